package gateway

import (
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

// reassembleStream answers a non-streaming client from the engine's stream
// (Config.ObserveNonStreaming): every event goes through the stream
// accounting as a streamed request's would (the first content event moves
// the slot to decode and records TTFT; later ones ITL; the usage chunk the
// token usage), and into an oai.Reassembler; nothing reaches the client until
// the stream has ended, so every failure still gets a real status:
//
//   - the whole stream ([DONE], every choice finished): 200 with the
//     reassembled body, as vLLM's non-streaming answer, with
//     Content-Length, written under the client write deadline;
//   - the engine's own error event: an OpenAI error object with its
//     message, and its code as the status when that is one (else 502);
//   - a stream cut short, an event or a body too large, or one that
//     cannot be reassembled: 502; the buffer budget full: 503;
//   - timeouts as for a stream until the first token (Timeouts.FirstToken
//     bounds the engine's silence in its queue and prefill), then
//     Timeouts.Idle between reads; the attempt timeout bounds the whole,
//     as for any non-streaming answer.
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

	// A continuable request's answer is reassembled across its legs: the
	// continuation's chunks, reshaped, go into the same reassembler.
	var ra *oai.Reassembler
	if cr != nil {
		if cr.ra == nil {
			cr.ra = oai.NewReassembler(c.op.schema == oai.SchemaCompletion)
		}
		ra = cr.ra
	} else {
		ra = oai.NewReassembler(c.op.schema == oai.SchemaCompletion)
	}
	st := streamState{a: a, framing: frameOpenAI, injected: true, cr: cr}
	var failed error // the first reassembly failure; the answer is given at once
	var held int64   // event bytes reserved in the budget
	defer func() {
		if cr != nil {
			cr.answer += held
			cr.buffered += held // given back when the request ends
		} else {
			s.buffered.give(held)
		}
	}()
	limit := c.set.cfg.MaxResponseBufferBytes // > 0: Validate requires it with ObserveNonStreaming
	if cr != nil {
		limit -= cr.answer // what earlier legs of the answer hold counts
	}
	var scratch []byte
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
		if failed != nil || ev.Comment || ev.Data == nil || sse.IsDone(ev.Data) {
			return
		}
		data := ev.Data
		if st.ch.FinishReason != nil && !(cr != nil && string(st.ch.FinishReason) == "abort" && cr.mayResume(migrateAbort)) {
			st.finished = true // a break after it is not continued
		}
		if cr != nil {
			switch {
			case st.ch.Error && cr.mayResume(migrateStreamErr):
				st.tail, st.reason, st.errEvent = []byte{}, migrateStreamErr, false
				return
			case string(st.ch.FinishReason) == "abort" && cr.mayResume(migrateAbort):
				st.tail, st.reason = []byte{}, migrateAbort
				return
			case st.ch.Error:
				// The engine's error, as the answer: the reassembler
				// turns it into the client's error.
				st.unresumable(migrateStreamErr)
			default:
				if string(st.ch.FinishReason) == "abort" {
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
		n := int64(len(data))
		switch {
		case held+n > limit:
			failed = errReassembleTooLarge
		case !s.buffered.take(n):
			failed = errReassembleBudget
		default:
			held += n
			failed = ra.Add(data)
		}
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
