package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// copyBufSize is the read buffer for engine bodies (Caddy's reverse proxy
// uses 32 KiB too).
const copyBufSize = 32 << 10

var (
	captureBufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	copyBufPool    = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}
	scannerPool    = sync.Pool{New: func() any { return sse.NewScanner(0) }}
)

// streamState is what the stream loop learns from the events it forwards.
type streamState struct {
	a        *attempt
	now      time.Time
	done     bool // saw data: [DONE]
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
	if ch.HasUsage {
		a.usage, a.hasUsage = ch.Usage, true
		if st.injected && !ch.Content && !ch.Finish {
			st.dropFrom, st.dropTo = ev.Offset, ev.Offset+len(ev.Raw)
		}
	}
	if ch.Content {
		a.onContent(st.now)
	}
}

// relay moves one engine response body to the client: a pooled read
// buffer, the engine idle timer, the client's write deadline, and the start
// of the response, which waits for the first bytes worth forwarding so that
// an engine dying before any still gets a clean JSON error with a status.
// It lives on the handler's stack; close releases what it holds.
type relay struct {
	w       http.ResponseWriter
	r       *http.Request
	rc      *http.ResponseController
	resp    *http.Response
	sse     bool // an event stream: re-framed (no Content-Length), never buffered by a proxy in front
	started bool
	bufp    *[]byte
	idle    time.Duration
	timer   *time.Timer // cancels the attempt with errIdleTimeout; nil when idle is 0
}

func (s *Server) newRelay(w http.ResponseWriter, r *http.Request, resp *http.Response, cancel context.CancelCauseFunc, sse bool) relay {
	rl := relay{w: w, r: r, rc: http.NewResponseController(w), resp: resp, sse: sse,
		bufp: copyBufPool.Get().(*[]byte), idle: s.cfg.Timeouts.Idle}
	if rl.idle > 0 {
		rl.timer = time.AfterFunc(rl.idle, func() { cancel(errIdleTimeout) })
	}
	return rl
}

func (rl *relay) close() {
	if rl.timer != nil {
		rl.timer.Stop()
	}
	copyBufPool.Put(rl.bufp)
}

// read returns the next bytes of the engine body (valid until the next
// read); any bytes restart the idle timer.
func (rl *relay) read() ([]byte, error) {
	n, err := rl.resp.Body.Read(*rl.bufp)
	if n > 0 && rl.timer != nil {
		rl.timer.Reset(rl.idle)
	}
	return (*rl.bufp)[:n], err
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
	markHeaderWritten(rl.r)
	rl.w.WriteHeader(rl.resp.StatusCode)
}

// write starts the response if needed and writes p to the client, flushing
// it when flush is set. The engine idle timer is paused meanwhile: a slow
// client is not a silent engine. The client gets its own bound instead, a
// write deadline of one idle period (Caddy's idle write deadline), so a
// client that stops reading cannot hold an engine slot forever. Classify
// an error with clientWriteErrType.
func (rl *relay) write(p []byte, flush bool) error {
	rl.start()
	if rl.timer != nil {
		rl.timer.Stop()
		_ = rl.rc.SetWriteDeadline(time.Now().Add(rl.idle))
	}
	_, err := rl.w.Write(p)
	if err == nil && flush {
		err = rl.rc.Flush()
	}
	if rl.timer != nil {
		_ = rl.rc.SetWriteDeadline(time.Time{})
		rl.timer.Reset(rl.idle)
	}
	return err
}

// stream forwards an SSE response event by event: every read is scanned,
// the complete events in it are written and flushed at once, and a partial
// event waits for its end. When the engine fails mid-stream the client gets
// a final `data: {"error":...}` event and no [DONE], because the OpenAI
// clients take a bare EOF for success.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, resp *http.Response, a *attempt, actx context.Context, cancel context.CancelCauseFunc, injected bool) {
	rl := s.newRelay(w, r, resp, cancel, true)
	defer rl.close()
	sc := scannerPool.Get().(*sse.Scanner)
	sc.Reset()
	defer scannerPool.Put(sc)

	st := streamState{a: a, injected: injected}
	onEvent := st.onEvent
	for {
		p, rerr := rl.read()
		if len(p) > 0 {
			st.now = time.Now()
			st.dropTo = 0
			out := sc.Push(p, onEvent)
			if st.dropTo > 0 {
				// Forward around the usage chunk the client did not ask for.
				rest := out[st.dropTo:]
				if st.dropFrom > 0 {
					if err := rl.write(out[:st.dropFrom], len(rest) == 0); err != nil {
						a.fail(clientWriteErrType(err))
						return
					}
				}
				out = rest
			}
			if len(out) > 0 {
				if err := rl.write(out, true); err != nil {
					a.fail(clientWriteErrType(err))
					return
				}
			}
		}
		if st.done && rerr == nil {
			// [DONE] is the end: do not wait on an engine that keeps the
			// connection open after it.
			rerr = io.EOF
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF && st.done {
			if st.errEvent {
				a.fail(ErrTypeStreamError)
			}
			rl.start()
			return
		}
		var et string
		var ae *APIError
		if rerr == io.EOF {
			et, ae = ErrTypeEngineDisconnect, &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeEngineDisconnect, Message: "the engine closed the stream before it was complete"}
		} else {
			et, ae = s.classify(r, actx, rerr)
		}
		a.fail(et)
		switch {
		case !rl.started:
			writeError(w, r, ae)
		case et != ErrTypeClientCancelled:
			writeStreamError(w, rl.rc, ae)
		}
		return
	}
}

// clientWriteErrType classifies a failed write to the client: a client
// that stopped reading for a whole idle period (the write deadline) is
// client_stalled; any other failure means it went away.
func clientWriteErrType(err error) string {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ErrTypeClientStalled
	}
	return ErrTypeClientCancelled
}

// writeStreamError ends a broken stream with an OpenAI error event. A
// partial event the engine left unfinished is dropped (it was never
// forwarded), so the error event starts on a clean boundary.
func writeStreamError(w http.ResponseWriter, rc *http.ResponseController, ae *APIError) {
	// Bounded: a client that stopped reading must not hold the handler.
	_ = rc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	var b bytes.Buffer
	b.WriteString("data: ")
	b.Write(ae.body())
	b.WriteString("\n\n")
	if _, err := w.Write(b.Bytes()); err == nil {
		_ = rc.Flush()
	}
}

// maxUsageCapture caps how much of a non-streaming body is kept to read its
// usage; larger bodies (big embedding batches) are forwarded without it.
const maxUsageCapture = 1 << 20

// copyBody forwards a non-streaming response. The body is teed into a
// capped buffer to read id and usage when it ends. Bodies of unknown length
// are flushed after every write (shared/cases L04). Nothing is sent before
// the first body bytes (vLLM sends a non-streaming response whole, so
// nothing is delayed). A failure after they went out aborts the client
// connection: a cut body must not look complete.
func (s *Server) copyBody(w http.ResponseWriter, r *http.Request, resp *http.Response, a *attempt, actx context.Context, cancel context.CancelCauseFunc) {
	rl := s.newRelay(w, r, resp, cancel, false)
	defer rl.close()
	flush := resp.ContentLength < 0

	capBuf := captureBufPool.Get().(*bytes.Buffer)
	capBuf.Reset()
	defer func() {
		if capBuf.Cap() <= maxUsageCapture {
			captureBufPool.Put(capBuf)
		}
	}()
	capturing := true
	for {
		p, rerr := rl.read()
		if len(p) > 0 {
			if capturing {
				if capBuf.Len()+len(p) > maxUsageCapture {
					capturing = false
				} else {
					capBuf.Write(p)
				}
			}
			if err := rl.write(p, flush); err != nil {
				a.fail(clientWriteErrType(err))
				return
			}
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			rl.start()
			if capturing {
				if id, u, ok := oai.ParseResponse(capBuf.Bytes()); ok {
					a.respID, a.usage, a.hasUsage = id, u, u != (oai.Usage{})
				}
			}
			return
		}
		et, ae := s.classify(r, actx, rerr)
		a.fail(et)
		if !rl.started {
			writeError(w, r, ae)
			return
		}
		if et == ErrTypeClientCancelled {
			return
		}
		// finish keeps the recorded cause for this panic.
		panic(http.ErrAbortHandler)
	}
}
