package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// engine is one incarnation of a configured engine. Removing an engine and
// adding it again under the same name creates a new incarnation with its own
// routing.Endpoint, so slots held on the old one are released there
// (shared/cases L03). A reload that changes only an engine's max_in_flight
// or its configured models keeps the incarnation and updates it in place
// (Pool.tryApply).
type engine struct {
	// cfg is the engine's configuration. Its Models and MaxInFlight are
	// rewritten in place by a reload, under Pool.mu: read them under it,
	// or through models and maxInFlight.
	cfg    EngineConfig
	ep     *routing.Endpoint
	tel    *telemetry.Engine
	base   string            // the engine's base URL without a trailing slash, never with userinfo; the route path is appended
	urls   map[string]string // the engine URL of every fixed path of the operation table, built once
	static bool              // models come from config
	auth   []string          // the Authorization header value, or nil when the engine takes none
	shown  string            // the URL as logs and /admin/engines show it: userinfo redacted
	header []string          // the X-Switchboard-Engine value, shared by every response

	// spanAttrs are the engine span attributes that never change:
	// server.address, server.port, switchboard.engine.
	spanAttrs []attribute.KeyValue

	// maxInFlight is the engine's circuit breaker (EngineConfig.MaxInFlight,
	// 0 for none), an atomic so a reload changes it under the requests in
	// flight, which keep counting against it.
	maxInFlight atomic.Int64

	models  atomic.Pointer[[]string] // sorted; nil until known
	lastErr atomic.Pointer[string]
	// cards are the engine's /v1/models entries by id (created, owned_by,
	// root, parent, max_model_len), nil until discovered; static engines
	// have none.
	cards atomic.Pointer[map[string]modelObject]
	// sleeping is set when the engine was put to sleep through the admin
	// API, cleared by wake-up (or by a probe that finds it awake); a
	// sleeping engine leaves routing.
	sleeping atomic.Bool
	// drained is set by POST /admin/engines/{name}/drain and cleared by
	// .../resume: the engine takes no new requests and finishes the ones
	// it has (state draining), while staying in the pool and probed.
	drained atomic.Bool
	// unready is set while the engine's discovery source reports it not
	// ready (a Kubernetes endpoint not ready or terminating,
	// DiscoveredEngine.Draining): like drained, it takes no new requests
	// and finishes the ones it has, keeping its health, outlier state and
	// stats, so turning ready again is instant. Set by Pool.tryApply.
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

	// Probe state, touched only under Pool.probeMu.
	fails        int
	lastDiscover time.Time

	// statsURL is the engine's metrics URL (EngineStatsConfig.Path), never
	// with userinfo.
	statsURL string
	// prefix is the prefix cache bookkeeping, touched only under
	// Pool.statsMu.
	prefix prefixState
	// blocked is the stats verdict the routing snapshot was built with:
	// fresh stats say the engine sleeps or is unhealthy. Touched only under
	// Pool.mu.
	blocked bool
}

func (e *engine) knownModels() []string {
	if p := e.models.Load(); p != nil {
		return *p
	}
	return nil
}

// route is the candidate list for one model: parallel slices, so a policy
// gets []*routing.Endpoint without a per-request copy.
type route struct {
	eps  []*routing.Endpoint
	engs []*engine
	// limited: some engine of the route has a circuit breaker
	// (EngineConfig.MaxInFlight), so candidates are checked against it.
	limited bool
}

func (rt *route) engineFor(ep *routing.Endpoint) *engine {
	for i, e := range rt.eps {
		if e == ep {
			return rt.engs[i]
		}
	}
	return nil
}

// snapshot is an immutable view of the pool used by the request path.
type snapshot struct {
	routes  map[string]*route // routable engines (healthy, awake, not blocked by their stats), per model
	all     route             // every routable engine, for requests that name no model
	known   map[string]bool   // every model of every engine with known models
	pending bool              // some engine has not reported its models yet
	// aliases are Config.Models.Aliases with their replacement bytes.
	aliases map[string]alias
	// cards are the GET /v1/models entries by id (served models and
	// aliases), modelsBody the whole list; nil when no routable engine has
	// reported models.
	cards      map[string]modelObject
	modelsBody []byte
}

// alias is a public model name and the engine model it stands for, with
// the bytes that replace the name in a request body: quoted for JSON, raw
// for a form field.
type alias struct {
	target      string
	quoted, raw []byte
}

// Pool is the set of engines, their health, their models and their
// scraped stats. The request path reads an immutable snapshot through an
// atomic pointer; changes (health verdicts, stats verdicts, discovery, Add,
// Remove) build a new one. All methods are safe for concurrent use.
type Pool struct {
	cfg         HealthConfig
	aliases     map[string]alias
	stats       EngineStatsConfig
	metrics     *telemetry.Metrics
	client      *http.Client
	statsClient *http.Client // no client timeout: each scrape has its own
	log         *slog.Logger
	now         func() time.Time
	started     int64 // unix seconds: the created time of configured models

	mu        sync.Mutex
	engines   []*engine
	retired   []*engine // removed, still holding slots; reported until drained (pruneRetiredLocked, observeInFlight)
	telByName map[string]*telemetry.Engine

	snap atomic.Pointer[snapshot]

	out outliers // outlier detection (outlier.go)

	probeMu   sync.Mutex // one probe round at a time
	statsMu   sync.Mutex // one scrape round at a time
	startOnce sync.Once
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// newPool builds a pool from cfg (already validated): its engines, health
// and stats settings. now is the clock the stats are stamped and judged by.
func newPool(cfg Config, m *telemetry.Metrics, rt http.RoundTripper, log *slog.Logger, now func() time.Time) (*Pool, error) {
	p := &Pool{
		cfg:         cfg.Health,
		stats:       cfg.EngineStats,
		metrics:     m,
		client:      &http.Client{Transport: rt, Timeout: cfg.Health.Timeout},
		statsClient: &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:         log,
		now:         now,
		telByName:   map[string]*telemetry.Engine{},
		aliases:     map[string]alias{},
		started:     now().Unix(),
	}
	for name, target := range cfg.Models.Aliases {
		q, _ := json.Marshal(target)
		p.aliases[name] = alias{target: target, quoted: q, raw: []byte(target)}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.out.init(cfg.Outlier)
	for _, ec := range cfg.Engines {
		e, err := p.newEngine(ec)
		if err != nil {
			return nil, err
		}
		p.engines = append(p.engines, e)
	}
	p.rebuild()
	return p, nil
}

func (p *Pool) newEngine(ec EngineConfig) (*engine, error) {
	if err := ec.Validate(); err != nil {
		return nil, err
	}
	base, _ := url.Parse(ec.URL)
	// Credentials in the URL become an Authorization header (Basic, as
	// net/http's client would send them) and never appear in a URL the
	// gateway logs, shows or sends.
	userinfo := base.User
	base.User = nil
	key := ec.APIKey
	if ec.APIKeyEnv != "" {
		if key = os.Getenv(ec.APIKeyEnv); key == "" {
			return nil, fmt.Errorf("%w: engine %q needs a key but %s is not set", ErrInvalidConfig, ec.Name, ec.APIKeyEnv)
		}
	}
	port, _ := strconv.Atoi(base.Port())
	if port == 0 {
		port = 80
		if base.Scheme == "https" {
			port = 443
		}
	}
	tel, ok := p.telByName[ec.Name]
	if !ok {
		tel = p.metrics.Engine(ec.Name, telemetry.WithProvider(ec.Provider), telemetry.WithServer(base.Hostname(), port))
		p.telByName[ec.Name] = tel
	}
	e := &engine{cfg: ec, ep: routing.NewEndpoint(ec.Name, base), tel: tel, shown: redactURL(ec.URL), header: []string{ec.Name}}
	e.maxInFlight.Store(int64(ec.MaxInFlight))
	// gen_ai.provider.name, server.address and server.port are set when
	// the span starts (telemetry.Attrs.SpanStart).
	e.spanAttrs = []attribute.KeyValue{telemetry.AttrSpanEngine.String(ec.Name)}
	switch {
	case key != "":
		e.auth = []string{"Bearer " + key}
	case userinfo != nil:
		pw, _ := userinfo.Password()
		e.auth = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(userinfo.Username()+":"+pw))}
	}
	e.base = strings.TrimSuffix(base.String(), "/")
	e.urls = make(map[string]string)
	for _, op := range operations {
		for _, path := range op.paths {
			if !strings.Contains(path, "{") {
				e.urls[path] = e.base + path
			}
		}
	}
	e.statsURL = base.JoinPath(p.stats.Path).String()
	if len(ec.Models) > 0 {
		ms := slices.Clone(ec.Models)
		sort.Strings(ms)
		e.models.Store(&ms)
		e.static = true
	}
	return e, nil
}

// Add adds an engine. It fails if the config is invalid or the name is
// taken. The engine starts healthy; its models, if not configured, are
// learned at its first probe.
func (p *Pool) Add(ec EngineConfig) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byNameLocked(ec.Name) != nil {
		return fmt.Errorf("%w: engine %q already in the pool", ErrInvalidConfig, ec.Name)
	}
	// Its own telemetry.Engine: an engine re-added under a name that is
	// still draining (perhaps with another URL) reports its own
	// server.address; the gauges merge the incarnations by name.
	e, err := p.newIncarnation(ec)
	if err != nil {
		return err
	}
	p.telByName[ec.Name] = e.tel
	p.engines = append(p.engines, e)
	p.pruneRetiredLocked()
	p.rebuildLocked()
	return nil
}

// Remove takes the named engine out of routing. Requests in flight on it
// finish normally and release their slots on it; its gauges drain to 0 and
// then stop being reported. It reports whether the engine was present.
func (p *Pool) Remove(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.IndexFunc(p.engines, func(e *engine) bool { return e.cfg.Name == name })
	if i < 0 {
		return false
	}
	p.retired = append(p.retired, p.engines[i])
	p.engines = slices.Delete(p.engines, i, i+1)
	p.pruneRetiredLocked()
	p.rebuildLocked()
	return true
}

func (p *Pool) rebuild() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rebuildLocked()
}

// modelObject is one entry of GET /v1/models, with the fields vLLM's
// ModelCard has (vllm/entrypoints/openai/protocol.py): root is the served
// weights (an adapter's path), parent the base model of a LoRA adapter,
// max_model_len the context length in tokens.
type modelObject struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        *string `json:"root,omitempty"`
	Parent      *string `json:"parent"`
	MaxModelLen *int64  `json:"max_model_len,omitempty"`
}

// engineState is an engine's state as /admin/engines and
// switchboard.engine.state show it (routing's state machine, one verdict
// per writer: removal, probes, outlier detection, the admin API and the
// engine's stats); the index into telemetry.EngineStates.
func (p *Pool) engineState(e *engine, retired bool) int {
	return int(routing.Verdicts{
		Draining:  retired || e.drained.Load() || e.unready.Load(),
		Unhealthy: !e.ep.Healthy(),
		Ejected:   e.ep.Outlier().Ejected(),
		Sleeping:  e.sleeping.Load() || e.blocked, // or self-reported unhealthy in fresh stats
	}.State())
}

// routable reports whether e may receive new requests: it is ready.
func (e *engine) routable() bool {
	return e.ep.Healthy() && !e.blocked && !e.sleeping.Load() && !e.ep.Outlier().Ejected() && !e.drained.Load() && !e.unready.Load()
}

func (p *Pool) rebuildLocked() {
	s := &snapshot{routes: map[string]*route{}, known: map[string]bool{}, aliases: p.aliases}
	cards := map[string]modelObject{}
	for _, e := range p.engines {
		ms := e.knownModels()
		if ms == nil {
			// Only until the engine's first probe: an engine that was
			// down at start must not turn every unknown model (a typo)
			// into a 503 for as long as it stays down.
			if !e.probed.Load() {
				s.pending = true
			}
			continue
		}
		// A sleeping or self-reported unhealthy engine (fresh stats) is
		// left out like an unhealthy one: it keeps its slots and its
		// health verdict, and comes back when woken or when its stats say
		// so or expire.
		ok := e.routable()
		if ok {
			s.all.eps = append(s.all.eps, e.ep)
			s.all.engs = append(s.all.engs, e)
			s.all.limited = s.all.limited || e.maxInFlight.Load() > 0
		}
		var ec map[string]modelObject
		if c := e.cards.Load(); c != nil {
			ec = *c
		}
		for _, m := range ms {
			s.known[m] = true
			if !ok {
				continue
			}
			if _, seen := cards[m]; !seen {
				card, found := ec[m]
				if !found {
					card = modelObject{ID: m, Object: "model", Created: p.started, OwnedBy: "switchboard"}
				}
				cards[m] = card
			}
			rt := s.routes[m]
			if rt == nil {
				rt = &route{}
				s.routes[m] = rt
			}
			rt.eps = append(rt.eps, e.ep)
			rt.engs = append(rt.engs, e)
			rt.limited = rt.limited || e.maxInFlight.Load() > 0
		}
	}
	for name, a := range p.aliases {
		s.known[name] = s.known[a.target]
		if c, ok := cards[a.target]; ok {
			c.ID = name
			cards[name] = c
		}
	}
	if len(cards) > 0 {
		names := make([]string, 0, len(cards))
		for m := range cards {
			names = append(names, m)
		}
		sort.Strings(names)
		list := struct {
			Object string        `json:"object"`
			Data   []modelObject `json:"data"`
		}{Object: "list", Data: make([]modelObject, len(names))}
		for i, n := range names {
			list.Data[i] = cards[n]
		}
		s.modelsBody, _ = json.Marshal(list)
		s.cards = cards
	}
	p.snap.Store(s)
}

// lookup returns the route for model, or the APIError to answer:
// 404 model_not_found, or 503 when the model is known but no engine serving
// it is healthy (or an engine without configured models has not had its
// first probe yet).
func (p *Pool) lookup(model string) (*route, error) {
	s := p.snap.Load()
	if rt, ok := s.routes[model]; ok {
		return rt, nil
	}
	if s.known[model] || s.pending {
		return nil, routing.ErrNoEndpoint
	}
	return nil, errModelNotFound(model)
}

// markFailed records a refused (or timed-out) connection as the engine's
// last error and probes the engine at once (probeOnConnectFailure): the
// probe's verdict, by its usual rules, takes a dead engine out of routing
// without waiting for the next round, with outlier detection off or when
// its cap refuses. The attempt's connect_error also reaches outlier
// detection when the attempt ends (observeOutcome), where a streak of them
// ejects the engine.
func (p *Pool) markFailed(e *engine, err error) {
	msg := err.Error()
	e.lastErr.Store(&msg)
	p.probeOnConnectFailure(e)
}

// observeInFlight reports the in-flight counts of every engine name, summing
// the incarnations that share a name, plus retired engines until they have
// drained and been reported at zero once.
func (p *Pool) observeInFlight(report func(e *telemetry.Engine, prefill, decode int64)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	type sum struct{ pf, dc int64 }
	sums := make(map[*telemetry.Engine]*sum, len(p.engines)+len(p.retired))
	order := make([]*telemetry.Engine, 0, len(p.engines)+len(p.retired))
	add := func(e *engine) {
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
	for _, e := range p.engines {
		add(e)
	}
	keep := p.retired[:0]
	for _, e := range p.retired {
		add(e)
		if pf, dc := e.ep.InFlight(); pf != 0 || dc != 0 {
			keep = append(keep, e)
		}
	}
	clear(p.retired[len(keep):])
	p.retired = keep
	for _, t := range order {
		s := sums[t]
		report(t, s.pf, s.dc)
	}
}

// observeState reports every engine's state for switchboard.engine.state:
// the engines in the pool, then retired ones still holding slots
// (draining) under a name no engine in the pool has.
func (p *Pool) observeState(report func(e *telemetry.Engine, state int)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[*telemetry.Engine]bool, len(p.engines))
	for _, e := range p.engines {
		seen[e.tel] = true
		report(e.tel, p.engineState(e, false))
	}
	for _, e := range p.retired {
		if pf, dc := e.ep.InFlight(); !seen[e.tel] && pf+dc > 0 {
			seen[e.tel] = true
			report(e.tel, p.engineState(e, true))
		}
	}
}

// EngineStatus is one engine's state as shown on GET /admin/engines.
type EngineStatus struct {
	Name     string   `json:"name"`               // configured engine name
	URL      string   `json:"url"`                // base URL, userinfo redacted
	Healthy  bool     `json:"healthy"`            // last health verdict
	Routable bool     `json:"routable"`           // ready: healthy, in the pool, not ejected, not sleeping or self-reported unhealthy by fresh stats
	State    string   `json:"state"`              // ready, unhealthy, sleeping, draining or ejected (telemetry.EngineStates)
	Sleeping bool     `json:"sleeping,omitempty"` // put to sleep through the admin API and not woken yet
	Models   []string `json:"models"`             // sorted; empty until discovered
	Static   bool     `json:"models_configured"`  // models come from config, not discovery
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
}

// Status returns every engine's state, configured engines first (in config
// order) then retired ones still draining.
func (p *Pool) Status() []EngineStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]EngineStatus, 0, len(p.engines)+len(p.retired))
	now := p.now()
	st := func(e *engine, retired bool) EngineStatus {
		pf, dc := e.ep.InFlight()
		s := EngineStatus{Name: e.cfg.Name, URL: e.shown, Healthy: e.ep.Healthy(), Models: e.knownModels(),
			Static: e.static, Prefill: pf, Decode: dc, Retired: retired,
			Routable: !retired && e.routable(), State: telemetry.EngineStates[p.engineState(e, retired)],
			Sleeping: e.sleeping.Load(), Drained: e.drained.Load(), Unready: e.unready.Load(), MaxInFlight: int(e.maxInFlight.Load()), Stats: statsStatus(e.ep.Stats(), now)}
		if s.Models == nil {
			s.Models = []string{}
		}
		s.EjectedUntil, s.Ejections = p.outlierStatus(e, now)
		if le := e.lastErr.Load(); le != nil {
			s.LastError = *le
		}
		return s
	}
	for _, e := range p.engines {
		out = append(out, st(e, false))
	}
	for _, e := range p.retired {
		// Shown while it still has requests finishing: a drained one
		// may stay listed until the gauges report its last 0
		// (observeInFlight), or a reload, Add or Remove prunes it
		// (pruneRetiredLocked).
		if pf, dc := e.ep.InFlight(); pf+dc > 0 {
			out = append(out, st(e, true))
		}
	}
	return out
}

// Ready reports whether at least one healthy engine has reported models.
func (p *Pool) Ready() bool { return p.snap.Load().modelsBody != nil }

// Start runs the first probe round synchronously (each probe bounded by the
// probe timeout), then probes every HealthConfig.Interval until Close. With
// EngineStatsConfig.Enabled it also scrapes every engine's metrics once,
// synchronously (bounded by the scrape timeout), so an engine that reports
// it is asleep gets no request in the first interval, and then every
// EngineStatsConfig.Interval on its own goroutine, so a slow engine never
// delays a probe or a request.
func (p *Pool) Start() {
	p.startOnce.Do(func() {
		p.ProbeNow(p.ctx)
		known := p.snap.Load().known
		for name, a := range p.aliases {
			if !known[a.target] && !p.snap.Load().pending {
				p.log.Warn("model alias points at a model no engine serves", "alias", name, "target", a.target)
			}
		}
		if p.stats.Enabled {
			p.ScrapeNow(p.ctx)
			p.every(p.stats.Interval, p.ScrapeNow)
		}
		p.every(p.cfg.Interval, p.ProbeNow)
	})
}

// every runs fn every d until Close, on a goroutine Close waits for.
func (p *Pool) every(d time.Duration, fn func(context.Context)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-p.ctx.Done():
				return
			case <-t.C:
				fn(p.ctx)
			}
		}
	}()
}

// Close stops probing and scraping and waits for their goroutines. It does
// not touch requests in flight.
func (p *Pool) Close() {
	p.cancel()
	p.closeOutliers()
	p.wg.Wait()
	p.client.CloseIdleConnections()
}

// ProbeNow probes every engine once, concurrently, and rebuilds the
// snapshot. Health probes never touch the in-flight counters
// (shared/cases L02).
func (p *Pool) ProbeNow(ctx context.Context) {
	p.probeMu.Lock()
	defer p.probeMu.Unlock()
	// A passing probe also ends an ejection whose time has passed.
	p.forEachEngine(func(e *engine) {
		if p.probe(ctx, e) {
			p.returnEjected(e)
		}
	})
	p.rebuild()
}

// forEachEngine runs fn on every engine in the pool, each on its own
// goroutine, and returns when all have returned.
func (p *Pool) forEachEngine(fn func(*engine)) {
	p.mu.Lock()
	engines := slices.Clone(p.engines)
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Go(func() { fn(e) })
	}
	wg.Wait()
}

// probe asks e's /health (and /v1/models, /is_sleeping when due) and
// records the verdict; it reports whether the probe passed. The caller
// holds probeMu.
func (p *Pool) probe(ctx context.Context, e *engine) bool {
	err := p.get(ctx, e, "/health", nil)
	if err == nil && (!e.static && (e.models.Load() == nil || time.Since(e.lastDiscover) >= p.cfg.DiscoveryInterval)) {
		err = p.discover(ctx, e)
	}
	if err == nil && e.sleeping.Load() {
		// Put to sleep through the gateway: back in routing once the
		// engine says it is awake, however it was woken, unless an admin
		// call came in meanwhile (its verdict is newer).
		gen := e.sleepGen.Load()
		var st struct {
			IsSleeping *bool `json:"is_sleeping"`
		}
		if p.get(ctx, e, "/is_sleeping", &st) == nil && st.IsSleeping != nil && !*st.IsSleeping && e.sleepGen.Load() == gen {
			e.sleeping.Store(false)
			p.log.Info("engine awake", "engine", e.cfg.Name)
		}
	}
	first := !e.probed.Load()
	defer e.probed.Store(true)
	if err != nil {
		msg := err.Error()
		e.lastErr.Store(&msg)
		e.fails++
		// The first verdict is taken at once: an engine that has never
		// answered is not presumed healthy for UnhealthyAfter rounds.
		if (first || e.fails >= p.cfg.UnhealthyAfter) && e.ep.Healthy() {
			e.ep.SetHealthy(false)
			p.log.Warn("engine unhealthy", "engine", e.cfg.Name, "error", err)
		}
		return false
	}
	e.fails = 0
	e.lastErr.Store(nil)
	if !e.ep.Healthy() {
		e.ep.SetHealthy(true)
		p.log.Info("engine healthy", "engine", e.cfg.Name)
	}
	return true
}

// discover reads the engine's /v1/models: the model ids it serves (LoRA
// adapters included: vLLM lists each loaded adapter with its base model as
// parent) and their cards.
func (p *Pool) discover(ctx context.Context, e *engine) error {
	var list struct {
		Data []modelObject `json:"data"`
	}
	if err := p.get(ctx, e, "/v1/models", &list); err != nil {
		return err
	}
	ms := make([]string, 0, len(list.Data))
	cards := make(map[string]modelObject, len(list.Data))
	for _, d := range list.Data {
		if d.ID != "" && !slices.Contains(ms, d.ID) {
			ms = append(ms, d.ID)
			d.Object = "model"
			cards[d.ID] = d
		}
	}
	sort.Strings(ms)
	e.cards.Store(&cards)
	e.models.Store(&ms)
	e.lastDiscover = time.Now()
	return nil
}

var errProbeStatus = errors.New("unexpected status")

func (p *Pool) get(ctx context.Context, e *engine, path string, into any) error {
	// JoinPath on a base with an empty path yields a relative path: go
	// through String, which restores the leading slash.
	resp, err := p.engineGet(ctx, p.client, e, e.ep.URL().JoinPath(path).String(), path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if into == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(into); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// engineGet sends GET url to engine e through c, with the engine's
// credentials and, when accept is not nil, that Accept header. It returns
// the response of a 200, whose body the caller closes; any other status is
// drained (up to 64 KiB), closed and returned as an error wrapping
// errProbeStatus that names path.
func (p *Pool) engineGet(ctx context.Context, c *http.Client, e *engine, url, path string, accept []string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if accept != nil {
		req.Header["Accept"] = accept
	}
	if e.auth != nil {
		req.Header["Authorization"] = e.auth
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %w %d", path, errProbeStatus, resp.StatusCode)
	}
	return resp, nil
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

// String summarises the pool for logs.
func (p *Pool) String() string {
	var b strings.Builder
	for i, s := range p.Status() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s(%s healthy=%t models=%v)", s.Name, s.URL, s.Healthy, s.Models)
	}
	return b.String()
}
