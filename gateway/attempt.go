package gateway

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// attempt is one try of a request on one engine: the engine span and the
// engine slot, tied together.
//
// Lifecycle (shared/DESIGN.md, "One request", step 5):
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
// once (shared/cases L01, L02). Metrics never depend on the span being
// sampled.
type attempt struct {
	s     *Server
	ctx   context.Context // carries the engine span (for exemplars)
	eng   *engine
	attrs *telemetry.Attrs
	span  trace.Span
	slot  routing.Slot // not acquired on a light route
	class opClass

	start, first, last time.Time
	contentEvents      int64
	usage              oai.Usage
	hasUsage           bool
	respID             string
	status             int    // engine response status, 0 before headers
	errType            string // "" while successful
	ended              bool
}

// clientSpan are the start options of every engine span, built once.
var clientSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// startAttempt starts the engine span and, unless the route is light,
// takes a prefill slot on eng. The caller must `defer a.finish()`
// immediately.
func (s *Server) startAttempt(ctx context.Context, eng *engine, op *operation, in *inbound) (context.Context, *attempt) {
	// The metrics carry the model the engines serve (a bounded set: the
	// route lookup found it), the span the name the client used.
	a := &attempt{s: s, eng: eng, class: op.class, attrs: eng.tel.Attrs(in.target, op.genai, op.name)}
	ctx, a.span = s.tracer.Start(ctx, a.attrs.SpanName(), clientSpan...)
	a.ctx = ctx
	if a.span.IsRecording() {
		a.span.SetAttributes(eng.spanAttrs...)
		a.span.SetAttributes(
			telemetry.AttrGenAIOp.String(op.genai),
			telemetry.AttrOperation.String(op.name),
			attribute.Bool("switchboard.stream", in.stream),
			telemetry.AttrRequestID.String(RequestIDFrom(ctx)),
		)
		if in.model != "" {
			a.span.SetAttributes(telemetry.AttrGenAIReqModel.String(in.model))
		}
		if in.req.MaxTokens > 0 {
			a.span.SetAttributes(telemetry.AttrGenAIMaxTokens.Int64(in.req.MaxTokens))
		}
	}
	if op.class != classLight {
		a.slot.Acquire(eng.ep)
	}
	s.live.Add(1)
	a.start = time.Now()
	if st := stateFrom(ctx); st != nil {
		st.triedEngine(eng.cfg.Name)
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
		if a.slot.Promote() {
			a.s.metrics.RecordFirstToken(a.ctx, a.attrs, now.Sub(a.start).Seconds())
			if a.span.IsRecording() {
				a.span.AddEvent("first_token")
			}
		}
		return
	}
	a.s.metrics.RecordInterToken(a.ctx, a.attrs, now.Sub(a.last).Seconds())
	a.last = now
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

// end releases the slot, records the outcome and ends the span. Idempotent.
func (a *attempt) end() {
	if a.ended {
		return
	}
	a.ended = true
	phase := a.slot.Release()
	if a.s.onRelease != nil {
		a.s.onRelease(a.eng.cfg.Name, phase)
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
	if a.errType == "" && !a.first.IsZero() {
		n := a.contentEvents
		if a.hasUsage && a.usage.CompletionTokens > 0 {
			n = a.usage.CompletionTokens
		}
		if n > 1 {
			o.TPOT = a.last.Sub(a.first).Seconds() / float64(n-1)
		}
	}
	// Recording ignores the context's cancellation by contract; the request
	// context is kept for exemplars even when the client has gone.
	a.s.metrics.RecordEnd(a.ctx, a.attrs, o)
	if st := stateFrom(a.ctx); st != nil { // for the access log: the last attempt's outcome
		st.errType = a.errType
		st.inTok, st.outTok = o.InputTokens, o.OutputTokens
		if !a.first.IsZero() {
			st.ttft = a.first.Sub(a.start)
		}
	}
	if a.span.IsRecording() {
		a.span.SetAttributes(attribute.String("switchboard.released_phase", phase.String()))
		if a.status != 0 {
			a.span.SetAttributes(attribute.Int("http.response.status_code", a.status))
		}
		if a.respID != "" {
			a.span.SetAttributes(telemetry.AttrGenAIResponseID.String(a.respID))
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
