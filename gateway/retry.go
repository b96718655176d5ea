package gateway

import (
	"fmt"
	"strings"
	"time"
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
