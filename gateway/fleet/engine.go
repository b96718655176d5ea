package fleet

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Engine is one incarnation of a configured engine. Removing an engine and
// adding it again under the same name creates a new incarnation with its own
// routing.Endpoint, so slots held on the old one are released there
// (docs/cases.md L03). A reload that changes only an engine's max_in_flight
// or its configured models keeps the incarnation and updates it in place
// (Fleet.tryApply); a change of its role or group is a new incarnation, as
// for its URL: they are fixed for an incarnation's life (its span and
// state gauge attributes carry the role), so the request path reads them
// without a lock.
//
// The request path reads an Engine through its methods, all safe for
// concurrent use; everything else about it is the fleet's.
type Engine struct {
	// cfg is the engine's configuration. Its Models and MaxInFlight are
	// rewritten in place by a reload, under Fleet.mu: read them under it,
	// or through models and maxInFlight.
	cfg    EngineConfig
	ep     *routing.Endpoint
	tel    *telemetry.Engine
	base   string                   // the engine's base URL without a trailing slash, never with userinfo; the route path is appended
	urls   map[string]string        // the engine URL of every path given to WithPaths, built once
	static bool                     // models come from config
	auth   atomic.Pointer[[]string] // the Authorization header value, nil when the engine takes none; a reload may replace it (rereadKey)
	shown  string                   // the URL as logs and /admin/engines show it: userinfo redacted
	header []string                 // the X-Switchboard-Engine value, shared by every response
	role   Role                     // EngineConfig.Role, parsed
	group  string                   // EngineConfig.Group

	// prov is a provider engine's request shape (provider.go), nil for a
	// self-hosted engine; rt its own transport (a provider's, or one with
	// a CAFile), nil for the gateway's.
	prov *provider
	rt   http.RoundTripper
	// key is the engine's bare key (api_key, its variable or file), nil
	// for none: a provider sends it in its own header.
	key atomic.Pointer[string]
	// modelMap is EngineConfig.ModelMap with each provider name quoted
	// as a JSON string, fixed for the incarnation.
	modelMap map[string]mapped
	// tier is EngineConfig.Tier (defaulted); maxQueue MaxQueueDepth. A
	// reload changes both in place.
	tier, maxQueue atomic.Int64

	// spanAttrs are the engine span attributes that never change:
	// switchboard.engine and switchboard.engine.role.
	spanAttrs []attribute.KeyValue

	// maxInFlight is the engine's circuit breaker (EngineConfig.MaxInFlight,
	// 0 for none), an atomic so a reload changes it under the requests in
	// flight, which keep counting against it.
	maxInFlight atomic.Int64

	// reportsCached: an answer of this incarnation carried
	// usage.prompt_tokens_details.cached_tokens (vLLM with
	// --enable-prompt-tokens-details), so an answer without it had no
	// prefix cache hit (NoteCachedTokens).
	reportsCached atomic.Bool

	models  atomic.Pointer[[]string] // sorted; nil until known
	lastErr atomic.Pointer[string]
	// cards are the engine's /v1/models entries by id (created, owned_by,
	// root, parent, max_model_len), nil until discovered; static engines
	// have none.
	cards atomic.Pointer[map[string]ModelCard]
	// sleeping is set when the engine was put to sleep through the admin
	// API, cleared by wake-up (or by a probe that finds it awake); a
	// sleeping engine leaves routing.
	sleeping atomic.Bool
	// drained is set by POST /admin/engines/{name}/drain and cleared by
	// .../resume: the engine takes no new requests and finishes the ones
	// it has (state draining), while staying in the fleet and probed.
	drained atomic.Bool
	// unready is set while the engine's discovery source reports it not
	// ready (a Kubernetes endpoint not ready or terminating,
	// DiscoveredEngine.Unready): like drained, it takes no new requests
	// and finishes the ones it has, keeping its health, outlier state and
	// stats, so turning ready again is instant. Set by Fleet.tryApply.
	unready atomic.Bool
	// sleepGen counts the admin sleep and wake-up calls, so a probe that
	// asked /is_sleeping before one of them does not undo it.
	sleepGen atomic.Uint64

	// statsFailing is set while the engine's stats scrapes fail (logged
	// once per streak).
	statsFailing atomic.Bool

	// probed is set once the first probe has given its verdict; until
	// then an engine without known models keeps unknown models answering
	// 503 rather than 404 (discovery pending).
	probed atomic.Bool

	// Probe state, touched only under Fleet.probeMu.
	fails        int
	lastDiscover time.Time

	// statsURL is the engine's metrics URL (EngineStatsConfig.Path), never
	// with userinfo.
	statsURL string
	// prefix is the prefix cache bookkeeping, touched only under
	// Fleet.statsMu.
	prefix prefixState
	// blocked is the stats verdict the routing snapshot was built with:
	// fresh stats say the engine sleeps or is unhealthy. Touched only under
	// Fleet.mu.
	blocked bool
	// kv is the incarnation's KV-event subscription (kvevents.go).
	kv kvState
	// kvSizeLogged: a scraped KV block size other than
	// kv_events.block_size was logged (checkBlockSize).
	kvSizeLogged atomic.Bool
	// retired is set when the incarnation leaves the fleet (Remove, a
	// reload or discovery dropping or replacing it): it finishes its
	// requests in flight and takes no new ones. Touched only under
	// Fleet.mu.
	retired bool
}

// Name returns the engine's configured name.
func (e *Engine) Name() string { return e.cfg.Name }

// Endpoint returns the incarnation's routing endpoint: its in-flight
// counters (take a slot on it with routing.Slot), health, outlier state
// and stats.
func (e *Engine) Endpoint() *routing.Endpoint { return e.ep }

// Telemetry returns the incarnation's telemetry.Engine: its metric and
// span attributes (engine, server.address, server.port, provider).
func (e *Engine) Telemetry() *telemetry.Engine { return e.tel }

// SpanAttrs returns the engine span attributes that never change:
// switchboard.engine (the name) and switchboard.engine.role (the role,
// "both", "prefill" or "decode"). The slice is shared: callers must not
// modify it.
func (e *Engine) SpanAttrs() []attribute.KeyValue { return e.spanAttrs }

// Role returns the engine's prefill/decode role (EngineConfig.Role,
// RoleBoth when unset). It is fixed for the incarnation: a reload or
// discovery changing it makes a new one.
func (e *Engine) Role() Role { return e.role }

// Group returns the engine's pairing group (EngineConfig.Group), "" for
// none: a prefill engine with a group is paired only with decode engines
// of the same group, one without pairs with any. Fixed for the
// incarnation, like [Engine.Role].
func (e *Engine) Group() string { return e.group }

// Header returns the X-Switchboard-Engine header value naming the engine,
// one element. The slice is shared by every response: callers must not
// modify it.
func (e *Engine) Header() []string { return e.header }

// Auth returns the Authorization header value the engine takes (its
// Bearer key, or Basic credentials from its URL), or nil when it takes
// none. The slice is shared: callers must not modify it.
func (e *Engine) Auth() []string {
	if p := e.auth.Load(); p != nil {
		return *p
	}
	return nil
}

// engineKey returns ec's key: api_key, or the value of api_key_env, or
// the content of api_key_file trimmed; "" when it has none. The error
// (wrapping ErrInvalidConfig) names the variable or the file, never a
// key.
func engineKey(ec EngineConfig) (string, error) {
	switch {
	case ec.APIKeyEnv != "":
		if key := os.Getenv(ec.APIKeyEnv); key != "" {
			return key, nil
		}
		return "", fmt.Errorf("%w: engine %q needs a key but %s is not set", ErrInvalidConfig, ec.Name, ec.APIKeyEnv)
	case ec.APIKeyFile != "":
		b, err := os.ReadFile(ec.APIKeyFile)
		if err != nil {
			return "", fmt.Errorf("%w: engine %q needs a key but its api_key_file %s cannot be read: %v", ErrInvalidConfig, ec.Name, ec.APIKeyFile, errors.Unwrap(err))
		}
		if key := strings.TrimSpace(string(b)); key != "" {
			return key, nil
		}
		return "", fmt.Errorf("%w: engine %q needs a key but its api_key_file %s is empty", ErrInvalidConfig, ec.Name, ec.APIKeyFile)
	}
	return ec.APIKey, nil
}

// rereadKey reads the key of an engine whose key comes from a variable or
// a file again (a reload), and uses it from the next request when it
// changed, reporting whether it did; a key that cannot be read keeps the
// one in use, and is logged. Under Fleet.mu.
func (f *Fleet) rereadKey(e *Engine, ec EngineConfig) (changed bool) {
	if ec.APIKeyEnv == "" && ec.APIKeyFile == "" {
		return false
	}
	key, err := engineKey(ec)
	if err != nil {
		f.log.Warn("cannot read the engine's key again; the one in use is kept", "engine", ec.Name, "error", err)
		return false
	}
	if auth := []string{"Bearer " + key}; !slices.Equal(e.Auth(), auth) {
		e.auth.Store(&auth)
		e.key.Store(&key)
		f.log.Info("engine's key changed; used from the next request", "engine", ec.Name)
		return true
	}
	return false
}

// Base returns the engine's base URL without a trailing slash and without
// userinfo: a request path is appended to it.
func (e *Engine) Base() string { return e.base }

// PathURL returns the engine URL of path (Base + path) when path is one
// given to [WithPaths], built once, and false otherwise.
func (e *Engine) PathURL(path string) (string, bool) {
	u, ok := e.urls[path]
	return u, ok
}

// NoteCachedTokens records that an answer of the engine carried
// usage.prompt_tokens_details.cached_tokens. Safe for concurrent use.
func (e *Engine) NoteCachedTokens() {
	if !e.reportsCached.Load() {
		e.reportsCached.Store(true)
	}
}

// ReportsCachedTokens reports whether an answer of the engine has carried
// usage.prompt_tokens_details.cached_tokens: vLLM writes it only when run
// with --enable-prompt-tokens-details and only for a non-zero count
// (vllm/entrypoints/openai/serving_chat.py), so from such an engine an
// answer without it had no cached prompt token.
func (e *Engine) ReportsCachedTokens() bool { return e.reportsCached.Load() }

// MaxInFlight returns the engine's circuit breaker, the most requests the
// gateway may have on it at once (EngineConfig.MaxInFlight; 0 for none).
// A reload may change it while requests run.
func (e *Engine) MaxInFlight() int64 { return e.maxInFlight.Load() }

func (e *Engine) knownModels() []string {
	if p := e.models.Load(); p != nil {
		return *p
	}
	return nil
}

// state is the incarnation's state, the one place it is decided: what
// /admin/engines and switchboard.engine.state show, and what the routing
// snapshot routes to (only a ready engine, routable). It combines
// routing's verdicts, one per writer: removal, discovery and the admin
// drain (draining), the probes (unhealthy), outlier detection (ejected),
// the admin API and the engine's stats (sleeping). Call with Fleet.mu
// held: blocked and retired are guarded by it.
func (e *Engine) state() routing.State {
	return routing.Verdicts{
		Draining:  e.retired || e.drained.Load() || e.unready.Load(),
		Unhealthy: !e.ep.Healthy(),
		Ejected:   e.ep.Outlier().Ejected(),
		Sleeping:  e.sleeping.Load() || e.blocked, // or self-reported unhealthy in fresh stats
	}.State()
}

// routable reports whether e may receive new requests: its state is
// ready. Call with Fleet.mu held.
func (e *Engine) routable() bool { return e.state() == routing.StateReady }

func (f *Fleet) newEngine(ec EngineConfig) (*Engine, error) {
	if err := ec.Validate(); err != nil {
		return nil, err
	}
	base, _ := url.Parse(ec.baseURL())
	// Credentials in the URL become an Authorization header (Basic, as
	// net/http's client would send them) and never appear in a URL the
	// gateway logs, shows or sends.
	userinfo := base.User
	base.User = nil
	key, err := engineKey(ec)
	if err != nil {
		return nil, err
	}
	prov, rt, err := newProvider(ec, f.connectTimeout)
	if err != nil {
		return nil, err
	}
	port, _ := strconv.Atoi(base.Port())
	if port == 0 {
		port = 80
		if base.Scheme == "https" {
			port = 443
		}
	}
	tel, ok := f.telByName[ec.Name]
	if !ok {
		tel = f.metrics.Engine(ec.Name, telemetry.WithProvider(ec.providerName(base.Hostname())), telemetry.WithServer(base.Hostname(), port),
			telemetry.WithRole(ec.role().String()))
		f.telByName[ec.Name] = tel
	}
	e := &Engine{cfg: ec, ep: routing.NewEndpoint(ec.Name, base), tel: tel, shown: redactURL(ec.baseURL()), header: []string{ec.Name},
		role: ec.role(), group: ec.Group, prov: prov, rt: rt}
	e.maxInFlight.Store(int64(ec.MaxInFlight))
	e.tier.Store(int64(ec.tier()))
	e.maxQueue.Store(int64(ec.MaxQueueDepth))
	if len(ec.ModelMap) > 0 {
		e.modelMap = make(map[string]mapped, len(ec.ModelMap))
		for from, to := range ec.ModelMap {
			q, _ := json.Marshal(to)
			e.modelMap[from] = mapped{Name: to, Quoted: q}
		}
	}
	if key != "" {
		e.key.Store(&key)
	}
	// gen_ai.provider.name, server.address and server.port are set when
	// the span starts (telemetry.Attrs.SpanStart).
	e.spanAttrs = []attribute.KeyValue{telemetry.AttrSpanEngine.String(ec.Name), telemetry.AttrSpanEngineRole.String(e.role.String())}
	switch {
	case key != "":
		e.auth.Store(&[]string{"Bearer " + key})
	case userinfo != nil:
		pw, _ := userinfo.Password()
		e.auth.Store(&[]string{"Basic " + base64.StdEncoding.EncodeToString([]byte(userinfo.Username()+":"+pw))})
	}
	e.base = strings.TrimSuffix(base.String(), "/")
	e.urls = make(map[string]string, len(f.paths))
	for _, path := range f.paths {
		e.urls[path] = e.base + path
	}
	e.statsURL = base.JoinPath(f.stats.Path).String()
	if ms := ec.servedModels(); len(ms) > 0 {
		e.models.Store(&ms)
		e.static = true
	}
	if prov != nil {
		// Never probed: known to serve its models from the start, its
		// health its traffic's (outlier detection). No prefix routing.
		e.probed.Store(true)
		e.ep.SetExternal()
	}
	return e, nil
}

// redactURL returns raw with any userinfo replaced by "xxxxx", so neither a
// user name nor a password shows (url.URL.Redacted keeps the user name,
// which is often the token itself).
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	u.User = url.User("xxxxx")
	return u.String()
}

// mapped is a model's name at a provider (EngineConfig.ModelMap): as is,
// and quoted as a JSON string for the request body.
type mapped struct {
	Name   string
	Quoted []byte
}

// MapModel returns the name engine model model has at this engine
// (EngineConfig.ModelMap), as is and as a JSON string; ok is false when
// the engine knows it by the same name.
func (e *Engine) MapModel(model string) (name string, quoted []byte, ok bool) {
	m, ok := e.modelMap[model]
	return m.Name, m.Quoted, ok
}

// servedModels returns the models ec configures, Models and the keys of
// ModelMap, sorted and without duplicates.
func (ec EngineConfig) servedModels() []string {
	ms := slices.Clone(ec.Models)
	for m := range ec.ModelMap {
		ms = append(ms, m)
	}
	slices.Sort(ms)
	return slices.Compact(ms)
}
