package quota

import (
	"context"
	"errors"
	"time"
)

// Limits are one API key's limits. Zero means no limit of that kind.
type Limits struct {
	// RequestsPerMinute: requests admitted per minute, as a GCRA bucket
	// that holds at most RequestsPerMinute and refills at
	// RequestsPerMinute/60 per second.
	RequestsPerMinute int64
	// TokensPerMinute: tokens (input + output) per minute, the same kind
	// of bucket; a request takes its reservation at admission and is
	// settled to its real usage when it ends (Store.Release).
	TokensPerMinute int64
	// Concurrent: requests in flight at once.
	Concurrent int64
	// SpendPerDay and SpendPerMonth: the most the key's requests may cost
	// in one UTC calendar day / month of the store's clock, in nano-USD
	// (10^-9 USD). A request reserves its estimated cost (Ask.Spend) at
	// admission and is settled to its real cost at Release. Admission
	// keeps spent + reserved within the limit, so a window overspends only
	// when a request's real cost exceeds its reservation, by that excess.
	SpendPerDay, SpendPerMonth int64
}

// IsZero reports whether l limits nothing.
func (l Limits) IsZero() bool { return l == Limits{} }

// spend reports whether l has a spend limit.
func (l Limits) spend() bool { return l.SpendPerDay > 0 || l.SpendPerMonth > 0 }

// Ask is one admission.
type Ask struct {
	// Key is the key's configured name (bounded: configured names only).
	Key string
	// Limits are the key's limits (a reload may change them; the store
	// applies the ones it is given).
	Limits Limits
	// Tokens is the reservation, in tokens: the prompt estimate plus the
	// request's max_tokens (or the configured default). Ignored without a
	// TokensPerMinute limit.
	Tokens int64
	// Lease names this request's concurrency slot, unique among the
	// requests in flight in the fleet (a request id with the replica's
	// id). Ignored without a Concurrent limit.
	Lease string
	// Spend is the cost reservation, in nano-USD: the request's estimated
	// cost (a negative one counts as 0). Ignored without a SpendPerDay or
	// SpendPerMonth limit.
	Spend int64
}

// Refused names the limit a refused admission hit.
type Refused string

// The limits an admission can be refused by.
const (
	RefusedNone       Refused = ""
	RefusedRequests   Refused = "requests"
	RefusedTokens     Refused = "tokens"
	RefusedSpend      Refused = "spend"
	RefusedConcurrent Refused = "concurrent"
)

// Bucket is one per-minute limit's state after an admission, as OpenAI's
// x-ratelimit-* headers report it.
type Bucket struct {
	// Limit is the configured per-minute limit (0: none; the other fields
	// are then zero).
	Limit int64
	// Remaining is what could still be taken at once, >= 0.
	Remaining int64
	// Reset is the time until the bucket is full again, >= 0.
	Reset time.Duration
}

// Decision is a store's answer to an Ask.
type Decision struct {
	// Allowed: the request is admitted and holds what it asked (its
	// request, its token reservation, its lease) until Release.
	Allowed bool
	// Refused names the limit that refused it (RefusedNone when allowed).
	// When several would, the first of requests, tokens, spend,
	// concurrent.
	Refused Refused
	// RetryAfter is, when refused, the wait before the same Ask could be
	// admitted (>= 1 ms for requests and tokens; for spend, the time until
	// the refusing window ends: the next UTC midnight for the day limit,
	// the next month's first day for the month limit, the later when both
	// refuse); 0 when it never can (a reservation larger than
	// TokensPerMinute, or a Spend larger than a spend limit) or for
	// concurrency (it depends on other requests ending).
	RetryAfter time.Duration
	// Requests and Tokens are the buckets after this admission (or as they
	// stand, when refused: a refused Ask takes nothing).
	Requests, Tokens Bucket
	// InFlight is the key's requests in flight after this admission (0
	// without a Concurrent limit).
	InFlight int64
	// Spend is the key's spend windows after this admission (or as they
	// stand, when refused); zero without spend limits.
	Spend SpendState
	// SpendWindow names the windows an allowed Ask reserved its Spend in;
	// the caller copies it into Release.SpendDay and SpendMonth so the
	// settlement goes into the same windows even if a UTC day or month
	// ended meanwhile. Empty without spend limits.
	SpendWindow SpendWindow
}

// SpendState is a key's spend in its current windows.
type SpendState struct {
	// Day and Month are spent + reserved in the current UTC day and month,
	// in nano-USD (0 for a window without a limit).
	Day, Month int64
}

// SpendWindow names a UTC day ("YYYYMMDD") and month ("YYYYMM") of the
// store's clock; "" for a window without a limit.
type SpendWindow struct {
	Day, Month string
}

// Release is what a request gives back when it ends.
type Release struct {
	Key    string
	Limits Limits
	// Lease is the Ask's lease.
	Lease string
	// Reserved is the Ask's Tokens; Used is what the request really used
	// (its usage, or the gateway's estimate). Used-Reserved is put into
	// (positive) or given back to (negative) the tokens bucket; the bucket
	// is never fuller than its limit.
	Reserved, Used int64
	// ReservedSpend is the Ask's Spend and UsedSpend the request's real
	// cost, in nano-USD: UsedSpend-ReservedSpend is added (a negative
	// difference given back, never below 0) to the day and month windows
	// the Ask reserved in, for each spend limit of Limits.
	ReservedSpend, UsedSpend int64
	// SpendDay and SpendMonth are the Decision's SpendWindow.Day and
	// Month: the windows to settle into, even if they have ended since (a
	// window is kept a day past its end for this). "" or a malformed id
	// settles into the current window; a window ended more than a day ago
	// is no longer kept and its settlement is dropped.
	SpendDay, SpendMonth string
}

// ErrUnavailable is returned (wrapped) by a store that cannot answer in
// time (Redis unreachable or slower than its timeout). The caller applies
// its fail mode: admit anyway (fail open) or refuse with 503 (fail closed).
var ErrUnavailable = errors.New("quota store unavailable")

// Store keeps every key's limits' state. Implementations must be safe for
// concurrent use: [Memory] (per process) and [Redis] (shared by replicas).
//
// Admit takes, atomically, one request, Ask.Tokens tokens, Ask.Spend and a
// lease, or nothing: an Ask any limit refuses changes no state. Release
// gives back the lease and settles the tokens and the spend; it is called
// exactly once per allowed Ask, on every exit path, and never for a
// refused one.
type Store interface {
	Admit(ctx context.Context, a Ask) (Decision, error)
	Release(ctx context.Context, r Release) error
	// Close stops the store's background work (lease renewal) and waits
	// for it.
	Close() error
}
