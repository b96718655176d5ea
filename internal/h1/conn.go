package h1

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// conn is one connection to an engine. Between checkout and release it
// belongs to one request, and only that request's goroutine touches it,
// except for two things that may come from anywhere: the context's
// AfterFunc (cancel) and a response body's Close, which only close nc.
type conn struct {
	h  *host
	nc net.Conn
	br *bufio.Reader
	// cancel is the AfterFunc run when a request's context ends while
	// it holds the connection: it marks the connection cancelled and
	// closes it, which unblocks any read or write on it. Made once per
	// connection.
	cancel   func()
	canceled atomic.Bool
	reused   bool      // it served a response before (net/http: persistConn.isReused)
	idleAt   time.Time // when it went idle
	nwritten int64     // bytes written to nc
	hp       headParser
	bw       bodyWriter
	bufs     [2][]byte   // writev backing for bw
	nb       net.Buffers // over bufs, here so that WriteTo allocates nothing
}

func newConn(h *host, nc net.Conn) *conn {
	c := &conn{h: h, nc: nc, br: bufio.NewReaderSize(nc, h.t.cfg.readBufSize)}
	c.cancel = func() {
		c.canceled.Store(true)
		_ = c.nc.Close()
	}
	c.bw.c = c
	return c
}

// roundTrip runs one attempt on c: it writes the request, reads the
// response head and returns the response, whose body then owns c. On
// failure c is closed and released, and the failure says whether the
// request may be replayed.
//
// The context's AfterFunc is registered for the whole exchange, from the
// first byte written to the end of the body: whatever phase the request is
// in when the context ends, the blocked read or write returns and the
// engine sees the connection close (so vLLM aborts the request).
func (t *Transport) roundTrip(ctx context.Context, c *conn, req *http.Request, p *plan, body io.ReadCloser) (*http.Response, *failure) {
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, c.cancel)
	}
	start := c.nwritten
	err := t.writeRequest(c, req, p, body)
	if err != nil {
		c.release(stop, false)
		if c.canceled.Load() {
			return nil, &failure{err: context.Cause(ctx)}
		}
		if re, ok := err.(requestError); ok {
			// The request body's failure, not the connection's.
			return nil, &failure{err: re.error}
		}
		return nil, &failure{err: fmt.Errorf("h1: writing the request: %w", err), wrote: c.nwritten > start, replayable: true}
	}
	// Wait for the first byte of the response: a failure before it is
	// the keep-alive race when the connection was reused (net/http:
	// transportReadFromServerError, errServerClosedIdle).
	if _, err := c.br.Peek(1); err != nil {
		c.release(stop, false)
		if c.canceled.Load() {
			return nil, &failure{err: context.Cause(ctx)}
		}
		return nil, &failure{err: fmt.Errorf("h1: reading the response: %w", err), wrote: true, replayable: true}
	}
	resp, b, err := c.readResponse(req, p)
	if err != nil {
		c.release(stop, false)
		if c.canceled.Load() {
			return nil, &failure{err: context.Cause(ctx)}
		}
		return nil, &failure{err: err, wrote: true}
	}
	if b == nil {
		c.release(stop, !resp.Close && !p.close)
		resp.Body = http.NoBody
		return resp, nil
	}
	b.ctx, b.stop = ctx, stop
	resp.Body = b
	return resp, nil
}

// release ends c's exchange: stop is the context AfterFunc's stop (nil
// when the context cannot end). The connection goes back to its pool when
// reuse is set, the AfterFunc did not fire, and no unread byte follows the
// response (an engine must not send what was not asked for); otherwise it
// is closed and its slot released.
func (c *conn) release(stop func() bool, reuse bool) {
	if stop != nil && !stop() {
		reuse = false // the context ended: the AfterFunc closes c
	}
	if reuse && c.br.Buffered() == 0 {
		c.reused = true
		c.h.put(c)
		return
	}
	_ = c.nc.Close()
	c.h.releaseSlot()
}

// write writes p to the connection, counting what was written.
func (c *conn) write(p []byte) error {
	n, err := c.nc.Write(p)
	c.nwritten += int64(n)
	return err
}
