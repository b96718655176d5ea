package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Outcomes of telemetry.MigrationsName.
const (
	migrationRescued   = "rescued"   // the continuation finished the answer
	migrationFailed    = "failed"    // the continuation broke too, or failed before its first byte
	migrationCancelled = "cancelled" // the client left during the continuation
	migrationLimit     = "limit"     // not continued: migration.limit reached
	migrationNoEngine  = "no_engine" // not continued: no other engine serves the model
)

// cut is a stream of a continuable route broken after bytes reached the
// client, not yet ended: the planner decides whether it is continued, and
// if it is not, endCut ends it.
type cut struct {
	// reason is the failure kind (MigrationConfig.On).
	reason string
	// err is the error event the gateway ends the stream with.
	err *APIError
	// tail is the engine's own end of the stream, held back when a
	// continuation was possible (its error event, or its abort chunk, and
	// what followed): forwarded instead of err when not continued.
	tail []byte
	// last is when the client got the leg's last content (zero when
	// none): the start of the seam.
	last time.Time
}

// endCut ends a broken stream that is not continued: with the engine's own
// end when it sent one (tail), else with the gateway's error event in the
// route's framing. Bounded by a write deadline, as writeStreamError is.
func endCut(w http.ResponseWriter, k *cut, f framing) {
	rc := http.NewResponseController(w)
	if len(k.tail) > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := w.Write(k.tail); err == nil {
			_ = rc.Flush()
		}
	} else {
		writeStreamError(w, rc, k.err, f)
	}
	_ = rc.SetWriteDeadline(time.Time{})
}

// continueURL is the engine path a continuation is sent to: vLLM's
// /v1/completions takes a token-id prompt.
const continueURL = "/v1/completions"

// continuation runs one continuation leg on eng (legContinue): the carry's
// prompt and generated ids as a token prompt to eng's /v1/completions,
// its chunks reshaped into the client's framing and appended to the
// client's response, which has started (or, for a non-streaming client,
// into the answer being reassembled). Like exchange, it returns the next
// leg (another continuation) or legNone, and ends the client's stream
// itself when it breaks too and is not continued again; only a
// non-streaming client, whose response has not started, gets an error
// returned to write.
func (s *Server) continuation(ctx context.Context, w http.ResponseWriter, r *http.Request, op *operation, in *inbound, eng *fleet.Engine, p *plan) (nextLeg, error) {
	cr := p.cr
	prev := cr.cut
	if cr.framed() || cr.crossing {
		// No token ids from the engine, or ids of another model: the
		// prompt and the text so far are tokenized by the engine that
		// continues.
		if err := s.tokenizeContinuation(ctx, eng, in.target, cr); errors.Is(err, errTooLong) {
			s.metrics.RecordMigrationExclusion(ctx, exclMaxTokens)
			return s.endBroken(w, r, prev, op, in.observe)
		} else if err != nil && r.Context().Err() != nil {
			// The client left while the engine tokenized.
			s.metrics.RecordMigration(ctx, prev.reason, migrationCancelled)
			return nextLeg{}, nil
		} else if err != nil {
			s.log.Warn("continuation: tokenize failed", "engine", eng.Name(), "err", err)
			s.metrics.RecordMigration(ctx, prev.reason, migrationFailed)
			if next := p.next(&outcome{stage: stageCut, cut: prev}); next.kind != legNone {
				return next, nil
			}
			return s.endBroken(w, r, prev, op, in.observe)
		}
		cr.crossing = false
	}
	cr.legGen = len(cr.gen)
	cr.ended, cr.finish = false, ""
	body, done := cr.request(in.target, in.req.MaxTokens)
	if done {
		// The break came after the last token: only the end is missing.
		err := s.finishAnswer(w, r, cr, in.observe)
		s.metrics.RecordMigration(ctx, prev.reason, migrationRescued)
		if st := stateFrom(ctx); st != nil && err == nil {
			st.errType = "" // the answer is whole
		}
		return nextLeg{}, err
	}
	cr.continued++
	cr.aborted = false
	if len(cr.engines) < maxLoggedEngines {
		cr.engines = append(cr.engines, eng.Name())
	}
	ctx, a := s.startAttempt(ctx, eng, op, in)
	defer a.finish()
	a.seam = cr
	if a.span.IsRecording() {
		if cr.link.IsValid() {
			a.span.AddLink(trace.Link{SpanContext: cr.link})
		}
		a.span.AddEvent(telemetry.EventContinuation, trace.WithAttributes(
			telemetry.AttrMigrationReason.String(prev.reason),
			telemetry.AttrContinuedTokens.Int(len(cr.gen))))
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ob := outBody{n: int64(len(body))}
	ob.parts[0] = body
	c := call{set: in.set, op: op, target: in.target, stream: in.stream, observe: in.observe, out: &ob, a: a, eng: eng, actx: actx, cancel: cancel, cr: cr, path: continueURL, resumed: true}
	defer c.stop()
	o := s.send(&c, r, &ob)
	if o.resp != nil {
		defer o.resp.Body.Close()
	}
	var k *cut
	unsent := false // the leg failed before anything of it reached the client
	switch {
	case o.err != nil:
		k, unsent = &cut{reason: ErrTypeEngineDisconnect, err: o.err}, true
		if a.errType != "" && cr.cfg.on(a.errType) {
			k.reason = a.errType
		}
	case o.resp.StatusCode < 200 || o.resp.StatusCode > 299 || !isEventStream(o.resp.Header.Get("Content-Type")):
		a.fail(ErrTypeStreamError)
		k, unsent = &cut{reason: ErrTypeStreamError, err: &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeStreamError,
			Message: "the engine refused the continuation of the broken generation"}}, true
	case in.observe:
		var ae *APIError
		if ae, k = s.reassembleStream(w, r, o.resp, &c); ae != nil {
			// Nothing of the answer can be given: a reassembly failure,
			// or the client gone.
			s.metrics.RecordMigration(ctx, prev.reason, legOutcome(a.errType, false))
			return nextLeg{}, ae
		}
	default:
		_, k = s.stream(w, r, o.resp, &c)
	}
	switch a.errType {
	case ErrTypeClientCancelled, ErrTypeClientStalled:
		// The client left: nothing follows, and nothing is written.
		s.metrics.RecordMigration(ctx, prev.reason, migrationCancelled)
		return nextLeg{}, nil
	}
	if k == nil {
		s.metrics.RecordMigration(ctx, prev.reason, legOutcome(a.errType, cr.aborted))
		return nextLeg{}, nil
	}
	s.metrics.RecordMigration(ctx, prev.reason, migrationFailed)
	if unsent {
		// Refused before its first byte: this engine had nothing of the
		// answer, so the attempt does not use up migration.limit and the
		// planner may send the continuation to another engine.
		cr.continued--
	}
	if k.last.IsZero() {
		k.last = prev.last // nothing reached the client in this leg
	}
	cr.link = a.span.SpanContext()
	cr.cut = k
	if next := p.next(&outcome{stage: stageCut, cut: k, errType: a.errType}); next.kind != legNone {
		return next, nil
	}
	return s.endBroken(w, r, k, op, in.observe)
}

// endBroken ends an answer broken as k that is not continued: a
// non-streaming client's (whole: observed), whose response has not
// started, gets k's error returned, to be written in the route's envelope;
// a stream is ended here (endCut).
func (s *Server) endBroken(w http.ResponseWriter, r *http.Request, k *cut, op *operation, whole bool) (nextLeg, error) {
	if whole {
		return nextLeg{}, k.err
	}
	s.answerComplete(r)
	endCut(w, k, op.framing)
	return nextLeg{}, nil
}

// legOutcome is the migrations outcome of a continuation leg that ended
// with error type errType (aborted: it ended with finish_reason "abort",
// passed to the client).
func legOutcome(errType string, aborted bool) string {
	switch {
	case errType == ErrTypeClientCancelled || errType == ErrTypeClientStalled:
		return migrationCancelled
	case errType != "" || aborted:
		return migrationFailed
	}
	return migrationRescued
}

// finishAnswer ends an answer broken after its last token and before its
// end: the finish chunk (finish_reason "length": max_tokens was reached),
// the usage chunk when the client asked for it (always, for a whole
// answer), and [DONE] (Messages: content_block_stop, message_delta with
// stop_reason max_tokens and the whole usage, message_stop); for a
// non-streaming client (whole), the reassembled body. Errors: a whole
// answer that cannot be reassembled (502).
func (s *Server) finishAnswer(w http.ResponseWriter, r *http.Request, cr *carry, whole bool) error {
	finish := []byte(`{"choices":[{"text":"","finish_reason":"length","stop_reason":null}]}`)
	usage := []byte(`{"choices":[],"usage":{"completion_tokens":0}}`)
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	unmerged := func(err error) error {
		return &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeStreamError, Message: fmt.Sprintf("the engine's stream could not be reassembled into a response: %v", err)}
	}
	if cr.framed() {
		cr.finish = "length"
		b, _ := cr.reshapeFramed(nil, &contChunk{Usage: &struct {
			CompletionTokens int64 `json:"completion_tokens"`
		}{}})
		if !whole {
			if _, err := w.Write(b); err == nil {
				_ = rc.Flush()
			}
			return nil
		}
		if err := addFramed(cr.ra, b); err != nil {
			return unmerged(err)
		}
	} else if whole {
		for _, ev := range [][]byte{finish, usage} {
			b, _ := cr.reshape(nil, ev)
			if err := cr.ra.Add(b); err != nil {
				return unmerged(err)
			}
		}
	}
	if whole {
		body := cr.ra.Body()
		h := w.Header()
		h["Content-Type"] = jsonContentType // shared: no one mutates it
		h.Set("Content-Length", strconv.Itoa(len(body)))
		writeHeader(w, r, http.StatusOK)
		_, _ = w.Write(body)
		return nil
	}
	var b []byte
	b = append(b, "data: "...)
	b, _ = cr.reshape(b, finish)
	b = append(b, "\n\n"...)
	if cr.usage {
		b = append(b, "data: "...)
		b, _ = cr.reshape(b, usage)
		b = append(b, "\n\n"...)
	}
	b = append(b, "data: [DONE]\n\n"...)
	if _, err := w.Write(b); err == nil {
		_ = rc.Flush()
	}
	return nil
}
