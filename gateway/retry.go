package gateway

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
)

// RetryConfig says which failures are tried again on another engine, and
// how much retrying the gateway allows (the `server.retry` section).
//
// A request is retried only before anything of its response reached the
// client, so no token is ever sent twice, and only when its previous
// attempt has been cancelled (its context cancelled and its body closed,
// so its engine connection is gone, before the next attempt starts; vLLM
// aborts a request whose connection closes), so the gateway never keeps
// two engines working on one request. Each attempt has its own engine
// span and slot. The number of attempts is Config.MaxAttempts.
//
// The model is Envoy's (envoy.config.route.v3.RetryPolicy and the
// cluster's RetryBudget): retry_on conditions, a back-off between
// attempts, and a budget that caps the requests being retried at once as a
// share of the active requests, with a floor, so a fleet-wide outage is not
// amplified by retries.
type RetryConfig struct {
	// On lists the conditions retried: "connect-failure" (the engine could
	// not be reached: it never saw the request), "503" and "429" (the
	// engine said it is unavailable or overloaded), and, opt-in, "500",
	// "502", "504" (those engine statuses), "reset" (the engine closed a
	// new connection before its response headers; on a kept-alive one the
	// request is first sent again on a new connection, see
	// replayOnStaleConn) and "header-timeout" (no
	// response headers within Timeouts.ResponseHeader) and
	// "first-token-timeout" (a stream with no first content event within
	// Timeouts.FirstToken; the stream then sends nothing to its client,
	// headers included, before its first content event, so that the
	// request can still go elsewhere). Default
	// ["connect-failure", "503", "429"]. Empty: no retries.
	On []string `koanf:"on"`
	// Within is the time budget: no new attempt starts later than this
	// after the request arrived. Default 10 s; 0 = no time budget.
	Within time.Duration `koanf:"within"`
	// BudgetRatio caps the requests being retried at once at this share of
	// the requests in flight (Envoy's retry budget budget_percent, whose
	// default is 20%). Default 0.2. Must be in [0, 1].
	BudgetRatio float64 `koanf:"budget_ratio"`
	// BudgetMin is the floor of that cap, so a lightly loaded gateway can
	// always retry (Envoy's min_retry_concurrency, default 3). Default 3.
	BudgetMin int `koanf:"budget_min"`
	// Backoff is the base of the wait before a retry on the same engine
	// (when no other engine serves the model): full jitter over
	// Backoff x 2^(retry-1), capped at 10 x Backoff (Envoy's
	// base_interval, default 25 ms, and max_interval). A retry on another
	// engine does not wait. Default 25 ms.
	Backoff time.Duration `koanf:"backoff"`
	// RetryAfterCap is the longest engine Retry-After (on a 429 or 503)
	// the gateway waits out before trying the same engine again; an engine
	// asking for longer has its answer passed to the client, unless
	// another engine can take the request at once. Default 1 s.
	RetryAfterCap time.Duration `koanf:"retry_after_cap"`
}

// DefaultRetryConfig returns the documented defaults.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{
		On:            []string{"connect-failure", "503", "429"},
		Within:        10 * time.Second,
		BudgetRatio:   0.2,
		BudgetMin:     3,
		Backoff:       25 * time.Millisecond,
		RetryAfterCap: time.Second,
	}
}

// retryReason is why an attempt is retried; its name is the
// switchboard.request.retries reason attribute.
type retryReason uint8

const (
	retryNone retryReason = iota
	retryConnect
	retryReset
	retryHeaderTimeout
	retry429
	retry500
	retry502
	retry503
	retry504
	retryFirstToken
	numRetryReasons
)

// retryConditions maps RetryConfig.On values to reasons.
var retryConditions = map[string]retryReason{
	"connect-failure":     retryConnect,
	"reset":               retryReset,
	"header-timeout":      retryHeaderTimeout,
	"429":                 retry429,
	"500":                 retry500,
	"502":                 retry502,
	"503":                 retry503,
	"504":                 retry504,
	"first-token-timeout": retryFirstToken,
}

// retryReasons are the values of switchboard.request.retries' reason
// attribute, indexed by retryReason.
var retryReasons = [numRetryReasons]string{"", "connect_failure", "reset", "header_timeout", "429", "500", "502", "503", "504", "first_token_timeout"}

func (r retryReason) String() string { return retryReasons[r] }

// retryMask is the parsed RetryConfig.On: bit r set = reason r retried.
type retryMask uint16

func (m retryMask) has(r retryReason) bool { return r != retryNone && m&(1<<r) != 0 }

// mask parses On; Validate has checked every value.
func (c RetryConfig) mask() retryMask {
	var m retryMask
	for _, v := range c.On {
		if r, ok := retryConditions[strings.TrimSpace(v)]; ok {
			m |= 1 << r
		}
	}
	return m
}

func (c RetryConfig) validate() []error {
	var errs []error
	for _, v := range c.On {
		if _, ok := retryConditions[strings.TrimSpace(v)]; !ok {
			errs = append(errs, fmt.Errorf("%w: server.retry.on: unknown condition %q (connect-failure, reset, header-timeout, first-token-timeout, 429, 500, 502, 503, 504)", ErrInvalidConfig, v))
		}
	}
	if c.Within < 0 {
		errs = append(errs, fmt.Errorf("%w: server.retry.within must be >= 0, got %s", ErrInvalidConfig, c.Within))
	}
	if !(c.BudgetRatio >= 0 && c.BudgetRatio <= 1) {
		errs = append(errs, fmt.Errorf("%w: server.retry.budget_ratio must be in [0, 1], got %v", ErrInvalidConfig, c.BudgetRatio))
	}
	if c.BudgetMin < 0 {
		errs = append(errs, fmt.Errorf("%w: server.retry.budget_min must be >= 0, got %d", ErrInvalidConfig, c.BudgetMin))
	}
	if c.Backoff < 0 {
		errs = append(errs, fmt.Errorf("%w: server.retry.backoff must be >= 0, got %s", ErrInvalidConfig, c.Backoff))
	}
	if c.RetryAfterCap < 0 {
		errs = append(errs, fmt.Errorf("%w: server.retry.retry_after_cap must be >= 0, got %s", ErrInvalidConfig, c.RetryAfterCap))
	}
	return errs
}

// retryTimingErrors refuses a timeout retry condition that could never
// fire: an attempt cut by the timeout ends later than the time budget
// (RetryConfig.Within) allows a new attempt to start.
func (c Config) retryTimingErrors() []error {
	var errs []error
	m := c.Retry.mask()
	for _, t := range []struct {
		reason    retryReason
		cond, key string
		d         time.Duration
	}{
		{retryHeaderTimeout, "header-timeout", "response_header", c.Timeouts.ResponseHeader},
		{retryFirstToken, "first-token-timeout", "first_token", c.Timeouts.FirstToken},
	} {
		if m.has(t.reason) && c.Retry.Within > 0 && t.d > 0 && c.Retry.Within <= t.d {
			errs = append(errs, fmt.Errorf("%w: server.retry.on has %s, but server.retry.within (%s) is not longer than server.timeouts.%s (%s): the retry could never start; raise within or lower %s",
				ErrInvalidConfig, t.cond, c.Retry.Within, t.key, t.d, t.key))
		}
	}
	return errs
}

// reason classifies an attempt's result as a retry condition, or retryNone.
// errType is the attempt's error type for a result without a response.
func (res *result) reason(errType string) retryReason {
	if res.connFailed {
		return retryConnect
	}
	if res.resp != nil {
		switch res.resp.StatusCode {
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
	switch errType {
	case ErrTypeEngineDisconnect:
		return retryReset
	case ErrTypeHeaderTimeout:
		return retryHeaderTimeout
	case ErrTypeFirstToken:
		return retryFirstToken
	}
	return retryNone
}

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

// takeRetry reserves a share of the retry budget for one request (Envoy's
// RetryBudget: at most max(BudgetMin, BudgetRatio x the requests in
// flight) are being retried at once); the caller gives it back with
// giveRetry when that request ends. It reports false when the budget is
// spent. Safe for concurrent use.
func (s *Server) takeRetry(cfg *RetryConfig) bool {
	limit := max(int64(cfg.BudgetMin), int64(math.Ceil(cfg.BudgetRatio*float64(s.inflight.Load()))))
	if s.retrying.Add(1) > limit {
		s.retrying.Add(-1)
		return false
	}
	return true
}

// giveRetry gives back a share taken by takeRetry.
func (s *Server) giveRetry() { s.retrying.Add(-1) }

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

// retryState is one request's retry bookkeeping across its attempts.
type retryState struct {
	s        *Server
	set      *settings
	ctx      context.Context // the client's: once it is done, nothing is retried
	sticky   bool            // a sticky route: a 404 means "ask the next engine"
	max      int             // attempts allowed
	deadline time.Time       // no attempt starts after it; zero = no time budget
	held     bool            // this request holds a share of the retry budget

	// Set by the loop before each attempt.
	n      int  // the attempt's number, from 1
	others bool // another candidate is left besides this attempt's engine

	// Set by decide when it says yes.
	lastErr *APIError // the retried attempt's error when it got no response
	reason  retryReason
	same    bool          // the next attempt goes to the same engine
	wait    time.Duration // the pause before it
}

// decide reports whether an attempt's result is tried again, and sets
// where, after which wait and why. errType is the attempt's error type.
// Nothing reached the client: a result is what arrived before commit.
func (rs *retryState) decide(res *result, errType string) bool {
	if rs.n >= rs.max || rs.ctx.Err() != nil {
		return false
	}
	if rs.sticky {
		// An engine without the stored response, or one that could not
		// be reached: ask the next one.
		rs.reason, rs.same, rs.wait = retryConnect, false, 0
		if !res.connFailed {
			if res.resp == nil || res.resp.StatusCode != http.StatusNotFound {
				return false
			}
			rs.reason = retryNone
		}
		return rs.others
	}
	reason := res.reason(errType)
	if !rs.set.retryOn.has(reason) {
		return false
	}
	var wait time.Duration
	same := !rs.others
	if same {
		// The only engine: wait out its Retry-After (up to the cap) or
		// back off before asking it again.
		ra, ok := time.Duration(0), false
		if res.resp != nil {
			ra, ok = retryAfter(res.resp.Header, time.Now())
		}
		switch {
		case ok && ra > rs.set.cfg.Retry.RetryAfterCap:
			return false // the engine asks for longer than the gateway waits
		case ok:
			wait = ra
		default:
			wait = backoff(rs.set.cfg.Retry.Backoff, rs.n)
		}
	}
	if !rs.deadline.IsZero() && time.Now().Add(wait).After(rs.deadline) {
		return false
	}
	if !rs.held {
		if !rs.s.takeRetry(&rs.set.cfg.Retry) {
			rs.s.metrics.RecordRetryBudgetExhausted(context.Background())
			return false
		}
		rs.held = true
	}
	rs.reason, rs.same, rs.wait, rs.lastErr = reason, same, wait, res.err
	return true
}

// done gives back the request's share of the retry budget, if it took one.
func (rs *retryState) done() {
	if rs.held {
		rs.held = false
		rs.s.giveRetry()
	}
}
