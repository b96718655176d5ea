package h1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
)

// Errors returned by RoundTrip and by response bodies. Each is wrapped with
// details; test with errors.Is.
var (
	// ErrNoFallback: the request needs the fallback RoundTripper (https,
	// CONNECT, Upgrade, Expect: 100-continue, trailers, ...) and the
	// Transport was built without one.
	ErrNoFallback = errors.New("h1: request not handled and no fallback transport")
	// ErrMalformedResponse: the engine's response is not valid HTTP/1.x
	// (status line, header line, framing or chunked encoding). The
	// connection is closed.
	ErrMalformedResponse = errors.New("h1: malformed HTTP response")
	// ErrResponseHeaderTooLarge: the response head (or a chunked body's
	// trailers) exceeded WithMaxResponseHeaderBytes. The connection is
	// closed.
	ErrResponseHeaderTooLarge = errors.New("h1: server response headers exceeded the limit")
)

// errReadOnClosedResBody is net/http's error for a read after Close
// (transport.go, errReadOnClosedResBody); the same text for the same case.
var errReadOnClosedResBody = errors.New("http: read on closed response body")

// Transport is an http.RoundTripper for HTTP/1.1 over plain TCP with
// keep-alive pools per host:port; see the package documentation. Requests
// it does not handle go to the fallback given to New. Safe for concurrent
// use; the zero value is not usable, call New.
type Transport struct {
	cfg      config
	fallback http.RoundTripper
	wbufs    sync.Pool // *[]byte of cap cfg.writeBufSize

	mu sync.RWMutex
	// hosts: the pools by canonical dial address ("host:port");
	// byURL: the same pools by URL.Host as requests spell it (with and
	// without the default port), so a lookup allocates nothing.
	hosts map[string]*host
	byURL map[string]*host
}

// New returns a Transport. fallback receives the requests this Transport
// does not handle: a scheme other than "http" (https: TLS engines, hosted
// providers), CONNECT, a request with an Upgrade header, Expect:
// 100-continue, request trailers or a Transfer-Encoding other than
// chunked, a non-ASCII host, a body of unknown length on a method that
// usually has none (GET, HEAD, DELETE, OPTIONS, PROPFIND, SEARCH: net/http
// probes those), or the deprecated Request.Cancel on a context without a
// deadline (http.Client's Timeout sets Cancel and a context deadline that
// covers it: those are handled here, the channel not watched). Give it an
// *http.Transport; a nil fallback makes those requests fail with an error
// wrapping ErrNoFallback.
func New(fallback http.RoundTripper, opts ...Option) *Transport {
	t := &Transport{
		cfg:      newConfig(opts),
		fallback: fallback,
		hosts:    make(map[string]*host),
		byURL:    make(map[string]*host),
	}
	size := t.cfg.writeBufSize
	t.wbufs.New = func() any {
		b := make([]byte, 0, size)
		return &b
	}
	return t
}

// ConnCount is one host's connections, as ConnCounts reports them.
type ConnCount struct {
	// Active counts the connections in use by a request (from the
	// checkout to the end of the response body) or being dialed.
	Active int
	// Idle counts the connections kept for reuse.
	Idle int
	// Waiting counts the requests waiting for a connection (only with
	// WithMaxConnsPerHost).
	Waiting int
}

// ConnCounts returns every host's connection counts, keyed by the
// "host:port" the Transport dials. A host appears from its first request
// until CloseIdleConnections finds it with no connections and no waiters.
// The map is the caller's.
func (t *Transport) ConnCounts() map[string]ConnCount {
	t.mu.RLock()
	hs := make([]*host, 0, len(t.hosts))
	for _, h := range t.hosts {
		hs = append(hs, h)
	}
	t.mu.RUnlock()
	m := make(map[string]ConnCount, len(hs))
	for _, h := range hs {
		h.mu.Lock()
		m[h.addr] = ConnCount{Active: h.open - len(h.idle), Idle: len(h.idle), Waiting: len(h.waiters)}
		h.mu.Unlock()
	}
	return m
}

// CloseIdleConnections closes every idle connection and forgets the hosts
// left with no connections and no waiters; connections in use are not
// touched. It calls the fallback's CloseIdleConnections too, when it has
// one (http.Client.CloseIdleConnections calls this).
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	var idle []*conn
	for addr, h := range t.hosts {
		h.mu.Lock()
		idle = append(idle, h.idle...)
		clear(h.idle)
		h.open -= len(h.idle)
		h.idle = h.idle[:0]
		h.stopTimer()
		if h.open == 0 && len(h.waiters) == 0 {
			h.gone = true
			delete(t.hosts, addr)
		}
		h.mu.Unlock()
	}
	for k, h := range t.byURL {
		if h.gone {
			delete(t.byURL, k)
		}
	}
	t.mu.Unlock()
	closeConns(idle)
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper: it sends req on a pooled or new
// connection and returns the response once its head has arrived; the body
// is read from the connection as the caller reads it. See the package
// documentation for cancellation, replays and errors. req.Body is always
// closed.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL == nil {
		closeBody(req.Body)
		return nil, errors.New("http: nil Request.URL")
	}
	if req.Header == nil {
		closeBody(req.Body)
		return nil, errors.New("http: nil Request.Header")
	}
	if !handles(req) {
		if t.fallback == nil {
			closeBody(req.Body)
			return nil, fmt.Errorf("%w: %s %s://%s", ErrNoFallback, req.Method, req.URL.Scheme, req.URL.Host)
		}
		return t.fallback.RoundTrip(req)
	}
	var p plan
	if err := p.prepare(req); err != nil {
		closeBody(req.Body)
		return nil, err
	}
	ctx := req.Context()
	body := req.Body
	if body == http.NoBody {
		body = nil
	}
	fresh := false // a replay goes to a new connection
	for {
		if ctx.Err() != nil {
			closeBody(body)
			return nil, context.Cause(ctx)
		}
		c, err := t.conn(ctx, req.URL, fresh)
		if err != nil {
			closeBody(body)
			return nil, err
		}
		resp, f := t.roundTrip(ctx, c, req, &p, body)
		if f == nil {
			return resp, nil
		}
		if !f.replay(c, req, &p) {
			return nil, f.err
		}
		// The keep-alive race: send the request again on a new
		// connection (net/http: Transport.roundTrip, rewindBody).
		if body != nil {
			if body, err = req.GetBody(); err != nil {
				return nil, err
			}
			if body == http.NoBody {
				body = nil
			}
		}
		fresh = true
	}
}

// handles reports whether req is for this Transport rather than the
// fallback.
func handles(req *http.Request) bool {
	u := req.URL
	if u.Scheme != "http" || req.Method == http.MethodConnect || len(req.Trailer) > 0 {
		return false
	}
	if req.Cancel != nil {
		// http.Client's Timeout sets the deprecated Cancel channel for
		// a RoundTripper it does not know, and puts its deadline (or an
		// earlier one) on the context, which is watched: the channel
		// closes no sooner. A Cancel without a deadline is someone
		// else's: net/http watches it.
		if _, ok := req.Context().Deadline(); !ok {
			return false
		}
	}
	if te := req.TransferEncoding; len(te) > 0 && (len(te) != 1 || te[0] != "chunked") {
		return false
	}
	h := req.Header
	if len(h["Upgrade"]) > 0 {
		return false
	}
	for _, v := range h["Expect"] {
		if strings.EqualFold(strings.TrimSpace(v), "100-continue") {
			return false
		}
	}
	if req.Body != nil && req.Body != http.NoBody && req.ContentLength == 0 && len(req.TransferEncoding) == 0 {
		switch req.Method {
		case "", "GET", "HEAD", "DELETE", "OPTIONS", "PROPFIND", "SEARCH":
			// net/http probes such a body for a first byte
			// (transferWriter.probeRequestBody): leave that to it.
			return false
		}
	}
	if !isASCII(u.Host) || (req.Host != "" && !isASCII(req.Host)) {
		return false
	}
	return true
}

// conn returns a connection to u's host: an idle one, unless fresh, or a
// new one.
func (t *Transport) conn(ctx context.Context, u *url.URL, fresh bool) (*conn, error) {
	for {
		h, err := t.host(u)
		if err != nil {
			return nil, err
		}
		c, err := h.get(ctx, fresh)
		if err != errHostGone {
			return c, err
		}
	}
}

// host returns the pool for u's host:port, making it on first use.
func (t *Transport) host(u *url.URL) (*host, error) {
	t.mu.RLock()
	h := t.byURL[u.Host]
	t.mu.RUnlock()
	if h != nil {
		return h, nil
	}
	if u.Host == "" {
		return nil, errors.New("http: no Host in request URL")
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	t.mu.Lock()
	defer t.mu.Unlock()
	h = t.hosts[addr]
	if h == nil {
		h = &host{t: t, addr: addr}
		t.hosts[addr] = h
	}
	t.byURL[u.Host] = h
	return h, nil
}

// failure is a failed attempt on one connection, with what is known of how
// far it got: what decides a replay.
type failure struct {
	err error
	// wrote: some bytes of the request reached the connection.
	wrote bool
	// replayable: the attempt failed before any byte of the response
	// arrived, and not because of the context or of the request body.
	replayable bool
}

// replay reports whether the failed request is sent again on a new
// connection: the connection had served a response before (the
// keep-alive race), nothing of the response arrived, and net/http would
// replay it (transport.go, persistConn.shouldRetryRequest): nothing of it
// was written and its body can be had again, or the request is replayable
// (Request.isReplayable: GET, HEAD, OPTIONS, TRACE, or an Idempotency-Key
// or X-Idempotency-Key header, even with no values; and no body, or
// GetBody).
func (f *failure) replay(c *conn, req *http.Request, p *plan) bool {
	if !f.replayable || !c.reused {
		return false
	}
	rewindable := p.bodyLen == 0 || req.GetBody != nil
	if !f.wrote && rewindable {
		return true
	}
	if !rewindable {
		return false
	}
	switch req.Method {
	case "", "GET", "HEAD", "OPTIONS", "TRACE":
		return true
	}
	_, k1 := req.Header["Idempotency-Key"]
	_, k2 := req.Header["X-Idempotency-Key"]
	return k1 || k2
}

func closeBody(b io.ReadCloser) {
	if b != nil {
		_ = b.Close()
	}
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
