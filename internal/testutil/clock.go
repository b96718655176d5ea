package testutil

import (
	"slices"
	"sync"
	"time"
)

// Clock is a fake clock that a test moves by hand. Inject its Now method
// where a package takes a func() time.Time, and its AfterFunc where it
// takes a timer constructor of the shape func(time.Duration, func()) (stop
// func() bool). Timers fire only when the test moves the clock, on the
// goroutine that moves it, so nothing waits on the wall clock. Safe for
// concurrent use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*clockTimer
}

type clockTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

// NewClock returns a Clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d (back when d is negative) and then runs
// the timers that are due, in the order of their due times.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.fireLocked() // unlocks
}

// Set moves the clock to t (back when t is before Now) and then runs the
// timers that are due, in the order of their due times.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.fireLocked() // unlocks
}

// fireLocked takes the due timers off the list, releases c.mu and runs
// them (a timer's f may use the clock).
func (c *Clock) fireLocked() {
	var due []*clockTimer
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			keep = append(keep, t)
		}
	}
	clear(c.timers[len(keep):])
	c.timers = keep
	c.mu.Unlock()
	slices.SortStableFunc(due, func(a, b *clockTimer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		t.f()
	}
}

// AfterFunc arms a timer that runs f once the clock reaches Now()+d, on
// the goroutine that moves the clock there; d <= 0 runs it at the next
// Advance or Set. It returns the timer's stop function, which reports
// whether it stopped the timer (false once it has fired or was stopped),
// as time.Timer.Stop does.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &clockTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// Pending returns how many timers are armed: neither fired nor stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.stopped {
			n++
		}
	}
	return n
}
