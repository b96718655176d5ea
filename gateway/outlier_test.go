package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// outlierRig is a gateway in front of simulated engines serving model m,
// with an injected clock and a count of each engine's ended attempts.
type outlierRig struct {
	*harness
	clk     *testutil.Clock
	logs    *logRecorder // what the gateway logged
	sims    map[string]*enginesim.Engine
	mu      sync.Mutex
	ended   map[string]int
	chat    string
	streams string
}

// newOutlierRig starts one simulated engine per name (a name "dead" gets an
// engine that passed a probe and then stopped listening, "errevent" an
// engine whose every stream is one error event), all serving "m" (static
// models, so no probe is needed before traffic), with round-robin routing,
// one attempt per request, no probe at start (but the one "dead" passed),
// and mod applied to the config.
func newOutlierRig(t *testing.T, names []string, mod func(*Config)) *outlierRig {
	t.Helper()
	r := &outlierRig{clk: testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), logs: &logRecorder{}, sims: map[string]*enginesim.Engine{}, ended: map[string]int{},
		chat:    `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`,
		streams: `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`}
	var engines []fleet.EngineConfig
	var dead []*httptest.Server
	for _, n := range names {
		url := ""
		switch n {
		case "errevent":
			url = enginetest.Serve(t, http.HandlerFunc(errorEventEngine)).URL
		case "dead":
			_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
			dead = append(dead, srv)
			url = srv.URL
		default:
			e, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
			r.sims[n] = e
			url = srv.URL
		}
		engines = append(engines, fleet.EngineConfig{Name: n, URL: url, Models: []string{"m"}})
	}
	cfg := testConfig(engines...)
	cfg.MaxAttempts = 1
	if mod != nil {
		mod(&cfg)
	}
	r.harness = newHarnessWith(t, cfg, []Option{withClock(r.clk.Now), withFleet(fleet.WithAfterFunc(r.clk.AfterFunc)), WithLogger(slog.New(r.logs))}, withoutStart())
	if dead != nil {
		// Healthy at its last probe, then gone: its first refused
		// connection's probe is not the engine's first verdict.
		r.gw.fleet.ProbeNow(context.Background())
		for _, srv := range dead {
			srv.Close()
		}
	}
	r.gw.onRelease = func(name string, _ routing.Phase) {
		r.mu.Lock()
		r.ended[name]++
		r.mu.Unlock()
	}
	return r
}

// logRecorder is a slog.Handler that counts the records of every level by
// message (bounded: a map of the distinct messages).
type logRecorder struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil {
		l.n = map[string]int{}
	}
	l.n[r.Message]++
	return nil
}

// count returns how many records had a message starting with prefix.
func (l *logRecorder) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for m, c := range l.n {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}

// errorEventEngine answers /health, and every other request with a stream
// holding one error event (an engine failing mid-generation the way vLLM
// reports it), then closes.
func errorEventEngine(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: {\"error\":{\"message\":\"engine failure\",\"type\":\"InternalServerError\",\"code\":500}}\n\n")
}

func (r *outlierRig) attempts(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ended[name]
}

// send posts body and returns the status and the engine that answered.
func (r *outlierRig) send(body string, hdr ...string) (int, string) {
	r.t.Helper()
	resp := r.post("/v1/chat/completions", body, hdr...)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("X-Switchboard-Engine")
}

// sendUntil sends body until engine name has ended n attempts in total
// (bounded), checking before each request that name is still routable.
func (r *outlierRig) sendUntil(name string, n int, body string, hdr ...string) {
	r.t.Helper()
	for i := 0; r.attempts(name) < n; i++ {
		if i > 20*n+20 {
			r.t.Fatalf("%s ended %d attempts after %d requests, want %d", name, r.attempts(name), i, n)
		}
		if st := r.status(name); st.State != "ready" {
			r.t.Fatalf("%s is %s after %d of its attempts, before the streak of %d", name, st.State, r.attempts(name), n)
		}
		r.send(body, hdr...)
	}
}

func (r *outlierRig) state(name string) string { return r.status(name).State }

// TestOutlierEjectsAfterStreak: each failure kind ejects the engine after
// exactly its configured streak: 5xx answers, engines dropping a stream
// mid-way (after content reached the client), error events, refused
// connections, header timeouts. The ejected engine leaves routing at once
// and the state shows in /admin/engines and the state gauge.
func TestOutlierEjectsAfterStreak(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  string // the bad engine's default fault
		stream bool
		n      func(*routing.OutlierConfig) int
		mod    func(*Config)
	}{
		{name: "engine 500", fault: "status=500", n: func(c *routing.OutlierConfig) int { return c.Consecutive5xx }},
		{name: "engine 503", fault: "status=503", n: func(c *routing.OutlierConfig) int { return c.Consecutive5xx }},
		{name: "mid-stream disconnect", fault: "close-after=2", stream: true, n: func(c *routing.OutlierConfig) int { return c.Consecutive5xx }},
		{name: "error event", stream: true, n: func(c *routing.OutlierConfig) int { return c.Consecutive5xx }},
		// The refused connections also probe the engine (once: the clock
		// stands still, and a probe is debounced for health.timeout); at
		// unhealthy_after 2 (the default) its one failure leaves the engine
		// in, so the streak is what takes it out.
		{name: "connect failure", n: func(c *routing.OutlierConfig) int { return c.ConsecutiveConnectFailures },
			mod: func(c *Config) { c.Health.UnhealthyAfter = 2 }},
		{name: "header timeout", fault: "stall-before-headers", stream: true, n: func(c *routing.OutlierConfig) int { return c.ConsecutiveTimeouts },
			mod: func(c *Config) { c.Timeouts.ResponseHeader = 20 * time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := "bad"
			switch tc.name {
			case "connect failure":
				bad = "dead"
			case "error event":
				bad = "errevent"
			}
			r := newOutlierRig(t, []string{bad, "good"}, tc.mod)
			if e := r.sims[bad]; e != nil {
				if err := e.SetFault(tc.fault); err != nil {
					t.Fatal(err)
				}
			}
			body := r.chat
			if tc.stream {
				body = r.streams
			}
			oc := r.gw.fleet.OutlierConfig()
			n := tc.n(&oc)
			r.sendUntil(bad, n, body)
			st := r.status(bad)
			if st.State != "ejected" || st.Routable || st.EjectedUntil == nil || st.Ejections != 1 {
				t.Fatalf("after %d failures: %+v, want ejected once", n, st)
			}
			if want := r.clk.Now().Add(30 * time.Second); !st.EjectedUntil.Equal(want) {
				t.Errorf("ejected_until %s, want %s (base_ejection_time)", st.EjectedUntil, want)
			}
			if s := r.engineStates()[bad]; s != "ejected" {
				t.Errorf("state gauge %q, want ejected", s)
			}
			for range 6 {
				if code, eng := r.send(r.chat); code != 200 || eng != "good" {
					t.Fatalf("after the ejection: %d from %q, want 200 from good", code, eng)
				}
			}
			if got := r.attempts(bad); got != n {
				t.Errorf("%s ended %d attempts, want %d: nothing more after its ejection", bad, got, n)
			}
			r.waitIdle()
		})
	}
}

// TestOutlierNeutralOutcomes: 4xx (429 too) and clients that cancel never
// count against an engine, however many.
func TestOutlierNeutralOutcomes(t *testing.T) {
	for _, fault := range []string{"status=400", "status=404", "status=429,retry-after=1"} {
		t.Run(fault, func(t *testing.T) {
			r := newOutlierRig(t, []string{"bad", "good"}, nil)
			if err := r.sims["bad"].SetFault(fault); err != nil {
				t.Fatal(err)
			}
			for range 40 {
				r.send(r.chat)
			}
			if r.attempts("bad") < 10 {
				t.Fatalf("bad ended %d attempts, want many", r.attempts("bad"))
			}
			if st := r.status("bad"); st.State != "ready" || st.Ejections != 0 {
				t.Errorf("after %d answers %s: %+v, want ready", r.attempts("bad"), fault, st)
			}
			r.waitIdle()
		})
	}
	t.Run("client cancels", func(t *testing.T) {
		r := newOutlierRig(t, []string{"bad", "good"}, nil)
		if err := r.sims["bad"].SetFault("stall-before-headers"); err != nil {
			t.Fatal(err)
		}
		// bad never sends headers; every client gives up after 30 ms.
		for i := 0; r.attempts("bad") < 12; i++ {
			if i > 100 {
				t.Fatal("bad engine not reached")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(r.streams))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := r.client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			cancel()
			r.waitIdle()
		}
		if et := r.errorTypes(); et[ErrTypeClientCancelled] < 12 {
			t.Fatalf("error types %v, want >= 12 client_cancelled", et)
		}
		if st := r.status("bad"); st.State != "ready" {
			t.Errorf("after %d cancelled requests: %+v, want ready", r.attempts("bad"), st)
		}
	})
}

// TestOutlierSuccessResets: a success between failures ends the streak.
func TestOutlierSuccessResets(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, nil)
	n := r.gw.fleet.OutlierConfig().Consecutive5xx
	bad := r.sims["bad"]
	_ = bad.SetFault("status=500")
	r.sendUntil("bad", n-1, r.chat)
	_ = bad.SetFault("")
	r.sendUntil("bad", n, r.chat) // one success
	_ = bad.SetFault("status=500")
	r.sendUntil("bad", 2*n-1, r.chat)
	if s := r.state("bad"); s != "ready" {
		t.Fatalf("after %d failures, a success and %d failures: %s, want ready", n-1, n-1, s)
	}
	r.sendUntil("bad", 2*n, r.chat)
	if s := r.state("bad"); s != "ejected" {
		t.Errorf("after a full streak: %s, want ejected", s)
	}
	r.waitIdle()
}

// TestOutlierReturnAfterTimeAndProbe: an ejected engine returns only once
// its ejection time has passed and a probe passes: a probe passing before
// then changes nothing; the timer at the end probes at once; a failing
// probe then keeps it out (and unhealthy) until a later probe passes.
func TestOutlierReturnAfterTimeAndProbe(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, nil)
	bad := r.sims["bad"]
	_ = bad.SetFault("status=500")
	r.sendUntil("bad", 5, r.chat)
	if s := r.state("bad"); s != "ejected" {
		t.Fatalf("state %s, want ejected", s)
	}
	_ = bad.SetFault("")
	r.gw.fleet.ProbeNow(context.Background())
	if s := r.state("bad"); s != "ejected" {
		t.Fatalf("a passing probe before the ejection time: %s, want ejected", s)
	}
	r.clk.Advance(29 * time.Second)
	if s := r.state("bad"); s != "ejected" {
		t.Fatalf("at 29s of 30s: %s, want ejected", s)
	}
	bad.SetHealthy(false)
	r.clk.Advance(time.Second) // the timer fires: its probe fails
	st := r.status("bad")
	if st.State != "unhealthy" || st.Routable || st.EjectedUntil == nil {
		t.Fatalf("after a failed return probe: %+v, want unhealthy, still ejected", st)
	}
	if code, eng := r.send(r.chat); code != 200 || eng != "good" {
		t.Fatalf("while bad is out: %d from %q", code, eng)
	}
	bad.SetHealthy(true)
	r.gw.fleet.ProbeNow(context.Background())
	st = r.status("bad")
	if st.State != "ready" || !st.Routable || st.EjectedUntil != nil || st.Ejections != 1 {
		t.Fatalf("after a passing probe past the ejection time: %+v, want ready", st)
	}
	seen := map[string]int{}
	for range 6 {
		_, eng := r.send(r.chat)
		seen[eng]++
	}
	if seen["bad"] == 0 {
		t.Errorf("the returned engine got no traffic: %v", seen)
	}

	// The timer alone brings it back when its probe passes.
	_ = bad.SetFault("status=500")
	r.sendUntil("bad", r.attempts("bad")+5, r.chat)
	st = r.status("bad")
	if st.State != "ejected" || st.Ejections != 2 {
		t.Fatalf("second ejection: %+v", st)
	}
	_ = bad.SetFault("")
	r.clk.Advance(st.EjectedUntil.Sub(r.clk.Now()))
	if s := r.state("bad"); s != "ready" {
		t.Errorf("after the second ejection's time and the timer's probe: %s, want ready", s)
	}
	if n := r.clk.Pending(); n != 0 {
		t.Errorf("%d timers still armed", n)
	}
	r.waitIdle()
}

// TestOutlierBackoff: each ejection lasts base × its number, capped at
// max_ejection_time; time healthy forgives earlier ones.
func TestOutlierBackoff(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, func(c *Config) {
		c.Outlier.Consecutive5xx = 2
		c.Outlier.BaseEjectionTime = 10 * time.Second
		c.Outlier.MaxEjectionTime = 25 * time.Second
	})
	bad := r.sims["bad"]
	_ = bad.SetFault("status=500")
	for i, want := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second} {
		r.sendUntil("bad", r.attempts("bad")+2, r.chat)
		st := r.status("bad")
		if st.State != "ejected" || st.EjectedUntil == nil {
			t.Fatalf("ejection %d: %+v", i+1, st)
		}
		if got := st.EjectedUntil.Sub(r.clk.Now()); got != want {
			t.Errorf("ejection %d lasts %s, want %s", i+1, got, want)
		}
		r.clk.Advance(want) // the timer's probe passes (/health is fine)
		if s := r.state("bad"); s != "ready" {
			t.Fatalf("after ejection %d: %s, want ready", i+1, s)
		}
	}
	// Healthy for 2 base times: the multiplier (3, capped) drops by 2, so
	// the next ejection is the second: 20 s.
	r.clk.Advance(20 * time.Second)
	r.sendUntil("bad", r.attempts("bad")+2, r.chat)
	if st := r.status("bad"); st.EjectedUntil == nil || st.EjectedUntil.Sub(r.clk.Now()) != 20*time.Second || st.Ejections != 2 {
		t.Errorf("after 20s healthy: %+v, want the second ejection (20s)", st)
	}
	r.waitIdle()
}

// TestOutlierMaxEjectionPercent: never more than max_ejection_percent of a
// model's engines are ejected at once, the only engine of a model is never
// ejected, and even at 100% a model keeps its last ready engine.
func TestOutlierMaxEjectionPercent(t *testing.T) {
	t.Run("3 of 4 failing at 50%", func(t *testing.T) {
		r := newOutlierRig(t, []string{"b1", "b2", "b3", "good"}, nil)
		for _, n := range []string{"b1", "b2", "b3"} {
			_ = r.sims[n].SetFault("status=500")
		}
		for range 120 {
			r.send(r.chat)
		}
		ejected := 0
		for _, n := range []string{"b1", "b2", "b3"} {
			if r.state(n) == "ejected" {
				ejected++
			}
		}
		if ejected != 2 {
			t.Errorf("%d of 4 engines ejected, want 2 (50%%)", ejected)
		}
		if s := r.state("good"); s != "ready" {
			t.Errorf("good is %s", s)
		}
		r.waitIdle()
	})
	t.Run("one engine", func(t *testing.T) {
		r := newOutlierRig(t, []string{"only"}, nil)
		_ = r.sims["only"].SetFault("status=500")
		for range 30 {
			if code, _ := r.send(r.chat); code != 500 {
				t.Fatalf("status %d, want the engine's 500", code)
			}
		}
		if s := r.state("only"); s != "ready" {
			t.Errorf("the only engine of its model is %s, want ready", s)
		}
		r.waitIdle()
	})
	t.Run("100% keeps the last ready engine", func(t *testing.T) {
		// 100% lifts the cap, not the rule that a model keeps a ready
		// engine (TestOutlierKeepsLastReadyEngine): of three engines all
		// failing, two are ejected (50% would allow one) and the third
		// keeps answering, with its own 500s rather than a 503.
		names := []string{"b1", "b2", "b3"}
		r := newOutlierRig(t, names, func(c *Config) { c.Outlier.MaxEjectionPercent = 100 })
		for _, n := range names {
			_ = r.sims[n].SetFault("status=500")
		}
		for range 60 {
			r.send(r.chat)
		}
		var ejected, ready []string
		for _, n := range names {
			switch r.state(n) {
			case "ejected":
				ejected = append(ejected, n)
			case "ready":
				ready = append(ready, n)
			}
		}
		if len(ejected) != 2 || len(ready) != 1 {
			t.Fatalf("ejected %v, ready %v: want 2 ejected and the last one ready", ejected, ready)
		}
		for range 10 {
			if code, eng := r.send(r.chat); code != 500 || eng != ready[0] {
				t.Fatalf("%d from %q, want %s's own 500", code, eng, ready[0])
			}
		}
		if s := r.state(ready[0]); s != "ready" {
			t.Errorf("the last ready engine is %s", s)
		}
		r.waitIdle()
	})
}

// TestOutlierDisabled: with outlier detection off nothing is ejected, and
// turning it off at run time returns an ejected engine at once.
func TestOutlierDisabled(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, func(c *Config) { c.Outlier.Enabled = false })
	_ = r.sims["bad"].SetFault("status=500")
	for range 40 {
		r.send(r.chat)
	}
	if s := r.state("bad"); s != "ready" {
		t.Fatalf("disabled: %s, want ready", s)
	}
	c := r.gw.fleet.OutlierConfig()
	c.Enabled = true
	r.gw.fleet.SetOutlier(c)
	r.sendUntil("bad", r.attempts("bad")+5, r.chat)
	if s := r.state("bad"); s != "ejected" {
		t.Fatalf("enabled at run time: %s, want ejected", s)
	}
	c.Enabled = false
	r.gw.fleet.SetOutlier(c)
	if st := r.status("bad"); st.State != "ready" || !st.Routable {
		t.Errorf("disabled at run time: %+v, want ready at once", st)
	}
	if n := r.clk.Pending(); n != 0 {
		t.Errorf("%d return timers still armed", n)
	}
	r.waitIdle()
}

// TestOutlierAdminEngines: GET /admin/engines shows an ejected engine with
// state ejected, ejected_until and ejections.
func TestOutlierAdminEngines(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, nil)
	_ = r.sims["bad"].SetFault("status=503")
	r.sendUntil("bad", 5, r.chat)
	admin := httptest.NewServer(r.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)
	resp, err := admin.Client().Get(admin.URL + "/admin/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Engines []map[string]any `json:"engines"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	byName := map[string]map[string]any{}
	for _, e := range body.Engines {
		byName[e["name"].(string)] = e
	}
	b := byName["bad"]
	until, _ := time.Parse(time.RFC3339Nano, asString(b["ejected_until"]))
	if b["state"] != "ejected" || b["routable"] != false || b["ejections"] != float64(1) || !until.Equal(r.clk.Now().Add(30*time.Second)) {
		t.Errorf("/admin/engines bad: %v", b)
	}
	g := byName["good"]
	if _, ok := g["ejected_until"]; ok || g["state"] != "ready" || g["ejections"] != float64(0) {
		t.Errorf("/admin/engines good: %v", g)
	}
	r.waitIdle()
}

func asString(v any) string { s, _ := v.(string); return s }

// TestOutlierFlappingNeverNegative: an engine failing and recovering over
// and over, ejected and returned many times while streams are in flight on
// it and on the other engine, never drives an in-flight gauge below 0,
// always reports exactly one state per engine, and leaves every gauge at
// exactly 0.
func TestOutlierFlappingNeverNegative(t *testing.T) {
	r := newOutlierRig(t, []string{"flappy", "steady"}, func(c *Config) {
		c.Outlier.Consecutive5xx = 2
		c.Outlier.BaseEjectionTime = time.Second
		c.Outlier.MaxEjectionTime = 3 * time.Second
	})
	ctx, stop := context.WithCancel(context.Background())
	var watch sync.WaitGroup
	var problems []string
	var pmu sync.Mutex
	problem := func(s string) {
		pmu.Lock()
		if len(problems) < 10 {
			problems = append(problems, s)
		}
		pmu.Unlock()
	}
	watch.Go(func() {
		for ctx.Err() == nil {
			rm := r.collect()
			for k, v := range gaugesOf(rm) {
				if v < 0 {
					problem(k + " below 0")
				}
			}
			if m, ok := findMetric(rm, telemetry.EngineStateName); ok {
				ones := map[string]int{}
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					e, _ := dp.Attributes.Value(telemetry.AttrEngine)
					if dp.Value != 0 && dp.Value != 1 {
						problem("state gauge value out of {0,1}")
					}
					ones[e.AsString()] += int(dp.Value)
				}
				for e, n := range ones {
					if n != 1 {
						problem(e + ": not exactly one state at 1")
					}
				}
			}
		}
	})
	var load sync.WaitGroup
	for range 6 {
		load.Go(func() {
			for ctx.Err() == nil {
				resp, err := r.client.Post(r.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(r.streams))
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	flappy := r.sims["flappy"]
	tracker := r.gw.fleet.Engine("flappy").Endpoint().Outlier()
	total := func() uint64 { oc := r.gw.fleet.OutlierConfig(); return tracker.Status(&oc, r.clk.Now()).Total }
	for round := 0; total() < 8 && round < 400; round++ {
		switch round % 4 {
		case 0:
			_ = flappy.SetFault("close-after=1")
		case 1:
			_ = flappy.SetFault("status=502")
		case 2:
			_ = flappy.SetFault("")
		case 3:
			r.clk.Advance(time.Second)
			r.gw.fleet.ProbeNow(context.Background())
		}
		for range 4 {
			r.send(r.streams)
		}
		if !slices.Contains([]string{"ready", "ejected"}, r.state("flappy")) {
			t.Fatalf("flappy is %s", r.state("flappy"))
		}
	}
	stop()
	load.Wait()
	watch.Wait()
	if n := total(); n < 3 {
		t.Errorf("flappy was ejected %d times, want a flapping engine", n)
	}
	pmu.Lock()
	for _, p := range problems {
		t.Error(p)
	}
	pmu.Unlock()
	r.waitIdle()
	for e, s := range r.engineStates() {
		if !slices.Contains(telemetry.EngineStates[:], s) {
			t.Errorf("%s in state %q", e, s)
		}
	}
}

// TestOutcomeOf: the classification of an attempt's end.
func TestOutcomeOf(t *testing.T) {
	for _, tc := range []struct {
		status  int
		errType string
		want    routing.Outcome
	}{
		{200, "", routing.OutcomeSuccess},
		{404, "", routing.OutcomeSuccess}, // a sticky route's 404 is no error
		{500, "500", routing.OutcomeServerError},
		{503, "503", routing.OutcomeServerError},
		{599, "599", routing.OutcomeServerError},
		{200, ErrTypeEngineDisconnect, routing.OutcomeServerError},
		{0, ErrTypeEngineDisconnect, routing.OutcomeServerError},
		{200, ErrTypeStreamError, routing.OutcomeServerError},
		{0, ErrTypeConnect, routing.OutcomeConnectFailure},
		{0, ErrTypeHeaderTimeout, routing.OutcomeTimeout},
		{200, ErrTypeFirstToken, routing.OutcomeTimeout},
		{200, ErrTypeIdleTimeout, routing.OutcomeTimeout},
		{0, ErrTypeAttemptTimeout, routing.OutcomeTimeout},
		{429, "429", routing.OutcomeNeutral},
		{400, "400", routing.OutcomeNeutral},
		{404, "404", routing.OutcomeNeutral},
		{200, ErrTypeClientCancelled, routing.OutcomeNeutral},
		{503, ErrTypeClientCancelled, routing.OutcomeNeutral}, // the client left while the error was relayed
		{200, ErrTypeClientStalled, routing.OutcomeNeutral},
		{200, ErrTypeShutdown, routing.OutcomeNeutral},
		{0, ErrTypeRequestTimeout, routing.OutcomeNeutral},
		{0, ErrTypePanic, routing.OutcomeNeutral},
		{0, ErrTypeInternal, routing.OutcomeNeutral},
		{502, "503", routing.OutcomeNeutral}, // not the status it names
	} {
		if got := outcomeOf(tc.status, tc.errType); got != tc.want {
			t.Errorf("outcomeOf(%d, %q) = %v, want %v", tc.status, tc.errType, got, tc.want)
		}
	}
}

// TestSetOutlierConfigValidate: server.outlier errors name their key and
// wrap ErrInvalidConfig.
func TestSetOutlierConfigValidate(t *testing.T) {
	cfg := testConfig(fleet.EngineConfig{Name: "e", URL: "http://127.0.0.1:1", Models: []string{"m"}})
	cfg.Outlier.MaxEjectionPercent = 150
	cfg.Outlier.BaseEjectionTime = 0
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, routing.ErrInvalidOutlierConfig) ||
		!strings.Contains(err.Error(), "server.outlier.max_ejection_percent") || !strings.Contains(err.Error(), "server.outlier.base_ejection_time") {
		t.Errorf("Validate() = %v", err)
	}
}

// TestOutlierLightRoutesDoNotCount: attempts on light routes (tokenize
// here; also sticky lookups, model retrieval, count_tokens) say nothing
// about the engine's health for generation, so they count for nothing:
// their successes do not end a streak (an engine failing every generation
// between tokenize calls is still ejected) and their failures do not make
// one.
func TestOutlierLightRoutesDoNotCount(t *testing.T) {
	const tokenize = `{"model":"m","prompt":"hello there"}`
	t.Run("successes do not end a streak", func(t *testing.T) {
		r := newOutlierRig(t, []string{"bad", "good"}, nil)
		_ = r.sims["bad"].SetFault("status=500")
		n := r.gw.fleet.OutlierConfig().Consecutive5xx
		for i := 1; i <= n; i++ {
			r.sendUntil("bad", r.attempts("bad")+1, r.chat) // one more generation failure
			if i == n {
				break
			}
			// Then one tokenize call the engine answers (a per-request
			// fault spec without status overrides its default 500).
			for j, want := 0, r.attempts("bad")+1; r.attempts("bad") < want; j++ {
				if j > 20 {
					t.Fatal("tokenize never reached bad")
				}
				resp := r.post("/tokenize", tokenize, enginesim.FaultHeader, "powered-by")
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if eng := resp.Header.Get("X-Switchboard-Engine"); eng == "bad" && resp.StatusCode != 200 {
					t.Fatalf("tokenize on bad: %d, want 200", resp.StatusCode)
				}
			}
		}
		if st := r.status("bad"); st.State != "ejected" {
			t.Errorf("after %d generation failures, each but the last followed by a tokenize success: %+v, want ejected", n, st)
		}
		r.waitIdle()
	})
	t.Run("failures do not count", func(t *testing.T) {
		r := newOutlierRig(t, []string{"bad", "good"}, nil)
		_ = r.sims["bad"].SetFault("status=500")
		for range 40 {
			resp := r.post("/tokenize", tokenize)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if a := r.attempts("bad"); a < 10 {
			t.Fatalf("bad ended %d tokenize attempts, want many", a)
		}
		if st := r.status("bad"); st.State != "ready" || st.Ejections != 0 {
			t.Errorf("after %d tokenize 500s: %+v, want ready", r.attempts("bad"), st)
		}
		r.waitIdle()
	})
}

// TestOutlierKeepsLastReadyEngine: an engine is never ejected when that
// would leave one of its models without a ready engine, whatever
// max_ejection_percent allows (it counts every engine of the model,
// whatever its state): with e1 out of routing (drained through the admin
// API, or failing its probes), e2 failing every request stays in and the
// model keeps answering (the engine's own 500s), never 503. With e1 back,
// the next streak ejects e2.
func TestOutlierKeepsLastReadyEngine(t *testing.T) {
	admin := func(r *outlierRig, path string) {
		srv := httptest.NewServer(r.gw.AdminHandler(nil))
		defer srv.Close()
		resp, err := srv.Client().Post(srv.URL+path, "application/json", nil)
		if err != nil {
			r.t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			r.t.Fatalf("POST %s: %d", path, resp.StatusCode)
		}
	}
	for _, tc := range []struct {
		name      string
		out, back func(*outlierRig)
	}{
		{"drained", func(r *outlierRig) { admin(r, "/admin/engines/e1/drain") }, func(r *outlierRig) { admin(r, "/admin/engines/e1/resume") }},
		{"unhealthy", func(r *outlierRig) {
			r.sims["e1"].SetHealthy(false)
			r.gw.fleet.ProbeNow(context.Background())
		}, func(r *outlierRig) {
			r.sims["e1"].SetHealthy(true)
			r.gw.fleet.ProbeNow(context.Background())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newOutlierRig(t, []string{"e1", "e2"}, nil)
			tc.out(r)
			if s := r.state("e1"); s == "ready" {
				t.Fatalf("e1 is %s", s)
			}
			_ = r.sims["e2"].SetFault("status=500")
			n := r.gw.fleet.OutlierConfig().Consecutive5xx
			for i := range 6 * n {
				if code, eng := r.send(r.chat); code != 500 || eng != "e2" {
					t.Fatalf("request %d: %d from %q, want e2's 500 (the model's last ready engine stays in)", i, code, eng)
				}
			}
			if st := r.status("e2"); st.State != "ready" || st.Ejections != 0 {
				t.Fatalf("after %d failures as the last ready engine: %+v, want ready", 6*n, st)
			}
			if got := r.logs.count("engine not ejected"); got != 1 {
				t.Errorf("%d refusals logged, want 1", got)
			}
			tc.back(r)
			r.sendUntil("e2", r.attempts("e2")+n, r.chat)
			if st := r.status("e2"); st.State != "ejected" {
				t.Fatalf("with e1 back, after a streak: %+v, want ejected", st)
			}
			if code, eng := r.send(r.chat); code != 200 || eng != "e1" {
				t.Errorf("after e2's ejection: %d from %q, want 200 from e1", code, eng)
			}
			r.waitIdle()
		})
	}
}

// TestOutlierRefusedEjectionLogsOnce: an ejection refused streak after
// streak (the only engine of its model answering 500s; at 1k QPS that is a
// streak every 5 ms) is logged once per base_ejection_time per engine, not
// once per streak.
func TestOutlierRefusedEjectionLogsOnce(t *testing.T) {
	r := newOutlierRig(t, []string{"only"}, nil)
	_ = r.sims["only"].SetFault("status=500")
	c := r.gw.fleet.OutlierConfig()
	streaks := func(k int) {
		for range k * c.Consecutive5xx {
			if code, _ := r.send(r.chat); code != 500 {
				t.Fatalf("status %d, want the engine's 500", code)
			}
		}
	}
	streaks(10)
	if got := r.logs.count("engine not ejected"); got != 1 {
		t.Fatalf("10 refused streaks logged %d times, want once", got)
	}
	r.clk.Advance(c.BaseEjectionTime - time.Second)
	streaks(3)
	if got := r.logs.count("engine not ejected"); got != 1 {
		t.Fatalf("within base_ejection_time: %d lines, want still 1", got)
	}
	r.clk.Advance(time.Second)
	streaks(3)
	if got := r.logs.count("engine not ejected"); got != 2 {
		t.Errorf("a base_ejection_time later: %d lines, want 2", got)
	}
	if s := r.state("only"); s != "ready" {
		t.Errorf("the only engine is %s", s)
	}
	r.waitIdle()
}
