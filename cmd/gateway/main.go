// Command gateway runs Switchboard, the OpenAI-compatible gateway in front
// of vLLM-style engines.
//
//	gateway --config configs/gateway.yaml
//	gateway --config configs/demo.yaml   # two in-process simulated engines
//	gateway keys hash < key.txt          # the sha256 of an API key (auth.keys)
//
// See configs/gateway.yaml for every key and README.md for telemetry set-up.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"k8s.io/klog/v2"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/gateway/k8s"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/logbuf"
	"github.com/switchboard-gw/switchboard/internal/version"
	"github.com/switchboard-gw/switchboard/quota"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "keys" {
		if err := keysCommand(os.Args[2:], os.Stdin, os.Stdout); err != nil && !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "switchboard:", err)
			os.Exit(2)
		}
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		// The first signal starts the drain; a second one ends the process
		// at once. (Restoring the signal's disposition instead would not do:
		// a process started with SIGINT ignored, by nohup or `cmd &` in a
		// script, would then ignore the second Ctrl-C.)
		for n := 0; ; n++ {
			select {
			case <-done:
				return
			case <-sigs:
			}
			if n > 0 {
				flushLogs()
				fmt.Fprintln(os.Stderr, "switchboard: second signal: exiting without waiting for the drain")
				os.Exit(130)
			}
			cancel()
		}
	}()
	err := run(ctx, os.Args[1:], os.Environ, os.Stderr, nil)
	signal.Stop(sigs)
	close(done)
	cancel()
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if errors.Is(err, errVersion) {
		fmt.Println(versionLine())
		return
	}
	if err != nil {
		// One prefixed line per problem (errors.Join puts each on its own).
		for line := range strings.SplitSeq(err.Error(), "\n") {
			fmt.Fprintln(os.Stderr, "switchboard:", line)
		}
		os.Exit(1)
	}
}

// run wires config -> telemetry -> engines -> policy -> gateway -> serve,
// then drains in-flight requests once ctx is done (main cancels it on
// SIGINT/SIGTERM) and returns.
//
// args are the command-line arguments without the program name; environ
// supplies the SWITCHBOARD_* overrides (os.Environ in main); logs go to
// logw. The OTEL_* variables are read from the process environment by the
// OpenTelemetry SDK itself. When ready is not nil it is called once both
// listeners are bound, with their actual addresses (so ":0" works); admin
// is "" when the admin listener is disabled. run returns nil after a clean
// drain, even when the drain deadline passed and connections were closed.
func run(ctx context.Context, args []string, environ func() []string, logw io.Writer, ready func(public, admin string)) (err error) {
	// SIGHUP reloads. It is caught from the first instant, before the
	// config is even read: its default action ends the process, and one
	// sent while the gateway starts (probing its engines can take
	// seconds) waits here, one deep, for the reloader. Stopped last, so
	// a SIGHUP during the drain is ignored rather than fatal.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// loaded is the sum of the file's bytes this config was built from:
	// an edit made from now on, before the watch is set up, is still a
	// change.
	cfg, loaded, shadow, err := loadConfigSum(args, environ)
	if err != nil {
		return err
	}
	level, _ := parseLevel(cfg.Log.Level)
	// Lines are batched (log.buffer_bytes): an access-log line is then no
	// write of its own. Deferred first, so it writes out last, after every
	// line of the shutdown.
	lb := logbuf.New(logw, cfg.Log.BufferBytes, cfg.Log.FlushInterval)
	defer lb.Close()
	runLog.Store(lb) // for main's exit without the drain
	defer runLog.CompareAndSwap(lb, nil)
	var h slog.Handler = slog.NewTextHandler(lb, &slog.HandlerOptions{Level: level})
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(lb, &slog.HandlerOptions{Level: level})
	}
	h = flushAt{h, lb, slog.LevelWarn}
	log := slog.New(h)

	providers, shutdownTelemetry, err := telemetry.Setup(ctx, cfg.Telemetry, log)
	if err != nil {
		return err
	}
	defer func() {
		// A collector that is down at exit loses the last export; that is
		// worth a warning, not a failed exit.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if terr := shutdownTelemetry(sctx); terr != nil {
			log.Warn("telemetry shutdown: final export failed", "error", terr)
		}
	}()
	// gen_ai.client.operation.duration's buckets reach the longest a
	// request may last.
	t := cfg.Server.Config.Timeouts
	metrics, err := telemetry.NewMetrics(providers.MeterProvider, telemetry.WithLongestTimeout(max(t.Request, t.Attempt)),
		telemetry.WithVersion(version.Version), telemetry.WithEventHistograms(providers.Events))
	if err != nil {
		return err
	}

	// The simulated engines trace like vLLM with --otlp-traces-endpoint
	// when traces are exported: their server spans, children of the
	// gateway's engine spans, go out through the same provider.
	var simTP trace.TracerProvider
	if providers.OTLPTraces {
		simTP = providers.TracerProvider
	}
	sims, err := startSimulated(cfg.Simulate, simTP, log)
	defer func() {
		for _, s := range sims {
			_ = s.Close()
		}
	}()
	if err != nil {
		return err
	}

	// The precise prefix index outlives policies (a reload's new policy
	// gets the same one) and is fed by the engines' KV-event
	// subscriptions; empty and idle until an engine has an endpoint.
	kv := routing.NewKVIndex(cfg.KVEvents.IndexConfig())
	policy, err := routing.NewPolicy(cfg.Routing, routing.WithKVIndex(kv, cfg.KVEvents.BlockSize))
	if err != nil {
		return err
	}
	var simEngines []fleet.EngineConfig
	for _, s := range sims {
		simEngines = append(simEngines, s.engine)
	}
	gcfg := gatewayConfig(cfg, simEngines)
	// With no trace exporter, spans would be recorded for nothing: the
	// gateway then records none (a no-op provider), and the client's trace
	// context still reaches the engines unchanged. Metrics never depend on
	// spans.
	var tp trace.TracerProvider = providers.TracerProvider
	if !providers.OTLPTraces {
		tp = tracenoop.NewTracerProvider()
	}
	gopts := []gateway.Option{
		gateway.WithTracerProvider(tp),
		gateway.WithPropagator(providers.Propagator),
		gateway.WithLogger(log),
		gateway.WithKVIndex(kv),
		// The keys API reads the keys file as this loader does before it
		// rewrites it: a hand edit not reloaded yet is kept.
		gateway.WithKeysFileReader(func(path string) ([]gateway.KeyConfig, error) {
			keys, _, err := loadKeysFile(path)
			return keys, err
		}),
	}
	kube := cfg.Discovery.Kubernetes
	if kube.Enabled {
		gopts = append(gopts, gateway.WithDynamicEngines())
	}
	if cfg.Limits.Redis.Address != "" {
		// The keys' limits are shared by every replica using this Redis.
		// go-redis logs its own connection failures; the gateway already
		// reports them (a warning at most once a minute, a metric).
		redis.SetLogger(redisLog{log})
		store, serr := quota.NewRedis(cfg.Limits.Redis)
		if serr != nil {
			return serr
		}
		defer func() { err = errors.Join(err, store.Close()) }() // after the gateway's Close
		gopts = append(gopts, gateway.WithQuotaStore(store))
		log.Info("api key limits are shared through redis", "address", cfg.Limits.Redis.Address, "fail_mode", cfg.Limits.FailMode)
	}
	gw, err := gateway.New(gcfg, policy, metrics, gopts...)
	if err != nil {
		return err
	}
	// The series of an engine gone and drained leave the metric exports
	// after telemetry.series_linger: discovery churn does
	// not grow them without bound.
	providers.SetEngineLive(gw.Fleet().Live, telemetry.WithServerLive(gw.Fleet().LiveServer),
		telemetry.WithSeriesLinger(cfg.Telemetry.SeriesLinger))
	defer func() { err = errors.Join(err, gw.Close()) }()
	gw.Start()
	if kube.Enabled {
		// client-go logs through klog: into this log, warnings and up.
		klog.SetSlogLogger(slog.New(levelAtLeast{h, slog.LevelWarn}))
		disc, err := k8s.Start(ctx, kube, gw, log)
		if err != nil {
			return err
		}
		// Stopped before the gateway closes: the engines stay as they
		// are for the drain.
		defer disc.Close()
	}

	// No ReadTimeout or WriteTimeout: they would cut long streams. The
	// gateway bounds body reads (server.body_read_timeout) and client
	// writes (server.timeouts.client_write) per request instead; its base
	// context lets it end the streams still open at the shutdown deadline.
	public := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		IdleTimeout: cfg.Server.IdleTimeout, BaseContext: gw.BaseContext,
		ErrorLog: slog.NewLogLogger(h, slog.LevelWarn)}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- public.Serve(ln) }()
	var admin *http.Server
	adminAddr := ""
	if cfg.Admin.Listen != "" {
		aln, err := net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			_ = public.Close()
			return err
		}
		admin = &http.Server{Handler: gw.AdminHandler(providers.Prometheus), ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
			IdleTimeout: cfg.Server.IdleTimeout, ErrorLog: slog.NewLogLogger(h, slog.LevelWarn)}
		go func() { errc <- admin.Serve(aln) }()
		adminAddr = aln.Addr().String()
		log.Info("admin listening", "addr", adminAddr, "metrics", "http://"+adminAddr+"/metrics")
	}
	closeAll := func() {
		_ = public.Close()
		if admin != nil {
			_ = admin.Close()
		}
	}
	// Reloads (SIGHUP, the watched config file) stop before the gateway
	// closes: this defer runs first.
	rl := &reloader{args: args, environ: environ, log: log, gw: gw, metrics: metrics, sims: simEngines, kv: kv,
		started: cfg, routing: cfg.Routing, policy: policy, shadowed: shadow}
	defer rl.startReloads(ctx, hup, configFile(args), loaded, cfg.Reload.Watch, cfg.Reload.Debounce)()
	gw.SetReloader(rl.adminReload) // POST /admin/reload
	gw.SetConsoleConfig(cfg)       // the console's Config panel: the whole file, redacted
	defer gw.SetReloader(nil)      // before the reloads stop (defers run last first)
	log.Info("switchboard listening", "addr", ln.Addr().String(), "policy", cfg.Routing.Policy, "engines", gw.Fleet().String())
	if ready != nil {
		ready(ln.Addr().String(), adminAddr)
	}

	select {
	case <-ctx.Done():
		log.Info("shutting down: draining in-flight requests (a second Ctrl-C exits at once)", "timeout", cfg.Server.ShutdownTimeout)
	case err := <-errc:
		closeAll()
		return fmt.Errorf("serve: %w", err)
	}
	// Stop readiness first, then refuse new connections and let streams
	// finish under the deadline. The servers' BaseContext is not the
	// signal context, so SIGTERM does not cut streams off.
	gw.Drain()
	if d := cfg.Server.DrainDelay; d > 0 {
		log.Info("readiness failing; still accepting requests before closing the listener", "drain_delay", d)
		time.Sleep(d)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownTimeout)
	defer cancel()
	serr := public.Shutdown(sctx)
	if admin != nil {
		serr = errors.Join(serr, admin.Shutdown(sctx))
	}
	if errors.Is(serr, context.DeadlineExceeded) {
		// Streams still open end with a server_shutdown error event rather
		// than a silent cut, and every handler returns (slots released,
		// durations recorded) before telemetry is flushed below.
		log.Warn("shutdown deadline passed; ending the requests still in flight", "requests", gw.InFlight())
		gw.Abort()
		wctx, wcancel := context.WithTimeout(context.Background(), abortGrace)
		if gw.Wait(wctx) != nil {
			log.Warn("requests still running after the abort grace period; closing their connections", "grace", abortGrace)
		}
		wcancel()
		closeAll()
		// A handler blocked on a client write or a body read returns as soon
		// as its connection is closed; wait for it, so its slot release and
		// duration are in the last export.
		wctx, wcancel = context.WithTimeout(context.Background(), 5*time.Second)
		if gw.Wait(wctx) != nil {
			log.Error("requests still running after their connections were closed; their telemetry may be missing from the last export", "requests", gw.InFlight())
		}
		wcancel()
		serr = nil
	}
	if serr == nil {
		log.Info("stopped")
	}
	return serr
}

// abortGrace bounds the wait for handlers after Abort at the shutdown
// deadline: they end their streams with an error event (itself bounded by a
// 5 s write deadline) and return.
const abortGrace = 10 * time.Second

// simulated is one in-process simulated engine.
type simulated struct {
	engine fleet.EngineConfig
	srv    *http.Server
	sim    *enginesim.Engine
}

// Close stops the simulated engine's server and its KV-event publisher.
func (s *simulated) Close() error { return errors.Join(s.srv.Close(), s.sim.Close()) }

// startSimulated starts cfg.Engines simulated engines on loopback ports.
// Their models are left out of the engine config on purpose, so the demo
// exercises model discovery through GET /v1/models.
func startSimulated(cfg SimulateConfig, tp trace.TracerProvider, log *slog.Logger) ([]*simulated, error) {
	var out []*simulated
	for i := range cfg.Engines {
		name := fmt.Sprintf("sim-%d", i+1)
		role := ""
		if cfg.PrefillEngines > 0 {
			role = fleet.RoleDecodeName
			if i < cfg.PrefillEngines {
				role = fleet.RolePrefillName
			}
		}
		// Cached tokens reported as vLLM does with --enable-prompt-tokens-details,
		// so a disaggregated answer's cached_tokens can be checked.
		ecfg := enginesim.Config{Name: name, Models: cfg.Models, TTFT: cfg.TTFT, ITL: cfg.ITL,
			OutputTokens: cfg.OutputTokens, MaxNumSeqs: cfg.MaxNumSeqs, TracerProvider: tp, PromptTokensDetails: true}
		if cfg.KVEvents {
			ecfg.KVEvents, ecfg.KVEventsReplay = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
		}
		e, err := enginesim.New(ecfg)
		if err != nil {
			return out, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return out, err
		}
		srv := &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		url := "http://" + ln.Addr().String()
		ec := fleet.EngineConfig{Name: name, URL: url, Role: role}
		if cfg.KVEvents {
			ec.KVEvents, ec.KVEventsReplay = e.KVEventsAddr(), e.KVReplayAddr()
		}
		out = append(out, &simulated{engine: ec, srv: srv, sim: e})
		log.Info("simulated engine started", "engine", name, "url", url, "models", cfg.Models, "role", cmp.Or(role, fleet.RoleBothName),
			"kv_events", ec.KVEvents)
	}
	return out, nil
}

// runLog is the log buffer of the running run, for main to flush when it
// exits without waiting for run to return (a second signal).
var runLog atomic.Pointer[logbuf.Writer]

// flushLogs writes out the running run's buffered log lines.
func flushLogs() {
	if lb := runLog.Load(); lb != nil {
		_ = lb.Flush()
	}
}

// flushAt is a handler whose records at min or above are written out at
// once, with the lines buffered before them: a warning or an error is not
// held for the flush interval, nor lost if the process dies right after.
type flushAt struct {
	slog.Handler
	w   *logbuf.Writer
	min slog.Level
}

func (f flushAt) Handle(ctx context.Context, r slog.Record) error {
	err := f.Handler.Handle(ctx, r)
	if r.Level >= f.min {
		_ = f.w.Flush() // the record's own error, if any, is err
	}
	return err
}

func (f flushAt) WithAttrs(as []slog.Attr) slog.Handler {
	return flushAt{f.Handler.WithAttrs(as), f.w, f.min}
}

func (f flushAt) WithGroup(name string) slog.Handler {
	return flushAt{f.Handler.WithGroup(name), f.w, f.min}
}

// levelAtLeast is h without the records below min (client-go's klog
// chatter: only its warnings and errors reach the gateway's log).
type levelAtLeast struct {
	slog.Handler
	min slog.Level
}

func (l levelAtLeast) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= l.min && l.Handler.Enabled(ctx, lv)
}

func (l levelAtLeast) WithAttrs(as []slog.Attr) slog.Handler {
	return levelAtLeast{l.Handler.WithAttrs(as), l.min}
}

func (l levelAtLeast) WithGroup(name string) slog.Handler {
	return levelAtLeast{l.Handler.WithGroup(name), l.min}
}

// redisLog puts go-redis's own log lines at debug level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
	}
}
