package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// copyBufSize is the read buffer for engine bodies (Caddy's reverse proxy
// uses 32 KiB too); eventBufSize the one for event streams.
const (
	copyBufSize  = 32 << 10
	eventBufSize = 4 << 10
)

var (
	copyBufPool = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}
	// eventBufPool holds the read buffers of event streams: their events
	// are small and come one or a few per read, and a stream holds its
	// buffer for its whole life, so a 32 KiB buffer would be most of a
	// long stream's memory (the scanner keeps an event split across
	// reads).
	eventBufPool = sync.Pool{New: func() any { b := make([]byte, eventBufSize); return &b }}
	scannerPool  = sync.Pool{New: func() any { return sse.NewScanner(0) }}
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
	ch, err := oai.InspectChunk(ev.Data)
	if err != nil {
		// Forwarded anyway; an unparsable event never becomes a 5xx
		// mid-stream (shared/cases L07).
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
		}
	}
	if ch.Content {
		a.onContent(st.now)
	}
}

// onTypedEvent reads one Responses API or Anthropic Messages event.
func (st *streamState) onTypedEvent(ev sse.Event) {
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
	}
	if e.InputTokens >= 0 {
		a.usage.PromptTokens, a.hasUsage = e.InputTokens, true
	}
	if e.OutputTokens >= 0 {
		a.usage.CompletionTokens, a.hasUsage = e.OutputTokens, true
	}
	if e.Content {
		a.onContent(st.now)
	}
}

// relayTimer is an attempt's engine-silence timer: first the first-token
// deadline (errFirstTokenTimeout), then, once the first content has
// arrived, the idle timeout between reads (errIdleTimeout). Its callback
// runs on the timer goroutine, hence the atomics.
//
// The timer is lazy (as Caddy's and net/http's idle timers are): moving
// the deadline later, which every read does, only stores it; when the
// timer fires before the stored deadline it re-arms itself for the rest.
// Only a deadline earlier than the one the timer is set for (the switch
// from the first-token wait to the shorter idle bound) resets it. A write
// to the client pauses the deadline (paused): the timer then re-checks
// every recheck until the write is over.
type relayTimer struct {
	t        *time.Timer
	cancel   context.CancelCauseFunc
	waiting  atomic.Bool  // still waiting for the first content
	deadline atomic.Int64 // monotonic ns since clockBase; paused while a client write runs
	stopped  atomic.Bool
	recheck  time.Duration
	// idle caps a re-arm during the first-token wait: the idle deadline
	// that follows it is earlier than the first-token one, and only the
	// timer may reset itself once it has fired (a reset from the handler
	// could race with its re-arm).
	idle time.Duration
}

// clockBase is the origin of the timers' deadlines: durations since it
// are read from the monotonic clock, so a wall-clock step (NTP, a VM
// resumed) moves no deadline.
var clockBase = time.Now()

// mono returns t as the monotonic nanoseconds since clockBase.
func mono(t time.Time) int64 { return int64(t.Sub(clockBase)) }

// paused is the deadline while a client write runs; pauseRecheck how often
// the timer looks again meanwhile, so the engine-silence bound is late by
// at most that much after a write that outlasted it.
const (
	paused       = math.MaxInt64
	pauseRecheck = 100 * time.Millisecond
)

// fire cancels the attempt with the cause of the phase the stream is in,
// or re-arms the timer when the deadline has moved on or is paused.
func (rt *relayTimer) fire() {
	if rt.stopped.Load() {
		return
	}
	switch d := rt.deadline.Load(); {
	case d == paused:
		rt.t.Reset(rt.recheck)
		return
	case mono(time.Now()) < d:
		left := time.Duration(d - mono(time.Now()))
		if rt.waiting.Load() && rt.idle > 0 {
			left = min(left, rt.idle)
		}
		rt.t.Reset(left)
		return
	}
	if rt.waiting.Load() {
		rt.cancel(errFirstTokenTimeout)
		return
	}
	rt.cancel(errIdleTimeout)
}

// relay moves one engine response body to the client: a pooled read
// buffer, the engine-silence timer, the client's write deadline, and the
// start of the response, which waits for the first bytes worth forwarding
// so that an engine dying before any still gets a clean JSON error with a
// status. It lives on the handler's stack; close releases what it holds.
type relay struct {
	w       http.ResponseWriter
	r       *http.Request
	rc      *http.ResponseController
	resp    *http.Response
	sse     bool // an event stream: re-framed (no Content-Length), never buffered by a proxy in front
	started bool
	bufp    *[]byte
	events  bool // an event stream from the engine: bufp is from eventBufPool

	idle        time.Duration
	clientWrite time.Duration
	cancel      context.CancelCauseFunc // the attempt's, for the timer
	waiting     bool                    // a stream that has not had its first content yet
	timer       *relayTimer             // nil while no engine-silence bound applies
	deadline    time.Time               // the engine-silence deadline, while the timer runs
	fireAt      time.Time               // when the timer is set to fire (at or before deadline)
	wdl         time.Time               // the client write deadline set on the connection; zero when none

	// waited is the time spent blocked reading the engine body and
	// writing to the client; close adds it to the request's
	// reqState.waited.
	waited time.Duration
	// last is when the last read that brought bytes returned (zero before
	// the first); maxGap the largest gap between two such reads.
	last   time.Time
	maxGap time.Duration
}

// newRelay prepares the relay of resp. A streamed response (stream set)
// first waits for its first content: the engine may be silent until
// firstBy (no bound when firstBy is zero), and only after touch has been
// called does Timeouts.Idle bound the silence between touches. A
// non-streaming body is bounded by Timeouts.Idle between reads from the
// start.
func (s *Server) newRelay(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, sse, stream bool, firstBy time.Time) relay {
	cancel := c.cancel
	rl := relay{w: w, r: r, rc: http.NewResponseController(w), resp: resp, sse: sse,
		idle: c.set.cfg.Timeouts.Idle, clientWrite: c.set.cfg.Timeouts.ClientWrite,
		cancel: cancel, waiting: stream}
	if rl.events = isEventStream(resp.Header.Get("Content-Type")); rl.events {
		rl.bufp = eventBufPool.Get().(*[]byte)
	} else {
		rl.bufp = copyBufPool.Get().(*[]byte)
	}
	switch {
	case stream && !firstBy.IsZero():
		rl.arm(firstBy, true)
	case !stream && rl.idle > 0:
		rl.arm(time.Now().Add(rl.idle), false)
	}
	return rl
}

// arm starts the engine-silence timer, to fire at deadline with
// errFirstTokenTimeout (first set) or errIdleTimeout.
func (rl *relay) arm(deadline time.Time, first bool) {
	rl.timer = &relayTimer{cancel: rl.cancel, recheck: pauseRecheck, idle: rl.idle}
	rl.timer.waiting.Store(first)
	rl.timer.deadline.Store(mono(deadline))
	rl.deadline, rl.fireAt = deadline, deadline
	rl.timer.t = time.AfterFunc(time.Until(deadline), rl.timer.fire)
}

// setDeadline moves the engine-silence deadline to d: stored only when it
// is not earlier than when the timer fires (the timer re-arms itself),
// else the timer is reset.
func (rl *relay) setDeadline(d time.Time) {
	rl.deadline = d
	rl.timer.deadline.Store(mono(d))
	if d.Before(rl.fireAt) {
		rl.fireAt = d
		rl.timer.t.Reset(time.Until(d))
	}
}

// close stops the timer, returns the read buffer to its pool and adds the
// time spent waiting on the engine to the request's.
func (rl *relay) close() {
	if rl.timer != nil {
		rl.timer.stopped.Store(true)
		rl.timer.t.Stop()
	}
	if rl.started || !rl.wdl.IsZero() {
		// The connection may serve another request: no deadline of this
		// response's writes (ours, or writeStreamError's) stays on it.
		_ = rl.rc.SetWriteDeadline(time.Time{})
	}
	if rl.events {
		eventBufPool.Put(rl.bufp)
	} else {
		copyBufPool.Put(rl.bufp)
	}
	if st := stateFrom(rl.r.Context()); st != nil {
		st.waited += rl.waited
	}
}

// read returns the next bytes of the engine body (valid until the next
// read) and the time the read returned. The time blocked in it is engine
// time (relay.waited); the gaps between reads that brought bytes give the
// stream's largest gap.
func (rl *relay) read() ([]byte, time.Time, error) {
	t0 := time.Now()
	n, err := rl.resp.Body.Read(*rl.bufp)
	now := time.Now()
	rl.waited += now.Sub(t0)
	if n > 0 {
		if !rl.last.IsZero() {
			rl.maxGap = max(rl.maxGap, now.Sub(rl.last))
		}
		rl.last = now
	}
	return (*rl.bufp)[:n], now, err
}

// touch records engine progress at now (the first content of an SSE
// stream or any bytes after it; any bytes of a body that is not parsed):
// the first-token wait, if any, is over, and the idle timeout starts again.
func (rl *relay) touch(now time.Time) {
	if rl.waiting {
		rl.waiting = false
		if rl.timer != nil {
			rl.timer.waiting.Store(false)
		}
	}
	if rl.idle <= 0 {
		if rl.timer != nil {
			rl.timer.stopped.Store(true)
			rl.timer.t.Stop()
			rl.timer = nil
		}
		return
	}
	if rl.timer == nil {
		rl.arm(now.Add(rl.idle), false)
		return
	}
	rl.setDeadline(now.Add(rl.idle))
}

// start commits the engine's status and headers to the client, once.
func (rl *relay) start() {
	if rl.started {
		return
	}
	rl.started = true
	h := rl.w.Header()
	copyResponseHeaders(h, rl.resp.Header, rl.sse)
	if rl.sse {
		h.Set("X-Accel-Buffering", "no") // ask any nginx in front not to buffer
	}
	writeHeader(rl.w, rl.r, rl.resp.StatusCode)
}

// write starts the response if needed and writes p to the client, flushing
// it when flush is set. The engine-silence timer is paused meanwhile (its
// deadline moves by the time the write took): a slow client is not a
// silent engine. The client gets its own bound instead, a write deadline of
// Timeouts.ClientWrite (Caddy's idle write deadline), so a client that
// stops reading cannot hold an engine slot forever. Classify an error with
// clientWriteErrType.
func (rl *relay) write(p []byte, flush bool) error {
	rl.start()
	t0 := time.Now()
	if rl.timer != nil {
		rl.timer.deadline.Store(paused)
	}
	// The write deadline is renewed when less than three quarters of
	// Timeouts.ClientWrite is left, not before every write: a write is
	// bounded by 3/4 to all of ClientWrite, and a stream's writes cost no
	// deadline updates (each is a poller timer change) in between.
	if cw := rl.clientWrite; cw > 0 && (rl.wdl.IsZero() || rl.wdl.Sub(t0) < cw-cw/4) {
		rl.wdl = t0.Add(cw)
		_ = rl.rc.SetWriteDeadline(rl.wdl)
	}
	_, err := rl.w.Write(p)
	if err == nil && flush {
		err = rl.rc.Flush()
	}
	now := time.Now()
	if err == nil && !rl.wdl.IsZero() && !now.Before(rl.wdl) && rl.r.Context().Err() != nil {
		// The write deadline passed during this write and net/http has
		// cancelled the request, which it does when a write to the
		// connection fails: the flush failed, and a wrapper hid it.
		// ResponseController.Flush stops at the first writer with a
		// plain Flush() (otelhttp's has no FlushError), so its error is
		// lost; without this the attempt would end at the next engine
		// read as client_cancelled instead of client_stalled.
		err = os.ErrDeadlineExceeded
	}
	took := now.Sub(t0)
	rl.waited += took // the client's pace, not the gateway's
	if rl.timer != nil {
		// The pause moves the engine-silence deadline by the write's time.
		rl.deadline = rl.deadline.Add(took)
		rl.timer.deadline.Store(mono(rl.deadline))
	}
	return err
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
func (s *Server) stream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call) *APIError {
	a, actx := c.a, c.actx
	// A stream the client did not ask for (speech, images answered as
	// events) has no first-token wait: the idle timeout bounds it from
	// the start.
	rl := s.newRelay(w, r, resp, c, true, c.stream, c.firstBy)
	defer rl.close()
	sc := scannerPool.Get().(*sse.Scanner)
	sc.Reset()
	defer scannerPool.Put(sc)

	st := streamState{a: a, framing: c.op.framing, injected: c.out.injected}
	endsAtEOF := c.op.framing == frameAny
	onEvent := st.onEvent
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
			st.dropTo = 0
			out := sc.Push(p, onEvent)
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
				if st.dropFrom > 0 {
					if err := emit(out[:st.dropFrom], len(rest) == 0); err != nil {
						a.fail(clientWriteErrType(err))
						return nil
					}
				}
				out = rest
			}
			if len(out) > 0 {
				if err := emit(out, true); err != nil {
					a.fail(clientWriteErrType(err))
					return nil
				}
			}
		}
		if st.done && rerr == nil {
			// The end event is the end: do not wait on an engine that
			// keeps the connection open after it.
			rerr = io.EOF
		}
		if rerr == nil {
			continue
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
			return nil
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
			return ae
		}
		if et != ErrTypeClientCancelled {
			writeStreamError(w, rl.rc, ae, c.op.framing)
		}
		return nil
	}
}

// clientWriteErrType classifies a failed write to the client: a client
// that stopped reading for Timeouts.ClientWrite (the write deadline) is
// client_stalled; any other failure means it went away.
func clientWriteErrType(err error) string {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ErrTypeClientStalled
	}
	return ErrTypeClientCancelled
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

// maxUsageCapture caps how much of a relayed (unbuffered) non-streaming
// body is kept to read its usage; larger bodies (big embedding batches) are
// forwarded without it. It is reserved in the buffered-bytes budget too.
const maxUsageCapture = 1 << 20

// copyMode is how copyBody relays a body that is not SSE.
type copyMode uint8

const (
	// copyWhole: a non-streaming response, buffered whole up to
	// Config.MaxResponseBufferBytes before anything is sent.
	copyWhole copyMode = iota
	// copyStream: a streamed response in another framing (NDJSON, chunked
	// JSON): relayed as it arrives, flushed per write, never parsed.
	copyStream
)

// copyBody forwards a response that is not SSE.
//
// copyWhole: vLLM sends a non-streaming response in one piece, so it is
// buffered up to Config.MaxResponseBufferBytes (every byte of buffer
// capacity reserved in the buffered-bytes budget) and sent with its exact
// Content-Length once it has ended; an engine failing before its end gets
// a clean 502/504 JSON error, never a 200 that looks whole. A body above the
// cap (or one the budget cannot hold) is relayed as it arrives from then on,
// and a failure after its first bytes went out aborts the client connection
// (a cut body must not look complete; with a declared length the client sees
// it short). The body's id and usage are read from what was held, up to
// maxUsageCapture when relayed.
//
// copyStream: relayed byte for byte as it arrives, flushed per write; the
// engine may be silent until firstBy before its first bytes, then
// Timeouts.Idle between reads; the body's clean end is the stream's end.
func (s *Server) copyBody(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, mode copyMode) *APIError {
	a, actx := c.a, c.actx
	firstBy := time.Time{}
	if mode == copyStream {
		firstBy = c.firstBy
	}
	rl := s.newRelay(w, r, resp, c, false, mode == copyStream, firstBy)
	defer rl.close()
	flush := mode == copyStream || resp.ContentLength < 0
	// hold is the body kept: all of it while buffering, a prefix for the
	// usage while relaying, nothing for copyStream.
	hold := heldBuf{s: s, hint: resp.ContentLength}
	defer hold.release()
	bufLimit := c.set.cfg.MaxResponseBufferBytes
	buffering := mode == copyWhole && bufLimit > 0 && resp.ContentLength <= bufLimit
	capturing := mode == copyWhole // keeping the body (or its first bytes) to read its usage
	for {
		p, now, rerr := rl.read()
		if len(p) > 0 {
			rl.touch(now)
			if buffering && int64(len(hold.b)+len(p)) <= bufLimit && hold.add(p, bufLimit) {
				p = nil
			} else if buffering {
				// Too large (or no budget) to hold: relay from here on.
				buffering = false
				if err := rl.write(hold.b, false); err != nil {
					a.fail(clientWriteErrType(err))
					return nil
				}
			}
			if len(p) > 0 {
				if capturing && !hold.add(p, maxUsageCapture) {
					capturing = false // too large (or no budget) to read its usage
					hold.release()
				}
				if err := rl.write(p, flush); err != nil {
					a.fail(clientWriteErrType(err))
					return nil
				}
			}
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			if buffering {
				// The whole body: sent with its exact length (the engine's
				// header when it had one; it matched, or the read failed).
				if resp.ContentLength < 0 {
					rl.w.Header().Set("Content-Length", strconv.Itoa(len(hold.b)))
				}
				if err := rl.write(hold.b, false); err != nil {
					a.fail(clientWriteErrType(err))
				}
			}
			rl.start()
			if capturing {
				if b, ok := oai.ParseBody(hold.b); ok {
					a.respID, a.usage, a.hasUsage = b.ID, b.Usage, b.Usage != (oai.Usage{})
					a.answered(b.Model)
					a.finished(b.FinishReason)
				}
			}
			return nil
		}
		et, ae := s.classify(r, actx, rerr)
		a.fail(et)
		if !rl.started {
			return ae
		}
		if et == ErrTypeClientCancelled {
			return nil
		}
		// finish keeps the recorded cause for this panic.
		panic(http.ErrAbortHandler)
	}
}

// heldBuf is response bytes kept in memory under the gateway's
// buffered-bytes budget: its capacity grows by doubling, from the declared
// length (hint, when known and small enough) or 16 KiB, and every byte of
// capacity is reserved before it is allocated. b is nil until the first
// add and after release.
type heldBuf struct {
	s        *Server
	hint     int64 // the body's declared length, -1 when unknown
	b        []byte
	reserved int64
}

// add appends p when the buffer can then hold at most limit bytes and the
// budget has room for its capacity; otherwise it appends nothing and
// returns false.
func (h *heldBuf) add(p []byte, limit int64) bool {
	need := int64(len(h.b) + len(p))
	if need > limit {
		return false
	}
	if need > int64(cap(h.b)) {
		c := max(2*int64(cap(h.b)), need)
		if cap(h.b) == 0 {
			c = max(need, initialBodyBuf)
			if h.hint >= need {
				c = h.hint // one exact allocation when the length is known
			}
		}
		c = min(c, limit)
		if !h.s.buffered.take(c - h.reserved) {
			return false
		}
		h.reserved = c
		nb := make([]byte, len(h.b), c)
		copy(nb, h.b)
		h.b = nb
	}
	h.b = append(h.b, p...)
	return true
}

// release drops the buffer and gives its reservation back.
func (h *heldBuf) release() {
	h.s.buffered.give(h.reserved)
	h.reserved, h.b = 0, nil
}
