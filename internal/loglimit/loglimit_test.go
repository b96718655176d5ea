package loglimit

import (
	"testing"
	"time"
)

func TestLimiter(t *testing.T) {
	l := Limiter{Interval: time.Minute}
	t0 := time.Unix(1000, 0)
	for i, step := range []struct {
		at         time.Duration
		ok         bool
		suppressed int
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{59 * time.Second, false, 0},
		{time.Minute, true, 2},
		{time.Minute + time.Second, false, 0},
	} {
		n, ok := l.Allow(t0.Add(step.at))
		if ok != step.ok || n != step.suppressed {
			t.Errorf("step %d at %s: Allow = %d, %t; want %d, %t", i, step.at, n, ok, step.suppressed, step.ok)
		}
	}
	if n := l.Flush(); n != 1 {
		t.Errorf("Flush = %d, want 1 (the line held back after the second let through)", n)
	}
	if n := l.Flush(); n != 0 {
		t.Errorf("second Flush = %d, want 0", n)
	}
}
