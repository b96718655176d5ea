package testutil

import (
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// fakeTB records a fatal failure instead of failing the real test; its
// Fatalf ends the goroutine, as testing.T's does.
type fakeTB struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.failed, f.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

// run calls fn with a fakeTB on its own goroutine (its Fatalf exits the
// goroutine) and returns the fakeTB once fn is done.
func run(t *testing.T, fn func(testing.TB)) *fakeTB {
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

func TestEventuallyHolds(t *testing.T) {
	var calls atomic.Int32
	f := run(t, func(tb testing.TB) {
		Eventually(tb, 5*time.Second, func() bool { return calls.Add(1) == 3 }, "third call")
	})
	if f.failed {
		t.Fatalf("Eventually failed: %s", f.msg)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times, want 3 (it stops once cond holds)", n)
	}
}

func TestEventuallyFails(t *testing.T) {
	for _, c := range []struct {
		name string
		args []any
		want string
	}{
		{"format", []any{"engine %s ejected", "e1"}, "timed out after 30ms waiting for engine e1 ejected"},
		{"values", []any{42, "x"}, "timed out after 30ms waiting for 42x"},
		{"none", nil, "timed out after 30ms waiting for the condition"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls atomic.Int32
			began := time.Now()
			f := run(t, func(tb testing.TB) {
				Eventually(tb, 30*time.Millisecond, func() bool { calls.Add(1); return false }, c.args...)
				t.Error("Eventually returned on a condition that never holds")
			})
			elapsed := time.Since(began)
			if !f.failed || f.msg != c.want {
				t.Errorf("failed=%t message %q, want a failure %q", f.failed, f.msg, c.want)
			}
			if elapsed < 30*time.Millisecond {
				t.Errorf("gave up after %v, before the 30ms timeout", elapsed)
			}
			if n := calls.Load(); n < 2 {
				t.Errorf("cond called %d times, want at least 2 (at once and at the deadline)", n)
			}
		})
	}
}

// TestPollPauses runs poll on a fake clock: the pauses double from 1 ms
// up to timeout/100 (at least 1 ms, at most 100 ms), the last is cut to
// the deadline, and cond is called at once and once more at the deadline.
func TestPollPauses(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		timeout time.Duration
		want    []time.Duration
	}{
		{10 * ms, []time.Duration{ms, ms, ms, ms, ms, ms, ms, ms, ms, ms}},
		{200 * ms, []time.Duration{ms, 2 * ms, 2 * ms, 2 * ms}},
		{time.Second, []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 10 * ms}},
		{400 * ms, []time.Duration{ms, 2 * ms, 4 * ms, 4 * ms}},
		{time.Minute, []time.Duration{ms, 2 * ms, 4 * ms, 8 * ms, 16 * ms, 32 * ms, 64 * ms, 100 * ms}},
	} {
		clk := NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		var pauses []time.Duration
		calls := 0
		sleep := func(d time.Duration) { pauses = append(pauses, d); clk.Advance(d) }
		if poll(clk.Now, sleep, c.timeout, func() bool { calls++; return false }) {
			t.Fatalf("%v: poll = true for a condition that never holds", c.timeout)
		}
		if len(pauses) < len(c.want) || !slices.Equal(pauses[:len(c.want)], c.want) {
			t.Errorf("%v: pauses start %v, want %v", c.timeout, head(pauses, len(c.want)), c.want)
		}
		var sum time.Duration
		for _, p := range pauses {
			sum += p
		}
		if sum != c.timeout || calls != len(pauses)+1 {
			t.Errorf("%v: %d calls over pauses summing to %v, want %d calls over exactly the timeout", c.timeout, calls, sum, len(pauses)+1)
		}
	}
}

func head(d []time.Duration, n int) []time.Duration { return d[:min(n, len(d))] }

// TestPollHoldsAtDeadline: a condition that becomes true only at the
// deadline is still seen, by the call at the deadline.
func TestPollHoldsAtDeadline(t *testing.T) {
	clk := NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	deadline := clk.Now().Add(time.Second)
	if !poll(clk.Now, clk.Advance, time.Second, func() bool { return !clk.Now().Before(deadline) }) {
		t.Fatal("poll = false for a condition true at the deadline")
	}
	if !Poll(time.Second, func() bool { return true }) {
		t.Fatal("Poll = false for a condition that holds")
	}
}
