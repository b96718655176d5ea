package gateway

import (
	"slices"
	"strings"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// WithDynamicEngines lets [New] and [Server.Reload] accept a configuration
// without engines: a discovery source (Kubernetes EndpointSlices) adds them
// at run time through [Server.SetDiscovered]. Until it does, requests get
// 503 and /ready fails.
func WithDynamicEngines() Option {
	return optionFunc(func(c *config) { c.dynamic = true })
}

// SetDiscovered makes engines the engines that the discovery source named
// source contributes, replacing what it contributed before, and applies
// the whole engine set (the configured engines in configuration order,
// then each source's engines) as one batch, exactly as [Server.Reload]
// applies an engine list: see fleet.Fleet.SetDiscovered, which it calls,
// for what is applied, left out (errors wrapping fleet.ErrEngineLeftOut)
// and reported. Safe for concurrent use with Reload: one of them applies
// at a time, and a Reload keeps every source's engines. Call it after
// [Server.Start].
func (s *Server) SetDiscovered(source string, engines []fleet.DiscoveredEngine) (fleet.Changes, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return s.fleet.SetDiscovered(source, engines)
}

var _ fleet.Sink = (*Server)(nil)

// Discovered returns the engines the discovery source named source
// contributes now (as last given to SetDiscovered, the skipped ones
// included), nil when it has none.
func (s *Server) Discovered(source string) []fleet.DiscoveredEngine {
	return s.fleet.Discovered(source)
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
