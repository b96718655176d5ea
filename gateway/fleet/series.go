package fleet

import (
	"net/url"
	"strconv"
)

// Live reports whether an engine called name is live for telemetry: an
// engine of that name is in the fleet (healthy or not, drained through the
// admin API or not), or a retired incarnation of that name (removed by
// Remove, a reload or discovery, or replaced by a reload) still holds
// slots. It is false once the name has left the fleet and its last request
// there has ended: no measurement carries the name after that.
//
// It is the liveness telemetry.Providers.SetEngineLive takes, so that the
// metric exports drop a gone engine's series (the SDK would export them
// forever, open-telemetry/opentelemetry-go#8905): pass f.Live. It is
// called at collection time, once per engine name per collection, never on
// the request path; it takes the fleet lock for a scan of the engines and
// the retired incarnations (no allocation), as the gauge callbacks do.
// Safe for concurrent use.
func (f *Fleet) Live(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byNameLocked(name) != nil {
		return true
	}
	for _, e := range f.retired {
		if e.cfg.Name != name {
			continue
		}
		if pf, dc := e.ep.InFlight(); pf+dc > 0 {
			return true
		}
	}
	return false
}

// LiveServer reports whether a server at address and port is live for
// telemetry: an engine in the fleet, or a retired incarnation still
// holding slots (as for Live), has that host and port, as its
// telemetry.Engine reports them in server.address and server.port (the
// engine URL's host, without brackets for IPv6, and its port, or the
// scheme's default when the URL names none or 0: 443 for https, else 80). A
// port of 0 matches the address on any port; an empty address matches
// nothing.
//
// It is the server liveness telemetry.WithServerLive takes, so that the
// metric exports drop the gen_ai.client.* series of an engine address no
// engine has any more (a Kubernetes pod's IP after the pod is replaced;
// the SDK would export them forever, open-telemetry/opentelemetry-go#8905):
// pass f.LiveServer. It is called at collection time, once per (address,
// port) per collection, never on the request path; it takes the fleet lock
// for a scan of the engines and the retired incarnations, reading each
// one's parsed URL (no allocation). Safe for concurrent use.
func (f *Fleet) LiveServer(address string, port int) bool {
	if address == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.engines {
		if e.servesAt(address, port) {
			return true
		}
	}
	for _, e := range f.retired {
		if !e.servesAt(address, port) {
			continue
		}
		if pf, dc := e.ep.InFlight(); pf+dc > 0 {
			return true
		}
	}
	return false
}

// servesAt reports whether e's server.address and server.port are address
// and port (any port when port is 0). It computes them as newEngine does
// for telemetry.WithServer, from the endpoint's URL (newEngine's parsed
// base, which nothing writes after): Hostname and Port slice u.Host, so
// nothing is allocated.
func (e *Engine) servesAt(address string, port int) bool {
	u := e.ep.URL()
	if u.Hostname() != address {
		return false
	}
	return port == 0 || urlPort(u) == port
}

// urlPort is the port newEngine reports for u: its explicit port, else
// 443 for https and 80 for any other scheme. An empty port is not parsed:
// strconv.Atoi's error for it would allocate.
func urlPort(u *url.URL) int {
	port := 0
	if ps := u.Port(); ps != "" {
		port, _ = strconv.Atoi(ps)
	}
	if port == 0 {
		port = 80
		if u.Scheme == "https" {
			port = 443
		}
	}
	return port
}
