package fleet

import (
	"fmt"
	"slices"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// retiredLen is how many retired incarnations the fleet keeps.
func retiredLen(f *Fleet) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.retired)
}

// TestPrunesRetired: with no metrics collection at all, the retired list
// does not grow with reloads that replace an engine (the drained old
// incarnations are dropped: the engine in the fleet continues the name's
// series) and is bounded when engines are removed for good; a removed
// name still reports a last 0 once when a collection does come.
func TestPrunesRetired(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
	p := newTestFleet(t, testConfig(EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}))
	p.Start()
	for i := range 20 {
		url := s1.URL
		if i%2 == 0 {
			url = s2.URL
		}
		if ch, err := p.SetConfigured([]EngineConfig{{Name: "e1", URL: url, Models: []string{"m"}}}, nil); err != nil || !slices.Equal(ch.Changed, []string{"e1"}) {
			t.Fatalf("reload %d: %+v, %v; want e1 changed", i, ch, err)
		}
	}
	if n := retiredLen(p); n != 0 {
		t.Errorf("after 20 reloads that replaced e1: %d retired incarnations kept, want 0", n)
	}

	ec := func(name string) EngineConfig { return EngineConfig{Name: name, URL: s1.URL, Models: []string{"m"}} }
	if err := p.Add(ec("gone")); err != nil {
		t.Fatal(err)
	}
	p.Remove("gone")
	// A collection of the in-flight gauge: what ObserveInFlight reports
	// for gone.
	collect := func() (reports []string) {
		p.ObserveInFlight(func(e *telemetry.Engine, prefill, decode int64) {
			if e.Name() == "gone" {
				reports = append(reports, fmt.Sprintf("%d/%d", prefill, decode))
			}
		})
		return reports
	}
	if got := collect(); !slices.Equal(got, []string{"0/0"}) {
		t.Errorf("first collection after removing gone: %v, want its last 0 for both phases", got)
	}
	if got := collect(); len(got) != 0 {
		t.Errorf("second collection: %v, want gone no longer reported", got)
	}

	for i := range maxRetired + 50 {
		name := fmt.Sprintf("x%d", i)
		if err := p.Add(ec(name)); err != nil {
			t.Fatal(err)
		}
		p.Remove(name)
	}
	if n := retiredLen(p); n > maxRetired {
		t.Errorf("after removing %d engines: %d retired incarnations kept, want at most %d", maxRetired+50, n, maxRetired)
	}
	if got := routed(p, "m"); !slices.Equal(got, []string{"e1"}) {
		t.Errorf("routed %v, want e1", got)
	}
}
