package fleet

import (
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// outlierRig is a fleet of simulated engines serving model m (static
// models, so no probe is needed before outcomes are reported), with an
// injected clock and its timers. It is not started.
type outlierRig struct {
	t   *testing.T
	f   *Fleet
	clk *testutil.Clock
}

// newOutlierRig starts one simulated engine per name and builds the fleet
// of them with mod applied to the config.
func newOutlierRig(t *testing.T, names []string, mod func(*Config)) *outlierRig {
	t.Helper()
	var engines []EngineConfig
	for _, n := range names {
		_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
		engines = append(engines, EngineConfig{Name: n, URL: srv.URL, Models: []string{"m"}})
	}
	cfg := testConfig(engines...)
	if mod != nil {
		mod(&cfg)
	}
	r := &outlierRig{t: t, clk: testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	r.f = newTestFleet(t, cfg, WithClock(r.clk.Now), WithAfterFunc(r.clk.AfterFunc))
	return r
}

// report reports n outcomes o of engine name, as its attempts would end.
func (r *outlierRig) report(name string, o routing.Outcome, n int) {
	r.t.Helper()
	e := r.f.Engine(name)
	if e == nil {
		r.t.Fatalf("no engine %q", name)
	}
	for range n {
		r.f.Report(e, o)
	}
}

func (r *outlierRig) status(name string) EngineStatus { return statusOf(r.t, r.f, name) }

// TestEngineStatesMatchRouting: the state gauge's values are routing's
// states, index for index.
func TestEngineStatesMatchRouting(t *testing.T) {
	for i, name := range telemetry.EngineStates {
		if got := routing.State(i).String(); got != name {
			t.Errorf("telemetry.EngineStates[%d] = %q, routing.State(%d) = %q", i, name, i, got)
		}
	}
}

// TestReportDoesNotAllocate: the per-attempt hook allocates nothing.
func TestReportDoesNotAllocate(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	r := newOutlierRig(t, []string{"a", "b"}, func(c *Config) { c.Outlier.Consecutive5xx = 1 << 30 })
	e := r.f.engines[0]
	i := 0
	if a := testing.AllocsPerRun(1000, func() {
		if i%2 == 0 {
			r.f.Report(e, routing.OutcomeServerError)
		} else {
			r.f.Report(e, routing.OutcomeSuccess)
		}
		i++
	}); a != 0 {
		t.Errorf("Report allocates %v per call", a)
	}
}

// TestOutlierIncarnations: an ejected engine removed from the fleet shows
// draining (its return timer then does nothing), and the engine added
// again under its name is a new incarnation: ready, never ejected.
func TestOutlierIncarnations(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, nil)
	r.report("bad", routing.OutcomeServerError, r.f.OutlierConfig().Consecutive5xx)
	old := r.f.Engine("bad")
	if s := r.status("bad").State; s != "ejected" {
		t.Fatalf("state %s, want ejected", s)
	}
	if !r.f.Remove("bad") {
		t.Fatal("Remove")
	}
	r.clk.Advance(time.Minute) // the return timer fires for an engine no longer in the fleet
	if !old.ep.Outlier().Ejected() {
		t.Error("the retired incarnation was probed back")
	}
	if err := r.f.Add(old.cfg); err != nil {
		t.Fatal(err)
	}
	if st := r.status("bad"); st.State != "ready" || st.Ejections != 0 || st.EjectedUntil != nil {
		t.Errorf("the new incarnation: %+v, want ready and never ejected", st)
	}
}

// TestOutlierRealTimer: with the real clock and time.AfterFunc the return
// timer fires by itself at the end of a short ejection and its probe
// brings the engine back; Close stops an armed timer (goleak checks
// nothing is left). The test waits on the timer, not on a sleep.
func TestOutlierRealTimer(t *testing.T) {
	_, sBad := sim(t, enginesim.Config{Models: []string{"m"}})
	_, sGood := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(EngineConfig{Name: "bad", URL: sBad.URL, Models: []string{"m"}}, EngineConfig{Name: "good", URL: sGood.URL, Models: []string{"m"}})
	cfg.Outlier.Consecutive5xx = 1
	cfg.Outlier.BaseEjectionTime = 20 * time.Millisecond
	// The real timer, telling the test when its function has returned.
	fired := make(chan struct{}, 4)
	f := newTestFleet(t, cfg, WithAfterFunc(func(d time.Duration, fn func()) func() bool {
		return time.AfterFunc(d, func() { fn(); fired <- struct{}{} }).Stop
	}))
	bad := f.Engine("bad")
	f.Report(bad, routing.OutcomeServerError)
	if s := statusOf(t, f, "bad").State; s != "ejected" {
		t.Fatalf("bad is %s after a streak of 1, want ejected", s)
	}
	select {
	case <-fired:
	case <-time.After(5 * time.Second):
		t.Fatal("the return timer of a 20 ms ejection did not fire within 5 s")
	}
	if s := statusOf(t, f, "bad").State; s != "ready" {
		t.Fatalf("after the return timer's probe: %s, want ready", s)
	}
	// Ejected again, for 40 ms, and closed while the timer is armed.
	f.Report(bad, routing.OutcomeServerError)
	if s := statusOf(t, f, "bad").State; s != "ejected" {
		t.Fatalf("bad is %s after a second streak, want ejected", s)
	}
	f.Close()
	f.mu.Lock()
	armed := len(f.out.timers)
	f.mu.Unlock()
	if armed != 0 {
		t.Errorf("%d return timers armed after Close", armed)
	}
}

// TestOutlierDisableDuringEjection: outlier detection turned off (a
// reload's SetOutlier) between a streak tripping and its ejection taking
// the fleet's lock ejects nothing and arms no return timer: the ejection
// reads the settings again under the lock.
func TestOutlierDisableDuringEjection(t *testing.T) {
	r := newOutlierRig(t, []string{"bad", "good"}, nil)
	off := r.f.OutlierConfig()
	off.Enabled = false
	var once sync.Once
	r.f.out.tripped = func(*Engine) { once.Do(func() { r.f.SetOutlier(off) }) }
	r.report("bad", routing.OutcomeServerError, off.Consecutive5xx)
	if st := r.status("bad"); st.State != "ready" || !st.Routable || st.EjectedUntil != nil || st.Ejections != 0 {
		t.Errorf("detection turned off as the streak tripped: %+v, want ready, never ejected", st)
	}
	if n := r.clk.Pending(); n != 0 {
		t.Errorf("%d return timers armed with detection off", n)
	}
}
