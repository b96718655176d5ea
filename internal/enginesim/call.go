package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"
)

// errClientGone is returned by every wait and write once the client has disconnected or
// cancelled the request.
var errClientGone = errors.New("client went away")

// outcome is how a validated request ended; each request has exactly one.
type outcome int

const (
	outcomeNone outcome = iota
	outcomeCompleted
	outcomeAborted
	outcomeFaulted
)

// poweredBy is the X-Powered-By value sent under the powered-by fault.
const poweredBy = "enginesim"

// malformedEvent is the invalid SSE event emitted by the malformed fault.
const malformedEvent = "data: {\"id\":\"bad\", \"choices\": [\n\n"

// malformedBody is the invalid JSON body returned by the malformed fault on non-stream
// requests.
const malformedBody = `{"id":"bad", "choices": [`

// call is the state of one validated request on its handler goroutine: the sequence it holds
// in the scheduler and KV cache, its faults, and how it ended. It is not shared.
type call struct {
	e      *Engine
	m      *modelState // the base model: scheduler counts and metrics; nil on light routes
	model  string      // the model name echoed in responses: a served model or a LoRA adapter
	api    api         // the route's error envelope
	f      *faults
	w      http.ResponseWriter
	rc     *http.ResponseController
	ctx    context.Context
	start  time.Time
	stream bool // the response is an SSE stream (keep-alive comments allowed)
	// tracked requests are counted in Stats and the vLLM metrics; light routes (tokenize,
	// admin, LoRA, stored responses) and a background response's POST reply are not.
	tracked bool

	outcome      outcome
	finishReason string
	settled      bool

	t      *ticket  // nil until admitted, and again after release
	kvHeld int64    // KV blocks held by this sequence
	dec    *decoder // the decoding sequence in the prefill interference model; nil if none
}

// newCall starts a tracked request on t: it ends as exactly one outcome in Stats and the
// metrics.
func (e *Engine) newCall(w http.ResponseWriter, r *http.Request, f *faults, a api, t target, stream bool) *call {
	c := e.newLightCall(w, r, f, a)
	c.m, c.model, c.stream, c.tracked = t.m, t.name, stream, true
	return c
}

// newLightCall starts an untracked request: faults apply to its response, but it holds no
// running slot and is not counted.
func (e *Engine) newLightCall(w http.ResponseWriter, r *http.Request, f *faults, a api) *call {
	if f.poweredBy {
		w.Header().Set("X-Powered-By", poweredBy)
	}
	return &call{e: e, api: a, f: f.resolveAt(0, 0), w: w, rc: http.NewResponseController(w), ctx: r.Context(), start: time.Now()}
}

// end releases the sequence and accounts the outcome, unless settle already did; err is
// the error that ended the request early, if any (always the client going away). Handlers
// defer it, so it also runs when a fault aborts the connection with
// panic(http.ErrAbortHandler).
func (c *call) end(err *error) {
	if c.outcome == outcomeNone && (*err != nil || c.ctx.Err() != nil) {
		c.outcome = outcomeAborted
	}
	c.settle(c.outcome, c.finishReason)
}

// settle ends the request as o (once; later calls only release again): it frees the running
// slot and KV blocks and counts the outcome. The engine settles a request before it writes
// the response's last bytes (or closes the connection), so a client that has seen the end
// of a response also sees it in Stats and /metrics, as in vLLM, where a request finishes in
// the engine before its response is sent.
func (c *call) settle(o outcome, reason string) {
	c.release()
	if c.settled || o == outcomeNone {
		return
	}
	c.settled = true
	c.outcome, c.finishReason = o, reason
	if !c.tracked {
		return
	}
	e := c.e
	switch o {
	case outcomeCompleted:
		e.completed.Add(1)
		if reason == finishLength {
			c.m.successLen.Inc()
		} else {
			c.m.successStop.Inc()
		}
	case outcomeAborted:
		e.aborted.Add(1)
		c.m.aborted.Inc()
		slog.Debug("aborted request", "engine", e.cfg.Name, "model", c.m.name, "after", time.Since(c.start))
	case outcomeFaulted:
		e.faulted.Add(1)
		c.m.faulted.Inc()
		slog.Debug("faulted request", "engine", e.cfg.Name, "model", c.m.name, "fault", c.f.spec)
	}
}

// admit queues the sequence for a running slot and waits for it (emitting keep-alives on
// streams). Once running, it looks the prompt's words up in the prefix cache when cacheable
// and takes KV blocks for its tokens prompt tokens. It returns the number of cached prompt
// tokens.
func (c *call) admit(words []string, tokens int, cacheable bool) (cached int, err error) {
	c.t = c.e.sched.enqueue(&c.m.counts)
	select {
	case <-c.t.ready:
	default:
		if err := c.wait(-1, c.t.ready, true); err != nil {
			return 0, err
		}
	}
	if cacheable {
		cached = c.e.lookupPrefix(c.m, c.model, words, tokens)
	}
	c.setKVTokens(tokens)
	return cached, nil
}

// lookupPrefix looks words (tokens prompt tokens) up in the prefix cache under the name
// model (a LoRA adapter's blocks are its own, as in vLLM) and counts the query and hits for
// m. It returns the number of cached tokens.
func (e *Engine) lookupPrefix(m *modelState, model string, words []string, tokens int) int {
	cached := e.cache.lookupAndInsert(model, words)
	// The /metrics counters first: whoever sees the new Stats (atomics,
	// so ordered after these) then finds /metrics saying the same.
	m.pcQueries.Add(float64(tokens))
	m.pcHits.Add(float64(cached))
	e.pcQueries.Add(int64(tokens))
	e.pcHits.Add(int64(cached))
	return cached
}

// setKVTokens sets the number of tokens (prompt + generated) the sequence holds in the KV
// cache, taking or freeing whole blocks.
func (c *call) setKVTokens(tokens int) {
	bs := c.e.cfg.BlockSize
	blocks := int64((tokens + bs - 1) / bs)
	c.e.kvBlocks.Add(blocks - c.kvHeld)
	c.kvHeld = blocks
}

// release gives back the running slot (or the queue place) and the KV blocks. Idempotent.
func (c *call) release() {
	if c.t != nil {
		c.e.sched.done(c.t)
		c.t = nil
	}
	c.e.kvBlocks.Add(-c.kvHeld)
	c.kvHeld = 0
	c.e.interf.endDecode(c.dec)
	c.dec = nil
}

// wait blocks until d elapses (d < 0: never), ready is closed (nil: never) or the client
// goes away (errClientGone). With keepAlive on a stream whose faults include keepalive, it
// first writes a keep-alive comment, then one every keepalive interval if one was given.
func (c *call) wait(d time.Duration, ready <-chan struct{}, keepAlive bool) error {
	if c.ctx.Err() != nil {
		return errClientGone
	}
	keepAlive = keepAlive && c.stream && c.f.keepAlive
	if keepAlive {
		if err := c.write([]byte(": keep-alive\n\n")); err != nil {
			return err
		}
	}
	if d == 0 && ready == nil {
		return nil
	}
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	var tick <-chan time.Time
	if keepAlive && c.f.keepAliveEvery > 0 {
		t := time.NewTicker(c.f.keepAliveEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-c.ctx.Done():
			return errClientGone
		case <-timeout:
			return nil
		case <-ready:
			return nil
		case <-tick:
			if err := c.write([]byte(": keep-alive\n\n")); err != nil {
				return err
			}
		}
	}
}

// sleep waits d (d < 0: until the client goes away) without keep-alives.
func (c *call) sleep(d time.Duration) error { return c.wait(d, nil, false) }

// write sends b to the client and flushes it. Under the trickle fault it writes one byte at a
// time, flushing and pausing after each, so events arrive split across many reads.
func (c *call) write(b []byte) error {
	if c.f.trickle < 0 {
		if _, err := c.w.Write(b); err != nil {
			return errClientGone
		}
		return c.flush()
	}
	for i := range b {
		if _, err := c.w.Write(b[i : i+1]); err != nil {
			return errClientGone
		}
		if err := c.flush(); err != nil {
			return err
		}
		if err := c.sleep(c.f.trickle); err != nil {
			return err
		}
	}
	return nil
}

// flush pushes buffered bytes to the client. A writer that cannot flush is tolerated.
func (c *call) flush() error {
	if err := c.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return errClientGone
	}
	return nil
}

// event writes v as one SSE data event.
func (c *call) event(v any) error { return c.namedEvent("", v) }

// namedEvent writes v as one SSE event: "event: typ" (omitted when typ is "") and its data.
func (c *call) namedEvent(typ string, v any) error {
	b, err := eventBytes(typ, v)
	if err != nil {
		return err
	}
	return c.write(b)
}

// eventBytes encodes v as one SSE event, with an "event: typ" line unless typ is "".
func eventBytes(typ string, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 0, len(b)+len(typ)+16)
	if typ != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, typ...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	return buf, nil
}

// preHeaders applies the faults that act before any response byte: slow-headers,
// stall-before-headers, close-before-headers and status. handled reports that the response is
// finished (or the connection gone) and the handler must return.
func (c *call) preHeaders() (handled bool, err error) {
	if d := c.f.slowHeaders; d > 0 {
		if err := c.sleep(d); err != nil {
			return true, err
		}
	}
	if c.f.stallBeforeHeaders {
		d := c.f.stallBeforeFor
		if d == 0 {
			d = -1
		}
		if err := c.sleep(d); err != nil {
			return true, err
		}
	}
	if c.f.closeBeforeHeaders {
		c.closeConn()
		return true, nil
	}
	if c.f.status != 0 {
		c.settle(outcomeFaulted, "")
		writeFaultError(c.w, c.api, c.f)
		return true, nil
	}
	return false, nil
}

// closeConn closes the connection without writing a response (close-before-headers). It
// hijacks the connection when it can (HTTP/1.x) and otherwise aborts the handler.
func (c *call) closeConn() {
	c.settle(outcomeFaulted, "")
	if conn, _, err := c.rc.Hijack(); err == nil {
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler)
}

// abortConn flushes what was written and aborts the connection mid-response: net/http closes
// it without finishing the body, so the client sees an unexpected EOF.
func (c *call) abortConn() {
	_ = c.flush()
	c.settle(outcomeFaulted, "")
	panic(http.ErrAbortHandler)
}

// resetConn resets the connection mid-response (reset-after): it flushes what was written,
// hijacks the connection and closes it with SO_LINGER 0, so the kernel sends a TCP RST
// and the client's next read fails with "connection reset by peer". Where the connection
// cannot be hijacked (HTTP/2) the handler aborts, which resets the stream.
func (c *call) resetConn() {
	_ = c.flush()
	c.settle(outcomeFaulted, "")
	conn, _, err := c.rc.Hijack()
	if err == nil {
		nc := conn
		if tc, ok := nc.(interface{ NetConn() net.Conn }); ok { // TLS
			nc = tc.NetConn()
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = conn.Close()
	}
	panic(http.ErrAbortHandler) // unwind the handler; net/http ignores a hijacked connection
}

// Mid-stream errors (error-after): vLLM's GenerationError, raised when the engine finishes
// a request with finish_reason "error" (OpenAIServing._raise_if_error in
// vllm/entrypoints/openai/serving_engine.py), is answered with status 500, type
// InternalServerError and message "Internal server error"; in a stream as the data event
// {"error": {...}} followed by "data: [DONE]" (serving_chat.py and serving_completion.py
// catch it in the stream generator, yield create_streaming_error_response and then
// [DONE]).
const (
	midErrorMessage = "Internal server error"
	midErrorStatus  = http.StatusInternalServerError
)

// openAIStreamError is the error-after event of the OpenAI-style streams: vLLM's streaming
// error response, then [DONE].
func openAIStreamError() ([]byte, error) {
	b, err := eventBytes("", errorBody{Error: errorInfo{Message: midErrorMessage, Type: errorType(midErrorStatus), Code: midErrorStatus}})
	if err != nil {
		return nil, err
	}
	return append(b, doneEvent...), nil
}

// writeBody writes a non-stream JSON response body with writeBodyAs.
func (c *call) writeBody(b []byte, reason string) error {
	return c.writeBodyAs(b, "application/json", reason)
}

// closeAfterHeaders applies the close-after-headers fault to a non-stream response of
// Content-Type ct ("" for none): 200 headers, flushed, then the connection aborted.
func (c *call) closeAfterHeaders(ct string) {
	if !c.f.closeAfterHeaders {
		return
	}
	if ct != "" {
		c.w.Header().Set("Content-Type", ct)
	}
	c.w.WriteHeader(http.StatusOK)
	c.abortConn()
}

// writeBodyAs writes a non-stream 200 response body of Content-Type ct ("" for none: an
// empty body), applying the body faults: malformed (the invalid JSON body instead, whatever
// ct, Faulted), close-after (half the body, then abort), reset-after (half the body, then a
// TCP reset), stall-after (half the body, then block until the client leaves), truncate
// (the full body's Content-Length, half the body, then abort), error-after (vLLM's 500
// error instead of the body), drain-after (the engine drains; a body whose reason is not
// "abort" is cut like close-after, one whose reason is "abort" is sent, Faulted) and trickle
// (no Content-Length, one byte at a time). Otherwise the request is settled as completed
// with reason just before the write.
func (c *call) writeBodyAs(b []byte, ct, reason string) error {
	if c.f.errorAfter >= 0 {
		// vLLM answers a non-stream request whose generation failed with the 500 error.
		c.settle(outcomeFaulted, "")
		c.api.writeError(c.w, midErrorStatus, midErrorMessage)
		return nil
	}
	if c.f.drainAfter >= 0 {
		c.e.SetDraining(true)
	}
	h := c.w.Header()
	if ct != "" {
		h.Set("Content-Type", ct)
	}
	// drain-after cuts the routes that have no abort finish_reason like close-after.
	cutByDrain := c.f.drainAfter >= 0 && reason != finishAbort
	if c.f.closeAfter >= 0 || c.f.stallAfter >= 0 || c.f.resetAfter >= 0 || cutByDrain {
		c.w.WriteHeader(http.StatusOK)
		if err := c.write(b[:len(b)/2]); err != nil {
			return err
		}
		if c.f.closeAfter >= 0 || cutByDrain {
			c.abortConn()
		}
		if c.f.resetAfter >= 0 {
			c.resetConn()
		}
		c.e.interf.endDecode(c.dec) // decodes no more (see serveStream's stall)
		c.dec = nil
		return c.sleep(-1)
	}
	if c.f.malformed {
		b = []byte(malformedBody)
	}
	if c.f.truncate {
		// Declare the whole body, even under trickle, so the client sees a short body.
		h.Set("Content-Length", strconv.Itoa(len(b)))
		c.w.WriteHeader(http.StatusOK)
		if err := c.write(b[:len(b)/2]); err != nil {
			return err
		}
		c.abortConn()
	}
	if c.f.malformed || reason == finishAbort {
		c.settle(outcomeFaulted, "")
	} else {
		c.settle(outcomeCompleted, reason)
	}
	if c.f.trickle < 0 {
		h.Set("Content-Length", strconv.Itoa(len(b)))
	}
	c.w.WriteHeader(http.StatusOK)
	return c.write(b)
}

// light answers an untracked request (no running slot, no accounting) with the body that
// act builds, applying the faults: those before the headers first, then close-after-headers,
// and only then act (so a status fault or an early close leaves the engine unchanged), then
// the body faults. ct "" sends a body without Content-Type.
func (c *call) light(ct string, act func() ([]byte, error)) error {
	if handled, err := c.preHeaders(); handled || err != nil {
		return err
	}
	c.closeAfterHeaders(ct)
	b, err := act()
	if err != nil {
		return err
	}
	return c.writeBodyAs(b, ct, finishStop)
}

// readBody reads the whole request body, capped at maxBodyBytes. On failure it returns the
// status to answer with.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge, err
		}
		return nil, http.StatusBadRequest, err
	}
	return b, 0, nil
}
