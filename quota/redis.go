package quota

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisConfig is the Redis store's operator settings (the gateway's
// limits.redis section). The zero value has no Address: Redis is not used.
type RedisConfig struct {
	// Address is Redis's "host:port"; "" means Redis is not used (each
	// process keeps its own limits).
	Address string `koanf:"address"`
	// Username is the ACL user to authenticate as ("" for the default
	// user).
	Username string `koanf:"username"`
	// PasswordEnv names the environment variable holding the password
	// ("": none). NewRedis reads it and fails when it is unset or empty.
	PasswordEnv string `koanf:"password_env"`
	// DB is the database number (default 0).
	DB int `koanf:"db"`
	// Timeout is the longest an admission (or a release) waits for Redis,
	// connecting included (default 50 ms). Past it the call fails with
	// ErrUnavailable and down_for begins.
	Timeout time.Duration `koanf:"timeout"`
	// DownFor is how long after a failure Admit and Release fail at once
	// with ErrUnavailable without asking Redis, before one call tries
	// again (default 1 s): a dead Redis costs one timeout per down_for,
	// not one per request. 0 asks again at once.
	DownFor time.Duration `koanf:"down_for"`
	// KeyPrefix starts every Redis key the store writes (default
	// "switchboard:quota:"); it may not contain '{' or '}' (the key
	// name's hash tag follows it).
	KeyPrefix string `koanf:"key_prefix"`
	// LeaseTTL is how long a concurrency lease lives without renewal
	// (default 30 s). This process renews its leases every LeaseTTL/3, so
	// a crashed replica's requests stop counting within LeaseTTL. At least
	// 100 ms and 3 times Timeout.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// TLS connects with TLS (1.2 or later), verifying the server's
	// certificate against the system roots for Address's host.
	TLS bool `koanf:"tls"`
}

// The RedisConfig defaults (DefaultRedisConfig).
const (
	defaultRedisTimeout   = 50 * time.Millisecond
	defaultRedisDownFor   = time.Second
	defaultRedisKeyPrefix = "switchboard:quota:"
	defaultRedisLeaseTTL  = 30 * time.Second
	minLeaseTTL           = 100 * time.Millisecond
)

// DefaultRedisConfig returns the defaults: no address (Redis not used), a
// 50 ms timeout, 1 s down_for, the "switchboard:quota:" prefix and 30 s
// leases.
func DefaultRedisConfig() RedisConfig {
	return RedisConfig{Timeout: defaultRedisTimeout, DownFor: defaultRedisDownFor,
		KeyPrefix: defaultRedisKeyPrefix, LeaseTTL: defaultRedisLeaseTTL}
}

// Validate reports every problem of a configuration with an Address,
// joined, each wrapping ErrInvalidConfig; with no Address there is nothing
// to check. It does not read the environment (NewRedis does).
func (c RedisConfig) Validate() error {
	if c.Address == "" {
		return nil
	}
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if host, port, err := net.SplitHostPort(c.Address); err != nil {
		bad("address %q: %v", c.Address, err)
	} else if p, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || p == 0 {
		bad("address %q: want host:port", c.Address)
	}
	if c.PasswordEnv != "" && !envName(c.PasswordEnv) {
		bad("password_env %q is not an environment variable name", c.PasswordEnv)
	}
	if c.DB < 0 {
		bad("db %d is negative", c.DB)
	}
	if c.Timeout <= 0 {
		bad("timeout %v must be positive", c.Timeout)
	}
	if c.DownFor < 0 {
		bad("down_for %v is negative", c.DownFor)
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		bad("key_prefix %q may not contain '{' or '}' (the key name's hash tag follows it)", c.KeyPrefix)
	}
	if c.LeaseTTL < minLeaseTTL || c.LeaseTTL < 3*c.Timeout {
		bad("lease_ttl %v must be at least %v and 3 times timeout (it is renewed every lease_ttl/3)", c.LeaseTTL, minLeaseTTL)
	}
	return errors.Join(errs...)
}

func envName(s string) bool {
	for i, c := range s {
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// The scripts: gcra.lua's math, then each one's own steps.
var (
	//go:embed gcra.lua
	gcraLua string
	//go:embed admit.lua
	admitLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string
	//go:embed spend.lua
	spendLua string

	admitScript   = redis.NewScript(gcraLua + spendLua + admitLua)
	releaseScript = redis.NewScript(gcraLua + spendLua + releaseLua)
	renewScript   = redis.NewScript(gcraLua + renewLua)
)

// Redis is the [Store] shared by every replica using the same Redis: see
// the package documentation (# Redis, # Failure). It is safe for
// concurrent use. It holds a connection pool and one goroutine renewing
// its leases; Close stops both.
type Redis struct {
	cfg     RedisConfig
	clock   clock
	onError func(error)
	client  *redis.Client
	ttlUS   int64 // LeaseTTL in µs

	// The down_for state: down since a failure and until an answer;
	// downUntil (ns on clock) ends the fast failures, then one probing
	// call asks Redis.
	down      atomic.Bool
	downUntil atomic.Int64
	probing   atomic.Bool
	downErr   atomic.Pointer[error]
	closed    atomic.Bool

	mu       sync.Mutex
	refusals map[string]refusal // key name -> its requests refusal
	held     map[string]*held   // key name -> the leases this process holds

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// spendShift (µs) is added to Redis's clock for the spend windows
	// only: tests set it, before any call, to move across a UTC day or
	// month. 0 otherwise.
	spendShift int64
}

var _ Store = (*Redis)(nil)

// refusal is a requests refusal kept locally until it could change.
type refusal struct {
	limits    Limits
	at, until int64 // ns on the clock: when asked, when Redis could admit
	d         Decision
}

// held is one key's leases this process holds, renewed in the background.
type held struct {
	conc   string // the key's leases sorted set
	leases map[string]struct{}
}

// maxRefusals bounds the local refusals kept before expired ones are
// swept (keys are configured names: it is a backstop).
const maxRefusals = 1024

// NewRedis returns a Redis store for cfg. It takes [WithClock] (for the
// local refusals and down_for only: the buckets keep Redis's time) and
// [WithErrorHook]. It fails, wrapping ErrInvalidConfig, on an invalid or
// empty-address cfg or when PasswordEnv names an unset or empty variable.
// It does not connect: the first Admit does (a Redis down at start-up is
// the same as one down later).
func NewRedis(cfg RedisConfig, opts ...Option) (*Redis, error) {
	if cfg.Address == "" {
		return nil, fmt.Errorf("%w: address is empty", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var password string
	if cfg.PasswordEnv != "" {
		if password = os.Getenv(cfg.PasswordEnv); password == "" {
			return nil, fmt.Errorf("%w: password_env: %s is not set or empty", ErrInvalidConfig, cfg.PasswordEnv)
		}
	}
	o := newConfig(opts)
	ro := &redis.Options{
		Addr:     cfg.Address,
		Username: cfg.Username,
		Password: password,
		DB:       cfg.DB,
		// Every wait is bounded by the call's timeout (its context's
		// deadline). No retries: a script is not idempotent, and down_for
		// is the retry.
		DialTimeout:           cfg.Timeout,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		PoolTimeout:           cfg.Timeout,
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		DialerRetries:         1,
		// No CLIENT SETINFO nor maintenance-notification handshake: fewer
		// round trips when a connection is made on an admission's time.
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if cfg.TLS {
		host, _, _ := net.SplitHostPort(cfg.Address)
		ro.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	r := &Redis{
		cfg:      cfg,
		clock:    newClock(o.now),
		onError:  o.onError,
		client:   redis.NewClient(ro),
		ttlUS:    cfg.LeaseTTL.Microseconds(),
		refusals: make(map[string]refusal),
		held:     make(map[string]*held),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(1)
	go r.renewLoop()
	return r, nil
}

// Admit asks Redis, in one round trip, to take one request, a.Tokens
// tokens, a.Spend (in the current UTC day and month of Redis's clock) and
// a.Lease from a.Key's state, or nothing (see [Store]); a key
// refused by its requests limit is refused again locally, without a round
// trip, until its RetryAfter. It fails with ErrInvalidAsk for a Concurrent
// limit without a Lease; with an error wrapping ErrUnavailable when Redis
// does not answer within Timeout, fails, or is in its down_for period
// (the Ask may or may not have been applied: a lease taken then expires
// within LeaseTTL); and with ctx's own error, as is, when ctx is done. A
// lease already held is held once (leases must be unique).
func (r *Redis) Admit(ctx context.Context, a Ask) (Decision, error) {
	if err := a.check(); err != nil {
		return Decision{}, err
	}
	l := a.Limits
	if l.RequestsPerMinute <= 0 && l.TokensPerMinute <= 0 && l.Concurrent <= 0 && !l.spend() {
		return Decision{Allowed: true}, nil
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	sent := r.clock.nanos()
	if d, ok := r.refusedLocally(a, sent); ok {
		return d, nil
	}
	probe, err := r.gate(sent)
	if err != nil {
		return Decision{}, err
	}
	if probe {
		defer r.probing.Store(false)
	}
	rr, tr := newRate(l.RequestsPerMinute), newRate(l.TokensPerMinute)
	keys := r.keys(a.Key)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	v, err := admitScript.Run(cctx, r.client, keys,
		rr.per, rr.full, rr.cell, rr.tick,
		tr.per, tr.full, tr.cell, tr.tick, a.Tokens,
		max(l.Concurrent, 0), a.Lease, r.ttlUS,
		max(l.SpendPerDay, 0), max(l.SpendPerMonth, 0), max(a.Spend, 0), r.spendShift).Int64Slice()
	if err == nil && len(v) != 12 {
		err = fmt.Errorf("the admit script answered %d values, want 12", len(v))
	}
	if err != nil {
		return Decision{}, r.failed(ctx, "admit", err)
	}
	r.answered()
	d := Decision{Allowed: v[0] == 1}
	switch v[1] {
	case 1:
		d.Refused = RefusedRequests
	case 2:
		d.Refused = RefusedTokens
	case 3:
		d.Refused = RefusedConcurrent
	case 4:
		d.Refused = RefusedSpend
	}
	if v[2] > 0 {
		d.RetryAfter = max(micros(v[2]), time.Millisecond)
	}
	if l.RequestsPerMinute > 0 {
		d.Requests = Bucket{Limit: l.RequestsPerMinute, Remaining: v[3], Reset: micros(v[4])}
	}
	if l.TokensPerMinute > 0 {
		d.Tokens = Bucket{Limit: l.TokensPerMinute, Remaining: v[5], Reset: micros(v[6])}
	}
	if l.Concurrent > 0 {
		d.InFlight = v[7]
	}
	d.Spend = SpendState{Day: v[8], Month: v[9]}
	if d.Allowed {
		if l.SpendPerDay > 0 {
			d.SpendWindow.Day = strconv.FormatInt(v[10], 10)
		}
		if l.SpendPerMonth > 0 {
			d.SpendWindow.Month = strconv.FormatInt(v[11], 10)
		}
	}
	switch {
	case d.Allowed && l.Concurrent > 0:
		r.hold(a.Key, keys[2], a.Lease)
	case d.Refused == RefusedRequests:
		// Redis's now was after sent: Redis admits no earlier than
		// sent+retry, so refusing until then is exact.
		r.keepRefusal(a.Key, refusal{limits: l, at: sent, until: sent + int64(micros(v[2])), d: d})
	}
	return d, nil
}

// Release gives back r.Lease, if this store holds it (a second Release of
// a lease changes nothing for concurrency), and settles the tokens bucket
// by rel.Used-rel.Reserved when rel.Limits has a TokensPerMinute limit, and
// the spend windows rel.SpendDay and rel.SpendMonth (the current ones when
// "" or malformed) by rel.UsedSpend-rel.ReservedSpend for each spend limit
// of rel.Limits (never below 0; a window ended a day or more ago is gone
// and settles nothing), in one round trip; with nothing to do it makes
// none. Its errors are
// Admit's: a Release that fails is not retried (its lease expires within
// LeaseTTL; its settlement is lost).
func (r *Redis) Release(ctx context.Context, rel Release) error {
	lease := ""
	if rel.Lease != "" && r.unhold(rel.Key, rel.Lease) {
		lease = rel.Lease
	}
	var tr rate
	dt := delta(rel.Used, rel.Reserved)
	if rel.Limits.TokensPerMinute > 0 && dt != 0 {
		tr = newRate(rel.Limits.TokensPerMinute)
	} else {
		dt = 0
	}
	ds := delta(rel.UsedSpend, rel.ReservedSpend)
	if !rel.Limits.spend() {
		ds = 0
	}
	if lease == "" && dt == 0 && ds == 0 {
		return nil
	}
	day, month := rel.SpendDay, rel.SpendMonth
	if _, _, ok := parseDay(day); !ok {
		day = ""
	}
	if _, _, ok := parseMonth(month); !ok {
		month = ""
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	probe, err := r.gate(r.clock.nanos())
	if err != nil {
		return err
	}
	if probe {
		defer r.probing.Store(false)
	}
	keys := r.keys(rel.Key)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	err = releaseScript.Run(cctx, r.client, keys[1:],
		lease, dt, tr.per, tr.full, tr.cell, tr.tick,
		ds, flag(rel.Limits.SpendPerDay > 0), flag(rel.Limits.SpendPerMonth > 0), day, month, r.spendShift).Err()
	if err != nil {
		return r.failed(ctx, "release", err)
	}
	r.answered()
	return nil
}

// Down reports whether the store is in its down state: its last round
// trip failed and none has answered since (Admit and Release fail fast
// with ErrUnavailable for down_for after each failure). For a gauge; safe
// for concurrent use.
func (r *Redis) Down() bool { return r.down.Load() }

// Close stops the lease renewal, waits for it and closes the connections.
// The leases still held are not released: they expire within LeaseTTL.
// After Close, Admit and Release fail with ErrUnavailable. Calling it again
// returns the first call's result.
func (r *Redis) Close() error {
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		r.cancel()
		r.wg.Wait()
		r.closeErr = r.client.Close()
	})
	return r.closeErr
}

// keys are a key name's Redis keys: requests, tokens, leases and spend
// (the hash of its spend windows, fields d:YYYYMMDD and m:YYYYMM). They
// share the hash tag {name}, so a Redis Cluster keeps them on one node.
// Each script declares in KEYS every key it touches (admit.lua all four,
// release.lua the last three, renew.lua the leases): Redis's scripting
// contract, which Redis Cluster's routing and Dragonfly rely on.
func (r *Redis) keys(name string) []string {
	base := r.cfg.KeyPrefix + "{" + name + "}:"
	return []string{base + "req", base + "tok", base + "conc", base + "spend"}
}

// flag is a boolean as a script argument.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

var errClosed = fmt.Errorf("%w: the store is closed", ErrUnavailable)

// gate lets a call ask Redis, or fails it fast in the down_for period.
// probe is true for the one call let through when the period is over; it
// must clear r.probing when done.
func (r *Redis) gate(now int64) (probe bool, err error) {
	if r.closed.Load() {
		return false, errClosed
	}
	if !r.down.Load() {
		return false, nil
	}
	if now < r.downUntil.Load() || !r.probing.CompareAndSwap(false, true) {
		return false, *r.downErr.Load()
	}
	return true, nil
}

// failed handles a round trip's error: ctx's own error as is; anything
// else starts the down_for period, goes to the hook and is returned
// wrapping ErrUnavailable.
func (r *Redis) failed(ctx context.Context, op string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		// The caller's deadline, not ours, ended the call: ctx is about to
		// say so (its timer and the connection's deadline race).
		return context.DeadlineExceeded
	}
	if r.closed.Load() {
		return errClosed
	}
	e := fmt.Errorf("%w: redis %s: %s: %w", ErrUnavailable, r.cfg.Address, op, err)
	fast := fmt.Errorf("%w: redis %s is down (asked again %v after its last failure: %v)", ErrUnavailable, r.cfg.Address, r.cfg.DownFor, err)
	r.downErr.Store(&fast)
	r.downUntil.Store(r.clock.nanos() + int64(r.cfg.DownFor))
	r.down.Store(true)
	r.report(e)
	return e
}

// answered ends the down state.
func (r *Redis) answered() {
	if r.down.Load() {
		r.down.Store(false)
	}
}

func (r *Redis) report(err error) {
	if r.onError != nil {
		r.onError(err)
	}
}

// refusedLocally returns the kept requests refusal of a.Key, if it still
// holds for a.Limits at now.
func (r *Redis) refusedLocally(a Ask, now int64) (Decision, bool) {
	if a.Limits.RequestsPerMinute <= 0 {
		return Decision{}, false
	}
	r.mu.Lock()
	f, ok := r.refusals[a.Key]
	if ok && (now >= f.until || f.limits != a.Limits) {
		delete(r.refusals, a.Key)
		ok = false
	}
	r.mu.Unlock()
	if !ok {
		return Decision{}, false
	}
	d, since := f.d, time.Duration(now-f.at)
	d.RetryAfter = max(time.Duration(f.until-now), time.Millisecond)
	d.Requests.Reset = max(d.Requests.Reset-since, 0)
	d.Tokens.Reset = max(d.Tokens.Reset-since, 0)
	return d, true
}

func (r *Redis) keepRefusal(key string, f refusal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.refusals) >= maxRefusals {
		for k, old := range r.refusals {
			if f.at >= old.until {
				delete(r.refusals, k)
			}
		}
	}
	r.refusals[key] = f
}

// hold records a lease this process holds, for renewal.
func (r *Redis) hold(key, conc, lease string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.held[key]
	if h == nil {
		h = &held{conc: conc, leases: make(map[string]struct{})}
		r.held[key] = h
	}
	h.leases[lease] = struct{}{}
}

// unhold forgets a lease, reporting whether it was held.
func (r *Redis) unhold(key, lease string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.held[key]
	if h == nil {
		return false
	}
	if _, ok := h.leases[lease]; !ok {
		return false
	}
	delete(h.leases, lease)
	if len(h.leases) == 0 {
		delete(r.held, key)
	}
	return true
}

// renewLoop renews the held leases every LeaseTTL/3 until Close.
func (r *Redis) renewLoop() {
	defer r.wg.Done()
	t := time.NewTicker(r.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
			r.renew()
		}
	}
}

// renew runs renew.lua once per key with leases held. A failure is
// reported and ends this round: the next one tries again (a lease
// survives two missed rounds).
func (r *Redis) renew() {
	type batch struct {
		conc string
		args []any
	}
	r.mu.Lock()
	batches := make([]batch, 0, len(r.held))
	for _, h := range r.held {
		args := make([]any, 0, 1+len(h.leases))
		args = append(args, r.ttlUS)
		for l := range h.leases {
			args = append(args, l)
		}
		batches = append(batches, batch{conc: h.conc, args: args})
	}
	r.mu.Unlock()
	for _, b := range batches {
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.Timeout)
		err := renewScript.Run(ctx, r.client, []string{b.conc}, b.args...).Err()
		cancel()
		if err != nil {
			if r.ctx.Err() == nil {
				r.report(fmt.Errorf("%w: redis %s: renewing %d leases: %w", ErrUnavailable, r.cfg.Address, len(b.args)-1, err))
			}
			return
		}
	}
}
