package gateway

import (
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestAdmitAllocs: admission on a limited, tiered route allocates nothing
// when it keeps every candidate (every engine of the lowest tier with
// room), and one slice when it narrows them to a tier.
func TestAdmitAllocs(t *testing.T) {
	m, _ := telemetry.NewMetrics(nil)
	one := 1
	f, err := fleet.New(fleet.Config{Engines: []fleet.EngineConfig{
		{Name: "a", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxInFlight: 4},
		{Name: "b", URL: "http://127.0.0.1:2", Models: []string{"m"}, MaxInFlight: 4},
		{Name: "p", URL: "http://127.0.0.1:3", Models: []string{"m"}, Tier: &one},
	}, Health: fleet.DefaultHealthConfig(), Stats: fleet.DefaultEngineStatsConfig()}, m)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rt, err := f.Lookup("m")
	if err != nil {
		t.Fatal(err)
	}
	low := rt.Endpoints()[:2]
	now := time.Now()
	if out, _ := admit(rt, low, "chat", now); len(out) != 2 {
		t.Fatalf("admitted %d of the tier-0 engines, want 2", len(out))
	}
	if a := testing.AllocsPerRun(100, func() { _, _ = admit(rt, low, "chat", now) }); a != 0 {
		t.Errorf("admit keeping every candidate allocates %v times, want 0", a)
	}
	if out, ad := admit(rt, rt.Endpoints(), "chat", now); len(out) != 2 || ad.usable != 3 || ad.spill != -1 {
		t.Fatalf("admit over both tiers: %d kept, %+v; want the 2 of tier 0, 3 usable, no spill", len(out), ad)
	}
	if a := testing.AllocsPerRun(100, func() { _, _ = admit(rt, rt.Endpoints(), "chat", now) }); a != 1 {
		t.Errorf("admit narrowing to a tier allocates %v times, want 1 (its slice)", a)
	}
}
