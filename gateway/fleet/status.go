package fleet

import (
	"slices"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// EngineStatus is one engine's state as shown on GET /admin/engines.
type EngineStatus struct {
	Name     string   `json:"name"`               // configured engine name
	URL      string   `json:"url"`                // base URL, userinfo redacted
	Healthy  bool     `json:"healthy"`            // last health verdict
	Routable bool     `json:"routable"`           // ready: healthy, in the fleet, not ejected, not sleeping or self-reported unhealthy by fresh stats
	State    string   `json:"state"`              // ready, unhealthy, sleeping, draining or ejected (telemetry.EngineStates)
	Sleeping bool     `json:"sleeping,omitempty"` // put to sleep through the admin API and not woken yet
	Models   []string `json:"models"`             // sorted; empty until discovered
	Static   bool     `json:"models_configured"`  // models come from config, not discovery
	Role     string   `json:"role"`               // prefill/decode role: both, prefill or decode (Role.String)
	Group    string   `json:"group,omitempty"`    // pairing group (EngineConfig.Group); absent when none
	Prefill  int64    `json:"prefill"`            // requests in prefill now
	Decode   int64    `json:"decode"`             // requests in decode now
	Retired  bool     `json:"retired,omitempty"`  // removed, still draining its requests
	Drained  bool     `json:"drained,omitempty"`  // drained through the admin API (POST .../drain) and not resumed
	// Unready: its discovery source reports it not ready (a Kubernetes
	// endpoint not ready or terminating); state draining until it is
	// ready again or gone.
	Unready bool `json:"unready,omitempty"`
	// MaxInFlight is the engine's circuit breaker (EngineConfig.MaxInFlight);
	// absent when it has none.
	MaxInFlight int    `json:"max_in_flight,omitempty"`
	LastError   string `json:"last_error,omitempty"` // the last failed probe or refused connection
	// EjectedUntil is when the engine's ejection time ends, while outlier
	// detection has it ejected; it returns at its first passing probe
	// after that.
	EjectedUntil *time.Time `json:"ejected_until,omitempty"`
	// Ejections is the engine's ejection multiplier (its ejections less
	// those forgiven by time spent healthy): its next ejection lasts
	// base_ejection_time × (Ejections + 1), capped.
	Ejections int `json:"ejections"`
	// Stats are the engine's last scraped stats, fresh or not; absent
	// when none was ever scraped (or scraping is off).
	Stats *EngineStatsStatus `json:"stats,omitempty"`
	// KVEvents is the engine's KV-cache event subscription; absent when
	// it has none (no kv_events endpoint).
	KVEvents *EngineKVStatus `json:"kv_events,omitempty"`
	// Tier is the engine's tier (EngineConfig.Tier, defaulted).
	Tier int `json:"tier"`
	// Provider is the engine's provider kind (EngineConfig.Provider);
	// absent for a self-hosted engine.
	Provider string `json:"provider,omitempty"`
	// MaxQueueDepth is its overflow threshold on its reported queue
	// depth; absent when none.
	MaxQueueDepth int64 `json:"max_queue_depth,omitempty"`
	// BackingOffUntil is when a provider's back-off (its 429 or
	// exhausted rate-limit headers) ends, while it lasts; BackOffs
	// counts the back-offs since the incarnation started.
	BackingOffUntil *time.Time `json:"backing_off_until,omitempty"`
	BackOffs        int64      `json:"backoffs,omitempty"`
}

// Engines returns the engines in the fleet now, in configuration order
// (retired incarnations left out).
func (f *Fleet) Engines() []*Engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.engines)
}

// Status returns every engine's state, configured engines first (in config
// order) then retired ones still draining.
func (f *Fleet) Status() []EngineStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]EngineStatus, 0, len(f.engines)+len(f.retired))
	now := f.now()
	st := func(e *Engine) EngineStatus {
		pf, dc := e.ep.InFlight()
		state := e.state()
		s := EngineStatus{Name: e.cfg.Name, URL: e.shown, Healthy: e.ep.Healthy(), Models: e.knownModels(),
			Static: e.static, Role: e.role.String(), Group: e.group, Prefill: pf, Decode: dc, Retired: e.retired,
			Routable: state == routing.StateReady, State: telemetry.EngineStates[state],
			Sleeping: e.sleeping.Load(), Drained: e.drained.Load(), Unready: e.unready.Load(), MaxInFlight: int(e.maxInFlight.Load()), Stats: statsStatus(e.ep.Stats(), now)}
		if s.Models == nil {
			s.Models = []string{}
		}
		s.EjectedUntil, s.Ejections = f.outlierStatus(e, now)
		s.KVEvents = f.kvStatus(e, now)
		s.Tier, s.Provider, s.MaxQueueDepth = e.Tier(), e.Provider(), e.MaxQueueDepth()
		if p := e.prov; p != nil {
			s.BackOffs = p.backoffs.Load()
			if u := p.until.Load(); u > now.UnixNano() {
				t := time.Unix(0, u).UTC()
				s.BackingOffUntil = &t
			}
		}
		if le := e.lastErr.Load(); le != nil {
			s.LastError = *le
		}
		return s
	}
	for _, e := range f.engines {
		out = append(out, st(e))
	}
	for _, e := range f.retired {
		// Shown while it still has requests finishing: a drained one
		// may stay listed until the gauges report its last 0
		// (inFlightByIncarnation), or a reload, Add or Remove prunes it
		// (pruneRetiredLocked).
		if pf, dc := e.ep.InFlight(); pf+dc > 0 {
			out = append(out, st(e))
		}
	}
	return out
}

// Ready reports whether at least one routable engine has reported models.
func (f *Fleet) Ready() bool { return f.snap.Load().modelsBody != nil }

// inFlightByIncarnation reports the in-flight counts of every engine name,
// summing the incarnations that share a telemetry.Engine, plus retired
// engines until they have drained and been reported at zero once.
func (f *Fleet) inFlightByIncarnation(report func(e *telemetry.Engine, prefill, decode int64)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	type sum struct{ pf, dc int64 }
	sums := make(map[*telemetry.Engine]*sum, len(f.engines)+len(f.retired))
	order := make([]*telemetry.Engine, 0, len(f.engines)+len(f.retired))
	add := func(e *Engine) {
		pf, dc := e.ep.InFlight()
		s := sums[e.tel]
		if s == nil {
			s = &sum{}
			sums[e.tel] = s
			order = append(order, e.tel)
		}
		s.pf += pf
		s.dc += dc
	}
	for _, e := range f.engines {
		add(e)
	}
	keep := f.retired[:0]
	for _, e := range f.retired {
		add(e)
		if pf, dc := e.ep.InFlight(); pf != 0 || dc != 0 {
			keep = append(keep, e)
		}
	}
	clear(f.retired[len(keep):])
	f.retired = keep
	for _, t := range order {
		s := sums[t]
		report(t, s.pf, s.dc)
	}
}

// ObserveInFlight reports the in-flight counts of every engine name, for
// the switchboard.engine.active_requests gauge (telemetry.Metrics
// ObserveInFlight): the engines in the fleet, and retired incarnations
// until they have drained and been reported at zero once. The reports of
// the incarnations that share a name are merged into one (their counts
// summed): an engine replaced by a reload has two telemetry.Engines, with
// the same engine and phase attributes, while its old incarnation drains,
// and an observation callback must report each attribute set once.
func (f *Fleet) ObserveInFlight(report func(e *telemetry.Engine, prefill, decode int64)) {
	type sum struct {
		tel    *telemetry.Engine
		pf, dc int64
	}
	var sums []sum
	f.inFlightByIncarnation(func(t *telemetry.Engine, pf, dc int64) {
		for i := range sums {
			if sums[i].tel.Name() == t.Name() {
				sums[i].pf += pf
				sums[i].dc += dc
				return
			}
		}
		sums = append(sums, sum{t, pf, dc})
	})
	for _, s := range sums {
		report(s.tel, s.pf, s.dc)
	}
}

// ObserveBases reports every engine in the fleet with its base URL, each
// engine name once, for gauges kept per destination (the gateway's
// switchboard.engine.connections).
func (f *Fleet) ObserveBases(report func(e *telemetry.Engine, base string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.engines {
		report(e.tel, e.base)
	}
}

// stateByIncarnation reports every engine's state: the engines in the
// fleet, then retired ones still holding slots (draining) under a name no
// engine in the fleet has.
func (f *Fleet) stateByIncarnation(report func(e *telemetry.Engine, state int)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := make(map[*telemetry.Engine]bool, len(f.engines))
	for _, e := range f.engines {
		seen[e.tel] = true
		report(e.tel, int(e.state()))
	}
	for _, e := range f.retired {
		if pf, dc := e.ep.InFlight(); !seen[e.tel] && pf+dc > 0 {
			seen[e.tel] = true
			report(e.tel, int(e.state()))
		}
	}
}

// ObserveState reports every engine's state for switchboard.engine.state
// (telemetry.Metrics ObserveEngineState; the index into
// telemetry.EngineStates), each engine name once: the engine in the
// fleet, not an older incarnation still draining under the same name.
func (f *Fleet) ObserveState(report func(e *telemetry.Engine, state int)) {
	var seen []string
	f.stateByIncarnation(func(t *telemetry.Engine, state int) {
		if slices.Contains(seen, t.Name()) {
			return
		}
		seen = append(seen, t.Name())
		report(t, state)
	})
}
