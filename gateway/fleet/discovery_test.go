package fleet

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// discovered wraps engines as ready discovered engines.
func discovered(ecs ...EngineConfig) []DiscoveredEngine {
	out := make([]DiscoveredEngine, len(ecs))
	for i, ec := range ecs {
		out[i] = DiscoveredEngine{EngineConfig: ec}
	}
	return out
}

// TestSetDiscoveredLeavesOutBadAndTaken: a discovered engine whose name a
// configured engine has, or that is invalid, is left out with an error
// wrapping ErrEngineLeftOut; the others are applied.
func TestSetDiscoveredLeavesOutBadAndTaken(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	e1 := EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}
	f := newTestFleet(t, testConfig(e1))
	f.Start()
	rep, err := f.SetDiscovered("kubernetes", discovered(
		EngineConfig{Name: "e1", URL: "http://10.0.0.1:8000", Models: []string{"m"}},
		EngineConfig{Name: "bad", URL: "ftp://x", Models: []string{"m"}},
		EngineConfig{Name: "ok", URL: s1.URL, Models: []string{"m"}},
		EngineConfig{Name: "ok", URL: "http://10.0.0.2:8000", Models: []string{"m"}},
	))
	if !errors.Is(err, ErrEngineLeftOut) || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrEngineLeftOut and ErrInvalidConfig", err)
	}
	for _, want := range []string{`"e1": the name is taken by a configured engine`, `"bad": url scheme`, `"ok": the name is taken by another engine of kubernetes discovery`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to say %s", err, want)
		}
	}
	if !slices.Equal(rep.Added, []string{"ok"}) {
		t.Fatalf("report %+v, want only ok added", rep)
	}
	var st []EngineStatus
	for _, s := range f.Status() {
		if s.Name == "e1" {
			st = append(st, s)
		}
	}
	if len(st) != 1 || st[0].URL != s1.URL {
		t.Errorf("e1 = %+v, want the configured one, untouched", st)
	}
}

// TestSetConfiguredKeepsDiscovered: SetConfigured replaces the configured
// engines and keeps every discovery source's; a configured engine taking a
// discovered engine's name wins, and the left-out engine is reported with
// the rest applied.
func TestSetConfiguredKeepsDiscovered(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	f := newTestFleet(t, testConfig(EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}))
	f.Start()
	if _, err := f.SetDiscovered("kubernetes", discovered(EngineConfig{Name: "pod-a", URL: s1.URL, Models: []string{"m"}})); err != nil {
		t.Fatal(err)
	}
	ch, err := f.SetConfigured([]EngineConfig{{Name: "e2", URL: s1.URL, Models: []string{"m"}}}, nil)
	if err != nil || !slices.Equal(ch.Added, []string{"e2"}) || !slices.Equal(ch.Removed, []string{"e1"}) {
		t.Fatalf("SetConfigured = %+v, %v; want e2 added, e1 removed", ch, err)
	}
	if got := routed(f, "m"); !slices.Equal(got, []string{"e2", "pod-a"}) {
		t.Fatalf("routed %v, want e2 then pod-a", got)
	}
	ch, err = f.SetConfigured([]EngineConfig{{Name: "pod-a", URL: s1.URL, Models: []string{"m"}}}, nil)
	if !errors.Is(err, ErrEngineLeftOut) || !slices.Equal(ch.Removed, []string{"e2"}) {
		t.Fatalf("SetConfigured taking pod-a's name = %+v, %v; want e2 removed and pod-a left out", ch, err)
	}
	if got := f.Discovered("kubernetes"); len(got) != 1 || got[0].Name != "pod-a" {
		t.Errorf("Discovered = %+v, want pod-a kept", got)
	}
}
