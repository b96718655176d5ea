package quota

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs its dial failures to a process-wide logger; the outage
	// tests cause them on purpose.
	redis.SetLogger(silent{})
	goleak.VerifyTestMain(m)
}

type silent struct{}

func (silent) Printf(context.Context, string, ...any) {}

func admit(t *testing.T, st Store, a Ask) Decision {
	t.Helper()
	d, err := st.Admit(context.Background(), a)
	if err != nil {
		t.Fatalf("Admit(%+v): %v", a, err)
	}
	return d
}

func release(t *testing.T, st Store, r Release) {
	t.Helper()
	if err := st.Release(context.Background(), r); err != nil {
		t.Fatalf("Release(%+v): %v", r, err)
	}
}

// testConcurrency: leases count, a refusal holds none, a second Release of
// a lease (or one never held) changes nothing, and it never goes negative.
func testConcurrency(t *testing.T, st Store, key string) {
	l := Limits{Concurrent: 2}
	ask := func(lease string) Decision { return admit(t, st, Ask{Key: key, Limits: l, Lease: lease}) }
	rel := func(lease string) { release(t, st, Release{Key: key, Limits: l, Lease: lease}) }
	check := func(what string, d Decision, allowed bool, inFlight int64) {
		t.Helper()
		if d.Allowed != allowed || d.InFlight != inFlight {
			t.Errorf("%s: allowed %v, in flight %d; want %v, %d (%+v)", what, d.Allowed, d.InFlight, allowed, inFlight, d)
		}
		if !allowed && (d.Refused != RefusedConcurrent || d.RetryAfter != 0) {
			t.Errorf("%s: refused %q, retry after %v; want concurrent, 0", what, d.Refused, d.RetryAfter)
		}
	}
	check("a", ask("a"), true, 1)
	check("b", ask("b"), true, 2)
	check("c at the limit", ask("c"), false, 2)
	rel("a")
	check("c after a ended", ask("c"), true, 2)
	rel("a") // a second Release of a
	rel("never-admitted")
	check("d: a's second Release freed nothing", ask("d"), false, 2)
	rel("b")
	rel("c")
	rel("c")
	rel("b")
	check("e with nothing in flight", ask("e"), true, 1)
	rel("e")
}

// testAllOrNothing: a refusal by any limit takes nothing from the others.
func testAllOrNothing(t *testing.T, st Store, key string) {
	l := Limits{RequestsPerMinute: 10, TokensPerMinute: 100, Concurrent: 1}
	d := admit(t, st, Ask{Key: key, Limits: l, Tokens: 10, Lease: "x"})
	if !d.Allowed || d.Requests.Remaining != 9 || d.Tokens.Remaining != 90 || d.InFlight != 1 {
		t.Fatalf("x: %+v", d)
	}
	// Refused by concurrency: no request, no token taken.
	d = admit(t, st, Ask{Key: key, Limits: l, Tokens: 10, Lease: "y"})
	if d.Allowed || d.Refused != RefusedConcurrent || d.Requests.Remaining != 9 || d.Tokens.Remaining != 90 || d.InFlight != 1 {
		t.Fatalf("y at the concurrency limit: %+v", d)
	}
	release(t, st, Release{Key: key, Limits: l, Lease: "x", Reserved: 10, Used: 10})
	// Refused by tokens: no request and no lease taken.
	d = admit(t, st, Ask{Key: key, Limits: l, Tokens: 200, Lease: "z"})
	if d.Allowed || d.Refused != RefusedTokens || d.RetryAfter != 0 || d.Requests.Remaining != 9 || d.InFlight != 0 {
		t.Fatalf("z over the tokens limit: %+v", d)
	}
	d = admit(t, st, Ask{Key: key, Limits: l, Tokens: 90, Lease: "w"})
	if !d.Allowed || d.Requests.Remaining != 8 || d.Tokens.Remaining != 0 || d.InFlight != 1 {
		t.Fatalf("w: z took nothing, so w fits: %+v", d)
	}
	release(t, st, Release{Key: key, Limits: l, Lease: "w", Reserved: 90, Used: 90})
}

func testInvalidAsk(t *testing.T, st Store) {
	_, err := st.Admit(context.Background(), Ask{Key: "k", Limits: Limits{Concurrent: 1}})
	if !errors.Is(err, ErrInvalidAsk) {
		t.Errorf("a concurrent limit without a lease: %v, want ErrInvalidAsk", err)
	}
	d, err := st.Admit(context.Background(), Ask{Key: "k"})
	if err != nil || !d.Allowed || d != (Decision{Allowed: true}) {
		t.Errorf("no limits: %+v, %v; want allowed with nothing to report", d, err)
	}
}

func TestMemoryConcurrency(t *testing.T)  { testConcurrency(t, NewMemory(), "k") }
func TestMemoryAllOrNothing(t *testing.T) { testAllOrNothing(t, NewMemory(), "k") }
func TestMemoryInvalidAsk(t *testing.T)   { testInvalidAsk(t, NewMemory()) }

func TestMemoryKeysApart(t *testing.T) {
	m := NewMemory()
	l := Limits{RequestsPerMinute: 1}
	if !admit(t, m, Ask{Key: "a", Limits: l}).Allowed || !admit(t, m, Ask{Key: "b", Limits: l}).Allowed {
		t.Fatal("each key has its own bucket")
	}
	if admit(t, m, Ask{Key: "a", Limits: l}).Allowed {
		t.Fatal("a's bucket is empty")
	}
}

// TestMemoryRefusedChangesNothing: a run of refusals leaves the state as
// it was: the first Ask allowed after them is allowed at the same time as
// with no refusals at all.
func TestMemoryRefusedChangesNothing(t *testing.T) {
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 600, Concurrent: 1}
	run := func(refusals bool) Decision {
		clk := newFakeClock()
		m := NewMemory(WithClock(clk.Now))
		admit(t, m, Ask{Key: "k", Limits: l, Tokens: 600, Lease: "held"})
		if refusals {
			for i := range 50 {
				lease := "r" + strconv.Itoa(i)
				admit(t, m, Ask{Key: "k", Limits: l, Tokens: int64(i), Lease: lease})        // tokens or concurrency
				admit(t, m, Ask{Key: "k", Limits: l, Tokens: 601, Lease: lease})             // never
				admit(t, m, Ask{Key: "k", Limits: l, Tokens: 0, Lease: lease})               // concurrency
				admit(t, m, Ask{Key: "k", Limits: Limits{RequestsPerMinute: 60}, Tokens: 0}) // allowed: takes a request
				clk.Advance(10 * time.Millisecond)
			}
		} else {
			for range 50 {
				admit(t, m, Ask{Key: "k", Limits: Limits{RequestsPerMinute: 60}, Tokens: 0})
				clk.Advance(10 * time.Millisecond)
			}
		}
		release(t, m, Release{Key: "k", Limits: l, Lease: "held", Reserved: 600, Used: 600})
		clk.Advance(30 * time.Second)
		return admit(t, m, Ask{Key: "k", Limits: l, Tokens: 300, Lease: "after"})
	}
	with, without := run(true), run(false)
	if with != without {
		t.Errorf("refusals changed the state:\n with %+v\n without %+v", with, without)
	}
	if !with.Allowed {
		t.Errorf("the Ask after: %+v", with)
	}
}

// TestMemoryClockBack: a clock stepped back refills from the new time on,
// not only once it has caught up again.
func TestMemoryClockBack(t *testing.T) {
	clk := newFakeClock()
	m := NewMemory(WithClock(clk.Now))
	l := Limits{RequestsPerMinute: 60}
	for range 60 {
		admit(t, m, Ask{Key: "k", Limits: l})
	}
	clk.Advance(-time.Hour)
	if d := admit(t, m, Ask{Key: "k", Limits: l}); d.Allowed {
		t.Fatalf("an empty bucket after the clock went back: %+v", d)
	}
	clk.Advance(time.Second)
	if d := admit(t, m, Ask{Key: "k", Limits: l}); !d.Allowed {
		t.Fatalf("a second after the step back, one is refilled: %+v", d)
	}
}

// TestMemorySweep: keys whose buckets are full and which hold no lease are
// dropped once the map has doubled; the others are kept.
func TestMemorySweep(t *testing.T) {
	clk := newFakeClock()
	m := NewMemory(WithClock(clk.Now))
	l := Limits{RequestsPerMinute: 10}
	admit(t, m, Ask{Key: "held", Limits: Limits{Concurrent: 1}, Lease: "x"})
	for i := range sweepMin - 2 {
		admit(t, m, Ask{Key: "k" + strconv.Itoa(i), Limits: l})
	}
	if n := m.len(); n != sweepMin-1 {
		t.Fatalf("%d keys, want %d", n, sweepMin-1)
	}
	clk.Advance(59 * time.Second)
	admit(t, m, Ask{Key: "recent", Limits: l})
	clk.Advance(2 * time.Second) // the first keys are full again, recent is not
	admit(t, m, Ask{Key: "new", Limits: l})
	if n := m.len(); n != 3 {
		t.Fatalf("after the sweep, %d keys; want held, recent and new", n)
	}
	// A dropped key starts again full, which it was.
	if d := admit(t, m, Ask{Key: "k0", Limits: l}); !d.Allowed || d.Requests.Remaining != 9 {
		t.Errorf("a dropped key: %+v", d)
	}
	if d := admit(t, m, Ask{Key: "held", Limits: Limits{Concurrent: 1}, Lease: "y"}); d.Allowed {
		t.Errorf("the key holding a lease was dropped: %+v", d)
	}
}

// TestMemoryReleaseOfADroppedKey: an overrun settled after the key's entry
// was swept is still charged.
func TestMemoryReleaseOfADroppedKey(t *testing.T) {
	clk := newFakeClock()
	m := NewMemory(WithClock(clk.Now))
	l := Limits{TokensPerMinute: 100}
	release(t, m, Release{Key: "k", Limits: l, Reserved: 10, Used: 0}) // nothing to give back to
	if m.len() != 0 {
		t.Error("giving back to a key with no entry made one")
	}
	release(t, m, Release{Key: "k", Limits: l, Reserved: 10, Used: 110})
	if d := admit(t, m, Ask{Key: "k", Limits: l, Tokens: 1}); d.Allowed {
		t.Errorf("an overrun of 100 on a 100-token bucket: %+v", d)
	}
}

func TestMemoryAdmitAllocs(t *testing.T) {
	m := NewMemory()
	ctx := context.Background()
	l := Limits{RequestsPerMinute: 1e9, TokensPerMinute: 1e12, Concurrent: 10, SpendPerDay: 1e15, SpendPerMonth: 1e15}
	a := Ask{Key: "team", Limits: l, Tokens: 100, Lease: "lease-1", Spend: 1000}
	d, _ := m.Admit(ctx, a)
	r := Release{Key: "team", Limits: l, Lease: "lease-1", Reserved: 100, Used: 50,
		ReservedSpend: 1000, UsedSpend: 600, SpendDay: d.SpendWindow.Day, SpendMonth: d.SpendWindow.Month}
	_ = m.Release(ctx, r)
	if n := testing.AllocsPerRun(1000, func() {
		_, _ = m.Admit(ctx, a)
		_ = m.Release(ctx, r)
	}); n != 0 {
		t.Errorf("%v allocations per Admit and Release, want 0", n)
	}
}

// TestMemoryConcurrentSafe hammers a few keys from many goroutines: the
// requests in flight per key never exceed its limit, and end at zero.
func TestMemoryConcurrentSafe(t *testing.T) {
	m := NewMemory()
	const keys, workers, rounds, limit = 3, 8, 300, 3
	l := Limits{RequestsPerMinute: 1e9, TokensPerMinute: 1e9, Concurrent: limit}
	var inFlight [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := (w + i) % keys
				key, lease := "k"+strconv.Itoa(k), strconv.Itoa(w)+"-"+strconv.Itoa(i)
				d, err := m.Admit(context.Background(), Ask{Key: key, Limits: l, Tokens: 10, Lease: lease})
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					continue
				}
				if n := inFlight[k].Add(1); n > limit || d.InFlight > limit {
					t.Errorf("key %d: %d in flight (decision %d), limit %d", k, n, d.InFlight, limit)
				}
				inFlight[k].Add(-1)
				_ = m.Release(context.Background(), Release{Key: key, Limits: l, Lease: lease, Reserved: 10, Used: 5})
			}
		})
	}
	wg.Wait()
	for k := range keys {
		d := admit(t, m, Ask{Key: "k" + strconv.Itoa(k), Limits: l, Lease: "last"})
		if d.InFlight != 1 {
			t.Errorf("key %d: %d in flight after all ended (this one included)", k, d.InFlight)
		}
	}
}

func BenchmarkMemoryAdmitRelease(b *testing.B) {
	m := NewMemory()
	ctx := context.Background()
	l := Limits{RequestsPerMinute: 1e9, TokensPerMinute: 1e12, Concurrent: 100}
	a := Ask{Key: "team", Limits: l, Tokens: 100, Lease: "lease"}
	r := Release{Key: "team", Limits: l, Lease: "lease", Reserved: 100, Used: 80}
	_, _ = m.Admit(ctx, a)
	_ = m.Release(ctx, r)
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := m.Admit(ctx, a); !d.Allowed {
			b.Fatal(d)
		}
		_ = m.Release(ctx, r)
	}
}
