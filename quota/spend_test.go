package quota

import (
	"context"
	"maps"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// spendStore is a store whose spend clock a test sets: Memory's injected
// clock, or the shift Redis adds to its own TIME for the spend windows.
// Redis's clock keeps moving after set, so its RetryAfter is checked
// within slack.
type spendStore struct {
	Store
	set   func(time.Time)
	slack time.Duration
}

func memorySpend(t *testing.T) spendStore {
	clk := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	return spendStore{Store: NewMemory(WithClock(clk.Now)), set: clk.Set}
}

func redisSpend(t *testing.T) spendStore {
	r := newRedis(t, redistest.Start(t).Addr(), nil)
	return spendStore{Store: r, set: func(at time.Time) { r.spendShift = at.UnixMicro() - time.Now().UnixMicro() }, slack: 2 * time.Second}
}

// The test times are years ahead of the real clock: Redis expires a
// spend hash on its real clock, GRACE past its latest window's end.
func utc(y int, m time.Month, d, h, min, s int) time.Time {
	return time.Date(y, m, d, h, min, s, 0, time.UTC)
}

// spendCase is one spend test, run against both stores.
type spendCase struct {
	name string
	run  func(t *testing.T, st spendStore)
}

// expectSpend checks a Decision's spend fields.
func expectSpend(t *testing.T, what string, d Decision, allowed bool, retry time.Duration, day, month int64, slack time.Duration) {
	t.Helper()
	if d.Allowed != allowed {
		t.Errorf("%s: allowed %v, want %v (%+v)", what, d.Allowed, allowed, d)
	}
	if !allowed && d.Refused != RefusedSpend {
		t.Errorf("%s: refused %q, want spend (%+v)", what, d.Refused, d)
	}
	if allowed && (d.Refused != RefusedNone || d.RetryAfter != 0) {
		t.Errorf("%s: allowed with refused %q, retry %v", what, d.Refused, d.RetryAfter)
	}
	if !allowed && (d.RetryAfter > retry || d.RetryAfter < retry-slack || (retry == 0) != (d.RetryAfter == 0)) {
		t.Errorf("%s: retry after %v, want %v (within %v)", what, d.RetryAfter, retry, slack)
	}
	if d.Spend != (SpendState{Day: day, Month: month}) {
		t.Errorf("%s: spend %+v, want day %d, month %d", what, d.Spend, day, month)
	}
}

var spendCases = []spendCase{
	{"admit under the limit, refuse over it until midnight", func(t *testing.T, st spendStore) {
		st.set(utc(2030, 3, 15, 23, 0, 0))
		l := Limits{SpendPerDay: 1000}
		d := admit(t, st, Ask{Key: "k", Limits: l, Spend: 400})
		expectSpend(t, "400", d, true, 0, 400, 0, st.slack)
		if d.SpendWindow != (SpendWindow{Day: "20300315"}) {
			t.Errorf("window %+v, want day 20300315", d.SpendWindow)
		}
		expectSpend(t, "600 more: exactly the limit", admit(t, st, Ask{Key: "k", Limits: l, Spend: 600}), true, 0, 1000, 0, st.slack)
		expectSpend(t, "1 more", admit(t, st, Ask{Key: "k", Limits: l, Spend: 1}), false, time.Hour, 1000, 0, st.slack)
		expectSpend(t, "0 at the limit", admit(t, st, Ask{Key: "k", Limits: l, Spend: 0}), true, 0, 1000, 0, st.slack)
		expectSpend(t, "above the limit by itself: never", admit(t, st, Ask{Key: "other", Limits: l, Spend: 1001}), false, 0, 0, 0, st.slack)
	}},
	{"refuse over the month until its end", func(t *testing.T, st spendStore) {
		st.set(utc(2030, 2, 28, 12, 0, 0))
		l := Limits{SpendPerMonth: 1000}
		d := admit(t, st, Ask{Key: "k", Limits: l, Spend: 1000})
		expectSpend(t, "1000", d, true, 0, 0, 1000, st.slack)
		if d.SpendWindow != (SpendWindow{Month: "203002"}) {
			t.Errorf("window %+v, want month 203002", d.SpendWindow)
		}
		expectSpend(t, "1 more", admit(t, st, Ask{Key: "k", Limits: l, Spend: 1}), false, 12*time.Hour, 0, 1000, st.slack)
		// Both limits refusing: the later reset, the month's.
		st.set(utc(2030, 2, 10, 12, 0, 0))
		both := Limits{SpendPerDay: 100, SpendPerMonth: 100}
		admit(t, st, Ask{Key: "both", Limits: both, Spend: 100})
		expectSpend(t, "both full", admit(t, st, Ask{Key: "both", Limits: both, Spend: 1}), false, 18*24*time.Hour+12*time.Hour, 100, 100, st.slack)
		// Never by the day limit, refused by the month's until its end:
		// never wins.
		expectSpend(t, "never by one limit", admit(t, st, Ask{Key: "both", Limits: Limits{SpendPerDay: 50, SpendPerMonth: 100}, Spend: 60}), false, 0, 100, 100, st.slack)
	}},
	{"settle down and up", func(t *testing.T, st spendStore) {
		st.set(utc(2030, 5, 20, 10, 0, 0))
		l := Limits{SpendPerDay: 1000, SpendPerMonth: 5000}
		d := admit(t, st, Ask{Key: "k", Limits: l, Spend: 500})
		expectSpend(t, "reserve 500", d, true, 0, 500, 500, st.slack)
		release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 500, UsedSpend: 200, SpendDay: d.SpendWindow.Day, SpendMonth: d.SpendWindow.Month})
		d = admit(t, st, Ask{Key: "k", Limits: l, Spend: 800})
		expectSpend(t, "after 300 given back, reserve 800", d, true, 0, 1000, 1000, st.slack)
		// The real cost exceeds the reservation: the excess is spent.
		release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 800, UsedSpend: 900, SpendDay: d.SpendWindow.Day, SpendMonth: d.SpendWindow.Month})
		expectSpend(t, "overspent by 100", admit(t, st, Ask{Key: "k", Limits: l}), false, 14*time.Hour, 1100, 1100, st.slack)
		// Given back beyond what the windows hold: 0, not negative.
		release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 5000, UsedSpend: 0, SpendDay: d.SpendWindow.Day, SpendMonth: d.SpendWindow.Month})
		expectSpend(t, "given back past zero", admit(t, st, Ask{Key: "k", Limits: l}), true, 0, 0, 0, st.slack)
		// No window ids: the current windows.
		release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 0, UsedSpend: 70})
		expectSpend(t, "settled into the current windows", admit(t, st, Ask{Key: "k", Limits: l, Spend: 30}), true, 0, 100, 100, st.slack)
	}},
	{"refused asks change nothing", func(t *testing.T, st spendStore) {
		st.set(utc(2030, 5, 20, 10, 0, 0))
		l := Limits{RequestsPerMinute: 10, TokensPerMinute: 100, Concurrent: 1, SpendPerDay: 100}
		d := admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10, Lease: "a", Spend: 60})
		expectSpend(t, "a", d, true, 0, 60, 0, st.slack)
		// Spend is checked before concurrency: a holds the only lease.
		d = admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10, Lease: "b", Spend: 50})
		expectSpend(t, "b over the spend", d, false, 14*time.Hour, 60, 0, st.slack)
		d = admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10, Lease: "c", Spend: 40})
		if d.Allowed || d.Refused != RefusedConcurrent || d.Spend.Day != 60 {
			t.Errorf("c within the spend, over concurrency: %+v", d)
		}
		d = admit(t, st, Ask{Key: "k", Limits: l, Tokens: 1000, Lease: "d", Spend: 40})
		if d.Allowed || d.Refused != RefusedTokens || d.Spend.Day != 60 {
			t.Errorf("d over the tokens: %+v", d)
		}
		release(t, st, Release{Key: "k", Limits: l, Lease: "a", Reserved: 10, Used: 10, ReservedSpend: 60, UsedSpend: 60})
		d = admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10, Lease: "e", Spend: 40})
		expectSpend(t, "e", d, true, 0, 100, 0, st.slack)
		if d.Requests.Remaining != 8 || d.Tokens.Remaining != 80 || d.InFlight != 1 {
			t.Errorf("e: the refusals took something: %+v", d)
		}
	}},
	{"the day resets the next day", func(t *testing.T, st spendStore) {
		st.set(utc(2030, 3, 15, 23, 59, 59))
		l := Limits{SpendPerDay: 100}
		admit(t, st, Ask{Key: "k", Limits: l, Spend: 100})
		expectSpend(t, "full", admit(t, st, Ask{Key: "k", Limits: l, Spend: 1}), false, time.Second, 100, 0, st.slack)
		st.set(utc(2030, 3, 16, 0, 0, 0))
		d := admit(t, st, Ask{Key: "k", Limits: l, Spend: 100})
		expectSpend(t, "the next day", d, true, 0, 100, 0, st.slack)
		if d.SpendWindow.Day != "20300316" {
			t.Errorf("window %+v", d.SpendWindow)
		}
	}},
	{"the month limit apart from the day limit", func(t *testing.T, st spendStore) {
		l := Limits{SpendPerDay: 100, SpendPerMonth: 250}
		st.set(utc(2030, 4, 1, 8, 0, 0))
		expectSpend(t, "day 1", admit(t, st, Ask{Key: "k", Limits: l, Spend: 100}), true, 0, 100, 100, st.slack)
		expectSpend(t, "day 1 full", admit(t, st, Ask{Key: "k", Limits: l, Spend: 1}), false, 16*time.Hour, 100, 100, st.slack)
		st.set(utc(2030, 4, 2, 8, 0, 0))
		expectSpend(t, "day 2", admit(t, st, Ask{Key: "k", Limits: l, Spend: 100}), true, 0, 100, 200, st.slack)
		st.set(utc(2030, 4, 3, 8, 0, 0))
		expectSpend(t, "day 3", admit(t, st, Ask{Key: "k", Limits: l, Spend: 50}), true, 0, 50, 250, st.slack)
		expectSpend(t, "month full, day not", admit(t, st, Ask{Key: "k", Limits: l, Spend: 1}), false, 27*24*time.Hour+16*time.Hour, 50, 250, st.slack)
		st.set(utc(2030, 5, 1, 0, 0, 0))
		expectSpend(t, "the next month", admit(t, st, Ask{Key: "k", Limits: l, Spend: 100}), true, 0, 100, 100, st.slack)
	}},
	{"release into the admission's windows after a boundary", func(t *testing.T, st spendStore) {
		l := Limits{SpendPerDay: 1000, SpendPerMonth: 1000}
		st.set(utc(2030, 3, 31, 23, 59, 50))
		d := admit(t, st, Ask{Key: "k", Limits: l, Spend: 300})
		if d.SpendWindow != (SpendWindow{Day: "20300331", Month: "203003"}) {
			t.Fatalf("window %+v", d.SpendWindow)
		}
		st.set(utc(2030, 4, 1, 0, 0, 10))
		release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 300, UsedSpend: 900, SpendDay: d.SpendWindow.Day, SpendMonth: d.SpendWindow.Month})
		expectSpend(t, "the new windows untouched", admit(t, st, Ask{Key: "k", Limits: l, Spend: 1000}), true, 0, 1000, 1000, st.slack)
		// Back in the old windows (a clock set back): they hold the 900.
		st.set(utc(2030, 3, 31, 23, 59, 55))
		expectSpend(t, "the old windows", admit(t, st, Ask{Key: "k", Limits: l, Spend: 100}), true, 0, 1000, 1000, st.slack)
		// A window ended a day or more ago is gone: its settlement dropped.
		st.set(utc(2030, 4, 2, 0, 0, 0))
		release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 0, UsedSpend: 500, SpendDay: "20300331", SpendMonth: "203003"})
		expectSpend(t, "not into today", admit(t, st, Ask{Key: "k", Limits: l}), true, 0, 0, 1000, st.slack)
	}},
}

func TestMemorySpend(t *testing.T) {
	for _, c := range spendCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, memorySpend(t)) })
	}
}

func TestRedisSpend(t *testing.T) {
	for _, c := range spendCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, redisSpend(t)) })
	}
}

// testSpendConcurrentSafe: asks of 7 against a day limit of 1000 from
// many goroutines over the stores (Redis: two replicas) admit exactly
// 142 of them, never more.
func testSpendConcurrentSafe(t *testing.T, stores []Store) {
	const workers, asks, limit, each = 16, 20, 1000, 7
	l := Limits{SpendPerDay: limit, SpendPerMonth: 10 * limit}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range asks {
				d, err := stores[w%len(stores)].Admit(context.Background(), Ask{Key: "k", Limits: l, Spend: each})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
					if d.Spend.Day > limit {
						t.Errorf("spend %d after an admission, limit %d", d.Spend.Day, limit)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != limit/each {
		t.Errorf("%d admitted, want %d", n, limit/each)
	}
	d := admit(t, stores[0], Ask{Key: "k", Limits: l})
	if d.Spend.Day != limit/each*each || d.Spend.Month != limit/each*each {
		t.Errorf("after all: %+v", d.Spend)
	}
}

func TestMemorySpendConcurrentSafe(t *testing.T) {
	testSpendConcurrentSafe(t, []Store{NewMemory()})
}

func TestRedisSpendConcurrentSafe(t *testing.T) {
	srv := redistest.Start(t)
	// A second, not 50 ms: 16 goroutines dialling at once under -race on a
	// loaded machine took longer, and this test is about exactness.
	slow := func(c *RedisConfig) { c.Timeout = time.Second }
	a, b := newRedis(t, srv.Addr(), slow), newRedis(t, srv.Addr(), slow)
	shift := utc(2030, 6, 15, 12, 0, 0).UnixMicro() - time.Now().UnixMicro()
	a.spendShift, b.spendShift = shift, shift
	testSpendConcurrentSafe(t, []Store{a, b})
}

// TestRedisSpendKeys: a key's spend windows are the fields of one hash
// named for the key, under its hash tag, which expires a day past the end
// of its latest window (the month's).
func TestRedisSpendKeys(t *testing.T) {
	srv := redistest.Start(t)
	st := newRedis(t, srv.Addr(), nil)
	raw := rawClient(t, srv.Addr())
	ctx := context.Background()
	d := admit(t, st, Ask{Key: "team-a", Limits: Limits{SpendPerDay: 100, SpendPerMonth: 1000}, Spend: 10})
	w := windowsAt(time.Now().UnixMicro())
	if d.SpendWindow.Day != strconv.FormatInt(w.day, 10) || d.SpendWindow.Month != strconv.FormatInt(w.month, 10) {
		t.Skipf("a UTC day ended during the test: %+v, %+v", d.SpendWindow, w)
	}
	const key = "switchboard:quota:{team-a}:spend"
	if keys, err := raw.Keys(ctx, "*").Result(); err != nil || len(keys) != 1 || keys[0] != key {
		t.Fatalf("keys %q (%v), want only %s", keys, err, key)
	}
	want := map[string]string{"d:" + d.SpendWindow.Day: "10", "m:" + d.SpendWindow.Month: "10"}
	if got, err := raw.HGetAll(ctx, key).Result(); err != nil || !maps.Equal(got, want) {
		t.Errorf("%s: %v (%v), want %v", key, got, err, want)
	}
	wantAt := time.UnixMicro(w.monthEnd).Add(spendGrace)
	if at, err := raw.PExpireTime(ctx, key).Result(); err != nil || time.UnixMilli(int64(at/time.Millisecond)) != wantAt {
		t.Errorf("%s: PEXPIRETIME %v (%v), want %v", key, at, err, wantAt)
	}
	// A day limit alone: the hash expires a day past the day's end.
	admit(t, st, Ask{Key: "team-b", Limits: Limits{SpendPerDay: 100}, Spend: 10})
	wantAt = time.UnixMicro(w.dayEnd).Add(spendGrace)
	if at, err := raw.PExpireTime(ctx, "switchboard:quota:{team-b}:spend").Result(); err != nil || time.UnixMilli(int64(at/time.Millisecond)) != wantAt {
		t.Errorf("team-b: PEXPIRETIME %v (%v), want %v", at, err, wantAt)
	}
}

// TestRedisSpendWindowsBounded: day after day, through two month ends,
// with admissions and settlements into the previous day, a key's hash
// keeps the current windows and those ended less than a day ago, no more,
// and expires a day past its latest window's end.
func TestRedisSpendWindowsBounded(t *testing.T) {
	srv := redistest.Start(t)
	st := newRedis(t, srv.Addr(), nil)
	raw := rawClient(t, srv.Addr())
	ctx := context.Background()
	const key = "switchboard:quota:{k}:spend"
	l := Limits{SpendPerDay: 100, SpendPerMonth: 1000}
	start := utc(2030, 1, 1, 12, 0, 0)
	var prev SpendWindow
	for i := range 70 { // days
		at := start.AddDate(0, 0, i)
		st.spendShift = at.UnixMicro() - time.Now().UnixMicro()
		d := admit(t, st, Ask{Key: "k", Limits: l, Spend: 3})
		if prev.Day != "" { // yesterday's request ends today
			release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 3, UsedSpend: 1, SpendDay: prev.Day, SpendMonth: prev.Month})
		}
		prev = d.SpendWindow
		fields, err := raw.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		w := windowsAt(at.UnixMicro())
		yesterday := windowsAt(at.AddDate(0, 0, -1).UnixMicro())
		wantDay := map[string]string{"d:" + strconv.FormatInt(w.day, 10): "3"}
		if i > 0 {
			wantDay["d:"+strconv.FormatInt(yesterday.day, 10)] = "1"
		}
		days, months := 0, 0
		for f, v := range fields {
			if f[0] == 'd' {
				days++
				if wantDay[f] != v {
					t.Errorf("%v: %s = %s, want %q", at, f, v, wantDay[f])
				}
			} else {
				months++
			}
		}
		if days != len(wantDay) || months > 2 || fields["m:"+strconv.FormatInt(w.month, 10)] == "" {
			t.Fatalf("%v: fields %v", at, fields)
		}
		wantAt := time.UnixMicro(w.monthEnd).Add(spendGrace)
		if got, err := raw.PExpireTime(ctx, key).Result(); err != nil || time.UnixMilli(int64(got/time.Millisecond)) != wantAt {
			t.Fatalf("%v: PEXPIRETIME %v (%v), want %v", at, got, err, wantAt)
		}
	}
	// A settlement after every window ended a day ago changes nothing:
	// no write, so no field and no expiry are touched.
	st.spendShift = start.AddDate(0, 4, 0).UnixMicro() - time.Now().UnixMicro()
	release(t, st, Release{Key: "k", Limits: l, ReservedSpend: 0, UsedSpend: 5, SpendDay: prev.Day, SpendMonth: prev.Month})
	if n, err := raw.HLen(ctx, key).Result(); err != nil || n > 4 {
		t.Errorf("after a late settlement: %d fields (%v)", n, err)
	}
	// The next write drops them all but its own.
	admit(t, st, Ask{Key: "k", Limits: Limits{SpendPerMonth: 1000}, Spend: 2})
	want := map[string]string{"m:203005": "2"}
	if got, err := raw.HGetAll(ctx, key).Result(); err != nil || !maps.Equal(got, want) {
		t.Errorf("after months idle: %v (%v), want %v", got, err, want)
	}
}

// checkedLua wraps redis.call, for the scripts that follow it, with a
// check that every command but TIME names a declared key (in KEYS) first.
const checkedLua = `
local declared_call = redis.call
local declared = {}
for _, k in ipairs(KEYS) do
  declared[k] = true
end
local redis = {call = function(cmd, ...)
  local key = ...
  if string.upper(cmd) ~= 'TIME' and not declared[key] then
    error('undeclared key ' .. tostring(key) .. ' (' .. cmd .. ')')
  end
  return declared_call(cmd, ...)
end}
`

// TestRedisScriptsDeclareKeys: the scripts touch only the keys they
// declare in KEYS (Redis's scripting contract: Redis Cluster routes on
// them, Dragonfly refuses undeclared keys), through the spend cases,
// concurrency, settling and renewal.
func TestRedisScriptsDeclareKeys(t *testing.T) {
	a, r, n := admitScript, releaseScript, renewScript
	t.Cleanup(func() { admitScript, releaseScript, renewScript = a, r, n })
	admitScript = redis.NewScript(checkedLua + gcraLua + spendLua + admitLua)
	releaseScript = redis.NewScript(checkedLua + gcraLua + spendLua + releaseLua)
	renewScript = redis.NewScript(checkedLua + gcraLua + renewLua)
	srv := redistest.Start(t)
	for _, c := range spendCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, redisSpend(t)) })
	}
	var hookErr atomic.Pointer[error]
	st := newRedis(t, srv.Addr(), nil, WithErrorHook(func(err error) { hookErr.Store(&err) }))
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 1000, Concurrent: 2, SpendPerDay: 1000, SpendPerMonth: 5000}
	d := admit(t, st, Ask{Key: "k", Limits: l, Tokens: 100, Lease: "r1", Spend: 50})
	if !d.Allowed {
		t.Fatalf("refused: %+v", d)
	}
	st.renew()
	if p := hookErr.Load(); p != nil {
		t.Fatalf("renew: %v", *p)
	}
	release(t, st, Release{Key: "k", Limits: l, Lease: "r1", Reserved: 100, Used: 40, ReservedSpend: 50, UsedSpend: 20,
		SpendDay: d.SpendWindow.Day, SpendMonth: d.SpendWindow.Month})
	if d := admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10, Lease: "r2", Spend: 10}); !d.Allowed || d.Spend.Day != 30 || d.InFlight != 1 {
		t.Errorf("after the release: %+v", d)
	}
	// The check itself: a script naming a key it did not declare fails.
	bad := redis.NewScript(checkedLua + `return redis.call('GET', 'undeclared')`)
	if err := bad.Run(context.Background(), rawClient(t, srv.Addr()), []string{"declared"}).Err(); err == nil || !strings.Contains(err.Error(), "undeclared key undeclared") {
		t.Errorf("an undeclared key: %v", err)
	}
}

// spendProbeLua returns, for each time in ARGV (µs), spend.lua's windows
// and the ends day_end and month_id_end find from the ids.
const spendProbeLua = `
local out = {}
for i = 1, #ARGV do
  local d, m, de, me = windows(tonumber(ARGV[i]))
  for _, v in ipairs({d, m, de, me, day_end(d), month_id_end(m)}) do
    out[#out + 1] = v
  end
end
return out`

// TestSpendLuaMatchesGo: spend.lua's calendar is Go's, across leap years,
// centuries (up to 2200: Redis TIME in µs, a double, is exact to 2255) and every boundary's last and first µs.
func TestSpendLuaMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	probe := redis.NewScript(gcraLua + spendLua + spendProbeLua)
	rng := rand.New(rand.NewPCG(3, 4))
	var times []any
	var want []int64
	add := func(us int64) {
		w := windowsAt(us)
		times = append(times, us)
		want = append(want, w.day, w.month, w.dayEnd, w.monthEnd, w.dayEnd, w.monthEnd)
	}
	for _, at := range []time.Time{utc(1970, 1, 1, 0, 0, 0), utc(2000, 2, 29, 12, 0, 0), utc(2100, 2, 28, 23, 59, 59), utc(2024, 12, 31, 23, 59, 59)} {
		add(at.UnixMicro())
	}
	for range 2000 {
		day := utc(1970+rng.IntN(230), time.Month(1+rng.IntN(12)), 1+rng.IntN(31), 0, 0, 0)
		add(day.UnixMicro())
		add(day.UnixMicro() - 1)
		add(day.UnixMicro() + rng.Int64N(86_400_000_000))
	}
	got, err := probe.Run(context.Background(), raw, []string{"probe"}, times...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d values, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("time %d µs: Lua %v, Go %v (day, month, their ends, the ends from the ids)", times[i/6], got[i/6*6:i/6*6+6], want[i/6*6:i/6*6+6])
		}
	}
}

// TestMemorySpendWindowsBounded: a key keeps its current windows and those
// ended less than a day ago, no more, and is swept once they are gone.
func TestMemorySpendWindowsBounded(t *testing.T) {
	clk := testutil.NewClock(utc(2030, 1, 1, 12, 0, 0))
	m := NewMemory(WithClock(clk.Now))
	l := Limits{SpendPerDay: 100, SpendPerMonth: 1000}
	for range 70 { // days: through two month ends
		admit(t, m, Ask{Key: "k", Limits: l, Spend: 1})
		m.mu.Lock()
		e := m.keys["k"]
		if len(e.days) > 2 || len(e.months) > 2 {
			t.Fatalf("%v: %d day and %d month windows kept", clk.Now(), len(e.days), len(e.months))
		}
		m.mu.Unlock()
		clk.Advance(24 * time.Hour)
	}
	// Two months later the windows are gone: a new key's sweep drops k.
	clk.Advance(62 * 24 * time.Hour)
	for i := range sweepMin {
		admit(t, m, Ask{Key: "other-" + strconv.Itoa(i), Limits: Limits{RequestsPerMinute: 10}})
	}
	m.mu.Lock()
	_, kept := m.keys["k"]
	m.mu.Unlock()
	if kept {
		t.Errorf("k kept with no window left")
	}
}
