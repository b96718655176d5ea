package quota

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"slices"
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

// newRedis is a Redis store on srv with the default config changed by
// mod, closed at the end of the test.
func newRedis(t testing.TB, addr string, mod func(*RedisConfig), opts ...Option) *Redis {
	t.Helper()
	cfg := DefaultRedisConfig()
	cfg.Address = addr
	if mod != nil {
		mod(&cfg)
	}
	st, err := NewRedis(cfg, opts...)
	if err != nil {
		t.Fatalf("NewRedis: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

// rawClient is a plain client on srv for looking at the keys.
func rawClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRedisBoundaries runs the boundary cases Memory passes exactly
// against Redis: the same decisions, and buckets within what Redis's
// clock, moving meanwhile, can refill. The cases Redis runs are those no
// refill within a second can flip.
func TestRedisBoundaries(t *testing.T) {
	srv := redistest.Start(t)
	st := newRedis(t, srv.Addr(), nil)
	for _, c := range boundaryCases {
		if c.memoryOnly {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			runBoundary(t, st, t.Name(), c, nil, true)
			if e := time.Since(start); e > time.Second {
				t.Logf("the case took %v: its tolerances grew with it", e)
			}
		})
	}
}

func TestRedisConcurrency(t *testing.T) {
	srv := redistest.Start(t)
	testConcurrency(t, newRedis(t, srv.Addr(), nil), "k")
}

func TestRedisAllOrNothing(t *testing.T) {
	srv := redistest.Start(t)
	testAllOrNothing(t, newRedis(t, srv.Addr(), nil), "k")
}

func TestRedisInvalidAsk(t *testing.T) {
	// No server: neither Ask needs one.
	testInvalidAsk(t, newRedis(t, "127.0.0.1:1", nil))
}

// TestRedisKeys: a key name's three Redis keys share its hash tag, expire
// when their state is gone (bucket full, no lease) and vanish when given
// back.
func TestRedisKeys(t *testing.T) {
	srv := redistest.Start(t)
	st := newRedis(t, srv.Addr(), nil)
	raw := rawClient(t, srv.Addr())
	ctx := context.Background()
	l := Limits{RequestsPerMinute: 60, TokensPerMinute: 1000, Concurrent: 2}
	admit(t, st, Ask{Key: "team-a", Limits: l, Tokens: 100, Lease: "r1"})
	keys, err := raw.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := "switchboard:quota:{team-a}:conc switchboard:quota:{team-a}:req switchboard:quota:{team-a}:tok"
	if got := strings.Join(slices.Sorted(slices.Values(keys)), " "); got != want {
		t.Fatalf("keys %s, want %s", got, want)
	}
	for _, k := range []struct {
		key      string
		min, max time.Duration
	}{
		{"switchboard:quota:{team-a}:req", 900 * time.Millisecond, 1002 * time.Millisecond},  // reset 1 s
		{"switchboard:quota:{team-a}:tok", 5900 * time.Millisecond, 6002 * time.Millisecond}, // 100 tokens: 6 s
		{"switchboard:quota:{team-a}:conc", 29 * time.Second, 30 * time.Second},              // lease_ttl
	} {
		ttl, err := raw.PTTL(ctx, k.key).Result()
		if err != nil || ttl < k.min || ttl > k.max {
			t.Errorf("%s: PTTL %v (%v), want %v to %v", k.key, ttl, err, k.min, k.max)
		}
	}
	release(t, st, Release{Key: "team-a", Limits: l, Lease: "r1", Reserved: 100, Used: 0})
	if n, err := raw.Exists(ctx, "switchboard:quota:{team-a}:tok", "switchboard:quota:{team-a}:conc").Result(); err != nil || n != 0 {
		t.Errorf("after giving back all tokens and the only lease, %d of tok and conc remain (%v)", n, err)
	}
}

// TestRedisNoScript: a Redis that lost its scripts (a restart, SCRIPT
// FLUSH) gets them again through EVAL.
func TestRedisNoScript(t *testing.T) {
	srv := redistest.Start(t)
	st := newRedis(t, srv.Addr(), nil)
	l := Limits{RequestsPerMinute: 10, Concurrent: 1}
	admit(t, st, Ask{Key: "k", Limits: l, Lease: "a"})
	if err := rawClient(t, srv.Addr()).ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	release(t, st, Release{Key: "k", Limits: l, Lease: "a"})
	if d := admit(t, st, Ask{Key: "k", Limits: l, Lease: "b"}); !d.Allowed || d.Requests.Remaining != 8 || d.InFlight != 1 {
		t.Errorf("after SCRIPT FLUSH: %+v", d)
	}
}

// TestRedisLeasesOfACrashedReplica: a replica's leases live while it
// renews them, past several lease_ttl, and expire within lease_ttl of its
// end without a Release.
func TestRedisLeasesOfACrashedReplica(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 300 * time.Millisecond
	live := newRedis(t, srv.Addr(), nil)
	crashing := newRedis(t, srv.Addr(), func(c *RedisConfig) { c.LeaseTTL = ttl })
	raw := rawClient(t, srv.Addr())
	ctx := context.Background()
	l := Limits{Concurrent: 1}
	if d := admit(t, crashing, Ask{Key: "k", Limits: l, Lease: "crashing-1"}); !d.Allowed {
		t.Fatalf("the first lease: %+v", d)
	}
	taken := time.Now()
	first, err := raw.ZScore(ctx, "switchboard:quota:{k}:conc", "crashing-1").Result()
	if err != nil {
		t.Fatal(err)
	}
	// Held past three lease_ttl: renewed, so still counted.
	testutil.Eventually(t, 5*time.Second, func() bool {
		if d := admit(t, live, Ask{Key: "k", Limits: l, Lease: "live-1"}); d.Allowed || d.InFlight != 1 {
			t.Fatalf("%v after the lease was taken, it no longer counts: %+v", time.Since(taken), d)
		}
		return time.Since(taken) > 3*ttl
	}, "three lease_ttl")
	score, err := raw.ZScore(ctx, "switchboard:quota:{k}:conc", "crashing-1").Result()
	if err != nil || score <= first {
		t.Fatalf("the lease's expiry %v (%v), first %v: not renewed", score, err, first)
	}
	// The replica dies: no Release.
	if err := crashing.Close(); err != nil {
		t.Fatal(err)
	}
	died := time.Now()
	testutil.Eventually(t, 5*time.Second, func() bool {
		return admit(t, live, Ask{Key: "k", Limits: l, Lease: "live-2"}).Allowed
	}, "the crashed replica's lease expiring")
	if waited := time.Since(died); waited > ttl+time.Second {
		t.Errorf("the lease expired %v after the replica died, lease_ttl %v", waited, ttl)
	}
	// Leases expire: the key's set does too, lease_ttl after its last
	// change.
	release(t, live, Release{Key: "k", Limits: l, Lease: "live-2"})
}

// TestRedisOutage: a stopped Redis fails Admit with ErrUnavailable at once
// (a refused connection) and starts down_for, in which calls fail without
// a round trip (the error hook, called per round trip, counts them); after
// down_for one call asks again; after Restart the store answers again.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	clk := newFakeClock()
	var roundTripErrors atomic.Int64
	st := newRedis(t, srv.Addr(), func(c *RedisConfig) { c.DownFor = time.Minute },
		WithClock(clk.Now), WithErrorHook(func(err error) {
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("hook: %v does not wrap ErrUnavailable", err)
			}
			roundTripErrors.Add(1)
		}))
	ctx := context.Background()
	ask := Ask{Key: "k", Limits: Limits{TokensPerMinute: 1_000_000, Concurrent: 10}, Tokens: 1, Lease: "a"}
	admit(t, st, ask)
	srv.Stop()

	start := time.Now()
	ask.Lease = "b"
	_, err := st.Admit(ctx, ask)
	if took := time.Since(start); !errors.Is(err, ErrUnavailable) || took > time.Second {
		t.Fatalf("Admit with Redis stopped: %v after %v, want ErrUnavailable at once", err, took)
	}
	if !st.Down() || roundTripErrors.Load() != 1 {
		t.Fatalf("down %v, %d round-trip errors; want down after 1", st.Down(), roundTripErrors.Load())
	}
	for i := range 20 {
		ask.Lease = "c" + strconv.Itoa(i)
		if _, err := st.Admit(ctx, ask); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Admit within down_for: %v", err)
		}
	}
	if err := st.Release(ctx, Release{Key: "k", Limits: ask.Limits, Lease: "a", Reserved: 1, Used: 5}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Release within down_for: %v", err)
	}
	if n := roundTripErrors.Load(); n != 1 {
		t.Fatalf("%d round trips within down_for, want none", n-1)
	}

	clk.Advance(time.Minute)
	if _, err := st.Admit(ctx, ask); !errors.Is(err, ErrUnavailable) || roundTripErrors.Load() != 2 {
		t.Fatalf("after down_for, Redis still stopped: %v, %d round-trip errors; want a second one", err, roundTripErrors.Load())
	}

	srv.Restart()
	testutil.Eventually(t, 5*time.Second, func() bool {
		clk.Advance(time.Minute)
		_, err := st.Admit(ctx, ask)
		return err == nil
	}, "answering after Restart")
	if st.Down() {
		t.Error("still down after an answer")
	}
}

// blackhole is a TCP server that accepts and never answers: a hung Redis.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// TestRedisTimeout: a Redis that does not answer costs one timeout, then
// down_for fails fast.
func TestRedisTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	st := newRedis(t, blackhole(t), func(c *RedisConfig) { c.Timeout = timeout })
	ask := Ask{Key: "k", Limits: Limits{RequestsPerMinute: 10}}
	start := time.Now()
	_, err := st.Admit(context.Background(), ask)
	took := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || took < timeout-10*time.Millisecond || took > timeout+400*time.Millisecond {
		t.Fatalf("Admit of a hung Redis: %v after %v, want ErrUnavailable after the %v timeout", err, took, timeout)
	}
	start = time.Now()
	if _, err := st.Admit(context.Background(), ask); !errors.Is(err, ErrUnavailable) || time.Since(start) > timeout/2 {
		t.Fatalf("Admit within down_for: %v after %v, want ErrUnavailable at once", err, time.Since(start))
	}
}

// TestRedisCallerContext: a context the caller cancelled, or whose
// deadline passed first, is returned as is: not ErrUnavailable, no
// down_for, no hook.
func TestRedisCallerContext(t *testing.T) {
	var hooked atomic.Int64
	st := newRedis(t, blackhole(t), func(c *RedisConfig) { c.Timeout = 2 * time.Second },
		WithErrorHook(func(error) { hooked.Add(1) }))
	ask := Ask{Key: "k", Limits: Limits{RequestsPerMinute: 10}}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := st.Admit(ctx, ask); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		t.Errorf("a cancelled context: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := st.Admit(ctx, ask)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) || time.Since(start) > time.Second {
		t.Errorf("the caller's deadline first: %v after %v", err, time.Since(start))
	}
	if st.Down() || hooked.Load() != 0 {
		t.Errorf("down %v, %d hook calls: the caller's context says nothing about Redis", st.Down(), hooked.Load())
	}
}

// TestRedisLocalRefusal: after a refusal by the requests limit, the same
// key with the same limits is refused without a round trip (Redis stopped
// meanwhile) until its RetryAfter; other limits ask Redis.
func TestRedisLocalRefusal(t *testing.T) {
	srv := redistest.Start(t)
	clk := newFakeClock()
	st := newRedis(t, srv.Addr(), nil, WithClock(clk.Now))
	l := Limits{RequestsPerMinute: 1, TokensPerMinute: 1000}
	admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10})
	first := admit(t, st, Ask{Key: "k", Limits: l, Tokens: 10})
	if first.Refused != RefusedRequests || first.RetryAfter < 59*time.Second {
		t.Fatalf("the second request: %+v", first)
	}
	srv.Stop()
	clk.Advance(10 * time.Second)
	d, err := st.Admit(context.Background(), Ask{Key: "k", Limits: l, Tokens: 500})
	if err != nil || d.Refused != RefusedRequests || d.RetryAfter != first.RetryAfter-10*time.Second ||
		d.Requests.Reset != first.Requests.Reset-10*time.Second || d.Tokens.Remaining != first.Tokens.Remaining {
		t.Fatalf("refused locally 10 s later: %+v, %v; first %+v", d, err, first)
	}
	if _, err := st.Admit(context.Background(), Ask{Key: "k", Limits: Limits{RequestsPerMinute: 2}}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("other limits ask Redis: %v", err)
	}
	clk.Advance(time.Minute) // past the RetryAfter and down_for
	if _, err := st.Admit(context.Background(), Ask{Key: "k", Limits: l}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("after the RetryAfter, Redis is asked: %v", err)
	}
}

// TestRedisReplicasNeverExceed: two stores (two replicas) on one Redis,
// admitting concurrently, admit exactly the requests limit in a burst and
// never more in flight than the concurrent limit.
func TestRedisReplicasNeverExceed(t *testing.T) {
	srv := redistest.Start(t)
	replicas := []*Redis{newRedis(t, srv.Addr(), nil), newRedis(t, srv.Addr(), nil)}
	const workers, asks = 8, 15
	t.Run("requests", func(t *testing.T) {
		const limit = 40 // T = 1.5 s
		l := Limits{RequestsPerMinute: limit}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := range workers {
			wg.Go(func() {
				for range asks {
					d, err := replicas[w%2].Admit(context.Background(), Ask{Key: "burst", Limits: l})
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		refill := int64(time.Since(start) / (time.Minute / limit))
		if n := admitted.Load(); n < limit || n > limit+refill {
			t.Errorf("%d admitted of %d asks, want the limit %d (+%d refilled)", n, workers*asks, limit, refill)
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		const limit = 3
		l := Limits{Concurrent: limit}
		var inFlight, peak atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				st := replicas[w%2]
				for i := range asks {
					lease := strconv.Itoa(w) + "-" + strconv.Itoa(i)
					d, err := st.Admit(context.Background(), Ask{Key: "conc", Limits: l, Lease: lease})
					if err != nil {
						t.Error(err)
						return
					}
					if !d.Allowed {
						continue
					}
					n := inFlight.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					inFlight.Add(-1)
					if err := st.Release(context.Background(), Release{Key: "conc", Limits: l, Lease: lease}); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if p := peak.Load(); p > limit || p == 0 {
			t.Errorf("peak %d in flight, limit %d", p, limit)
		}
		if d := admit(t, replicas[0], Ask{Key: "conc", Limits: l, Lease: "last"}); d.InFlight != 1 {
			t.Errorf("after all ended, %d in flight with this one", d.InFlight)
		}
	})
}

// TestRedisPassword: password_env's password authenticates; without it
// the store is unavailable (NOAUTH), and an empty variable fails NewRedis.
func TestRedisPassword(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	if err := raw.ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("QUOTA_TEST_REDIS_PASSWORD", "s3cret")
	t.Setenv("QUOTA_TEST_EMPTY", "")
	ask := Ask{Key: "k", Limits: Limits{RequestsPerMinute: 10}}
	withPassword := newRedis(t, srv.Addr(), func(c *RedisConfig) { c.PasswordEnv = "QUOTA_TEST_REDIS_PASSWORD" })
	admit(t, withPassword, ask)
	without := newRedis(t, srv.Addr(), nil)
	if _, err := without.Admit(context.Background(), ask); !errors.Is(err, ErrUnavailable) {
		t.Errorf("no password: %v", err)
	}
	cfg := DefaultRedisConfig()
	cfg.Address, cfg.PasswordEnv = srv.Addr(), "QUOTA_TEST_EMPTY"
	if _, err := NewRedis(cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "QUOTA_TEST_EMPTY") {
		t.Errorf("an empty password variable: %v", err)
	}
}

func TestRedisConfigValidate(t *testing.T) {
	ok := DefaultRedisConfig()
	ok.Address = "redis.internal:6379"
	tests := []struct {
		name string
		mod  func(*RedisConfig)
		want string // "" for valid
	}{
		{"defaults with an address", func(*RedisConfig) {}, ""},
		{"no address: nothing checked", func(c *RedisConfig) { *c = RedisConfig{} }, ""},
		{"ipv6", func(c *RedisConfig) { c.Address = "[::1]:6379" }, ""},
		{"no port", func(c *RedisConfig) { c.Address = "redis.internal" }, "address"},
		{"no host", func(c *RedisConfig) { c.Address = ":6379" }, "address"},
		{"port 0", func(c *RedisConfig) { c.Address = "r:0" }, "address"},
		{"a port too big", func(c *RedisConfig) { c.Address = "r:70000" }, "address"},
		{"password_env not a name", func(c *RedisConfig) { c.PasswordEnv = "REDIS PASSWORD" }, "password_env"},
		{"password_env from a digit", func(c *RedisConfig) { c.PasswordEnv = "1PW" }, "password_env"},
		{"password_env", func(c *RedisConfig) { c.PasswordEnv = "REDIS_PASSWORD_2" }, ""},
		{"db negative", func(c *RedisConfig) { c.DB = -1 }, "db"},
		{"timeout 0", func(c *RedisConfig) { c.Timeout = 0 }, "timeout"},
		{"down_for negative", func(c *RedisConfig) { c.DownFor = -time.Second }, "down_for"},
		{"down_for 0", func(c *RedisConfig) { c.DownFor = 0 }, ""},
		{"a prefix with a brace", func(c *RedisConfig) { c.KeyPrefix = "q:{x}:" }, "key_prefix"},
		{"an empty prefix", func(c *RedisConfig) { c.KeyPrefix = "" }, ""},
		{"lease_ttl too short", func(c *RedisConfig) { c.LeaseTTL = 50 * time.Millisecond }, "lease_ttl"},
		{"lease_ttl under 3 timeouts", func(c *RedisConfig) { c.Timeout = time.Second; c.LeaseTTL = 2 * time.Second }, "lease_ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mod(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tt.want != "" && (!errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate: %v, want an ErrInvalidConfig about %s", err, tt.want)
			}
		})
	}
	if _, err := NewRedis(RedisConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewRedis with no address: %v", err)
	}
	bad := ok
	bad.Timeout, bad.DB = 0, -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "timeout") || !strings.Contains(err.Error(), "db") {
		t.Errorf("every problem is reported: %v", err)
	}
}

// TestRedisCloseTwice: Close is idempotent, and the store is unavailable
// after it.
func TestRedisCloseTwice(t *testing.T) {
	st, err := NewRedis(RedisConfig{Address: "127.0.0.1:1", Timeout: time.Second, LeaseTTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Admit(context.Background(), Ask{Key: "k", Limits: Limits{RequestsPerMinute: 1}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Admit after Close: %v", err)
	}
}

func BenchmarkRedisAdmitRelease(b *testing.B) {
	srv := redistest.Start(b)
	st := newRedis(b, srv.Addr(), nil)
	ctx := context.Background()
	l := Limits{RequestsPerMinute: math.MaxInt32, TokensPerMinute: 1e12, Concurrent: 100}
	a := Ask{Key: "team", Limits: l, Tokens: 100, Lease: "lease"}
	r := Release{Key: "team", Limits: l, Lease: "lease", Reserved: 100, Used: 80}
	b.ReportAllocs()
	for b.Loop() {
		if d, err := st.Admit(ctx, a); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
		if err := st.Release(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
}

// gcraProbeLua runs gcra.lua's functions on given inputs (a bucket, a
// rate, a time), so TestLuaMatchesGo can compare them with gcra.go's.
const gcraProbeLua = `
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '0' then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4] .. ' ' .. ARGV[5])
end
local per, full, cell, tick = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local now, n, delta = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local d = debt_at(KEYS[1], per, full, tick, now)
local q = floorto(now, tick)
local after = d + n * cell
local settled = d + delta * cell
if settled < 0 then
  settled = 0
elseif settled > MAXDEBT then
  settled = MAXDEBT
end
local retry = 0
if after > full then
  retry = untilrepaid(after - full, q, now, per, tick)
end
return {d, after, remaining(d, full, cell), untilrepaid(d, q, now, per, tick), retry, settled}
`

// TestLuaMatchesGo: gcra.lua computes exactly what gcra.go does, on
// random buckets, limits (a reload between them included), times, costs
// and settlements, up to the extremes (debts near 2^52, 1 ms ticks).
func TestLuaMatchesGo(t *testing.T) {
	srv := redistest.Start(t)
	raw := rawClient(t, srv.Addr())
	probe := redis.NewScript(gcraLua + gcraProbeLua)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	limits := append([]int64{3, 59, 61, 120, 997, 65_537, 7_000_001}, limitsUnderTest...)
	const now0 = 1_800_000_000_123_457 // µs, not on a tick
	for i := range 1500 {
		old, cur := newRate(limits[rng.IntN(len(limits))]), newRate(limits[rng.IntN(len(limits))])
		if i%3 == 0 {
			old = cur // mostly no reload
		}
		var b bucket
		if i%17 != 0 { // sometimes no bucket at all
			debt := []int64{0, 1, old.cell, old.full, old.full + 1, maxDebt - 1, maxDebt, rng.Int64N(old.full + 1), rng.Int64N(maxDebt)}[rng.IntN(9)]
			b = bucket{debt: debt, at: floorTo(now0-rng.Int64N(120_000_000), old.tick), r: old}
		}
		now := now0 + []int64{0, 1, -5_000_000, rng.Int64N(90_000_000)}[rng.IntN(4)] // -: the clock went back
		n := []int64{0, 1, cur.limit(), rng.Int64N(cur.limit() + 1)}[rng.IntN(4)]
		dt := []int64{0, -1, 1, math.MaxInt64, math.MinInt64, rng.Int64N(2*cur.limit()+1) - cur.limit()}[rng.IntN(6)]

		d := b.debtAt(cur, now)
		q := floorTo(now, cur.tick)
		after, ok := cur.take(d, n)
		var retry int64
		if !ok {
			retry = cur.until(after-cur.full, q, now)
		}
		want := []int64{d, after, cur.remaining(d), cur.until(d, q, now), retry, cur.settle(d, dt)}
		got, err := probe.Run(ctx, raw, []string{"probe"},
			b.debt, b.at, b.r.per, b.r.full, b.r.tick,
			cur.per, cur.full, cur.cell, cur.tick, now, n, dt).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("case %d: bucket %+v, rate %+v, now %d, n %d, delta %d:\n Lua %v\n  Go %v\n(debt, after, remaining, reset, retry, settled)", i, b, cur, now, n, dt, got, want)
		}
	}
}
