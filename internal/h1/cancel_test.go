package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

var errCause = errors.New("test: the attempt was superseded")

// TestCancelWaitingForSlot: a request waiting for a connection slot
// (WithMaxConnsPerHost) returns the context's cause when it ends, and
// leaves the queue.
func TestCancelWaitingForSlot(t *testing.T) {
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.")
			seesEOF(c, br)
		}
	})
	tr := newTransport(t, WithMaxConnsPerHost(1))
	first, err := get(t, tr, context.Background(), srv.url())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := get(t, tr, ctx, srv.url())
		done <- err
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return counts(tr, srv).Waiting == 1 }, "the second request to wait")
	cancel(errCause)
	if err := <-done; err != errCause {
		t.Errorf("err %v, want the cause", err)
	}
	if c := counts(tr, srv); c != (ConnCount{Active: 1}) {
		t.Errorf("counts %+v, want the first request's connection only", c)
	}
	first.Body.Close()
	if c := counts(tr, srv); c != (ConnCount{}) {
		t.Errorf("counts %+v after the first body's close, want none", c)
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// TestCancelDial: a dial that hangs ends with the context, returning its
// cause.
func TestCancelDial(t *testing.T) {
	addr := blackhole(t)
	dialing := make(chan struct{})
	d := &net.Dialer{}
	tr := newTransport(t, WithDialContext(func(ctx context.Context, network, a string) (net.Conn, error) {
		close(dialing)
		return d.DialContext(ctx, network, a)
	}))
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := get(t, tr, ctx, "http://"+addr+"/x")
		done <- err
	}()
	<-dialing
	cancel(errCause)
	if err := <-done; err != errCause {
		t.Errorf("err %v, want the cause", err)
	}
	if c := tr.ConnCounts()[addr]; c != (ConnCount{}) {
		t.Errorf("counts %+v, want none", c)
	}
}

// TestDialErrors: a connect timeout is a *net.OpError with Op "dial" whose
// Timeout() is true; a refused connection is one whose Timeout() is false
// (what gateway/classify.go tells apart).
func TestDialErrors(t *testing.T) {
	addr := blackhole(t)
	tr := newTransport(t, WithConnectTimeout(50*time.Millisecond))
	_, err := get(t, tr, context.Background(), "http://"+addr+"/x")
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "dial" || !oe.Timeout() {
		t.Errorf("connect timeout: %v (%T), want a *net.OpError, Op dial, Timeout()", err, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	_, err = get(t, tr, context.Background(), "http://"+ln.Addr().String()+"/x")
	if !errors.As(err, &oe) || oe.Op != "dial" || oe.Timeout() {
		t.Errorf("refused: %v (%T), want a *net.OpError, Op dial, not Timeout()", err, err)
	}
	if c := tr.ConnCounts(); c[addr] != (ConnCount{}) || c[ln.Addr().String()] != (ConnCount{}) {
		t.Errorf("counts %+v, want none", c)
	}
}

// TestCancelWritingBody: a request whose body the engine does not read
// ends with the context, returning its cause, and the engine sees the
// connection close; for each way a body is written.
func TestCancelWritingBody(t *testing.T) {
	big := make([]byte, 64<<20)
	cases := []struct {
		name string
		body func() io.Reader
		n    int64
	}{
		{"in memory (writev)", func() io.Reader { return bytes.NewReader(big) }, int64(len(big))},
		{"plain reader", func() io.Reader { return onlyReader{bytes.NewReader(big)} }, int64(len(big))},
		{"chunked", func() io.Reader { return onlyReader{bytes.NewReader(big)} }, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			head := make(chan struct{})
			resume := make(chan struct{})
			closed := make(chan error, 1)
			srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				close(head)
				<-resume // the body is not read meanwhile
				closed <- seesEOF(c, br)
			})
			tr := newTransport(t)
			ctx, cancel := context.WithCancelCause(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.url(), tc.body())
			req.ContentLength = tc.n
			done := make(chan error, 1)
			go func() {
				_, err := tr.RoundTrip(req)
				done <- err
			}()
			<-head
			cancel(errCause)
			if err := <-done; err != errCause {
				t.Errorf("err %v, want the cause", err)
			}
			close(resume)
			if err := <-closed; err != nil {
				t.Errorf("the server did not see the connection close: %v", err)
			}
			if c := counts(tr, srv); c != (ConnCount{}) {
				t.Errorf("counts %+v, want none", c)
			}
		})
	}
}

// TestCancelWaitingForHead: a request whose answer does not come (a
// non-streaming vLLM request still generating) ends with the context,
// returning its cause, and the engine sees the connection close.
func TestCancelWaitingForHead(t *testing.T) {
	read := make(chan struct{})
	closed := make(chan error, 1)
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err != nil {
			return
		}
		close(read)
		closed <- seesEOF(c, br)
	})
	tr := newTransport(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.url()+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	<-read
	cancel(errCause)
	if err := <-done; err != errCause {
		t.Errorf("err %v, want the cause", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("the server did not see the connection close: %v", err)
	}
	if c := counts(tr, srv); c != (ConnCount{}) {
		t.Errorf("counts %+v, want none", c)
	}
}

// TestDeadlineExceeded: a context deadline ends the wait like a
// cancellation; the error is context.DeadlineExceeded.
func TestDeadlineExceeded(t *testing.T) {
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err == nil {
			seesEOF(c, br)
		}
	})
	tr := newTransport(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := get(t, tr, ctx, srv.url()); err != context.DeadlineExceeded {
		t.Errorf("err %v, want context.DeadlineExceeded", err)
	}
}

// TestCancelReadingBody: a body that stalls ends with the context: the
// blocked Read returns the cause (and so do later ones), and the engine
// sees the connection close.
func TestCancelReadingBody(t *testing.T) {
	for _, framing := range []string{"Content-Length: 100", "Transfer-Encoding: chunked", "Connection: close"} {
		t.Run(framing, func(t *testing.T) {
			closed := make(chan error, 1)
			srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
				if _, _, err := readRequest(br); err != nil {
					return
				}
				first := "data: 1\n\n"
				if strings.Contains(framing, "chunked") {
					first = "9\r\n" + first + "\r\n"
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"+framing+"\r\n\r\n"+first)
				closed <- seesEOF(c, br)
			})
			tr := newTransport(t)
			ctx, cancel := context.WithCancelCause(context.Background())
			resp, err := get(t, tr, ctx, srv.url())
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			n, err := resp.Body.Read(buf)
			if err != nil || string(buf[:n]) != "data: 1\n\n" {
				t.Fatalf("first read %q, %v", buf[:n], err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := resp.Body.Read(buf)
				done <- err
			}()
			if c := counts(tr, srv); c != (ConnCount{Active: 1}) {
				t.Errorf("counts %+v while reading, want one active", c)
			}
			cancel(errCause)
			if err := <-done; err != errCause {
				t.Errorf("blocked read: err %v, want the cause", err)
			}
			if _, err := resp.Body.Read(buf); err != errCause {
				t.Errorf("next read: err %v, want the cause", err)
			}
			if err := <-closed; err != nil {
				t.Errorf("the server did not see the connection close: %v", err)
			}
			resp.Body.Close()
			resp.Body.Close()
			if c := counts(tr, srv); c != (ConnCount{}) {
				t.Errorf("counts %+v, want none", c)
			}
		})
	}
}

// TestCancelledBeforeStart: a request whose context already ended is not
// sent.
func TestCancelledBeforeStart(t *testing.T) {
	srv, reqs := capture(t)
	tr := newTransport(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errCause)
	body := &closeRecorder{Reader: strings.NewReader("{}")}
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.url(), body)
	if _, err := tr.RoundTrip(req); err != errCause {
		t.Errorf("err %v, want the cause", err)
	}
	if body.closed.Load() != 1 {
		t.Error("the body was not closed")
	}
	select {
	case r := <-reqs:
		t.Errorf("the server read %q", r)
	default:
	}
}

// TestCancelAfterBody: a context that ends after the body was read to its
// end does not touch the connection, which serves the next request.
func TestCancelAfterBody(t *testing.T) {
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := newTransport(t)
	for range 3 {
		ctx, cancel := context.WithCancelCause(context.Background())
		resp, err := get(t, tr, ctx, srv.url())
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		cancel(errCause)
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// TestCloseDuringRead: Close from another goroutine while a Read is
// blocked ends the Read, closes the connection and frees its slot; Close
// is idempotent and Read after it fails with net/http's error.
func TestCloseDuringRead(t *testing.T) {
	closed := make(chan error, 1)
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
			closed <- seesEOF(c, br)
		}
	})
	tr := newTransport(t)
	resp, err := get(t, tr, context.Background(), srv.url())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 10))
		done <- err
	}()
	resp.Body.Close()
	if err := <-done; err == nil {
		t.Error("the blocked read returned no error")
	}
	if err := <-closed; err != nil {
		t.Errorf("the server did not see the connection close: %v", err)
	}
	for range 2 {
		if err := resp.Body.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if _, err := resp.Body.Read(make([]byte, 1)); err == nil || err.Error() != "http: read on closed response body" {
		t.Errorf("read after close: %v", err)
	}
	if c := counts(tr, srv); c != (ConnCount{}) {
		t.Errorf("counts %+v, want none", c)
	}
}

// TestClientTimeout: http.Client's Timeout (which sets Request.Cancel for
// a RoundTripper it does not know, and a context deadline) is handled
// here, not by the fallback: an answer in time passes, a late one ends the
// round trip and the engine sees the connection close.
func TestClientTimeout(t *testing.T) {
	closed := make(chan error, 1)
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			req, _, err := readRequest(br)
			if err != nil {
				return
			}
			if req.URL.Path == "/slow" {
				closed <- seesEOF(c, br)
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := newTransport(t) // no fallback: a request sent to it would fail
	client := &http.Client{Transport: tr, Timeout: 200 * time.Millisecond}
	resp, err := client.Get(srv.url() + "/fast")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	// The client's message depends on whether its timer or the
	// context's deadline (the same instant) is seen first.
	_, err = client.Get(srv.url() + "/slow")
	if err == nil || !(strings.Contains(err.Error(), "Client.Timeout exceeded") || errors.Is(err, context.DeadlineExceeded)) {
		t.Errorf("err %v, want the client's timeout", err)
	}
	if err := <-closed; err != nil {
		t.Errorf("the server did not see the connection close: %v", err)
	}
}
