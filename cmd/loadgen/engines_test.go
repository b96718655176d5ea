package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// fleet is a few in-process simulated engines behind a round-robin router
// that names the engine in X-Switchboard-Engine, as the gateway does. Each
// engine's /metrics is served on its own URL and records the engine's own
// counters at every scrape.
type fleet struct {
	names   []string
	engines []*enginesim.Engine
	metrics []string // /metrics URLs
	router  *httptest.Server

	mu       sync.Mutex
	arrivals []arrival           // chat requests, in arrival order
	scrapes  [][]enginesim.Stats // per engine, Stats() at each scrape
	next     int
}

// arrival is one chat request as the router saw it.
type arrival struct {
	engine string
	words  int // prompt words: the simulator's prompt tokens
}

func newFleet(t *testing.T, n int) *fleet {
	t.Helper()
	f := &fleet{scrapes: make([][]enginesim.Stats, n)}
	var handlers []http.Handler
	for i := range n {
		// A small block size, so short test prompts fill blocks.
		e, err := enginesim.New(enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond, BlockSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		f.names = append(f.names, fmt.Sprintf("e%d", i+1))
		f.engines = append(f.engines, e)
		handlers = append(handlers, e.Handler())
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			f.scrapes[i] = append(f.scrapes[i], e.Stats())
			f.mu.Unlock()
			e.Handler().ServeHTTP(w, r)
		}))
		f.metrics = append(f.metrics, srv.URL+"/metrics")
	}
	f.router = serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var cr chatRequest
		if err := json.Unmarshal(body, &cr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		words := 0
		for _, m := range cr.Messages {
			words += len(strings.Fields(m.Content))
		}
		f.mu.Lock()
		i := f.next % n
		f.next++
		f.arrivals = append(f.arrivals, arrival{engine: f.names[i], words: words})
		f.mu.Unlock()
		w.Header().Set(engineHeader, f.names[i])
		r.Body = io.NopCloser(bytes.NewReader(body))
		handlers[i].ServeHTTP(w, r)
	}))
	return f
}

// TestEngineCountsAndPrefixCache runs a conversation workload with a warmup
// through run, so the flags, the scrape before the measured requests and
// the report are all exercised, and checks the report against what the
// router and the simulators themselves counted.
func TestEngineCountsAndPrefixCache(t *testing.T) {
	const engines, warmup, measured = 3, 7, 40
	f := newFleet(t, engines)
	path := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"--url", f.router.URL, "--model", "m", "--stream",
		"--workload", "conversations", "--conversations", "5", "--turns", "4", "--system-prompts", "2",
		"--system-prompt-words", "40", "--prompt-words", "6", "--max-tokens", "3",
		"--concurrency", "4", "--warmup", "7", "--requests", "40",
		"--engine-metrics", strings.Join(f.metrics, ","), "--json", path}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Succeeded != measured || rep.Warmup != warmup {
		t.Fatalf("%d ok, %d warmup, want %d, %d", rep.Succeeded, rep.Warmup, measured, warmup)
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.arrivals) != warmup+measured {
		t.Fatalf("router got %d requests, want %d", len(f.arrivals), warmup+measured)
	}
	// The measured requests start only after every warmup request ended,
	// so they are the last ones to arrive.
	want := map[string]int{}
	words := 0
	for _, a := range f.arrivals[warmup:] {
		want[a.engine]++
		words += a.words
	}
	if !reflect.DeepEqual(rep.EngineRequests, want) {
		t.Errorf("engine requests %v, want %v (the router's count of the measured requests)", rep.EngineRequests, want)
	}
	sum, busiest := 0, 0
	for _, n := range rep.EngineRequests {
		sum += n
		busiest = max(busiest, n)
	}
	if sum != rep.Succeeded {
		t.Errorf("engine requests sum to %d, want the %d successful requests", sum, rep.Succeeded)
	}
	if wantShare := float64(busiest) / (float64(measured) / engines); rep.BusiestEngineShare != wantShare {
		t.Errorf("busiest share %v, want %v", rep.BusiestEngineShare, wantShare)
	}

	// Three scrapes per engine: the check at the start, the one right
	// before the measured requests, the one after.
	pc := rep.PrefixCache
	if pc == nil || pc.Error != "" || pc.Engines != engines || len(pc.PerEngine) != engines {
		t.Fatalf("prefix cache report %+v", pc)
	}
	var hits, queries int64
	for i, s := range f.scrapes {
		if len(s) != 3 {
			t.Fatalf("engine %d scraped %d times, want 3", i, len(s))
		}
		h, q := s[2].PrefixCacheHits-s[1].PrefixCacheHits, s[2].PrefixCacheQueries-s[1].PrefixCacheQueries
		e := pc.PerEngine[i]
		if e.URL != f.metrics[i] || e.HitTokens != float64(h) || e.QueriedTokens != float64(q) || e.HitRate != float64(h)/float64(q) {
			t.Errorf("engine %d: %+v, want %d hits of %d queries (the simulator's own counters)", i, e, h, q)
		}
		hits += h
		queries += q
	}
	if pc.HitTokens != float64(hits) || pc.QueriedTokens != float64(queries) || pc.HitRate != float64(hits)/float64(queries) {
		t.Errorf("prefix cache %v of %v = %v, want %d of %d", pc.HitTokens, pc.QueriedTokens, pc.HitRate, hits, queries)
	}
	// Nothing of the warmup leaks in: the queried tokens are exactly the
	// prompt words of the measured requests.
	if queries != int64(words) {
		t.Errorf("engines queried %d tokens, want the %d prompt words of the measured requests", queries, words)
	}
	// Shared system prompts and growing histories do hit the cache.
	if pc.HitRate <= 0.3 || pc.HitRate >= 1 {
		t.Errorf("hit rate %v, want a real share", pc.HitRate)
	}

	for _, want := range []string{"busiest/mean", "e1 ", "prefix cache", "all (3 engines)", f.metrics[0]} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, stdout.String())
		}
	}
	var again bytes.Buffer
	if err := rep.WriteJSON(&again); err != nil {
		t.Fatal(err)
	}
	if again.String() != string(data) {
		t.Errorf("JSON does not round-trip:\n%s\nvs\n%s", data, again.String())
	}
}

func TestEngineMetricsUnreachable(t *testing.T) {
	rec := &recorder{next: newSim(t)}
	srv := serve(t, rec)
	closed := struct{ URL string }{testutil.RefusedURL}
	for _, tc := range []struct {
		name, url string
	}{
		{"connection refused", closed.URL + "/metrics"},
		{"not found", srv.URL + "/nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout bytes.Buffer
			err := run(context.Background(), []string{"--url", srv.URL, "--requests", "3", "--engine-metrics", tc.url}, &stdout, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "--engine-metrics") || !strings.Contains(err.Error(), tc.url) {
				t.Errorf("run: %v, want an --engine-metrics error naming %s", err, tc.url)
			}
			if n := len(rec.requests()); n != 0 || stdout.Len() != 0 {
				t.Errorf("%d requests sent and %d bytes of report, want none before the metrics check", n, stdout.Len())
			}
		})
	}
	if _, err := parseFlags([]string{"--requests", "1", "--engine-metrics", "localhost:8001/metrics"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--engine-metrics") {
		t.Errorf("parseFlags: %v, want an --engine-metrics URL error", err)
	}
}

// TestBeforeMeasured checks that the hook runs once, after every warmup
// request and before any measured one, with nothing in flight, in both
// loops.
func TestBeforeMeasured(t *testing.T) {
	var mu sync.Mutex
	got := 0
	sim := newSim(t)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got++
		mu.Unlock()
		sim.ServeHTTP(w, r)
	}))
	for _, tc := range []struct {
		name   string
		args   []string
		warmup int
	}{
		{"closed loop", []string{"--concurrency", "4", "--warmup", "9"}, 9},
		{"open loop", []string{"--rate", "2000", "--warmup", "9"}, 9},
		{"no warmup", []string{"--concurrency", "4"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			got = 0
			mu.Unlock()
			cfg, err := parseFlags(append([]string{"--url", srv.URL, "--stream", "--requests", "20", "--max-tokens", "2"}, tc.args...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			tr := http.DefaultTransport.(*http.Transport).Clone()
			defer tr.CloseIdleConnections()
			r := NewRunner(cfg, newWorkload(cfg), NewClient(cfg, &http.Client{Transport: tr}))
			calls := 0
			r.BeforeMeasured(func() {
				calls++
				mu.Lock()
				defer mu.Unlock()
				if got != tc.warmup || r.inflight.Load() != 0 || r.done.Load() != 0 {
					t.Errorf("hook saw %d requests received, %d in flight, %d measured done; want %d, 0, 0", got, r.inflight.Load(), r.done.Load(), tc.warmup)
				}
			})
			results, _ := r.Run(context.Background())
			if calls != 1 || len(results) != 20 || r.Warmup() != tc.warmup {
				t.Errorf("hook called %d times, %d results, %d warmup; want 1, 20, %d", calls, len(results), r.Warmup(), tc.warmup)
			}
		})
	}
}

func TestParsePrefixCounters(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want prefixCounters
		err  string
	}{
		{
			name: "vllm text, series summed",
			body: "# HELP vllm:prefix_cache_queries_total Prefix cache queries.\n" +
				"# TYPE vllm:prefix_cache_queries_total counter\n" +
				"vllm:prefix_cache_queries_total{model_name=\"a\"} 100\n" +
				"vllm:prefix_cache_queries_total{model_name=\"b\"} 50\n" +
				"# TYPE vllm:prefix_cache_hits_total counter\n" +
				"vllm:prefix_cache_hits_total{model_name=\"a\"} 60\n" +
				"vllm:prefix_cache_hits_total{model_name=\"b\"} 15\n" +
				"# TYPE vllm:prefix_cache_hits_created gauge\n" +
				"vllm:prefix_cache_hits_created{model_name=\"a\"} 1.7e9\n",
			want: prefixCounters{queries: 150, hits: 75},
		},
		{
			name: "untyped, without _total",
			body: "vllm:prefix_cache_queries 8\nvllm:prefix_cache_hits 2\n",
			want: prefixCounters{queries: 8, hits: 2},
		},
		{
			name: "_total wins over the bare name",
			body: "vllm:prefix_cache_queries_total 8\nvllm:prefix_cache_queries 1000\nvllm:prefix_cache_hits_total 2\n",
			want: prefixCounters{queries: 8, hits: 2},
		},
		{
			name: "openmetrics",
			body: "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{model_name=\"a\"} 40\n" +
				"# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits_total{model_name=\"a\"} 30\n# EOF\n",
			want: prefixCounters{queries: 40, hits: 30},
		},
		{
			name: "no hits counter",
			body: "vllm:prefix_cache_queries_total 8\nvllm:num_requests_running 1\n",
			err:  "no vllm:prefix_cache_hits_total metric",
		},
		{
			name: "not an exposition",
			body: "<html>hello</html>\n",
			err:  "parse metrics",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePrefixCounters(strings.NewReader(tc.body))
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("err %v, want one containing %q", err, tc.err)
			case tc.err == "" && (err != nil || got != tc.want):
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestPrefixCacheGrowth(t *testing.T) {
	urls := []string{"http://a/metrics", "http://b/metrics", "http://c/metrics"}
	before := []prefixCounters{{queries: 100, hits: 40}, {queries: 500, hits: 400}, {queries: 7, hits: 0}}
	// b restarted: its counters start again from 0. c saw nothing.
	after := []prefixCounters{{queries: 300, hits: 190}, {queries: 60, hits: 10}, {queries: 7, hits: 0}}
	got := prefixCacheGrowth(urls, before, after)
	want := &PrefixCache{Engines: 3, QueriedTokens: 260, HitTokens: 160, HitRate: 160.0 / 260, PerEngine: []EngineCache{
		{URL: urls[0], QueriedTokens: 200, HitTokens: 150, HitRate: 0.75},
		{URL: urls[1], QueriedTokens: 60, HitTokens: 10, HitRate: 10.0 / 60},
		{URL: urls[2]},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestCountEngines(t *testing.T) {
	var results []*Result
	for i := range MaxEngineNames + 44 {
		results = append(results, &Result{Engine: fmt.Sprintf("e%03d", i)})
	}
	results = append(results, &Result{Engine: "e000"}, &Result{}, &Result{Engine: "e999", Class: ClassHTTP5xx})
	counts := countEngines(results)
	if len(counts) != MaxEngineNames+1 || counts[OtherEngines] != 45 || counts["e000"] != 2 || counts["e255"] != 1 {
		t.Errorf("%d names, other %d, e000 %d, e255 %d; want %d, 45, 2, 1", len(counts), counts[OtherEngines], counts["e000"], counts["e255"], MaxEngineNames+1)
	}
	if counts := countEngines([]*Result{{}, {Class: ClassConnect}}); counts != nil {
		t.Errorf("no engine header: %v, want nil", counts)
	}
	for _, tc := range []struct {
		counts  map[string]int
		engines int
		want    float64
	}{
		{map[string]int{"a": 5, "b": 5}, 0, 1},
		{map[string]int{"a": 6, "b": 2}, 0, 1.5},
		{map[string]int{"a": 6, "b": 2}, 4, 3}, // two of four engines got nothing
		{map[string]int{"a": 6, "b": 2}, 1, 1.5},
		{map[string]int{"a": 6, "b": 2, OtherEngines: 100}, 0, 1.5},
		{nil, 4, 0},
	} {
		if got := busiestShare(tc.counts, tc.engines); got != tc.want {
			t.Errorf("busiestShare(%v, %d) = %v, want %v", tc.counts, tc.engines, got, tc.want)
		}
	}
}
