package gateway

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// inbound is a client request as the gateway routes it: its body (kept for
// forwarding and fail-over) and what the route's row says to read from it.
type inbound struct {
	// set is the settings snapshot the request runs under, loaded once
	// when it arrives: a reload never changes a request midway.
	set  *settings
	body []byte
	// kvPredicted is the prompt tokens the policy predicted cached on
	// kvOn, the engine of its last pick, from the engine's KV-cache
	// events (routing.Request.PredictedCached); -1 when it did not.
	kvPredicted int
	kvOn        *routing.Endpoint
	// capOut is the max_tokens the gateway adds to a chat or completions
	// body that sets none, when its key has a spend budget (spendCap): the
	// output its reservation holds, so the engine cannot generate past
	// it. 0: none added.
	capOut int64
	// kvPromptTokens is the prompt's number of tokens when the tokenizer
	// knows it exactly (a hit, or a tokenization waited for), else 0.
	kvPromptTokens int
	// req holds a JSON body's routing fields (bodyJSON rows only).
	req oai.Request
	// form holds a multipart body's fields (bodyForm rows only).
	form oai.Form
	// model is the model as the client named it; "" when the route or the
	// request names none (any routable engine serves it).
	model string
	// target is the model the engines serve under that name: model, or
	// the model an alias (Config.Models.Aliases) stands for; rename is its
	// replacement bytes in the body when they differ (nil when not).
	target string
	// capCompletion: the spend cap is sent as max_completion_tokens
	// (set for a leg on OpenAI's or Azure's chat, engineOut).
	capCompletion bool
	rename        []byte
	stream        bool
	// observe: a non-streaming request sent to the engine as a stream and
	// reassembled (observes: Config.ObserveNonStreaming, or a request
	// whose generation may be continued).
	observe bool
	// excluded is why the body cannot be continued (excludedBy), once
	// judged is set (inbound.exclusion).
	excluded string
	judged   bool
	// id is the {id} path parameter of a sticky route.
	id string
}

// read reads and checks the request as op's row says: the body (under the
// size limits), the model and the stream flag. Errors are APIErrors (400,
// 413, 415, 408, 503) or the client's context error; no engine slot is
// taken for any of them.
func (s *Server) read(w http.ResponseWriter, r *http.Request, op *operation, set *settings, held *int64) (in inbound, err error) {
	in.set = set
	if op.body != bodyNone {
		if err := checkEncoding(r.Header, op.body); err != nil {
			closeAfterUnreadBody(w, http.NewResponseController(w))
			return in, err
		}
	}
	if op.body == bodyForm {
		// A body that cannot be a form is refused before it is read, by
		// the rules ParseForm applies.
		if _, err := oai.FormBoundary(r.Header.Get("Content-Type")); err != nil {
			closeAfterUnreadBody(w, http.NewResponseController(w))
			return in, requestError(err)
		}
	}
	switch op.body {
	case bodyJSON, bodyForm:
		limit := set.cfg.MaxBodyBytes
		if op.body == bodyForm {
			limit = set.cfg.MaxFormBytes
		}
		t0 := time.Now()
		in.body, err = s.readBody(w, r, held, limit, set.cfg.BodyReadTimeout)
		if st := stateFrom(r.Context()); st != nil {
			st.waited += time.Since(t0) // the client's pace, not the gateway's
		}
		if err != nil {
			return in, err
		}
	}
	t0 := time.Now()
	defer func() {
		if op.body != bodyNone {
			s.metrics.RecordStep(r.Context(), telemetry.StepParse, time.Since(t0).Seconds())
		}
	}()
	switch op.body {
	case bodyJSON:
		if in.req, err = set.parser.Parse(op.schema, in.body); err != nil {
			return in, requestError(err)
		}
		in.model, in.stream = in.req.Model, in.req.Stream
	case bodyForm:
		if in.form, err = oai.ParseForm(in.body, r.Header.Get("Content-Type"), op.param); err != nil {
			return in, requestError(err)
		}
		in.model, in.stream = in.form.Model, in.form.Stream
	case bodyNone:
		in.stream = r.URL.Query().Get("stream") == "true"
	}
	switch op.model {
	case modelPath:
		in.model = chi.URLParam(r, op.param)
	case modelQuery:
		in.model = r.URL.Query().Get(op.param)
	case modelNone:
		in.model = ""
	}
	if op.sticky {
		in.id = chi.URLParam(r, idParam)
		if !validID(in.id) {
			return in, errBadRequest(idParam, "invalid response id")
		}
	}
	return in, nil
}

// requestError turns a parser's *oai.RequestError into the client's 400
// (or its own status, 415 for a wrong content type).
func requestError(err error) error {
	var re *oai.RequestError
	if !errors.As(err, &re) {
		return err
	}
	ae := errBadRequest(re.Param, re.Message)
	ae.Status = re.HTTPStatus()
	return ae
}

// maxIDLen caps a stored response id in a path.
const maxIDLen = 256

// validID reports whether id may be put in an engine path: 1..256 bytes of
// letters, digits, '-', '_' and '.', and not a dot segment.
func validID(id string) bool {
	if id == "" || len(id) > maxIDLen || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// initialBodyBuf is the first buffer for a request body: a body grows from
// it with the bytes that arrive (doubling, up to its Content-Length or
// Config.MaxBodyBytes), so a client that declares a large body and sends
// little holds little.
const initialBodyBuf = 16 << 10

// readBody reads the whole body under the size limit and the body read
// deadline. The bytes are kept for forwarding (and re-sending on
// fail-over). Every byte of buffer capacity is reserved in the
// buffered-bytes budget and added to *held, which the caller gives back
// when the request ends. Errors: 413 (too large), 408 (deadline), 503 (the
// budget is full), 400 (unreadable or empty), or the context's error when
// the client went away.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, held *int64, limit int64, timeout time.Duration) (body []byte, err error) {
	rc := http.NewResponseController(w)
	defer func() {
		var ae *APIError
		switch {
		case err == nil || err == errBodyEmpty:
		case errors.As(err, &ae) && ae.Status == http.StatusRequestTimeout:
			closeStalled(w, rc)
		default:
			closeAfterUnreadBody(w, rc) // the body was not read to its end
		}
	}()
	if r.ContentLength > limit {
		return nil, errBodyTooLarge(limit)
	}
	if d := timeout; d > 0 && rc.SetReadDeadline(time.Now().Add(d)) == nil {
		defer func() {
			if err == nil || err == errBodyEmpty {
				// Cleared at once: net/http keeps reading the connection
				// in the background to notice a client that leaves, and a
				// deadline left behind would cancel a long stream.
				_ = rc.SetReadDeadline(time.Time{})
			}
		}()
	}
	want := limit // the most the body can hold
	if r.ContentLength >= 0 {
		want = r.ContentLength
	}
	rd := http.MaxBytesReader(w, r.Body, limit)
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= want {
				if r.ContentLength >= 0 {
					break // net/http ends the body at Content-Length
				}
				// At the limit with no declared length: one more byte means
				// too large.
				var one [1]byte
				n, err := rd.Read(one[:])
				if n > 0 {
					return nil, errBodyTooLarge(limit)
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					return nil, s.bodyReadError(r, err, limit, timeout)
				}
				continue
			}
			grow := min(max(int64(cap(buf)), initialBodyBuf), want-int64(cap(buf)))
			if !s.buffered.take(grow) {
				return nil, errOverloaded("the gateway is holding too many request bytes; retry shortly")
			}
			*held += grow
			nb := make([]byte, len(buf), int64(cap(buf))+grow)
			copy(nb, buf)
			buf = nb
		}
		n, rerr := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err = rerr; err == io.EOF {
			break
		}
		if err != nil {
			return nil, s.bodyReadError(r, err, limit, timeout)
		}
	}
	if len(buf) == 0 {
		return nil, errBodyEmpty
	}
	return buf, nil
}

// bodyReadError maps a failed body read to what the client is answered.
func (s *Server) bodyReadError(r *http.Request, err error, limit int64, timeout time.Duration) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errBodyTooLarge(limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Before the context check: net/http cancels the request context
		// on any failed read of the connection, this one included.
		return errBodyTimeout(timeout)
	case r.Context().Err() != nil:
		return r.Context().Err()
	}
	return errBadRequest("", "could not read the request body: "+err.Error())
}

// checkEncoding refuses, before the body is read, a body the route cannot
// parse as its row says (415, naming what was sent):
//   - a Content-Encoding other than identity (gzip, br, ...): the gateway
//     reads routing fields from the body and engines take it as sent, so
//     a compressed body would only fail later as "invalid character";
//   - on a JSON route, a Content-Type that is not JSON: text/plain, a form
//     (application/x-www-form-urlencoded, curl's default for -d, or
//     multipart/form-data) or any other media type except
//     application/json and a +json type. OpenAI's API refuses these too;
//     a request with no Content-Type is read as JSON, as engines do.
func checkEncoding(h http.Header, kind bodyKind) error {
	if ce := h.Values("Content-Encoding"); len(ce) > 0 {
		for _, v := range ce {
			for _, enc := range strings.Split(v, ",") {
				if enc = strings.TrimSpace(enc); enc != "" && !strings.EqualFold(enc, "identity") {
					return &APIError{Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest, Code: "unsupported_content_encoding",
						Message: "content encoding " + strconv.Quote(enc) + " is not supported: send the request body uncompressed"}
				}
			}
		}
	}
	if kind != bodyJSON {
		return nil
	}
	ct := h.Get("Content-Type")
	if ct == "" || isJSON(ct) && (len(ct) == 16 || ct[16] == ';' || ct[16] == ' ') {
		return nil // the common case, without ParseMediaType's allocations
	}
	mt, _, err := mime.ParseMediaType(ct)
	if errors.Is(err, mime.ErrInvalidMediaParameter) {
		err = nil // a JSON type with a broken parameter (`; charset`) is still JSON
	}
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json")) {
		return nil
	}
	shown := mt
	if err != nil {
		shown = ct
	}
	return &APIError{Status: http.StatusUnsupportedMediaType, Type: TypeInvalidRequest, Code: "unsupported_media_type",
		Message: "content type " + strconv.Quote(shown) + " is not supported on this route: send the body as application/json"}
}
