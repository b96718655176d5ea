package gateway

// Live reports whether an engine called name is live for telemetry: an
// engine of that name is in the pool (healthy or not, drained through the
// admin API or not), or a retired incarnation of that name (removed by
// Remove, a reload or discovery, or replaced by a reload) still holds
// slots. It is false once the name has left the pool and its last request
// there has ended: no measurement carries the name after that.
//
// It is the liveness telemetry.Providers.SetEngineLive takes, so that the
// metric exports drop a gone engine's series (the SDK would export them
// forever, open-telemetry/opentelemetry-go#8905): pass p.Live. It is
// called at collection time, once per engine name per collection, never on
// the request path; it takes the pool lock for a scan of the engines and
// the retired incarnations (no allocation), as the gauge callbacks do.
// Safe for concurrent use.
func (p *Pool) Live(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byNameLocked(name) != nil {
		return true
	}
	for _, e := range p.retired {
		if e.cfg.Name != name {
			continue
		}
		if pf, dc := e.ep.InFlight(); pf+dc > 0 {
			return true
		}
	}
	return false
}
