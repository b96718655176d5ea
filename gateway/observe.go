package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// Reassembly failures that are not the engine's stream error.
var (
	// errReassembleTooLarge: the event data, or the body rebuilt from it,
	// passed Config.MaxResponseBufferBytes.
	errReassembleTooLarge = errors.New("stream too large to reassemble")
	// errReassembleEvent: an event passed the scanner's limit and was
	// skipped, so the body would miss its content.
	errReassembleEvent = errors.New("an event too large to read")
	// errReassembleBudget: the gateway-wide buffered-bytes budget
	// (Config.MaxBufferedBytes) is full.
	errReassembleBudget = errors.New("the gateway's buffer budget is full")
)

// observes decides whether a non-streaming request is sent to the engine
// as a stream and its events reassembled into the one body the client gets
// (inbound.observe), on a route whose row allows it (operation.observe:
// chat, completions, Messages, Responses), for a body a stream can answer
// (no prompt_logprobs or kv_transfer_params, no stream_options without
// stream, no Responses background request: it is answered at once and
// generates on its own) and with Config.MaxResponseBufferBytes > 0 (the body is held up to it):
//
//   - always with Config.ObserveNonStreaming;
//   - otherwise when its generation may be continued: continuation is on
//     (MigrationConfig.Limit > 0, MigrationConfig.NonStreaming) and the body is continuable at arrival
//     (excludedBy finds nothing). Without a stream there are no token ids
//     (or, for Messages, no text) to continue from, so a non-streaming
//     answer broken by its engine could only fail. An excluded request
//     goes as it came.
func observes(op *operation, in *inbound) bool {
	cfg := &in.set.cfg
	switch {
	case !op.observe || in.stream || !in.req.Streamable || in.req.HasStreamOptions || cfg.MaxResponseBufferBytes <= 0:
		return false
	case op.framing == frameResponses && background(in.body):
		return false
	case cfg.ObserveNonStreaming:
		return true
	}
	return op.migrate != migrateNone && cfg.Migration.Limit > 0 && cfg.Migration.NonStreaming && in.exclusion(op.migrate) == ""
}

// exclusion returns why the request's body cannot be continued on a route
// continued as k (excludedBy; "" when it can), judged once per request: the
// body is read for it at most once, whether observes or newCarry asks
// first.
func (in *inbound) exclusion(k migrateKind) string {
	if !in.judged {
		in.excluded, in.judged = excludedBy(k, in.body, in.set.cfg.Migration.ResponsesStore), true
	}
	return in.excluded
}

// answerer reassembles the events of an observed answer (all its legs)
// into the non-streaming body: *oai.Reassembler for chat and completions,
// *oai.MessagesReassembler for Anthropic Messages.
type answerer interface {
	// Add merges one event's data; errors: *oai.StreamError for the
	// engine's error event, others for data that cannot be merged.
	Add(data []byte) error
	// Finished reports whether the answer is whole.
	Finished() bool
	// Body returns the body the engine would have answered.
	Body() []byte
	// SetModel names the model that finished the answer (raw JSON
	// string), when the continuation crossed to a fallback model.
	SetModel(raw []byte)
	// Held is the bytes of event data kept so far (about the body's
	// size): what is charged against the limits.
	Held() int
}

// newAnswerer returns the reassembler of op's answers.
func newAnswerer(op *operation) answerer {
	switch op.framing {
	case frameAnthropic:
		return new(oai.MessagesReassembler)
	case frameResponses:
		return new(oai.ResponsesReassembler)
	}
	return oai.NewReassembler(op.schema == oai.SchemaCompletion)
}

// addFramed merges whole SSE events (an "event:" line and one "data:" line
// each, as carry.reshapeMessages frames them; several may follow each
// other) into ra: the data of each.
func addFramed(ra answerer, b []byte) error {
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, eventEnd[:1])
		if data, ok := bytes.CutPrefix(line, dataPrefix); ok {
			if err := ra.Add(data); err != nil {
				return err
			}
		}
	}
	return nil
}

// reassembleStream answers a non-streaming client from the engine's stream
// (observes): every event goes through the stream accounting as a streamed
// request's would (the first content event moves the slot to decode and
// records TTFT; later ones ITL; the usage chunk, or Messages' usage, the
// token usage), and into the answer's reassembler (answerer); nothing
// reaches the client until the stream has ended, so every failure still
// gets a real status, in the route's error envelope:
//
//   - the whole stream (chat and completions: [DONE], every choice
//     finished; Messages: message_start, message_delta and message_stop):
//     200 with the reassembled body, as vLLM's non-streaming answer, with
//     Content-Length, written under the client write deadline;
//   - the engine's own error event: an error with its message, and its
//     status (an OpenAI error's code; an Anthropic error's type, see
//     oai.MessagesReassembler.Add) when that is one (else 502);
//   - a stream cut short, an event or a body too large, or one that
//     cannot be reassembled: 502; the buffer budget full: 503;
//   - timeouts as for a stream until the first token (Timeouts.FirstToken
//     bounds the engine's silence in its queue and prefill), then
//     Timeouts.Idle between reads; the attempt timeout bounds the whole,
//     as for any non-streaming answer.
//
// A continuable request's break (a cut, or the engine's own error or
// abort held back while a continuation may replace it) is returned as a
// cut; a continuation leg's chunks, reshaped into the client's framing,
// go into the same reassembler (carry.ra).
//
// The event data held is reserved in the gateway-wide buffered-bytes
// budget until the answer is written.
func (s *Server) reassembleStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call) (*APIError, *cut) {
	a, cr := c.a, c.cr
	var firstBy time.Time
	if d := c.set.cfg.Timeouts.FirstToken; d > 0 {
		firstBy = a.start.Add(d)
	}
	rl := s.newRelay(w, r, resp, c, false, true, firstBy)
	defer rl.close()
	defer func() {
		if rl.maxGap > 0 {
			s.metrics.RecordMaxGap(a.ctx, a.attrs, rl.maxGap.Seconds())
		}
	}()
	sc := scannerPool.Get().(*sse.Scanner)
	sc.Reset()
	defer scannerPool.Put(sc)

	// The engine's framing: the route's on the first leg, /v1/completions
	// chunks on a continuation leg; a Messages continuation's chunks are
	// reshaped into whole Anthropic events (framed).
	f := frameOpenAI
	if !c.resumed {
		f = c.op.framing
	}
	framed := cr != nil && c.resumed && cr.framed()
	// A continuable request's answer is reassembled across its legs: the
	// continuation's chunks, reshaped, go into the same reassembler.
	var ra answerer
	if cr != nil {
		if cr.ra == nil {
			cr.ra = newAnswerer(c.op)
		}
		ra = cr.ra
	} else {
		ra = newAnswerer(c.op)
	}
	st := streamState{a: a, framing: f, injected: true, cr: cr}
	var failed error // the first reassembly failure; the answer is given at once
	var held int64   // bytes the reassembler keeps, reserved in the budget
	defer func() {
		if cr != nil {
			cr.answer += held
			cr.buffered += held // given back when the request ends
		} else {
			s.buffered.give(held)
		}
	}()
	limit := c.set.cfg.MaxResponseBufferBytes // > 0: observes requires it
	if cr != nil {
		limit -= cr.answer // what earlier legs of the answer hold counts
	}
	// What the reassembler keeps of each event is charged (about the
	// body's size), not the event's bytes: a chat chunk's framing is ~50
	// times its token, so charging it would refuse answers whose body
	// fits well within the limit.
	// kept is ra.Held() after the last add: Held walks what the
	// reassembler keeps, so it is read once per event, not twice.
	kept := ra.Held()
	add := func(data []byte) {
		if framed {
			failed = addFramed(ra, data)
		} else {
			failed = ra.Add(data)
		}
		now := ra.Held()
		grow := int64(now - kept)
		kept = now
		if failed != nil || grow <= 0 {
			return
		}
		switch {
		case held+grow > limit:
			failed = errReassembleTooLarge
		case !s.buffered.take(grow):
			failed = errReassembleBudget
		default:
			held += grow
		}
	}
	var scratch, usageBuf []byte
	onEvent := func(ev sse.Event) {
		if st.tail != nil {
			// After an end a continuation may replace: nothing counts.
			if ev.Data != nil && sse.IsDone(ev.Data) {
				st.done = true
			}
			return
		}
		st.ch = oai.Chunk{}
		st.onEvent(ev)
		if failed != nil || ev.Comment || ev.Data == nil {
			return
		}
		if sse.IsDone(ev.Data) {
			if framed {
				// A Messages answer ends at message_stop, which the usage
				// chunk brought, or which comes now.
				if scratch = cr.endFramed(scratch[:0], a.contentEvents); len(scratch) > 0 {
					add(scratch)
				}
			}
			return
		}
		data := ev.Data
		switch {
		case f == frameAnthropic, f == frameResponses:
			// onTypedEvent has read it (takeAnthropic and takeResponses
			// keep the text), and held the engine's error event back
			// (tail) while a continuation may replace it, or counted why
			// not.
			if st.tail != nil {
				return
			}
		case cr != nil:
			abort := string(st.ch.FinishReason) == "abort"
			if st.ch.FinishReason != nil && !(abort && cr.mayResume(migrateAbort)) {
				st.finished = true // a break after it is not continued
			}
			switch {
			case framed && (st.ch.Error || abort):
				// The engine's own end, in the wrong framing for this
				// client: the answer ends with the gateway's error,
				// unless continued.
				st.tail, st.reason = []byte{}, migrateStreamErr
				if !st.ch.Error {
					st.reason = migrateAbort
				}
				return
			case st.ch.Error && cr.mayResume(migrateStreamErr):
				st.tail, st.reason, st.errEvent = []byte{}, migrateStreamErr, false
				return
			case abort && cr.mayResume(migrateAbort):
				st.tail, st.reason = []byte{}, migrateAbort
				return
			case st.ch.Error:
				// The engine's error, as the answer: the reassembler
				// turns it into the client's error.
				st.unresumable(migrateStreamErr)
			default:
				if abort {
					st.unresumable(migrateAbort)
					cr.aborted = true
				}
				if !c.resumed {
					data = cr.take(data, &st.ch)
					break
				}
				var drop bool
				if scratch, drop = cr.reshape(scratch[:0], data); drop {
					return
				}
				data = scratch
			}
		}
		if st.ch.HasUsage && a.pd != nil {
			if nd, ok := a.rewriteUsage(usageBuf[:0], data); ok {
				data, usageBuf = nd, nd
			}
		}
		add(data)
	}
	for {
		p, now, rerr := rl.read()
		if len(p) > 0 {
			st.now = now
			sc.Push(p, onEvent)
			if failed == nil && sc.Overflows() > 0 {
				failed = errReassembleEvent
			}
			if !a.first.IsZero() {
				// After the first token any bytes are progress; before
				// it only content ends the first-token wait.
				rl.touch(now)
			}
		}
		if st.done && rerr == nil {
			rerr = io.EOF // [DONE] is the end, whatever the connection does
		}
		if rerr == nil && failed == nil {
			continue
		}
		if st.tail != nil {
			// The engine ended the answer itself (an error event, an
			// abort) and a continuation may go on from it.
			a.fail(st.reason)
			return nil, &cut{reason: st.reason, last: st.last,
				err: &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeStreamError, Message: "the engine ended the stream with an error"}}
		}
		var body []byte
		if failed == nil && rerr == io.EOF && st.done && ra.Finished() {
			if body = ra.Body(); int64(len(body)) > limit {
				failed, body = errReassembleTooLarge, nil
			}
		}
		var es *oai.StreamError
		switch {
		case errors.As(failed, &es):
			a.fail(ErrTypeStreamError)
			ae := &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeStreamError, Message: es.Message}
			if es.Code >= 400 && es.Code <= 599 {
				ae.Status = es.Code
			}
			if ae.Message == "" {
				ae.Message = "the engine reported an error in its stream"
			}
			return ae, nil
		case failed == errReassembleBudget:
			a.fail(ErrTypeOverloaded)
			return &APIError{Status: http.StatusServiceUnavailable, Type: TypeServer, Code: ErrTypeOverloaded, Message: "the gateway has no buffer left for this response; retry", Err: failed}, nil
		case failed != nil:
			a.fail(ErrTypeStreamError)
			return &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeStreamError, Message: fmt.Sprintf("the engine's stream could not be reassembled into a response: %v", failed), Err: failed}, nil
		case body != nil:
			h := w.Header()
			copyResponseHeaders(h, resp.Header, true)
			h["Content-Type"] = jsonContentType // shared: no one mutates it
			h.Set("Content-Length", strconv.Itoa(len(body)))
			s.answerComplete(r)
			writeHeader(w, r, http.StatusOK)
			rl.started = true
			// Under the client write deadline: a client that stops
			// reading does not hold the slot.
			if err := rl.write(body, false); err != nil {
				a.fail(clientWriteErrType(err))
			}
		case rerr == io.EOF:
			a.fail(ErrTypeEngineDisconnect)
			ae := &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeEngineDisconnect, Message: "the engine closed the stream before it was complete"}
			if cr != nil && !a.first.IsZero() && !st.finished {
				return nil, &cut{reason: ErrTypeEngineDisconnect, err: ae, last: st.last}
			}
			return ae, nil
		default:
			et, ae := s.classify(r, c.actx, rerr)
			a.fail(et)
			if cr != nil && !a.first.IsZero() && !st.finished && et != ErrTypeClientCancelled && et != ErrTypeClientStalled {
				return nil, &cut{reason: et, err: ae, last: st.last}
			}
			return ae, nil
		}
		return nil, nil
	}
}
