package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Prefill/decode disaggregation (docs/disaggregation.md): a chat or
// completions request whose prompt is long and not cached on the decode
// engine chosen for it is sent first to a prefill engine, which computes
// the prompt's KV cache and answers with where to read it
// (kv_transfer_params); the decode engine, sent the client's request with
// those params, reads the KV cache and generates the answer. The wire is
// vLLM's NixlConnector's, as its proxy example
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py), the
// production-stack router and llm-d's routing sidecar use it:
//
//   - the prefill leg: the client's body with stream false, no
//     stream_options, the token cap 1 and
//     "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}
//     (oai.PrefillBody), sent as one non-streaming request;
//   - its reply: a top-level kv_transfer_params object (remote_engine_id,
//     remote_block_ids, remote_host, remote_port, ...), copied unchanged;
//   - the decode leg: the request as it would have gone to the engine
//     (the client's body and the gateway's edits) with those params
//     (oai.DecodeBody), streamed or not as the client asked, with the
//     same X-Request-Id;
//   - the answer's usage.prompt_tokens_details.cached_tokens is the
//     prefill engine's: the decode engine reports the whole prompt as
//     cached, having read it.
//
// Each leg is a leg of the request's plan with its own attempt (span,
// slot, timers): the prefill leg holds a prefill slot on its engine for
// its whole length; the decode leg is an ordinary exchange, a prefill
// slot on its engine until its first token (the KV read is in it), then
// a decode slot.

// DisaggregationConfig turns prefill/decode disaggregation on (the
// disaggregation section). It applies to chat and completions requests of
// models whose engines include at least one prefill and one decode engine
// (fleet.EngineConfig.Role; the llm-d.ai/role pod label under Kubernetes
// discovery).
type DisaggregationConfig struct {
	// Enabled turns disaggregation on. Default false: engine roles then
	// only keep generations off prefill engines.
	Enabled bool `koanf:"enabled"`
	// MinUncachedTokens is the least estimated uncached prompt length, in
	// tokens, on the decode engine chosen, for which a request is
	// disaggregated; shorter ones are computed where they decode. Default
	// 256: a prefill that short takes a few milliseconds on one GPU,
	// about the cost of the extra exchange and the KV read, and stalls
	// nothing (llm-d's pd-profile-handler decides on the same quantity,
	// its threshold of non-cached tokens).
	MinUncachedTokens int `koanf:"min_uncached_tokens"`
	// BytesPerToken converts the prompt's size in bytes into tokens for
	// the estimate, default 4 (OpenAI's rule of thumb for English text).
	// The cached part is the prompt's leading blocks the routing policy's
	// prefix index last sent to that engine (routing.prefix; none with a
	// policy that keeps no index, so the whole prompt counts). With
	// precise-prefix and the prompt's tokens known, the estimate is exact
	// instead: the prompt's tokens less those the engine reported holding
	// in its KV-cache events (docs/kv-events.md).
	BytesPerToken float64 `koanf:"bytes_per_token"`
}

// DefaultDisaggregationConfig returns the defaults documented on
// [DisaggregationConfig].
func DefaultDisaggregationConfig() DisaggregationConfig {
	return DisaggregationConfig{MinUncachedTokens: 256, BytesPerToken: 4}
}

// Validate reports every problem with c, joined; each wraps
// [ErrInvalidConfig].
func (c DisaggregationConfig) Validate() error {
	var errs []error
	if c.MinUncachedTokens < 0 {
		errs = append(errs, fmt.Errorf("%w: disaggregation.min_uncached_tokens must be >= 0, got %d", ErrInvalidConfig, c.MinUncachedTokens))
	}
	if !(c.BytesPerToken > 0 && c.BytesPerToken <= 64) {
		errs = append(errs, fmt.Errorf("%w: disaggregation.bytes_per_token must be in (0, 64], got %g", ErrInvalidConfig, c.BytesPerToken))
	}
	return errors.Join(errs...)
}

// errClientKVParams answers a chat or completions request that sets
// kv_transfer_params while disaggregation is on or its model has prefill
// engines: the gateway sets them, and a client's would tell a decode
// engine where to read a KV cache from (any host: vLLM's NIXL side
// channel connects where it is told).
var errClientKVParams = &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: "kv_transfer_params", Code: "invalid_parameter",
	Message: "kv_transfer_params is set by the gateway in front of these engines (they run prefill/decode disaggregation): remove it from the request"}

// maxPrefillReply caps the prefill leg's reply the gateway reads: one
// generated token, its usage and the kv_transfer_params (a block id per
// 16 prompt tokens: 64 KiB holds a 100k-token prompt's several times).
const maxPrefillReply = 1 << 20

// kvTolerance is how many fewer cached prompt tokens than the prompt a
// decode engine may report after reading the KV cache before the transfer
// is counted as not done (not_transferred): one block of vLLM's default
// size, which a connector may compute again.
const kvTolerance = 16

// disagg is a request's disaggregation state, from its decision to its
// end.
type disagg struct {
	mode string // a telemetry.DisaggMode value
	// decode is the decode engine picked first: the first decode leg
	// goes there.
	decode *routing.Endpoint
	// params is the prefill reply's kv_transfer_params (nil in recompute
	// mode); body the decode leg's body with them.
	params []byte
	body   outBody
	// cached is the prefill engine's usage.prompt_tokens_details.cached_tokens,
	// 0 when it reported none (vLLM writes the details only for a
	// non-zero count); prompt its prompt_tokens.
	cached, prompt int64
	// group is the prefill engine's group (fleet.EngineConfig.Group):
	// only decode engines that pair with it get the params.
	group string
	// accepted is when the decision was made, the request read and
	// admitted (the client's TTFT starts there, as an aggregated
	// request's starts at its attempt); replied when the prefill reply
	// was read (the handover starts there).
	accepted, replied time.Time
	// handedOver: the handover was recorded (first decode leg only);
	// checked: the decode engine's cached count was checked; sent: a
	// decode leg with the params reached its engine.
	handedOver, checked, sent bool
}

// done ends the request's disaggregation: params that no decode engine
// was sent are counted as abandoned (the prefill engine holds their
// blocks until its lease or abort timeout).
func (d *disagg) done(ctx context.Context, m *telemetry.Metrics) {
	if d.params != nil && !d.sent {
		m.RecordKVTransferFailure(ctx, telemetry.KVFailureAbandoned)
	}
}

// pairs reports whether decode engine e may read a KV cache from a prefill
// engine of group: e has no group, or that one.
func pairs(e *fleet.Engine, group string) bool {
	if e.IsProvider() {
		return false // a hosted API reads no KV cache of ours
	}
	g := e.Group()
	return g == "" || g == group
}

// disaggregable reports whether a chat or completions request may be
// disaggregated: n of 1 (the prefill leg computes one sequence), and no
// prompt_logprobs (Streamable is false with it; the prompt's logprobs
// come from the prefill engine's logits, which the client would not
// get). A client's kv_transfer_params never get here (errClientKVParams).
func disaggregable(in *inbound) bool {
	if !in.req.Streamable {
		return false
	}
	if in.req.Sampling.N != nil {
		if n := oai.ParseSampling(in.req.Sampling).N; n != nil && *n != 1 {
			return false
		}
	}
	// vLLM's completions server answers a batch of prompts with the
	// first one's kv_transfer_params only, and echo with logprobs asks for
	// the prompt's logprobs (vllm/entrypoints/openai/serving_completion.py):
	// both are served whole.
	if in.req.PromptBatch || in.req.EchoLogprobs {
		return false
	}
	return true
}

// decideDisagg makes the disaggregation decision of a request to route
// rt: nil when the request or its model does not take part (nothing is
// counted), otherwise a state whose mode says what follows. For
// disaggregated mode the decode engine is picked, by the policy over the
// admissible decode engines (load, session, prefix), and the prompt's
// uncached part on it is at least MinUncachedTokens; with less, the mode
// is aggregated and the same engine serves the whole request.
func (s *Server) decideDisagg(ctx context.Context, op *operation, in *inbound, rt *fleet.Route, rreq *routing.Request) (*disagg, error) {
	cfg := &in.set.cfg.Disaggregation
	if !cfg.Enabled || op.sticky || (op.migrate != migrateChat && op.migrate != migrateCompletion) || !rt.Disaggregable() {
		return nil, nil
	}
	accepted := time.Now()
	if !disaggregable(in) {
		return &disagg{mode: telemetry.DisaggModeAggregated, accepted: accepted}, nil
	}
	decode := admissible(rt, selfHosted(rt, rt.Decode())) // a provider reads no KV cache of ours
	if len(decode) == 0 {
		return nil, nil // every decode engine is full: the request path says so
	}
	ep, err := in.set.policy.Pick(ctx, rreq, decode)
	s.metrics.RecordStep(ctx, telemetry.StepPick, time.Since(accepted).Seconds())
	if err != nil {
		return nil, err
	}
	d := &disagg{mode: telemetry.DisaggModeAggregated, decode: ep, accepted: accepted}
	cachedBytes := rreq.Known() * in.set.parser.BlockBytes
	uncached := float64(max(rreq.PromptBytes-cachedBytes, 0)) / cfg.BytesPerToken
	if cached := rreq.PredictedCached(); cached >= 0 && rreq.TokenBlocks > 0 {
		// The engine's own report of the prompt's blocks it holds
		// (precise-prefix): the prompt's tokens less those.
		uncached = float64(max(rreq.TokenBlocks*in.set.kvBlocks-cached, 0))
	}
	if uncached >= float64(cfg.MinUncachedTokens) && len(s.prefillCandidates(rt, ep)) > 0 {
		d.mode = telemetry.DisaggModeDisaggregated
	}
	return d, nil
}

// prefillCandidates returns the admissible prefill engines of rt that may
// hand over to decode: not decode itself, and of its group when it has
// one (fleet.EngineConfig.Group).
func (s *Server) prefillCandidates(rt *fleet.Route, decode *routing.Endpoint) []*routing.Endpoint {
	de := rt.Engine(decode)
	all := rt.Prefill()
	out := make([]*routing.Endpoint, 0, len(all))
	for _, ep := range all {
		if ep == decode {
			continue
		}
		if e := rt.Engine(ep); e == nil || e.IsProvider() || de == nil || !pairs(de, e.Group()) {
			continue
		}
		out = append(out, ep)
	}
	return admissible(rt, out)
}

// prefill runs the prefill legs of a disaggregated request: the prefill
// engine is picked by prefix match and load (pickPrefill) among
// prefillCandidates, and one that fails before answering is replaced by
// another within the retry rules and budget (plan.retry). It returns nil
// once d holds the prefill reply's params (mode disaggregated) or none
// (mode recompute, counted and logged), or the error the client is to
// get, with stop set: the prefill engine's own status and error object
// (written: the error is nil), or the gateway's (a 502 for an unreachable
// engine, 499 for a client that left, which cancelled the prefill on its
// engine).
//
// The prefill leg's body is the client's (the model an alias stands for
// replaced), edited by oai.PrefillBody: none of the gateway's own edits
// for the engine that generates (usage, token ids) are for it.
func (s *Server) prefill(ctx context.Context, w http.ResponseWriter, r *http.Request, op *operation, in *inbound, rt *fleet.Route, rreq *routing.Request, p *plan, d *disagg) (stop, fromLeg bool, err error) {
	plain := *in
	plain.observe = false
	src := s.outgoing(op, &plain, false)
	body, err := oai.PrefillBody(src.flat())
	if err != nil {
		return true, false, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "could not build the prefill request", Err: err}
	}
	pb := outBody{n: int64(len(body))}
	pb.parts[0] = body
	var tried []*routing.Endpoint
	for {
		// The engines not tried yet, or, after plan.retry's "same" (no
		// other was left), the one that failed, after its back-off.
		cands := excluding(s.prefillCandidates(rt, d.decode), tried)
		if len(cands) == 0 {
			if p.lastErr != nil {
				return true, true, p.lastErr
			}
			return true, false, routing.ErrNoEndpoint
		}
		ep, err := pickPrefill(ctx, in.set.policy, rreq, cands)
		if err != nil {
			return true, false, err
		}
		eng := rt.Engine(ep)
		if eng == nil {
			return true, false, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "routing policy returned an unknown engine"}
		}
		p.legs++
		p.others = len(cands) > 1
		if in.set.cfg.EngineHeader {
			w.Header()["X-Switchboard-Engine"] = eng.Header() // the prefill engine's own error names it
		}
		o, ae := s.prefillLeg(ctx, r, op, in, &pb, eng, d)
		if o == nil {
			return ae != nil, ae != nil, ae // no error: d holds the reply
		}
		next := p.retry(o)
		if next.kind == legNone {
			if o.resp != nil {
				return true, true, s.passError(w, r, o.resp, eng) // its body is read: o.resp.Body is in memory
			}
			return true, true, o.err
		}
		s.metrics.RecordRetry(ctx, next.reason.String())
		if f, ok := in.set.policy.(routing.Forgetter); ok {
			f.Forget(rreq, ep)
		}
		if !next.same {
			tried = append(tried, ep)
		}
		if ae := s.pause(ctx, r, next.wait); ae != nil {
			return true, false, ae
		}
	}
}

// pickPrefill picks the prefill engine among cands (not empty) by prefix
// match and load: through the routing policy when it routes on prompt
// prefixes (prefix-aware, scorer: the engine that holds most of the
// prompt, balanced by load), else the one with the fewest requests in
// flight (the first of them on a tie). A prefill's cost is its uncached
// prompt, so a policy blind to both (round-robin, a session ring) would
// queue long prompts behind one another on a busy prefill engine while
// another idles. It does not allocate.
func pickPrefill(ctx context.Context, policy routing.Policy, rreq *routing.Request, cands []*routing.Endpoint) (*routing.Endpoint, error) {
	if _, ok := policy.(routing.PrefixHasher); ok {
		return policy.Pick(ctx, rreq, cands)
	}
	var best *routing.Endpoint
	var least int64
	for _, ep := range cands {
		pf, dc := ep.InFlight()
		if best == nil || pf+dc < least {
			best, least = ep, pf+dc
		}
	}
	if best == nil {
		return nil, routing.ErrNoEndpoint
	}
	return best, nil
}

// prefillLeg runs one prefill leg on eng: its attempt holds a prefill
// slot on eng from the request's send to its reply read whole (never a
// decode slot: it generates for the KV cache, not for the client). It
// returns a nil outcome when the engine answered 2xx and d has what the
// reply says (the error, if any, is the client's: an unreadable reply);
// otherwise the outcome for the planner, its response (headers read)
// left open for the caller.
func (s *Server) prefillLeg(ctx context.Context, r *http.Request, op *operation, in *inbound, body *outBody, eng *fleet.Engine, d *disagg) (*outcome, error) {
	ctx, a := s.startAttempt(ctx, eng, op, in)
	defer a.finish()
	a.stream = false
	if a.span.IsRecording() {
		a.span.SetAttributes(telemetry.AttrLeg.String("prefill"), telemetry.AttrStream.Bool(false), telemetry.AttrGenAIStream.Bool(false),
			telemetry.AttrGenAIMaxTokens.Int64(1))
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c := call{set: in.set, op: op, target: in.target, out: body, a: a, eng: eng, actx: actx, cancel: cancel}
	defer c.stop()
	o := s.send(&c, r, body)
	o.errType = a.errType
	if o.resp != nil && (o.resp.StatusCode < 200 || o.resp.StatusCode > 299) {
		// The engine's error, read now, while the leg's context lives
		// (its cancellation would cut the body): the client may get it
		// as it is (passError), and the connection is kept.
		b, _ := io.ReadAll(io.LimitReader(o.resp.Body, maxErrorBody))
		o.resp.Body.Close()
		o.resp.Body = io.NopCloser(bytes.NewReader(b))
	}
	if o.resp == nil || o.resp.StatusCode < 200 || o.resp.StatusCode > 299 {
		return &o, nil
	}
	reply, err := io.ReadAll(io.LimitReader(o.resp.Body, maxPrefillReply+1))
	o.resp.Body.Close()
	if err != nil {
		et, ae := s.classify(r, actx, err)
		a.fail(et)
		return &outcome{stage: stageRelay, err: ae, errType: a.errType, held: true}, nil
	}
	pf, ok := oai.ParsePrefill(reply)
	if !ok || len(reply) > maxPrefillReply {
		a.fail(ErrTypeBadResponse)
		return &outcome{stage: stageRelay, errType: a.errType, held: true, err: &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: "bad_response",
			Message: "the prefill engine's answer is not a JSON object of at most 1 MiB"}}, nil
	}
	now := time.Now()
	d.replied, d.group = now, eng.Group()
	d.cached, d.prompt = pf.CachedTokens, pf.PromptTokens
	// The leg's own usage (its one generated token is not the client's):
	// the key's token limits and the cost count its prefill, not an
	// estimate and a whole max_tokens.
	a.usage = oai.Usage{PromptTokens: pf.PromptTokens, CachedTokens: pf.CachedTokens, HasCached: pf.HasCached}
	a.hasUsage = pf.PromptTokens > 0
	s.metrics.RecordPrefill(a.ctx, a.attrs, now.Sub(a.start).Seconds())
	if a.span.IsRecording() && pf.PromptTokens > 0 {
		a.span.SetAttributes(telemetry.AttrGenAIInputTok.Int64(pf.PromptTokens))
	}
	if pf.Params == nil {
		// The engine kept no KV cache for a decode engine to read: the
		// decode engine computes the prompt. vLLM returns the params only
		// for a prefill that ended at its token cap (finish_reason
		// "length"); one whose single token ended the generation (a stop
		// token) has none by design. Any other is a prefill engine
		// without a KV connector, or one that failed to keep the KV.
		d.mode = telemetry.DisaggModeRecompute
		if b, _ := oai.ParseBody(reply); b.FinishReason == nil || string(b.FinishReason) == "length" {
			s.metrics.RecordKVTransferFailure(a.ctx, telemetry.KVFailureMissingParams)
			s.log.LogAttrs(a.ctx, slog.LevelWarn, "prefill answer without kv_transfer_params: the decode engine recomputes the prompt",
				slog.String("engine", eng.Name()), slog.String("request_id", RequestIDFrom(r.Context())))
		}
		return nil, nil
	}
	d.params = append([]byte(nil), pf.Params...)
	return nil, nil
}

// handover records, at the first event of a decode leg that carried the
// params, the time since the prefill reply: the decode engine's queue and
// KV pull (once per request).
func (a *attempt) handover(now time.Time) {
	if d := a.pd; d != nil && a.carried && !d.handedOver {
		d.handedOver = true
		a.s.metrics.RecordHandover(a.ctx, a.attrs, now.Sub(d.replied).Seconds())
	}
}

// decodeBody returns the decode leg's body: out with d's params, built
// once.
func (d *disagg) decodeBody(out *outBody) (*outBody, error) {
	if d.body.n > 0 {
		return &d.body, nil
	}
	b, err := oai.DecodeBody(out.flat(), d.params)
	if err != nil {
		return nil, err
	}
	d.body = outBody{n: int64(len(b)), injected: out.injected}
	d.body.parts[0] = b
	return &d.body, nil
}

// rewriteUsage rewrites, in data (a chunk or a whole body of the decode
// leg of attempt a), usage.prompt_tokens_details.cached_tokens to the
// prefill engine's count, appending the result to dst; ok is false (dst
// unchanged) when there is nothing to rewrite.
//
// The first usage seen is checked: a decode engine that read the KV cache
// reports the whole prompt as cached, so fewer cached tokens than the
// prompt less kvTolerance, or none at all from an engine known to report
// them (fleet.Engine.ReportsCachedTokens: vLLM writes the count only when
// it is not 0), means it computed the prompt itself: counted as
// not_transferred, and logged.
func (a *attempt) rewriteUsage(dst, data []byte) ([]byte, bool) {
	d := a.pd
	if d == nil || !a.carried {
		return dst, false
	}
	out, was, ok := oai.SetCachedTokens(dst, data, d.cached)
	if ok {
		a.eng.NoteCachedTokens()
	}
	if !d.checked && d.prompt > 0 {
		switch {
		case ok:
			d.checked = true
			if was+kvTolerance < d.prompt {
				a.notTransferred(was)
			}
		case a.eng.ReportsCachedTokens() && bytes.Contains(data, promptTokensKey):
			d.checked = true
			a.notTransferred(0)
		}
	}
	if !ok {
		return dst, false
	}
	return out, true
}

// promptTokensKey is in every usage object of chat and completions.
var promptTokensKey = []byte(`"prompt_tokens"`)

// notTransferred counts and logs a decode leg whose engine computed the
// prompt itself (cached of its tokens found cached).
func (a *attempt) notTransferred(cached int64) {
	a.s.metrics.RecordKVTransferFailure(a.ctx, telemetry.KVFailureNotTransferred)
	a.s.log.LogAttrs(a.ctx, slog.LevelWarn, "decode engine reports the prompt not cached: the KV transfer did not happen",
		slog.String("engine", a.eng.Name()), slog.Int64("prompt_tokens", a.pd.prompt), slog.Int64("cached_tokens", cached))
}
