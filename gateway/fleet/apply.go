package fleet

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
)

// Changes says what applying an engine set changed ([Fleet.SetConfigured],
// [Fleet.SetDiscovered]). Engine names are in the order of the set
// (Removed: in the order the engines ran).
type Changes struct {
	// Added are the engines new to the fleet.
	Added []string
	// Removed are the engines taken out of routing; their requests in
	// flight finish on them and release their slots there (draining).
	Removed []string
	// Changed are the engines whose configuration changed. A change of
	// max_in_flight or of the configured models alone is applied to the
	// running incarnation: its requests in flight count against the new
	// limit, and its health, outlier state (an ejection, the failure
	// streak), sleep and admin drain stay. Any other change (URL, key,
	// key variable, provider, role, group, or models switching between
	// configured and discovered) is another server or identity (the role
	// is on the engine's span and state gauge attributes, fixed for an
	// incarnation): the old incarnation
	// drains its requests in flight, a new one takes the new requests
	// with fresh circuit breaker counts and outlier state (an admin drain
	// carries over).
	Changed []string
	// Unready and Ready are the discovered engines that turned unready
	// (no new requests, their requests in flight finishing) or ready
	// again ([Fleet.SetDiscovered] only).
	Unready, Ready []string
}

// Applied reports whether an engine was added, removed or changed, or
// turned unready or ready.
func (c Changes) Applied() bool {
	return len(c.Added)+len(c.Removed)+len(c.Changed)+len(c.Unready)+len(c.Ready) > 0
}

// sameEngine reports whether a and b configure the same engine: every
// field equal, the models compared as a set, the roles as what they name
// ("", "both" and "prefill-decode" are one).
func sameEngine(a, b EngineConfig) bool {
	a.Models, b.Models = sortedSet(a.Models), sortedSet(b.Models)
	a.Role, b.Role = a.role().String(), b.role().String()
	return reflect.DeepEqual(a, b)
}

func sortedSet(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// reloadTries bounds how often apply builds its batch again when the fleet
// changed (Add, Remove) while the new engines were being probed.
const reloadTries = 3

// errFleetChanged is apply's conflict, retried.
var errFleetChanged = errors.New("the engine pool changed during the reload")

// apply makes the fleet's engines those of want (validated), in want's
// order, as one batch, and the model aliases those of aliases. An engine
// whose configuration is unchanged keeps its incarnation (its slots,
// health, models, sleep state, outlier state, admin drain), and so does
// one whose max_in_flight or configured models alone changed (updated in
// place, see inPlace); a new one, or one changed otherwise, gets a new
// incarnation, probed before the batch is applied (a replaced engine's
// admin drain carries over to it); a removed one, and the old incarnation
// of a replaced one, are retired (reported until drained).
// The engines named in unready take no new requests (engine.unready),
// the others may. It returns the names added, removed and changed, or an
// error (nothing changed) when an engine cannot be built.
func (f *Fleet) apply(want []EngineConfig, unready map[string]bool, aliases map[string]string) (added, removed, changed []string, err error) {
	for range reloadTries {
		added, removed, changed, err = f.tryApply(want, unready, aliases)
		if !errors.Is(err, errFleetChanged) {
			return added, removed, changed, err
		}
	}
	return nil, nil, nil, fmt.Errorf("%w: %w, %d times; try again", ErrInvalidConfig, errFleetChanged, reloadTries)
}

func (f *Fleet) tryApply(want []EngineConfig, unready map[string]bool, aliases map[string]string) (added, removed, changed []string, err error) {
	// 1. Plan against the current engines and build the new incarnations.
	f.mu.Lock()
	base := slices.Clone(f.engines)
	byName := make(map[string]*Engine, len(base))
	for _, e := range base {
		byName[e.cfg.Name] = e
	}
	next := make([]*Engine, len(want))
	var fresh []*Engine
	replaces := map[*Engine]*Engine{} // a new incarnation: the one it replaces
	type update struct {
		e  *Engine
		ec EngineConfig
	}
	var updates []update
	var errs []error
	for i, ec := range want {
		old := byName[ec.Name]
		switch {
		case old != nil && sameEngine(old.cfg, ec):
			next[i] = old
			if f.rereadKey(old, ec) {
				changed = append(changed, ec.Name) // its key: the reload applied something
			}
			continue
		case old != nil && inPlace(old.cfg, ec):
			next[i] = old
			f.rereadKey(old, ec)
			updates = append(updates, update{old, ec})
			changed = append(changed, ec.Name)
			continue
		}
		e, err := f.newIncarnation(ec)
		if err != nil {
			errs = append(errs, fmt.Errorf("engines[%d]: %w", i, err))
			continue
		}
		next[i] = e
		fresh = append(fresh, e)
		if old == nil {
			added = append(added, ec.Name)
		} else {
			replaces[e] = old
			changed = append(changed, ec.Name)
		}
	}
	f.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, nil, err
	}
	wanted := make(map[string]bool, len(want))
	for _, ec := range want {
		wanted[ec.Name] = true
	}
	for _, e := range base {
		if !wanted[e.cfg.Name] {
			removed = append(removed, e.cfg.Name)
		}
	}
	newAliases := aliasesOf(aliases)

	// 2. Probe the new incarnations, outside the fleet lock: a probe takes
	// up to HealthConfig.Timeout, and the request path and the gauges must
	// not wait for it. They are not in the fleet yet, so only this
	// goroutine touches their probe state; probeMu keeps a probe round
	// from running beside them all the same.
	if len(fresh) > 0 {
		f.probeMu.Lock()
		var wg sync.WaitGroup
		for _, e := range fresh {
			wg.Go(func() { f.probe(f.ctx, e) })
		}
		wg.Wait()
		f.probeMu.Unlock()
	}

	// 3. Apply the batch, unless the fleet changed meanwhile.
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.engines, base) {
		return nil, nil, nil, errFleetChanged
	}
	keep := make(map[*Engine]bool, len(next))
	for _, e := range next {
		keep[e] = true
	}
	for _, e := range base {
		if !keep[e] {
			f.retireLocked(e)
		}
	}
	for _, u := range updates {
		u.e.updateLocked(u.ec)
	}
	for _, e := range fresh {
		f.telByName[e.cfg.Name] = e.tel
		if old := replaces[e]; old != nil {
			// The operator drained the engine, not its URL or key.
			e.drained.Store(old.drained.Load())
		}
	}
	for _, name := range removed {
		// A later Add under this name builds attributes from its own URL.
		delete(f.telByName, name)
	}
	for _, e := range next {
		e.unready.Store(unready[e.cfg.Name])
	}
	f.engines = next
	f.aliases = newAliases
	f.pruneRetiredLocked()
	f.rebuildLocked()
	return added, removed, changed, nil
}

// inPlace reports whether next, the new configuration of the engine
// configured as cur, differs from it only in what its running incarnation
// can take: max_in_flight, tier, max_queue_depth, and the configured
// models as long as both
// configure some (switching between configured and discovered models
// changes how the engine is probed). The URL, key, key variable,
// provider, role and group are the server and its identity: a change of
// one is a new incarnation.
func inPlace(cur, next EngineConfig) bool {
	if (len(cur.Models) == 0) != (len(next.Models) == 0) {
		return false
	}
	cur.MaxInFlight, cur.Models, cur.Tier, cur.MaxQueueDepth = next.MaxInFlight, next.Models, next.Tier, next.MaxQueueDepth
	return sameEngine(cur, next)
}

// updateLocked applies ec, an inPlace change of e's configuration, to e:
// its circuit breaker, and its configured models, keeping the adapters
// loaded on it at run time (they are in its models, not in its config).
// Call with Fleet.mu held, and rebuild the snapshot after.
func (e *Engine) updateLocked(ec EngineConfig) {
	e.maxInFlight.Store(int64(ec.MaxInFlight))
	e.cfg.MaxInFlight = ec.MaxInFlight
	e.tier.Store(int64(ec.tier()))
	e.maxQueue.Store(int64(ec.MaxQueueDepth))
	e.cfg.Tier, e.cfg.MaxQueueDepth = ec.Tier, ec.MaxQueueDepth
	if want := ec.servedModels(); !slices.Equal(e.cfg.servedModels(), want) {
		ms := want
		for _, m := range e.knownModels() {
			if !slices.Contains(e.cfg.Models, m) && !slices.Contains(ms, m) {
				ms = append(ms, m)
			}
		}
		slices.Sort(ms)
		e.models.Store(&ms)
	}
	e.cfg.Models = slices.Clone(ec.Models)
}

// maxRetired bounds Fleet.retired when nothing collects the metrics: past
// it, drained incarnations are dropped even when their name owes the
// gauges a last 0.
const maxRetired = 256

// pruneRetiredLocked drops the retired incarnations that have drained and
// whose name an engine in the fleet has (that engine continues the name's
// gauge series, so no last 0 is owed), then, while the list is longer
// than maxRetired, the oldest drained ones. Without it the list would
// only shrink when the gauges are collected (inFlightByIncarnation), so a
// gateway nobody scrapes would keep every incarnation each reload or
// Remove retired. Call with Fleet.mu held.
func (f *Fleet) pruneRetiredLocked() {
	live := make(map[string]bool, len(f.engines))
	for _, e := range f.engines {
		live[e.cfg.Name] = true
	}
	drained := func(e *Engine) bool {
		pf, dc := e.ep.InFlight()
		return pf == 0 && dc == 0
	}
	excess := 0
	for _, e := range f.retired {
		if !(live[e.cfg.Name] && drained(e)) {
			excess++
		}
	}
	excess -= maxRetired
	keep := f.retired[:0]
	for _, e := range f.retired {
		switch {
		case !drained(e):
		case live[e.cfg.Name]:
			e.closeIdle()
			continue
		case excess > 0:
			excess--
			e.closeIdle()
			continue
		}
		keep = append(keep, e)
	}
	clear(f.retired[len(keep):])
	f.retired = keep
}

// newIncarnation builds a new incarnation of ec with its own
// telemetry.Engine, so its metrics and spans carry its own server.address,
// server.port and gen_ai.provider.name while an older incarnation under the
// same name drains with its own. The fleet's telemetry map is left as it
// was (apply installs the new one with the batch). Call with f.mu held.
func (f *Fleet) newIncarnation(ec EngineConfig) (*Engine, error) {
	prev, had := f.telByName[ec.Name]
	delete(f.telByName, ec.Name) // newEngine builds a fresh one from ec
	e, err := f.newEngine(ec)
	if had {
		f.telByName[ec.Name] = prev
	} else {
		delete(f.telByName, ec.Name)
	}
	return e, err
}
