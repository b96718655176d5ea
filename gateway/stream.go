package gateway

import (
	"bytes"
	"io"
	"net/http"
	"time"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// maxHeldBeforeFirst caps what a stream holds back before its first
// content event while a first-token retry is possible (a role chunk is
// about 200 bytes).
const maxHeldBeforeFirst = 16 << 10

// streamState is what the stream loop learns from the events it forwards.
type streamState struct {
	a        *attempt
	framing  framing
	now      time.Time
	done     bool // saw the framing's end event ([DONE], response.completed, message_stop, ...)
	errEvent bool // the engine sent an error event
	// injected is set when the gateway asked for the usage chunk on the
	// client's behalf; that chunk is then recorded but not forwarded.
	injected bool
	// dropFrom and dropTo bound an event in the current Push output
	// that must not be forwarded; dropTo is 0 when there is none.
	dropFrom, dropTo int
	// swap, when not empty, is forwarded in place of the dropped event:
	// a disaggregated request's usage chunk with the prefill engine's
	// cached tokens (attempt.rewriteUsage).
	swap []byte
	// heldAt, when held, is where in the current Push output the error
	// event of a Messages or Responses stream's first leg starts, held
	// back in tail (with what follows it) because a continuation may
	// replace it.
	heldAt int
	held   bool

	// On a continuable route (cr set): every event is rewritten into out
	// (token id fields cut, or a continuation's chunks reshaped), and an
	// engine's own end that a continuation may replace (its error event,
	// an abort) is held in tail, with what follows it.
	cr      *carry
	reshape bool // a continuation leg: the engine's chunks are completions chunks
	out     []byte
	scratch []byte
	tail    []byte
	reason  string // the failure kind when tail is held
	// last is when the last content event was read.
	last time.Time
	// finished: the leg forwarded a finish_reason, so its generation is
	// complete and a break after it (the engine closing before [DONE])
	// is not continued: a continuation would add a second finish (or
	// tokens after the end).
	finished bool
	// ch is the last chunk onChunk inspected (for reassembleStream).
	ch oai.Chunk
}

// dataPrefix and eventEnd frame a rewritten event.
var (
	dataPrefix = []byte("data: ")
	eventEnd   = []byte("\n\n")
)

// onRewrite reads one event of a continuable route's stream (OpenAI
// framing) and appends what the client is to get to st.out: the event
// with the token id fields the client did not ask for cut (take), or, on
// a continuation leg, the engine's completions chunk reshaped into the
// client's framing (reshape). An end the engine sends itself that a
// continuation may replace (its error event, an abort) goes to st.tail
// instead, with everything after it, rewritten the same way: the client
// gets it if no continuation follows.
func (st *streamState) onRewrite(ev sse.Event) {
	if st.tail != nil && st.reshape && st.cr.framed() {
		// A Messages continuation that failed: its end is the gateway's
		// error event, whatever the engine sends after.
		if ev.Data != nil && sse.IsDone(ev.Data) {
			st.done = true
		}
		return
	}
	if len(st.tail) > maxHeldTail {
		st.done = true // an engine that goes on after its end: enough
		return
	}
	dst := &st.out
	if st.tail != nil {
		dst = &st.tail
	}
	if ev.Comment || ev.Data == nil {
		*dst = append(*dst, ev.Raw...)
		return
	}
	a, cr := st.a, st.cr
	if a.pd != nil {
		a.handover(st.now)
	}
	if sse.IsDone(ev.Data) {
		st.done = true
		if st.reshape && cr.framed() {
			// An Anthropic stream ends at message_stop, which the usage
			// chunk brought, or which is sent now.
			*dst = cr.endFramed(*dst, a.contentEvents)
			return
		}
		*dst = append(*dst, ev.Raw...)
		return
	}
	ch, err := oai.InspectChunk(ev.Data)
	if err != nil {
		a.s.metrics.RecordParseError(a.ctx, a.attrs)
		if !st.reshape {
			// The client's own engine's framing: forwarded as it came
			// (docs/cases.md L07). A continuation engine's unreadable
			// chunk is not in the client's framing: dropped.
			*dst = append(*dst, ev.Raw...)
		}
		return
	}
	if st.tail != nil && ch.Content {
		// Content after an end the engine sent itself (its error, an
		// abort) is not an answer to keep: the stream ends there.
		st.done = true
		return
	}
	if st.tail == nil && st.reshape && cr.framed() && (ch.Error || string(ch.FinishReason) == "abort") {
		// The engine's own end is in the wrong framing for this client:
		// it ends with the gateway's error event, unless continued.
		st.tail, st.reason = []byte{}, migrateStreamErr
		if !ch.Error {
			st.reason = migrateAbort
		}
		return
	}
	switch {
	case ch.Error:
		st.errEvent = true
		if st.tail == nil && cr.mayResume(migrateStreamErr) {
			st.tail, st.reason = append([]byte{}, ev.Raw...), migrateStreamErr
			return
		}
		if st.tail == nil {
			st.unresumable(migrateStreamErr)
		}
		*dst = append(*dst, ev.Raw...)
		return
	case st.tail == nil && string(ch.FinishReason) == "abort":
		if cr.mayResume(migrateAbort) {
			st.tail, st.reason = []byte{}, migrateAbort
			dst = &st.tail
		} else {
			st.unresumable(migrateAbort)
			cr.aborted = true
		}
	}
	if a.respID == "" && len(ch.ID) > 0 && !st.reshape {
		a.respID = string(ch.ID)
	}
	if !a.modelSeen {
		a.answered(ch.Model)
	}
	if ch.FinishReason != nil {
		a.finished(ch.FinishReason)
		st.finished = true
	}
	if ch.HasUsage {
		a.usage, a.hasUsage = ch.Usage, true
	}
	if ch.Content {
		a.onContent(st.now)
		st.last = st.now
	}
	if st.reshape {
		var drop bool
		switch st.scratch, drop = cr.reshape(st.scratch[:0], ev.Data); {
		case drop:
		case cr.framed():
			*dst = append(*dst, st.scratch...)
		default:
			*dst = appendEvent(*dst, st.scratch)
		}
		return
	}
	if st.injected && ch.HasUsage && ch.Choices == 0 {
		if a.pd != nil {
			a.rewriteUsage(nil, ev.Data) // not forwarded, but checked (not_transferred)
		}
		return // the usage chunk the client did not ask for
	}
	// take cuts in place: ev.Data is the scanner's copy of the engine's
	// bytes, done with once the event is dispatched, and the bytes Push
	// returns are not forwarded on this path (st.out is).
	data := cr.take(ev.Data, &ch)
	if ch.HasUsage && a.pd != nil {
		if nd, ok := a.rewriteUsage(nil, data); ok {
			*dst = appendEvent(*dst, nd)
			return
		}
	}
	if len(data) == len(ev.Data) {
		*dst = append(*dst, ev.Raw...)
		return
	}
	*dst = appendEvent(*dst, data)
}

// maxHeldTail caps what is held after an end the engine sent itself (an
// error event or an abort chunk, then its usage and [DONE]).
const maxHeldTail = 16 << 10

// appendEvent appends data as one SSE event: a data line per line of it.
func appendEvent(b, data []byte) []byte {
	for {
		line, rest, more := bytes.Cut(data, eventEnd[:1])
		b = append(append(append(b, dataPrefix...), line...), '\n')
		if !more {
			return append(b, '\n')
		}
		data = rest
	}
}

// unresumable counts an end the engine sent itself (kind: an error event
// or an abort) that is not held back for a continuation, when kind is one
// migration.on continues: the request's exclusion, or the continuation
// outcome limit or no_engine, as plan.resume counts a break.
func (st *streamState) unresumable(kind string) {
	cr := st.cr
	if !cr.cfg.on(kind) {
		return
	}
	exclusion, outcome := cr.verdict()
	cr.count(st.a.ctx, st.a.s.metrics, kind, exclusion, outcome)
}

func (st *streamState) onEvent(ev sse.Event) {
	if ev.Comment || ev.Data == nil {
		return // keep-alives and comments never count as tokens (L08, L10)
	}
	switch st.framing {
	case frameOpenAI:
		st.onChunk(ev)
	case frameResponses, frameAnthropic:
		st.onTypedEvent(ev)
	default:
		// Any other stream: every data event is output.
		st.a.onContent(st.now)
	}
}

// onChunk reads one OpenAI chunk (chat, completions, transcription).
func (st *streamState) onChunk(ev sse.Event) {
	if sse.IsDone(ev.Data) {
		st.done = true
		return
	}
	a := st.a
	if a.pd != nil {
		a.handover(st.now)
	}
	ch, err := oai.InspectChunk(ev.Data)
	st.ch = ch
	if err != nil {
		// Forwarded anyway; an unparsable event never becomes a 5xx
		// mid-stream (docs/cases.md L07).
		a.s.metrics.RecordParseError(a.ctx, a.attrs)
		return
	}
	if ch.Error {
		st.errEvent = true
	}
	if a.respID == "" && len(ch.ID) > 0 {
		a.respID = string(ch.ID)
	}
	if !a.modelSeen {
		a.answered(ch.Model)
	}
	if ch.FinishReason != nil {
		a.finished(ch.FinishReason)
	}
	if ch.HasUsage {
		a.usage, a.hasUsage = ch.Usage, true
		if st.injected && ch.Choices == 0 { // the usage-only chunk: nothing else in it
			st.dropFrom, st.dropTo = ev.Offset, ev.Offset+len(ev.Raw)
			if a.pd != nil {
				a.rewriteUsage(nil, ev.Data) // not forwarded, but checked (not_transferred)
			}
		} else if a.pd != nil {
			if data, ok := a.rewriteUsage(nil, ev.Data); ok {
				st.swap = appendEvent(st.swap[:0], data)
				st.dropFrom, st.dropTo = ev.Offset, ev.Offset+len(ev.Raw)
			}
		}
	}
	if ch.Content {
		a.onContent(st.now)
		st.last = st.now
	}
}

// onTypedEvent reads one Responses API or Anthropic Messages event.
func (st *streamState) onTypedEvent(ev sse.Event) {
	if st.tail != nil {
		// After an error event held back for a continuation, nothing
		// the engine sends counts (the stream loop keeps its bytes with
		// the held event, for the client if no continuation follows).
		return
	}
	a := st.a
	var e oai.Event
	var err error
	if st.framing == frameResponses {
		e, err = oai.InspectResponsesEvent(ev.Data)
	} else {
		e, err = oai.InspectAnthropicEvent(ev.Data)
	}
	if err != nil {
		a.s.metrics.RecordParseError(a.ctx, a.attrs)
		return
	}
	if e.Error && st.cr != nil && st.tail == nil {
		if st.cr.mayResume(migrateStreamErr) {
			// The engine's error ends the stream; a continuation may
			// replace it, so it is held back (tail) until the planner
			// decides.
			st.tail, st.reason, st.heldAt, st.held = append([]byte{}, ev.Raw...), migrateStreamErr, ev.Offset, true
			st.done = true
			return
		}
		st.unresumable(migrateStreamErr)
	}
	if e.Error {
		st.errEvent = true
	}
	if e.Terminal {
		st.done = true
	}
	if a.respID == "" && len(e.ID) > 0 {
		a.respID = string(e.ID)
	}
	if !a.modelSeen {
		a.answered(e.Model)
	}
	if e.FinishReason != nil {
		a.finished(e.FinishReason)
		st.finished = true // a break after it is not continued
	}
	if st.cr != nil {
		if st.framing == frameAnthropic {
			st.cr.takeAnthropic(ev.Data, &e)
		} else {
			st.cr.takeResponses(ev.Data, &e)
		}
	}
	a.noteEventUsage(&e, st.framing == frameAnthropic)
	if e.Content {
		a.onContent(st.now)
		st.last = st.now
	}
	if st.cr != nil && st.cr.blockStarted && st.cr.excluded == "" {
		switch string(e.Type) {
		case "content_block_stop", "response.output_text.done":
			st.finished = true // the text is whole; a break after it is not continued
		}
	}
}

// stream forwards an SSE response event by event: every read is scanned,
// the complete events in it are written and flushed at once, and a partial
// event waits for its end. The route's framing says when the stream is
// complete (at `data: [DONE]`, at response.completed / failed /
// incomplete, at message_stop, or, for any other stream, at the body's
// clean end). When the engine fails before that the client gets a final
// error event in the route's framing (writeStreamError), because the
// official clients take a bare EOF for success. Until the first content event the engine may send nothing
// but the role chunk and comments until firstBy; after it, Timeouts.Idle
// bounds the gap between reads.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call) (*APIError, *cut) {
	a, actx := c.a, c.actx
	// A stream the client did not ask for (speech, images answered as
	// events) has no first-token wait: the idle timeout bounds it from
	// the start.
	rl := s.newRelay(w, r, resp, c, true, c.stream, c.firstBy)
	rl.started = c.resumed // a continuation appends to a response that has started
	defer rl.close()
	sc := scannerPool.Get().(*sse.Scanner)
	sc.Reset()
	defer scannerPool.Put(sc)

	st := streamState{a: a, framing: c.op.framing, injected: c.out.injected}
	endsAtEOF := c.op.framing == frameAny
	onEvent := st.onEvent
	if c.cr != nil {
		st.cr = c.cr // an Anthropic stream's first leg is read as it is (onTypedEvent)
	}
	rewrite := c.cr != nil && (c.op.framing == frameOpenAI || c.resumed)
	if rewrite {
		st.reshape = c.resumed
		onEvent = st.onRewrite
		// The rewritten events of one read: a pooled buffer.
		outp := eventBufPool.Get().(*[]byte)
		st.out = (*outp)[:0]
		defer eventBufPool.Put(outp) // its array, whatever st.out grew into
	}
	// With a first-token retry possible (c.holdFirst), nothing is sent
	// before the first content event: the role chunk and anything else
	// before it are held (up to maxHeldBeforeFirst; more is sent and the
	// retry given up), so a first-token timeout leaves the client
	// untouched and the request can go to another engine.
	var held []byte
	hold := c.holdFirst
	emit := func(p []byte, flush bool) error {
		if hold && a.first.IsZero() && len(held)+len(p) <= maxHeldBeforeFirst {
			held = append(held, p...)
			return nil
		}
		if hold {
			hold = false
			if len(held) > 0 {
				p = append(held, p...)
				held = nil
			}
		}
		return rl.write(p, flush)
	}
	defer func() {
		if rl.maxGap > 0 {
			a.s.metrics.RecordMaxGap(a.ctx, a.attrs, rl.maxGap.Seconds())
		}
	}()
	for {
		p, now, rerr := rl.read()
		if len(p) > 0 {
			st.now = now
			st.dropTo, st.swap = 0, st.swap[:0]
			st.out = st.out[:0]
			out := sc.Push(p, onEvent)
			if rewrite {
				out = st.out
			}
			if st.held {
				// An error event held back (onTypedEvent): it is in tail;
				// what follows it in this read is not sent either.
				if rest := out[min(st.heldAt+len(st.tail), len(out)):]; len(st.tail)+len(rest) <= maxHeldTail {
					st.tail = append(st.tail, rest...)
				}
				out, st.held = out[:st.heldAt], false
			}
			if (st.done || st.errEvent) && st.tail == nil {
				// The end event (or the engine's own error event, which
				// ends a Messages or Responses stream with no end event)
				// is in out: the request's concurrency lease goes back
				// before the client can read it (once: leaseBack).
				s.answerComplete(r)
			}
			if !a.first.IsZero() || a.class != classGenerative || !c.stream {
				// After the first content any bytes are progress (an event
				// trickled across reads, a keep-alive); before it only
				// content ends the first-token wait. A route that
				// generates nothing itself (a stored response streamed
				// again) has no first token: its bytes are progress.
				rl.touch(st.now)
			}
			if st.dropTo > 0 {
				// Forward around the usage chunk the client did not ask for.
				rest := out[st.dropTo:]
				head := out[:st.dropFrom]
				if len(st.swap) > 0 {
					head = append(head[:len(head):len(head)], st.swap...)
				}
				if len(head) > 0 {
					if err := emit(head, len(rest) == 0); err != nil {
						a.fail(clientWriteErrType(err))
						return nil, nil
					}
				}
				out = rest
			}
			if len(out) > 0 {
				if err := emit(out, true); err != nil {
					a.fail(clientWriteErrType(err))
					return nil, nil
				}
			}
		}
		if st.done {
			// The end event is the end: do not wait on an engine that
			// keeps the connection open after it, and a read error that
			// came with it breaks nothing (the answer is whole).
			rerr = io.EOF
		}
		if rerr == nil {
			continue
		}
		if st.tail != nil {
			// The engine ended the stream itself (an error event, an
			// abort) and a continuation may replace that end.
			a.fail(st.reason)
			if !rl.started {
				// Nothing reached the client: its end is the answer.
				s.answerComplete(r)
				if err := rl.write(append(held, st.tail...), true); err != nil {
					a.fail(clientWriteErrType(err))
				}
				return nil, nil
			}
			return nil, &cut{reason: st.reason, tail: st.tail, last: st.last,
				err: &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: st.reason, Message: "the engine ended the stream with an error"}}
		}
		// An engine that sent its own error event and closed has ended
		// the stream: the client has the error, and a second one made
		// by the gateway would only hide it.
		if rerr == io.EOF && (st.done || endsAtEOF || st.errEvent) {
			if st.errEvent {
				a.fail(ErrTypeStreamError)
			}
			if len(held) > 0 { // a stream that ended with no content
				if err := rl.write(held, true); err != nil {
					a.fail(clientWriteErrType(err))
				}
			}
			rl.start()
			return nil, nil
		}
		var et string
		var ae *APIError
		if rerr == io.EOF {
			et, ae = ErrTypeEngineDisconnect, &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeEngineDisconnect, Message: "the engine closed the stream before it was complete"}
		} else {
			et, ae = s.classify(r, actx, rerr)
		}
		a.fail(et)
		if !rl.started {
			// Nothing was sent (the stream may have been held before its
			// first content): the planner decides between another leg
			// and this error, a real status.
			return ae, nil
		}
		if st.cr != nil && !st.finished && et != ErrTypeClientCancelled && et != ErrTypeClientStalled {
			// The caller decides: a continuation, or this error event.
			// (A break after the finish chunk is not continued: the
			// answer is whole, only its end is missing.)
			return nil, &cut{reason: et, err: ae, last: st.last}
		}
		if et != ErrTypeClientCancelled {
			s.answerComplete(r)
			writeStreamError(w, rl.rc, ae, c.op.framing)
		}
		return nil, nil
	}
}

// writeStreamError ends a broken stream with an error event in the
// route's framing. A partial event the engine left unfinished is dropped
// (it was never forwarded), so the error event starts on a clean boundary.
//
//   - OpenAI (and any other stream): `data: {"error":{...}}`, which the
//     OpenAI clients raise as an APIError.
//   - Anthropic: `event: error` with {"type":"error","error":{"type",
//     "message"}}, as the Messages API sends it.
//   - Responses: `event: error` with the Responses API error event's
//     fields (type "error", code, message, param) plus the OpenAI error
//     object under "error": the official clients (openai-go, openai-node)
//     raise an error for any event whose data has an "error" member.
func writeStreamError(w http.ResponseWriter, rc *http.ResponseController, ae *APIError, f framing) {
	// Bounded: a client that stopped reading must not hold the handler.
	_ = rc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	switch f {
	case frameAnthropic:
		b.WriteString("event: error\ndata: ")
		b.Write(ae.body(envAnthropic))
	case frameResponses:
		b.WriteString("event: error\ndata: ")
		b.Write(ae.responsesErrorEvent())
	default:
		b.WriteString("data: ")
		b.Write(ae.body(envOpenAI))
	}
	b.WriteString("\n\n")
	if _, err := w.Write(b.Bytes()); err == nil {
		_ = rc.Flush()
	}
}

// noteEventUsage takes the usage a Responses or Anthropic event reports.
// Anthropic's input_tokens leaves out the prompt read from its cache and
// the prompt written to it, reported apart (and per field in later
// events): the prompt is their sum, its cached part the tokens read. A
// Responses usage's input_tokens is the whole prompt, with
// input_tokens_details.cached_tokens its cached part.
func (a *attempt) noteEventUsage(e *oai.Event, anthropic bool) {
	if e.OutputTokens >= 0 {
		a.usage.CompletionTokens, a.hasUsage = e.OutputTokens, true
	}
	if !anthropic {
		if e.InputTokens >= 0 {
			a.usage.PromptTokens, a.hasUsage = e.InputTokens, true
		}
		if e.CachedTokens >= 0 {
			a.usage.CachedTokens, a.usage.HasCached = e.CachedTokens, true
		}
		return
	}
	if e.InputTokens < 0 && e.CachedTokens < 0 && e.CacheWriteTokens < 0 {
		return
	}
	for _, f := range [...]struct {
		dst *int64
		v   int64
	}{{&a.anthIn, e.InputTokens}, {&a.anthRead, e.CachedTokens}, {&a.anthWrite, e.CacheWriteTokens}} {
		if f.v >= 0 {
			*f.dst = f.v
		}
	}
	a.usage.PromptTokens, a.hasUsage = a.anthIn+a.anthRead+a.anthWrite, true
	if e.CachedTokens >= 0 {
		a.usage.CachedTokens, a.usage.HasCached = a.anthRead, true
	}
}
