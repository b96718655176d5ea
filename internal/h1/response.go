package h1

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// maxKeptScratch: parser scratch grown past this by a large head is not
// kept for the connection's next response.
const maxKeptScratch = 64 << 10

// chunkedTE is Response.TransferEncoding of a chunked response, shared by
// all of them: callers must not modify it.
var chunkedTE = []string{"chunked"}

// headParser reads response heads from a connection's buffer. Its scratch
// is reused for every response on the connection, so a head costs its
// Header map, one string holding every value and one []string backing
// them (net/textproto.readMIMEHeader does the same with one string per
// value).
type headParser struct {
	limit int64    // bytes left to read of the head
	long  []byte   // a line longer than the read buffer
	vals  []byte   // the values, end to end
	kvs   []header // the fields, in order
}

type header struct {
	key        string
	start, end int
}

// readResponse reads the response head to req (after skipping 1xx heads)
// and works out its framing as net/http's ReadResponse and readTransfer
// do (response.go, transfer.go). It returns the body to hand out, or nil
// when the response has none (then the connection is free).
func (c *conn) readResponse(req *http.Request, p *plan) (*http.Response, *body, error) {
	hp := &c.hp
	hp.limit = c.h.t.cfg.maxHeaderBytes
	defer hp.trim()
	var (
		resp *http.Response
		err  error
	)
	for {
		resp, err = hp.readHead(c.br)
		if err != nil {
			return nil, nil, err
		}
		code := resp.StatusCode
		if code == http.StatusSwitchingProtocols {
			return nil, nil, fmt.Errorf("%w: 101 Switching Protocols to a request without Upgrade", ErrMalformedResponse)
		}
		if code >= 200 {
			break
		}
		// 1xx: 100 Continue, 102, 103 Early Hints; skipped, their
		// bytes counted in the head's bound (persistConn.readResponse).
		if err := hp.readFields(c.br); err != nil {
			return nil, nil, err
		}
	}
	if err := hp.readFields(c.br); err != nil {
		return nil, nil, err
	}
	h := hp.header()
	resp.Header = h
	resp.Request = req
	fixPragmaCacheControl(h)

	// Transfer-Encoding (transferReader.parseTransferEncoding).
	chunked := false
	if raw, ok := h["Transfer-Encoding"]; ok {
		delete(h, "Transfer-Encoding")
		if resp.ProtoMinor >= 1 {
			if len(raw) != 1 {
				return nil, nil, fmt.Errorf("%w: too many transfer encodings: %q", ErrMalformedResponse, raw)
			}
			if !strings.EqualFold(raw[0], "chunked") {
				return nil, nil, fmt.Errorf("%w: unsupported transfer encoding: %q", ErrMalformedResponse, raw[0])
			}
			chunked = true
		}
	}
	resp.Close = shouldClose(resp.ProtoMinor, h)

	// Content-Length (fixLength).
	cls := h["Content-Length"]
	if len(cls) > 1 {
		first := textproto.TrimString(cls[0])
		for _, v := range cls[1:] {
			if textproto.TrimString(v) != first {
				return nil, nil, fmt.Errorf("%w: multiple Content-Length headers: %q", ErrMalformedResponse, cls)
			}
		}
		cls = cls[:1:1]
		h["Content-Length"] = cls
	}
	cl := int64(-1)
	if len(cls) > 0 {
		if cl, err = parseContentLength(cls[0]); err != nil {
			return nil, nil, err
		}
	}
	code := resp.StatusCode
	noBody := code == http.StatusNoContent || code == http.StatusNotModified
	var n int64 // the body's length: net/http's realLength
	switch {
	case p.head || noBody:
		n = 0
	case chunked:
		delete(h, "Content-Length")
		n = -1
	default:
		n = cl
	}
	if p.head {
		resp.ContentLength = cl
	} else {
		resp.ContentLength = n
	}
	if chunked {
		resp.TransferEncoding = chunkedTE
		if tr, ok := h["Trailer"]; ok {
			delete(h, "Trailer")
			if resp.Trailer, err = declaredTrailer(tr); err != nil {
				return nil, nil, err
			}
		}
	}
	var kind uint8
	switch {
	case n == 0: // a HEAD answer, 204, 304 or Content-Length: 0
		return resp, nil, nil
	case chunked:
		kind = bodyChunked
	case n > 0:
		kind = bodyLength
	default: // no length: the body ends with the connection
		resp.Close = true
		kind = bodyUntilClose
	}
	return resp, &body{c: c, resp: resp, kind: kind, remain: n, keep: !resp.Close && !p.close}, nil
}

// readHead reads a status line and returns a Response with its status
// fields (ReadResponse's checks).
func (hp *headParser) readHead(br *bufio.Reader) (*http.Response, error) {
	line, err := hp.readLine(br)
	if err != nil {
		return nil, err
	}
	proto, status, ok := bytes.Cut(line, []byte(" "))
	if !ok {
		return nil, fmt.Errorf("%w: malformed HTTP response %q", ErrMalformedResponse, line)
	}
	status = bytes.TrimLeft(status, " ")
	codeb, _, _ := bytes.Cut(status, []byte(" "))
	if len(codeb) != 3 || !isDigit(codeb[0]) || !isDigit(codeb[1]) || !isDigit(codeb[2]) {
		return nil, fmt.Errorf("%w: malformed HTTP status code %q", ErrMalformedResponse, codeb)
	}
	code := int(codeb[0]-'0')*100 + int(codeb[1]-'0')*10 + int(codeb[2]-'0')
	if code < 100 {
		return nil, fmt.Errorf("%w: malformed HTTP status code %q", ErrMalformedResponse, codeb)
	}
	resp := &http.Response{StatusCode: code, ProtoMajor: 1}
	switch string(proto) {
	case "HTTP/1.1":
		resp.Proto, resp.ProtoMinor = "HTTP/1.1", 1
	case "HTTP/1.0":
		resp.Proto = "HTTP/1.0"
	default:
		// ParseHTTPVersion's HTTP/X.Y; only major version 1 is
		// HTTP/1.x framing.
		if len(proto) != len("HTTP/1.Y") || !bytes.HasPrefix(proto, []byte("HTTP/1.")) || !isDigit(proto[7]) {
			return nil, fmt.Errorf("%w: malformed HTTP version %q", ErrMalformedResponse, proto)
		}
		resp.Proto, resp.ProtoMinor = string(proto), int(proto[7]-'0')
	}
	if s, ok := statusLines[code]; ok && string(status) == s {
		resp.Status = s
	} else {
		resp.Status = string(status)
	}
	return resp, nil
}

// statusLines holds "200 OK" and the like for every code with a
// StatusText, so a standard status line costs no string.
var statusLines = func() map[int]string {
	m := make(map[int]string)
	for code := 100; code < 600; code++ {
		if t := http.StatusText(code); t != "" {
			m[code] = strconv.Itoa(code) + " " + t
		}
	}
	return m
}()

// readFields reads header lines up to the blank line into hp.kvs and
// hp.vals (textproto.readMIMEHeader's rules: keys are tokens, put in
// canonical form; values are trimmed of spaces and tabs, may not hold
// control bytes but tab; a line starting with a space or tab continues the
// previous value (obs-fold), except as the first line). Unlike textproto, a
// key with a space before its colon is rejected (RFC 9112, section 5.1).
func (hp *headParser) readFields(br *bufio.Reader) error {
	hp.vals, hp.kvs = hp.vals[:0], hp.kvs[:0]
	for {
		line, err := hp.readLine(br)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			if len(hp.kvs) == 0 {
				return fmt.Errorf("%w: malformed MIME header initial line: %q", ErrMalformedResponse, line)
			}
			v := textproto.TrimBytes(line)
			if !validValue(v) {
				return fmt.Errorf("%w: malformed MIME header line: %q", ErrMalformedResponse, line)
			}
			hp.vals = append(hp.vals, ' ')
			hp.vals = append(hp.vals, v...)
			hp.kvs[len(hp.kvs)-1].end = len(hp.vals)
			continue
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(k) == 0 {
			return fmt.Errorf("%w: malformed MIME header line: %q", ErrMalformedResponse, line)
		}
		for _, b := range k {
			if !httpguts.IsTokenRune(rune(b)) {
				return fmt.Errorf("%w: malformed MIME header line: %q", ErrMalformedResponse, line)
			}
		}
		v = textproto.TrimBytes(v)
		if !validValue(v) {
			return fmt.Errorf("%w: malformed MIME header line: %q", ErrMalformedResponse, line)
		}
		key := canonicalKey(k)
		start := len(hp.vals)
		hp.vals = append(hp.vals, v...)
		hp.kvs = append(hp.kvs, header{key: key, start: start, end: len(hp.vals)})
	}
}

// header builds the Header of the fields read: one string for all values
// and one []string backing them.
func (hp *headParser) header() http.Header {
	n := len(hp.kvs)
	h := make(http.Header, n)
	if n == 0 {
		return h
	}
	all := string(hp.vals)
	strs := make([]string, n)
	for i, f := range hp.kvs {
		v := all[f.start:f.end]
		if vv, ok := h[f.key]; ok {
			h[f.key] = append(vv, v)
			continue
		}
		strs[i] = v
		h[f.key] = strs[i : i+1 : i+1]
	}
	return h
}

// readLine returns the next line without its LF or CRLF, counting its
// bytes against hp.limit; the slice is valid until the next read.
func (hp *headParser) readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		hp.long = append(hp.long[:0], line...)
		for err == bufio.ErrBufferFull {
			if int64(len(hp.long)) > hp.limit {
				return nil, ErrResponseHeaderTooLarge
			}
			line, err = br.ReadSlice('\n')
			hp.long = append(hp.long, line...)
		}
		line = hp.long
	}
	hp.limit -= int64(len(line))
	if hp.limit < 0 {
		return nil, ErrResponseHeaderTooLarge
	}
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// trim drops scratch that a large head grew.
func (hp *headParser) trim() {
	if cap(hp.long) > maxKeptScratch {
		hp.long = nil
	}
	if cap(hp.vals) > maxKeptScratch {
		hp.vals = nil
	}
	if cap(hp.kvs) > maxKeptScratch/32 {
		hp.kvs = nil
	}
	clear(hp.kvs[:cap(hp.kvs)]) // no key strings kept alive
}

// shouldClose reports whether the connection closes after the response
// (transfer.go, shouldClose): an HTTP/1.0 response unless it says
// keep-alive, an HTTP/1.1 one when it says close (then its Connection
// header is removed, as net/http does).
func shouldClose(minor int, h http.Header) bool {
	conv := h["Connection"]
	hasClose := httpguts.HeaderValuesContainsToken(conv, "close")
	if minor == 0 {
		return hasClose || !httpguts.HeaderValuesContainsToken(conv, "keep-alive")
	}
	if hasClose {
		delete(h, "Connection")
	}
	return hasClose
}

// parseContentLength is transfer.go's parseContentLength.
func parseContentLength(v string) (int64, error) {
	v = textproto.TrimString(v)
	if v == "" {
		return 0, fmt.Errorf("%w: invalid empty Content-Length", ErrMalformedResponse)
	}
	n, err := strconv.ParseUint(v, 10, 63)
	if err != nil {
		return 0, fmt.Errorf("%w: bad Content-Length %q", ErrMalformedResponse, v)
	}
	return int64(n), nil
}

// declaredTrailer is transfer.go's fixTrailer: the keys a chunked response
// declares in its Trailer header, with no values until the trailer is
// read.
func declaredTrailer(vv []string) (http.Header, error) {
	t := make(http.Header)
	for _, v := range vv {
		for k := range strings.SplitSeq(v, ",") {
			k = http.CanonicalHeaderKey(strings.TrimSpace(k))
			switch k {
			case "":
				continue
			case "Transfer-Encoding", "Trailer", "Content-Length":
				return nil, fmt.Errorf("%w: bad trailer key %q", ErrMalformedResponse, k)
			}
			t[k] = nil
		}
	}
	return t, nil
}

// fixPragmaCacheControl is response.go's: Pragma: no-cache without
// Cache-Control reads as Cache-Control: no-cache (RFC 7234, section 5.4).
func fixPragmaCacheControl(h http.Header) {
	if hp, ok := h["Pragma"]; ok && len(hp) > 0 && hp[0] == "no-cache" {
		if _, present := h["Cache-Control"]; !present {
			h["Cache-Control"] = []string{"no-cache"}
		}
	}
}

// canonicalKey returns k (a valid token) in canonical form, interned for
// common keys; k is changed in place.
func canonicalKey(k []byte) string {
	upper := true
	for i, c := range k {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		k[i] = c
		upper = c == '-'
	}
	if s, ok := commonKeys[string(k)]; ok {
		return s
	}
	return string(k)
}

// commonKeys interns the keys engines and proxies send (textproto's
// commonHeader, and vLLM's and uvicorn's own).
var commonKeys = func() map[string]string {
	m := make(map[string]string)
	for _, k := range []string{
		"Accept-Ranges", "Access-Control-Allow-Credentials", "Access-Control-Allow-Headers",
		"Access-Control-Allow-Methods", "Access-Control-Allow-Origin", "Access-Control-Expose-Headers",
		"Age", "Allow", "Cache-Control", "Connection", "Content-Disposition", "Content-Encoding",
		"Content-Language", "Content-Length", "Content-Location", "Content-Range", "Content-Type",
		"Date", "Etag", "Expires", "Keep-Alive", "Last-Modified", "Location", "Pragma",
		"Retry-After", "Server", "Set-Cookie", "Strict-Transport-Security", "Trailer",
		"Traceparent", "Tracestate", "Transfer-Encoding", "Vary", "Via", "Www-Authenticate",
		"X-Accel-Buffering", "X-Content-Type-Options", "X-Frame-Options", "X-Request-Id",
		"X-Ratelimit-Limit-Requests", "X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Requests",
		"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Requests", "X-Ratelimit-Reset-Tokens",
		"Openai-Processing-Ms", "Openai-Version", "Openai-Model", "Openai-Organization",
	} {
		m[k] = k
	}
	return m
}()

// validValue is textproto's validHeaderValueByte over v: VCHAR, SP, HTAB
// and obs-text (>= 0x80).
func validValue(v []byte) bool {
	for _, b := range v {
		if (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}

func isDigit(b byte) bool { return '0' <= b && b <= '9' }
