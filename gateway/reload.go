package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/switchboard-gw/switchboard/internal/cfgdiff"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// ReloadReport says what a [Server.Reload] changed. Engine names are in
// configuration order (Removed: in the order the engines ran); keys are
// spelled as the YAML file spells them ("server.timeouts.idle",
// "models.aliases").
type ReloadReport struct {
	// Added are the engines new to the pool.
	Added []string
	// Removed are the engines taken out of routing; their requests in
	// flight finish on them and release their slots there (draining).
	Removed []string
	// Changed are the engines whose configuration changed. A change of
	// max_in_flight or of the configured models alone is applied to the
	// running incarnation: its requests in flight count against the new
	// limit, and its health, outlier state (an ejection, the failure
	// streak), sleep and admin drain stay. Any other change (URL, key,
	// key variable, provider, or models switching between configured and
	// discovered) is another server or identity: the old incarnation
	// drains its requests in flight, a new one takes the new requests
	// with fresh circuit breaker counts and outlier state (an admin drain
	// carries over).
	Changed []string
	// Unready and Ready are the discovered engines that turned unready
	// (no new requests, their requests in flight finishing) or ready
	// again ([Server.SetDiscovered] only).
	Unready, Ready []string
	// PolicyChanged is set when the routing policy was replaced by
	// another instance.
	PolicyChanged bool
	// Settings are the keys of the settings that changed and apply to the
	// requests arriving after the reload (timeouts, limits, attempts,
	// model aliases, ...).
	Settings []string
	// Restart are the keys whose new value differs from the running one
	// but takes effect only after a restart (every setting not read
	// through the settings snapshot: the transport's connect timeout,
	// health checks, stats scraping, the buffered-bytes budget, header
	// stripping, trusted proxies, the access log). The running values stay
	// in force; a later reload reports them again until the process
	// restarts.
	Restart []string
}

// Applied reports whether the reload changed anything in force: an
// engine, the policy or a setting. Keys that need a restart do not count.
func (r ReloadReport) Applied() bool {
	return len(r.Added)+len(r.Removed)+len(r.Changed)+len(r.Settings)+len(r.Unready)+len(r.Ready) > 0 || r.PolicyChanged
}

// Reload applies cfg and policy to a running server without dropping a
// request. cfg is validated whole first (as [New] validates, plus every
// engine's key variable); on any error nothing changes, the running
// configuration stays in force and the error (wrapping ErrInvalidConfig,
// joined with errors.Join) is returned with an empty report.
//
// Otherwise the engine set is applied as one batch, in one new routing
// snapshot: engines new to cfg are added, engines missing from it are
// removed, engines whose max_in_flight or configured models alone changed
// are updated in place, engines whose EngineConfig otherwise differs are
// replaced (see ReloadReport.Changed). A removed engine, and the old
// incarnation of a replaced one, take no new request;
// their requests in flight finish and release their slots into their own
// incarnation, whose gauges are reported until they drain. Each new
// incarnation is probed (health, and its models when none are
// configured) before the batch is applied, each probe bounded by
// HealthConfig.Timeout, so a new engine serves at once and one that is
// down enters as unhealthy. A replaced engine's metrics and spans carry
// its new server.address and server.port from its first request on. The
// model aliases are then replaced, and last the settings snapshot the
// request path reads: requests already in flight keep the settings they
// started with.
//
// policy must not be nil; pass the running policy to keep its state
// (round-robin position, session ring, prefix index). The settings that
// cannot change at run time keep their running values and are listed in
// ReloadReport.Restart. Call Reload after [Server.Start]; it is safe for
// concurrent use (reloads are applied one at a time).
func (s *Server) Reload(cfg Config, policy routing.Policy) (ReloadReport, error) {
	if policy == nil {
		return ReloadReport{}, fmt.Errorf("%w: nil routing policy", ErrInvalidConfig)
	}
	if err := cfg.validate(s.dynamic); err != nil {
		return ReloadReport{}, err
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	cur := s.set.Load()
	eff := keepRunning(cfg, s.cfg)
	var rep ReloadReport
	rep.Restart = configDiff(cfg, eff)
	if err := eff.validate(s.dynamic); err != nil {
		return ReloadReport{}, fmt.Errorf("with the running values of the settings that need a restart (%s): %w",
			strings.Join(rep.Restart, ", "), err)
	}
	want, unready, left := s.engineSetLocked(eff.Engines, s.discovered)
	if left != nil {
		// A configured engine now has a discovered engine's name: the
		// configured one wins.
		s.log.Warn("discovered engines left out by the reload", "error", left)
	}
	added, removed, changed, err := s.pool.apply(want, unready, eff.Models.Aliases)
	if err != nil {
		return ReloadReport{}, err
	}
	s.static = slices.Clone(eff.Engines)
	rep.Added, rep.Removed, rep.Changed = added, removed, changed
	if !reflect.DeepEqual(cur.cfg.Outlier, eff.Outlier) {
		// New thresholds from the next outcome, new ejection times from
		// the next ejection; turned off, every ejected engine returns.
		s.pool.setOutlier(eff.Outlier)
	}
	rep.PolicyChanged = !samePolicy(policy, cur.policy)
	rep.Settings = configDiff(cur.cfg, eff)
	if rep.Applied() {
		s.set.Store(newSettings(eff, policy))
	}
	return rep, nil
}

// reloadable are the keys of the settings the request path reads from the
// settings snapshot, once per request (or that Reload hands to their
// owner, as outlier detection), so a reload applies them to the requests
// that follow; a key ending in "." stands for its whole section. Every
// other setting is read once, where it is built, and needs a restart:
// max_buffered_bytes (the budget's limit, read without a lock),
// strip_request_headers and trusted_proxies (Server fields built by New),
// timeouts.connect (the engine transport's dialer), health and
// engine_stats (the pool's tickers and probe client), log.access (the
// access-log middleware, chosen when the handler is built). A setting
// added later needs a restart until it is listed here: it is never
// silently ignored.
var reloadable = []string{
	"server.max_body_bytes", "server.max_form_bytes", "server.body_read_timeout",
	"server.max_concurrent_requests", "server.max_response_buffer_bytes",
	"server.max_attempts", "server.retry.", "server.max_pending_per_model", "server.outlier.",
	"server.timeouts.response_header", "server.timeouts.first_token", "server.timeouts.idle",
	"server.timeouts.attempt", "server.timeouts.client_write", "server.timeouts.request",
	"server.engine_header", "server.inject_usage", "server.observe_non_streaming", "server.ready_requires_engine",
}

func isReloadable(key string) bool {
	for _, k := range reloadable {
		if key == k || strings.HasSuffix(k, ".") && strings.HasPrefix(key, k) {
			return true
		}
	}
	return false
}

// keepRunning returns next with every setting that cannot change at run
// time (see reloadable) set back to its running value: what a reload puts
// in force. The engines and the model aliases are next's.
func keepRunning(next, running Config) Config {
	cfgdiff.Keep("server", reflect.ValueOf(&next).Elem(), reflect.ValueOf(running), isReloadable)
	next.AccessLog = running.AccessLog
	next.Limits.Redis = running.Limits.Redis // the store is built at start
	return next
}

// configDiff returns the keys whose values differ between a and b, as the
// YAML file spells them, in field order; the engine list is not compared
// (Pool.apply does).
func configDiff(a, b Config) []string {
	var keys []string
	cfgdiff.Diff("server", reflect.ValueOf(a), reflect.ValueOf(b), nil, &keys)
	if a.AccessLog != b.AccessLog {
		keys = append(keys, "log.access")
	}
	if !maps.Equal(a.Models.Aliases, b.Models.Aliases) {
		keys = append(keys, "models.aliases")
	}
	if !reflect.DeepEqual(a.Auth.Keys, b.Auth.Keys) && len(a.Auth.Keys)+len(b.Auth.Keys) > 0 {
		keys = append(keys, "auth.keys")
	}
	if a.Auth.HideUnauthorizedModels != b.Auth.HideUnauthorizedModels {
		keys = append(keys, "auth.hide_unauthorized_models")
	}
	if a.Limits.DefaultMaxTokens != b.Limits.DefaultMaxTokens {
		keys = append(keys, "limits.default_max_tokens")
	}
	if a.Limits.FailMode != b.Limits.FailMode {
		keys = append(keys, "limits.fail_mode")
	}
	return keys
}

// samePolicy reports whether a and b are the same policy instance (a
// policy of a type that cannot be compared counts as a new one).
func samePolicy(a, b routing.Policy) bool {
	if reflect.TypeOf(a) != reflect.TypeOf(b) || !reflect.TypeOf(a).Comparable() {
		return false
	}
	return a == b
}

// sameEngine reports whether a and b configure the same engine: every
// field equal, the models compared as a set.
func sameEngine(a, b EngineConfig) bool {
	a.Models, b.Models = sortedSet(a.Models), sortedSet(b.Models)
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

// reloadTries bounds how often apply builds its batch again when the pool
// changed (Add, Remove) while the new engines were being probed.
const reloadTries = 3

// errPoolChanged is apply's conflict, retried.
var errPoolChanged = errors.New("the engine pool changed during the reload")

// apply makes the pool's engines those of want (validated), in want's
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
func (p *Pool) apply(want []EngineConfig, unready map[string]bool, aliases map[string]string) (added, removed, changed []string, err error) {
	for range reloadTries {
		added, removed, changed, err = p.tryApply(want, unready, aliases)
		if !errors.Is(err, errPoolChanged) {
			return added, removed, changed, err
		}
	}
	return nil, nil, nil, fmt.Errorf("%w: %w, %d times; try again", ErrInvalidConfig, errPoolChanged, reloadTries)
}

func (p *Pool) tryApply(want []EngineConfig, unready map[string]bool, aliases map[string]string) (added, removed, changed []string, err error) {
	// 1. Plan against the current engines and build the new incarnations.
	p.mu.Lock()
	base := slices.Clone(p.engines)
	byName := make(map[string]*engine, len(base))
	for _, e := range base {
		byName[e.cfg.Name] = e
	}
	next := make([]*engine, len(want))
	var fresh []*engine
	replaces := map[*engine]*engine{} // a new incarnation: the one it replaces
	type update struct {
		e  *engine
		ec EngineConfig
	}
	var updates []update
	var errs []error
	for i, ec := range want {
		old := byName[ec.Name]
		switch {
		case old != nil && sameEngine(old.cfg, ec):
			next[i] = old
			continue
		case old != nil && inPlace(old.cfg, ec):
			next[i] = old
			updates = append(updates, update{old, ec})
			changed = append(changed, ec.Name)
			continue
		}
		e, err := p.newIncarnation(ec)
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
	p.mu.Unlock()
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

	// 2. Probe the new incarnations, outside the pool lock: a probe takes
	// up to HealthConfig.Timeout, and the request path and the gauges must
	// not wait for it. They are not in the pool yet, so only this
	// goroutine touches their probe state; probeMu keeps a probe round
	// from running beside them all the same.
	if len(fresh) > 0 {
		p.probeMu.Lock()
		var wg sync.WaitGroup
		for _, e := range fresh {
			wg.Go(func() { p.probe(p.ctx, e) })
		}
		wg.Wait()
		p.probeMu.Unlock()
	}

	// 3. Apply the batch, unless the pool changed meanwhile.
	p.mu.Lock()
	defer p.mu.Unlock()
	if !slices.Equal(p.engines, base) {
		return nil, nil, nil, errPoolChanged
	}
	keep := make(map[*engine]bool, len(next))
	for _, e := range next {
		keep[e] = true
	}
	for _, e := range base {
		if !keep[e] {
			p.retired = append(p.retired, e)
		}
	}
	for _, u := range updates {
		u.e.updateLocked(u.ec)
	}
	for _, e := range fresh {
		p.telByName[e.cfg.Name] = e.tel
		if old := replaces[e]; old != nil {
			// The operator drained the engine, not its URL or key.
			e.drained.Store(old.drained.Load())
		}
	}
	for _, name := range removed {
		// A later Add under this name builds attributes from its own URL.
		delete(p.telByName, name)
	}
	for _, e := range next {
		e.unready.Store(unready[e.cfg.Name])
	}
	p.engines = next
	p.aliases = newAliases
	p.pruneRetiredLocked()
	p.rebuildLocked()
	return added, removed, changed, nil
}

// inPlace reports whether next, the new configuration of the engine
// configured as cur, differs from it only in what its running incarnation
// can take: max_in_flight, and the configured models as long as both
// configure some (switching between configured and discovered models
// changes how the engine is probed). The URL, key, key variable and
// provider are the server and its identity: a change of one is a new
// incarnation.
func inPlace(cur, next EngineConfig) bool {
	if (len(cur.Models) == 0) != (len(next.Models) == 0) {
		return false
	}
	cur.MaxInFlight, cur.Models = next.MaxInFlight, next.Models
	return sameEngine(cur, next)
}

// updateLocked applies ec, an inPlace change of e's configuration, to e:
// its circuit breaker, and its configured models, keeping the adapters
// loaded on it at run time (they are in its models, not in its config).
// Call with Pool.mu held, and rebuild the snapshot after.
func (e *engine) updateLocked(ec EngineConfig) {
	e.maxInFlight.Store(int64(ec.MaxInFlight))
	e.cfg.MaxInFlight = ec.MaxInFlight
	if want := sortedSet(ec.Models); !slices.Equal(sortedSet(e.cfg.Models), want) {
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

// maxRetired bounds Pool.retired when nothing collects the metrics: past
// it, drained incarnations are dropped even when their name owes the
// gauges a last 0.
const maxRetired = 256

// pruneRetiredLocked drops the retired incarnations that have drained and
// whose name an engine in the pool has (that engine continues the name's
// gauge series, so no last 0 is owed), then, while the list is longer
// than maxRetired, the oldest drained ones. Without it the list would
// only shrink when the gauges are collected (observeInFlight), so a
// gateway nobody scrapes would keep every incarnation each reload or
// Remove retired. Call with Pool.mu held.
func (p *Pool) pruneRetiredLocked() {
	live := make(map[string]bool, len(p.engines))
	for _, e := range p.engines {
		live[e.cfg.Name] = true
	}
	drained := func(e *engine) bool {
		pf, dc := e.ep.InFlight()
		return pf == 0 && dc == 0
	}
	excess := 0
	for _, e := range p.retired {
		if !(live[e.cfg.Name] && drained(e)) {
			excess++
		}
	}
	excess -= maxRetired
	keep := p.retired[:0]
	for _, e := range p.retired {
		switch {
		case !drained(e):
		case live[e.cfg.Name]:
			continue
		case excess > 0:
			excess--
			continue
		}
		keep = append(keep, e)
	}
	clear(p.retired[len(keep):])
	p.retired = keep
}

// newIncarnation builds a new incarnation of ec with its own
// telemetry.Engine, so its metrics and spans carry its own server.address,
// server.port and gen_ai.provider.name while an older incarnation under the
// same name drains with its own. The pool's telemetry map is left as it
// was (apply installs the new one with the batch). Call with p.mu held.
func (p *Pool) newIncarnation(ec EngineConfig) (*engine, error) {
	prev, had := p.telByName[ec.Name]
	delete(p.telByName, ec.Name) // newEngine builds a fresh one from ec
	e, err := p.newEngine(ec)
	if had {
		p.telByName[ec.Name] = prev
	} else {
		delete(p.telByName, ec.Name)
	}
	return e, err
}

// aliasesOf builds the alias table of Config.Models.Aliases.
func aliasesOf(m map[string]string) map[string]alias {
	out := make(map[string]alias, len(m))
	for name, target := range m {
		q, _ := json.Marshal(target)
		out[name] = alias{target: target, quoted: q, raw: []byte(target)}
	}
	return out
}

// observeInFlightByName is observeInFlight with the reports of the
// incarnations that share a name merged into one (their counts summed):
// an engine replaced by a reload has two telemetry.Engines, with the same
// engine and phase attributes, while its old incarnation drains, and an
// observation callback must report each attribute set once.
func (p *Pool) observeInFlightByName(report func(e *telemetry.Engine, prefill, decode int64)) {
	type sum struct {
		tel    *telemetry.Engine
		pf, dc int64
	}
	var sums []sum
	p.observeInFlight(func(t *telemetry.Engine, pf, dc int64) {
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

// observeStateByName is observeState reporting each engine name once: the
// engine in the pool, not an older incarnation still draining under the
// same name.
func (p *Pool) observeStateByName(report func(e *telemetry.Engine, state int)) {
	var seen []string
	p.observeState(func(t *telemetry.Engine, state int) {
		if slices.Contains(seen, t.Name()) {
			return
		}
		seen = append(seen, t.Name())
		report(t, state)
	})
}
