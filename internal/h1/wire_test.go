package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
)

// TestKeepAliveReuse: sequential requests of every body framing that can
// be reused share one connection, which ends idle.
func TestKeepAliveReuse(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/chunked":
			w.Write([]byte("part one,"))
			w.(http.Flusher).Flush()
			w.Write([]byte("part two"))
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Content-Length", "5")
			w.Write([]byte("hello"))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	tr := newTransport(t)
	want := map[string]string{"/length": "hello", "/chunked": "part one,part two", "/empty": ""}
	for i := range 30 {
		path := []string{"/length", "/chunked", "/empty"}[i%3]
		var req *http.Request
		if i%2 == 0 {
			req, _ = http.NewRequest(http.MethodGet, srv.URL+path, nil)
		} else {
			req, _ = http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"model":"m"}`))
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != want[path] {
			t.Fatalf("request %d %s: body %q, want %q", i, path, got, want[path])
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the server saw %d connections, want 1", n)
	}
	if c := tr.ConnCounts()[srv.Listener.Addr().String()]; c != (ConnCount{Idle: 1}) {
		t.Errorf("counts %+v, want one idle connection", c)
	}
}

// responseCases are raw responses that net/http's Transport and this one
// must read alike.
var responseCases = []struct {
	name, method, raw string
}{
	{"content-length", "GET", "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nX-Request-Id: abc\r\n\r\n{\"ok\":true}"},
	{"chunked", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n" +
		"7\r\ndata: a\r\n3;ext=1\r\n\n\nx\r\n0\r\n\r\n"},
	{"chunked with long extensions", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5;" + strings.Repeat("e", 3000) + "\r\nhello\r\n0\r\n\r\n"},
	{"chunked with trailer", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Usage\r\n\r\n" +
		"5\r\nhello\r\n0\r\nX-Usage: 42\r\n\r\n"},
	{"chunked and content-length", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n2\r\nhi\r\n0\r\n\r\n"},
	{"close-delimited", "GET", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"},
	{"http/1.0", "GET", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"},
	{"http/1.0 keep-alive", "GET", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"},
	{"connection close", "GET", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"},
	{"head", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Type: text/plain\r\n\r\n"},
	{"head chunked", "HEAD", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"},
	{"204", "GET", "HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n"},
	{"304", "GET", "HTTP/1.1 304 Not Modified\r\nEtag: \"x\"\r\nContent-Length: 10\r\n\r\n"},
	{"zero length", "POST", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
	{"100 continue skipped", "POST", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nnew"},
	{"odd status text", "GET", "HTTP/1.1 200 Fine Thanks\r\nContent-Length: 0\r\n\r\n"},
	{"no status text", "GET", "HTTP/1.1 500\r\nContent-Length: 0\r\n\r\n"},
	{"lower-case keys, multi values, folding, LF only", "GET", "HTTP/1.1 200 OK\ncontent-length: 2\nx-multi: a\nX-MULTI:  b \nx-fold: one\n two\nset-cookie: s=1\n\nok"},
	{"duplicate equal content-length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"},
	{"pragma", "GET", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 0\r\n\r\n"},
	{"error status", "POST", "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nContent-Length: 4\r\n\r\nbusy"},
}

// TestResponsesLikeNetHTTP: for each raw response, the Response this
// Transport returns matches net/http's in every field the gateway reads,
// and the body and trailer read the same.
func TestResponsesLikeNetHTTP(t *testing.T) {
	for _, tc := range responseCases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
				for {
					if _, _, err := readRequest(br); err != nil {
						return
					}
					io.WriteString(c, tc.raw)
					if !strings.Contains(tc.raw, "Content-Length") && !strings.Contains(tc.raw, "chunked") && tc.method != "HEAD" && !strings.Contains(tc.raw, " 204 ") {
						return // close-delimited
					}
				}
			})
			std := &http.Transport{DisableCompression: true}
			defer std.CloseIdleConnections()
			mine := newTransport(t, WithReadBufferSize(1024))
			do := func(rt http.RoundTripper) (*http.Response, string) {
				var body io.Reader
				if tc.method == "POST" {
					body = strings.NewReader("{}")
				}
				req, _ := http.NewRequest(tc.method, srv.url()+"/x", body)
				resp, err := rt.RoundTrip(req)
				if err != nil {
					t.Fatalf("%T: %v", rt, err)
				}
				return resp, readAll(t, resp)
			}
			want, wantBody := do(std)
			got, gotBody := do(mine)
			if gotBody != wantBody {
				t.Errorf("body %q, want %q", gotBody, wantBody)
			}
			type fields struct {
				Status                 string
				StatusCode             int
				Proto                  string
				ProtoMajor, ProtoMinor int
				Header, Trailer        http.Header
				ContentLength          int64
				TransferEncoding       []string
				Close                  bool
				NoBody                 bool
			}
			f := func(r *http.Response) fields {
				return fields{r.Status, r.StatusCode, r.Proto, r.ProtoMajor, r.ProtoMinor, r.Header, r.Trailer,
					r.ContentLength, r.TransferEncoding, r.Close, r.Body == http.NoBody}
			}
			gf, wf := f(got), f(want)
			wf.NoBody = gf.NoBody // net/http wraps even empty bodies
			if !reflect.DeepEqual(gf, wf) {
				t.Errorf("response\n got %+v\nwant %+v", gf, wf)
			}
			if got.Request == nil || got.Body == nil {
				t.Errorf("Request %v, Body %v: want both set", got.Request, got.Body)
			}
		})
	}
}

// capture is a server that answers every request with a 204 and sends the
// raw bytes of each request (head and body as they came) on reqs.
func capture(t *testing.T) (*rawServer, chan []byte) {
	reqs := make(chan []byte, 16)
	srv := newRawServer(t, func(_ int, c net.Conn, _ *bufio.Reader) {
		var raw bytes.Buffer
		br := bufio.NewReader(io.TeeReader(c, &raw))
		for {
			if _, _, err := readRequest(br); err != nil {
				return
			}
			// The tee holds what the parser took, possibly more:
			// a client sends one request at a time, so no more.
			reqs <- bytes.Clone(raw.Bytes())
			raw.Reset()
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
		}
	})
	return srv, reqs
}

// onlyReader hides a reader's other methods (WriterTo, Len), so net/http
// cannot tell its length and this Transport cannot writev it.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// TestRequestsLikeNetHTTP: the bytes this Transport writes for a request
// are net/http's Transport's: the same request line and header lines (in
// any order), and the same body (after chunked decoding, since chunk sizes
// follow the reads).
func TestRequestsLikeNetHTTP(t *testing.T) {
	big := strings.Repeat("0123456789", 10_000)
	cases := []struct {
		name string
		make func(url string) *http.Request
	}{
		{"get with query", func(u string) *http.Request {
			r, _ := http.NewRequest("GET", u+"/v1/models?limit=1&x=%2F", nil)
			return r
		}},
		{"escaped path", func(u string) *http.Request {
			r, _ := http.NewRequest("GET", u+"/a%20b/%C3%BC/c", nil)
			return r
		}},
		{"host override and empty path", func(u string) *http.Request {
			r, _ := http.NewRequest("GET", u, nil)
			r.Host = "engine.internal:8000"
			return r
		}},
		{"post json", func(u string) *http.Request {
			r, _ := http.NewRequest("POST", u+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Authorization", "Bearer k")
			r.Header["Idempotency-Key"] = nil
			r.Header["X-Empty"] = []string{}
			r.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
			return r
		}},
		{"post without body", func(u string) *http.Request {
			r, _ := http.NewRequest("POST", u+"/wake_up", nil)
			return r
		}},
		{"delete without body", func(u string) *http.Request {
			r, _ := http.NewRequest("DELETE", u+"/x", nil)
			return r
		}},
		{"large in-memory body", func(u string) *http.Request {
			r, _ := http.NewRequest("POST", u+"/v1/completions", bytes.NewReader([]byte(big)))
			return r
		}},
		{"large body of known length, plain reader", func(u string) *http.Request {
			r, _ := http.NewRequest("POST", u+"/v1/completions", onlyReader{strings.NewReader(big)})
			r.ContentLength = int64(len(big))
			return r
		}},
		{"chunked body", func(u string) *http.Request {
			r, _ := http.NewRequest("PUT", u+"/up", iotest.OneByteReader(strings.NewReader("streamed body")))
			return r
		}},
		{"large chunked body", func(u string) *http.Request {
			r, _ := http.NewRequest("POST", u+"/up", onlyReader{strings.NewReader(big)})
			return r
		}},
		{"user agent, multiple values, spaces, close", func(u string) *http.Request {
			r, _ := http.NewRequest("GET", u+"/x", nil)
			r.Header.Set("User-Agent", "  switchboard/1 ")
			r.Header["X-Multi"] = []string{"a", " b\t", ""}
			r.Header.Set("Host", "ignored.example")
			r.Header.Set("Content-Length", "999")
			r.Close = true
			return r
		}},
		{"empty user agent", func(u string) *http.Request {
			r, _ := http.NewRequest("GET", u+"/x", nil)
			r.Header["User-Agent"] = []string{""}
			return r
		}},
		{"nil user agent", func(u string) *http.Request {
			r, _ := http.NewRequest("GET", u+"/x", nil)
			r.Header["User-Agent"] = nil
			return r
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, reqs := capture(t)
			std := &http.Transport{DisableCompression: true}
			defer std.CloseIdleConnections()
			mine := newTransport(t)
			var raws [2][]byte
			for i, rt := range []http.RoundTripper{std, mine} {
				resp, err := rt.RoundTrip(tc.make(srv.url()))
				if err != nil {
					t.Fatalf("%T: %v", rt, err)
				}
				readAll(t, resp)
				raws[i] = <-reqs
			}
			want, got := raws[0], raws[1]
			wantHead, wantBody, _ := bytes.Cut(want, []byte("\r\n\r\n"))
			gotHead, gotBody, _ := bytes.Cut(got, []byte("\r\n\r\n"))
			wl, gl := strings.Split(string(wantHead), "\r\n"), strings.Split(string(gotHead), "\r\n")
			if wl[0] != gl[0] {
				t.Errorf("request line %q, want %q", gl[0], wl[0])
			}
			slices.Sort(wl[1:])
			slices.Sort(gl[1:])
			if !slices.Equal(wl, gl) {
				t.Errorf("header lines\n got %q\nwant %q", gl[1:], wl[1:])
			}
			if strings.Contains(string(wantHead), "chunked") {
				wantBody, gotBody = decodeBody(t, want), decodeBody(t, got)
			}
			if !bytes.Equal(gotBody, wantBody) {
				t.Errorf("body differs: %d bytes, want %d", len(gotBody), len(wantBody))
			}
			if bytes.Contains(bytes.ToLower(gotHead), []byte("idempotency-key")) || bytes.Contains(gotHead, []byte("X-Empty")) {
				t.Errorf("a header with no values was sent:\n%s", gotHead)
			}
		})
	}
}

func decodeBody(t *testing.T, raw []byte) []byte {
	t.Helper()
	_, b, err := readRequest(bufio.NewReader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatalf("decoding %q: %v", raw, err)
	}
	return b
}

// TestRequestErrors: invalid requests fail before anything is written,
// with net/http's messages, and their bodies are closed.
func TestRequestErrors(t *testing.T) {
	srv, reqs := capture(t)
	tr := newTransport(t)
	cases := []struct {
		name, want string
		mod        func(r *http.Request)
	}{
		{"header name", "invalid header field name", func(r *http.Request) { r.Header["Bad Name"] = []string{"x"} }},
		{"header value", "invalid header field value", func(r *http.Request) { r.Header["X-A"] = []string{"a\r\nInjected: 1"} }},
		{"method", "invalid method", func(r *http.Request) { r.Method = "GE T" }},
		{"control in URL", "control character", func(r *http.Request) { r.URL.RawQuery = "a=\x01" }},
		{"length without body", "with nil Body", func(r *http.Request) { r.Body, r.ContentLength = nil, 5 }},
		{"short body", "ContentLength=10 with Body length 2", func(r *http.Request) { r.ContentLength = 10 }},
		{"short large body", "ContentLength=100000 with Body length 2", func(r *http.Request) { r.ContentLength = 100000 }},
		{"long body", "ContentLength=1 with Body length > 1", func(r *http.Request) { r.ContentLength = 1 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := &closeRecorder{Reader: strings.NewReader("{}")}
			req, _ := http.NewRequest("POST", srv.url()+"/x", body)
			req.ContentLength = 2
			tc.mod(req)
			_, err := tr.RoundTrip(req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
			if req.Body != nil && body.closed.Load() != 1 {
				t.Errorf("the body was closed %d times, want once", body.closed.Load())
			}
		})
	}
	select {
	case r := <-reqs:
		t.Errorf("the server read a request:\n%s", r)
	default:
	}
	if c := counts(tr, srv); c.Active != 0 {
		t.Errorf("counts %+v: a connection is still active", c)
	}
}

// TestLongBodyFails: a large body with more bytes than its ContentLength
// fails the request after the announced bytes, which is all the engine
// gets, for an in-memory body and a plain reader.
func TestLongBodyFails(t *testing.T) {
	srv, reqs := capture(t)
	tr := newTransport(t)
	big := strings.Repeat("x", 100_000)
	for _, body := range []io.Reader{strings.NewReader(big), onlyReader{strings.NewReader(big)}} {
		req, _ := http.NewRequest("POST", srv.url(), body)
		req.ContentLength = 50_000
		_, err := tr.RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), "ContentLength=50000 with Body length > 50000") {
			t.Errorf("%T: err %v", body, err)
		}
		if b := decodeBody(t, <-reqs); len(b) != 50_000 {
			t.Errorf("%T: the engine read %d body bytes, want 50000", body, len(b))
		}
	}
}

// TestBodyClosed: the request body is closed once on success, on a dial
// failure and on a failed response.
func TestBodyClosed(t *testing.T) {
	srv, _ := capture(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + ln.Addr().String()
	ln.Close()
	broken := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) { readRequest(br) })
	tr := newTransport(t)
	for _, u := range []string{srv.url(), refused, broken.url()} {
		body := &closeRecorder{Reader: strings.NewReader("{}")}
		req, _ := http.NewRequest("POST", u, body)
		req.ContentLength = 2
		resp, err := tr.RoundTrip(req)
		if err == nil {
			readAll(t, resp)
		}
		if n := body.closed.Load(); n != 1 {
			t.Errorf("%s: body closed %d times (err %v), want once", u, n, err)
		}
	}
}

// TestMalformedResponses: responses that are not HTTP/1.x fail the round
// trip (or the body read) with ErrMalformedResponse, and the connection is
// closed.
func TestMalformedResponses(t *testing.T) {
	cases := []struct{ name, raw string }{
		{"no space", "HTTP/1.1\r\n\r\n"},
		{"status code length", "HTTP/1.1 2000 OK\r\n\r\n"},
		{"status code letters", "HTTP/1.1 2x0 OK\r\n\r\n"},
		{"status code below 100", "HTTP/1.1 099 Odd\r\n\r\n"},
		{"protocol", "HTTTP/1.1 200 OK\r\n\r\n"},
		{"http/2 text", "HTTP/2.0 200 OK\r\n\r\n"},
		{"101 unasked", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"},
		{"no colon", "HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\nok"},
		{"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok"},
		{"empty key", "HTTP/1.1 200 OK\r\n: x\r\n\r\n"},
		{"control byte in value", "HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n"},
		{"first line folded", "HTTP/1.1 200 OK\r\n X-A: a\r\n\r\n"},
		{"bad content-length", "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n"},
		{"negative content-length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"},
		{"empty content-length", "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n"},
		{"conflicting content-lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok"},
		{"transfer-encoding gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"},
		{"two transfer-encodings", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"},
		{"bad trailer key", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Content-Length\r\n\r\n0\r\n\r\n"},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n"},
		{"empty chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\nhi\r\n0\r\n\r\n"},
		{"chunk size overflow", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\nhi\r\n"},
		{"chunk without CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXX0\r\n\r\n"},
		{"chunk overhead", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("e", 100)+"\r\nx\r\n", 200)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			closed := make(chan error, 1)
			srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
				if _, _, err := readRequest(br); err != nil {
					return
				}
				io.WriteString(c, tc.raw)
				closed <- seesEOF(c, br)
			})
			tr := newTransport(t)
			resp, err := get(t, tr, context.Background(), srv.url())
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if !errors.Is(err, ErrMalformedResponse) {
				t.Fatalf("err %v, want ErrMalformedResponse", err)
			}
			if err := <-closed; err != nil {
				t.Errorf("the server did not see the connection close: %v", err)
			}
			if c := counts(tr, srv); c != (ConnCount{}) {
				t.Errorf("counts %+v, want none", c)
			}
		})
	}
}

// TestResponseHeaderBound: a head longer than the bound fails with
// ErrResponseHeaderTooLarge, 1xx heads counted, trailers bounded too.
func TestResponseHeaderBound(t *testing.T) {
	long := strings.Repeat("v", 3000)
	cases := []struct {
		name  string
		limit int64
		raw   string
	}{
		{"default bound, long line", 0, "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("v", 1<<20) + "\r\nContent-Length: 0\r\n\r\n"},
		{"many lines", 2048, "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-A: "+long[:100]+"\r\n", 30) + "Content-Length: 0\r\n\r\n"},
		{"one line over the read buffer", 2048, "HTTP/1.1 200 OK\r\nX-A: " + long + "\r\n\r\n"},
		{"1xx heads count", 2048, strings.Repeat("HTTP/1.1 100 Continue\r\nX-A: "+long[:100]+"\r\n\r\n", 30) + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		{"trailer", 2048, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: " + long + "\r\n\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
				if _, _, err := readRequest(br); err == nil {
					io.WriteString(c, tc.raw)
					seesEOF(c, br)
				}
			})
			tr := newTransport(t, WithMaxResponseHeaderBytes(tc.limit), WithReadBufferSize(1024))
			resp, err := get(t, tr, context.Background(), srv.url())
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if !errors.Is(err, ErrResponseHeaderTooLarge) {
				t.Fatalf("err %v, want ErrResponseHeaderTooLarge", err)
			}
		})
	}
	// Just under the bound passes.
	srv := newRawServer(t, func(_ int, c net.Conn, br *bufio.Reader) {
		if _, _, err := readRequest(br); err == nil {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-A: "+long+"\r\nContent-Length: 0\r\n\r\n")
		}
	})
	tr := newTransport(t, WithMaxResponseHeaderBytes(int64(len("HTTP/1.1 200 OK\r\nX-A: "+long+"\r\nContent-Length: 0\r\n\r\n"))))
	resp, err := get(t, tr, context.Background(), srv.url())
	if err != nil {
		t.Fatalf("a head of exactly the bound: %v", err)
	}
	if got := resp.Header.Get("X-A"); got != long {
		t.Errorf("X-A has %d bytes, want %d", len(got), len(long))
	}
	readAll(t, resp)
}

// TestFallback: https and the other requests this Transport does not
// handle go to the fallback; without one they fail with ErrNoFallback.
func TestFallback(t *testing.T) {
	tls := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls %s", r.Proto)
	}))
	defer tls.Close()
	fb := tls.Client().Transport.(*http.Transport)
	tr := New(fb)
	defer tr.CloseIdleConnections()
	resp, err := get(t, tr, context.Background(), tls.URL+"/x")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "tls HTTP/1.1" || resp.TLS == nil {
		t.Errorf("body %q, TLS %v: want the TLS server's answer", got, resp.TLS)
	}

	var calls atomic.Int32
	rec := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return &http.Response{StatusCode: 299, Body: http.NoBody, Request: r}, nil
	})
	tr2 := New(rec)
	mods := []func(r *http.Request){
		func(r *http.Request) { r.Header.Set("Upgrade", "websocket") },
		func(r *http.Request) { r.Header.Set("Expect", "100-continue") },
		func(r *http.Request) { r.Method = "CONNECT" },
		func(r *http.Request) { r.Trailer = http.Header{"X-T": nil} },
		func(r *http.Request) { r.Body, r.ContentLength = io.NopCloser(strings.NewReader("x")), 0 },
		func(r *http.Request) { r.URL.Scheme = "unix" },
		func(r *http.Request) { r.Host = "ünicode.example" },
		func(r *http.Request) { r.Cancel = make(chan struct{}) },
	}
	for i, mod := range mods {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:1/x", nil)
		mod(req)
		resp, err := tr2.RoundTrip(req)
		if err != nil || resp.StatusCode != 299 {
			t.Errorf("case %d: %v, %v: want the fallback's answer", i, resp, err)
		}
		if i == 0 {
			_, err := New(nil).RoundTrip(req)
			if !errors.Is(err, ErrNoFallback) {
				t.Errorf("without a fallback: %v, want ErrNoFallback", err)
			}
		}
	}
	if n := calls.Load(); int(n) != len(mods) {
		t.Errorf("fallback called %d times, want %d", n, len(mods))
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
