// Package loglimit bounds how often a repeated log line is written: the
// first gets through, then at most one per interval, each carrying the
// count of the lines held back since the previous one.
package loglimit

import (
	"sync"
	"time"
)

// Limiter decides, for one kind of line, whether to log it now. The zero
// value with Interval set is ready to use; it is safe for concurrent use.
type Limiter struct {
	// Interval is the least time between two lines let through.
	Interval time.Duration

	mu         sync.Mutex
	last       time.Time // when the last line was let through; zero before
	suppressed int
}

// Allow reports whether to log a line at now, and, when it does, how many
// lines were held back since the last one let through (to log with it).
func (l *Limiter) Allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < l.Interval {
		l.suppressed++
		return 0, false
	}
	suppressed, l.last, l.suppressed = l.suppressed, now, 0
	return suppressed, true
}

// Flush returns the number of lines held back since the last one let
// through, and resets it (for a last line at shutdown).
func (l *Limiter) Flush() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.suppressed
	l.suppressed = 0
	return n
}
