package h1

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// staleEngine serves each connection's requests in order and records them
// (the connection number and the body). A request is answered unless fail
// says otherwise for its connection number n and its index i on that
// connection (from 1): "close" closes the connection after reading it,
// "partial" sends part of a head and then closes.
type staleEngine struct {
	*rawServer
	mu     sync.Mutex
	conns  []int
	bodies []string
}

func newStaleEngine(t *testing.T, fail func(n, i int) string) *staleEngine {
	e := &staleEngine{}
	e.rawServer = newRawServer(t, func(n int, c net.Conn, br *bufio.Reader) {
		for i := 1; ; i++ {
			_, body, err := readRequest(br)
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, n)
			e.bodies = append(e.bodies, string(body))
			e.mu.Unlock()
			switch fail(n, i) {
			case "close":
				return
			case "partial":
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	return e
}

func (e *staleEngine) seen() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return fmt.Sprint(e.conns)
}

// closeSecond fails the second request on the first connection: the
// keep-alive race as the engine sees it (it read the request on a
// connection it was closing).
func closeSecond(n, i int) string {
	if n == 1 && i == 2 {
		return "close"
	}
	return ""
}

func post(t *testing.T, url string, key bool) (*http.Request, *atomic.Int32) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/embeddings", strings.NewReader(`{"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	gb := req.GetBody
	req.GetBody = func() (io.ReadCloser, error) {
		calls.Add(1)
		return gb()
	}
	if key {
		req.Header["Idempotency-Key"] = nil // the gateway's replayOnStaleConn
	}
	return req, &calls
}

// TestStaleReplayed: a request that a reused connection fails before any
// response byte is sent again on a new connection when net/http would
// replay it: a GET, or a POST with an Idempotency-Key (with no values) and
// GetBody, which is called once; also at a connection bound of one.
func TestStaleReplayed(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  func(t *testing.T, url string) (*http.Request, *atomic.Int32)
		opts []Option
	}{
		{"GET", func(t *testing.T, url string) (*http.Request, *atomic.Int32) {
			req, _ := http.NewRequest("GET", url+"/v1/models", nil)
			return req, nil
		}, nil},
		{"POST with a nil Idempotency-Key", func(t *testing.T, url string) (*http.Request, *atomic.Int32) {
			return post(t, url, true)
		}, nil},
		{"POST, one connection at most", func(t *testing.T, url string) (*http.Request, *atomic.Int32) {
			return post(t, url, true)
		}, []Option{WithMaxConnsPerHost(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStaleEngine(t, closeSecond)
			tr := newTransport(t, tc.opts...)
			for i := range 2 {
				req, calls := tc.req(t, e.url())
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
				if got := readAll(t, resp); got != "ok" {
					t.Fatalf("request %d: body %q", i+1, got)
				}
				if calls != nil && calls.Load() != int32(i) {
					t.Errorf("request %d: GetBody called %d times, want %d", i+1, calls.Load(), i)
				}
				if resp.Request != req {
					t.Errorf("request %d: Response.Request is not the caller's request", i+1)
				}
			}
			if got := e.seen(); got != "[1 1 2]" {
				t.Errorf("the engine read requests on connections %s, want [1 1 2]", got)
			}
			e.mu.Lock()
			if b := e.bodies; b[1] != b[2] {
				t.Errorf("the replayed body %q differs from %q", b[2], b[1])
			}
			e.mu.Unlock()
			if c := counts(tr, e.rawServer); c != (ConnCount{Idle: 1}) {
				t.Errorf("counts %+v, want one idle connection", c)
			}
		})
	}
}

// TestStaleNotReplayed: no replay for a POST without an idempotency key,
// after a response byte arrived, on a fresh connection, or when GetBody
// fails (its error is returned).
func TestStaleNotReplayed(t *testing.T) {
	errGetBody := errors.New("test: no more re-sends")
	for _, tc := range []struct {
		name       string
		fail       func(n, i int) string
		key        bool
		getBodyErr bool
		want       string // connections the engine read requests on
		isErr      error
	}{
		{"POST without a key", closeSecond, false, false, "[1 1]", io.EOF},
		{"partial response", func(n, i int) string {
			if i == 2 {
				return "partial"
			}
			return ""
		}, true, false, "[1 1]", io.ErrUnexpectedEOF},
		{"fresh connection", func(n, i int) string {
			if n == 1 {
				return "close"
			}
			return ""
		}, true, false, "[1]", io.EOF},
		{"GetBody fails", closeSecond, true, true, "[1 1]", errGetBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newStaleEngine(t, tc.fail)
			tr := newTransport(t)
			if tc.want != "[1]" {
				req, _ := post(t, e.url(), tc.key)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				readAll(t, resp)
			}
			req, calls := post(t, e.url(), tc.key)
			if tc.getBodyErr {
				req.GetBody = func() (io.ReadCloser, error) {
					calls.Add(1)
					return nil, errGetBody
				}
			}
			_, err := tr.RoundTrip(req)
			if !errors.Is(err, tc.isErr) {
				t.Errorf("err %v, want %v", err, tc.isErr)
			}
			if got := e.seen(); got != tc.want {
				t.Errorf("the engine read requests on connections %s, want %s", got, tc.want)
			}
			if want := int32(0); tc.getBodyErr {
				if calls.Load() != 1 {
					t.Errorf("GetBody called %d times, want once", calls.Load())
				}
			} else if calls.Load() != want {
				t.Errorf("GetBody called %d times, want none", calls.Load())
			}
			if c := counts(tr, e.rawServer); c.Active != 0 {
				t.Errorf("counts %+v, want nothing active", c)
			}
		})
	}
}

// TestReplayedOnce: an engine that reads every request and closes the
// connection unanswered gets a request at most twice (on a kept-alive
// connection and once more on a new one), however many idle connections
// the pool holds (gateway: TestReplayCappedAtOne).
func TestReplayedOnce(t *testing.T) {
	const idle = 4
	var closeAll atomic.Bool
	hold := make(chan struct{})
	var arrived atomic.Int32
	e := newStaleEngine(t, func(n, i int) string {
		if closeAll.Load() {
			return "close"
		}
		arrived.Add(1)
		<-hold
		return ""
	})
	tr := newTransport(t)
	var wg sync.WaitGroup
	for range idle {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := post(t, e.url(), true)
			if resp, err := tr.RoundTrip(req); err == nil {
				readAll(t, resp)
			}
		}()
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return arrived.Load() == idle }, "the warm-up requests")
	close(hold)
	wg.Wait()
	if c := counts(tr, e.rawServer); c.Idle != idle {
		t.Fatalf("counts %+v, want %d idle", c, idle)
	}
	closeAll.Store(true)
	req, _ := post(t, e.url(), true)
	if _, err := tr.RoundTrip(req); !errors.Is(err, io.EOF) {
		t.Errorf("err %v, want EOF", err)
	}
	e.mu.Lock()
	got := len(e.conns) - idle
	e.mu.Unlock()
	if got != 2 {
		t.Errorf("the engine read the failing request %d times, want 2", got)
	}
}

// TestIdleClosedByEngine: the engine closes a kept-alive connection while
// it is idle (uvicorn's keep-alive timeout); the next request finds it
// closed and is sent again on a new connection.
func TestIdleClosedByEngine(t *testing.T) {
	idleClosed := make(chan struct{})
	srv := newRawServer(t, func(n int, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			if n == 1 {
				c.Close()
				close(idleClosed)
				return
			}
		}
	})
	tr := newTransport(t)
	for i := range 3 {
		req, _ := post(t, srv.url(), true)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		readAll(t, resp)
		if i == 0 {
			<-idleClosed
		}
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// TestReplayRules is net/http's decision (persistConn.shouldRetryRequest)
// as a table: only reused connections, nothing of the response read; a
// request nothing of which was written is replayed when its body can be
// had again, a written one when it is also idempotent.
func TestReplayRules(t *testing.T) {
	body := func() io.ReadCloser { return io.NopCloser(strings.NewReader("x")) }
	getBody := func() (io.ReadCloser, error) { return body(), nil }
	for _, tc := range []struct {
		name                      string
		method                    string
		withBody, getBody, key    bool
		reused, wrote, replayable bool
		want                      bool
	}{
		{"fresh connection", "GET", false, false, false, false, true, true, false},
		{"response byte read", "GET", false, false, false, true, true, false, false},
		{"GET", "GET", false, false, false, true, true, true, true},
		{"HEAD", "HEAD", false, false, false, true, true, true, true},
		{"POST no body written", "POST", false, false, false, true, true, true, false},
		{"POST no body nothing written", "POST", false, false, false, true, false, true, true},
		{"POST body without GetBody, nothing written", "POST", true, false, false, true, false, true, false},
		{"POST GetBody nothing written", "POST", true, true, false, true, false, true, true},
		{"POST GetBody written", "POST", true, true, false, true, true, true, false},
		{"POST GetBody key written", "POST", true, true, true, true, true, true, true},
		{"POST key without GetBody", "POST", true, false, true, true, true, true, false},
		{"GET with body without GetBody", "GET", true, false, false, true, true, true, false},
	} {
		req, _ := http.NewRequest(tc.method, "http://e/x", nil)
		var p plan
		if tc.withBody {
			req.Body, req.ContentLength = body(), 1
		}
		if tc.getBody {
			req.GetBody = getBody
		}
		if tc.key {
			req.Header["X-Idempotency-Key"] = nil
		}
		if err := p.prepare(req); err != nil {
			t.Fatal(err)
		}
		f := &failure{wrote: tc.wrote, replayable: tc.replayable}
		if got := f.replay(&conn{reused: tc.reused}, req, &p); got != tc.want {
			t.Errorf("%s: replay %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestIdleCloseDetected: a connection the engine closed while it was idle
// (or wrote to unasked, like a 408 before closing) is found at checkout and
// dropped: the request goes to a new connection without a replay.
func TestIdleCloseDetected(t *testing.T) {
	for _, parting := range []string{"", "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n"} {
		part, idleClosed := make(chan struct{}), make(chan struct{})
		srv := newRawServer(t, func(n int, c net.Conn, br *bufio.Reader) {
			for {
				if _, _, err := readRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				if n == 1 {
					<-part // the connection is idle in the pool
					io.WriteString(c, parting)
					c.Close()
					close(idleClosed)
					return
				}
			}
		})
		var once sync.Once
		release := func() { once.Do(func() { close(part) }) }
		t.Cleanup(release) // before the server's cleanup waits for it
		tr := newTransport(t, withProbeIdle(0))
		for i := range 2 {
			req, calls := post(t, srv.url(), true)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("request %d: %v", i+1, err)
			}
			if got := readAll(t, resp); got != "ok" || resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %q", i+1, resp.StatusCode, got)
			}
			if calls.Load() != 0 {
				t.Errorf("request %d: GetBody called %d times: replayed, not detected", i+1, calls.Load())
			}
			if i == 0 {
				if c := counts(tr, srv); c != (ConnCount{Idle: 1}) {
					t.Fatalf("counts %+v, want one idle", c)
				}
				release()
				<-idleClosed
				// The close (and the bytes) reach the idle socket
				// at once on loopback; make sure before checkout.
				h := tr.hosts[srv.ln.Addr().String()]
				h.mu.Lock()
				nc := h.idle[0].nc
				h.mu.Unlock()
				testutil.Eventually(t, 5*time.Second, func() bool { return peerGone(nc) }, "the close to arrive")
			}
		}
		if n := srv.accepted.Load(); n != 2 {
			t.Errorf("%d connections, want 2", n)
		}
		if c := counts(tr, srv); c != (ConnCount{Idle: 1}) {
			t.Errorf("counts %+v, want one idle", c)
		}
	}
}
