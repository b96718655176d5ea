package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// gatedEngine is a fake engine whose streams send one content event and
// then wait until release is closed (or their request is cancelled), so a
// test holds a request in flight for exactly as long as it needs. A stream
// whose request sets max_tokens (servedBy's non-streaming requests, which
// the gateway observes as streams) is not held.
type gatedEngine struct {
	srv     *httptest.Server
	release chan struct{}
	started chan struct{} // one value per stream that sent its first content
	served  atomic.Int64  // chat requests received
}

func newGated(t testing.TB) *gatedEngine {
	t.Helper()
	g := &gatedEngine{release: make(chan struct{}), started: make(chan struct{}, 16)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		g.served.Add(1)
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		ev := func(data string) {
			_, _ = io.WriteString(w, "data: "+data+"\n\n")
			_ = http.NewResponseController(w).Flush()
		}
		ev(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}]}`)
		if !strings.Contains(string(body), `"max_tokens"`) {
			g.started <- struct{}{}
			select {
			case <-g.release:
			case <-r.Context().Done():
				return
			}
		}
		ev(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}`)
		ev(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
		ev("[DONE]")
	})
	g.srv = enginetest.Serve(t, mux)
	t.Cleanup(g.open)
	return g
}

// open lets every held stream (and every later one) finish.
func (g *gatedEngine) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

// waitStarted waits for one stream to have sent its first content.
func (g *gatedEngine) waitStarted(t testing.TB) {
	t.Helper()
	select {
	case <-g.started:
	case <-time.After(5 * time.Second):
		t.Fatal("the held stream did not start")
	}
}

// heldStream starts a stream on the gateway and returns a function that
// reads it to its end and reports whether it completed with [DONE].
func (h *harness) heldStream() func() error {
	h.t.Helper()
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		h.t.Fatalf("stream: status %d: %s", resp.StatusCode, b)
	}
	return func() error {
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && (!strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Contains(string(b), `"error"`)) {
			err = fmt.Errorf("stream did not complete cleanly: %q", tail(string(b)))
		}
		return err
	}
}

// servedBy sends n non-streaming chat requests and counts them by the
// engine that served them (X-Switchboard-Engine); any status but 200 fails
// the test.
func (h *harness) servedBy(n int, model string) map[string]int {
	h.t.Helper()
	out := map[string]int{}
	for range n {
		resp := h.post("/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"x"}],"max_tokens":2}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			h.t.Fatalf("request for %s: status %d: %s", model, resp.StatusCode, b)
		}
		out[resp.Header.Get("X-Switchboard-Engine")]++
	}
	return out
}

// policy returns the running policy (to reload with it unchanged).
func (h *harness) policy() routing.Policy { return h.gw.set.Load().policy }

// reload calls Reload and fails the test on an error.
func (h *harness) reload(cfg Config, p routing.Policy) ReloadReport {
	h.t.Helper()
	rep, err := h.gw.Reload(cfg, p)
	if err != nil {
		h.t.Fatalf("Reload: %v", err)
	}
	return rep
}

// points returns the data points of the int64 sum or gauge name whose
// attributes include every kv in match.
func (h *harness) points(name string, match ...attribute.KeyValue) []metricdata.DataPoint[int64] {
	h.t.Helper()
	m, ok := findMetric(h.collect(), name)
	if !ok {
		return nil
	}
	var dps []metricdata.DataPoint[int64]
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		dps = d.DataPoints
	case metricdata.Gauge[int64]:
		dps = d.DataPoints
	}
	var out []metricdata.DataPoint[int64]
	for _, dp := range dps {
		if hasAll(dp.Attributes, match) {
			out = append(out, dp)
		}
	}
	return out
}

func statusByName(p *fleet.Fleet) map[string][]fleet.EngineStatus {
	out := map[string][]fleet.EngineStatus{}
	for _, s := range p.Status() {
		out[s.Name] = append(out[s.Name], s)
	}
	return out
}

func portOf(t testing.TB, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

// TestReloadAddEngine: an engine added by a reload, with its models left to
// discovery, is probed by the reload itself and takes its share of the
// traffic at once, without waiting for the next health round.
func TestReloadAddEngine(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1)) // health interval 1 h: no round will come
	if got := h.servedBy(2, "m"); got["e1"] != 2 {
		t.Fatalf("before the reload: %v", got)
	}
	rep := h.reload(testConfig(e1, fleet.EngineConfig{Name: "e2", URL: s2.URL}), h.policy())
	if !slices.Equal(rep.Added, []string{"e2"}) || rep.Removed != nil || rep.Changed != nil || rep.PolicyChanged || rep.Settings != nil || rep.Restart != nil || !rep.Applied() {
		t.Fatalf("report = %+v, want e2 added and nothing else", rep)
	}
	st := statusByName(h.gw.Fleet())["e2"]
	if len(st) != 1 || !st[0].Healthy || !st[0].Routable || !slices.Equal(st[0].Models, []string{"m"}) || st[0].Static {
		t.Fatalf("e2 after the reload: %+v, want healthy, routable, models [m] discovered", st)
	}
	if got := h.servedBy(4, "m"); got["e1"] != 2 || got["e2"] != 2 {
		t.Errorf("round-robin after the reload: %v, want e1:2 e2:2", got)
	}
	if st := h.engineStates(); st["e1"] != "ready" || st["e2"] != "ready" {
		t.Errorf("engine states %v, want both ready", st)
	}
	h.waitIdle()
}

// TestReloadAddEngineDown: an engine added while it is down enters the
// pool unhealthy (its probe ran in the reload) and gets no request.
func TestReloadAddEngineDown(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	down, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	down.SetHealthy(false)
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	h.reload(testConfig(e1, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}}), h.policy())
	if st := statusByName(h.gw.Fleet())["e2"]; len(st) != 1 || st[0].Healthy || st[0].LastError == "" {
		t.Fatalf("e2 (down) after the reload: %+v, want unhealthy with its probe error", st)
	}
	if got := h.servedBy(4, "m"); got["e1"] != 4 {
		t.Errorf("served %v, want every request on e1", got)
	}
	if n := down.Stats().Received; n != 0 {
		t.Errorf("the engine that is down received %d requests", n)
	}
}

// TestReloadRemoveDrains: an engine removed by a reload gets no new
// request; its stream in flight completes, and releases its slot into its
// own incarnation: re-added under the same name meanwhile, the new
// incarnation's counters are untouched, the gauge is reported once per
// name and phase (both incarnations summed) and ends at exactly 0.
func TestReloadRemoveDrains(t *testing.T) {
	g := newGated(t)
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := fleet.EngineConfig{Name: "e1", URL: g.srv.URL, Models: []string{"m"}}
	e2 := fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	finish := h.heldStream()
	g.waitStarted(t)

	rep := h.reload(testConfig(e2), h.policy())
	if !slices.Equal(rep.Added, []string{"e2"}) || !slices.Equal(rep.Removed, []string{"e1"}) || rep.Changed != nil {
		t.Fatalf("report = %+v, want e2 added, e1 removed", rep)
	}
	if got := h.servedBy(3, "m"); got["e2"] != 3 {
		t.Errorf("after removing e1: served %v, want all on e2", got)
	}
	if n := g.served.Load(); n != 1 {
		t.Errorf("removed engine received %d requests, want only the held one", n)
	}
	if g := h.gauges()["e1/decode"]; g != 1 {
		t.Errorf("removed e1's decode gauge = %d while its stream runs, want 1", g)
	}
	if st := h.engineStates(); st["e1"] != "draining" {
		t.Errorf("e1 state %q while its stream runs, want draining", st["e1"])
	}

	// Back under the same name, same URL: a new incarnation.
	rep = h.reload(testConfig(e1, e2), h.policy())
	if !slices.Equal(rep.Added, []string{"e1"}) {
		t.Fatalf("report = %+v, want e1 added", rep)
	}
	st := statusByName(h.gw.Fleet())["e1"]
	if len(st) != 2 || st[0].Retired || st[0].Decode != 0 || !st[1].Retired || st[1].Decode != 1 {
		t.Fatalf("e1 status %+v, want a new incarnation at 0 and the retired one with the stream", st)
	}
	if dps := h.points(telemetry.ActiveRequestsName, telemetry.AttrEngine.String("e1"), telemetry.AttrPhase.String("decode")); len(dps) != 1 || dps[0].Value != 1 {
		t.Errorf("e1 decode data points %+v, want one, at 1 (both incarnations summed)", dps)
	}
	if dps := h.points(telemetry.EngineStateName, telemetry.AttrEngine.String("e1"), telemetry.AttrState.String("ready")); len(dps) != 1 || dps[0].Value != 1 {
		t.Errorf("e1 ready state points %+v, want one, at 1 (the engine in the pool, not the draining one)", dps)
	}

	g.open()
	if err := finish(); err != nil {
		t.Fatalf("the removed engine's stream: %v", err)
	}
	h.waitIdle()
	st = statusByName(h.gw.Fleet())["e1"]
	if len(st) != 1 || st[0].Retired || st[0].Prefill != 0 || st[0].Decode != 0 {
		t.Errorf("e1 after the drain: %+v, want only the new incarnation, at 0", st)
	}
	if n := len(statusByName(h.gw.Fleet())); n != 2 {
		t.Errorf("%d engine names after the drain, want 2", n)
	}
}

// TestReloadChangedURL: an engine whose URL changes moves its new requests
// to the new URL while its old incarnation drains; the metrics and spans
// of the new requests carry the new server.port, those of the old stream
// the old one, and the gauge is reported once.
func TestReloadChangedURL(t *testing.T) {
	g := newGated(t)
	b, sB := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: g.srv.URL, Models: []string{"m"}}))
	oldPort, newPort := portOf(t, g.srv.URL), portOf(t, sB.URL)
	finish := h.heldStream()
	g.waitStarted(t)

	rep := h.reload(testConfig(fleet.EngineConfig{Name: "e1", URL: sB.URL, Models: []string{"m"}}), h.policy())
	if !slices.Equal(rep.Changed, []string{"e1"}) || rep.Added != nil || rep.Removed != nil {
		t.Fatalf("report = %+v, want e1 changed", rep)
	}
	if got := h.servedBy(3, "m"); got["e1"] != 3 {
		t.Fatalf("served %v", got)
	}
	if n := b.Stats().Received; n != 3 {
		t.Errorf("new URL received %d requests, want 3", n)
	}
	if n := g.served.Load(); n != 1 {
		t.Errorf("old URL received %d requests, want only the held stream", n)
	}
	if dps := h.points(telemetry.ActiveRequestsName, telemetry.AttrEngine.String("e1"), telemetry.AttrPhase.String("decode")); len(dps) != 1 || dps[0].Value != 1 {
		t.Errorf("e1 decode points %+v, want one at 1 (the old incarnation's stream)", dps)
	}
	if st := h.engineStates(); st["e1"] != "ready" {
		t.Errorf("e1 state %q, want ready", st["e1"])
	}
	g.open()
	if err := finish(); err != nil {
		t.Fatalf("the old incarnation's stream: %v", err)
	}
	h.waitIdle()

	count := func(port int) uint64 {
		return h.histCount(telemetry.GenAIClientOperationDurationName, telemetry.AttrServerPort.Int(port))
	}
	if n := count(newPort); n != 3 {
		t.Errorf("%s with server.port %d (new URL): %d, want 3", telemetry.GenAIClientOperationDurationName, newPort, n)
	}
	if n := count(oldPort); n != 1 {
		t.Errorf("%s with server.port %d (old URL): %d, want 1 (the stream that drained)", telemetry.GenAIClientOperationDurationName, oldPort, n)
	}
	ports := map[int64]int{}
	for _, s := range h.spans.Ended() {
		if s.SpanKind() != trace.SpanKindClient {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == telemetry.AttrServerPort {
				ports[kv.Value.AsInt64()]++
			}
		}
	}
	if ports[int64(newPort)] != 3 || ports[int64(oldPort)] != 1 {
		t.Errorf("engine spans by server.port: %v, want %d:3 and %d:1", ports, newPort, oldPort)
	}
}

// TestReloadRejected: a config that fails validation, or whose engine
// cannot be built (its key variable unset), is rejected whole: no engine
// added, no setting changed, the old configuration still serving.
func TestReloadRejected(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	before := h.gw.set.Load()
	for _, tt := range []struct {
		name string
		mut  func(*Config)
	}{
		{"bad engine URL", func(c *Config) { c.Engines = append(c.Engines, fleet.EngineConfig{Name: "e2", URL: "ftp://x"}) }},
		{"duplicate engine", func(c *Config) { c.Engines = append(c.Engines, e1) }},
		{"negative timeout beside a good engine", func(c *Config) {
			c.Engines = append(c.Engines, fleet.EngineConfig{Name: "e2", URL: s2.URL})
			c.Timeouts.Idle = -time.Second
		}},
		{"key variable unset", func(c *Config) {
			c.Engines = append(c.Engines, fleet.EngineConfig{Name: "e2", URL: s2.URL, APIKeyEnv: "SWITCHBOARD_TEST_RELOAD_UNSET_KEY"})
			c.MaxAttempts = 5
		}},
		{"no engines", func(c *Config) { c.Engines = nil }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(e1)
			tt.mut(&cfg)
			rep, err := h.gw.Reload(cfg, routing.NewLeastLoaded(2))
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Reload = %v, want ErrInvalidConfig", err)
			}
			if rep.Applied() || rep.Restart != nil {
				t.Errorf("report %+v for a rejected config, want empty", rep)
			}
			if h.gw.set.Load() != before {
				t.Error("settings snapshot replaced by a rejected config")
			}
			if st := h.gw.Fleet().Status(); len(st) != 1 || st[0].Name != "e1" || st[0].Retired {
				t.Errorf("pool after a rejected config: %+v, want e1 alone", st)
			}
			if got := h.servedBy(2, "m"); got["e1"] != 2 {
				t.Errorf("served %v after a rejected config, want e1", got)
			}
		})
	}
	if _, err := h.gw.Reload(testConfig(e1), nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Reload with a nil policy = %v, want ErrInvalidConfig", err)
	}
	if h.gw.set.Load() != before {
		t.Error("settings replaced by a nil-policy reload")
	}
}

// lastPick is a policy that always picks the last candidate.
type lastPick struct{}

func (lastPick) Pick(_ context.Context, _ *routing.Request, c []*routing.Endpoint) (*routing.Endpoint, error) {
	if len(c) == 0 {
		return nil, routing.ErrNoEndpoint
	}
	return c[len(c)-1], nil
}

// TestReloadPolicySwitch: a new policy takes the requests after the reload;
// the same policy again changes nothing.
func TestReloadPolicySwitch(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
	h := newHarness(t, cfg)
	if got := h.servedBy(4, "m"); got["e1"] != 2 || got["e2"] != 2 {
		t.Fatalf("round-robin: %v", got)
	}
	p := &lastPick{}
	rep := h.reload(cfg, p)
	if !rep.PolicyChanged || !rep.Applied() || rep.Added != nil || rep.Settings != nil {
		t.Fatalf("report = %+v, want the policy changed only", rep)
	}
	if got := h.servedBy(4, "m"); got["e2"] != 4 {
		t.Errorf("after the switch: %v, want every request on e2", got)
	}
	if rep := h.reload(cfg, p); rep.Applied() || rep.PolicyChanged {
		t.Errorf("the same config and policy again: %+v, want nothing applied", rep)
	}
	if rep := h.reload(cfg, lastPick{}); !rep.PolicyChanged {
		t.Errorf("a policy of a value type: %+v, want it counted as changed", rep)
	}
}

// TestReloadSettings: reloadable settings apply to the next requests and
// are listed; settings that need a restart keep their running values and
// are reported as such, on every reload until the restart.
func TestReloadSettings(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	running := h.gw.set.Load().cfg

	cfg := testConfig(e1)
	cfg.MaxAttempts = 3
	cfg.Timeouts.Idle = 7 * time.Second
	cfg.Models.Aliases = map[string]string{"public": "m"}
	cfg.EngineHeader = false
	cfg.Health.Interval = time.Minute
	cfg.Timeouts.Connect = 3 * time.Second
	cfg.TrustedProxies = []string{"10.0.0.0/8"}
	cfg.StripRequestHeaders = []string{} // empty equals the running nil
	cfg.Outlier.ConsecutiveTimeouts = 9
	cfg.Disaggregation.Enabled, cfg.Disaggregation.MinUncachedTokens = true, 64
	cfg.Migration.Limit = 2
	rep := h.reload(cfg, h.policy())
	wantSettings := []string{"server.max_attempts", "server.timeouts.idle", "server.outlier.consecutive_timeouts", "server.engine_header", "models.aliases", "migration", "disaggregation"}
	wantRestart := []string{"server.trusted_proxies", "server.timeouts.connect", "server.health.interval"}
	if !slices.Equal(rep.Settings, wantSettings) || !slices.Equal(rep.Restart, wantRestart) || !rep.Applied() {
		t.Fatalf("report = %+v, want settings %v and restart %v", rep, wantSettings, wantRestart)
	}
	set := h.gw.set.Load().cfg
	if set.MaxAttempts != 3 || set.Timeouts.Idle != 7*time.Second || set.Health.Interval != running.Health.Interval ||
		set.Timeouts.Connect != running.Timeouts.Connect || set.TrustedProxies != nil {
		t.Errorf("settings in force: %+v", set)
	}
	if d := set.Disaggregation; !d.Enabled || d.MinUncachedTokens != 64 || set.Migration.Limit != 2 {
		t.Errorf("disaggregation in force: %+v, migration.limit %d", d, set.Migration.Limit)
	}
	if c := h.gw.fleet.OutlierConfig(); c.ConsecutiveTimeouts != 9 {
		t.Errorf("outlier detection in force: %+v, want consecutive_timeouts 9", c)
	}
	resp := h.post("/v1/chat/completions", `{"model":"public","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Switchboard-Engine") != "" {
		t.Errorf("request for the new alias: %d, engine header %q; want 200 without the header", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
	}
	_, _, body := h.do(http.MethodGet, "/v1/models", "")
	if !strings.Contains(string(body), `"id":"public"`) {
		t.Errorf("/v1/models does not list the new alias: %s", body)
	}

	again := h.reload(cfg, h.policy())
	if again.Applied() || !slices.Equal(again.Restart, wantRestart) {
		t.Errorf("the same config again: %+v, want nothing applied and the restart keys still reported", again)
	}
}

// TestReloadMaxConcurrentRequests: the admission limit follows a reload.
func TestReloadMaxConcurrentRequests(t *testing.T) {
	g := newGated(t)
	e1 := fleet.EngineConfig{Name: "e1", URL: g.srv.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	finish := h.heldStream()
	g.waitStarted(t)
	cfg := testConfig(e1)
	cfg.MaxConcurrentRequests = 1
	if rep := h.reload(cfg, h.policy()); !slices.Equal(rep.Settings, []string{"server.max_concurrent_requests"}) {
		t.Fatalf("report = %+v", rep)
	}
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a second request over the reloaded limit of 1: %d, want 503", resp.StatusCode)
	}
	g.open()
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	h.waitIdle()
}

// TestReloadConcurrentSafe: reloads that add, change and remove an engine
// (and change the one that stays in place: its max_in_flight) while
// requests flow never fail a request on the engine that stays, and every
// gauge ends at 0. Run with -race.
func TestReloadConcurrentSafe(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s3 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed, sent atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions",
					strings.NewReader(`{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"x"}]}`))
				resp, err := h.client.Do(req)
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
					failed.Add(1)
				}
			}
		})
	}
	policies := []routing.Policy{h.policy(), routing.NewLeastLoaded(2)}
	for i := range 30 {
		e1 := e1
		e1.MaxInFlight = 1000 * (i % 2) // changed in place under the requests
		var cfg Config
		switch i % 3 {
		case 0:
			cfg = testConfig(e1, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
		case 1:
			cfg = testConfig(e1, fleet.EngineConfig{Name: "e2", URL: s3.URL})
		case 2:
			cfg = testConfig(e1)
		}
		cfg.MaxAttempts = 1 + i%2
		h.reload(cfg, policies[i%2])
		_ = h.gauges()
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 || sent.Load() < 30 {
		t.Errorf("%d of %d requests failed during the reloads, want 0 of at least 30", n, sent.Load())
	}
	h.waitIdle()
	for _, st := range h.gw.Fleet().Status() {
		if st.Prefill != 0 || st.Decode != 0 || st.Retired {
			t.Errorf("after the load: %+v", st)
		}
	}
}

// TestPoolAddAfterRemoveNewURL: Pool.Add of a name removed a moment ago
// with another URL builds the new incarnation's own telemetry, so its
// metrics carry the new server.port, not the first incarnation's.
func TestPoolAddAfterRemoveNewURL(t *testing.T) {
	_, sA := sim(t, enginesim.Config{Models: []string{"m"}})
	_, sB := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: sA.URL, Models: []string{"m"}}))
	if got := h.servedBy(1, "m"); got["e1"] != 1 {
		t.Fatalf("served %v", got)
	}
	if !h.gw.Fleet().Remove("e1") {
		t.Fatal("e1 not removed")
	}
	if err := h.gw.Fleet().Add(fleet.EngineConfig{Name: "e1", URL: sB.URL, Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	if got := h.servedBy(2, "m"); got["e1"] != 2 {
		t.Fatalf("served %v", got)
	}
	h.waitIdle()
	count := func(url string) uint64 {
		return h.histCount(telemetry.GenAIClientOperationDurationName, telemetry.AttrServerPort.Int(portOf(t, url)))
	}
	if a, b := count(sA.URL), count(sB.URL); a != 1 || b != 2 {
		t.Errorf("operation.duration by server.port: old %d, new %d; want 1 and 2", a, b)
	}
}

// TestReloadInPlaceKeepsBreaker: a reload that changes only an engine's
// max_in_flight or its configured models keeps its incarnation, so the
// request it has in flight counts against the (new) limit and a second
// one is refused; the models are updated in place, and the same config
// again changes nothing.
func TestReloadInPlaceKeepsBreaker(t *testing.T) {
	for _, tt := range []struct {
		name         string
		before, next fleet.EngineConfig
	}{
		{"models changed", fleet.EngineConfig{MaxInFlight: 1, Models: []string{"m"}}, fleet.EngineConfig{MaxInFlight: 1, Models: []string{"m2", "m"}}},
		{"max_in_flight from none", fleet.EngineConfig{Models: []string{"m"}}, fleet.EngineConfig{MaxInFlight: 1, Models: []string{"m"}}},
		{"max_in_flight lowered", fleet.EngineConfig{MaxInFlight: 2, Models: []string{"m"}}, fleet.EngineConfig{MaxInFlight: 1, Models: []string{"m"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := newGated(t)
			before, next := tt.before, tt.next
			before.Name, before.URL = "e1", g.srv.URL
			next.Name, next.URL = "e1", g.srv.URL
			h := newHarness(t, testConfig(before))
			finish := h.heldStream()
			g.waitStarted(t)

			rep := h.reload(testConfig(next), h.policy())
			if !slices.Equal(rep.Changed, []string{"e1"}) || rep.Added != nil || rep.Removed != nil {
				t.Fatalf("report = %+v, want e1 changed", rep)
			}
			resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("a second request with one in flight and max_in_flight 1: %d, want 503", resp.StatusCode)
			}
			if n := g.served.Load(); n != 1 {
				t.Errorf("engine received %d requests, want only the held one", n)
			}
			st := statusByName(h.gw.Fleet())["e1"]
			want := slices.Compact(slices.Sorted(slices.Values(next.Models)))
			if len(st) != 1 || st[0].Retired || st[0].Prefill+st[0].Decode != 1 || st[0].MaxInFlight != 1 || !slices.Equal(st[0].Models, want) {
				t.Errorf("e1 after the reload: %+v, want one incarnation with its stream, max_in_flight 1, models %v", st, want)
			}
			if rep := h.reload(testConfig(next), h.policy()); rep.Applied() {
				t.Errorf("the same config again: %+v, want nothing applied", rep)
			}

			g.open()
			if err := finish(); err != nil {
				t.Fatal(err)
			}
			h.waitIdle()
			for _, m := range want {
				if got := h.servedBy(1, m); got["e1"] != 1 {
					t.Errorf("request for %s after the stream ended: served %v, want e1", m, got)
				}
			}
		})
	}
}

// TestReloadInPlaceKeepsEjection: an ejected engine whose max_in_flight
// changes stays ejected (its outlier state belongs to the incarnation the
// reload keeps); it does not come back at once.
func TestReloadInPlaceKeepsEjection(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, nil)
	_ = r.sims["bad"].SetFault("status=500")
	r.sendUntil("bad", 5, r.chat)
	if s := r.state("bad"); s != "ejected" {
		t.Fatalf("state %s, want ejected", s)
	}
	cfg := r.gw.set.Load().cfg
	cfg.Engines = slices.Clone(cfg.Engines)
	cfg.Engines[0].MaxInFlight = 10
	if rep := r.reload(cfg, r.policy()); !slices.Equal(rep.Changed, []string{"bad"}) {
		t.Fatalf("report = %+v, want bad changed", rep)
	}
	if st := r.status("bad"); st.State != "ejected" || st.EjectedUntil == nil || st.MaxInFlight != 10 {
		t.Errorf("bad after the reload: %+v, want still ejected, max_in_flight 10", st)
	}
	for range 4 {
		if _, engine := r.send(r.chat); engine != "good" {
			t.Errorf("a request went to %q, want good (bad is ejected)", engine)
		}
	}
	r.waitIdle()
}

// TestReloadKeepsAdminDrain: an engine drained through the admin API stays
// drained when a reload changes its models (the same incarnation) and when
// it changes its URL (a new incarnation, which takes the drain over): no
// request reaches it either way until it is resumed.
func TestReloadKeepsAdminDrain(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	moved, s3 := sim(t, enginesim.Config{Models: []string{"m"}})
	e2 := fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, e2))
	if _, ok := h.gw.Fleet().SetDrained("e1", true); !ok {
		t.Fatal("setDrained: e1 not found")
	}
	for _, step := range []struct {
		name string
		e1   fleet.EngineConfig
	}{
		{"models changed", fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m", "m2"}}},
		{"url changed", fleet.EngineConfig{Name: "e1", URL: s3.URL, Models: []string{"m", "m2"}}},
	} {
		if rep := h.reload(testConfig(step.e1, e2), h.policy()); !slices.Equal(rep.Changed, []string{"e1"}) {
			t.Fatalf("%s: report = %+v, want e1 changed", step.name, rep)
		}
		if st := h.status("e1"); !st.Drained || st.State != "draining" || st.Routable {
			t.Errorf("%s: e1 %+v, want still drained", step.name, st)
		}
		if got := h.servedBy(4, "m"); got["e2"] != 4 {
			t.Errorf("%s: served %v, want all on e2 (e1 drained)", step.name, got)
		}
	}
	if n := moved.Stats().Received; n != 0 {
		t.Errorf("e1's new URL received %d requests while drained", n)
	}
	if st, _ := h.gw.Fleet().SetDrained("e1", false); st.State != "ready" {
		t.Fatalf("resume: %+v", st)
	}
	if got := h.servedBy(4, "m"); got["e1"] != 2 || moved.Stats().Received != 2 {
		t.Errorf("after resume: served %v, new URL received %d; want e1 at its new URL back in rotation", got, moved.Stats().Received)
	}
	h.waitIdle()
}

// TestReloadInPlaceKeepsLoadedAdapter: a LoRA adapter loaded through the
// admin API on an engine with configured models is still routed to it
// after a reload that changes those models.
func TestReloadInPlaceKeepsLoadedAdapter(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"base", "other"}, OutputTokens: 2})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"base"}}))
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)
	resp, err := admin.Client().Post(admin.URL+"/admin/engines/e1/load_lora_adapter", "application/json", strings.NewReader(`{"lora_name":"sql","lora_path":"/adapters/sql"}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("load: %d", resp.StatusCode)
	}
	if rep := h.reload(testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"base", "other"}}), h.policy()); !slices.Equal(rep.Changed, []string{"e1"}) {
		t.Fatalf("report = %+v, want e1 changed", rep)
	}
	if st := h.status("e1"); !slices.Equal(st.Models, []string{"base", "other", "sql"}) {
		t.Errorf("e1 models %v, want base, other and the loaded sql", st.Models)
	}
	for _, m := range []string{"sql", "other"} {
		if got := h.servedBy(1, m); got["e1"] != 1 {
			t.Errorf("%s: served %v, want e1", m, got)
		}
	}
	h.waitIdle()
}
