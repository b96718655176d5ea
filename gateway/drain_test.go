package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
)

// TestAdminDrainAndResume: POST /admin/engines/e1/drain while a stream is
// in flight on e1: new requests go to e2 only, e1 is "draining" on the
// state gauge and in its status (which shows the request still finishing),
// the held stream completes cleanly and releases its slot, and after
// .../undrain (or .../resume) e1 takes requests again. Unknown engines get
// 404, other methods 405.
func TestAdminDrainAndResume(t *testing.T) {
	g := newGated(t)
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: g.srv.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}}))
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)
	post := func(path string) (int, fleet.EngineStatus) {
		t.Helper()
		resp, err := http.Post(admin.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st fleet.EngineStatus
		if resp.StatusCode == 200 {
			if err := json.Unmarshal(b, &st); err != nil {
				t.Fatalf("%s: %v in %q", path, err, b)
			}
		}
		return resp.StatusCode, st
	}

	finish := h.heldStream() // round-robin starts at e1
	g.waitStarted(t)
	code, st := post("/admin/engines/e1/drain")
	if code != 200 || st.State != "draining" || !st.Drained || st.Routable || st.Prefill+st.Decode != 1 {
		t.Fatalf("drain: %d %+v, want 200, draining, one request finishing", code, st)
	}
	if got := h.servedBy(4, "m"); got["e2"] != 4 {
		t.Errorf("while e1 drains: served %v, want all 4 on e2", got)
	}
	if s := h.engineStates(); s["e1"] != "draining" || s["e2"] != "ready" {
		t.Errorf("states %v, want e1 draining, e2 ready", s)
	}
	g.open()
	if err := finish(); err != nil {
		t.Errorf("the stream on the draining engine: %v", err)
	}
	h.waitIdle()

	code, st = post("/admin/engines/e1/undrain")
	if code != 200 || st.State != "ready" || st.Drained || !st.Routable {
		t.Fatalf("undrain: %d %+v, want 200, ready", code, st)
	}
	// .../resume is the same.
	if code, st = post("/admin/engines/e1/drain"); code != 200 || !st.Drained {
		t.Fatalf("drain again: %d %+v", code, st)
	}
	if code, st = post("/admin/engines/e1/resume"); code != 200 || st.Drained {
		t.Fatalf("resume: %d %+v, want 200, not drained", code, st)
	}
	if got := h.servedBy(4, "m"); got["e1"] == 0 {
		t.Errorf("after resume: served %v, want e1 back in rotation", got)
	}
	if code, _ := post("/admin/engines/nope/drain"); code != 404 {
		t.Errorf("unknown engine: %d, want 404", code)
	}
	resp, err := http.Get(admin.URL + "/admin/engines/e1/drain")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Errorf("GET .../drain: %d Allow %q, want 405 and POST", resp.StatusCode, resp.Header.Get("Allow"))
	}
	h.waitIdle()
}

// TestStatusDropsDrainedRetiredEngine: a removed engine is listed (retired)
// only while it has requests finishing, whether or not anything has
// collected the metrics since (the retired list itself is pruned by the
// gauges' callback, which a gateway without a scrape never runs).
func TestStatusDropsDrainedRetiredEngine(t *testing.T) {
	g := newGated(t)
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: g.srv.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}}))
	finish := h.heldStream() // on e1
	g.waitStarted(t)
	h.gw.Fleet().Remove("e1")
	names := func() (out []string) {
		for _, st := range h.gw.Fleet().Status() {
			out = append(out, fmt.Sprintf("%s/retired=%t", st.Name, st.Retired))
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{"e2/retired=false", "e1/retired=true"}) {
		t.Errorf("while e1's stream finishes: %v", got)
	}
	g.open()
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	testutil.Poll(2*time.Second, func() bool { return h.gw.LiveAttempts() == 0 })
	if got := names(); !slices.Equal(got, []string{"e2/retired=false"}) {
		t.Errorf("after it drained, with no metrics collection: %v, want e2 only", got)
	}
}

// TestEveryEngineDrainedSaysSo: with every engine of a model drained, a
// request for it, a request naming no model, GET /v1/models, GET
// /v1/models/{id} and /ready (ready_requires_engine on) answer 503
// engines_drained saying "drained", not "no healthy engine"; resuming one
// engine brings them back.
func TestEveryEngineDrainedSaysSo(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
	cfg.ReadyRequiresEngine = true
	cfg.Models.Aliases = map[string]string{"public": "m"}
	h := newHarness(t, cfg)
	for _, e := range []string{"e1", "e2"} {
		if _, ok := h.gw.fleet.SetDrained(e, true); !ok {
			t.Fatalf("drain %s", e)
		}
	}
	check := func(method, path, body string) {
		t.Helper()
		st, _, b := h.do(method, path, body)
		var e apiErr
		_ = json.Unmarshal(b, &e)
		if st != 503 || e.code() != "engines_drained" || !strings.Contains(e.Error.Message, "drained") {
			t.Errorf("%s %s: %d %s, want 503 engines_drained saying drained", method, path, st, b)
		}
	}
	chat := `{"model":"%s","messages":[{"role":"user","content":"hi"}]}`
	check(http.MethodPost, "/v1/chat/completions", fmt.Sprintf(chat, "m"))
	check(http.MethodPost, "/v1/chat/completions", fmt.Sprintf(chat, "public"))
	check(http.MethodPost, "/tokenize", `{"prompt":"hi"}`)
	check(http.MethodGet, "/v1/models", "")
	check(http.MethodGet, "/v1/models/m", "")
	check(http.MethodGet, "/ready", "")
	// A model no engine serves is still unknown, not drained.
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", fmt.Sprintf(chat, "nope")); st != 404 {
		t.Errorf("unknown model while drained: %d %s, want 404", st, b)
	}
	h.gw.fleet.SetDrained("e2", false)
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", fmt.Sprintf(chat, "m")); st != 200 {
		t.Errorf("after resuming e2: %d %s, want 200", st, b)
	}
	if st, _, _ := h.do(http.MethodGet, "/ready", ""); st != 200 {
		t.Errorf("/ready after resuming e2: %d, want 200", st)
	}
}

// TestRetryDrainedAliasNamesAlias: a request for an alias whose engines are
// all drained while its first attempt fails (503) is answered in the name
// the client used, never the alias's target.
func TestRetryDrainedAliasNamesAlias(t *testing.T) {
	var h *harness
	e1 := fakeEngine(t, []string{"secret-target"}, func(w http.ResponseWriter, r *http.Request) {
		h.gw.fleet.SetDrained("e1", true)
		h.gw.fleet.SetDrained("e2", true)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"busy","type":"server_error","param":null,"code":503}}`)
	})
	e2 := fakeEngine(t, []string{"secret-target"}, func(w http.ResponseWriter, r *http.Request) {
		t.Error("e2 was drained: it must get no request")
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: e1.URL, Models: []string{"secret-target"}}, fleet.EngineConfig{Name: "e2", URL: e2.URL, Models: []string{"secret-target"}})
	cfg.Models.Aliases = map[string]string{"public": "secret-target"}
	h = newHarnessWith(t, cfg, nil, withPolicy(routing.NewRoundRobin()))
	st, _, b := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"public","messages":[{"role":"user","content":"hi"}]}`)
	if st != 503 || !strings.Contains(string(b), "public") || strings.Contains(string(b), "secret-target") {
		t.Errorf("%d %s, want 503 naming public, never secret-target", st, b)
	}
}
