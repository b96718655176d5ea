package testutil

import (
	"fmt"
	"testing"
	"time"
)

// Poll calls cond until it returns true or timeout has passed, and reports
// whether it did. It calls cond at once, then after pauses that double
// from 1 ms up to timeout/100 (at least 1 ms, at most 100 ms), so a
// condition that soon holds is seen within a few milliseconds and a long
// wait does not spin; cond is called once more at the deadline. Use it
// where the test handles the failure itself; Eventually fails the test.
func Poll(timeout time.Duration, cond func() bool) bool {
	return poll(time.Now, time.Sleep, timeout, cond)
}

// poll is Poll on the clock of now and sleep.
func poll(now func() time.Time, sleep func(time.Duration), timeout time.Duration, cond func() bool) bool {
	maxPause := min(max(timeout/100, time.Millisecond), 100*time.Millisecond)
	pause := time.Millisecond
	deadline := now().Add(timeout)
	for {
		if cond() {
			return true
		}
		left := deadline.Sub(now())
		if left <= 0 {
			return false
		}
		sleep(min(pause, left))
		pause = min(2*pause, maxPause)
	}
}

// Eventually polls cond as Poll does and fails the test with t.Fatalf if
// it does not hold within timeout. msgAndArgs says what was awaited: a
// format string and its arguments ("engine %s ejected", name), or any
// values, printed as fmt.Sprint does. Like t.Fatalf, call it from the
// test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msgAndArgs ...any) {
	t.Helper()
	if Poll(timeout, cond) {
		return
	}
	if what := message(msgAndArgs); what != "" {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
	t.Fatalf("timed out after %v waiting for the condition", timeout)
}

// message formats msgAndArgs: a format string and its arguments, or values.
func message(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	if format, ok := msgAndArgs[0].(string); ok {
		return fmt.Sprintf(format, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}
