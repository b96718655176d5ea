package h1

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// defaultUserAgent is net/http's (request.go, defaultUserAgent).
const defaultUserAgent = "Go-http-client/1.1"

// maxKeptWriteBuf: a write buffer grown past this by a large head is not
// pooled again.
const maxKeptWriteBuf = 64 << 10

// requestError is a failure of the request itself (its body's Read or
// Close, or a body shorter than its ContentLength), not of the connection:
// returned as is, never replayed.
type requestError struct{ error }

// errBodyTooLong: the body had more bytes than its ContentLength; the
// extra ones were not sent.
var errBodyTooLong = errors.New("h1: request body longer than its ContentLength")

// plan is what is worked out of a request once, before any attempt:
// net/http's Request.write and transferWriter decisions (request.go,
// transfer.go).
type plan struct {
	method string
	host   string // the Host header's value
	ua     string // the User-Agent header's value; "" sends none
	// bodyLen is net/http's Request.outgoingLength: 0 without a body,
	// the ContentLength, or -1 (unknown: sent chunked).
	bodyLen int64
	sendCL  bool // write Content-Length (transferWriter.shouldSendContentLength)
	// close: the request asked to close the connection after the
	// response (Request.Close, or Connection: close); writeClose: write
	// "Connection: close" for Request.Close (transferWriter.writeHeader).
	close, writeClose bool
	head              bool // a HEAD request: the response has no body
}

// prepare validates req and fills p, as net/http's Transport.roundTrip
// (validateHeaders, validMethod) and Request.write do.
func (p *plan) prepare(req *http.Request) error {
	p.method = req.Method
	if p.method == "" {
		p.method = http.MethodGet
	}
	if !httpguts.ValidHeaderFieldName(p.method) {
		return fmt.Errorf("net/http: invalid method %q", p.method)
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("net/http: invalid header field name %q", k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				// Not the value: it may be a credential.
				return fmt.Errorf("net/http: invalid header field value for %q", k)
			}
		}
	}
	if u := req.URL; hasCTL(u.Opaque) || hasCTL(u.EscapedPath()) || hasCTL(u.RawQuery) {
		return errors.New("net/http: can't write control character in Request.URL")
	}
	h := req.Host
	if h == "" {
		h = req.URL.Host
	}
	if !httpguts.ValidHostHeader(h) {
		// Request.write: an invalid Host is sent empty, not truncated.
		h = ""
	}
	p.host = removeZone(h)
	p.ua = defaultUserAgent
	if vv, ok := req.Header["User-Agent"]; ok {
		p.ua = ""
		if len(vv) > 0 {
			p.ua = textproto.TrimString(vv[0])
		}
	}
	body := req.Body
	if body == http.NoBody {
		body = nil
	}
	switch {
	case body == nil && req.ContentLength != 0:
		return fmt.Errorf("http: Request.ContentLength=%d with nil Body", req.ContentLength)
	case body == nil:
		p.bodyLen = 0
	case len(req.TransferEncoding) > 0 || req.ContentLength <= 0:
		p.bodyLen = -1
	default:
		p.bodyLen = req.ContentLength
	}
	switch p.method {
	case "POST", "PUT", "PATCH":
		p.sendCL = p.bodyLen >= 0
	default:
		p.sendCL = p.bodyLen > 0
	}
	connClose := httpguts.HeaderValuesContainsToken(req.Header["Connection"], "close")
	p.close = req.Close || connClose
	p.writeClose = req.Close && !connClose
	p.head = p.method == http.MethodHead
	return nil
}

// writeRequest writes req's head and body to c, through a pooled buffer;
// small requests go out in one write, a large in-memory body with its head
// in one writev. body (req.Body, or GetBody's for a replay) is closed, as
// Request.write does. Errors of the body are requestErrors.
func (t *Transport) writeRequest(c *conn, req *http.Request, p *plan, body io.ReadCloser) error {
	bp := t.wbufs.Get().(*[]byte)
	buf := appendHead((*bp)[:0], req, p)
	var err error
	buf, err = c.writeBody(buf, p, body)
	if body != nil {
		if cerr := body.Close(); cerr != nil && err == nil {
			err = requestError{cerr}
		}
	}
	if cap(buf) <= maxKeptWriteBuf {
		*bp = buf[:0]
	}
	t.wbufs.Put(bp)
	return err
}

// appendHead appends the request line and header to buf, in
// Request.write's order: Host, User-Agent, Connection: close,
// Content-Length or Transfer-Encoding, then req.Header except the fields
// written from the request's fields (reqWriteExcludeHeader) and the keys
// with no values. Values are trimmed of spaces and tabs (Header.writeSubset);
// prepare has rejected CR and LF in them. Unlike net/http the header keys
// are not sorted.
func appendHead(buf []byte, req *http.Request, p *plan) []byte {
	buf = append(buf, p.method...)
	buf = append(buf, ' ')
	buf = appendRequestURI(buf, req.URL)
	buf = append(buf, " HTTP/1.1\r\nHost: "...)
	buf = append(buf, p.host...)
	buf = append(buf, "\r\n"...)
	if p.ua != "" {
		buf = append(buf, "User-Agent: "...)
		buf = append(buf, p.ua...)
		buf = append(buf, "\r\n"...)
	}
	if p.writeClose {
		buf = append(buf, "Connection: close\r\n"...)
	}
	if p.sendCL {
		buf = append(buf, "Content-Length: "...)
		buf = strconv.AppendInt(buf, max(p.bodyLen, 0), 10)
		buf = append(buf, "\r\n"...)
	} else if p.bodyLen < 0 {
		buf = append(buf, "Transfer-Encoding: chunked\r\n"...)
	}
	for k, vv := range req.Header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		for _, v := range vv {
			buf = append(buf, k...)
			buf = append(buf, ": "...)
			buf = append(buf, textproto.TrimString(v)...)
			buf = append(buf, "\r\n"...)
		}
	}
	return append(buf, "\r\n"...)
}

// appendRequestURI appends u.RequestURI() without allocating in the usual
// case (no Opaque).
func appendRequestURI(buf []byte, u *url.URL) []byte {
	if u.Opaque != "" {
		return append(buf, u.RequestURI()...)
	}
	start := len(buf)
	buf = append(buf, u.EscapedPath()...)
	if len(buf) == start {
		buf = append(buf, '/')
	}
	if u.ForceQuery || u.RawQuery != "" {
		buf = append(buf, '?')
		buf = append(buf, u.RawQuery...)
	}
	return buf
}

// writeBody writes buf (the head) and the body to c; it returns buf, which
// it may have grown or reused.
func (c *conn) writeBody(buf []byte, p *plan, body io.ReadCloser) ([]byte, error) {
	switch {
	case body == nil:
		return buf, c.write(buf)
	case p.bodyLen < 0:
		return c.writeChunked(buf, body)
	}
	n := p.bodyLen
	if int64(cap(buf)-len(buf)) > n {
		// Head and body in one write (with a byte to spare for
		// tooLong).
		l := len(buf)
		buf = buf[:l+int(n)]
		if m, err := io.ReadFull(body, buf[l:]); err != nil {
			return buf, bodyErr(err, n, int64(m))
		}
		if tooLong(body, buf) {
			return buf, requestError{fmt.Errorf("http: ContentLength=%d with Body length > %d", n, n)}
		}
		return buf, c.write(buf)
	}
	if wt, ok := body.(io.WriterTo); ok {
		// An in-memory body (io.NopCloser keeps WriteTo): head and
		// body in one writev, the body not copied.
		c.bw.head, c.bw.remain, c.bw.err = buf, n, nil
		_, err := wt.WriteTo(&c.bw)
		c.bw.head = nil
		switch {
		case c.bw.err != nil:
			return buf, c.bw.err
		case err == errBodyTooLong:
			return buf, requestError{fmt.Errorf("http: ContentLength=%d with Body length > %d", n, n)}
		case err != nil:
			return buf, requestError{err}
		case c.bw.remain > 0:
			return buf, bodyErr(io.EOF, n, n-c.bw.remain)
		}
		return buf, nil
	}
	// Any other reader: through the buffer, a write each time it fills.
	left := n
	for left > 0 {
		if len(buf) == cap(buf) {
			if err := c.write(buf); err != nil {
				return buf, err
			}
			buf = buf[:0]
		}
		l := len(buf)
		room := min(int64(cap(buf)-l), left)
		m, err := body.Read(buf[l : l+int(room)])
		buf = buf[:l+m]
		left -= int64(m)
		if err != nil && left > 0 {
			return buf, bodyErr(err, n, n-left)
		}
	}
	if len(buf) == cap(buf) {
		if err := c.write(buf); err != nil {
			return buf, err
		}
		buf = buf[:0]
	}
	if tooLong(body, buf) {
		// What was announced is written; the request fails after it,
		// as net/http's does.
		if err := c.write(buf); err != nil {
			return buf, err
		}
		return buf, requestError{fmt.Errorf("http: ContentLength=%d with Body length > %d", n, n)}
	}
	return buf, c.write(buf)
}

// tooLong reports whether body has a byte beyond what was read of it,
// reading it into buf's spare capacity (which must have a byte). Like
// net/http (transferWriter.writeBody reads on to EOF), it reads body once
// more after its announced length.
func tooLong(body io.Reader, buf []byte) bool {
	m, _ := body.Read(buf[len(buf) : len(buf)+1])
	return m > 0
}

// bodyErr is the requestError for a body that ended (or failed) after got
// of its want bytes.
func bodyErr(err error, want, got int64) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return requestError{fmt.Errorf("http: ContentLength=%d with Body length %d", want, got)}
	}
	return requestError{err}
}

// chunkHead is the room kept before a chunk's data for its size line: four
// hex digits (chunks are at most 0xffff bytes; leading zeros are valid
// chunk-size syntax) and CRLF.
const chunkHead = 6

// writeChunked writes the head and the body in chunked encoding, one chunk
// per Read and a write per chunk (the body may be a stream whose next
// bytes wait on the engine; net/http's FlushAfterChunkWriter), then the
// last chunk.
func (c *conn) writeChunked(buf []byte, body io.Reader) ([]byte, error) {
	for {
		if cap(buf)-len(buf) < chunkHead+2+64 {
			if err := c.write(buf); err != nil {
				return buf, err
			}
			buf = buf[:0]
		}
		l := len(buf)
		// Room for the chunk's CRLF and the last chunk too: a Read that
		// fills it and ends the body in one call does not grow buf.
		room := min(cap(buf)-l-chunkHead-2-len("0\r\n\r\n"), 0xffff)
		data := buf[l+chunkHead : l+chunkHead+room]
		m, err := body.Read(data)
		if m > 0 {
			buf = buf[:l+chunkHead+m]
			const hex = "0123456789abcdef"
			buf[l], buf[l+1], buf[l+2], buf[l+3] = hex[m>>12&0xf], hex[m>>8&0xf], hex[m>>4&0xf], hex[m&0xf]
			buf[l+4], buf[l+5] = '\r', '\n'
			buf = append(buf, "\r\n"...)
		}
		if err == io.EOF {
			buf = append(buf, "0\r\n\r\n"...)
			return buf, c.write(buf)
		}
		if err != nil {
			return buf, requestError{err}
		}
		if m > 0 {
			if err := c.write(buf); err != nil {
				return buf, err
			}
			buf = buf[:0]
		}
	}
}

// bodyWriter receives an in-memory body's WriteTo: the first Write goes
// out with the head in one writev; bytes past ContentLength are not sent
// (errBodyTooLong). It lives in its conn so that passing it as an
// io.Writer allocates nothing.
type bodyWriter struct {
	c      *conn
	head   []byte // not yet written
	remain int64
	err    error // the connection's write error
}

func (w *bodyWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	n := len(p)
	if int64(n) > w.remain {
		p = p[:w.remain]
	}
	c := w.c
	var err error
	if w.head != nil {
		c.bufs[0], c.bufs[1] = w.head, p
		c.nb = c.bufs[:]
		var m int64
		m, err = c.nb.WriteTo(c.nc) // writev; consumes c.nb
		c.nwritten += m
		c.bufs[0], c.bufs[1], c.nb = nil, nil, nil
		w.head = nil
	} else if len(p) > 0 {
		err = c.write(p)
	}
	w.remain -= int64(len(p))
	if err != nil {
		w.err = err
		return 0, err
	}
	if len(p) < n {
		return len(p), errBodyTooLong
	}
	return n, nil
}

// hasCTL reports whether s has a control byte (< 0x20 or 0x7f;
// request.go, stringContainsCTLByte).
func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' || b == 0x7f {
			return true
		}
	}
	return false
}

// removeZone removes an IPv6 zone identifier from host (request.go,
// removeZone; RFC 6874).
func removeZone(host string) string {
	if !strings.HasPrefix(host, "[") {
		return host
	}
	i := strings.LastIndex(host, "]")
	if i < 0 {
		return host
	}
	j := strings.LastIndex(host[:i], "%")
	if j < 0 {
		return host
	}
	return host[:j] + host[i:]
}
