package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// smallBufListener gives every accepted connection a small send buffer, so
// a client that stops reading blocks the gateway's writes quickly.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestClientStopsReading: a client that stops reading mid-stream cannot
// hold an engine slot: the gateway's write deadline
// (timeouts.client_write) fires, the attempt ends as client_stalled, its
// slot is released and the engine request is cancelled. The idle timeout is
// off: the write deadline does not depend on it.
func TestClientStopsReading(t *testing.T) {
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Nanosecond, MaxOutputTokens: 100000, MaxModelLen: 200000})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.Timeouts.ClientWrite = 300 * time.Millisecond
	cfg.Timeouts.Idle = 0
	h := newHarness(t, cfg)
	srv := httptest.NewUnstartedServer(h.gw.Handler())
	srv.Listener = smallBufListener{srv.Listener}
	srv.Start()
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"model":"m","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"x"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1024), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Stop reading. The slot must come back without the client's help.
	testutil.Poll(5*time.Second, func() bool { return h.gw.LiveAttempts() == 0 })
	h.assertIdle()
	if et := h.errorTypes(); et[ErrTypeClientStalled] != 1 || len(et) != 1 {
		t.Errorf("error types %v, want one client_stalled", et)
	}
	testutil.Poll(5*time.Second, func() bool { return eng.Stats().Aborted == 1 })
	if a := eng.Stats().Aborted; a != 1 {
		t.Errorf("engine aborted %d requests, want 1 (the generation must stop)", a)
	}
}

// connWriter stands for net/http's response writer on a client that stopped
// reading: its flush blocks past the write deadline, fails with the
// deadline error and cancels the request, as net/http does when a write to
// the connection fails.
type connWriter struct {
	http.ResponseWriter
	cancel context.CancelFunc
	block  time.Duration
}

func (w *connWriter) FlushError() error {
	time.Sleep(w.block) // the flush blocks on the full socket (on the bubble's clock)
	w.cancel()
	return fmt.Errorf("write tcp: %w", os.ErrDeadlineExceeded)
}

// plainFlusher wraps a writer the way otelhttp's did (and any third-party
// wrapper may): Flush() without an error, and Unwrap. http.ResponseController.Flush stops at it.
type plainFlusher struct{ http.ResponseWriter }

func (w plainFlusher) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w plainFlusher) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestStalledFlushBehindWrapper: a flush that fails on the client write
// deadline behind a wrapper that hides the error (otelhttp's was in the
// production chain until issue 24) is still a stall: relay.write reports the deadline
// error, so the attempt ends as client_stalled, not as client_cancelled at
// the next engine read (TestClientStopsReading flaked that way under load).
// A request cancelled before the deadline is not a stall. No sockets: the
// blocking flush runs on a synctest bubble's clock.
func TestStalledFlushBehindWrapper(t *testing.T) {
	for _, tc := range []struct {
		name        string
		clientWrite time.Duration
		block       time.Duration
		want        string // clientWriteErrType of the error; "" for none
	}{
		{"deadline passed", 5 * time.Millisecond, 20 * time.Millisecond, ErrTypeClientStalled},
		{"cancelled before the deadline", time.Hour, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", nil)
				w := plainFlusher{&connWriter{ResponseWriter: httptest.NewRecorder(), cancel: cancel, block: tc.block}}
				rl := relay{w: w, r: r, rc: http.NewResponseController(w), clientWrite: tc.clientWrite,
					resp: &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}}, sse: true}
				err := rl.write([]byte("data: {}\n\n"), true)
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("write: %v, want nil (the client left; the engine read says so)", err)
				case tc.want != "" && (err == nil || clientWriteErrType(err) != tc.want):
					t.Errorf("write: %v, want an error classified %s", err, tc.want)
				case tc.want != "" && !errors.Is(err, os.ErrDeadlineExceeded):
					t.Errorf("write: %v, want os.ErrDeadlineExceeded", err)
				}
			})
		})
	}
}
