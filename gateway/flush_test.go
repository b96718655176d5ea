package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// TestCaseL04L05L06EventsFlushedAsSent: each event reaches a real TCP
// client about when the engine wrote it, whatever the Content-Type
// (text/event-stream with charset, application/x-ndjson, none), with the
// front's response writer in the chain, and with the client asking for gzip (event
// streams are never compressed).
func TestCaseL04L05L06EventsFlushedAsSent(t *testing.T) {
	const gap = 150 * time.Millisecond
	const events = 5
	for _, ct := range []string{"text/event-stream; charset=utf-8", "application/x-ndjson", ""} {
		t.Run(fmt.Sprintf("content-type %q", ct), func(t *testing.T) {
			eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
				if ct != "" {
					w.Header().Set("Content-Type", ct)
				} else {
					w.Header()["Content-Type"] = nil // suppress sniffing
				}
				w.WriteHeader(200)
				rc := http.NewResponseController(w)
				_ = rc.Flush() // flush before the first write (L05)
				for i := range events {
					fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%d%s\"}}]}\n\n", i, strings.Repeat("x", 100))
					_ = rc.Flush()
					time.Sleep(gap)
				}
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
			})
			h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))

			// A raw TCP client, so nothing on the client side buffers.
			conn, err := net.Dial("tcp", h.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if enc := resp.Header.Get("Content-Encoding"); enc != "" {
				t.Fatalf("stream compressed with %q", enc)
			}
			var arrivals []time.Time
			var all bytes.Buffer
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				if n > 0 {
					all.Write(buf[:n])
					for range bytes.Count(buf[:n], []byte("\n\n")) {
						arrivals = append(arrivals, time.Now())
					}
				}
				if err != nil {
					break
				}
			}
			if len(arrivals) != events+1 {
				t.Fatalf("got %d events, want %d: %q", len(arrivals), events+1, all.String())
			}
			for i := 1; i < events; i++ {
				if d := arrivals[i].Sub(arrivals[i-1]); d < gap/2 {
					t.Errorf("events %d and %d arrived %v apart, want about %v (buffered)", i-1, i, d, gap)
				}
			}
			h.waitIdle()
			if l := h.serverLog.String(); strings.Contains(l, "superfluous") {
				t.Errorf("net/http complained: %s", l)
			}
			var statuses []string
			for _, sp := range h.spans.Ended() {
				if sp.SpanKind() == trace.SpanKindServer {
					statuses = append(statuses, attrValue(sp.Attributes(), "http.response.status_code"))
				}
			}
			if len(statuses) != 1 || statuses[0] != "200" {
				t.Errorf("server span statuses %v, want exactly [200]", statuses)
			}
		})
	}
}

// TestNonStreamingMayBeCompressedButIsPassedAsIs: the gateway does not
// compress; a JSON body passes byte for byte.
func TestNonStreamingBodyByteForByte(t *testing.T) {
	const body = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"é ✓"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != body || resp.ContentLength != int64(len(body)) {
		t.Errorf("got %q (Content-Length %d), want the engine's body", b, resp.ContentLength)
	}
	h.waitIdle()
}
