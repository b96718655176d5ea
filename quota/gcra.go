package quota

import (
	"math"
	"time"
)

// The per-minute bucket math both stores share (Redis runs the same steps
// in Lua: gcra.lua). It is GCRA kept exact in integers; see the package
// documentation, # Algorithm, for why it is written as a debt rather than a
// theoretical arrival time.
//
// Units: times are integer microseconds (µs) on the store's clock (Unix
// µs: Memory's monotonic clock offset to the wall time it started at, or
// Redis's TIME), so every value fits the 53 bits a Lua number holds
// exactly. A bucket's debt is in scaled units chosen per limit so that one
// request (or token) and one tick's refill are both whole numbers.
const (
	minuteMicros = 60_000_000
	// maxFull caps a full bucket's debt: rates pick a coarser tick until
	// limit*cell fits, so a debt plus any admissible cost stays below 2^53.
	maxFull = 1 << 46
	// maxDebt caps a bucket's debt (an overrun settled by Release): at
	// least 64 minutes' worth of any limit (maxDebt/maxFull).
	maxDebt = 1 << 52
	// maxLimit is the largest limit kept exactly; a larger one acts as
	// this one (at a one-second tick, limit*cell <= 6e13 < maxFull).
	maxLimit = 1_000_000_000_000
	maxTick  = 1_000_000 // µs: the coarsest tick, one second
)

// rate is a per-minute limit in the units of its bucket's debt. The
// bucket's emission interval T (60 s/limit) is cell/per ticks, exactly: a
// request (or token) adds cell to the debt, each tick takes per off it,
// and the bucket is empty (nothing can be taken) at debt full =
// limit*cell, one minute of refill. The zero rate is no limit.
type rate struct {
	tick int64 // µs per tick: 1, 10, ... 10^6
	cell int64 // debt one request (or token) adds: (60 s/tick)/g
	per  int64 // debt one tick repays: limit/g
	full int64 // limit*cell = per*(60 s/tick), <= maxFull
}

// newRate returns limit's rate: the finest tick at which limit*cell fits
// maxFull (the tick is only coarser than 1 µs for limits above about a
// million whose gcd with 6e7 is small). limit <= 0 is no limit.
func newRate(limit int64) rate {
	if limit <= 0 {
		return rate{}
	}
	limit = min(limit, maxLimit)
	for tick := int64(1); ; tick *= 10 {
		w := minuteMicros / tick // ticks per minute
		g := gcd(limit, w)
		cell, per := w/g, limit/g
		if cell <= maxFull/limit || tick == maxTick {
			return rate{tick: tick, cell: cell, per: per, full: limit * cell}
		}
	}
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// limit is the limit r was made for (after the maxLimit cap).
func (r rate) limit() int64 { return r.full / r.cell }

// bucket is one per-minute limit's state: its debt (how far its
// theoretical arrival time is ahead of at, in r's units) as of at. The
// zero bucket is full.
type bucket struct {
	debt int64 // >= 0, <= maxDebt
	at   int64 // µs, a multiple of r.tick
	r    rate  // the units of debt
}

// debtAt returns b's debt at now (µs), in r's units: b's debt less the
// whole ticks since b.at (exact: the refill is per per tick), rescaled when
// b was kept in another rate's units (a limit changed by a reload keeps
// its bucket's fill: the same fraction of a minute's debt, rounded up).
// A clock behind b.at refills nothing.
func (b bucket) debtAt(r rate, now int64) int64 {
	d := b.debt
	if d <= 0 || b.r.per == 0 {
		return 0
	}
	if q := floorTo(now, b.r.tick); q > b.at {
		if el := (q - b.at) / b.r.tick; el >= ceilDiv(d, b.r.per) {
			return 0
		} else {
			d -= el * b.r.per
		}
	}
	if b.r.per != r.per || b.r.tick != r.tick {
		// Another unit of debt. (Two limits can share one: debt/per ticks
		// is the time ahead, so equal per and tick mean the same debt.)
		d = rescale(d, b.r.full, r.full)
	}
	return d
}

// rebase moves b.at back to now's tick when the clock went back past it
// (a stepped wall clock), so the bucket refills again from now instead of
// waiting for the clock to catch up. It changes no debt.
func (b *bucket) rebase(now int64) {
	if b.r.per != 0 {
		if q := floorTo(now, b.r.tick); q < b.at {
			b.at = q
		}
	}
}

// rescale converts a debt from a bucket of full debt from to one of full
// debt to, keeping its fraction of a minute (rounded up, capped). It is
// float64 math on purpose: Lua does the very same IEEE operations.
func rescale(d, from, to int64) int64 {
	v := math.Ceil(float64(d) / float64(from) * float64(to))
	return int64(min(max(v, 0), maxDebt))
}

// take returns the debt after taking n requests (or tokens) from debt d,
// and whether that is allowed: the debt after stays within full (GCRA:
// tat' - now <= 60 s). n <= 0 takes nothing but still needs a debt within
// full (a bucket an overrun left in debt refuses everything). The caller
// has refused n > limit already (never allowed: tooBig).
func (r rate) take(d, n int64) (after int64, ok bool) {
	after = d + max(n, 0)*r.cell // <= maxDebt + maxFull < 2^53
	return after, after <= r.full
}

// tooBig reports whether n is more than the bucket can ever hold.
func (r rate) tooBig(n int64) bool { return n > r.limit() }

// settle returns debt d with delta requests (or tokens) put in (delta > 0)
// or given back (delta < 0): never below zero (the bucket is never fuller
// than its limit: tat not before now) nor above maxDebt.
func (r rate) settle(d, delta int64) int64 {
	switch {
	case delta > 0:
		if d >= maxDebt || delta > (maxDebt-d)/r.cell {
			return maxDebt
		}
		return d + delta*r.cell
	case delta < 0:
		if delta <= -ceilDiv(d, r.cell) {
			return 0
		}
		return d + delta*r.cell
	}
	return d
}

// remaining is what could be taken at once from debt d.
func (r rate) remaining(d int64) int64 {
	if d >= r.full {
		return 0
	}
	return (r.full - d) / r.cell
}

// until is the time, in µs from now, until debt d (as of q, now's tick)
// has been repaid; 0 for no debt.
func (r rate) until(d, q, now int64) int64 {
	if d <= 0 {
		return 0
	}
	return max(q+ceilDiv(d, r.per)*r.tick-now, 0)
}

// retryAfter is the wait before debt after (as of q) is back within full,
// the refused cost's RetryAfter: at least a millisecond.
func (r rate) retryAfter(after, q, now int64) time.Duration {
	return max(micros(r.until(after-r.full, q, now)), time.Millisecond)
}

// state returns the Bucket the headers report for debt d as of q.
func (r rate) state(limit, d, q, now int64) Bucket {
	if r.per == 0 {
		return Bucket{}
	}
	return Bucket{Limit: limit, Remaining: r.remaining(d), Reset: micros(r.until(d, q, now))}
}

// floorTo is t rounded down to a multiple of tick (t >= 0).
func floorTo(t, tick int64) int64 { return t - t%tick }

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// micros converts µs to a Duration, saturating.
func micros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// decide is one Admit over the two buckets (req in rr's units, tok in
// tr's; a zero rate is no limit), the spend check's verdict (spend.go) and
// the key's requests in flight: the Decision and, when it is allowed, the
// buckets to keep. The checks run in the contract's order, requests,
// tokens, spend, concurrent, and all of them before anything is taken. The
// caller adds the lease and the spend and sets Decision.InFlight and
// Decision.Spend.
func decide(l Limits, tokens int64, rr, tr rate, req, tok bucket, sp spendVerdict, inFlight, now int64) (d Decision, nreq, ntok bucket) {
	var rd, rq, td, tq int64
	rafter, rok := int64(0), true
	tafter, tok2 := int64(0), true
	if rr.per != 0 {
		rq, rd = floorTo(now, rr.tick), req.debtAt(rr, now)
		rafter, rok = rr.take(rd, 1)
	}
	if tr.per != 0 {
		tq, td = floorTo(now, tr.tick), tok.debtAt(tr, now)
		if !tr.tooBig(tokens) {
			tafter, tok2 = tr.take(td, tokens)
		}
	}
	nreq, ntok = req, tok
	switch {
	case !rok:
		d.Refused, d.RetryAfter = RefusedRequests, rr.retryAfter(rafter, rq, now)
	case tr.per != 0 && tr.tooBig(tokens):
		d.Refused = RefusedTokens // never: RetryAfter 0
	case !tok2:
		d.Refused, d.RetryAfter = RefusedTokens, tr.retryAfter(tafter, tq, now)
	case sp.refused:
		d.Refused, d.RetryAfter = RefusedSpend, sp.retryAfter
	case l.Concurrent > 0 && inFlight >= l.Concurrent:
		d.Refused = RefusedConcurrent
	default:
		d.Allowed = true
		if rr.per != 0 {
			rd, nreq = rafter, bucket{debt: rafter, at: rq, r: rr}
		}
		// A reservation of nothing leaves the bucket as it is stored (as
		// gcra.lua does: no write).
		if tr.per != 0 && tokens > 0 {
			td, ntok = tafter, bucket{debt: tafter, at: tq, r: tr}
		}
	}
	d.Requests = rr.state(l.RequestsPerMinute, rd, rq, now)
	d.Tokens = tr.state(l.TokensPerMinute, td, tq, now)
	if l.Concurrent > 0 {
		d.InFlight = inFlight
	}
	return d, nreq, ntok
}

// settled returns b with delta tokens put in or given back at now, kept in
// r's units.
func (b bucket) settled(r rate, delta, now int64) bucket {
	return bucket{debt: r.settle(b.debtAt(r, now), delta), at: floorTo(now, r.tick), r: r}
}

// full reports whether b has no debt left at now (an idle key's bucket).
func (b bucket) full(now int64) bool { return b.debtAt(b.r, now) == 0 }

// delta is used-reserved, saturating.
func delta(used, reserved int64) int64 {
	d := used - reserved
	switch {
	case used >= 0 && reserved < 0 && d < 0:
		return math.MaxInt64
	case used < 0 && reserved > 0 && d >= 0:
		return math.MinInt64
	}
	return d
}
