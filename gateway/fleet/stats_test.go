package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/internal/vllmmetrics"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func TestParseEngineMetrics(t *testing.T) {
	tests := []struct {
		name string
		page string
		want sample
		err  error // errors.Is target; errAny for any error
	}{
		{
			name: "vLLM v1 page, two models",
			page: testutil.VLLMPage,
			want: sample{running: 5, waiting: 5, kvUsage: 0.5, hits: 616, queries: 1024, hasPrefix: true},
		},
		{
			name: "older vLLM: gpu_cache_usage_perc only",
			page: `# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.875
`,
			want: sample{running: 7, kvUsage: 0.875},
		},
		{
			name: "kv_cache_usage_perc wins over gpu_cache_usage_perc",
			page: `vllm:num_requests_running 1
vllm:gpu_cache_usage_perc 0.9
vllm:kv_cache_usage_perc 0.1
`,
			want: sample{running: 1, kvUsage: 0.1},
		},
		{
			name: "counters without _total",
			page: `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries{model_name="m"} 50
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits{model_name="m"} 20
`,
			want: sample{waiting: 2, kvUsage: -1, hits: 20, queries: 50, hasPrefix: true},
		},
		{
			name: "counter typed without _total, sampled with it (old prometheus_client)",
			page: `vllm:num_requests_running 0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 8
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 2
`,
			want: sample{kvUsage: -1, hits: 2, queries: 8, hasPrefix: true},
		},
		{
			name: "only one prefix counter: no ratio",
			page: "vllm:num_requests_running 1\nvllm:prefix_cache_queries_total 8\n",
			want: sample{running: 1, kvUsage: -1},
		},
		{name: "awake", page: testutil.SleepPage(0), want: sample{kvUsage: -1}},
		{name: "sleep level 1", page: testutil.SleepPage(1), want: sample{kvUsage: -1, sleeping: true}},
		{name: "sleep level 2", page: testutil.SleepPage(2), want: sample{kvUsage: -1, sleeping: true}},
		{
			name: "sleep level as a plain gauge",
			page: "vllm:num_requests_running 0\nvllm:engine_sleep_state 1\n",
			want: sample{kvUsage: -1, sleeping: true},
		},
		{
			name: "fault tolerance: one rank unhealthy",
			page: "vllm:num_requests_running 0\n# TYPE vllm:engine_healthy gauge\nvllm:engine_healthy{engine=\"0\"} 1\nvllm:engine_healthy{engine=\"1\"} 0\n",
			want: sample{kvUsage: -1, unhealthy: true},
		},
		{
			name: "fault tolerance: healthy",
			page: "vllm:num_requests_running 0\nvllm:engine_healthy{engine=\"0\"} 1\n",
			want: sample{kvUsage: -1},
		},
		{
			name: "fractional, negative and NaN gauges",
			page: "vllm:num_requests_running{model_name=\"a\"} 2.6\nvllm:num_requests_running{model_name=\"b\"} NaN\nvllm:num_requests_waiting -3\nvllm:kv_cache_usage_perc 1.5\n",
			want: sample{running: 3, kvUsage: 1},
		},
		{name: "not a vLLM page", page: "# TYPE up gauge\nup 1\n", err: errNoEngineMetrics},
		{name: "empty body", page: "", err: errNoEngineMetrics},
		{name: "garbage line", page: "vllm:num_requests_running 1\nthis is { not metrics\n", err: errAny},
		{name: "HTML error page", page: "<html><body>502 Bad Gateway</body></html>\n", err: errAny},
		{name: "bad value", page: "vllm:num_requests_running one\n", err: errAny},
		{name: "unterminated label", page: "vllm:num_requests_running{model_name=\"m} 1\n", err: errAny},
		{name: "binary noise", page: "\x00\xff\xfe{{{\n\n\"\"", err: errAny},
		{name: "second TYPE line", page: "# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running counter\n", err: errAny},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs, err := parseEngineMetrics(strings.NewReader(tc.page))
			got := sampleOf(vs)
			switch {
			case tc.err == errAny && err == nil:
				t.Fatalf("no error; got %+v", got)
			case tc.err != nil && tc.err != errAny && !errors.Is(err, tc.err):
				t.Fatalf("error %v, want %v", err, tc.err)
			case tc.err == nil && err != nil:
				t.Fatalf("error %v", err)
			case tc.err == nil && got != tc.want:
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// sample is the part of a vllmmetrics.Sample the scraper uses, as the
// parser table states it: the prefix counters only when both are there.
type sample struct {
	running, waiting int64
	kvUsage          float64
	hits, queries    float64
	hasPrefix        bool
	sleeping         bool
	unhealthy        bool
}

func sampleOf(s vllmmetrics.Sample) sample {
	out := sample{running: s.Running, waiting: s.Waiting, kvUsage: s.KVCacheUsage, sleeping: s.Sleeping, unhealthy: s.Unhealthy}
	if s.HasPrefixHits && s.HasPrefixQueries {
		out.hits, out.queries, out.hasPrefix = s.PrefixHits, s.PrefixQueries, true
	}
	return out
}

// errAny stands for "some error" in the parser table.
var errAny = errors.New("any error")

// TestPrefixState: the hit ratio is the growth of hits over the growth of
// queries between two successful scrapes; unchanged when no query was
// made; unknown again, from a new baseline, when a counter goes down (the
// engine restarted) or disappears.
func TestPrefixState(t *testing.T) {
	steps := []struct {
		hits, queries float64
		has           bool
		want          float64
	}{
		{hits: 100, queries: 400, has: true, want: -1},  // first scrape: a baseline only
		{hits: 130, queries: 500, has: true, want: 0.3}, // 30 of 100 new tokens hit
		{hits: 130, queries: 500, has: true, want: 0.3}, // idle: the last ratio stays
		{hits: 230, queries: 600, has: true, want: 1},   // every new token hit
		{hits: 5, queries: 20, has: true, want: -1},     // restart: counters fell
		{hits: 5, queries: 40, has: true, want: 0},      // measured from the new baseline
		{has: false, want: -1},                          // counters gone
		{hits: 50, queries: 60, has: true, want: -1},    // back: a baseline again
		{hits: 70, queries: 100, has: true, want: 0.5},
	}
	ps := prefixState{ratio: -1}
	for i, s := range steps {
		got := ps.update(vllmmetrics.Sample{PrefixHits: s.hits, PrefixQueries: s.queries, HasPrefixHits: s.has, HasPrefixQueries: s.has})
		if got != s.want {
			t.Errorf("step %d (%+v): ratio %v, want %v", i, s, got, s.want)
		}
	}
}

// statsConfig is testConfig with scraping on: every second, 500 ms per
// scrape, stats trusted for 5 s.
func statsConfig(engines ...EngineConfig) Config {
	cfg := testConfig(engines...)
	cfg.Stats = EngineStatsConfig{Enabled: true, Interval: time.Second, Timeout: 500 * time.Millisecond, MaxAge: 5 * time.Second, Path: "/metrics"}
	return cfg
}

// TestEngineStatsExpire (in a synctest bubble, engines in memory): the
// scraper stores what an engine reports every interval; when the engine
// stops answering its /metrics, the last stats stay in place, are trusted
// until max_age after their scrape and then not at all: the gauges stop
// reporting the engine, and a sleeping engine, kept out of routing while
// its stats were fresh, is routable again. Its health verdict never moves.
func TestEngineStatsExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		eng := testutil.NewStatsEngine(testutil.SleepPage(1), "m")
		cfg := statsConfig(EngineConfig{Name: "e1", URL: "http://e1.test:8000", Models: []string{"m"}})
		p, err := New(cfg, mustMetrics(t), WithTransport(handlerTransport{eng}), WithLogger(discard))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		start := time.Now()
		p.Start()
		synctest.Wait()
		ep := p.engines[0].ep
		first := ep.Stats()
		if !first.Fresh(time.Now()) || !first.Sleeping || !first.At.Equal(start) || !first.Expires.Equal(start.Add(5*time.Second)) {
			t.Fatalf("after the first scrape: %+v (now %v)", first, start)
		}
		if _, err := p.Lookup("m"); !errors.Is(err, routing.ErrNoEndpoint) {
			t.Fatalf("sleeping engine routable: lookup error %v", err)
		}

		// Awake: the next scrape (one interval later) brings it back.
		eng.SetPage(testutil.SleepPage(0))
		time.Sleep(time.Second)
		synctest.Wait()
		if _, err := p.Lookup("m"); err != nil {
			t.Fatalf("awake engine not routable: %v", err)
		}
		eng.SetPage(testutil.SleepPage(2))
		time.Sleep(time.Second)
		synctest.Wait()
		last := ep.Stats()
		if _, err := p.Lookup("m"); !errors.Is(err, routing.ErrNoEndpoint) || !last.Sleeping {
			t.Fatalf("engine asleep again but routable: %v, %+v", err, last)
		}

		// The engine stops answering: every further scrape times out.
		eng.SetMode(testutil.MetricsHang)
		scrapes := eng.Scrapes()
		time.Sleep(5*time.Second - time.Nanosecond) // to just before expiry
		synctest.Wait()
		if eng.Scrapes() <= scrapes {
			t.Fatal("no scrape attempted while the engine hung")
		}
		if ep.Stats() != last || !last.Fresh(time.Now()) {
			t.Fatalf("a failed scrape replaced or expired the stats early: %+v", ep.Stats())
		}
		if n := countObserved(p); n != 1 {
			t.Errorf("fresh stats observed for %d engines, want 1", n)
		}
		if _, err := p.Lookup("m"); !errors.Is(err, routing.ErrNoEndpoint) {
			t.Fatalf("sleeping engine routable before its stats expired: %v", err)
		}
		time.Sleep(time.Nanosecond) // now == Expires: stale
		if last.Fresh(time.Now()) {
			t.Fatal("stats still fresh at their expiry")
		}
		if n := countObserved(p); n != 0 {
			t.Errorf("stale stats observed for %d engines, want 0", n)
		}
		// The next round notices (at most one interval and one timeout
		// later) and routes to the engine again; the probe decides.
		time.Sleep(cfg.Stats.Interval + cfg.Stats.Timeout)
		synctest.Wait()
		if _, err := p.Lookup("m"); err != nil {
			t.Errorf("engine with stale stats not routable: %v", err)
		}
		if !ep.Healthy() {
			t.Error("failed scrapes marked the engine unhealthy")
		}
		if ep.Stats() != last {
			t.Error("stats replaced without a successful scrape")
		}
	})
}

// countObserved returns how many engines the stats gauges would report.
func countObserved(p *Fleet) int {
	n := 0
	p.ObserveStats(func(*telemetry.Engine, telemetry.EngineStats) { n++ })
	return n
}

// TestScrapeFailuresKeepStats: a scrape answered 500, with garbage, with
// a body over 4 MiB or not at all leaves the previous stats in place, is
// logged at debug level with the engine name and never the engine's key,
// and does not touch the health verdict. The scrape carries the engine's
// key as the probes do.
func TestScrapeFailuresKeepStats(t *testing.T) {
	eng := testutil.NewStatsEngine(testutil.VLLMPage, "m")
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	cfg := statsConfig(EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}, APIKey: "sk-engine-secret"})
	cfg.Stats.Interval, cfg.Stats.MaxAge = time.Hour, 2*time.Hour // scrapes only when asked
	// Parsing 4 MiB under the race detector takes a good part of a second:
	// only the hanging engine below should time out.
	cfg.Stats.Timeout = 20 * time.Second
	var logs testutil.LockedBuffer
	p, err := New(cfg, mustMetrics(t),
		WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.ScrapeNow(context.Background())
	good := p.engines[0].ep.Stats()
	if good == nil || good.Running != 5 || good.Waiting != 5 || good.KVCacheUsage != 0.5 || good.PrefixCacheHitRatio != -1 {
		t.Fatalf("stats from the vLLM page: %+v", good)
	}
	if a := eng.LastAuth(); a != "Bearer sk-engine-secret" {
		t.Errorf("scrape sent Authorization %q, want the engine's key", a)
	}
	huge := "vllm:num_requests_running 1\n" + strings.Repeat("# padding padding padding padding padding padding padding\n", (5<<20)/58)
	for _, tc := range []struct {
		name string
		set  func()
		log  string
	}{
		{"status 500", func() { eng.SetMode(testutil.MetricsFail) }, "unexpected status 500"},
		{"garbage", func() { eng.SetMode(testutil.MetricsServe); eng.SetPage("vllm:num_requests_running {{{\n") }, "parse metrics"},
		{"over 4 MiB", func() { eng.SetPage(huge) }, "metrics body over the size limit (4 MiB)"},
		{"not vLLM", func() { eng.SetPage("up 1\n") }, "neither vllm:num_requests_running"},
		{"timeout", func() { eng.SetMode(testutil.MetricsHang); p.stats.Timeout = 100 * time.Millisecond }, "context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.set()
			p.ScrapeNow(context.Background())
			if st := p.engines[0].ep.Stats(); st != good {
				t.Errorf("stats replaced by a failed scrape: %+v", st)
			}
			if !p.engines[0].ep.Healthy() {
				t.Error("a failed scrape marked the engine unhealthy")
			}
			out := logs.String()
			if !strings.Contains(out, "engine stats scrape fail") || !strings.Contains(out, "engine=e1") || !strings.Contains(out, tc.log) {
				t.Errorf("log lacks the failure (%q):\n%s", tc.log, out)
			}
		})
	}
	// The first failure of the streak is a warning, the rest debug lines;
	// a scrape that works again says so once.
	if n := strings.Count(logs.String(), "level=WARN msg=\"engine stats scrape failing"); n != 1 {
		t.Errorf("%d warnings for one failure streak, want 1:\n%s", n, logs.String())
	}
	eng.SetMode(testutil.MetricsServe)
	eng.SetPage(testutil.VLLMPage)
	p.stats.Timeout = 20 * time.Second
	p.ScrapeNow(context.Background())
	if n := strings.Count(logs.String(), "msg=\"engine stats scrape recovered\" engine=e1"); n != 1 {
		t.Errorf("%d recovery lines, want 1:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "sk-engine-secret") {
		t.Errorf("the engine key was logged:\n%s", logs.String())
	}
}

// TestScrapeHitRatioAndRestart: the ratio comes from two consecutive
// successful scrapes of the same engine, stays through an idle scrape,
// and starts over when the counters fall (the engine restarted).
func TestScrapeHitRatioAndRestart(t *testing.T) {
	eng := testutil.NewStatsEngine("", "m")
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	cfg := statsConfig(EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	p, err := New(cfg, mustMetrics(t), WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	page := func(hits, queries int) string {
		return fmt.Sprintf("vllm:num_requests_running{model_name=\"m\"} 0\n"+
			"# TYPE vllm:prefix_cache_hits_total counter\nvllm:prefix_cache_hits_total{model_name=\"m\"} %d\n"+
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{model_name=\"m\"} %d\n", hits, queries)
	}
	ep := p.engines[0].ep
	for i, s := range []struct {
		hits, queries int
		want          float64
	}{
		{0, 0, -1},
		{48, 64, 0.75},
		{48, 64, 0.75},
		{112, 192, 0.5},
		{0, 16, -1}, // restarted
		{16, 32, 1},
	} {
		eng.SetPage(page(s.hits, s.queries))
		p.ScrapeNow(context.Background())
		if got := ep.Stats().PrefixCacheHitRatio; got != s.want {
			t.Errorf("scrape %d (hits %d, queries %d): ratio %v, want %v", i, s.hits, s.queries, got, s.want)
		}
	}
}

// TestStatsConfigValidate: the scraper settings are refused with the key
// in the message.
func TestStatsConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*EngineStatsConfig)
		want string // "" = valid
	}{
		{"defaults", func(*EngineStatsConfig) {}, ""},
		{"disabled with defaults", func(s *EngineStatsConfig) { s.Enabled = false }, ""},
		{"zero interval", func(s *EngineStatsConfig) { s.Interval = 0 }, "server.engine_stats.interval must be > 0"},
		{"negative timeout", func(s *EngineStatsConfig) { s.Timeout = -time.Second }, "server.engine_stats.timeout must be > 0"},
		{"zero max age", func(s *EngineStatsConfig) { s.MaxAge = 0 }, "server.engine_stats.max_age must be > 0"},
		{"timeout over interval", func(s *EngineStatsConfig) { s.Timeout = 2 * time.Second }, "timeout (2s) must not be longer than server.engine_stats.interval (1s)"},
		{"timeout equal to interval", func(s *EngineStatsConfig) { s.Timeout = s.Interval }, ""},
		{"max age equal to interval", func(s *EngineStatsConfig) { s.MaxAge = s.Interval }, "must be longer than server.engine_stats.interval"},
		{"max age below interval", func(s *EngineStatsConfig) { s.Interval = 10 * time.Second }, "max_age (5s) must be longer than server.engine_stats.interval (10s)"},
		{"empty path", func(s *EngineStatsConfig) { s.Path = "" }, "server.engine_stats.path must be a path starting with /"},
		{"relative path", func(s *EngineStatsConfig) { s.Path = "metrics" }, "server.engine_stats.path"},
		{"a URL", func(s *EngineStatsConfig) { s.Path = "http://x/metrics" }, "server.engine_stats.path"},
		{"a host", func(s *EngineStatsConfig) { s.Path = "//x/metrics" }, "server.engine_stats.path"},
		{"a query", func(s *EngineStatsConfig) { s.Path = "/metrics?x=1" }, "server.engine_stats.path"},
		{"a deeper path", func(s *EngineStatsConfig) { s.Path = "/engine/metrics" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultEngineStatsConfig()
			tc.mut(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			case err != nil && !errors.Is(err, ErrInvalidConfig):
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
}

// TestScrapeBlockSizeMismatch: an engine with a KV-event subscription
// whose scraped block size (vllm:cache_config_info) is not
// kv_events.block_size is logged once; one that agrees, or reports none,
// is not.
func TestScrapeBlockSizeMismatch(t *testing.T) {
	eng := testutil.NewStatsEngine("", "m")
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	cfg := statsConfig(EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}, KVEvents: "tcp://127.0.0.1:1"})
	var logs bytes.Buffer
	p, err := New(cfg, mustMetrics(t), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		WithKVIndex(routing.NewKVIndex(routing.DefaultKVIndexConfig()), KVEventsConfig{BlockSize: 16}))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	page := func(bs string) string {
		return "vllm:num_requests_running{model_name=\"m\"} 0\n" + `vllm:cache_config_info{block_size="` + bs + `",engine="0"} 1` + "\n"
	}
	for _, bs := range []string{"16", "", "32", "32"} {
		eng.SetPage(page(bs))
		p.ScrapeNow(context.Background())
	}
	if n := strings.Count(logs.String(), "is not kv_events.block_size"); n != 1 || !strings.Contains(logs.String(), "engine_block_size=32") {
		t.Errorf("logged %d times, want once with engine_block_size=32:\n%s", n, logs.String())
	}
}

// TestEngineKeyFile: an engine's key read from api_key_file is its
// Authorization; a reload reads the file again and uses a rotated key; a
// file that then cannot be read keeps the key in use (logged, and never
// the key itself); at start an empty file refuses the engine (fail
// closed), naming the file, not a key.
func TestEngineKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte("  sk-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ec := EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}, APIKeyFile: path}
	var logs bytes.Buffer
	f, err := New(Config{Engines: []EngineConfig{ec}, Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig()}, mustMetrics(t),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	auth := func() string { return strings.Join(f.engines[0].Auth(), "") }
	if got := auth(); got != "Bearer sk-one" {
		t.Fatalf("Authorization %q, want Bearer sk-one", got)
	}
	first := f.engines[0]
	if err := os.WriteFile(path, []byte("sk-two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SetConfigured([]EngineConfig{ec}, nil); err != nil {
		t.Fatal(err)
	}
	if got := auth(); got != "Bearer sk-two" || f.engines[0] != first {
		t.Errorf("after the rotation and a reload: %q (same incarnation %v), want Bearer sk-two on the same engine", got, f.engines[0] == first)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SetConfigured([]EngineConfig{ec}, nil); err != nil {
		t.Fatal(err)
	}
	if got := auth(); got != "Bearer sk-two" || !strings.Contains(logs.String(), "cannot read the engine's key again") || strings.Contains(logs.String(), "sk-") {
		t.Errorf("an emptied file: %q, logs %q; want the key kept, logged without it", got, logs.String())
	}
	_, err = New(Config{Engines: []EngineConfig{ec}, Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig()}, mustMetrics(t), WithLogger(discard))
	if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "api_key_file "+path+" is empty") {
		t.Errorf("an empty key file at start: %v, want an ErrInvalidConfig naming the file", err)
	}
	bad := ec
	bad.APIKey = "x"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "set one of api_key, api_key_env and api_key_file") {
		t.Errorf("api_key and api_key_file: %v", err)
	}
}
