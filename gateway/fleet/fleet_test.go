package fleet

import (
	"context"
	"errors"
	"slices"
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
