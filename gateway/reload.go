package gateway

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/cfgdiff"
	"github.com/switchboard-gw/switchboard/routing"
)

// ReloadReport says what a [Server.Reload] changed. Engine names are in
// configuration order (Removed: in the order the engines ran); keys are
// spelled as the YAML file spells them ("server.timeouts.idle",
// "models.aliases").
type ReloadReport struct {
	// Changes are the engines added, removed and changed (see
	// fleet.Changes); Unready and Ready stay empty: a reload changes no
	// discovered engine's readiness.
	fleet.Changes
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
	return r.Changes.Applied() || len(r.Settings) > 0 || r.PolicyChanged
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
// are updated in place, engines whose fleet.EngineConfig otherwise differs are
// replaced (see ReloadReport.Changed). A removed engine, and the old
// incarnation of a replaced one, take no new request;
// their requests in flight finish and release their slots into their own
// incarnation, whose gauges are reported until they drain. Each new
// incarnation is probed (health, and its models when none are
// configured) before the batch is applied, each probe bounded by
// fleet.HealthConfig.Timeout, so a new engine serves at once and one that is
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
	rep, err := s.reload(cfg, policy)
	s.console.reloads.note(time.Now(), rep, err) // the console's reload history
	return rep, err
}

// NoteRejectedReload puts a reload rejected before [Server.Reload] was
// called (a config file that does not parse or load) in the console's
// reload history, with its error; Reload records its own results. Safe
// for concurrent use.
func (s *Server) NoteRejectedReload(err error) {
	if err != nil {
		s.console.reloads.note(time.Now(), ReloadReport{}, err)
	}
}

// reload is Reload without its entry in the console's history.
func (s *Server) reload(cfg Config, policy routing.Policy) (ReloadReport, error) {
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
	// Admin tokens that cannot be read reject the reload, as they keep
	// the gateway from starting: the configuration in force stays, rather
	// than one whose admin actions would be open or closed unintended.
	tokens, err := eff.AdminAuth.adminTokens()
	if err != nil {
		return ReloadReport{}, err
	}
	changes, err := s.fleet.SetConfigured(eff.Engines, eff.Models.Aliases)
	switch {
	case errors.Is(err, fleet.ErrEngineLeftOut):
		// A configured engine now has a discovered engine's name: the
		// configured one wins.
		s.log.Warn("discovered engines left out by the reload", "error", err)
	case err != nil:
		return ReloadReport{}, err
	}
	rep.Changes = changes
	rotated := s.admin.swap(tokens) // with the settings below: past the last failure
	if un := unservedFallbacks(eff.Models, s.fleet.Snapshot()); len(un) > 0 {
		// Allowed (engines come and go), but worth knowing: a request
		// falling back finds none of these until an engine serves them.
		s.log.Warn("fallback models no engine serves now", "models", un)
	}
	if !reflect.DeepEqual(cur.cfg.Outlier, eff.Outlier) {
		// New thresholds from the next outcome, new ejection times from
		// the next ejection; turned off, every ejected engine returns.
		s.fleet.SetOutlier(eff.Outlier)
	}
	rep.PolicyChanged = !samePolicy(policy, cur.policy)
	rep.Settings = configDiff(cur.cfg, eff)
	if rotated && !slices.Contains(rep.Settings, "admin.auth") {
		// The files' names are the same, their tokens are not: a
		// rotated Secret is a change applied.
		rep.Settings = append(rep.Settings, "admin.auth")
	}
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
// engine_stats (the fleet's tickers and probe client), log.access (the
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
// (fleet.Fleet.SetConfigured does).
func configDiff(a, b Config) []string {
	var keys []string
	cfgdiff.Diff("server", reflect.ValueOf(a), reflect.ValueOf(b), nil, &keys)
	if a.AccessLog != b.AccessLog {
		keys = append(keys, "log.access")
	}
	if !maps.Equal(a.Models.Aliases, b.Models.Aliases) {
		keys = append(keys, "models.aliases")
	}
	if !reflect.DeepEqual(a.AdminAuth, b.AdminAuth) {
		keys = append(keys, "admin.auth")
	}
	if !reflect.DeepEqual(a.Models.Fallbacks, b.Models.Fallbacks) && len(a.Models.Fallbacks)+len(b.Models.Fallbacks) > 0 {
		keys = append(keys, "models.fallbacks")
	}
	if !reflect.DeepEqual(a.Models.ContextFallbacks, b.Models.ContextFallbacks) && len(a.Models.ContextFallbacks)+len(b.Models.ContextFallbacks) > 0 {
		keys = append(keys, "models.context_fallbacks")
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
	if !reflect.DeepEqual(a.Migration, b.Migration) {
		keys = append(keys, "migration")
	}
	if !reflect.DeepEqual(a.Pricing, b.Pricing) && len(a.Pricing)+len(b.Pricing) > 0 {
		keys = append(keys, "pricing")
	}
	if a.Disaggregation != b.Disaggregation {
		keys = append(keys, "disaggregation")
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
