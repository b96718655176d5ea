package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/internal/loglimit"
	"github.com/switchboard-gw/switchboard/quota"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// LimitsConfig is the top-level `limits` section (the loader fills it in):
// how the keys' limits (KeyConfig.Limits) are kept.
type LimitsConfig struct {
	// DefaultMaxTokens is the output a generative request without
	// max_tokens (max_completion_tokens, max_output_tokens) reserves
	// against its key's tokens_per_minute, in tokens (default 4096), but
	// never more than that whole limit. The reservation is settled to the
	// request's usage when it ends.
	DefaultMaxTokens int64 `koanf:"default_max_tokens"`
	// FailMode is what a keyed request gets when the limits' store cannot
	// answer within its timeout: "open" (default: admitted, uncounted) or
	// "closed" (503 with Retry-After). Both count in
	// switchboard.quota.store_errors and log at most once a minute.
	FailMode string `koanf:"fail_mode"`
	// Redis, when Redis.Address is set, keeps the limits in Redis, shared
	// by every replica using it; otherwise each process keeps its own (a
	// fleet of N replicas then admits up to N times each limit). Needs a
	// restart.
	Redis quota.RedisConfig `koanf:"redis"`
}

// The values of LimitsConfig.FailMode.
const (
	FailOpen   = "open"
	FailClosed = "closed"
)

// DefaultLimitsConfig returns the defaults: 4096 tokens reserved for a
// request without max_tokens, fail open, no Redis.
func DefaultLimitsConfig() LimitsConfig {
	return LimitsConfig{DefaultMaxTokens: 4096, FailMode: FailOpen, Redis: quota.DefaultRedisConfig()}
}

// Validate reports a negative default_max_tokens, an unknown fail_mode
// and the Redis section's errors. Errors wrap [ErrInvalidConfig].
func (c LimitsConfig) Validate() error {
	var errs []error
	if c.DefaultMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("%w: limits.default_max_tokens must not be negative", ErrInvalidConfig))
	}
	if c.FailMode != FailOpen && c.FailMode != FailClosed {
		errs = append(errs, fmt.Errorf("%w: limits.fail_mode must be %q or %q, not %q", ErrInvalidConfig, FailOpen, FailClosed, c.FailMode))
	}
	if err := c.Redis.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: limits.redis: %w", ErrInvalidConfig, err))
	}
	return errors.Join(errs...)
}

// keyUsage is one key's counts in this process, kept across reloads (by
// name) for GET /admin/keys.
type keyUsage struct {
	admitted, refused, unavailable atomic.Int64
	inFlight                       atomic.Int64 // admitted requests whose lease is not yet given back
	tokensIn, tokensOut            atomic.Int64
	spendNano                      atomic.Int64 // the cost of its requests' exchanges, in 10^-9 USD (Config.Pricing)
}

// keyGrant is a keyed request's hold on its key's limits, given back by
// settle exactly once.
type keyGrant struct {
	key      *apiKey
	limits   quota.Limits // the key's, less the tokens limit on a light route
	usage    *keyUsage
	lease    string
	reserved int64
	// spendReserved is the Ask's Spend (nano-USD) and spendWindow the
	// windows it was reserved in, settled there at the end.
	spendReserved int64
	spendWindow   quota.SpendWindow
	held          bool // the store admitted it: a Release is owed
	// leaseBack: its concurrency lease was given back when the answer
	// was complete (Server.leaseBack), before settle.
	leaseBack bool
}

// limiter is the server's side of the keys' limits: the store, the lease
// ids, the usage per key and the bounded log of store errors.
type limiter struct {
	store  quota.Store
	owned  bool   // built by New (closed by Close)
	prefix string // this process's lease prefix: random, so replicas differ
	seq    atomic.Uint64
	usage  sync.Map       // key name -> *keyUsage
	wg     sync.WaitGroup // background releases (a shared store)
	// admitLog and releaseLog bound the store's error lines, each its own.
	admitLog, releaseLog loglimit.Limiter
	log                  *slog.Logger
}

func newLimiter(store quota.Store, now func() time.Time, log *slog.Logger) *limiter {
	l := &limiter{store: store, log: log, admitLog: loglimit.Limiter{Interval: time.Minute}, releaseLog: loglimit.Limiter{Interval: time.Minute}}
	if l.store == nil {
		l.store, l.owned = quota.NewMemory(quota.WithClock(now)), true
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	l.prefix = hex.EncodeToString(b[:]) + "-"
	return l
}

func (l *limiter) usageOf(name string) *keyUsage {
	if u, ok := l.usage.Load(name); ok {
		return u.(*keyUsage)
	}
	u, _ := l.usage.LoadOrStore(name, new(keyUsage))
	return u.(*keyUsage)
}

// reservation is what a request reserves against its key's
// tokens_per_minute (and, with no such limit, the estimate its usage is
// counted by when the engine reports none): its prompt estimate (PromptBytes / 4, the
// bytes of a token of common BPE vocabularies) plus, on a generative
// route, its output: max_tokens (of one choice: n > 1 is settled at the
// end, as its usage says), or, when it sets none,
// LimitsConfig.DefaultMaxTokens capped to what the bucket can hold beside
// the prompt (a default the client did not choose never makes a request
// too large). Pooling routes reserve the prompt alone, light ones nothing.
// The sum saturates at math.MaxInt64 (a reservation over the limit, which
// is refused as too large), so no value in a body can overflow it.
func reservation(op *operation, in *inbound, tpm int64) (prompt, out int64) {
	if op.class == classLight {
		return 0, 0
	}
	prompt = (int64(in.req.PromptBytes) + 3) / 4
	if op.class != classGenerative {
		return prompt, 0
	}
	if m := in.req.MaxTokens; m > 0 {
		return prompt, min(m, math.MaxInt64-prompt)
	}
	if tpm <= 0 { // no tokens limit: the estimate only counts usage
		return prompt, in.set.cfg.Limits.DefaultMaxTokens
	}
	return prompt, min(in.set.cfg.Limits.DefaultMaxTokens, max(tpm-prompt, 0))
}

// spendCap returns the max_tokens to add to the engine's body of a
// request whose key has a spend budget and that sets no output cap: the
// default_max_tokens its spend reservation holds (admitKey), so that it
// cannot cost more than it reserved. 0 for any other request, and for
// routes other than chat and completions (whose cap field is max_tokens;
// Messages require one, the Responses API's is another).
func spendCap(st *reqState, op *operation, in *inbound) int64 {
	if st == nil || st.key == nil || (st.key.limits.SpendPerDay == 0 && st.key.limits.SpendPerMonth == 0) {
		return 0
	}
	if op.class != classGenerative || (op.name != "chat" && op.name != "completions" && op.name != "responses") || in.req.MaxTokens > 0 {
		return 0
	}
	return in.set.cfg.Limits.DefaultMaxTokens
}

// admitKey applies the request's key's limits before any engine is
// picked: it returns the grant to settle when the request ends, or the
// error to answer (429 with Retry-After and the x-ratelimit-* headers;
// 503 when the store cannot answer and the gateway fails closed). It
// returns nil, nil for a request without a key; a key without limits gets
// a grant that only counts (the store is not asked). A light route
// (tokenize, a stored response's retrieval or cancel) is not held to the
// tokens limit: it spends none, and a key in token debt can still cancel.
func (s *Server) admitKey(w http.ResponseWriter, r *http.Request, st *reqState, op *operation, in *inbound) (*keyGrant, error) {
	if st == nil || st.key == nil {
		return nil, nil
	}
	k := st.key
	g := &st.grant // the request state holds it: no allocation of its own
	*g = keyGrant{key: k, usage: s.limits.usageOf(k.name), limits: k.limits}
	if op.class == classLight {
		// No tokens, no cost: a key in token debt or over its budget
		// can still tokenize, look up or cancel.
		g.limits.TokensPerMinute, g.limits.SpendPerDay, g.limits.SpendPerMonth = 0, 0, 0
	}
	ctx := r.Context()
	prompt, out := reservation(op, in, g.limits.TokensPerMinute)
	st.promptEst, st.reservedOut = prompt, out
	if g.limits.IsZero() {
		g.usage.admitted.Add(1)
		g.usage.inFlight.Add(1)
		s.metrics.RecordKeyRequest(ctx, k.attrs, telemetry.KeyAdmitted)
		return g, nil
	}
	g.reserved = prompt + out
	ask := quota.Ask{Key: k.name, Limits: g.limits, Tokens: g.reserved}
	if g.limits.SpendPerDay > 0 || g.limits.SpendPerMonth > 0 {
		// The output a spend budget reserves is the request's max_tokens,
		// else default_max_tokens, not capped to the token bucket as the
		// tokens' reservation is.
		spendOut := out
		if op.class == classGenerative && in.req.MaxTokens <= 0 {
			spendOut = in.set.cfg.Limits.DefaultMaxTokens
		}
		if ask.Spend = nanoUSD(in.set.prices.reservation(in.target, prompt, spendOut)); ask.Spend == 0 {
			// An unpriced request costs nothing: no budget holds it back.
			ask.Limits.SpendPerDay, ask.Limits.SpendPerMonth = 0, 0
			g.limits.SpendPerDay, g.limits.SpendPerMonth = 0, 0
		}
		g.spendReserved = ask.Spend
	}
	if g.limits.Concurrent > 0 {
		ask.Lease = s.limits.prefix + strconv.FormatUint(s.limits.seq.Add(1), 36)
	}
	g.lease = ask.Lease
	// Not cancelled with the client: once Redis has run the admission it
	// holds a lease and a reservation, and only a Release gives them back;
	// the store's own timeout bounds the wait.
	d, err := s.limits.store.Admit(context.WithoutCancel(ctx), ask)
	if err != nil {
		open := in.set.cfg.Limits.FailMode != FailClosed
		s.metrics.RecordQuotaStoreError(ctx, open)
		if suppressed, ok := s.limits.admitLog.Allow(time.Now()); ok {
			msg := "the limits' store did not answer; requests are refused (fail_mode closed)"
			if open {
				msg = "the limits' store did not answer; requests are admitted without limits (fail_mode open)"
			}
			s.limits.log.Warn(msg, "error", err, "suppressed", suppressed)
		}
		if open {
			g.usage.admitted.Add(1)
			g.usage.inFlight.Add(1)
			s.metrics.RecordKeyRequest(ctx, k.attrs, telemetry.KeyAdmitted)
			return g, nil // held is false: nothing to give back
		}
		g.usage.unavailable.Add(1)
		s.metrics.RecordKeyRequest(ctx, k.attrs, telemetry.KeyUnavailable)
		return nil, &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "rate_limits_unavailable",
			Message: "the gateway cannot check this api key's rate limits right now; retry shortly", Err: err}
	}
	if !d.Allowed {
		setRateLimitHeaders(w.Header(), g.limits, d)
		g.usage.refused.Add(1)
		s.metrics.RecordKeyRequest(ctx, k.attrs, string(d.Refused))
		if v := retryAfterSeconds(d); v != "" {
			w.Header()["Retry-After"] = []string{v}
		}
		return nil, errRateLimited(k, ask, d)
	}
	g.held = true
	g.spendWindow = d.SpendWindow
	g.usage.admitted.Add(1)
	g.usage.inFlight.Add(1)
	setRateLimitHeaders(w.Header(), g.limits, d)
	s.metrics.RecordKeyRequest(ctx, k.attrs, telemetry.KeyAdmitted)
	return g, nil
}

// settle ends a grant: the tokens the request used (summed over its
// attempts by attempt.end) are counted and the store's reservation is
// settled to them, the lease given back. It runs once, deferred right
// after admitKey, so every exit path (success, error, cancellation, panic)
// gives back exactly once. The per-process store settles at once; a
// shared one (Redis) in the background, so no client waits for it: the
// response is complete when the handler returns, the release after.
func (s *Server) settle(ctx context.Context, st *reqState, g *keyGrant) {
	in, out := st.usedIn, st.usedOut
	g.usage.tokensIn.Add(in)
	g.usage.tokensOut.Add(out)
	g.usage.spendNano.Add(st.costNano)
	s.metrics.RecordKeyTokens(ctx, g.key.attrs, in, out)
	if !g.held {
		g.usage.inFlight.Add(-1)
		return
	}
	rel := quota.Release{Key: g.key.name, Limits: g.limits, Lease: g.lease, Reserved: g.reserved, Used: in + out,
		ReservedSpend: g.spendReserved, UsedSpend: st.costNano, SpendDay: g.spendWindow.Day, SpendMonth: g.spendWindow.Month}
	if g.limits.TokensPerMinute == 0 {
		rel.Reserved, rel.Used = 0, 0
	}
	// A shared store's lease is given back before the handler returns
	// (so before a chunked answer's end, and before the gateway's own
	// error is written): a client that waits for the answer finds the
	// lease free on every replica. The settlement of tokens and spend
	// goes on in the background. The key's in-flight count drops once
	// all is given back, so an admission that reads zero in flight
	// finds the lease free.
	if !s.limits.owned && g.lease != "" && !g.leaseBack {
		s.leaseBack(ctx, g)
	}
	if g.leaseBack {
		rel.Lease = ""
	}
	if s.limits.owned {
		s.limits.release(context.WithoutCancel(ctx), rel)
		g.usage.inFlight.Add(-1)
		return
	}
	s.limits.wg.Add(1)
	go func() {
		defer s.limits.wg.Done()
		s.limits.release(context.WithoutCancel(ctx), rel)
		g.usage.inFlight.Add(-1)
	}()
}

// leaseBack gives a request's concurrency lease back at once (with
// concurrent: N, a client that sends its next request as soon as it has
// read an answer must find the lease free, on any replica): when the
// answer is complete and before its last bytes are written (the end
// event of a stream, a whole body, an engine's error), or from settle.
// Once per request; a no-op without a lease. g is the request's grant
// (reqState.grant).
func (s *Server) leaseBack(ctx context.Context, g *keyGrant) {
	if g == nil || !g.held || g.lease == "" || g.leaseBack {
		return
	}
	g.leaseBack = true
	s.limits.release(context.WithoutCancel(ctx), quota.Release{Key: g.key.name, Limits: g.limits, Lease: g.lease})
}

// answerComplete is called when the request's answer is complete, before
// its last bytes are written: the key's concurrency lease goes back now
// (leaseBack).
func (s *Server) answerComplete(r *http.Request) {
	if st := stateFrom(r.Context()); st != nil {
		s.leaseBack(r.Context(), &st.grant)
	}
}

func (l *limiter) release(ctx context.Context, rel quota.Release) {
	if err := l.store.Release(ctx, rel); err != nil {
		if suppressed, ok := l.releaseLog.Allow(time.Now()); ok {
			l.log.Warn("the limits' store did not take a request's release: its unused token reservation is not given back (a concurrency lease expires after lease_ttl)", "key", rel.Key, "error", err, "suppressed", suppressed)
		}
	}
}

// countUsage adds an ended attempt's tokens to its request's total, which
// settle charges to the request's key: the engine's usage when it
// reported one; else, for an attempt the engine accepted (2xx), the
// prompt estimate plus one token per content event; else nothing (the
// engine refused or never got it).
func (a *attempt) countUsage(st *reqState) (in, out int64) {
	switch {
	case a.class == classLight:
	case a.seam != nil:
		// A continuation: its prompt is the request's prompt and what
		// was generated, already counted; its output is the answer's.
		out = max(a.usage.CompletionTokens, a.contentEvents)
	case a.hasUsage:
		in = max(a.usage.PromptTokens, 0)
		if a.pd != nil && a.carried {
			// A decode leg that read the prompt's KV cache: its prefill
			// leg counted the prompt (its own usage).
			in = 0
		}
		if a.class == classGenerative {
			// A stream cut before its final usage (Anthropic's
			// message_start already says output_tokens 1) has at
			// least its content events.
			out = max(a.usage.CompletionTokens, a.contentEvents)
		}
	case a.status >= 200 && a.status <= 299:
		in = st.promptEst
		if a.stream {
			out = a.contentEvents
		} else if a.class == classGenerative {
			// A whole answer whose usage is unknown (no usage object,
			// a body too large to read it from, audio, images) is
			// charged its reservation.
			out = st.reservedOut
		}
	}
	st.usedIn += in
	st.usedOut += out
	return in, out
}

// errRateLimited is the 429 for an Ask a limit refused, worded as OpenAI's
// (type "requests" or "tokens", code rate_limit_exceeded), with
// Retry-After (retryAfterSeconds) set by the caller.
func errRateLimited(k *apiKey, ask quota.Ask, d quota.Decision) *APIError {
	ae := &APIError{Status: http.StatusTooManyRequests, Type: string(d.Refused), Code: "rate_limit_exceeded"}
	switch d.Refused {
	case quota.RefusedRequests:
		ae.Message = fmt.Sprintf("rate limit reached for api key %q on requests per minute: limit %d; try again in %s", k.name, k.limits.RequestsPerMinute, roundUp(d.RetryAfter))
	case quota.RefusedSpend:
		// OpenAI's answer to an account out of credit.
		ae.Type, ae.Code = "insufficient_quota", "insufficient_quota"
		if d.RetryAfter <= 0 {
			ae.Message = fmt.Sprintf("api key %q's spend budget (%s) cannot hold this request, which could cost up to $%.6f (its prompt and output limit, max_tokens or else limits.default_max_tokens, at its model's highest price); send a lower max_tokens",
				k.name, spendLimits(k.limits), float64(ask.Spend)/1e9)
		} else {
			ae.Message = fmt.Sprintf("api key %q has used its spend budget (%s): this request could cost up to $%.6f; try again %s",
				k.name, spendLimits(k.limits), float64(ask.Spend)/1e9, whenAgain(d.RetryAfter))
		}
	case quota.RefusedTokens:
		if d.RetryAfter <= 0 {
			ae.Message = fmt.Sprintf("request too large for api key %q on tokens per minute: limit %d, requested %d (prompt estimate plus max_tokens); lower max_tokens", k.name, k.limits.TokensPerMinute, ask.Tokens)
		} else {
			ae.Message = fmt.Sprintf("rate limit reached for api key %q on tokens per minute: limit %d, requested %d; try again in %s", k.name, k.limits.TokensPerMinute, ask.Tokens, roundUp(d.RetryAfter))
		}
	default:
		ae.Type = "requests"
		ae.Message = fmt.Sprintf("api key %q has its limit of %d concurrent requests in flight; try again when one ends", k.name, k.limits.Concurrent)
	}
	return ae
}

// spendLimits describes a key's spend budgets for a message.
func spendLimits(l quota.Limits) string {
	var parts []string
	if l.SpendPerDay > 0 {
		parts = append(parts, "$"+strconv.FormatFloat(float64(l.SpendPerDay)/1e9, 'f', -1, 64)+" a day")
	}
	if l.SpendPerMonth > 0 {
		parts = append(parts, "$"+strconv.FormatFloat(float64(l.SpendPerMonth)/1e9, 'f', -1, 64)+" a month")
	}
	return strings.Join(parts, ", ")
}

// whenAgain says when a refused budget admits again: in d, or never
// (the request alone costs more than the budget).
func whenAgain(d time.Duration) string {
	if d <= 0 {
		return "with a lower max_tokens: the budget could never hold it"
	}
	return "in " + roundUp(d).String() + " (when the budget's UTC day or month starts)"
}

// retryAfterSeconds is a refusal's Retry-After in whole seconds, rounded
// up: "" when waiting cannot help (a reservation over the limit); "1" for
// concurrency, whose room depends on other requests ending.
func retryAfterSeconds(d quota.Decision) string {
	switch {
	case d.RetryAfter > 0:
		return strconv.FormatInt(int64((d.RetryAfter+time.Second-1)/time.Second), 10)
	case d.Refused == quota.RefusedConcurrent:
		return "1"
	}
	return ""
}

// roundUp is d rounded up to the millisecond, for messages and headers.
func roundUp(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// setRateLimitHeaders sets OpenAI's rate-limit headers for the key's
// per-minute limits (only those set): x-ratelimit-limit-requests,
// x-ratelimit-remaining-requests, x-ratelimit-reset-requests (the time
// until the bucket is full again, as OpenAI writes it: "1s", "6m0s",
// "17ms"), and the same with -tokens.
func setRateLimitHeaders(h http.Header, l quota.Limits, d quota.Decision) {
	if l.RequestsPerMinute > 0 {
		h["X-Ratelimit-Limit-Requests"] = []string{strconv.FormatInt(l.RequestsPerMinute, 10)}
		h["X-Ratelimit-Remaining-Requests"] = []string{strconv.FormatInt(d.Requests.Remaining, 10)}
		h["X-Ratelimit-Reset-Requests"] = []string{roundUp(d.Requests.Reset).String()}
	}
	if l.TokensPerMinute > 0 {
		h["X-Ratelimit-Limit-Tokens"] = []string{strconv.FormatInt(l.TokensPerMinute, 10)}
		h["X-Ratelimit-Remaining-Tokens"] = []string{strconv.FormatInt(d.Tokens.Remaining, 10)}
		h["X-Ratelimit-Reset-Tokens"] = []string{roundUp(d.Tokens.Reset).String()}
	}
}

// KeyStatus is one API key as GET /admin/keys reports it: never the key
// or its hash.
type KeyStatus struct {
	Name   string    `json:"name"`
	Models []string  `json:"models"`
	Limits KeyLimits `json:"limits"` // 0 = no limit
	// Source is where the key lives: "config" (auth.keys of the config
	// file, changed only there), "keys_file" (auth.keys_file) or "api"
	// (created by the keys API and kept in Redis).
	Source string `json:"source"`
	// CreatedAt is when the keys API created the key (RFC 3339, UTC);
	// absent for a key written by hand.
	CreatedAt *time.Time `json:"created_at,omitempty"`
	// Shared says the limits are kept in Redis for every replica; false:
	// in this process only.
	Shared bool `json:"shared"`
	// This process's counts since it started (kept across reloads):
	// requests admitted, refused by a limit, refused because the store
	// could not answer (fail_mode closed), in flight now, and the tokens
	// used (the engines' usage, else the gateway's estimate).
	Admitted    int64 `json:"admitted"`
	Refused     int64 `json:"refused"`
	Unavailable int64 `json:"unavailable"`
	InFlight    int64 `json:"in_flight"`
	TokensIn    int64 `json:"input_tokens"`
	TokensOut   int64 `json:"output_tokens"`
	// Spend is the cost of its requests' exchanges at the configured
	// prices (pricing), in USD, this process since it started.
	Spend float64 `json:"spend_usd"`
}

// Keys returns every key's status: the configuration's (auth.keys, then
// auth.keys_file) in configuration order, then the keys API's kept in
// Redis, by name. Safe for concurrent use.
func (s *Server) Keys() []KeyStatus {
	set := s.set.Load()
	shared := set.cfg.Limits.Redis.Address != ""
	out := make([]KeyStatus, len(set.cfg.Auth.Keys))
	for i, k := range set.cfg.Auth.Keys {
		out[i] = s.keyStatus(k, shared)
	}
	out = append(out, s.apiKeyStatuses(set, shared)...)
	s.limits.prune(out)
	return out
}

// prune drops the usage of every key name not among keys that has no
// request in flight: a revoked key's counts go (the keys API makes and
// revokes names at run time, so they would grow without bound), and a key
// made again under its name starts from zero. A grant in flight keeps its
// own *keyUsage, so dropping the map's entry loses none of its counts.
func (l *limiter) prune(keys []KeyStatus) {
	live := make(map[string]bool, len(keys))
	for _, k := range keys {
		live[k.Name] = true
	}
	l.usage.Range(func(name, u any) bool {
		if !live[name.(string)] && u.(*keyUsage).inFlight.Load() == 0 {
			l.usage.Delete(name)
		}
		return true
	})
}

// keyStatus is k's status with this process's counts.
func (s *Server) keyStatus(k KeyConfig, shared bool) KeyStatus {
	u := s.limits.usageOf(k.Name)
	st := KeyStatus{Name: k.Name, Models: k.Models, Limits: k.Limits, Source: k.Source, Shared: shared,
		Admitted: u.admitted.Load(), Refused: u.refused.Load(), Unavailable: u.unavailable.Load(),
		InFlight: u.inFlight.Load(), TokensIn: u.tokensIn.Load(), TokensOut: u.tokensOut.Load(),
		Spend: float64(u.spendNano.Load()) / 1e9}
	if st.Source == "" {
		st.Source = KeySourceConfig
	}
	if !k.CreatedAt.IsZero() {
		t := k.CreatedAt
		st.CreatedAt = &t
	}
	return st
}
