package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/h1"
	"github.com/switchboard-gw/switchboard/internal/loglimit"
	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/version"
	"github.com/switchboard-gw/switchboard/quota"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Server is the OpenAI-compatible gateway: the public handler, the admin
// handler, the engine fleet and the per-request engine lifecycle. Create it
// with [New], call [Server.Start], serve [Server.Handler] and
// [Server.AdminHandler], and [Server.Close] it after the HTTP servers have
// shut down. All methods are safe for concurrent use.
type Server struct {
	// cfg is the configuration the server was built with; what a reload
	// may change is read from set instead.
	cfg   Config
	fleet *fleet.Fleet
	// set is the settings snapshot the request path reads, once per
	// request; Reload swaps it.
	set     atomic.Pointer[settings]
	metrics *telemetry.Metrics
	tracer  trace.Tracer
	// serverStart are the server span's start options (front).
	serverStart []trace.SpanStartOption
	tp          trace.TracerProvider
	prop        propagation.TextMapPropagator
	client      *http.Client
	log         *slog.Logger
	reg         metric.Registration // the in-flight gauge callback
	// statsReg is the engine stats gauges callback, stateReg the engine
	// state gauge's.
	statsReg metric.Registration
	stateReg metric.Registration
	// connReg is the engine connections gauge's callback (nil when the
	// engine client keeps no counts).
	connReg metric.Registration
	// kvReg is the KV-event instruments' callback registration, nil
	// without a KV index (WithKVIndex).
	kvReg metric.Registration
	// tok tokenizes requests for a policy routing on KV-cache events; nil
	// without a KV index.
	tok *tokenizer
	// sticky remembers which engine created which stored response.
	sticky *stickyIndex

	// skipReq is the set of client request headers never copied to an
	// engine; trusted the proxies whose forwarding headers are believed.
	skipReq map[string]bool
	trusted trustedProxies

	// ops is the operation table served (operations; tests add rows).
	ops []*operation

	// live counts engine attempts that have started and not ended. It is
	// the gateway's only per-request state outside the handler goroutines,
	// and it must read 0 whenever no request is in flight.
	live atomic.Int64
	// limits keeps the API keys' limits (limits.go).
	limits *limiter
	// inflight counts the proxied requests being handled (admit).
	inflight atomic.Int64
	// retries is the retry budget: the requests being retried at once,
	// against inflight.
	retries retryBudget
	// pending maps a served model to its generative attempts without a
	// first token yet (*atomic.Int64), counted while
	// Config.MaxPendingPerModel is set (pendingFor).
	pending sync.Map
	// buffered is the gateway-wide budget of request and response bytes
	// held in memory (Config.MaxBufferedBytes).
	buffered budget
	draining atomic.Bool
	// base is the parent of every connection's context (BaseContext);
	// Abort cancels it with errServerShutdown.
	base  context.Context
	abort context.CancelCauseFunc
	// onRelease, when set (tests only), is told the phase each attempt
	// released its slot from.
	onRelease func(engine string, p routing.Phase)
	closeOnce sync.Once
	// reloadMu applies one Reload or SetDiscovered at a time.
	reloadMu sync.Mutex
	// dynamic: the engine list may be empty (WithDynamicEngines).
	dynamic bool
	// holds are the reasons /ready is held at 503 (HoldReady), under
	// holdMu.
	holdMu sync.Mutex
	holds  []*readyHold
	// tiers counts the legs, overflows and fallbacks of each tier
	// (tiers.go).
	tiers tierStats
	// providerAuthLog bounds the log lines of providers refusing the
	// gateway's credentials (providerAnswer).
	providerAuthLog loglimit.Limiter
	// admin is the admin listener's token check (adminauth.go).
	admin adminGate
	// reloadFn is what POST /admin/reload runs (SetReloader); nil: none.
	reloadFn atomic.Pointer[ReloadFunc]
	// keys is the keys API's state: its writes' lock and the keys kept in
	// Redis (keysapi.go).
	keys *keysAPI
	// console is the operator console's history (consolering.go).
	console consoleState
}

type config struct {
	tp        trace.TracerProvider
	prop      propagation.TextMapPropagator
	transport http.RoundTripper
	log       *slog.Logger
	now       func() time.Time                       // the engine stats clock; tests inject one
	dynamic   bool                                   // WithDynamicEngines
	store     quota.Store                            // WithQuotaStore
	fleet     []fleet.Option                         // tests: more options for the fleet
	kv        *routing.KVIndex                       // WithKVIndex
	keysFile  func(path string) ([]KeyConfig, error) // WithKeysFileReader
}

// WithKVIndex gives the server the precise prefix index that the policy
// was built with (routing.WithKVIndex): the engines' KV-cache event
// subscriptions (Config.KVEvents, engines' kv_events endpoints) feed it,
// and requests routed on it are tokenized through the engines' /tokenize.
// Without it no engine is subscribed. A nil index is ignored.
func WithKVIndex(x *routing.KVIndex) Option {
	return optionFunc(func(c *config) {
		if x != nil {
			c.kv = x
		}
	})
}

// WithQuotaStore sets the store of the API keys' limits, such as a
// quota.Redis shared by the replicas; the caller closes it after the
// server. Default: a per-process quota.Memory the server owns. A nil
// argument is ignored.
func WithQuotaStore(st quota.Store) Option {
	return optionFunc(func(c *config) {
		if st != nil {
			c.store = st
		}
	})
}

// Option configures what a test or embedder injects into [New].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithTracerProvider sets the tracer provider for the server and engine
// spans. Default: a no-op provider. A nil argument is ignored.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tp = tp
		}
	})
}

// WithMeterProvider is kept so that code written against earlier versions
// builds; it does nothing. The HTTP server metrics it fed (otelhttp's)
// come from the *telemetry.Metrics given to New, as every instrument does.
//
// Deprecated: build the *telemetry.Metrics on the meter provider instead.
func WithMeterProvider(metric.MeterProvider) Option {
	return optionFunc(func(*config) {})
}

// WithPropagator sets the propagator used to extract the client's trace
// context and inject it into engine requests. Default: W3C trace context
// and baggage. A nil argument is ignored.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) {
		if p != nil {
			c.prop = p
		}
	})
}

// The values of Config.EngineClient.
const (
	EngineClientLean    = "lean"
	EngineClientNetHTTP = "net/http"
)

// WithTransport sets the round tripper used for engine requests and probes.
// Default: as Config.EngineClient says, internal/h1's client over
// NewTransport (its fallback for https), or NewTransport alone, both
// honouring Config.Timeouts.Connect. A nil argument is ignored.
func WithTransport(rt http.RoundTripper) Option {
	return optionFunc(func(c *config) {
		if rt != nil {
			c.transport = rt
		}
	})
}

// WithLogger sets the logger. Default: slog.Default(). A nil argument is
// ignored.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.log = l
		}
	})
}

// NewTransport returns the engine transport: keep-alive pools sized for a
// gateway, the connect timeout, no transparent compression (SSE must pass
// through byte for byte), and no proxy from the environment (engines are
// addressed directly).
func NewTransport(connectTimeout time.Duration) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   connectTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
}

// New validates cfg and builds a server. m must not be nil (use
// telemetry.NewMetrics(nil) for no-op metrics). Errors wrap
// ErrInvalidConfig.
func New(cfg Config, policy routing.Policy, m *telemetry.Metrics, opts ...Option) (*Server, error) {
	c := config{
		tp:   tracenoop.NewTracerProvider(),
		prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		log:  slog.Default(),
		now:  time.Now,
	}
	for _, o := range opts {
		o.apply(&c)
	}
	if err := cfg.validate(c.dynamic); err != nil {
		return nil, err
	}
	if policy == nil {
		return nil, fmt.Errorf("%w: nil routing policy", ErrInvalidConfig)
	}
	if m == nil {
		return nil, fmt.Errorf("%w: nil metrics", ErrInvalidConfig)
	}
	if c.transport == nil {
		c.transport = NewTransport(cfg.Timeouts.Connect)
		if cfg.EngineClient != EngineClientNetHTTP {
			c.transport = h1.New(c.transport, h1.WithConnectTimeout(cfg.Timeouts.Connect), h1.WithMaxConnsPerHost(cfg.MaxEngineConnections))
		}
	}
	fcfg := fleet.Config{Engines: cfg.Engines, Health: cfg.Health, Stats: cfg.EngineStats, Outlier: cfg.Outlier, Aliases: cfg.Models.Aliases,
		ConnectTimeout: cfg.Timeouts.Connect}
	fopts := append([]fleet.Option{fleet.WithTransport(c.transport), fleet.WithLogger(c.log), fleet.WithClock(c.now),
		fleet.WithPaths(fixedPaths(operations)...), fleet.WithKVIndex(c.kv, cfg.KVEvents.fleetConfig())}, c.fleet...)
	fl, err := fleet.New(fcfg, m, fopts...)
	if err != nil {
		return nil, err
	}
	trusted, err := parseTrustedProxies(cfg.TrustedProxies)
	if err != nil { // unreachable: Validate parsed them
		return nil, fmt.Errorf("%w: server.trusted_proxies: %v", ErrInvalidConfig, err)
	}
	s := &Server{
		skipReq:     notToEngine(cfg.StripRequestHeaders),
		trusted:     trusted,
		buffered:    budget{limit: cfg.MaxBufferedBytes},
		limits:      newLimiter(c.store, c.now, c.log),
		cfg:         cfg,
		dynamic:     c.dynamic,
		fleet:       fl,
		metrics:     m,
		tp:          c.tp,
		tracer:      c.tp.Tracer(telemetry.ScopeName, trace.WithInstrumentationVersion(version.Version)),
		serverStart: serverSpanStart(),
		prop:        c.prop,
		client:      &http.Client{Transport: c.transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:         c.log,
		sticky:      newStickyIndex(stickyEntries),
		ops:         operations,

		providerAuthLog: loglimit.Limiter{Interval: time.Second},
	}
	tokens, err := cfg.AdminAuth.adminTokens()
	if err != nil {
		return nil, err
	}
	s.admin.set(tokens)
	if tokens.count() > 0 {
		c.log.Info("admin write actions need one of the admin tokens", "tokens", len(tokens.write), "read_only_tokens", len(tokens.read), "reads", cfg.AdminAuth.Reads)
	}
	s.retries.inflight = &s.inflight
	s.set.Store(newSettings(cfg, policy))
	s.base, s.abort = context.WithCancelCause(context.Background())
	if c.kv != nil {
		s.tok = newTokenizer(cfg.KVEvents, s.client, m, c.log, s.base)
		s.kvReg, err = m.ObserveKVEvents(fl.ObserveKV)
		if err != nil {
			return nil, fmt.Errorf("register KV-event instruments: %w", err)
		}
	}
	s.reg, err = m.ObserveInFlight(fl.ObserveInFlight)
	if err != nil {
		return nil, fmt.Errorf("register in-flight gauge: %w", err)
	}
	s.statsReg, err = m.ObserveEngineStats(fl.ObserveStats)
	if err != nil {
		_ = s.reg.Unregister()
		return nil, fmt.Errorf("register engine stats gauges: %w", err)
	}
	s.stateReg, err = m.ObserveEngineState(fl.ObserveState)
	if err != nil {
		_ = s.reg.Unregister()
		_ = s.statsReg.Unregister()
		return nil, fmt.Errorf("register engine state gauge: %w", err)
	}
	if cc, ok := c.transport.(connCounter); ok {
		s.connReg, err = m.ObserveConnections(func(report func(e *telemetry.Engine, active, idle, waiting int64)) {
			counts := cc.ConnCounts()
			fl.ObserveBases(func(e *telemetry.Engine, base string) {
				n := counts[hostPort(base)]
				report(e, int64(n.Active), int64(n.Idle), int64(n.Waiting))
			})
		})
		if err != nil {
			_ = s.reg.Unregister()
			_ = s.statsReg.Unregister()
			_ = s.stateReg.Unregister()
			return nil, fmt.Errorf("register engine connections gauge: %w", err)
		}
	}
	// Last: it starts the poll of the keys in Redis, which Close stops.
	if s.keys, err = newKeysAPI(s, cfg, c.keysFile, c.log); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// connCounter is an engine client that counts its connections per
// host:port (internal/h1.Transport).
type connCounter interface {
	ConnCounts() map[string]h1.ConnCount
}

// hostPort returns the host:port an engine client dials for the base URL
// base: its host, with the scheme's default port when it names none.
func hostPort(base string) string {
	u, err := url.Parse(base)
	if err != nil {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}

// Fleet returns the engine fleet (to add or remove engines at run time,
// read their status, probe them).
func (s *Server) Fleet() *fleet.Fleet { return s.fleet }

// LiveAttempts returns the number of engine attempts started and not yet
// ended. It is 0 whenever no request is in flight; tests assert it.
func (s *Server) LiveAttempts() int64 { return s.live.Load() }

// Start probes every engine once (discovering models) and starts the
// periodic health checks.
func (s *Server) Start() { s.fleet.Start() }

// Drain makes /ready answer 503 so load balancers stop sending traffic;
// call it before http.Server.Shutdown.
func (s *Server) Drain() { s.draining.Store(true) }

// BaseContext is the http.Server BaseContext to serve [Server.Handler]
// with: the parent of every request's context, which [Server.Abort]
// cancels. Without it Abort cannot end streams.
func (s *Server) BaseContext(net.Listener) context.Context { return s.base }

// Abort ends every request still in flight: each engine request is
// cancelled, a stream that has started gets a final SSE error event with
// code server_shutdown (error.type server_shutdown), a response that has
// not started gets 503 server_shutdown. Call it when the shutdown deadline
// has passed, then [Server.Wait] for the handlers to return. Requests
// arriving after Abort are cut at once.
func (s *Server) Abort() { s.abort(errServerShutdown) }

// InFlight returns the number of proxied requests being handled.
func (s *Server) InFlight() int64 { return s.inflight.Load() }

// Wait returns nil once no proxied request is being handled (every slot
// released, every duration recorded), or ctx's error if ctx ends first.
// It polls every 5 ms.
func (s *Server) Wait(ctx context.Context) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for s.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Close stops health checks and stats scraping, unregisters the gauge
// callbacks and closes idle engine connections. Call it after the HTTP
// servers have shut down and [Server.Wait] has returned, and before the
// telemetry providers shut down, so every request's telemetry is recorded
// before the last export.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.abort(errServerShutdown)
		s.fleet.Close()
		if s.reg != nil {
			err = s.reg.Unregister()
		}
		if s.statsReg != nil {
			err = errors.Join(err, s.statsReg.Unregister())
		}
		if s.stateReg != nil {
			err = errors.Join(err, s.stateReg.Unregister())
		}
		if s.connReg != nil {
			err = errors.Join(err, s.connReg.Unregister())
		}
		if s.kvReg != nil {
			err = errors.Join(err, s.kvReg.Unregister())
		}
		if s.tok != nil {
			s.tok.close()
		}
		s.client.CloseIdleConnections()
		err = errors.Join(err, s.keys.close())
		s.limits.wg.Wait() // the background releases, before the caller closes its store
		if s.limits.owned {
			err = errors.Join(err, s.limits.store.Close())
		}
	})
	return err
}

// Handler returns the public OpenAI-compatible handler:
//
//	every route of the operation table   proxied to an engine (README, "Routes")
//	GET  /v1/models          the sorted union of the routable engines' models and the aliases
//	GET  /v1/models/{model}  one of them (the SDKs' models.retrieve); 404 model_not_found
//	GET  /health             liveness (always 200 while the process serves)
//	GET  /ready              200 when at least one healthy engine has reported models
//
// (HEAD is answered on the GET routes.)
// The middleware order is: front (request id, server span and HTTP server
// metrics, inside chi so http.route is the route pattern, not for /health
// and /ready; and the access log, Config.AccessLog), panic recovery
// (inside the span, so a recovered panic is recorded as a 500), and on
// the proxied routes the admission
// check (Config.MaxConcurrentRequests). No middleware buffers or compresses
// responses: SSE is flushed event by event. Serve it with
// [Server.BaseContext] as the http.Server's BaseContext.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(s.front)
	r.Use(s.recoverer)
	r.NotFound(door(func(w http.ResponseWriter, r *http.Request) error {
		anthropicPath(r)
		return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found", Message: "no route for " + r.Method + " " + r.URL.Path}
	}))
	r.MethodNotAllowed(door(func(w http.ResponseWriter, req *http.Request) error {
		// chi only sets Allow in its default handler; RFC 9110 requires it.
		anthropicPath(req)
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
			if r.Match(chi.NewRouteContext(), m, req.URL.Path) {
				w.Header().Add("Allow", m)
			}
		}
		return &APIError{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed", Message: "method " + req.Method + " is not allowed on " + req.URL.Path}
	}))
	r.Group(func(r chi.Router) {
		for _, op := range s.ops {
			h := withOperation(op, s.authenticate(s.admit(s.proxyHandler(op))))
			for _, path := range op.paths {
				r.Method(op.method, path, h)
			}
		}
		getHead(r, "/v1/models", s.authenticate(door(s.models)).ServeHTTP)
		getHead(r, "/v1/models/*", s.authenticate(door(s.model)).ServeHTTP)
		getHead(r, "/health", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("ok\n"))
		})
		getHead(r, "/ready", door(s.ready))
	})
	return r
}

// anthropicPath makes the error envelope Anthropic's for a request under
// /v1/messages that matched no route (or no method), as the Anthropic
// clients expect of every answer there.
func anthropicPath(r *http.Request) {
	if st := stateFrom(r.Context()); st != nil && strings.HasPrefix(r.URL.Path, "/v1/messages") {
		st.env = envAnthropic
	}
}

// getHead routes GET and HEAD on pattern to h (net/http drops the body of
// a HEAD response).
func getHead(r chi.Router, pattern string, h http.HandlerFunc) {
	r.Get(pattern, h)
	r.Head(pattern, h)
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) error {
	snap := s.fleet.Snapshot() // once: one view for the whole answer
	body := snap.ModelsBody()
	if body == nil && snap.AllDrained() {
		return errDrained("every engine is drained: each finishes its requests in flight and takes no new ones")
	}
	if body == nil {
		return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "no_models",
			Message: "no routable engine (healthy and awake) has reported its models"}
	}
	if key := keyOf(r); key != nil {
		body = modelsFor(key, snap.Cards())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = w.Write(body)
	return nil
}

// model answers GET /v1/models/{model}: the model's entry as /v1/models
// lists it. The id is the rest of the path, so ids with slashes
// ("meta-llama/Llama-3.1-8B") work as the SDKs send them.
func (s *Server) model(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	snap := s.fleet.Snapshot()
	card, ok := snap.Cards()[id]
	if key := keyOf(r); key != nil && !key.allows(id) {
		// Listed only for the keys that may use it (modelsFor).
		return errModelNotFound(id)
	}
	if !ok {
		if _, err := snap.Lookup(id); errors.Is(err, fleet.ErrDrained) {
			return lookupError(id, err)
		}
		if snap.Known(id) {
			return routing.ErrNoEndpoint
		}
		return errModelNotFound(id)
	}
	b, _ := json.Marshal(card)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
	return nil
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) error {
	if s.draining.Load() {
		return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "draining", Message: "the gateway is shutting down"}
	}
	if held := s.heldReady(); held != "" {
		return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "starting", Message: "waiting for " + held}
	}
	if snap := s.fleet.Snapshot(); s.set.Load().cfg.ReadyRequiresEngine && snap.ModelsBody() == nil { // fleet.Ready, on one view
		if snap.AllDrained() {
			return errDrained("every engine is drained: each finishes its requests in flight and takes no new ones")
		}
		return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "no_ready_engine", Message: "no healthy engine has reported its models yet"}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ready\n"))
	return nil
}

// AdminHandler returns the admin handler:
//
//	GET /metrics         prom (the Prometheus exposition of the OTel metrics); 404 when nil
//	GET /admin/engines   JSON: every engine's models, health, routability, in-flight prefill/decode
//	                     and last scraped stats (fleet.EngineStatsStatus), plus the gateway's live
//	                     attempts, requests in flight and buffered bytes
//	GET /admin/keys      JSON: every API key's name, models, limits and this process's usage
//	                     (KeyStatus); never a key or its hash
//	POST /admin/reload   the configuration loaded and applied again, as on SIGHUP (SetReloader)
//	GET /debug/pprof/*   the runtime profiles
//	/admin/engines/{name}/... and /admin/models/...  engine admin (sleep, wake_up, is_sleeping,
//	                     reset_prefix_cache, LoRA load/unload, drain, undrain): see mountEngineAdmin
//
// Serve it on a separate, private listener.
func (s *Server) AdminHandler(prom http.Handler) http.Handler {
	r := chi.NewRouter()
	r.Use(s.adminAuth)
	if prom != nil {
		r.Method(http.MethodGet, "/metrics", prom)
	}
	r.Get("/admin/engines", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Engines       []fleet.EngineStatus `json:"engines"`
			LiveAttempts  int64                `json:"live_attempts"`
			Requests      int64                `json:"requests_in_flight"` // proxied requests being handled
			BufferedBytes int64                `json:"buffered_bytes"`     // request and response bytes held
			KVIndex       *kvIndexStatus       `json:"kv_index,omitempty"` // the precise prefix index; absent without one
			Tiers         []TierStatus         `json:"tiers"`              // each tier's engines and share of the legs
		}{s.fleet.Status(), s.live.Load(), s.inflight.Load(), s.buffered.used.Load(), s.kvIndexStatus(), s.Tiers()})
	})
	r.Get("/admin/keys", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Keys []KeyStatus `json:"keys"`
		}{s.Keys()})
	})
	s.mountEngineAdmin(r)
	s.mountAdminReload(r)
	s.mountKeysAPI(r)
	s.mountConsole(r)
	r.HandleFunc("/debug/pprof/", pprof.Index)
	r.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	r.HandleFunc("/debug/pprof/profile", pprof.Profile)
	r.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	r.HandleFunc("/debug/pprof/trace", pprof.Trace)
	r.Handle("/debug/pprof/{name}", http.HandlerFunc(pprof.Index))
	return r
}

// settings are what the request path reads from the configuration, as one
// immutable snapshot: a request loads it once (inbound.set) and keeps it to
// its end, so a reload (Server.Reload) applies to the requests that arrive
// after it and never changes one midway.
type settings struct {
	cfg    Config
	policy routing.Policy
	// parser parses request bodies; it hashes prompt blocks when the
	// policy routes on them (routing.PrefixHasher).
	parser oai.Parser
	// sessionHeader is the canonical header carrying the session key, ""
	// when the policy does not route on sessions (routing.SessionKeyed).
	sessionHeader string
	// kvBlocks is the token block size of a policy that routes on the
	// engines' KV-cache events (routing.KVRouter), 0 for another.
	kvBlocks int
	// prices are cfg.Pricing resolved.
	prices pricing
	// retryOn is cfg.Retry.On parsed.
	retryOn retryMask
	// keys are cfg.Auth.Keys compiled; none when auth is off.
	keys []apiKey
}

// newSettings builds the snapshot for cfg (validated) and policy (not nil).
func newSettings(cfg Config, policy routing.Policy) *settings {
	set := &settings{cfg: cfg, policy: policy, retryOn: cfg.Retry.mask(), keys: compileKeys(cfg.Auth), prices: newPricing(cfg.Pricing)}
	if ph, ok := policy.(routing.PrefixHasher); ok {
		set.parser.BlockBytes, set.parser.MaxBlocks = ph.PrefixBlocks()
	}
	if sk, ok := policy.(routing.SessionKeyed); ok {
		set.sessionHeader = textproto.CanonicalMIMEHeaderKey(sk.SessionHeader())
	}
	if kr, ok := policy.(routing.KVRouter); ok {
		set.kvBlocks = kr.KVBlockSize()
	}
	return set
}
