package quota

import (
	"math"
	"testing"
	"time"
)

// limitsUnderTest are the boundary limits: requests-sized, token-sized,
// primes (no common factor with 6e7: the worst case for the units) and
// the largest kept exactly.
var limitsUnderTest = []int64{1, 2, 7, 60, 1000, 1_000_000, 1_048_576, 123_456_789, 999_999_937, 1_000_000_000, 999_999_999_989, maxLimit}

func TestNewRateExact(t *testing.T) {
	for _, limit := range limitsUnderTest {
		r := newRate(limit)
		w := minuteMicros / r.tick
		switch {
		case r.full != limit*r.cell:
			t.Errorf("limit %d: full %d != limit*cell %d", limit, r.full, limit*r.cell)
		case r.full != r.per*w:
			t.Errorf("limit %d: a minute refills %d, not full %d", limit, r.per*w, r.full)
		case r.full > maxFull:
			t.Errorf("limit %d: full %d over maxFull", limit, r.full)
		case r.limit() != limit:
			t.Errorf("limit %d: rate's limit %d", limit, r.limit())
		}
		if r.tick > 1 {
			// The tick is the finest that fits.
			finer := minuteMicros / (r.tick / 10)
			if c := finer / gcd(limit, finer); c <= maxFull/limit {
				t.Errorf("limit %d: tick %d µs, but %d µs fits", limit, r.tick, r.tick/10)
			}
		}
	}
	if r := newRate(2 * maxLimit); r != newRate(maxLimit) {
		t.Errorf("a limit over maxLimit: %+v, want maxLimit's %+v", r, newRate(maxLimit))
	}
	if r := newRate(0); r != (rate{}) {
		t.Errorf("no limit: %+v", r)
	}
	if r := newRate(-5); r != (rate{}) {
		t.Errorf("a negative limit: %+v", r)
	}
}

// TestExactlyLimitAtOneInstant takes the whole bucket at one instant, one
// at a time where that is cheap and in parts where it is not: exactly
// limit is allowed and the next one refused.
func TestExactlyLimitAtOneInstant(t *testing.T) {
	for _, limit := range limitsUnderTest {
		r := newRate(limit)
		if limit <= 1_048_576 {
			var d int64
			for i := range limit {
				var ok bool
				if d, ok = r.take(d, 1); !ok {
					t.Fatalf("limit %d: take %d of %d refused", limit, i+1, limit)
				}
			}
			if _, ok := r.take(d, 1); ok {
				t.Errorf("limit %d: take %d allowed", limit, limit+1)
			}
			if r.remaining(d) != 0 {
				t.Errorf("limit %d: %d remaining after limit", limit, r.remaining(d))
			}
		}
		// In parts: limit-1 then 1, then 1 more refused.
		d, ok := r.take(0, limit-1)
		if ok {
			d, ok = r.take(d, 1)
		}
		if !ok {
			t.Errorf("limit %d: limit-1 then 1 refused", limit)
		}
		if _, ok := r.take(d, 1); ok {
			t.Errorf("limit %d: limit+1 in parts allowed", limit)
		}
		// At once, and the whole bucket's reset is a minute.
		if d, ok := r.take(0, limit); !ok || r.until(d, 0, 0) != minuteMicros || r.remaining(d) != 0 {
			t.Errorf("limit %d: the whole bucket at once: ok %v, reset %d µs, remaining %d", limit, ok, r.until(d, 0, 0), r.remaining(d))
		}
		if !r.tooBig(limit+1) || r.tooBig(limit) {
			t.Errorf("limit %d: tooBig(limit+1) %v, tooBig(limit) %v", limit, r.tooBig(limit+1), r.tooBig(limit))
		}
	}
}

// TestRefillOneInterval: after a full bucket, one emission interval (60
// s/limit, rounded up to the tick) lets exactly one more in, and a tick
// less does not.
func TestRefillOneInterval(t *testing.T) {
	for _, limit := range []int64{1, 7, 60, 1000, 1_000_000} {
		r := newRate(limit)
		const now = 1_700_000_000_000_000 // µs
		full, _ := r.take(0, limit)
		b := bucket{debt: full, at: now, r: r}
		after, _ := r.take(full, 1)
		wait := r.until(after-r.full, now, now) // µs
		if want := ceilDiv(minuteMicros, limit); wait != want {
			t.Errorf("limit %d: wait %d µs, want T rounded up %d µs", limit, wait, want)
		}
		if _, ok := r.take(b.debtAt(r, now+wait-r.tick), 1); ok {
			t.Errorf("limit %d: allowed a tick before T", limit)
		}
		d, ok := r.take(b.debtAt(r, now+wait), 1)
		if !ok {
			t.Errorf("limit %d: refused after T", limit)
		}
		if _, ok := r.take(d, 1); ok {
			t.Errorf("limit %d: two allowed after one T", limit)
		}
	}
}

func TestRetryAfterAtLeastAMillisecond(t *testing.T) {
	r := newRate(1_000_000_000) // T = 60 ns
	full, _ := r.take(0, 1_000_000_000)
	after, _ := r.take(full, 1)
	if got := r.retryAfter(after, 0, 0); got != time.Millisecond {
		t.Errorf("retry after %v, want the 1 ms floor", got)
	}
}

func TestSettle(t *testing.T) {
	r := newRate(1000)
	full, _ := r.take(0, 1000)
	tests := []struct {
		name        string
		debt, delta int64
		want        int64
	}{
		{"give back part", full, -400, full - 400*r.cell},
		{"give back all", full, -1000, 0},
		{"give back more than taken: never fuller than the limit", full, -5000, 0},
		{"give back to a full bucket", 0, -1, 0},
		{"overrun", full, 500, full + 500*r.cell},
		{"nothing", full, 0, full},
		{"a huge overrun is capped", full, math.MaxInt64, maxDebt},
		{"a huge give-back", full, math.MinInt64, 0},
		{"at the cap", maxDebt, 1, maxDebt},
	}
	for _, tt := range tests {
		if got := r.settle(tt.debt, tt.delta); got != tt.want {
			t.Errorf("%s: settle(%d, %d) = %d, want %d", tt.name, tt.debt, tt.delta, got, tt.want)
		}
	}
}

func TestDebtAt(t *testing.T) {
	r := newRate(60) // T = 1 s; tick 1 µs
	b := bucket{debt: 10 * r.cell, at: 1_000_000, r: r}
	tests := []struct {
		name string
		now  int64
		r    rate
		want int64
	}{
		{"no time", 1_000_000, r, 10 * r.cell},
		{"3 s later: 3 back", 4_000_000, r, 7 * r.cell},
		{"long after", 1e15, r, 0},
		{"clock went back: no refill", 500_000, r, 10 * r.cell},
		{"limit doubled: same fraction of a minute", 1_000_000, newRate(120), 20 * newRate(120).cell},
		{"limit halved", 1_000_000, newRate(30), 5 * newRate(30).cell},
	}
	for _, tt := range tests {
		if got := b.debtAt(tt.r, tt.now); got != tt.want {
			t.Errorf("%s: debt %d, want %d", tt.name, got, tt.want)
		}
	}
	b.rebase(500_000)
	if b.at != 500_000 || b.debt != 10*r.cell {
		t.Errorf("rebase: %+v", b)
	}
	if got := b.debtAt(r, 1_500_000); got != 9*r.cell {
		t.Errorf("after a rebase, 1 s refills 1: debt %d", got)
	}
}

func TestDelta(t *testing.T) {
	tests := []struct{ used, reserved, want int64 }{
		{10, 4, 6},
		{4, 10, -6},
		{math.MaxInt64, -1, math.MaxInt64},
		{math.MinInt64, 1, math.MinInt64},
		{-3, 0, -3},
	}
	for _, tt := range tests {
		if got := delta(tt.used, tt.reserved); got != tt.want {
			t.Errorf("delta(%d, %d) = %d, want %d", tt.used, tt.reserved, got, tt.want)
		}
	}
}
