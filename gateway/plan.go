package gateway

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// A request is a plan of legs. A leg is one engine exchange (exchange.go):
// its span, its slot and its timers, ended by an outcome value. The
// planner, plan.next, is the one function that decides what follows an
// outcome: another leg (on another engine, or on the same one after a
// back-off) or none, in which case the leg's own result is committed to
// the client. A new kind of leg (a continuation, a prefill, a fallback
// model) is a new legKind and a new case in next, not a new exit.

// legKind is what a leg of a request's plan is for.
type legKind uint8

const (
	// legNone: no further leg; the last leg's result is the answer.
	legNone legKind = iota
	// legAttempt is a request's first exchange.
	legAttempt
	// legRetry sends the same request again, nothing of the previous
	// leg having reached the client: on another engine, or on the same
	// one after a wait (nextLeg.same).
	legRetry
	// legContinue continues a generation broken after its first tokens
	// reached the client, on another engine, from its prompt and
	// generated token ids (migration.go).
	legContinue
	// legFallback sends the request to another model (nextLeg.fallback:
	// models.fallbacks or models.context_fallbacks), nothing having
	// reached the client: the model it was on has nothing left to try,
	// or cannot take it (fallback.go).
	legFallback
)

// stage is where in a leg its outcome was taken.
type stage uint8

const (
	// stageHeaders: the engine answered with headers (any status) or the
	// exchange failed before it did; nothing has been relayed.
	stageHeaders stage = iota
	// stageRelay: the relay of a 2xx answer ended in an error before
	// anything reached the client (a stream held until its first token
	// that timed out, an engine that failed before its first byte).
	stageRelay
	// stageCut: the relay broke after bytes reached the client (a cut);
	// the client's response has started and cannot become an error
	// status.
	stageCut
)

// outcome is how a leg ended, as the planner reads it. Nothing of the leg
// has reached the client: a leg that relayed anything is committed and
// never reaches the planner.
type outcome struct {
	stage stage
	// resp is the engine's answer (headers read, body not), nil when the
	// leg got none; err the gateway's error when it got none, or the
	// relay's at stageRelay.
	resp *http.Response
	err  *APIError
	// connFailed: the connection to the engine was never established, so
	// the engine did not see the request.
	connFailed bool
	// errType is the leg's error.type ("" while successful).
	errType string
	// held: at stageRelay, the relay held everything back (a stream that
	// may be retried on a first-token timeout, call.holdFirst), so the
	// request can still go elsewhere.
	held bool
	// cut is the broken stream at stageCut, and at any stage of a
	// continuation leg (whose client response has started).
	cut *cut
	// authFailed: a provider refused the gateway's credentials (its 401
	// or 403), answered as a 502 (providerAnswer).
	authFailed bool
	// backedOff is the back-off a provider's answer started (its 429 or
	// exhausted rate-limit headers): a retry on the same engine waits it
	// out as a Retry-After; 0 for none.
	backedOff time.Duration
}

// reason classifies an outcome as a retry condition, or retryNone.
func (o *outcome) reason() retryReason {
	if o.connFailed {
		return retryConnect
	}
	if o.authFailed {
		// The provider refused the request unrun, as an engine that
		// could not be reached: another engine may hold good
		// credentials.
		return retryConnect
	}
	if o.resp != nil {
		switch o.resp.StatusCode {
		case http.StatusTooManyRequests:
			return retry429
		case http.StatusInternalServerError:
			return retry500
		case http.StatusBadGateway:
			return retry502
		case http.StatusServiceUnavailable:
			return retry503
		case http.StatusGatewayTimeout:
			return retry504
		}
		return retryNone
	}
	switch o.errType {
	case ErrTypeEngineDisconnect:
		return retryReset
	case ErrTypeHeaderTimeout:
		return retryHeaderTimeout
	case ErrTypeFirstToken:
		return retryFirstToken
	}
	return retryNone
}

// nextLeg is the planner's decision after an outcome.
type nextLeg struct {
	kind   legKind
	reason retryReason   // why (legRetry)
	same   bool          // on the same engine: no other candidate is left
	wait   time.Duration // the pause before it
	// fallback is where a legFallback goes (nil otherwise).
	fallback *fallbackTo
}

// plan is one request's plan: what it may still do and what its legs
// have done so far.
type plan struct {
	set      *settings
	ctx      context.Context // the client's: once it is done, nothing follows
	sticky   bool            // a sticky route: a 404 means "ask the next engine"
	max      int             // legs allowed
	deadline time.Time       // no leg starts after it; zero = no time budget
	budget   *retryBudget
	metrics  *telemetry.Metrics
	now      func() time.Time

	// legs is the number of legs started, others whether a candidate is
	// left besides the current leg's engine; both set before each leg.
	legs   int
	others bool
	// held: this request holds a share of the retry budget.
	held bool
	// lastErr is the error of the last leg retried that got no response:
	// the answer when no engine is left to try.
	lastErr *APIError
	// cr is the request's continuation state, nil when its generation is
	// never continued (newCarry).
	cr *carry
	// fb is what the request may still fall back to (fallback.go); its
	// zero value falls back to nothing.
	fb fallbacks
	// pd is the request's disaggregation decision (disagg.go), nil when
	// it took no part in one.
	pd *disagg
	// spilled: the request overflowed to a higher tier (counted once);
	// tier is the tier of its last leg's engine, onTier set once a leg
	// ran (tiers.leg).
	spilled bool
	onTier  bool
	tier    int
}

// next decides what follows a leg that ended with o, nothing of which
// reached the client: another leg (where, after what wait and why), or
// legNone, and the leg's result is committed as it is. When the model's
// own legs are over (retry's legNone) and the outcome is a failure of
// the model's engines (a retry condition) or a context-length 400,
// another model may follow (fallback).
func (p *plan) next(o *outcome) nextLeg {
	if o.cut != nil {
		return p.resume(o.cut)
	}
	n := p.retry(o)
	if n.kind != legNone || !p.fb.any() || p.sticky || p.ctx.Err() != nil {
		return n
	}
	if o.stage == stageRelay && !o.held {
		return n // the engine had started answering: as for a retry
	}
	switch {
	case o.reason() != retryNone:
		return p.fallback(fallbackFailed)
	case len(p.fb.context) > 0 && o.resp != nil && isContextLengthError(o.resp):
		return p.fallback(fallbackContext)
	}
	return n
}

// retry decides whether the model's engines get another leg (legRetry)
// after o, under server.retry's rules.
func (p *plan) retry(o *outcome) nextLeg {
	if p.legs >= p.max || p.ctx.Err() != nil {
		return nextLeg{}
	}
	if p.sticky {
		// An engine without the stored response, or one that could not
		// be reached: ask the next one.
		switch {
		case !p.others || o.stage != stageHeaders:
			return nextLeg{}
		case o.connFailed:
			return nextLeg{kind: legRetry, reason: retryConnect}
		case o.resp != nil && o.resp.StatusCode == http.StatusNotFound:
			return nextLeg{kind: legRetry} // a lookup, not a retry
		}
		return nextLeg{}
	}
	if o.stage == stageRelay && !o.held {
		// Once a 2xx answer is being relayed, only a stream held back
		// until its first token can still go elsewhere.
		return nextLeg{}
	}
	reason := o.reason()
	if !p.set.retryOn.has(reason) {
		return nextLeg{}
	}
	var wait time.Duration
	same := !p.others
	if same && o.authFailed {
		return nextLeg{} // the same key would be refused again
	}
	if same {
		// The only engine: wait out its Retry-After (up to the cap) or
		// back off before asking it again.
		ra, ok := time.Duration(0), false
		if o.resp != nil {
			ra, ok = retryAfter(o.resp.Header, p.now())
		}
		if o.backedOff > 0 {
			// A provider backed off: it takes nothing before then.
			ra, ok = max(ra, o.backedOff), true
		}
		switch {
		case ok && ra > p.set.cfg.Retry.RetryAfterCap:
			return nextLeg{} // the engine asks for longer than the gateway waits
		case ok:
			wait = ra
		default:
			wait = backoff(p.set.cfg.Retry.Backoff, p.legs)
		}
	}
	if !p.deadline.IsZero() && p.now().Add(wait).After(p.deadline) {
		return nextLeg{}
	}
	if !p.held {
		if !p.budget.take(&p.set.cfg.Retry) {
			p.metrics.RecordRetryBudgetExhausted(context.Background())
			return nextLeg{}
		}
		p.held = true
	}
	p.lastErr = o.err
	return nextLeg{kind: legRetry, reason: reason, same: same, wait: wait}
}

// resume decides whether a stream broken after bytes reached the client
// (k) is continued on another engine: its failure kind is one
// MigrationConfig.On lists, the request can be continued (no exclusion,
// token ids seen), migration.limit is not reached, and another engine
// serves the model. A decision not to continue is counted (the exclusion,
// or the continuation outcome limit or no_engine); the caller then ends
// the stream.
func (p *plan) resume(k *cut) nextLeg {
	cr := p.cr
	if cr == nil || p.ctx.Err() != nil || !cr.cfg.on(k.reason) {
		return nextLeg{}
	}
	cr.others = cr.others || p.crossable() // set per leg: another self-hosted engine left
	if exclusion, outcome := cr.verdict(); exclusion != "" || outcome != "" {
		cr.count(p.ctx, p.metrics, k.reason, exclusion, outcome)
		return nextLeg{}
	}
	return nextLeg{kind: legContinue}
}

// done gives back the request's share of the retry budget, if it took one.
func (p *plan) done() {
	if p.held {
		p.held = false
		p.budget.give()
	}
}

// retryBudget caps the requests being retried at once (Envoy's
// RetryBudget): at most max(BudgetMin, BudgetRatio x the requests in
// flight). Safe for concurrent use.
type retryBudget struct {
	inflight *atomic.Int64 // the requests in flight (Server.inflight)
	retrying atomic.Int64
}

// take reserves a share of the budget for one request; the caller gives it
// back with give when that request ends. It reports false when the budget
// is spent.
func (b *retryBudget) take(cfg *RetryConfig) bool {
	limit := max(int64(cfg.BudgetMin), int64(math.Ceil(cfg.BudgetRatio*float64(b.inflight.Load()))))
	if b.retrying.Add(1) > limit {
		b.retrying.Add(-1)
		return false
	}
	return true
}

// give gives back a share taken by take.
func (b *retryBudget) give() { b.retrying.Add(-1) }

// retryAfter parses an engine's Retry-After: delay-seconds or an HTTP date
// (RFC 9110, section 10.2.3). ok is false when it is absent or unreadable.
func retryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, math.MaxInt64/int64(time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// backoff is the wait before retry number n (1 for the first retry) on the
// same engine: full jitter over base x 2^(n-1), capped at 10 x base
// (Envoy's retry back-off).
func backoff(base time.Duration, n int) time.Duration {
	if base <= 0 {
		return 0
	}
	ceil := base << min(n-1, 8)
	ceil = min(ceil, 10*base)
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// excluding returns eps without any of drop, in a new slice.
func excluding(eps, drop []*routing.Endpoint) []*routing.Endpoint {
	out := make([]*routing.Endpoint, 0, len(eps))
	for _, e := range eps {
		if !slices.Contains(drop, e) {
			out = append(out, e)
		}
	}
	return out
}

// without returns eps without ep, in a new slice.
func without(eps []*routing.Endpoint, ep *routing.Endpoint) []*routing.Endpoint {
	rest := make([]*routing.Endpoint, 0, len(eps))
	for _, c := range eps {
		if c != ep {
			rest = append(rest, c)
		}
	}
	return rest
}
