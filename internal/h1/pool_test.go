package h1

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// okServer answers every request with "ok" (Content-Length), keeping the
// connection, and reports each connection's close (as the client's) on
// closed.
func okServer(t *testing.T, extra string) (*rawServer, chan error) {
	closed := make(chan error, 16)
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			if _, _, err := readRequest(br); err != nil {
				closed <- nil
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\n"+extra+"Content-Length: 5\r\n\r\nhello")
		}
	})
	return srv, closed
}

// TestUnreadBodyClosesConnection: a body closed before its end (unread, or
// partly read) closes its connection, so an engine still generating sees
// the client leave; the next request dials.
func TestUnreadBodyClosesConnection(t *testing.T) {
	for _, read := range []int{0, 2} {
		srv, closed := okServer(t, "")
		tr := newTransport(t)
		resp, err := get(t, tr, context.Background(), srv.url())
		if err != nil {
			t.Fatal(err)
		}
		if read > 0 {
			if n, err := io.ReadFull(resp.Body, make([]byte, read)); n != read || err != nil {
				t.Fatalf("read %d, %v", n, err)
			}
		}
		resp.Body.Close()
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if c := counts(tr, srv); c != (ConnCount{}) {
			t.Errorf("read %d: counts %+v, want none", read, c)
		}
		resp, err = get(t, tr, context.Background(), srv.url())
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if n := srv.accepted.Load(); n != 2 {
			t.Errorf("read %d: %d connections, want 2", read, n)
		}
	}
}

// TestBodyReadToEndWithoutEOF: a Content-Length body read to its last
// byte ends with it (io.EOF with the data, as net/http's), so Close then
// keeps the connection.
func TestBodyReadToEndWithoutEOF(t *testing.T) {
	srv, _ := okServer(t, "")
	tr := newTransport(t)
	for range 3 {
		resp, err := get(t, tr, context.Background(), srv.url())
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if n, err := resp.Body.Read(buf); n != 5 || err != io.EOF {
			t.Errorf("read %d, %v: want 5 bytes and io.EOF", n, err)
		}
		resp.Body.Close()
	}
	if n := srv.accepted.Load(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// TestConnectionCloseRespected: a response that says Connection: close
// (or a request with Close) ends its connection after the body.
func TestConnectionCloseRespected(t *testing.T) {
	srv, closed := okServer(t, "Connection: close\r\n")
	tr := newTransport(t)
	for i := range 2 {
		resp, err := get(t, tr, context.Background(), srv.url())
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Close || resp.Header.Get("Connection") != "" {
			t.Errorf("Close %v, Connection %q: want Close and the header removed", resp.Close, resp.Header.Get("Connection"))
		}
		readAll(t, resp)
		if err := <-closed; err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	srv2, closed2 := okServer(t, "")
	req, _ := http.NewRequest("GET", srv2.url(), nil)
	req.Close = true
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if err := <-closed2; err != nil {
		t.Fatal(err)
	}
	if c := tr.ConnCounts(); c[srv.ln.Addr().String()] != (ConnCount{}) || c[srv2.ln.Addr().String()] != (ConnCount{}) {
		t.Errorf("counts %+v, want none", c)
	}
}

// TestExtraBytesNotReused: bytes after a response (not asked for) keep its
// connection from being reused.
func TestExtraBytesNotReused(t *testing.T) {
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 408 Request Timeout\r\n\r\n")
			seesEOF(c, br)
		}
	})
	tr := newTransport(t)
	for range 2 {
		resp, err := get(t, tr, context.Background(), srv.url())
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Errorf("body %q", got)
		}
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// TestMaxConnsPerHost: with a bound of two, a third concurrent request
// waits, then gets the first connection released; no third connection is
// opened.
func TestMaxConnsPerHost(t *testing.T) {
	release := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(2)
	srv := newRawServer(t, func(n int, c net.Conn, br *bufio.Reader) {
		for i := 0; ; i++ {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			if i == 0 {
				arrived.Done()
				<-release
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	tr := newTransport(t, WithMaxConnsPerHost(2))
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := get(t, tr, context.Background(), srv.url())
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	arrived.Wait()
	testutil.Eventually(t, 5*time.Second, func() bool { return counts(tr, srv) == ConnCount{Active: 2, Waiting: 1} }, "the third request to wait")
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
	if c := counts(tr, srv); c != (ConnCount{Idle: 2}) {
		t.Errorf("counts %+v, want two idle", c)
	}
}

// TestMaxIdleConnsPerHost: connections released beyond the idle bound are
// closed.
func TestMaxIdleConnsPerHost(t *testing.T) {
	release := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(3)
	srv := newRawServer(t, func(n int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err != nil {
			return
		}
		arrived.Done()
		<-release
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		seesEOF(c, br)
	})
	tr := newTransport(t, WithMaxIdleConnsPerHost(1))
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := get(t, tr, context.Background(), srv.url())
			if err != nil {
				t.Error(err)
				return
			}
			readAll(t, resp)
		}()
	}
	arrived.Wait()
	close(release)
	wg.Wait()
	if c := counts(tr, srv); c != (ConnCount{Idle: 1}) {
		t.Errorf("counts %+v, want one idle", c)
	}
}

// TestCloseIdleConnections: idle connections are closed (the engine sees
// it), the emptied host is forgotten, and the next request dials.
func TestCloseIdleConnections(t *testing.T) {
	srv, closed := okServer(t, "")
	tr := newTransport(t)
	resp, err := get(t, tr, context.Background(), srv.url())
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if c := counts(tr, srv); c != (ConnCount{Idle: 1}) {
		t.Fatalf("counts %+v, want one idle", c)
	}
	tr.CloseIdleConnections()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if c := tr.ConnCounts(); len(c) != 0 {
		t.Errorf("counts %+v, want no hosts", c)
	}
	resp, err = get(t, tr, context.Background(), srv.url())
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := srv.accepted.Load(); n != 2 {
		t.Errorf("%d connections, want 2", n)
	}
}

// TestIdleConnTimeout: a connection idle for the timeout is closed by the
// host's timer.
func TestIdleConnTimeout(t *testing.T) {
	srv, closed := okServer(t, "")
	tr := newTransport(t, WithIdleConnTimeout(20*time.Millisecond))
	resp, err := get(t, tr, context.Background(), srv.url())
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return counts(tr, srv) == ConnCount{} }, "the idle count to drop")
}

// TestHostSpellings: a URL host with and without its default port shares
// one pool, keyed by the dialed address.
func TestHostSpellings(t *testing.T) {
	srv, _ := okServer(t, "")
	var d net.Dialer
	var dialed []string
	tr := newTransport(t, WithDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dialed = append(dialed, addr)
		return d.DialContext(ctx, network, srv.ln.Addr().String())
	}))
	for _, u := range []string{"http://engine/x", "http://engine:80/y", "http://engine/z"} {
		resp, err := get(t, tr, context.Background(), u)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if strings.Join(dialed, ",") != "engine:80" {
		t.Errorf("dialed %q, want engine:80 once", dialed)
	}
	if c := tr.ConnCounts(); len(c) != 1 || c["engine:80"] != (ConnCount{Idle: 1}) {
		t.Errorf("counts %+v, want engine:80 with one idle", c)
	}
}
