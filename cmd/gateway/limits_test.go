package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// TestRunIdleKeepAliveClosed: server.idle_timeout closes a keep-alive
// client connection that sits idle after its requests, so idle connections
// cannot pile up; before that the connection serves further requests.
func TestRunIdleKeepAliveClosed(t *testing.T) {
	testutil.UnsetOTEL(t)
	const idle = 300 * time.Millisecond
	p := startRun(t, demoArgs, []string{"SWITCHBOARD_SERVER__IDLE_TIMEOUT=" + idle.String()})
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.public, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	get := func() {
		t.Helper()
		if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("status %d, close %v: want a kept-alive 200", resp.StatusCode, resp.Close)
		}
	}
	get()
	get() // the same connection serves a second request
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := br.Read(make([]byte, 1))
	if n != 0 || err != io.EOF {
		t.Fatalf("idle connection: read %d bytes, %v; want EOF (closed by the gateway)", n, err)
	}
	if d := time.Since(start); d < idle/2 || d > idle+2*time.Second {
		t.Errorf("closed after %s, want about server.idle_timeout (%s)", d, idle)
	}
}
