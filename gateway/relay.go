package gateway

import (
	"context"
	"errors"
	"math"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

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
		// plain Flush() (otelhttp's wrapper has none), so its error is
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

// clientWriteErrType classifies a failed write to the client: a client
// that stopped reading for Timeouts.ClientWrite (the write deadline) is
// client_stalled; any other failure means it went away.
func clientWriteErrType(err error) string {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return ErrTypeClientStalled
	}
	return ErrTypeClientCancelled
}
