package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// TestHealthProbes: an engine that fails its very first probe is out of
// routing at once; after that, UnhealthyAfter consecutive failures take it
// out and one success brings it back; Ready follows.
func TestHealthProbes(t *testing.T) {
	good, sGood := sim(t, enginesim.Config{Models: []string{"m"}})
	bad, sBad := sim(t, enginesim.Config{Models: []string{"m"}})
	bad.SetHealthy(false)
	cfg := testConfig(EngineConfig{Name: "good", URL: sGood.URL}, EngineConfig{Name: "bad", URL: sBad.URL})
	cfg.Health.UnhealthyAfter = 2
	f := newTestFleet(t, cfg)
	f.Start()
	status := func() map[string]bool {
		out := map[string]bool{}
		for _, s := range f.Status() {
			out[s.Name] = s.Healthy
		}
		return out
	}
	if st := status(); !st["good"] || st["bad"] {
		t.Fatalf("after the first probe: %v, want good healthy and bad not", st)
	}
	bad.SetHealthy(true)
	f.ProbeNow(context.Background())
	if st := status(); !st["bad"] {
		t.Fatalf("bad recovered but still unhealthy: %v", st)
	}
	good.SetHealthy(false)
	f.ProbeNow(context.Background())
	if st := status(); !st["good"] {
		t.Fatalf("one failed probe (of UnhealthyAfter=2) took good out: %v", st)
	}
	f.ProbeNow(context.Background())
	if st := status(); st["good"] {
		t.Fatalf("two failed probes left good in: %v", st)
	}
	// Only "bad" serves "m" now.
	if got := routed(f, "m"); !slices.Equal(got, []string{"bad"}) {
		t.Fatalf("routed to %v, want bad", got)
	}
	bad.SetHealthy(false)
	f.ProbeNow(context.Background())
	f.ProbeNow(context.Background())
	if f.Ready() {
		t.Errorf("Ready with no healthy engine")
	}
	good.SetHealthy(true)
	f.ProbeNow(context.Background())
	if !f.Ready() {
		t.Errorf("not Ready with good healthy again")
	}
}

func TestAddRemove(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	f := newTestFleet(t, testConfig(EngineConfig{Name: "e1", URL: s1.URL}))
	f.Start()
	if err := f.Add(EngineConfig{Name: "e1", URL: s1.URL}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Add of a duplicate name: %v, want ErrInvalidConfig", err)
	}
	if err := f.Add(EngineConfig{Name: "e2", URL: "ftp://x"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("Add of a bad URL: %v, want ErrInvalidConfig", err)
	}
	if f.Remove("nope") {
		t.Error("Remove of an unknown engine returned true")
	}
	if !f.Remove("e1") {
		t.Fatal("Remove(e1) = false")
	}
	if _, err := f.Lookup("m"); !errors.Is(err, ErrModelNotFound) {
		t.Errorf("model of a removed engine: %v, want ErrModelNotFound", err)
	}
}

// modelsEngine is a fake engine answering /health and GET /v1/models with
// model's card carrying maxLen (none when 0); healthy can turn it down.
func modelsEngine(t *testing.T, model string, maxLen int64, healthy *atomic.Bool) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if healthy != nil && !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		card := map[string]any{"id": model, "object": "model"}
		if maxLen > 0 {
			card["max_model_len"] = maxLen
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []any{card}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestRouteMaxModelLen: a route's context length is the smallest
// max_model_len its routable engines report in GET /v1/models; an engine
// that reports none, or whose models are configured (no discovery), adds
// nothing (0 is unknown), and an engine out of routing no longer counts.
func TestRouteMaxModelLen(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	s1 := modelsEngine(t, "m", 8192, nil)
	s2 := modelsEngine(t, "m", 4096, &up)
	s3 := modelsEngine(t, "m", 0, nil)
	s4 := modelsEngine(t, "n", 2048, nil)
	f := newTestFleet(t, testConfig(EngineConfig{Name: "long", URL: s1.URL}, EngineConfig{Name: "short", URL: s2.URL},
		EngineConfig{Name: "silent", URL: s3.URL}, EngineConfig{Name: "static", URL: s4.URL, Models: []string{"n"}}))
	f.Start()
	maxLen := func(model string) int64 {
		t.Helper()
		rt, err := f.Lookup(model)
		if err != nil {
			t.Fatalf("Lookup(%s): %v", model, err)
		}
		return rt.MaxModelLen()
	}
	if got := maxLen("m"); got != 4096 {
		t.Errorf("m: max_model_len %d, want 4096 (the smaller of 8192 and 4096)", got)
	}
	if got := maxLen("n"); got != 0 {
		t.Errorf("n (configured models, no discovery): max_model_len %d, want 0 (unknown)", got)
	}
	up.Store(false)
	f.ProbeNow(context.Background())
	if got := maxLen("m"); got != 8192 {
		t.Errorf("m with short unhealthy: max_model_len %d, want 8192", got)
	}
}
