package quota

import "time"

// config holds what tests and the gateway inject through Options.
type config struct {
	now     func() time.Time
	onError func(error)
}

// Option configures a store built by [NewMemory] or [NewRedis].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithClock sets the clock the store reads its time from (default
// time.Now). Memory keeps its buckets on it; Redis keeps its buckets on
// Redis's own clock and uses this one only for its local refusals and its
// down_for period. The clock's differences are what count (a time.Now
// clock is read monotonically). A nil now is ignored.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) {
		if now != nil {
			c.now = now
		}
	})
}

// WithErrorHook sets a function Redis calls with every error of a round
// trip (admission, release, lease renewal), each wrapping ErrUnavailable,
// for a metric and a bounded log line: the store itself logs nothing. It is
// not called for the fast failures of the down_for period, nor for a
// context the caller cancelled. It is called synchronously, possibly from
// several goroutines at once, and must be quick. Memory never calls it. A
// nil hook is ignored.
func WithErrorHook(hook func(error)) Option {
	return optionFunc(func(c *config) {
		if hook != nil {
			c.onError = hook
		}
	})
}

func newConfig(opts []Option) config {
	c := config{now: time.Now}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// clock reads a config's time as the stores count it.
type clock struct {
	now   func() time.Time
	epoch time.Time // the first reading
	base  int64     // epoch in Unix µs
}

func newClock(now func() time.Time) clock {
	e := now()
	return clock{now: now, epoch: e, base: e.UnixMicro()}
}

// micros is now in Unix µs: the epoch's wall time plus the (monotonic,
// for time.Now) time since.
func (c clock) micros() int64 { return c.base + c.now().Sub(c.epoch).Microseconds() }

// nanos is the time since the epoch, in ns.
func (c clock) nanos() int64 { return int64(c.now().Sub(c.epoch)) }
