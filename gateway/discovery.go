package gateway

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrEngineLeftOut wraps the error [Server.SetDiscovered] returns for the
// discovered engines it left out (and applied the others).
var ErrEngineLeftOut = errors.New("discovered engine left out")

// DiscoveredEngine is one engine a discovery source reports.
type DiscoveredEngine struct {
	EngineConfig
	// Unready: the source says the engine may not take new requests (a
	// Kubernetes endpoint not ready, or terminating). It stays in the
	// pool, state draining: its requests in flight finish on it, and it
	// keeps its health, outlier state and stats, so it serves again at
	// once when it is ready again, without a new incarnation or probe.
	Unready bool
}

// WithDynamicEngines lets [New] and [Server.Reload] accept a configuration
// without engines: a discovery source (Kubernetes EndpointSlices) adds them
// at run time through [Server.SetDiscovered]. Until it does, requests get
// 503 and /ready fails.
func WithDynamicEngines() Option {
	return optionFunc(func(c *config) { c.dynamic = true })
}

// SetDiscovered makes engines the engines that the discovery source named
// source contributes, replacing what it contributed before, and applies
// the pool's whole engine set (the configured engines in configuration
// order, then each source's engines in the order given) as one batch, in
// one new routing snapshot, exactly as [Server.Reload] applies an engine
// list: an engine new to the set is probed (bounded by
// server.health.timeout) and added, one missing from it is retired (it
// takes no new request; its requests in flight finish and release their
// slots on it, and its gauges are reported until it drains), one whose
// settings changed is updated in place or replaced (ReloadReport.Changed).
// An engine marked Unready is in the set but takes no new requests
// (DiscoveredEngine.Unready); the report lists the engines that turned
// unready or ready again. Give the engines of one source in a stable
// order (sorted by name): the order is the candidates' order for the
// routing policies. The probes of new engines run with the batch: a
// Reload (or another SetDiscovered) waits for them, a few
// server.health.timeout at worst.
//
// An engine that fails [EngineConfig.Validate], or whose name a configured
// engine or an earlier engine of any source already has, is left out; the
// returned error (wrapping ErrEngineLeftOut and ErrInvalidConfig, joined
// with errors.Join) names each one, and the others are applied all the
// same. The report lists what changed (Added, Removed, Changed; never
// settings) and which engines turned unready or ready. Any other error means nothing was applied: the batch could
// not be built (an engine's key variable is unset, or the pool kept
// changing under it).
//
// Safe for concurrent use with Reload: one of them applies at a time, and
// a Reload keeps every source's engines. Call it after [Server.Start].
func (s *Server) SetDiscovered(source string, engines []DiscoveredEngine) (ReloadReport, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	next := make(map[string][]DiscoveredEngine, len(s.discovered)+1)
	for k, v := range s.discovered {
		next[k] = v
	}
	next[source] = slices.Clone(engines)
	was := s.pool.unreadyNames()
	want, unready, skipped := s.engineSetLocked(s.static, next)
	added, removed, changed, err := s.pool.apply(want, unready, s.set.Load().cfg.Models.Aliases)
	if err != nil {
		return ReloadReport{}, err
	}
	s.discovered = next
	rep := ReloadReport{Added: added, Removed: removed, Changed: changed}
	for _, ec := range want {
		switch {
		case unready[ec.Name] && !was[ec.Name]:
			rep.Unready = append(rep.Unready, ec.Name)
		case !unready[ec.Name] && was[ec.Name]:
			rep.Ready = append(rep.Ready, ec.Name)
		}
	}
	return rep, skipped
}

// unreadyNames returns the names of the engines marked unready.
func (p *Pool) unreadyNames() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	for _, e := range p.engines {
		if e.unready.Load() {
			out[e.cfg.Name] = true
		}
	}
	return out
}

// Discovered returns the engines the discovery source named source
// contributes now (as last given to SetDiscovered, the skipped ones
// included), nil when it has none.
func (s *Server) Discovered(source string) []DiscoveredEngine {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return slices.Clone(s.discovered[source])
}

// engineSetLocked returns the pool's engine set: static, then each
// source's engines (sources sorted by name), leaving out each discovered
// engine that is invalid or whose name is taken, with the joined errors
// saying which; and the names of the discovered engines that are unready.
// Call with reloadMu held.
func (s *Server) engineSetLocked(static []EngineConfig, discovered map[string][]DiscoveredEngine) ([]EngineConfig, map[string]bool, error) {
	want := slices.Clone(static)
	unready := map[string]bool{}
	taken := make(map[string]string, len(static))
	for _, ec := range static {
		taken[ec.Name] = "a configured engine"
	}
	sources := make([]string, 0, len(discovered))
	for k := range discovered {
		sources = append(sources, k)
	}
	slices.Sort(sources)
	var errs []error
	for _, src := range sources {
		for _, de := range discovered[src] {
			ec := de.EngineConfig
			if err := ec.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("%w: %s discovery: %w", ErrEngineLeftOut, src, err))
				continue
			}
			if by, dup := taken[ec.Name]; dup {
				errs = append(errs, fmt.Errorf("%w: %w: %s discovery: engine %q: the name is taken by %s", ErrEngineLeftOut, ErrInvalidConfig, src, ec.Name, by))
				continue
			}
			taken[ec.Name] = "another engine of " + src + " discovery"
			want = append(want, ec)
			if de.Unready {
				unready[ec.Name] = true
			}
		}
	}
	return want, unready, errors.Join(errs...)
}

// readyHold is one reason /ready answers 503 (HoldReady).
type readyHold struct{ reason string }

// HoldReady makes /ready answer 503 (code "starting", the reason in the
// message) until the returned release function is called: a discovery
// source holds readiness until its first view of the engines is applied.
// release is idempotent; holds taken by several callers are released
// independently. Safe for concurrent use.
func (s *Server) HoldReady(reason string) (release func()) {
	h := &readyHold{reason: reason}
	s.holdMu.Lock()
	s.holds = append(s.holds, h)
	s.holdMu.Unlock()
	return func() {
		s.holdMu.Lock()
		defer s.holdMu.Unlock()
		if i := slices.Index(s.holds, h); i >= 0 {
			s.holds = slices.Delete(s.holds, i, i+1)
		}
	}
}

// heldReady returns the reasons readiness is held, "" when none.
func (s *Server) heldReady() string {
	s.holdMu.Lock()
	defer s.holdMu.Unlock()
	if len(s.holds) == 0 {
		return ""
	}
	rs := make([]string, len(s.holds))
	for i, h := range s.holds {
		rs[i] = h.reason
	}
	return strings.Join(rs, "; ")
}
