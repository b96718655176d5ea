package h1

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// benchEngine is a minimal keep-alive engine on loopback: it reads each
// request's head and Content-Length body and writes a canned answer, so a
// benchmark measures the client more than the server.
func benchEngine(b testing.TB, answer []byte) *rawServer {
	return newRawServer(b, func(_ int, c net.Conn, br *bufio.Reader) {
		for {
			n := int64(0)
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return
				}
				if len(line) <= 2 {
					break
				}
				if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
					n, _ = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
				}
			}
			if _, err := br.Discard(int(n)); err != nil {
				return
			}
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	})
}

// resettable is a request body that can be sent again without allocating.
type resettable struct{ bytes.Reader }

func (*resettable) Close() error { return nil }

const benchRequest = `{"model":"m","messages":[{"role":"user","content":"Say hello in one short sentence, please."}],"max_tokens":16}`

// BenchmarkRoundTrip: one POST of a small JSON body and its whole answer,
// on a kept-alive connection, through this Transport and through
// http.Transport (configured as gateway.NewTransport). json: a
// Content-Length answer; sse: a 16-event chunked stream, one chunk per
// event. The request, its context (cancellable, as the gateway's) and the
// read buffer are reused, so what is counted is the transport's.
func BenchmarkRoundTrip(b *testing.B) {
	jsonBody := `{"id":"cmpl-1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}}`
	jsonAnswer := "HTTP/1.1 200 OK\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: application/json\r\ncontent-length: " +
		strconv.Itoa(len(jsonBody)) + "\r\nx-request-id: 8f0e5c\r\n\r\n" + jsonBody
	var sse strings.Builder
	sse.WriteString("HTTP/1.1 200 OK\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\nx-request-id: 8f0e5c\r\n\r\n")
	for i := range 16 {
		ev := fmt.Sprintf("data: {\"id\":\"cmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
		fmt.Fprintf(&sse, "%x\r\n%s\r\n", len(ev), ev)
	}
	sse.WriteString("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
	for _, body := range []struct{ name, answer string }{{"json", jsonAnswer}, {"sse", sse.String()}} {
		for _, tc := range []struct {
			name string
			rt   func(b *testing.B) http.RoundTripper
		}{
			{"h1", func(b *testing.B) http.RoundTripper { return newTransport(b) }},
			{"net-http", func(b *testing.B) http.RoundTripper {
				t := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
				b.Cleanup(t.CloseIdleConnections)
				return t
			}},
		} {
			b.Run(body.name+"/"+tc.name, func(b *testing.B) {
				srv := benchEngine(b, []byte(body.answer))
				rt := tc.rt(b)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				rb := &resettable{}
				req, err := http.NewRequestWithContext(ctx, "POST", srv.url()+"/v1/chat/completions", rb)
				if err != nil {
					b.Fatal(err)
				}
				req.ContentLength = int64(len(benchRequest))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Request-Id", "8f0e5c")
				req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
				req.Header["Idempotency-Key"] = nil
				buf := make([]byte, 32<<10)
				payload := []byte(benchRequest)
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					rb.Reset(payload)
					resp, err := rt.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					for {
						_, err := resp.Body.Read(buf)
						if err == io.EOF {
							break
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					resp.Body.Close()
				}
				b.StopTimer()
				if n := srv.accepted.Load(); n != 1 {
					b.Errorf("%d connections, want 1", n)
				}
			})
		}
	}
}

// TestAllocsPerRoundTrip: a kept-alive round trip of a small JSON request
// (and of a 100 KiB one, written with writev) and answer allocates only the Response, its Header (map, values, value
// slices), the body and the context AfterFunc's two objects: the head and
// body write and the body framing allocate nothing.
func TestAllocsPerRoundTrip(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector changes allocations (sync.Pool drops items)")
	}
	answer := "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\nx-request-id: 8f0e5c\r\n\r\n{\"ok\":true}"
	srv := benchEngine(t, []byte(answer))
	tr := newTransport(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, payload := range [][]byte{[]byte(benchRequest), bytes.Repeat([]byte("x"), 100<<10)} {
		rb := &resettable{}
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.url()+"/v1/chat/completions", rb)
		req.ContentLength = int64(len(payload))
		req.Header.Set("Content-Type", "application/json")
		req.Header["Idempotency-Key"] = nil
		buf := make([]byte, 512)
		allocs := testing.AllocsPerRun(200, func() {
			rb.Reset(payload)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
		})
		if allocs > 8 {
			t.Errorf("%d-byte body: %.1f allocations per round trip, want at most 8", len(payload), allocs)
		}
	}
}
