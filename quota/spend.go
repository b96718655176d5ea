package quota

import (
	"math"
	"strconv"
	"time"
)

// The spend budgets' math both stores share (Redis runs the same steps in
// Lua: spend.lua). Windows are UTC calendar days and months of the store's
// clock (Unix µs); a window is named by its id, YYYYMMDD or YYYYMM as an
// integer, and kept spendGrace past its end so a request admitted in it can
// still settle there.

// spendGrace is how long a spend window is kept after it ends: the longest
// a request may run and still settle into the window it reserved in.
const spendGrace = 24 * time.Hour

// windows are the day and month windows holding one instant.
type windows struct {
	day, month       int64 // ids: YYYYMMDD, YYYYMM
	dayEnd, monthEnd int64 // Unix µs
}

// windowsAt returns the windows holding now (Unix µs).
func windowsAt(now int64) windows {
	y, m, d := time.UnixMicro(now).UTC().Date()
	return windows{
		day:      int64(y)*10000 + int64(m)*100 + int64(d),
		month:    int64(y)*100 + int64(m),
		dayEnd:   time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC).UnixMicro(),
		monthEnd: time.Date(y, m+1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(),
	}
}

// parseDay returns the id and end (Unix µs) of the day window named s
// ("YYYYMMDD"), or ok false for a malformed name.
func parseDay(s string) (id, end int64, ok bool) {
	if len(s) != 8 {
		return 0, 0, false
	}
	t, err := time.Parse("20060102", s)
	if err != nil {
		return 0, 0, false
	}
	id, _ = strconv.ParseInt(s, 10, 64)
	return id, t.AddDate(0, 0, 1).UnixMicro(), true
}

// parseMonth is parseDay for a month window ("YYYYMM").
func parseMonth(s string) (id, end int64, ok bool) {
	if len(s) != 6 {
		return 0, 0, false
	}
	t, err := time.Parse("200601", s)
	if err != nil {
		return 0, 0, false
	}
	id, _ = strconv.ParseInt(s, 10, 64)
	return id, t.AddDate(0, 1, 0).UnixMicro(), true
}

// spendVerdict is the spend check's result for decide.
type spendVerdict struct {
	refused    bool
	retryAfter time.Duration
}

// checkSpend checks a reservation of spend (negative: 0) against l's spend
// limits, given the windows' totals (spent + reserved) at now: refused when
// total + spend would pass a limit; RetryAfter the refusing window's end
// (the later of both), or 0 when spend passes a refusing limit by itself
// (never admitted).
func checkSpend(l Limits, spend, day, month int64, w windows, now int64) spendVerdict {
	n := max(spend, 0)
	var v spendVerdict
	never := false
	var until int64
	// n > limit - total: never overflows (total >= 0, limit > 0).
	if l.SpendPerDay > 0 && n > l.SpendPerDay-day {
		v.refused, never, until = true, never || n > l.SpendPerDay, max(until, w.dayEnd-now)
	}
	if l.SpendPerMonth > 0 && n > l.SpendPerMonth-month {
		v.refused, never, until = true, never || n > l.SpendPerMonth, max(until, w.monthEnd-now)
	}
	if v.refused && !never {
		v.retryAfter = max(micros(until), time.Millisecond)
	}
	return v
}

// settleSpend returns total with delta added: saturating, never below 0.
func settleSpend(total, delta int64) int64 {
	switch {
	case delta > 0 && total > math.MaxInt64-delta:
		return math.MaxInt64
	case total+delta < 0:
		return 0
	}
	return total + delta
}

// addSpend returns total + n (n >= 0), saturating.
func addSpend(total, n int64) int64 { return settleSpend(total, n) }
