package h1

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// errHostGone: the pool was dropped by CloseIdleConnections between the
// lookup and the checkout; look it up again.
var errHostGone = errors.New("h1: host pool closed")

// host is the connection pool of one host:port.
//
// Every connection counts in open from its checkout for a dial to its
// close: being dialed, in use, or idle. A connection leaves the pool's
// hands only by closing (releaseSlot) or by going back to idle or to a
// waiter (put). With a bound (WithMaxConnsPerHost), a request that finds
// open at the bound and nothing idle queues a waiter; a released slot or
// connection is handed to the first waiter directly, so the count never
// exceeds the bound and nothing is lost between the hand-off and the
// waiter's wake-up.
type host struct {
	t    *Transport
	addr string // "host:port", dialed

	mu      sync.Mutex
	idle    []*conn // oldest first; reuse takes the newest (LIFO)
	open    int
	waiters []*waiter // FIFO
	timer   *time.Timer
	armed   bool // timer is set to sweep idle connections
	gone    bool // dropped from the Transport's maps
}

// waiter is a request waiting for a connection. ch receives, once, either
// a connection (idle, to reuse) or nil: a slot to dial with.
type waiter struct {
	ch chan *conn
}

// get returns a connection for one attempt: the newest idle one unless
// fresh is set, else a new one when a slot is free, else the first one
// released, waiting until ctx ends (then it returns context.Cause(ctx)).
func (h *host) get(ctx context.Context, fresh bool) (*conn, error) {
	t := h.t
	h.mu.Lock()
	if h.gone {
		h.mu.Unlock()
		return nil, errHostGone
	}
	var expired []*conn
	for !fresh && len(h.idle) > 0 {
		n := len(h.idle) - 1
		c := h.idle[n]
		h.idle[n] = nil
		h.idle = h.idle[:n]
		idle := time.Since(c.idleAt)
		if idle >= t.cfg.idleTimeout {
			// c timed out, and every older one too (the idle timer
			// has not run yet).
			expired = append(h.idle[:n:n], c)
			h.idle = nil
			h.open -= len(expired)
			break
		}
		h.mu.Unlock()
		if idle < t.cfg.probeIdle || !peerGone(c.nc) {
			return c, nil
		}
		// The engine closed it while it was idle (or sent what was
		// not asked for): drop it, try the next.
		_ = c.nc.Close()
		h.mu.Lock()
		h.dropLocked()
		if h.gone {
			h.mu.Unlock()
			return nil, errHostGone
		}
	}
	max := t.cfg.maxConns
	if max <= 0 || h.open < max {
		h.open++
		h.mu.Unlock()
		closeConns(expired)
		return h.dial(ctx)
	}
	if fresh && len(h.idle) > 0 {
		// At the bound with idle connections, for a replay: the
		// oldest idle one gives its slot to a new one.
		old := h.idle[0]
		h.idle = slices.Delete(h.idle, 0, 1)
		h.mu.Unlock()
		_ = old.nc.Close()
		return h.dial(ctx)
	}
	w := &waiter{ch: make(chan *conn, 1)}
	h.waiters = append(h.waiters, w)
	h.mu.Unlock()
	closeConns(expired)
	select {
	case c := <-w.ch:
		return h.take(ctx, c, fresh)
	case <-ctx.Done():
	}
	h.mu.Lock()
	i := slices.Index(h.waiters, w)
	if i >= 0 {
		h.waiters = slices.Delete(h.waiters, i, i+1)
	}
	h.mu.Unlock()
	if i < 0 {
		// Something was handed over as the context ended: pass it on.
		if c := <-w.ch; c != nil {
			h.put(c)
		} else {
			h.releaseSlot()
		}
	}
	return nil, context.Cause(ctx)
}

// take turns what a waiter received into a connection: a handed-over idle
// connection (or, for a replay, a new one in its place), or a dial with
// the handed-over slot.
func (h *host) take(ctx context.Context, c *conn, fresh bool) (*conn, error) {
	if c != nil && !fresh {
		return c, nil
	}
	if c != nil {
		_ = c.nc.Close()
	}
	return h.dial(ctx)
}

// dial opens a connection in a slot already counted in open; on failure
// the slot is released and the error is the context's cause when the
// context ended, else the dialer's error unchanged (net/http:
// Transport.getConn, Transport.dialConn).
func (h *host) dial(ctx context.Context) (*conn, error) {
	nc, err := h.t.cfg.dial(ctx, "tcp", h.addr)
	if err != nil {
		h.releaseSlot()
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	return newConn(h, nc), nil
}

// releaseSlot gives up the slot of a connection that was closed (or never
// opened): to the first waiter, or back.
func (h *host) releaseSlot() {
	h.mu.Lock()
	h.dropLocked()
	h.mu.Unlock()
}

// dropLocked is releaseSlot with h.mu held (the waiter's channel has room:
// the send does not block).
func (h *host) dropLocked() {
	if len(h.waiters) > 0 {
		w := h.waiters[0]
		h.waiters = slices.Delete(h.waiters, 0, 1)
		w.ch <- nil
		return
	}
	h.open--
}

// put returns a connection that finished a response cleanly: to the first
// waiter, or to the idle list when it has room, else it is closed.
func (h *host) put(c *conn) {
	h.mu.Lock()
	if len(h.waiters) > 0 {
		w := h.waiters[0]
		h.waiters = slices.Delete(h.waiters, 0, 1)
		h.mu.Unlock()
		w.ch <- c
		return
	}
	if len(h.idle) >= h.t.cfg.maxIdle {
		h.open--
		h.mu.Unlock()
		_ = c.nc.Close()
		return
	}
	c.idleAt = time.Now()
	h.idle = append(h.idle, c)
	if !h.armed {
		h.armed = true
		if h.timer == nil {
			h.timer = time.AfterFunc(h.t.cfg.idleTimeout, h.sweep)
		} else {
			h.timer.Reset(h.t.cfg.idleTimeout)
		}
	}
	h.mu.Unlock()
}

// sweep closes the idle connections that have been idle for the idle
// timeout and sets the timer for the next one to.
func (h *host) sweep() {
	d := h.t.cfg.idleTimeout
	h.mu.Lock()
	if !h.armed {
		h.mu.Unlock()
		return
	}
	now := time.Now()
	n := 0
	for n < len(h.idle) && now.Sub(h.idle[n].idleAt) >= d {
		n++
	}
	var expired []*conn
	if n > 0 {
		expired = slices.Clone(h.idle[:n])
		h.idle = slices.Delete(h.idle, 0, n)
		h.open -= n
	}
	if len(h.idle) > 0 {
		h.timer.Reset(h.idle[0].idleAt.Add(d).Sub(now))
	} else {
		h.armed = false
	}
	h.mu.Unlock()
	closeConns(expired)
}

// stopTimer stops the idle timer; h.mu is held.
func (h *host) stopTimer() {
	if h.timer != nil {
		h.timer.Stop()
	}
	h.armed = false
}

func closeConns(cs []*conn) {
	for _, c := range cs {
		_ = c.nc.Close()
	}
}
