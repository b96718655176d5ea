package oai

import (
	"bytes"
	"mime"
)

// Form is what the gateway reads from a multipart/form-data request body
// (POST /v1/audio/transcriptions and /v1/audio/translations).
type Form struct {
	// Model is the "model" field's value, the last one when the field
	// repeats; "" when absent.
	Model string
	// ModelStart and ModelEnd are the byte offsets of that value in the
	// body, so that body[ModelStart:ModelEnd] can be replaced in place (a
	// model alias; the part has no length header to fix); both 0 when the
	// field is absent. An empty value has ModelStart == ModelEnd > 0.
	ModelStart, ModelEnd int
	// HasFile says a part named by ParseForm's fileField, with a filename
	// or non-empty content, was present.
	HasFile bool
	// Stream is the "stream" field (the last one): true for "true" in any
	// ASCII case; false for "false" or when absent.
	Stream bool
}

// maxFormModel is the longest "model" value ParseForm accepts, in bytes.
const maxFormModel = 256

// FormBoundary returns the multipart boundary of a multipart/form-data
// Content-Type, so a caller can refuse a request before reading its body.
// Errors (*RequestError): another media type or none, 415 "content type
// must be multipart/form-data"; unparsable parameters, 400 "malformed
// content type: ..."; no boundary, 400 "content type has no multipart
// boundary". [ParseForm] applies the same rules.
func FormBoundary(contentType string) (string, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if mt != "multipart/form-data" {
		return "", &RequestError{Status: 415, Message: "content type must be multipart/form-data"}
	}
	if err != nil {
		return "", reqErr("", "malformed content type: "+err.Error())
	}
	boundary := params["boundary"]
	if boundary == "" {
		return "", reqErr("", "content type has no multipart boundary")
	}
	return boundary, nil
}

// ParseForm reads the fields the gateway routes on from a buffered
// multipart/form-data body (RFC 7578) whose Content-Type header is
// contentType; fileField names the part that must carry the upload ("file"
// for audio; "" requires none). It does not retain body; Model is a copy.
//
// Errors are *RequestError:
//   - Status 415, "content type must be multipart/form-data": contentType
//     is missing or of another media type.
//   - 400, "malformed content type: ...": its parameters do not parse;
//     "content type has no multipart boundary": it has no boundary.
//   - 400, "malformed multipart body: ...": the body is not a form (see
//     below).
//   - 400, param "model": the model value is longer than 256 bytes, or
//     transfer-encoded (as for "stream").
//   - 400, param "stream": the stream value is neither "true" nor "false"
//     (in any ASCII case).
//   - 400, param fileField, "<fileField> is required": no such part with a
//     filename or content.
//
// The body is scanned in place, without copying parts, the way Go's
// mime/multipart reads it (FuzzParseForm compares the two): a preamble
// before the first boundary line is skipped; the first boundary line sets
// the line ending, CRLF as RFC 2046 requires, or bare LF as some clients
// send; boundary lines may carry transport padding (spaces and tabs)
// before their line ending; the part headers are MIME headers, with
// continuation lines, each line ending in CRLF or LF; a part's content
// ends before the line ending that precedes the next boundary line, and
// the form ends at the closing "--boundary--" line, after which any
// epilogue is ignored. Parts may come in any order. Model is the value's
// bytes as sent.
//
// It is stricter than mime/multipart where a lax reading could let the
// gateway and the engine's form parser disagree on which part is the
// model: every part must have exactly one Content-Disposition header, of
// type form-data, that mime.ParseMediaType accepts, and header names must
// be tokens (Go accepts a space before the colon and then ignores the
// header); and the model and stream parts must not have a
// Content-Transfer-Encoding other than 7bit, 8bit or binary (400, param
// "model" or "stream", "<name> must not be transfer-encoded"): RFC 7578
// deprecates the header, and parsers differ on whether they decode it.
// Parts are matched by their "name" parameter, exactly.
//
// Safe for concurrent use; never panics.
func ParseForm(body []byte, contentType, fileField string) (Form, error) {
	boundary, err := FormBoundary(contentType)
	if err != nil {
		return Form{}, err
	}
	sc := newFormScanner(body, boundary)
	var f Form
	var model, stream []byte
	modelAt := 0
	partsRead := 0
	expectNewPart := false
	for {
		line, eof := sc.line()
		if eof {
			if sc.isFinal(line) {
				break
			}
			return Form{}, malformedForm("unexpected end of body")
		}
		if sc.isDelimiter(line, partsRead == 0) {
			partsRead++
			p, err := sc.part()
			if err != nil {
				return Form{}, err
			}
			content := body[p.start:p.end]
			switch p.name {
			case "model", "stream":
				if p.encoded {
					return Form{}, reqErr(p.name, p.name+" must not be transfer-encoded")
				}
				if p.name == "model" {
					model, modelAt = content, p.start
				} else {
					stream = content
				}
			}
			if fileField != "" && p.name == fileField && (p.filename || len(content) > 0) {
				f.HasFile = true
			}
			expectNewPart = false
			continue
		}
		switch {
		case sc.isFinal(line):
		case expectNewPart:
			return Form{}, malformedForm("expected a boundary line after a part")
		case partsRead == 0:
			continue // the preamble
		case bytes.Equal(line, sc.nl):
			// The line ending before the boundary line that follows a
			// part's content.
			expectNewPart = true
			continue
		default:
			return Form{}, malformedForm("unexpected data after a part")
		}
		break // the final boundary line
	}

	if model != nil {
		if len(model) > maxFormModel {
			return Form{}, reqErr("model", "model must be at most 256 bytes")
		}
		f.Model = string(model)
		f.ModelStart, f.ModelEnd = modelAt, modelAt+len(model)
	}
	switch {
	case stream == nil || asciiEqualFold(stream, "false"):
	case asciiEqualFold(stream, "true"):
		f.Stream = true
	default:
		return Form{}, reqErr("stream", "stream must be true or false")
	}
	if fileField != "" && !f.HasFile {
		return Form{}, reqErr(fileField, fileField+" is required")
	}
	return f, nil
}

func malformedForm(why string) error { return reqErr("", "malformed multipart body: "+why) }

// formScanner reads a buffered multipart body line by line and part by
// part, with the state of Go's multipart.Reader: the current line ending
// and the boundary strings that depend on it.
type formScanner struct {
	b   []byte
	pos int // start of the unread rest of b
	// nl is the line ending, "\r\n" or, after a first boundary line that
	// ends in a bare LF, "\n". nlDashBoundary is nl + "--" + boundary,
	// dashBoundary "--" + boundary, dashBoundaryDash the closing
	// "--" + boundary + "--".
	nl, nlDashBoundary, dashBoundary, dashBoundaryDash []byte
}

func newFormScanner(body []byte, boundary string) formScanner {
	b := []byte("\r\n--" + boundary + "--")
	return formScanner{
		b:                body,
		nl:               b[:2],
		nlDashBoundary:   b[:len(b)-2],
		dashBoundaryDash: b[2:],
		dashBoundary:     b[2 : len(b)-2],
	}
}

// line consumes and returns the next line, its LF included; eof says
// there is no LF before the end of the body (line is then the rest).
func (sc *formScanner) line() (line []byte, eof bool) {
	rest := sc.b[sc.pos:]
	i := bytes.IndexByte(rest, '\n')
	if i < 0 {
		sc.pos = len(sc.b)
		return rest, true
	}
	sc.pos += i + 1
	return rest[:i+1], false
}

// isFinal reports whether line is the closing boundary line:
// "--boundary--", optional spaces and tabs, and a line ending or the end of
// the body.
func (sc *formScanner) isFinal(line []byte) bool {
	rest, ok := bytes.CutPrefix(line, sc.dashBoundaryDash)
	if !ok {
		return false
	}
	rest = skipLWSP(rest)
	return len(rest) == 0 || bytes.Equal(rest, sc.nl)
}

// isDelimiter reports whether line is a boundary line: "--boundary",
// optional spaces and tabs, and the line ending. On the first one (first),
// a bare LF switches the scanner to LF line endings.
func (sc *formScanner) isDelimiter(line []byte, first bool) bool {
	rest, ok := bytes.CutPrefix(line, sc.dashBoundary)
	if !ok {
		return false
	}
	rest = skipLWSP(rest)
	if first && len(rest) == 1 && rest[0] == '\n' {
		sc.nl = sc.nl[1:]
		sc.nlDashBoundary = sc.nlDashBoundary[1:]
	}
	return bytes.Equal(rest, sc.nl)
}

func skipLWSP(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// formPart is one part: its form name, whether it has a filename, whether
// it has a Content-Transfer-Encoding other than the identity ones, and the
// offsets of its content.
type formPart struct {
	name       string
	filename   bool
	encoded    bool
	start, end int
}

// part reads a part's headers and content, from just after its boundary
// line to just before the line ending that precedes the next boundary line.
func (sc *formScanner) part() (formPart, error) {
	disposition, encoded, err := sc.headers()
	if err != nil {
		return formPart{}, err
	}
	start, end, err := sc.content()
	if err != nil {
		return formPart{}, err
	}
	if disposition == nil {
		return formPart{}, malformedForm("part without content-disposition")
	}
	disp, params, err := mime.ParseMediaType(string(disposition))
	if err != nil {
		return formPart{}, malformedForm("invalid content-disposition: " + err.Error())
	}
	if disp != "form-data" {
		return formPart{}, malformedForm("content-disposition is not form-data")
	}
	return formPart{name: params["name"], filename: params["filename"] != "", encoded: encoded, start: start, end: end}, nil
}

// headers reads a part's header section, up to and including the empty
// line that ends it, and returns the Content-Disposition value (nil when
// there is none) as Go's textproto.Reader.ReadMIMEHeader would give it:
// continuation lines joined by a space, surrounding white space trimmed;
// and whether a Content-Transfer-Encoding header names an encoding other
// than 7bit, 8bit or binary.
func (sc *formScanner) headers() (disposition []byte, encoded bool, err error) {
	if sc.pos < len(sc.b) && (sc.b[sc.pos] == ' ' || sc.b[sc.pos] == '\t') {
		return nil, false, malformedForm("part header starts with white space")
	}
	for {
		line, ok := sc.headerLine()
		if !ok {
			return nil, false, malformedForm("unexpected end of part headers")
		}
		if len(line) == 0 {
			return disposition, encoded, nil
		}
		if bytes.IndexByte(line, ':') < 0 {
			return nil, false, malformedForm("part header line without a colon")
		}
		kv := trimLWSP(line)
		joined := false
		for sc.pos < len(sc.b) && (sc.b[sc.pos] == ' ' || sc.b[sc.pos] == '\t') {
			for sc.pos < len(sc.b) && (sc.b[sc.pos] == ' ' || sc.b[sc.pos] == '\t') {
				sc.pos++
			}
			cont, ok := sc.headerLine()
			if !ok {
				return nil, false, malformedForm("unexpected end of part headers")
			}
			if !joined {
				kv, joined = append([]byte(nil), kv...), true // kv aliases the body
			}
			kv = append(append(kv, ' '), trimLWSP(cont)...)
		}
		name, value, _ := bytes.Cut(kv, []byte(":"))
		if len(name) == 0 || !isToken(name) {
			return nil, false, malformedForm("invalid part header name")
		}
		for _, c := range value {
			if c < ' ' && c != '\t' || c == 0x7f {
				return nil, false, malformedForm("invalid part header value")
			}
		}
		if asciiEqualFold(name, "Content-Transfer-Encoding") {
			switch cte := bytes.TrimLeft(value, " \t"); {
			case asciiEqualFold(cte, "7bit"), asciiEqualFold(cte, "8bit"), asciiEqualFold(cte, "binary"):
			default:
				encoded = true
			}
		}
		if asciiEqualFold(name, "Content-Disposition") {
			if disposition != nil {
				return nil, false, malformedForm("more than one content-disposition in a part")
			}
			disposition = bytes.TrimLeft(value, " \t")
			if disposition == nil {
				disposition = []byte{} // present, if empty
			}
		}
	}
}

// headerLine consumes a header line and returns it without its line ending
// (LF, or CRLF: one CR before the LF); ok is false at the end of the body.
func (sc *formScanner) headerLine() (line []byte, ok bool) {
	line, eof := sc.line()
	if eof {
		return nil, false
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, true
}

// content finds the end of a part's content, which starts at sc.pos, and
// leaves sc.pos there: before the nlDashBoundary that is followed by
// padding, a line ending, "--" or the end of the body; or, for empty
// content, at a boundary that starts the content (Go allows that).
func (sc *formScanner) content() (start, end int, err error) {
	start = sc.pos
	buf := sc.b[start:]
	from := 0
	if bytes.HasPrefix(buf, sc.dashBoundary) {
		if endsBoundary(buf, len(sc.dashBoundary)) {
			return start, start, nil
		}
		from = len(sc.dashBoundary)
	}
	for {
		i := bytes.Index(buf[from:], sc.nlDashBoundary)
		if i < 0 {
			return 0, 0, malformedForm("part is not closed by a boundary")
		}
		i += from
		if endsBoundary(buf[i:], len(sc.nlDashBoundary)) {
			sc.pos = start + i
			return start, start + i, nil
		}
		from = i + len(sc.nlDashBoundary)
	}
}

// endsBoundary reports whether the boundary prefix of buf[:n] really is
// one: it is followed by the end of the body, a space, a tab, CR, LF or
// "--", not by more boundary characters ("--foobar" is not "--foo").
func endsBoundary(buf []byte, n int) bool {
	if len(buf) == n {
		return true
	}
	switch buf[n] {
	case ' ', '\t', '\r', '\n':
		return true
	case '-':
		return len(buf) > n+1 && buf[n+1] == '-'
	}
	return false
}

// asciiEqualFold reports whether b is s under ASCII case folding only
// (bytes.EqualFold would also take "falſe" for "false").
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// trimLWSP removes leading and trailing spaces and tabs.
func trimLWSP(b []byte) []byte {
	b = skipLWSP(b)
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// isToken reports whether b is all RFC 7230 token characters, which header
// names are made of.
func isToken(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 || !tokenChar[c] {
			return false
		}
	}
	return true
}

var tokenChar = func() (t [0x80]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()
