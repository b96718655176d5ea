package gateway

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// attempt is one try of a request on one engine: the engine span and the
// engine slot, tied together.
//
// Lifecycle (gateway/doc.go, "Engine accounting"):
//   - startAttempt starts the CLIENT span and takes the engine's prefill
//     slot;
//   - onContent at the first content-bearing event moves the slot to decode
//     and records TTFT (one sample, never on role-only chunks, comments or
//     usage chunks);
//   - end releases the slot from whichever phase it is in, records the
//     duration with error.type, ends the span and clears the timing state.
//
// end is idempotent and is the only release path. The attempt's owner
// defers finish right after startAttempt, so success, engine errors,
// disconnects, timeouts, client cancellation and panics all release exactly
// once (docs/cases.md L01, L02). Metrics never depend on the span being
// sampled.
type attempt struct {
	s     *Server
	ctx   context.Context // carries the engine span (for exemplars)
	eng   *fleet.Engine
	attrs *telemetry.Attrs
	span  trace.Span
	slot  routing.Slot // not acquired on a light route
	class opClass

	start, first, last time.Time
	contentEvents      int64
	usage              oai.Usage
	hasUsage           bool
	// anthIn, anthRead and anthWrite are an Anthropic stream's
	// input_tokens, cache_read_input_tokens and
	// cache_creation_input_tokens so far (noteEventUsage); 0 when none.
	anthIn, anthRead, anthWrite int64
	respID                      string
	// respModel and finish are the engine's answer's model and finish
	// reason, kept only while the span is recording (for its attributes).
	respModel, finishReason string
	modelSeen               bool   // answered has seen the engine's model
	stream                  bool   // the engine was asked for a stream
	status                  int    // engine response status, 0 before headers
	errType                 string // "" while successful
	ended                   bool
	// pending is the model's counter of attempts without a first token
	// (Config.MaxPendingPerModel) while this attempt is counted in it; it
	// is given back at the first token or at the end, once.
	pending *atomic.Int64
	// seam is the request's continuation state on a continuation leg
	// (nil on other legs): its first token is the end of the seam, not
	// the client's first token, and its usage is part of the whole
	// answer's.
	seam *carry
	// pd is the request's disaggregation state on a decode leg (nil on
	// other legs): the client's TTFT started before the leg, at the
	// request's acceptance; carried says the leg's request has the
	// prefill leg's kv_transfer_params, so its usage's cached tokens are
	// the prefill engine's (rewriteUsage).
	pd      *disagg
	carried bool
	// price is what an exchange costs on this engine for the request's
	// model (Config.Pricing); nil when unpriced. model is that model (the
	// engines' name for it).
	price *price
	model string
	// predicted is the prompt tokens the policy predicted cached on this
	// engine from its KV-cache events, checked at the end against the
	// cached tokens its usage reports; -1 when none was predicted.
	predicted int
	// console is the model's row on the console's models panel (its
	// inter-token gaps).
	console *modelStats
}

// startAttempt starts the engine span and, unless the route is light,
// takes a prefill slot on eng. The caller must `defer a.finish()`
// immediately.
func (s *Server) startAttempt(ctx context.Context, eng *fleet.Engine, op *operation, in *inbound) (context.Context, *attempt) {
	// The metrics carry the model the engines serve (a bounded set: the
	// route lookup found it), the span the name the client used.
	a := &attempt{s: s, eng: eng, class: op.class, attrs: eng.Telemetry().Attrs(in.target, op.genai, op.name), predicted: -1,
		price: in.set.prices.lookup(eng.Name(), in.target), model: in.target}
	if in.kvOn != nil && in.kvOn == eng.Endpoint() {
		a.predicted = in.kvPredicted
	}
	// The GenAI attributes the sampler may use are set at start: the
	// operation, provider, model (the one the engine is asked for, as in
	// the span name) and the engine's address.
	ctx, a.span = s.tracer.Start(ctx, a.attrs.SpanName(), a.attrs.SpanStart()...)
	a.ctx = ctx
	if a.span.IsRecording() {
		a.span.SetAttributes(eng.SpanAttrs()...)
		a.span.SetAttributes(
			telemetry.AttrOperation.String(op.name),
			telemetry.AttrStream.Bool(in.stream),
			telemetry.AttrRequestID.String(RequestIDFrom(ctx)),
		)
		if in.model != in.target {
			// The client named an alias (Config.Models.Aliases).
			a.span.SetAttributes(telemetry.AttrModelAlias.String(in.model))
		}
		if in.req.MaxTokens > 0 {
			a.span.SetAttributes(telemetry.AttrGenAIMaxTokens.Int64(in.req.MaxTokens))
		}
		if in.stream || in.observe {
			// Set if and only if the request (to the engine) is
			// streaming (GenAI conventions).
			a.span.SetAttributes(telemetry.AttrGenAIStream.Bool(true))
		}
		if op.body == bodyJSON {
			// Recorded spans only: the values the parser kept are decoded.
			a.span.SetAttributes(samplingAttrs(oai.ParseSampling(in.req.Sampling))...)
		}
	}
	a.stream = in.stream || in.observe
	if op.class != classLight {
		a.slot.Acquire(eng.Endpoint())
	}
	if in.set.cfg.MaxPendingPerModel > 0 && op.class == classGenerative && in.target != "" {
		a.pending = s.pendingFor(in.target)
		a.pending.Add(1)
	}
	s.live.Add(1)
	a.start = time.Now()
	if op.class == classGenerative {
		a.console = s.console.models.row(in.target)
	}
	if st := stateFrom(ctx); st != nil {
		st.triedEngine(eng.Name())
		if st.console == nil {
			st.console = a.console
		}
	}
	return ctx, a
}

// onContent records a content-bearing event seen at now: the first one is
// the first token (TTFT, prefill -> decode), later ones give ITL samples.
func (a *attempt) onContent(now time.Time) {
	if a.class != classGenerative {
		return // pooling and light routes have no tokens to time
	}
	a.contentEvents++
	if a.first.IsZero() {
		a.first, a.last = now, now
		a.unpend()
		if a.slot.Promote() {
			if a.seam != nil && !a.seam.cut.last.IsZero() {
				// The client's TTFT was recorded by the leg that broke;
				// this is the second wait it saw.
				a.s.metrics.RecordMigrationGap(a.ctx, a.attrs, now.Sub(a.seam.cut.last).Seconds())
			} else if a.pd != nil {
				// The engine's wait from its leg's start, the client's
				// from the request's acceptance (the prefill leg in it).
				a.s.metrics.RecordFirstTokenSplit(a.ctx, a.attrs, now.Sub(a.start).Seconds(), now.Sub(a.pd.accepted).Seconds())
			} else {
				a.s.metrics.RecordFirstToken(a.ctx, a.attrs, now.Sub(a.start).Seconds())
			}
			if a.span.IsRecording() {
				a.span.AddEvent(telemetry.EventFirstToken)
			}
		}
		return
	}
	gap := now.Sub(a.last).Seconds()
	a.s.metrics.RecordInterToken(a.ctx, a.attrs, gap)
	if a.console != nil {
		a.s.console.models.maybeAdvance(now)
		a.console.itl.observe(gap)
	}
	a.last = now
}

// unpend takes the attempt out of its model's pending count, once.
func (a *attempt) unpend() {
	if a.pending != nil {
		a.pending.Add(-1)
		a.pending = nil
	}
}

// answered records the model the engine's answer names (raw bytes): the
// GenAI metrics then carry gen_ai.response.model when it is the model
// asked for, and the span carries it as sent.
func (a *attempt) answered(model []byte) {
	if model == nil {
		return
	}
	a.modelSeen = true
	a.attrs = a.attrs.Answered(model)
	if a.span.IsRecording() && a.respModel == "" {
		a.respModel = string(model)
	}
}

// finished records the engine's finish reason (raw bytes) for the span.
func (a *attempt) finished(reason []byte) {
	if reason != nil && a.span.IsRecording() {
		a.finishReason = string(reason)
	}
}

// fail records the attempt's error class; the first one wins.
func (a *attempt) fail(errType string) {
	if a.errType == "" {
		a.errType = errType
	}
}

// finish is the attempt's deferred end. A panic is recorded as such (unless
// it is http.ErrAbortHandler, which the gateway raises itself after
// recording the real cause), the slot is released, and the panic goes on to
// the recoverer.
func (a *attempt) finish() {
	if p := recover(); p != nil {
		if p != http.ErrAbortHandler {
			a.errType = ErrTypePanic
		}
		a.end()
		panic(p)
	}
	a.end()
}

// charge adds the exchange's cost, from the tokens countUsage charged it
// (in input, out output) at its engine's price, to the request (the
// access log), to its key's spend and to switchboard.request.cost. The
// input tokens the engine found cached are priced as such when its usage
// says so.
func (a *attempt) charge(st *reqState, in, out int64) {
	if a.class == classLight {
		return
	}
	if a.seam != nil && a.hasUsage {
		// A continuation prefills the prompt and what was generated: the
		// key's token limits count that once (countUsage), the engine
		// bills it.
		in = max(a.usage.PromptTokens, 0)
	}
	if in == 0 && out == 0 && (a.status < 200 || a.status > 299) {
		return // the engine refused the exchange or never got it: no fee
	}
	var cached int64
	if a.hasUsage && a.usage.HasCached {
		cached = a.usage.CachedTokens
	}
	usd := a.price.cost(in, cached, out)
	if usd <= 0 {
		return
	}
	nano := nanoUSD(usd)
	st.costNano += nano
	key := ""
	if st.key != nil {
		key = st.key.name // its spend is added with its tokens, by settle
	}
	a.s.metrics.RecordCost(a.ctx, a.eng.Telemetry(), a.model, key, usd)
}

// checkPrediction compares the prompt tokens predicted cached on the
// engine at pick time with those its usage reports
// (prompt_tokens_details.cached_tokens; vLLM leaves it out when it is 0,
// so an engine known to report it had none cached when it is absent): the
// precise index checked against the truth.
func (a *attempt) checkPrediction() {
	reported := a.usage.CachedTokens
	switch {
	case a.usage.HasCached:
		a.eng.NoteCachedTokens()
	case !a.eng.ReportsCachedTokens():
		return // the engine does not report it (--enable-prompt-tokens-details off)
	}
	a.s.metrics.RecordKVPrediction(a.ctx, a.eng.Telemetry(), a.predicted, int(reported))
}

// end releases the slot, records the outcome and ends the span. Idempotent.
func (a *attempt) end() {
	if a.ended {
		return
	}
	a.ended = true
	phase := a.slot.Release()
	a.unpend()
	if a.s.onRelease != nil {
		a.s.onRelease(a.eng.Name(), phase)
	}
	now := time.Now()
	o := telemetry.Outcome{Seconds: now.Sub(a.start).Seconds(), ErrorType: a.errType, InputTokens: -1, OutputTokens: -1}
	switch {
	case !a.hasUsage || a.class == classLight:
		// A light route spends no tokens: a stored response read again
		// reports the usage of the generation that made it, which was
		// recorded then.
	case a.class == classPooling:
		o.InputTokens = a.usage.PromptTokens // pooling generates no output
	default:
		o.InputTokens, o.OutputTokens = a.usage.PromptTokens, a.usage.CompletionTokens
	}
	// Recording ignores the context's cancellation by contract; the request
	// context is kept for exemplars even when the client has gone.
	a.s.metrics.RecordEnd(a.ctx, a.attrs, o)
	if a.predicted >= 0 && a.hasUsage && a.class == classGenerative && a.seam == nil && a.pd == nil {
		a.checkPrediction()
	}
	if a.class != classLight {
		// A light route (tokenize, a sticky lookup, model retrieval)
		// says nothing of the engine's health for real work: neither
		// its success nor its failure counts for outlier detection.
		a.s.fleet.Report(a.eng, outcomeOf(a.status, a.errType))
	}
	if st := stateFrom(a.ctx); st != nil { // for the access log: the last attempt's outcome
		in, out := a.countUsage(st)
		if a.price != nil {
			a.charge(st, in, out)
		}
		st.errType = a.errType
		st.inTok, st.outTok = o.InputTokens, o.OutputTokens
		switch {
		case a.seam != nil:
			// The whole answer: the prompt once, every leg's output.
			st.inTok, st.outTok = int64(a.seam.promptLen), int64(a.seam.legGen)+max(o.OutputTokens, a.contentEvents)
			st.continued, st.continuedOn = a.seam.continued, a.seam.engines
			if k := a.seam.cut; k != nil && k.last.IsZero() && !a.first.IsZero() {
				// The break came before any content: the client's first
				// token is this leg's, its wait the whole request's so far.
				st.ttft = a.first.Sub(st.start)
			}
		case !a.first.IsZero() && a.pd != nil:
			st.ttft = a.first.Sub(a.pd.accepted) // the client's: the prefill leg's time in it
		case !a.first.IsZero():
			st.ttft = a.first.Sub(a.start)
		}
	}
	if a.span.IsRecording() {
		a.span.SetAttributes(telemetry.AttrReleasedPhase.String(phase.String()))
		if a.status != 0 {
			a.span.SetAttributes(telemetry.AttrHTTPStatus.Int(a.status))
		}
		if a.respID != "" {
			a.span.SetAttributes(telemetry.AttrGenAIResponseID.String(a.respID))
		}
		if a.respModel != "" {
			a.span.SetAttributes(telemetry.AttrGenAIRespModel.String(a.respModel))
		}
		if a.finishReason != "" {
			a.span.SetAttributes(telemetry.AttrGenAIFinish.StringSlice([]string{a.finishReason}))
		}
		if !a.first.IsZero() && a.stream {
			a.span.SetAttributes(telemetry.AttrGenAIFirstChunk.Float64(a.first.Sub(a.start).Seconds()))
		}
		if a.hasUsage {
			a.span.SetAttributes(telemetry.AttrGenAIInputTok.Int64(a.usage.PromptTokens), telemetry.AttrGenAIOutputTok.Int64(a.usage.CompletionTokens))
		}
		if a.errType != "" {
			a.span.SetAttributes(telemetry.AttrErrorType.String(a.errType))
			a.span.SetStatus(codes.Error, a.errType)
		}
	}
	a.span.End()
	a.s.live.Add(-1)
	// Clear the timing state: nothing of this request outlives it.
	a.start, a.first, a.last = time.Time{}, time.Time{}, time.Time{}
	a.ctx = nil
}

// samplingAttrs are the GenAI request attributes of the parameters p sets
// (OpenTelemetry GenAI conventions v1.41.1, span.gen_ai.inference.client):
// gen_ai.request.choice.count only when it is not 1, as they require.
func samplingAttrs(p oai.Sampling) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 9)
	for _, f := range []struct {
		k attribute.Key
		v *float64
	}{{telemetry.AttrGenAITemperature, p.Temperature}, {telemetry.AttrGenAITopP, p.TopP}, {telemetry.AttrGenAITopK, p.TopK},
		{telemetry.AttrGenAIFrequencyPenalty, p.FrequencyPenalty}, {telemetry.AttrGenAIPresencePenalty, p.PresencePenalty}} {
		if f.v != nil {
			kv = append(kv, f.k.Float64(*f.v))
		}
	}
	if p.Seed != nil {
		kv = append(kv, telemetry.AttrGenAISeed.Int64(*p.Seed))
	}
	if p.N != nil && *p.N != 1 {
		kv = append(kv, telemetry.AttrGenAIChoiceCount.Int64(*p.N))
	}
	if len(p.Stop) > 0 {
		kv = append(kv, telemetry.AttrGenAIStopSequences.StringSlice(p.Stop))
	}
	if p.OutputType != "" {
		kv = append(kv, telemetry.AttrGenAIOutputType.String(p.OutputType))
	}
	return kv
}
