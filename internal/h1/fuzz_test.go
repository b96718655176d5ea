package h1

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// stubConn serves a fixed byte string as everything the engine sends and
// discards what is written.
type stubConn struct {
	r      *bytes.Reader
	closed atomic.Bool
}

func (c *stubConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	return c.r.Read(p)
}
func (c *stubConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *stubConn) Close() error                     { c.closed.Store(true); return nil }
func (c *stubConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *stubConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *stubConn) SetDeadline(time.Time) error      { return nil }
func (c *stubConn) SetReadDeadline(time.Time) error  { return nil }
func (c *stubConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzResponse: any bytes an engine sends are read without a panic: the
// round trip fails, or its Response is consistent and its body reads to
// an end (its Content-Length, when it has one and reads cleanly).
func FuzzResponse(f *testing.F) {
	for _, tc := range responseCases {
		f.Add([]byte(tc.raw), tc.method == "HEAD")
	}
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-A\r\n\r\n3\r\nabc\r\n0\r\nX-A: 1\r\n\r\n"), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab"), false)
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nrest"), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"), false)
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		tr := New(nil, WithMaxResponseHeaderBytes(4096), WithReadBufferSize(64),
			WithDialContext(func(context.Context, string, string) (net.Conn, error) {
				return &stubConn{r: bytes.NewReader(data)}, nil
			}))
		defer tr.CloseIdleConnections()
		method := "GET"
		if head {
			method = "HEAD"
		}
		req, _ := http.NewRequest(method, "http://engine/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			if resp != nil {
				t.Fatalf("a response with the error %v", err)
			}
			return
		}
		if resp.Body == nil || resp.Header == nil || resp.Request != req || resp.ContentLength < -1 {
			t.Fatalf("inconsistent response %+v", resp)
		}
		if resp.StatusCode < 200 || resp.StatusCode > 999 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err == nil && !head && resp.ContentLength >= 0 && n != resp.ContentLength {
			t.Fatalf("read %d bytes of a %d-byte body without an error", n, resp.ContentLength)
		}
		if c := tr.ConnCounts()["engine:80"]; c.Active != 0 {
			t.Fatalf("counts %+v after the body", c)
		}
	})
}
