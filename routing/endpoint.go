package routing

import (
	"net/url"
	"sync/atomic"
	"time"
)

// Phase is the phase a request is in on an engine.
type Phase uint32

const (
	// PhaseNone means the slot is not held (not yet acquired, or released).
	PhaseNone Phase = iota
	// PhasePrefill means the request is admitted and no generated token has
	// been seen yet (the engine is computing the prompt's KV cache).
	PhasePrefill
	// PhaseDecode means at least one generated token has been seen.
	PhaseDecode
)

// String returns "prefill", "decode" or "none".
func (p Phase) String() string {
	switch p {
	case PhasePrefill:
		return "prefill"
	case PhaseDecode:
		return "decode"
	}
	return "none"
}

// Endpoint is one engine as the router sees it: a name, a base URL and the
// live in-flight counters. An Endpoint is created once per engine
// incarnation; a slot keeps a pointer to the Endpoint it was taken from, so
// an engine removed and re-added under the same name never receives releases
// for slots taken from its previous incarnation (docs/cases.md L03).
//
// All methods are safe for concurrent use.
type Endpoint struct {
	name string
	url  *url.URL

	id      uint64 // unique per incarnation, for policy indexes keyed by engine
	prefill atomic.Int64
	decode  atomic.Int64
	healthy atomic.Bool
	stats   atomic.Pointer[Stats]
	ring    atomic.Pointer[ringPoints] // session-affinity virtual nodes, built on first use
	outlier Outlier                    // passive health: failure streaks and ejections
	// external: a hosted provider's API, whose prefix cache (if any) the
	// gateway neither sees nor routes to (SetExternal).
	external atomic.Bool
}

// endpointIDs numbers endpoint incarnations; 0 is never used.
var endpointIDs atomic.Uint64

// Stats is an engine's own view of its load, scraped from its Prometheus
// /metrics. A Stats value is immutable once stored with
// [Endpoint.SetStats].
type Stats struct {
	// At is when the scrape that produced these stats completed.
	At time.Time
	// Expires is when the stats stop being trusted (At plus the configured
	// maximum age); policies fall back to the gateway's own counters after it.
	Expires time.Time
	// Running and Waiting are vllm:num_requests_running and
	// vllm:num_requests_waiting summed over the engine's models, in requests.
	Running, Waiting int64
	// KVCacheUsage is vllm:kv_cache_usage_perc (or the older
	// vllm:gpu_cache_usage_perc), 0..1; -1 when the engine reports neither.
	KVCacheUsage float64
	// PrefixCacheHitRatio is the fraction of prompt tokens found in the
	// engine's prefix cache, 0..1, from the growth of
	// vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total
	// between two scrapes; -1 when not known yet.
	PrefixCacheHitRatio float64
	// Sleeping is true when vllm:engine_sleep_state says the engine sleeps
	// (its weights are offloaded): it must not get traffic.
	Sleeping bool
	// Unhealthy is true when the engine reports vllm:engine_healthy 0.
	Unhealthy bool
	// InFlight is the gateway's own in-flight count (prefill + decode) on
	// this endpoint when the scrape completed, so a policy can add the
	// requests the gateway sent since: Running + Waiting + (now - InFlight).
	InFlight int64
}

// Fresh reports whether s is non-nil and not expired at now.
func (s *Stats) Fresh(now time.Time) bool { return s != nil && now.Before(s.Expires) }

// NewEndpoint returns a healthy endpoint with zeroed counters.
func NewEndpoint(name string, u *url.URL) *Endpoint {
	e := &Endpoint{name: name, url: u, id: endpointIDs.Add(1)}
	e.healthy.Store(true)
	return e
}

// Name returns the configured engine name.
func (e *Endpoint) Name() string { return e.name }

// SetExternal marks the endpoint as a hosted provider's API: the prefix
// policies (prefix-aware, precise-prefix, the prefix scorers) give it no
// prefix match and record no prompt against it, so it neither attracts a
// conversation by its cache nor takes entries from the prefix indexes.
func (e *Endpoint) SetExternal() { e.external.Store(true) }

// External reports whether SetExternal was called.
func (e *Endpoint) External() bool { return e.external.Load() }

// URL returns the engine's base URL. The caller must not modify it.
func (e *Endpoint) URL() *url.URL { return e.url }

// Healthy reports whether the last health verdict was healthy.
func (e *Endpoint) Healthy() bool { return e.healthy.Load() }

// SetHealthy records a health verdict. It never touches the in-flight
// counters: a probe must not reset them while requests are in flight
// (docs/cases.md L02, vllm-project/router issue #197).
func (e *Endpoint) SetHealthy(ok bool) { e.healthy.Store(ok) }

// Outlier returns the endpoint's outlier detection state. It belongs to
// this incarnation: an engine added again starts with none.
func (e *Endpoint) Outlier() *Outlier { return &e.outlier }

// Stats returns the last scraped stats, or nil when none has been stored.
// Check [Stats.Fresh] before trusting them.
func (e *Endpoint) Stats() *Stats { return e.stats.Load() }

// SetStats stores the stats of a completed scrape. s must not be modified
// afterwards. A nil s forgets the stats.
func (e *Endpoint) SetStats(s *Stats) { e.stats.Store(s) }

// InFlight returns the number of requests in prefill and in decode.
func (e *Endpoint) InFlight() (prefill, decode int64) {
	return e.prefill.Load(), e.decode.Load()
}

// Slot is one request's hold on an endpoint's in-flight counters. The zero
// value holds nothing. A Slot must not be copied (it holds an atomic); keep
// it in the struct that owns the request.
type Slot struct {
	ep    *Endpoint
	phase atomic.Uint32
}

// Acquire takes a prefill slot on e and makes s hold it. The slot must be
// released exactly once with [Slot.Release]: put `defer s.Release()` right
// after Acquire. Acquire on a slot that still holds a phase panics, because
// that is a programming error that would leak the first hold.
func (s *Slot) Acquire(e *Endpoint) {
	if s.phase.Load() != uint32(PhaseNone) {
		panic("routing: Acquire on a slot that is still held")
	}
	s.ep = e
	e.prefill.Add(1)
	s.phase.Store(uint32(PhasePrefill))
}

// Endpoint returns the endpoint the slot was taken from (nil for the zero Slot).
func (s *Slot) Endpoint() *Endpoint { return s.ep }

// Phase returns the slot's current phase.
func (s *Slot) Phase() Phase { return Phase(s.phase.Load()) }

// Promote moves the slot from prefill to decode. It reports whether it moved
// the slot: false when the slot was already in decode or released. The
// decode counter is raised before prefill is lowered, so a concurrent reader
// may briefly see the request in both phases but never in neither, and no
// counter ever goes below zero.
func (s *Slot) Promote() bool {
	if Phase(s.phase.Load()) != PhasePrefill {
		return false
	}
	// Raise decode first: a Release racing with us that sees PhaseDecode
	// then always finds the increment it undoes.
	s.ep.decode.Add(1)
	if !s.phase.CompareAndSwap(uint32(PhasePrefill), uint32(PhaseDecode)) {
		s.ep.decode.Add(-1)
		return false
	}
	s.ep.prefill.Add(-1)
	return true
}

// Release gives the slot back from the phase it is in and returns that
// phase. It is idempotent: only the first call changes a counter; later calls
// return PhaseNone. It is safe to race with Promote: exactly one counter is
// decremented exactly once.
func (s *Slot) Release() Phase {
	for {
		p := s.phase.Load()
		if Phase(p) == PhaseNone {
			return PhaseNone
		}
		if !s.phase.CompareAndSwap(p, uint32(PhaseNone)) {
			continue
		}
		if Phase(p) == PhaseDecode {
			s.ep.decode.Add(-1)
		} else {
			s.ep.prefill.Add(-1)
		}
		return Phase(p)
	}
}

// ringPoints is an endpoint's virtual nodes on the session-affinity hash
// ring: sorted hashes of "name#i" for i < vnodes.
type ringPoints struct {
	vnodes int
	points []uint64
}
