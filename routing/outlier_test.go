package routing

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// t0 is the injected clock's origin in the outlier tests.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func recordN(t *testing.T, o *Outlier, c *OutlierConfig, out Outcome, n int) (trips int) {
	t.Helper()
	for range n {
		if _, trip := o.Record(c, out); trip {
			trips++
		}
	}
	return trips
}

// TestOutlierStreakPerKind: each failure kind trips at its own threshold,
// exactly once per full streak, and 0 disables it.
func TestOutlierStreakPerKind(t *testing.T) {
	c := DefaultOutlierConfig()
	c.Consecutive5xx, c.ConsecutiveConnectFailures, c.ConsecutiveTimeouts = 5, 3, 2
	for _, tc := range []struct {
		kind Outcome
		n    int
	}{{OutcomeServerError, 5}, {OutcomeConnectFailure, 3}, {OutcomeTimeout, 2}} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			var o Outlier
			if trips := recordN(t, &o, &c, tc.kind, tc.n-1); trips != 0 {
				t.Fatalf("tripped after %d failures, threshold %d", tc.n-1, tc.n)
			}
			kind, trip := o.Record(&c, tc.kind)
			if !trip || kind != tc.kind {
				t.Fatalf("failure %d: (%v, %v), want (%v, true)", tc.n, kind, trip, tc.kind)
			}
			// The streak starts again: the next trip needs a full one.
			if trips := recordN(t, &o, &c, tc.kind, tc.n-1); trips != 0 {
				t.Errorf("tripped again before a second full streak")
			}
			if trips := recordN(t, &o, &c, tc.kind, 1); trips != 1 {
				t.Errorf("second full streak did not trip")
			}
		})
	}
	t.Run("disabled detector", func(t *testing.T) {
		c := c
		c.ConsecutiveTimeouts = 0
		var o Outlier
		if trips := recordN(t, &o, &c, OutcomeTimeout, 100); trips != 0 {
			t.Errorf("consecutive_timeouts 0 tripped %d times", trips)
		}
	})
}

// TestOutlierSuccessResetsNeutralDoesNot: a success ends every streak; a
// neutral outcome (4xx, 429, client cancel) neither counts nor ends one;
// a failure of another kind leaves a streak where it is.
func TestOutlierSuccessResetsNeutralDoesNot(t *testing.T) {
	c := DefaultOutlierConfig()
	c.Consecutive5xx, c.ConsecutiveConnectFailures = 3, 3
	var o Outlier
	recordN(t, &o, &c, OutcomeServerError, 2)
	recordN(t, &o, &c, OutcomeConnectFailure, 2)
	o.Record(&c, OutcomeSuccess)
	if s := o.Status(&c, t0); s.Streak5xx != 0 || s.StreakConnect != 0 {
		t.Fatalf("after a success: streaks %+v, want 0", s)
	}
	if trips := recordN(t, &o, &c, OutcomeServerError, 2); trips != 0 {
		t.Fatal("tripped after a success and 2 failures")
	}
	recordN(t, &o, &c, OutcomeNeutral, 50)
	recordN(t, &o, &c, OutcomeConnectFailure, 1)
	if kind, trip := o.Record(&c, OutcomeServerError); !trip || kind != OutcomeServerError {
		t.Errorf("third 5xx across neutral outcomes and a connect failure: trip %v", trip)
	}
	var fresh Outlier
	if trips := recordN(t, &fresh, &c, OutcomeNeutral, 1000); trips != 0 || fresh.Status(&c, t0).Streak5xx != 0 {
		t.Errorf("neutral outcomes counted")
	}
}

// TestOutlierBackoffGrowsAndCaps: the n-th ejection lasts base × n, capped
// at max; the multiplier itself stops at ceil(max/base).
func TestOutlierBackoffGrowsAndCaps(t *testing.T) {
	c := DefaultOutlierConfig()
	c.BaseEjectionTime, c.MaxEjectionTime = 30*time.Second, 100*time.Second
	var o Outlier
	now := t0
	want := []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second, 100 * time.Second, 100 * time.Second, 100 * time.Second}
	for i, w := range want {
		until, n, ok := o.Eject(&c, now)
		if !ok {
			t.Fatalf("ejection %d refused", i+1)
		}
		if got := until.Sub(now); got != w {
			t.Errorf("ejection %d lasts %s, want %s", i+1, got, w)
		}
		if n > 4 {
			t.Errorf("ejection %d: multiplier %d, want it capped at 4 (ceil(100s/30s))", i+1, n)
		}
		if _, _, again := o.Eject(&c, now); again {
			t.Errorf("an ejected endpoint was ejected again")
		}
		if o.Return(until.Add(-time.Nanosecond)) {
			t.Errorf("ejection %d ended before its time", i+1)
		}
		// Returned at once and failing again: no decay.
		now = until
		if !o.Return(now) {
			t.Fatalf("ejection %d did not end at its time", i+1)
		}
	}
	if s := o.Status(&c, now); s.Total != uint64(len(want)) || s.Ejected {
		t.Errorf("status %+v, want %d ejections in total, not ejected", s, len(want))
	}
}

// TestOutlierDecay: every base_ejection_time back in routing forgives one
// earlier ejection.
func TestOutlierDecay(t *testing.T) {
	c := DefaultOutlierConfig()
	c.BaseEjectionTime, c.MaxEjectionTime = 10*time.Second, time.Hour
	var o Outlier
	now := t0
	for range 3 {
		until, _, _ := o.Eject(&c, now)
		now = until
		o.Return(now)
	}
	if n := o.Status(&c, now).Ejections; n != 3 {
		t.Fatalf("multiplier %d after 3 ejections, want 3", n)
	}
	if n := o.Status(&c, now.Add(25*time.Second)).Ejections; n != 1 {
		t.Errorf("multiplier %d after 25s healthy, want 1", n)
	}
	// Healthy 10s: one forgiven, so this ejection is the third (2+1).
	now = now.Add(10 * time.Second)
	until, n, _ := o.Eject(&c, now)
	if n != 3 || until.Sub(now) != 30*time.Second {
		t.Errorf("after 10s healthy: ejection %d for %s, want 3 for 30s", n, until.Sub(now))
	}
	o.Return(until)
	if n := o.Status(&c, until.Add(time.Hour)).Ejections; n != 0 {
		t.Errorf("multiplier %d after an hour healthy, want 0", n)
	}
	if _, n, _ := o.Eject(&c, until.Add(time.Hour)); n != 1 {
		t.Errorf("after full decay the ejection is number %d, want 1", n)
	}
}

// TestOutlierIgnoresOutcomesWhileEjected: attempts started before the
// ejection and ending during it neither trip nor reset anything.
func TestOutlierIgnoresOutcomesWhileEjected(t *testing.T) {
	c := DefaultOutlierConfig()
	var o Outlier
	until, _, _ := o.Eject(&c, t0)
	if trips := recordN(t, &o, &c, OutcomeServerError, 100); trips != 0 {
		t.Errorf("tripped %d times while ejected", trips)
	}
	if s := o.Status(&c, t0); s.Streak5xx != 0 || !s.Ejected || !s.Until.Equal(until) {
		t.Errorf("status while ejected %+v", s)
	}
	if !o.Ejected() {
		t.Error("Ejected() false while ejected")
	}
	if !o.Forgive() || o.Ejected() || o.Status(&c, t0).Ejections != 0 {
		t.Error("Forgive did not end the ejection and forget the multiplier")
	}
}

// TestOutlierConfigValidate: every bad key is reported with its name.
func TestOutlierConfigValidate(t *testing.T) {
	if err := DefaultOutlierConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	zero := DefaultOutlierConfig()
	zero.Consecutive5xx, zero.ConsecutiveConnectFailures, zero.ConsecutiveTimeouts, zero.MaxEjectionPercent = 0, 0, 0, 0
	if err := zero.Validate(); err != nil {
		t.Errorf("zero thresholds and percent are valid (detectors off): %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*OutlierConfig)
		key  string
	}{
		{"negative 5xx", func(c *OutlierConfig) { c.Consecutive5xx = -1 }, "outlier.consecutive_5xx"},
		{"negative connect", func(c *OutlierConfig) { c.ConsecutiveConnectFailures = -1 }, "outlier.consecutive_connect_failures"},
		{"negative timeouts", func(c *OutlierConfig) { c.ConsecutiveTimeouts = -2 }, "outlier.consecutive_timeouts"},
		{"zero base", func(c *OutlierConfig) { c.BaseEjectionTime = 0 }, "outlier.base_ejection_time"},
		{"max below base", func(c *OutlierConfig) { c.MaxEjectionTime = c.BaseEjectionTime - 1 }, "outlier.max_ejection_time"},
		{"percent over 100", func(c *OutlierConfig) { c.MaxEjectionPercent = 101 }, "outlier.max_ejection_percent"},
		{"negative percent", func(c *OutlierConfig) { c.MaxEjectionPercent = -1 }, "outlier.max_ejection_percent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultOutlierConfig()
			c.Enabled = false // checked even when off
			tc.mod(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidOutlierConfig) || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("Validate() = %v, want an error naming %s", err, tc.key)
			}
		})
	}
}

// TestOutlierMaxEjected: floor(n × percent / 100).
func TestOutlierMaxEjected(t *testing.T) {
	c := DefaultOutlierConfig()
	for n, want := range map[int]int{0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 9: 4} {
		if got := c.MaxEjected(n); got != want {
			t.Errorf("MaxEjected(%d) at 50%% = %d, want %d", n, got, want)
		}
	}
	c.MaxEjectionPercent = 100
	if got := c.MaxEjected(1); got != 1 {
		t.Errorf("MaxEjected(1) at 100%% = %d, want 1", got)
	}
}

// TestStateVerdicts: the most severe verdict wins, and the names are the
// gauge's state values.
func TestStateVerdicts(t *testing.T) {
	for _, tc := range []struct {
		v    Verdicts
		want State
	}{
		{Verdicts{}, StateReady},
		{Verdicts{Sleeping: true}, StateSleeping},
		{Verdicts{Ejected: true, Sleeping: true}, StateEjected},
		{Verdicts{Unhealthy: true, Ejected: true}, StateUnhealthy},
		{Verdicts{Draining: true, Unhealthy: true, Ejected: true, Sleeping: true}, StateDraining},
	} {
		if got := tc.v.State(); got != tc.want {
			t.Errorf("%+v.State() = %v, want %v", tc.v, got, tc.want)
		}
	}
	want := []string{"ready", "unhealthy", "sleeping", "draining", "ejected"}
	for i, w := range want {
		if got := State(i).String(); got != w {
			t.Errorf("State(%d) = %q, want %q", i, got, w)
		}
	}
}

// TestOutlierRecordDoesNotAllocate: the per-attempt path allocates nothing.
func TestOutlierRecordDoesNotAllocate(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	c := DefaultOutlierConfig()
	var o Outlier
	outs := []Outcome{OutcomeSuccess, OutcomeServerError, OutcomeNeutral, OutcomeTimeout, OutcomeConnectFailure}
	i := 0
	if a := testing.AllocsPerRun(1000, func() { o.Record(&c, outs[i%len(outs)]); i++ }); a != 0 {
		t.Errorf("Record allocates %v per call", a)
	}
}

// TestOutlierConcurrentSafe: outcomes from many goroutines, ejections and
// returns racing; the streak never trips while ejected.
func TestOutlierConcurrentSafe(t *testing.T) {
	c := DefaultOutlierConfig()
	c.Consecutive5xx = 2
	var o Outlier
	var wg sync.WaitGroup
	var mu sync.Mutex
	now := t0
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				out := OutcomeServerError
				if (i+g)%7 == 0 {
					out = OutcomeSuccess
				}
				if _, trip := o.Record(&c, out); trip {
					mu.Lock()
					until, _, _ := o.Eject(&c, now)
					now = until
					o.Return(now)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if o.Ejected() {
		t.Error("left ejected")
	}
}
