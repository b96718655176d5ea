package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Fleet is the set of engines, their health, their models and their
// scraped stats. The request path reads an immutable [Snapshot] through
// an atomic pointer; changes (health verdicts, stats verdicts, outlier
// ejections, the admin API, discovery, reloads, Add, Remove) build a new
// one. All methods are safe for concurrent use.
type Fleet struct {
	health      HealthConfig
	aliases     map[string]Alias
	stats       EngineStatsConfig
	metrics     *telemetry.Metrics
	client      *http.Client
	statsClient *http.Client // no client timeout: each scrape has its own
	log         *slog.Logger
	now         func() time.Time
	paths       []string         // WithPaths: the paths each engine's URL is built for once
	started     int64            // unix seconds: the created time of configured models
	kv          *routing.KVIndex // WithKVIndex: what the engines' KV-event subscriptions feed; nil for none
	kvCfg       KVEventsConfig
	kvStarted   bool // Start ran: new engines are subscribed at once (under mu)
	// connectTimeout is the connect and TLS handshake timeout of the
	// engines' own transports (Config.ConnectTimeout).
	connectTimeout time.Duration

	mu        sync.Mutex
	engines   []*Engine
	retired   []*Engine // removed, still holding slots; reported until drained (pruneRetiredLocked, inFlightByIncarnation)
	telByName map[string]*telemetry.Engine

	snap atomic.Pointer[Snapshot]

	out outliers // outlier detection (outlier.go)

	// setMu applies one SetConfigured or SetDiscovered at a time, and
	// guards configured, discovered and aliasCfg (discovery.go).
	setMu      sync.Mutex
	configured []EngineConfig
	discovered map[string][]DiscoveredEngine
	aliasCfg   map[string]string

	probeMu   sync.Mutex // one probe round at a time
	statsMu   sync.Mutex // one scrape round at a time
	startOnce sync.Once
	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// Option configures what an embedder or a test injects into [New].
type Option func(*options)

type options struct {
	transport http.RoundTripper
	log       *slog.Logger
	now       func() time.Time
	after     func(d time.Duration, f func()) (stop func() bool)
	paths     []string
	kv        *routing.KVIndex
	kvCfg     KVEventsConfig
}

// WithTransport sets the transport of the probes, the stats scrapes and
// the admin calls. Default http.DefaultTransport. A nil rt is ignored.
func WithTransport(rt http.RoundTripper) Option {
	return func(o *options) {
		if rt != nil {
			o.transport = rt
		}
	}
}

// WithLogger sets the logger of health, stats, outlier and admin events.
// Default slog.Default(). A nil l is ignored.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithClock sets the clock the stats are stamped and judged by, and
// outlier detection's (ejection times, back-off decay, log rate limits).
// Default time.Now. A nil now is ignored.
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

// WithAfterFunc sets how an ejected engine's return timer is armed: after
// runs f once d has passed on the clock (WithClock) and returns a function
// that stops it, reporting whether it stopped it before it ran. Default
// time.AfterFunc. A nil after is ignored.
func WithAfterFunc(after func(d time.Duration, f func()) (stop func() bool)) Option {
	return func(o *options) {
		if after != nil {
			o.after = after
		}
	}
}

// WithPaths sets the fixed request paths (no pattern) the request path
// sends to engines: each engine's URL for each is built once, for
// [Engine.PathURL].
func WithPaths(paths ...string) Option {
	return func(o *options) { o.paths = append(o.paths, paths...) }
}

// New builds a fleet from cfg (its engines, health, stats and outlier
// settings, and model aliases; validated, as the gateway validates them).
// It probes nothing: call Start. Errors wrap ErrInvalidConfig: an engine
// that fails [EngineConfig.Validate], or whose key variable is unset.
func New(cfg Config, m *telemetry.Metrics, opts ...Option) (*Fleet, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil metrics", ErrInvalidConfig)
	}
	o := options{transport: http.DefaultTransport, log: slog.Default(), now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	f := &Fleet{
		health:      cfg.Health,
		stats:       cfg.Stats,
		metrics:     m,
		client:      &http.Client{Transport: o.transport, Timeout: cfg.Health.Timeout},
		statsClient: &http.Client{Transport: o.transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		log:         o.log,
		now:         o.now,
		paths:       o.paths,
		telByName:   map[string]*telemetry.Engine{},
		aliases:     aliasesOf(cfg.Aliases),
		configured:  slices.Clone(cfg.Engines),
		aliasCfg:    cfg.Aliases,
		started:     o.now().Unix(),
		kv:          o.kv,
		kvCfg:       o.kvCfg,

		connectTimeout: cfg.ConnectTimeout,
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.out.init(cfg.Outlier)
	if o.after != nil {
		f.out.after = o.after
	}
	var errs []error // every engine's, so one start names every missing key
	for _, ec := range cfg.Engines {
		e, err := f.newEngine(ec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.engines = append(f.engines, e)
	}
	if len(errs) > 0 {
		f.cancel()
		return nil, errors.Join(errs...)
	}
	f.rebuild()
	return f, nil
}

// Add adds an engine. It fails if the config is invalid or the name is
// taken (errors wrap ErrInvalidConfig). The engine starts healthy; its
// models, if not configured, are learned at its first probe.
func (f *Fleet) Add(ec EngineConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byNameLocked(ec.Name) != nil {
		return fmt.Errorf("%w: engine %q already in the pool", ErrInvalidConfig, ec.Name)
	}
	// Its own telemetry.Engine: an engine re-added under a name that is
	// still draining (perhaps with another URL) reports its own
	// server.address; the gauges merge the incarnations by name.
	e, err := f.newIncarnation(ec)
	if err != nil {
		return err
	}
	f.telByName[ec.Name] = e.tel
	f.engines = append(f.engines, e)
	f.pruneRetiredLocked()
	f.rebuildLocked()
	return nil
}

// Remove takes the named engine out of routing. Requests in flight on it
// finish normally and release their slots on it; its gauges drain to 0 and
// then stop being reported. It reports whether the engine was present.
func (f *Fleet) Remove(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.engines, func(e *Engine) bool { return e.cfg.Name == name })
	if i < 0 {
		return false
	}
	f.retireLocked(f.engines[i])
	f.engines = slices.Delete(f.engines, i, i+1)
	f.pruneRetiredLocked()
	f.rebuildLocked()
	return true
}

// retireLocked moves e, which the caller takes out of f.engines, to the
// retired incarnations: state draining, reported until it has drained.
func (f *Fleet) retireLocked(e *Engine) {
	e.retired = true
	f.stopKVLocked(e)
	f.retired = append(f.retired, e)
}

// MarkFailed records a refused (or timed-out) connection to e as the
// engine's last error and probes the engine at once
// (probeOnConnectFailure): the probe's verdict, by its usual rules, takes
// a dead engine out of routing without waiting for the next round, with
// outlier detection off or when its cap refuses. The attempt's connect
// failure also reaches outlier detection when the attempt ends (Report),
// where a streak of them ejects the engine.
func (f *Fleet) MarkFailed(e *Engine, err error) {
	msg := err.Error()
	e.lastErr.Store(&msg)
	f.probeOnConnectFailure(e)
}

// Start runs the first probe round synchronously (each probe bounded by the
// probe timeout), then probes every HealthConfig.Interval until Close. With
// EngineStatsConfig.Enabled it also scrapes every engine's metrics once,
// synchronously (bounded by the scrape timeout), so an engine that reports
// it is asleep gets no request in the first interval, and then every
// EngineStatsConfig.Interval on its own goroutine, so a slow engine never
// delays a probe or a request. Calls after the first do nothing.
func (f *Fleet) Start() {
	f.startOnce.Do(func() {
		f.ProbeNow(f.ctx)
		known := f.snap.Load().known
		for name, a := range f.aliases {
			if !known[a.Target] && !f.snap.Load().pending {
				f.log.Warn("model alias points at a model no engine serves", "alias", name, "target", a.Target)
			}
		}
		if f.stats.Enabled {
			f.ScrapeNow(f.ctx)
			f.every(f.stats.Interval, f.ScrapeNow)
		}
		f.every(f.health.Interval, f.ProbeNow)
		if f.kv != nil {
			f.mu.Lock()
			f.kvStarted = true
			f.reconcileKVLocked()
			f.mu.Unlock()
			f.every(cmp.Or(f.kvCfg.CheckInterval, time.Second), f.checkKV)
		}
	})
}

// every runs fn every d until Close, on a goroutine Close waits for.
func (f *Fleet) every(d time.Duration, fn func(context.Context)) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-f.ctx.Done():
				return
			case <-t.C:
				fn(f.ctx)
			}
		}
	}()
}

// Close stops probing and scraping and waits for their goroutines. It does
// not touch requests in flight.
func (f *Fleet) Close() {
	// Under mu: a KV-event subscription is started under it only while
	// the fleet's context is live, so none starts after Wait begins.
	f.mu.Lock()
	f.cancel()
	f.mu.Unlock()
	f.closeOutliers()
	f.wg.Wait()
	f.client.CloseIdleConnections()
	f.mu.Lock()
	for _, e := range append(slices.Clone(f.engines), f.retired...) {
		e.closeIdle()
	}
	f.mu.Unlock()
}

// String summarises the fleet for logs.
func (f *Fleet) String() string {
	var b strings.Builder
	for i, s := range f.Status() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s(%s healthy=%t models=%v)", s.Name, s.URL, s.Healthy, s.Models)
	}
	return b.String()
}
