package quota

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// newFakeClock returns the clock the tests move by hand, 20 s into a
// minute.
func newFakeClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_700_000_000, 0)) }

// A boundaryStep is an Ask for tokens (repeated n times: all but the last
// must be allowed), or a Release settling reserved to used, after wait on
// the clock.
type boundaryStep struct {
	wait    time.Duration // Memory only: Redis keeps its own time
	tokens  int64
	n       int // repeats; 0 is 1
	release *Release
	reload  Limits   // when set, this Ask and the later ones have these limits
	want    Decision // for the last repeat (Limit fields filled in)
	// memoryOnly: the step's outcome flips within a millisecond of Redis
	// time, or follows a wait.
	memoryOnly bool
}

// A boundaryCase is a key's sequence of steps against fresh state.
type boundaryCase struct {
	name   string
	limits Limits
	steps  []boundaryStep
	// memoryOnly: the case needs a still clock (many asks within one
	// emission interval, or waits).
	memoryOnly bool
}

func allowed(req, tok Bucket) Decision { return Decision{Allowed: true, Requests: req, Tokens: tok} }

func refused(by Refused, retry time.Duration, req, tok Bucket) Decision {
	return Decision{Refused: by, RetryAfter: retry, Requests: req, Tokens: tok}
}

func rb(remaining int64, reset time.Duration) Bucket {
	return Bucket{Remaining: remaining, Reset: reset}
}

var none Bucket

var boundaryCases = []boundaryCase{
	{name: "requests 1", limits: Limits{RequestsPerMinute: 1}, steps: []boundaryStep{
		{want: allowed(rb(0, time.Minute), none)},
		{want: refused(RefusedRequests, time.Minute, rb(0, time.Minute), none)},
		{wait: time.Minute - time.Microsecond, want: refused(RefusedRequests, time.Microsecond*1000, rb(0, time.Microsecond), none), memoryOnly: true},
		{wait: time.Microsecond, want: allowed(rb(0, time.Minute), none), memoryOnly: true},
	}},
	{name: "requests 7", limits: Limits{RequestsPerMinute: 7}, steps: []boundaryStep{
		{want: allowed(rb(6, 8571429*time.Microsecond), none)},
		{n: 6, want: allowed(rb(0, time.Minute), none)},
		// T = 60 s/7 = 8.571428571 s, rounded up to the µs.
		{want: refused(RefusedRequests, 8571429*time.Microsecond, rb(0, time.Minute), none)},
		{wait: 8571428 * time.Microsecond, want: refused(RefusedRequests, time.Millisecond, rb(0, 51428572*time.Microsecond), none), memoryOnly: true},
		{wait: time.Microsecond, want: allowed(rb(0, time.Minute), none), memoryOnly: true},
	}},
	{name: "requests 60", limits: Limits{RequestsPerMinute: 60}, steps: []boundaryStep{
		{want: allowed(rb(59, time.Second), none)},
		{n: 59, want: allowed(rb(0, time.Minute), none)},
		{want: refused(RefusedRequests, time.Second, rb(0, time.Minute), none)},
		{wait: time.Second, want: allowed(rb(0, time.Minute), none), memoryOnly: true},
		{want: refused(RefusedRequests, time.Second, rb(0, time.Minute), none), memoryOnly: true},
		{wait: 30 * time.Second, want: allowed(rb(29, 31*time.Second), none), memoryOnly: true},
	}},
	{name: "requests 1000", limits: Limits{RequestsPerMinute: 1000}, memoryOnly: true, steps: []boundaryStep{
		{n: 1000, want: allowed(rb(0, time.Minute), none)},
		{want: refused(RefusedRequests, 60*time.Millisecond, rb(0, time.Minute), none)},
		{wait: 60 * time.Millisecond, want: allowed(rb(0, time.Minute), none)},
	}},
	{name: "tokens 1e9", limits: Limits{TokensPerMinute: 1_000_000_000}, steps: []boundaryStep{
		{tokens: 1_000_000_000, want: allowed(none, rb(0, time.Minute))},
		{tokens: 1_000_000_000, want: refused(RefusedTokens, time.Minute, none, rb(0, time.Minute))},
		// T = 60 ns: one more token is a µs (the tick) away, shown as 1 ms.
		{tokens: 1, want: refused(RefusedTokens, time.Millisecond, none, rb(0, time.Minute)), memoryOnly: true},
		{wait: time.Microsecond, tokens: 16, want: allowed(none, rb(0, time.Minute)), memoryOnly: true},
		{tokens: 1, want: refused(RefusedTokens, time.Millisecond, none, rb(0, time.Minute)), memoryOnly: true},
	}},
	{name: "tokens prime 999999937 (1 ms tick)", limits: Limits{TokensPerMinute: 999_999_937}, steps: []boundaryStep{
		{tokens: 999_999_936, want: allowed(none, rb(1, time.Minute))},
		{tokens: 1, want: allowed(none, rb(0, time.Minute))},
		{tokens: 1, want: refused(RefusedTokens, time.Millisecond, none, rb(0, time.Minute)), memoryOnly: true},
		{wait: time.Millisecond, tokens: 16666, want: allowed(none, rb(0, time.Minute)), memoryOnly: true},
		{tokens: 999_999_937, want: refused(RefusedTokens, time.Minute, none, rb(0, time.Minute))},
	}},
	{name: "a reservation over the limit is never allowed", limits: Limits{TokensPerMinute: 1000}, steps: []boundaryStep{
		{tokens: 1001, want: refused(RefusedTokens, 0, none, rb(1000, 0))},
		{tokens: 1000, want: allowed(none, rb(0, time.Minute))},
		{tokens: 5000, want: refused(RefusedTokens, 0, none, rb(0, time.Minute))},
	}},
	{name: "all or nothing: a tokens refusal takes no request", limits: Limits{RequestsPerMinute: 2, TokensPerMinute: 100}, steps: []boundaryStep{
		{tokens: 60, want: allowed(rb(1, 30*time.Second), rb(40, 36*time.Second))},
		// 120 of 100: 20 tokens (12 s) short; the request is not taken.
		{tokens: 60, want: refused(RefusedTokens, 12*time.Second, rb(1, 30*time.Second), rb(40, 36*time.Second))},
		{tokens: 40, want: allowed(rb(0, time.Minute), rb(0, time.Minute))},
		// Both would refuse: requests first.
		{tokens: 10, want: refused(RefusedRequests, 30*time.Second, rb(0, time.Minute), rb(0, time.Minute))},
	}},
	{name: "settle: give back, overrun, clamp at full", limits: Limits{TokensPerMinute: 1000}, steps: []boundaryStep{
		{tokens: 1000, want: allowed(none, rb(0, time.Minute))},
		{release: &Release{Reserved: 1000, Used: 400}},
		{tokens: 600, want: allowed(none, rb(0, time.Minute))},
		{tokens: 1, want: refused(RefusedTokens, 60*time.Millisecond, none, rb(0, time.Minute)), memoryOnly: true},
		// 500 over: in debt for 30 s, refusing even a reservation of nothing.
		{release: &Release{Reserved: 0, Used: 500}},
		{tokens: 0, want: refused(RefusedTokens, 30*time.Second, none, rb(0, 90*time.Second))},
		// Giving back far more than taken leaves the bucket full, not
		// fuller: 1000 at once, not 1001.
		{release: &Release{Reserved: 100_000, Used: 0}},
		{tokens: 1001, want: refused(RefusedTokens, 0, none, rb(1000, 0))},
		{tokens: 1000, want: allowed(none, rb(0, time.Minute))},
	}},
	{name: "a huge overrun is capped at 2^52", limits: Limits{TokensPerMinute: 1_000_000}, steps: []boundaryStep{
		{release: &Release{Reserved: 0, Used: math.MaxInt64}},
		// cell 60, per 1 µs: the debt 2^52 is repaid in 2^52 µs (142 years).
		{tokens: 0, want: refused(RefusedTokens, (maxDebt-60_000_000)*time.Microsecond, none, rb(0, maxDebt*time.Microsecond))},
		{release: &Release{Reserved: math.MaxInt64, Used: 0}},
		{tokens: 1_000_000, want: allowed(none, rb(0, time.Minute))},
	}},
	{name: "a reload changes the limit: the fill carries over", limits: Limits{RequestsPerMinute: 60}, steps: []boundaryStep{
		{n: 30, want: allowed(rb(30, 30*time.Second), none)},
		// Half a minute's debt is half of the new bucket: 60 left, less
		// this one.
		{reload: Limits{RequestsPerMinute: 120}, want: allowed(rb(59, 30500*time.Millisecond), none)},
		{reload: Limits{RequestsPerMinute: 30}, want: allowed(rb(13, 32500*time.Millisecond), none)},
	}},
}

// runBoundary runs c against st. elapsed, when not nil, is how the store's
// own clock may have moved (Redis): the buckets' Remaining, Reset and
// RetryAfter are then checked within what that time can refill; else
// exactly, with clk moved by the steps' waits.
func runBoundary(t *testing.T, st Store, key string, c boundaryCase, clk *testutil.Clock, redis bool) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	limits := c.limits
	for i, s := range c.steps {
		if redis && s.memoryOnly {
			continue
		}
		if s.wait > 0 {
			clk.Advance(s.wait)
		}
		if !s.reload.IsZero() {
			limits = s.reload
		}
		if s.release != nil {
			r := *s.release
			r.Key, r.Limits = key, limits
			if err := st.Release(ctx, r); err != nil {
				t.Fatalf("%s: step %d: Release: %v", c.name, i, err)
			}
			continue
		}
		n := max(s.n, 1)
		var d Decision
		for j := range n {
			var err error
			d, err = st.Admit(ctx, Ask{Key: key, Limits: limits, Tokens: s.tokens})
			if err != nil {
				t.Fatalf("%s: step %d: Admit: %v", c.name, i, err)
			}
			if j < n-1 && !d.Allowed {
				t.Fatalf("%s: step %d: ask %d of %d refused: %+v", c.name, i, j+1, n, d)
			}
		}
		want := s.want
		if limits.RequestsPerMinute > 0 {
			want.Requests.Limit = limits.RequestsPerMinute
		}
		if limits.TokensPerMinute > 0 {
			want.Tokens.Limit = limits.TokensPerMinute
		}
		if !redis {
			if d != want {
				t.Errorf("%s: step %d:\n got %+v\nwant %+v", c.name, i, d, want)
			}
			continue
		}
		// Redis's clock moved by at most the time since the case began.
		e := time.Since(start)
		if d.Allowed != want.Allowed || d.Refused != want.Refused || d.InFlight != want.InFlight {
			t.Errorf("%s: step %d (%v in):\n got %+v\nwant %+v", c.name, i, e, d, want)
			continue
		}
		checkBucket(t, c.name, i, "requests", d.Requests, want.Requests, e)
		checkBucket(t, c.name, i, "tokens", d.Tokens, want.Tokens, e)
		if !within(d.RetryAfter, want.RetryAfter, e) && !(want.RetryAfter == time.Millisecond && d.RetryAfter == want.RetryAfter) {
			t.Errorf("%s: step %d: retry after %v, want %v less up to %v", c.name, i, d.RetryAfter, want.RetryAfter, e)
		}
	}
}

// within reports whether got is want less at most e (and a millisecond of
// tick), the most e of refill can take off a wait.
func within(got, want, e time.Duration) bool {
	if want == 0 {
		return got == 0
	}
	return got <= want+time.Millisecond && got >= want-e-time.Millisecond
}

func checkBucket(t *testing.T, name string, i int, which string, got, want Bucket, e time.Duration) {
	t.Helper()
	if got.Limit != want.Limit {
		t.Errorf("%s: step %d: %s limit %d, want %d", name, i, which, got.Limit, want.Limit)
	}
	// e can refill up to e*limit/minute, and a tick more: a tick's refill
	// comes at once (and one for rounding).
	e += time.Duration(newRate(want.Limit).tick) * time.Microsecond
	refill := int64(e*time.Duration(want.Limit)/time.Minute) + 1
	if got.Remaining < want.Remaining || got.Remaining > min(want.Remaining+refill, want.Limit) {
		t.Errorf("%s: step %d: %s remaining %d, want %d plus up to %d", name, i, which, got.Remaining, want.Remaining, refill)
	}
	if !within(got.Reset, want.Reset, e) {
		t.Errorf("%s: step %d: %s reset %v, want %v less up to %v", name, i, which, got.Reset, want.Reset, e)
	}
}

func TestMemoryBoundaries(t *testing.T) {
	for _, c := range boundaryCases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			runBoundary(t, NewMemory(WithClock(clk.Now)), "k", c, clk, false)
		})
	}
}
