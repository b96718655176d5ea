// Package quota keeps API keys' limits: requests per minute, tokens per
// minute (reserved at admission, settled to the real usage at the end),
// requests in flight at once, and spend budgets per UTC day and month
// (a cost reserved at admission, settled to the real cost at the end).
//
// A [Store] answers an [Ask] with a [Decision] and takes back a [Release].
// Two stores implement it: [Memory], per process, and [Redis], shared by
// every replica using the same Redis. Both make the same decisions from
// the same state: the bucket math is one set of integer functions
// (gcra.go) that the Redis store runs as a Lua transliteration.
//
// # Algorithm
//
// Each per-minute limit is a GCRA bucket (the Generic Cell Rate Algorithm
// of the ATM Forum's Traffic Management Specification 4.0, as used by
// brandur's throttled and by redis-cell). With emission interval T = 60
// s/limit, a bucket keeps a theoretical arrival time tat; a cost of n is
// allowed iff max(tat, now) + n*T - now <= 60 s, and then tat becomes that.
// So the bucket holds at most limit (the burst is the limit) and refills
// at limit per minute, continuously. The Decision reports, as OpenAI's
// x-ratelimit-* headers do, Remaining = floor((60 s - (tat-now))/T) and
// Reset = tat - now (the time until the bucket is full); a refusal's
// RetryAfter is tat' - 60 s - now, at least 1 ms. A cost above the limit
// is never allowed (RetryAfter 0). A Release settles a reservation: tat
// moves by (Used-Reserved)*T, forward for an overrun (the key is then in
// debt and refused until it is repaid), back for what was not used, but
// never before now (a bucket is never fuller than its limit).
//
// The checks run in order, requests, tokens, spend, concurrent, and all of
// them pass before anything is taken: a refused Ask changes nothing.
//
// T is rarely a whole number of anything (60 s/7; 60 ns for a billion
// tokens), and rounding it lets limit+1 in at once or only limit-1. So the
// math keeps tat - now as an integer debt in units chosen per limit: with
// g = gcd(limit, ticks per minute), one request (or token) adds
// (ticks per minute)/g, one tick repays limit/g, and the bucket is empty at
// debt limit*(ticks per minute)/g. Every step is exact: exactly limit is
// allowed at one instant and the next refused, for any limit up to 10^12
// (a larger one acts as 10^12). The tick is 1 µs, or a coarser power of
// ten for the few large limits (above about a million tokens) whose units
// would otherwise not fit 2^46; a debt is capped at 2^52 (at least 64
// minutes of overrun), so every value fits the 53 bits a Lua number keeps
// exactly. A reload that changes a key's limit keeps its bucket's fill (the
// same fraction of a minute of debt, rounded up).
//
// Concurrency is the count of the key's leases held: Admit adds Ask.Lease,
// Release removes it. Releasing a lease not held (twice, or never
// admitted) changes nothing, so the count never goes negative. Leases must
// be unique among the requests in flight: one already held is not counted
// twice. An Ask with a Concurrent limit and no Lease is an error
// ([ErrInvalidAsk]).
//
// # Spend
//
// Limits.SpendPerDay and SpendPerMonth bound what a key's requests cost
// (in nano-USD, 10^-9 USD) in one UTC calendar day and month of the
// store's clock (Memory's, or Redis's TIME). Each window keeps one total,
// spent + reserved. An Ask is allowed when total + Ask.Spend is within
// every spend limit set, and then adds Ask.Spend to each window with a
// limit; otherwise it is refused with RefusedSpend and a RetryAfter until
// the refusing window ends (the next UTC midnight, or the first of the next
// month; the later when both refuse), or 0 when Ask.Spend alone is above a
// refusing limit (it never fits). The Decision's Spend reports the totals
// and its SpendWindow names the windows reserved in ("YYYYMMDD",
// "YYYYMM").
//
// A Release adds UsedSpend-ReservedSpend to the windows its SpendDay and
// SpendMonth name: the admission's, even when a day or month ended while
// the request ran (a window is kept a day past its end for this; a
// settlement into a window ended longer ago is dropped). A negative
// difference is given back, never below 0. So admission keeps spent +
// reserved within the limit, and a window overspends only when a
// request's real cost exceeds its reservation, by that excess (the key is
// then refused until the window ends).
//
// Memory keeps each key's windows in its entry, dropping those ended a day
// ago; Redis keeps them in one hash per key, <key_prefix>{<key name>}:spend,
// a field per window, d:<YYYYMMDD> and m:<YYYYMM>, holding its total. The
// scripts name the fields from Redis's clock; the hash itself is a declared
// key, as every key a script touches is. Each write drops the fields of
// windows ended a day or more ago (so, with Redis's clock moving forward, a
// hash holds at most two day and two month fields) and sets the hash to
// expire a day past its latest window's end, so an idle key's hash goes.
// Lua keeps numbers as doubles: totals are exact up to 2^53 nano-USD (about
// 9 million USD).
//
// # Redis
//
// [Redis] answers each Admit in one round trip: one Lua script (EVALSHA,
// falling back to EVAL when Redis does not have it) reads Redis's own clock
// (TIME, so replicas with skewed clocks agree), checks the requests bucket,
// the tokens bucket, the spend windows and the concurrency leases, and
// commits all of it or none. Every key a script touches is among its
// declared KEYS. A key's state is three Redis keys (and its spend windows'
// hash, # Spend) sharing a Redis Cluster hash tag:
// <key_prefix>{<key name>}:req and :tok (strings: the debt, its time and
// its units; they expire when their bucket is full again, so idle keys
// vanish) and :conc, the leases as a sorted set scored by their expiry (the
// counting semaphore with expiring leases of Redis in Action, 6.3; the set
// expires lease_ttl after its last change). Expired leases are removed
// before counting; a lease lives lease_ttl, and the process holding it
// renews it every lease_ttl/3 until it is released, so the leases of a
// replica that crashed expire within lease_ttl. A Release is one round
// trip too (the lease removed, the tokens and the spend settled), or none
// when there is nothing to give back.
//
// The one thing cached in the process is a refusal by the requests limit:
// requests are never given back, so until its RetryAfter the same key with
// the same Limits is refused again, exactly, without asking Redis. Its
// headers are those of the refusal, with Reset shortened by the time since.
//
// # Failure
//
// Redis waits at most timeout (RedisConfig.Timeout) for Redis, including
// setting up a connection, and never retries within an admission. A
// failure (a timeout, a refused or broken connection, an error reply)
// returns an error wrapping [ErrUnavailable] and starts the down_for
// period: for down_for, Admit and Release fail at once with
// ErrUnavailable without asking Redis; then one call asks again, the others
// still failing fast, until an answer ends the period. A dead Redis so costs
// one timeout per down_for, not one per request. The caller applies its
// fail mode (admit uncounted, or refuse with 503). A context the caller
// cancelled (or whose deadline passed) is returned as is: it says nothing
// about Redis.
//
// A failed Release is not retried: its lease expires by itself within
// lease_ttl, and its settlement is lost (a reservation not given back, an
// overrun not charged). An Admit that timed out may still have been applied
// by Redis; its lease then expires the same way.
//
// The store logs nothing: [WithErrorHook] hands every error of a round
// trip to the caller (a metric, a bounded log line), and [Redis.Down]
// reports the down state for a gauge. The go-redis client's own log lines
// go to its process-wide logger (redis.SetLogger), which this package
// leaves alone.
package quota
