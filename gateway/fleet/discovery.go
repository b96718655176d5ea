package fleet

import (
	"errors"
	"fmt"
	"slices"
)

// ErrEngineLeftOut wraps the error [Fleet.SetDiscovered] returns for the
// discovered engines it left out (and applied the others).
var ErrEngineLeftOut = errors.New("discovered engine left out")

// DiscoveredEngine is one engine a discovery source reports.
type DiscoveredEngine struct {
	EngineConfig
	// Unready: the source says the engine may not take new requests (a
	// Kubernetes endpoint not ready, or terminating). It stays in the
	// fleet, state draining: its requests in flight finish on it, and it
	// keeps its health, outlier state and stats, so it serves again at
	// once when it is ready again, without a new incarnation or probe.
	Unready bool
}

// Sink receives the engines of a discovery source: *Fleet is one, and so
// is the gateway's Server. Implementations must be safe for concurrent
// use.
type Sink interface {
	// SetDiscovered replaces the engines of source with engines, applied
	// as one batch ([Fleet.SetDiscovered]).
	SetDiscovered(source string, engines []DiscoveredEngine) (Changes, error)
}

var _ Sink = (*Fleet)(nil)

// SetConfigured makes engines the configured engines and aliases the model
// aliases (Config.Aliases), and applies the fleet's whole engine set (the
// configured engines in order, then each discovery source's, sources
// sorted by name) as one batch, in one new routing snapshot: an engine new
// to the set is probed (bounded by HealthConfig.Timeout) and added, one
// missing from it is retired (it takes no new request; its requests in
// flight finish and release their slots on it, and its gauges are
// reported until it drains), one whose settings changed is updated in
// place or replaced (Changes.Changed). engines must be valid, with unique
// names (the gateway's Config.Validate checks them).
//
// A discovered engine whose name a configured engine now has is left out:
// the returned error (wrapping ErrEngineLeftOut and ErrInvalidConfig,
// joined with errors.Join) names it, and the rest is applied all the same.
// Any other error means nothing was applied: the batch could not be built
// (an engine's key variable is unset, or the fleet kept changing under it
// through Add and Remove); it wraps ErrInvalidConfig.
//
// One SetConfigured or SetDiscovered applies at a time.
func (f *Fleet) SetConfigured(engines []EngineConfig, aliases map[string]string) (Changes, error) {
	f.setMu.Lock()
	defer f.setMu.Unlock()
	want, unready, left := engineSet(engines, f.discovered)
	added, removed, changed, err := f.apply(want, unready, aliases)
	if err != nil {
		return Changes{}, err
	}
	f.configured = slices.Clone(engines)
	f.aliasCfg = aliases
	return Changes{Added: added, Removed: removed, Changed: changed}, left
}

// SetDiscovered makes engines the engines that the discovery source named
// source contributes, replacing what it contributed before, and applies
// the fleet's whole engine set as one batch, exactly as SetConfigured
// does, with the configured engines and aliases in force. An engine
// marked Unready is in the set but takes no new requests
// (DiscoveredEngine.Unready); Changes lists the engines that turned
// unready or ready again. Give the engines of one source in a stable
// order (sorted by name): the order is the candidates' order for the
// routing policies. The probes of new engines run with the batch: a
// SetConfigured (or another SetDiscovered) waits for them, a few
// HealthConfig.Timeout at worst.
//
// An engine that fails [EngineConfig.Validate], or whose name a configured
// engine or an earlier engine of any source already has, is left out; the
// returned error (wrapping ErrEngineLeftOut and ErrInvalidConfig, joined
// with errors.Join) names each one, and the others are applied all the
// same. Any other error means nothing was applied: the batch could not be
// built (an engine's key variable is unset, or the fleet kept changing
// under it).
func (f *Fleet) SetDiscovered(source string, engines []DiscoveredEngine) (Changes, error) {
	f.setMu.Lock()
	defer f.setMu.Unlock()
	next := make(map[string][]DiscoveredEngine, len(f.discovered)+1)
	for k, v := range f.discovered {
		next[k] = v
	}
	next[source] = slices.Clone(engines)
	was := f.unreadyNames()
	want, unready, skipped := engineSet(f.configured, next)
	added, removed, changed, err := f.apply(want, unready, f.aliasCfg)
	if err != nil {
		return Changes{}, err
	}
	f.discovered = next
	ch := Changes{Added: added, Removed: removed, Changed: changed}
	for _, ec := range want {
		switch {
		case unready[ec.Name] && !was[ec.Name]:
			ch.Unready = append(ch.Unready, ec.Name)
		case !unready[ec.Name] && was[ec.Name]:
			ch.Ready = append(ch.Ready, ec.Name)
		}
	}
	return ch, skipped
}

// Discovered returns the engines the discovery source named source
// contributes now (as last given to SetDiscovered, the skipped ones
// included), nil when it has none.
func (f *Fleet) Discovered(source string) []DiscoveredEngine {
	f.setMu.Lock()
	defer f.setMu.Unlock()
	return slices.Clone(f.discovered[source])
}

// unreadyNames returns the names of the engines marked unready.
func (f *Fleet) unreadyNames() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for _, e := range f.engines {
		if e.unready.Load() {
			out[e.cfg.Name] = true
		}
	}
	return out
}

// engineSet returns the fleet's engine set: configured, then each
// source's engines (sources sorted by name), leaving out each discovered
// engine that is invalid or whose name is taken, with the joined errors
// saying which; and the names of the discovered engines that are unready.
func engineSet(configured []EngineConfig, discovered map[string][]DiscoveredEngine) ([]EngineConfig, map[string]bool, error) {
	want := slices.Clone(configured)
	unready := map[string]bool{}
	taken := make(map[string]string, len(configured))
	for _, ec := range configured {
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
