package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTransport returns a Transport with no fallback whose idle connections
// are closed when the test ends.
func newTransport(t testing.TB, opts ...Option) *Transport {
	t.Helper()
	tr := New(nil, opts...)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// rawServer is a TCP server on loopback whose connections are served by
// handle, each on its own goroutine, with n counting connections from 1.
// Cleanup closes the listener and every connection and waits for the
// handlers.
type rawServer struct {
	ln       net.Listener
	handle   func(n int, c net.Conn, br *bufio.Reader)
	accepted atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newRawServer(t testing.TB, handle func(n int, c net.Conn, br *bufio.Reader)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, handle: handle}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *rawServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		n := int(s.accepted.Add(1))
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			s.handle(n, c, bufio.NewReader(c))
		}()
	}
}

// readRequest reads one request and its whole body.
func readRequest(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(req.Body)
	return req, b, err
}

// seesEOF reads c until it fails and reports whether that is the peer's
// close (EOF or a reset) within 5 s, rather than a timeout.
func seesEOF(c net.Conn, br *bufio.Reader) error {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, br)
	if err == nil || errors.Is(err, syscall.ECONNRESET) {
		return nil
	}
	return err
}

// counts returns the Transport's counts for the server's host.
func counts(tr *Transport, s *rawServer) ConnCount {
	return tr.ConnCounts()[s.ln.Addr().String()]
}

// get sends a GET to url with ctx and returns the response.
func get(t testing.TB, tr http.RoundTripper, ctx context.Context, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTrip(req)
}

// readAll reads and closes resp's body.
func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

// closeRecorder is a request body that records its Close.
type closeRecorder struct {
	io.Reader
	closed atomic.Int32
}

func (c *closeRecorder) Close() error {
	c.closed.Add(1)
	return nil
}

// withProbeIdle sets how long a connection must have been idle to be
// checked at checkout (tests).
func withProbeIdle(d time.Duration) Option {
	return optionFunc(func(c *config) { c.probeIdle = d })
}
