package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// offsetClock is the wall clock moved forward by a settable offset: the
// stats of a real-socket test can be aged without waiting.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) now() time.Time                    { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *offsetClock) advance(d time.Duration)           { c.off.Add(int64(d)) }
func withClock(now func() time.Time) Option              { return optionFunc(func(c *config) { c.now = now }) }
func (h *harness) pool() *fleet.Fleet                    { return h.gw.Fleet() }
func (h *harness) scrape()                               { h.pool().ScrapeNow(context.Background()) }
func (h *harness) status(name string) fleet.EngineStatus { return statusOf(h.t, h.pool(), name) }

// withFleet passes more options to the fleet (fleet.New).
func withFleet(opts ...fleet.Option) Option {
	return optionFunc(func(c *config) { c.fleet = append(c.fleet, opts...) })
}

// statsConfig is testConfig with scraping on: every second, 500 ms per
// scrape, stats trusted for 5 s.
func statsConfig(engines ...fleet.EngineConfig) Config {
	cfg := testConfig(engines...)
	cfg.EngineStats = fleet.EngineStatsConfig{Enabled: true, Interval: time.Second, Timeout: 500 * time.Millisecond, MaxAge: 5 * time.Second, Path: "/metrics"}
	return cfg
}

func statusOf(t testing.TB, p *fleet.Fleet, name string) fleet.EngineStatus {
	t.Helper()
	for _, s := range p.Status() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no engine %q in the status", name)
	return fleet.EngineStatus{}
}

// engineGauges returns the value of the engine gauge name per engine, from
// one collection; an engine absent from the map was not observed.
func engineGauges(t testing.TB, rm metricdata.ResourceMetrics, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	m, ok := findMetric(rm, name)
	if !ok {
		return out
	}
	check := func(set attribute.Set) {
		if set.Len() != 1 {
			t.Errorf("%s: attributes %v, want engine only", name, set.Encoded(attribute.DefaultEncoder()))
		}
	}
	switch d := m.Data.(type) {
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			check(dp.Attributes)
			e, _ := dp.Attributes.Value(telemetry.AttrEngine)
			out[e.AsString()] = float64(dp.Value)
		}
	case metricdata.Gauge[float64]:
		for _, dp := range d.DataPoints {
			check(dp.Attributes)
			e, _ := dp.Attributes.Value(telemetry.AttrEngine)
			out[e.AsString()] = dp.Value
		}
	default:
		t.Fatalf("%s is %T, want a gauge", name, m.Data)
	}
	return out
}

// engineMetric reads one unlabelled-by-us sample straight from a
// simulated engine's /metrics: the first line starting with prefix.
func engineMetric(t *testing.T, url, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f := strings.Fields(rest)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s in the engine's metrics", prefix)
	return 0
}

// TestEngineStatsGauges reads the four engine gauges through the manual
// reader while a simulated engine runs one request and queues two (max one
// sequence), after two identical prompts hit its prefix cache: queue
// depth 2, drift 0, the KV usage the engine itself reports and the hit
// ratio of the engine's own counters between the two scrapes. Once the
// stats are older than max_age none of the gauges reports the engine.
func TestEngineStatsGauges(t *testing.T) {
	eng, srv := sim(t, enginesim.Config{Models: []string{"m"}, MaxNumSeqs: 1, BlockSize: 4, KVCacheBlocks: 64})
	cfg := statsConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL})
	cfg.EngineStats.Interval, cfg.EngineStats.MaxAge = time.Hour, 2*time.Hour // scrapes only when asked
	clk := &offsetClock{}
	h := newHarnessWith(t, cfg, []Option{withClock(clk.now)})

	h.scrape() // the prefix cache baseline
	before := eng.Stats()
	const prompt = `{"model":"m","prompt":"one two three four five six seven eight nine ten eleven twelve","max_tokens":2}`
	for range 2 {
		resp := h.post("/v1/completions", prompt)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %d", resp.StatusCode)
		}
	}
	if eng.Stats().PrefixCacheHits == before.PrefixCacheHits {
		t.Fatal("the repeated prompt made no prefix cache hit; the test proves nothing")
	}

	// One stream runs and stalls after its first token, two wait behind it.
	ctx, cancel := context.WithCancel(context.Background())
	var streams sync.WaitGroup
	for range 3 {
		streams.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"a b c d e"}]}`))
			req.Header.Set(enginesim.FaultHeader, "stall-after=1")
			if resp, err := h.client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	defer func() {
		cancel()
		streams.Wait()
		h.waitIdle()
	}()
	// The running stream's prompt (5 words) is looked up in the prefix
	// cache a moment after it counts as running: wait for that too.
	queried := before.PrefixCacheQueries + 2*12 + 5
	testutil.Eventually(t, 5*time.Second, func() bool {
		s := eng.Stats()
		pf, dc := h.pool().Engine("e1").Endpoint().InFlight()
		return s.Running == 1 && s.Waiting == 2 && pf+dc == 3 && s.PrefixCacheQueries == queried
	}, "1 running and 2 waiting on the engine")
	// The engine is still now (one sequence stalled, two queued): its
	// counters at this point are the ones the second scrape reads.
	after := eng.Stats()
	wantRatio := float64(after.PrefixCacheHits-before.PrefixCacheHits) / float64(after.PrefixCacheQueries-before.PrefixCacheQueries)
	h.scrape()
	wantKV := engineMetric(t, srv.URL, "vllm:kv_cache_usage_perc")
	if wantKV <= 0 {
		t.Fatalf("the engine reports KV usage %v with a sequence running", wantKV)
	}
	rm := h.collect()
	for _, tc := range []struct {
		name string
		want float64
	}{
		{telemetry.QueueDepthName, 2},
		{telemetry.AccountingDriftName, 0},
		{telemetry.KVCacheUsageName, wantKV},
		{telemetry.PrefixCacheHitRatioName, wantRatio},
	} {
		got := engineGauges(t, rm, tc.name)
		if v, ok := got["e1"]; !ok || v != tc.want || len(got) != 1 {
			t.Errorf("%s = %v, want e1=%v", tc.name, got, tc.want)
		}
	}
	st := h.status("e1").Stats
	if st == nil || st.Running != 1 || st.Waiting != 2 || st.GatewayInFlight != 3 || !st.Fresh ||
		st.KVCacheUsage == nil || *st.KVCacheUsage != wantKV || st.PrefixCacheHitRatio == nil || *st.PrefixCacheHitRatio != wantRatio {
		t.Errorf("admin status stats: %+v", st)
	}

	// Stale: the gauges show a gap, not the last value.
	clk.advance(cfg.EngineStats.MaxAge)
	rm = h.collect()
	for _, name := range []string{telemetry.QueueDepthName, telemetry.AccountingDriftName, telemetry.KVCacheUsageName, telemetry.PrefixCacheHitRatioName} {
		if got := engineGauges(t, rm, name); len(got) != 0 {
			t.Errorf("%s still reported from stale stats: %v", name, got)
		}
	}
	if st := h.status("e1").Stats; st == nil || st.Fresh || st.AgeSeconds < cfg.EngineStats.MaxAge.Seconds() {
		t.Errorf("admin status of stale stats: %+v", st)
	}
}

// completionJSON is a minimal non-streaming completions body.
const completionJSON = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"hi","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`

// TestSleepingEngineGetsNoRequests: an engine whose fresh stats say it
// sleeps (vLLM's vllm:engine_sleep_state) or is unhealthy (vllm:engine_healthy
// 0) receives no new request while its health verdict stays healthy; it
// gets traffic again once it wakes, and once its stats expire.
func TestSleepingEngineGetsNoRequests(t *testing.T) {
	var hits [2]atomic.Int64
	engines := [2]*testutil.StatsEngine{testutil.NewStatsEngine(testutil.SleepPage(1), "m"), testutil.NewStatsEngine(testutil.SleepPage(0), "m")}
	var cfgs []fleet.EngineConfig
	for i, e := range engines {
		e.HandleV1(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			hits[i].Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, completionJSON)
		})
		srv := enginetest.Serve(t, e)
		cfgs = append(cfgs, fleet.EngineConfig{Name: fmt.Sprintf("e%d", i+1), URL: srv.URL, Models: []string{"m"}})
	}
	cfg := statsConfig(cfgs...)
	cfg.EngineStats.Interval, cfg.EngineStats.MaxAge = time.Hour, 2*time.Hour
	clk := &offsetClock{}
	h := newHarnessWith(t, cfg, []Option{withClock(clk.now)})
	send := func(n int) (e1, e2 int64) {
		t.Helper()
		a, b := hits[0].Load(), hits[1].Load()
		for range n {
			resp := h.post("/v1/completions", `{"model":"m","prompt":"x","max_tokens":1}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		return hits[0].Load() - a, hits[1].Load() - b
	}

	h.scrape()
	if st := h.status("e1"); st.Routable || !st.Healthy || st.Stats == nil || !st.Stats.Sleeping {
		t.Fatalf("sleeping e1: %+v", st)
	}
	if a, b := send(6); a != 0 || b != 6 {
		t.Fatalf("sleeping e1 got %d of 6 requests (e2 %d)", a, b)
	}

	engines[0].SetPage(testutil.SleepPage(0))
	h.scrape()
	if a, b := send(6); a != 3 || b != 3 {
		t.Fatalf("awake: e1 %d, e2 %d of 6 requests, want 3 each", a, b)
	}

	engines[0].SetPage(testutil.SleepPage(0) + "# TYPE vllm:engine_healthy gauge\nvllm:engine_healthy{engine=\"0\"} 0\n")
	h.scrape()
	if st := h.status("e1"); st.Routable || !st.Healthy || !st.Stats.EngineUnhealthy {
		t.Fatalf("self-reported unhealthy e1: %+v", st)
	}
	if a, _ := send(4); a != 0 {
		t.Fatalf("self-reported unhealthy e1 got %d requests", a)
	}

	// Both engines asleep: the model is known but has no engine.
	engines[1].SetPage(testutil.SleepPage(2))
	h.scrape()
	resp := h.post("/v1/completions", `{"model":"m","prompt":"x","max_tokens":1}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("every engine asleep: status %d, want 503", resp.StatusCode)
	}
	engines[1].SetPage(testutil.SleepPage(0))

	// e1 stops answering /metrics while blocked: its stats expire and it
	// is routable again (the health probe, which still passes, decides).
	engines[0].SetMode(testutil.MetricsFail)
	h.scrape()
	if a, _ := send(2); a != 0 {
		t.Fatalf("e1 got requests while its unhealthy stats were fresh")
	}
	clk.advance(cfg.EngineStats.MaxAge)
	h.scrape()
	if st := h.status("e1"); !st.Routable || st.Stats == nil || st.Stats.Fresh {
		t.Fatalf("e1 with stale stats: %+v", st)
	}
	if a, b := send(6); a != 3 || b != 3 {
		t.Fatalf("stale e1: e1 %d, e2 %d of 6 requests, want 3 each", a, b)
	}
	h.waitIdle()
}

// TestAccountingDriftZeroAfterMixedFaults runs a mixed load through the
// gateway against simulated engines only the gateway talks to: streaming
// and non-streaming successes, client cancellations mid-stream, and every
// fast engine fault of the soak (status errors, disconnects before and
// after the headers and mid-stream, truncation, stalls cut by the gateway's
// timeouts), with the scraper running all along. Once the load has ended
// and every engine is idle, a forced scrape must find
// switchboard.engine.accounting_drift at exactly 0 on every engine: the
// engines run and queue exactly what the gateway believes is in flight,
// so no slot leaked on either side.
func TestAccountingDriftZeroAfterMixedFaults(t *testing.T) {
	const nEngines, total, conc = 3, 600, 8
	var sims []*enginesim.Engine
	var engines []fleet.EngineConfig
	for i := range nEngines {
		e, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond,
			OutputTokens: 4, MaxNumSeqs: 4}) // few seats: requests queue, and are aborted while queued
		sims = append(sims, e)
		engines = append(engines, fleet.EngineConfig{Name: fmt.Sprintf("e%d", i+1), URL: srv.URL, Models: []string{"m"}})
	}
	cfg := statsConfig(engines...)
	cfg.EngineStats.Interval, cfg.EngineStats.Timeout, cfg.EngineStats.MaxAge = 200*time.Millisecond, 200*time.Millisecond, time.Minute
	// The soak's short timeouts, so the stall faults end quickly.
	cfg.Timeouts.ResponseHeader = 250 * time.Millisecond
	cfg.Timeouts.FirstToken = 500 * time.Millisecond
	cfg.Timeouts.Idle = 100 * time.Millisecond
	cfg.Timeouts.Attempt = 0
	cfg.Timeouts.Request = time.Second
	h := newHarness(t, cfg, withPolicy(routing.NewLeastLoaded(2)))

	schedule, bodies := soakSchedule(3, 4)
	var outcomes [numOutcomes]atomic.Int64
	var idx atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			w := &soakWorker{client: h.client, url: h.srv.URL, br: bufio.NewReaderSize(nil, 4096)}
			for {
				i := idx.Add(1) - 1
				if i >= total {
					return
				}
				ki := schedule[i%int64(len(schedule))]
				outcomes[w.do(&soakKinds[ki], bodies[ki])].Add(1)
			}
		})
	}
	wg.Wait()

	// The gateway is idle: no attempt live. The engines are not waited on:
	// the drift gauge itself must come to exactly 0 on every engine (an
	// aborted request leaves its engine a moment after the client has
	// gone), which only happens if the engines run and queue nothing the
	// gateway does not count. A request leaked on either side keeps it off 0.
	testutil.Eventually(t, 5*time.Second, func() bool { return h.gw.LiveAttempts() == 0 }, "the gateway to be idle")
	var rm metricdata.ResourceMetrics
	var drift, queue map[string]float64
	zero := func() bool {
		h.scrape()
		rm = h.collect()
		drift = engineGauges(t, rm, telemetry.AccountingDriftName)
		queue = engineGauges(t, rm, telemetry.QueueDepthName)
		for _, e := range engines {
			if v, ok := drift[e.Name]; !ok || v != 0 {
				return false
			}
		}
		return true
	}
	testutil.Poll(5*time.Second, zero)
	for _, e := range engines {
		if v, ok := drift[e.Name]; !ok || v != 0 {
			t.Errorf("accounting drift on %s = %v (observed %v), want exactly 0", e.Name, v, ok)
		}
		if v, ok := queue[e.Name]; !ok || v != 0 {
			t.Errorf("queue depth on %s = %v (observed %v), want 0", e.Name, v, ok)
		}
	}
	for _, e := range sims {
		if s := e.Stats(); s.Running != 0 || s.Waiting != 0 {
			t.Errorf("an engine still runs %d and queues %d with the gateway idle", s.Running, s.Waiting)
		}
	}
	h.assertIdle()

	// The mix really had cancellations and engine faults.
	var aborted, faulted, completed int64
	for _, e := range sims {
		s := e.Stats()
		aborted, faulted, completed = aborted+s.Aborted, faulted+s.Faulted, completed+s.Completed
	}
	errs := errorTypesOf(rm, telemetry.RequestDurationName)
	if aborted == 0 || faulted == 0 || completed == 0 || outcomes[outCancelled].Load() == 0 ||
		errs[ErrTypeClientCancelled] == 0 || errs[ErrTypeEngineDisconnect] == 0 || errs["500"] == 0 {
		t.Errorf("the load lacked a kind: engines completed %d, aborted %d, faulted %d; client cancellations %d; error types %v",
			completed, aborted, faulted, outcomes[outCancelled].Load(), errs)
	}
	if n := outcomes[outTransportErr].Load(); n != 0 {
		t.Errorf("%d requests got no response at all", n)
	}
}
