package testutil

import (
	"slices"
	"sync"
	"testing"
	"time"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestClockNowAdvanceSet(t *testing.T) {
	c := NewClock(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), start.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Advance(90s): Now = %v, want %v", got, want)
	}
	c.Advance(-time.Hour)
	if got, want := c.Now(), start.Add(90*time.Second-time.Hour); !got.Equal(want) {
		t.Fatalf("after Advance(-1h): Now = %v, want %v", got, want)
	}
	later := start.Add(24 * time.Hour)
	c.Set(later)
	if got := c.Now(); !got.Equal(later) {
		t.Fatalf("after Set: Now = %v, want %v", got, later)
	}
	var now func() time.Time = c.Now // the shape the packages inject
	if !now().Equal(later) {
		t.Fatal("Now as a func() time.Time reads another time")
	}
}

// TestClockTimers: timers fire when the clock reaches them, in due order,
// on the goroutine that moves the clock; a stopped timer never fires, and
// stop reports whether it stopped a live timer.
func TestClockTimers(t *testing.T) {
	c := NewClock(start)
	var fired []string
	var after func(time.Duration, func()) func() bool = c.AfterFunc // the shape the packages inject
	after(3*time.Second, func() { fired = append(fired, "3s") })
	after(time.Second, func() { fired = append(fired, "1s:"+c.Now().Sub(start).String()) })
	stop := after(2*time.Second, func() { fired = append(fired, "2s") })
	after(10*time.Second, func() { fired = append(fired, "10s") })
	if n := c.Pending(); n != 4 {
		t.Fatalf("Pending = %d, want 4", n)
	}
	if !stop() {
		t.Error("stop of an armed timer = false, want true")
	}
	if stop() {
		t.Error("second stop = true, want false")
	}
	c.Advance(999 * time.Millisecond)
	if len(fired) != 0 {
		t.Fatalf("fired %v before any timer was due", fired)
	}
	c.Advance(4 * time.Second)
	if want := []string{"1s:4.999s", "3s"}; !slices.Equal(fired, want) {
		t.Fatalf("fired %v, want %v (due order, clock already moved)", fired, want)
	}
	if n := c.Pending(); n != 1 {
		t.Fatalf("Pending = %d, want 1 (the 10 s timer)", n)
	}
	c.Set(start.Add(10 * time.Second))
	if want := []string{"1s:4.999s", "3s", "10s"}; !slices.Equal(fired, want) {
		t.Fatalf("after Set: fired %v, want %v", fired, want)
	}
	if n := c.Pending(); n != 0 {
		t.Fatalf("Pending = %d, want 0", n)
	}
}

// TestClockTimerRearms: a timer's function may use the clock and arm the
// next timer, which fires on a later move.
func TestClockTimerRearms(t *testing.T) {
	c := NewClock(start)
	n := 0
	var tick func()
	tick = func() { n++; c.AfterFunc(time.Second, tick) }
	c.AfterFunc(time.Second, tick)
	for range 3 {
		c.Advance(time.Second)
	}
	if n != 3 {
		t.Fatalf("ticks = %d, want 3", n)
	}
}

// TestClockConcurrentSafe reads and moves the clock from several
// goroutines (run with -race).
func TestClockConcurrentSafe(t *testing.T) {
	c := NewClock(start)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				c.AfterFunc(time.Millisecond, func() {})
				c.Advance(time.Millisecond)
				_ = c.Now()
				_ = c.Pending()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(400*time.Millisecond); !got.Equal(want) {
		t.Fatalf("Now = %v, want %v", got, want)
	}
}
