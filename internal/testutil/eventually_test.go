package testutil

import (
	"fmt"
	"runtime"
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
	began := time.Now()
	f := run(t, func(tb testing.TB) {
		Eventually(tb, 5*time.Second, func() bool { return calls.Add(1) == 3 }, "third call")
	})
	if f.failed {
		t.Fatalf("Eventually failed: %s", f.msg)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("cond called %d times, want 3 (it stops once cond holds)", n)
	}
	if d := time.Since(began); d > time.Second {
		t.Errorf("took %v for a condition true on the third poll, want a few ms", d)
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
			if n := calls.Load(); n < 3 {
				t.Errorf("cond called %d times in 30ms, want several", n)
			}
		})
	}
}

// TestPollLastCallAtDeadline: a condition that becomes true only once the
// timeout has passed is still seen by the call at the deadline.
func TestPollLastCallAtDeadline(t *testing.T) {
	deadline := time.Now().Add(20 * time.Millisecond)
	if !Poll(20*time.Millisecond, func() bool { return !time.Now().Before(deadline) }) {
		t.Fatal("Poll = false for a condition true at the deadline")
	}
	if Poll(10*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll = true for a condition that never holds")
	}
}

// TestPollPauses: the pauses start at 1 ms and grow, so a 200 ms wait
// polls neither once nor in a busy loop.
func TestPollPauses(t *testing.T) {
	n := 0
	Poll(200*time.Millisecond, func() bool { n++; return false })
	// 1+2 ms, then 2 ms pauses (the cap is 200ms/100): about 100 calls.
	if n < 20 || n > 150 {
		t.Fatalf("cond called %d times in 200 ms, want about 100", n)
	}
}
