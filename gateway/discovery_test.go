package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// TestSetDiscoveredCombinesWithStatic: a discovery source's engines join
// the configured ones and serve; a later batch without one retires it
// (its stream in flight completes on it), and a Reload of the configured
// engines keeps every discovered one.
func TestSetDiscoveredCombinesWithStatic(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	g := newGated(t)
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))

	d1 := fleet.EngineConfig{Name: "pod-a", URL: g.srv.URL} // models from /v1/models
	d2 := fleet.EngineConfig{Name: "pod-b", URL: s2.URL, Models: []string{"m"}}
	rep, err := h.gw.SetDiscovered("kubernetes", discovered(d1, d2))
	if err != nil || !slices.Equal(rep.Added, []string{"pod-a", "pod-b"}) || rep.Removed != nil || rep.Changed != nil {
		t.Fatalf("SetDiscovered = %+v, %v; want pod-a and pod-b added", rep, err)
	}
	if got := h.gw.Fleet().String(); !strings.Contains(got, "e1") || !strings.Contains(got, "pod-a") || !strings.Contains(got, "pod-b") {
		t.Fatalf("pool %s, want e1, pod-a, pod-b", got)
	}
	if got := h.servedBy(3, "m"); got["e1"] != 1 || got["pod-a"] != 1 || got["pod-b"] != 1 {
		t.Fatalf("round-robin over configured and discovered engines: %v, want one each", got)
	}

	// A stream on pod-a, then pod-a leaves (its endpoint turned terminating).
	var finish func() error
	for i := 0; finish == nil; i++ {
		if i == 3 {
			t.Fatal("no stream landed on pod-a in 3 round-robin requests")
		}
		finish = h.heldStreamOn("pod-a")
	}
	g.waitStarted(t)
	// pod-a turns unready (its endpoint terminating): it stays, draining,
	// its stream goes on, new requests go elsewhere.
	inc := h.gw.Fleet().Engine("pod-a")
	rep, err = h.gw.SetDiscovered("kubernetes", []fleet.DiscoveredEngine{{EngineConfig: d1, Unready: true}, {EngineConfig: d2}})
	if err != nil || rep.Added != nil || rep.Removed != nil || !slices.Equal(rep.Unready, []string{"pod-a"}) || rep.Ready != nil || !rep.Applied() {
		t.Fatalf("SetDiscovered with pod-a unready = %+v, %v; want pod-a unready", rep, err)
	}
	if st := statusByName(h.gw.Fleet())["pod-a"]; len(st) != 1 || st[0].State != "draining" || !st[0].Unready || st[0].Routable || st[0].Decode != 1 {
		t.Errorf("pod-a while unready with its stream: %+v, want one incarnation, draining, decode 1", st)
	}
	if got := h.servedBy(4, "m"); got["pod-a"] != 0 || got["e1"] != 2 || got["pod-b"] != 2 {
		t.Errorf("while pod-a is unready: %v, want e1:2 pod-b:2", got)
	}
	// Ready again: the same incarnation serves at once.
	rep, err = h.gw.SetDiscovered("kubernetes", discovered(d1, d2))
	if err != nil || !slices.Equal(rep.Ready, []string{"pod-a"}) || rep.Added != nil || rep.Changed != nil {
		t.Fatalf("SetDiscovered with pod-a ready again = %+v, %v", rep, err)
	}
	if h.gw.Fleet().Engine("pod-a") != inc {
		t.Error("pod-a got a new incarnation by turning ready again")
	}
	if got := h.servedBy(3, "m"); got["pod-a"] != 1 {
		t.Errorf("pod-a ready again: %v, want it served", got)
	}
	// Gone from the slices: retired, its stream still going.
	rep, err = h.gw.SetDiscovered("kubernetes", discovered(d2))
	if err != nil || rep.Added != nil || !slices.Equal(rep.Removed, []string{"pod-a"}) {
		t.Fatalf("SetDiscovered without pod-a = %+v, %v; want pod-a removed", rep, err)
	}
	if st := h.engineStates(); st["pod-a"] != "draining" {
		t.Errorf("pod-a state %q while its stream runs, want draining", st["pod-a"])
	}
	if got := h.servedBy(4, "m"); got["pod-a"] != 0 || got["e1"] != 2 || got["pod-b"] != 2 {
		t.Errorf("after pod-a left: %v, want e1:2 pod-b:2", got)
	}

	// A reload of the configured engines keeps pod-b.
	_, s3 := sim(t, enginesim.Config{Models: []string{"m"}})
	e3 := fleet.EngineConfig{Name: "e3", URL: s3.URL, Models: []string{"m"}}
	rep = h.reload(testConfig(e3), h.policy()).Changes
	if !slices.Equal(rep.Added, []string{"e3"}) || !slices.Equal(rep.Removed, []string{"e1"}) {
		t.Fatalf("reload = %+v, want e3 added, e1 removed, pod-b kept", rep)
	}
	if got := h.servedBy(4, "m"); got["e3"] != 2 || got["pod-b"] != 2 {
		t.Errorf("after the reload: %v, want e3:2 pod-b:2", got)
	}
	if got := h.gw.Discovered("kubernetes"); len(got) != 1 || got[0].Name != "pod-b" || got[0].Unready {
		t.Errorf("Discovered = %+v, want pod-b", got)
	}

	g.open()
	if err := finish(); err != nil {
		t.Fatalf("the stream on the engine that left: %v", err)
	}
	h.waitIdle()
	if _, ok := statusByName(h.gw.Fleet())["pod-a"]; ok {
		t.Error("pod-a is still listed after its stream drained")
	}
}

// heldStreamOn starts held streams until one lands on engine (round-robin
// over a known set: at most one per engine), closing the others at once;
// it returns the held stream's finish, or nil when this one went
// elsewhere.
func (h *harness) heldStreamOn(engine string) func() error {
	h.t.Helper()
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("stream: %d", resp.StatusCode)
	}
	if resp.Header.Get("X-Switchboard-Engine") != engine {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return nil
	}
	return func() error {
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), "data: [DONE]") {
			return errors.New("no [DONE]: " + string(b))
		}
		return nil
	}
}

// TestDynamicEnginesStartEmpty: WithDynamicEngines accepts a config with
// no engines; requests get 503 until a source adds one, and Reload also
// accepts an empty list then.
func TestDynamicEnginesStartEmpty(t *testing.T) {
	if _, err := New(testConfig(), nil, nil); err == nil || !strings.Contains(err.Error(), "no engines configured") {
		t.Fatalf("New without engines and without WithDynamicEngines: %v, want no engines configured", err)
	}
	h := newHarnessWith(t, testConfig(), []Option{WithDynamicEngines()})
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("no engine: %d, want 404 or 503", resp.StatusCode)
	}
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	if _, err := h.gw.SetDiscovered("kubernetes", discovered(fleet.EngineConfig{Name: "pod-a", URL: s1.URL})); err != nil {
		t.Fatal(err)
	}
	if got := h.servedBy(2, "m"); got["pod-a"] != 2 {
		t.Fatalf("served %v, want pod-a:2", got)
	}
	if _, err := h.gw.Reload(testConfig(), h.policy()); err != nil {
		t.Fatalf("reload with no configured engines: %v", err)
	}
	if got := h.servedBy(1, "m"); got["pod-a"] != 1 {
		t.Fatalf("after the reload: %v, want pod-a kept", got)
	}
}

// TestHoldReady: /ready answers 503 "starting" with every hold's reason
// until each is released; release is idempotent.
func TestHoldReady(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}))
	ready := func() (int, apiErr) {
		t.Helper()
		resp, err := h.client.Get(h.srv.URL + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e apiErr
		if resp.StatusCode != http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, e
	}
	if code, _ := ready(); code != http.StatusOK {
		t.Fatalf("/ready = %d before any hold", code)
	}
	r1 := h.gw.HoldReady("kubernetes discovery")
	r2 := h.gw.HoldReady("something else")
	code, e := ready()
	if code != http.StatusServiceUnavailable || e.code() != "starting" || e.Error.Message != "waiting for kubernetes discovery; something else" {
		t.Fatalf("/ready = %d %+v, want 503 starting naming both holds", code, e)
	}
	r1()
	r1()
	if code, e := ready(); code != http.StatusServiceUnavailable || e.Error.Message != "waiting for something else" {
		t.Fatalf("/ready = %d %+v after one release, want the other hold", code, e)
	}
	r2()
	if code, _ := ready(); code != http.StatusOK {
		t.Fatalf("/ready = %d after both releases, want 200", code)
	}
}

// discovered wraps engines as ready discovered engines.
func discovered(ecs ...fleet.EngineConfig) []fleet.DiscoveredEngine {
	out := make([]fleet.DiscoveredEngine, len(ecs))
	for i, ec := range ecs {
		out[i] = fleet.DiscoveredEngine{EngineConfig: ec}
	}
	return out
}

// TestAdminEngineNameWithSlash: the admin engine routes find a discovered
// engine whose name holds a "/" ("<namespace>/<pod>"), sent as %2F.
func TestAdminEngineNameWithSlash(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarnessWith(t, testConfig(), []Option{WithDynamicEngines()})
	if _, err := h.gw.SetDiscovered("kubernetes", discovered(fleet.EngineConfig{Name: "team-a/vllm-0", URL: s1.URL, Models: []string{"m"}})); err != nil {
		t.Fatal(err)
	}
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	defer admin.Close()
	resp, err := admin.Client().Post(admin.URL+"/admin/engines/team-a%2Fvllm-0/drain", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"name":"team-a/vllm-0"`) || !strings.Contains(string(b), `"drained":true`) {
		t.Fatalf("drain team-a%%2Fvllm-0: %d %s", resp.StatusCode, b)
	}
}

// TestSetDiscoveredReloadConcurrentSafe races discovery batches against
// reloads and requests: every reload keeps the discovered engines, every
// batch keeps the configured one, no request fails, and the gauges end at
// 0.
func TestSetDiscoveredReloadConcurrentSafe(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(e1))
	pods := []fleet.EngineConfig{{Name: "pod-a", URL: s2.URL, Models: []string{"m"}}, {Name: "pod-b", URL: s2.URL, Models: []string{"m"}}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 50 {
			set := []fleet.DiscoveredEngine{{EngineConfig: pods[0], Unready: i%3 == 0}}
			if i%2 == 0 {
				set = append(set, fleet.DiscoveredEngine{EngineConfig: pods[1]})
			}
			if _, err := h.gw.SetDiscovered("kubernetes", set); err != nil {
				t.Errorf("SetDiscovered: %v", err)
			}
		}
	})
	wg.Go(func() {
		for i := range 50 {
			cfg := testConfig(e1)
			cfg.MaxAttempts = 2 + i%2
			if _, err := h.gw.Reload(cfg, h.policy()); err != nil {
				t.Errorf("Reload: %v", err)
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for range 25 {
				resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("request: %d", resp.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	st := statusByName(h.gw.Fleet())
	if len(st["e1"]) != 1 || len(st["pod-a"]) == 0 || st["pod-a"][0].Retired {
		t.Errorf("after the race: %+v, want e1 and pod-a in the pool", st)
	}
	h.waitIdle()
}

// TestReadyRequiresEngine: with no engine up, /ready answers 503
// no_ready_engine by default and 200 with ready_requires_engine false
// (a reload switches it), while requests get 503 or 404 either way.
func TestReadyRequiresEngine(t *testing.T) {
	h := newHarnessWith(t, testConfig(), []Option{WithDynamicEngines()})
	ready := func() int {
		t.Helper()
		resp, err := h.client.Get(h.srv.URL + "/ready")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := ready(); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready = %d with no engine, want 503", code)
	}
	cfg := testConfig()
	cfg.ReadyRequiresEngine = false
	if _, err := h.gw.Reload(cfg, h.policy()); err != nil {
		t.Fatal(err)
	}
	if code := ready(); code != http.StatusOK {
		t.Fatalf("/ready = %d with ready_requires_engine false, want 200", code)
	}
	release := h.gw.HoldReady("discovery")
	if code := ready(); code != http.StatusServiceUnavailable {
		t.Errorf("/ready = %d while a hold is taken, want 503", code)
	}
	release()
	h.gw.Drain()
	if code := ready(); code != http.StatusServiceUnavailable {
		t.Errorf("/ready = %d while draining, want 503", code)
	}
}
