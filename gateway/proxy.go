package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
)

// Causes given to the attempt context when a gateway timeout fires, and to
// the base context on shutdown; they tell a timeout apart from the client
// going away.
var (
	errHeaderTimeout     = errors.New("engine response header timeout")
	errFirstTokenTimeout = errors.New("engine first token timeout")
	errIdleTimeout       = errors.New("engine stream idle timeout")
	errAttemptTimeout    = errors.New("engine attempt timeout")
	errRequestTimeout    = errors.New("request timeout")
	errServerShutdown    = errors.New("server shutdown")
)

func (s *Server) proxyHandler(op *operation) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { s.proxy(w, r, op) }
}

// proxy serves one generation request: read and validate the body, find the
// candidates, pick an engine, run the attempt, and fail over to another
// engine only when the connection to the picked one failed (nothing was
// sent, nothing reached the client).
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, op *operation) {
	var held int64 // bytes of the buffered-bytes budget this request holds
	defer func() { s.buffered.give(held) }()
	body, err := s.readBody(w, r, &held)
	if err != nil {
		writeError(w, r, err)
		return
	}
	req, err := s.parser.Parse(op.op, body)
	if err != nil {
		var re *oai.RequestError
		if errors.As(err, &re) {
			err = errBadRequest(re.Param, re.Message)
		}
		writeError(w, r, err)
		return
	}
	st := stateFrom(r.Context())
	if st != nil {
		st.model = req.Model
	}
	rt, err := s.pool.lookup(req.Model)
	if err != nil {
		writeError(w, r, err)
		return
	}
	ctx := r.Context()
	if d := s.cfg.Timeouts.Request; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, errRequestTimeout)
		defer cancel()
	}
	out := s.outgoing(body, &req)
	rreq := routing.Request{Model: req.Model, Stream: req.Stream, SessionKey: req.User, PromptBytes: req.PromptBytes, PrefixHashes: req.PrefixHashes}
	if s.sessionHeader != "" {
		if v := r.Header[s.sessionHeader]; len(v) > 0 && v[0] != "" {
			rreq.SessionKey = v[0]
		}
	}
	candidates := rt.eps
	for n := 1; ; n++ {
		ep, err := s.policy.Pick(ctx, &rreq, candidates)
		if err != nil {
			writeError(w, r, err)
			return
		}
		eng := rt.engineFor(ep)
		if eng == nil { // a policy returned a non-candidate: a bug, not an input
			writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "routing policy returned an unknown engine"})
			return
		}
		retryErr := s.attempt(ctx, w, r, op, &req, &out, eng, &held)
		if retryErr == nil {
			return
		}
		// Fail over: the engine refused the connection and has been
		// marked unhealthy; try the remaining candidates.
		if n >= s.cfg.MaxAttempts || ctx.Err() != nil {
			writeError(w, r, retryErr)
			return
		}
		rest := make([]*routing.Endpoint, 0, len(candidates))
		for _, c := range candidates {
			if c != ep {
				rest = append(rest, c)
			}
		}
		if len(rest) == 0 {
			writeError(w, r, retryErr)
			return
		}
		candidates = rest
	}
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
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, held *int64) (body []byte, err error) {
	rc := http.NewResponseController(w)
	defer func() {
		if err != nil && err != errBodyEmpty {
			closeAfterUnreadBody(w, rc) // the body was not read to its end
		}
	}()
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, errBodyTooLarge(limit)
	}
	if d := s.cfg.BodyReadTimeout; d > 0 && rc.SetReadDeadline(time.Now().Add(d)) == nil {
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
					return nil, s.bodyReadError(r, err)
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
			return nil, s.bodyReadError(r, err)
		}
	}
	if len(buf) == 0 {
		return nil, errBodyEmpty
	}
	return buf, nil
}

// bodyReadError maps a failed body read to what the client is answered.
func (s *Server) bodyReadError(r *http.Request, err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errBodyTooLarge(s.cfg.MaxBodyBytes)
	case errors.Is(err, os.ErrDeadlineExceeded):
		// Before the context check: net/http cancels the request context
		// on any failed read of the connection, this one included.
		return errBodyTimeout(s.cfg.BodyReadTimeout)
	case r.Context().Err() != nil:
		return r.Context().Err()
	}
	return errBadRequest("", "could not read the request body: "+err.Error())
}

// outBody is the body sent to an engine: the client's bytes, possibly with
// one insertion (the usage option), as up to three slices of the original
// body and a constant, so nothing is copied.
type outBody struct {
	parts [3][]byte
	n     int64
	// injected is set when the usage option was added for a client that
	// did not ask for usage: the usage chunk is then kept from it.
	injected bool
}

// reader returns a reader over the whole body.
func (b *outBody) reader() io.Reader {
	return &partsReader{parts: b.parts}
}

// partsReader reads up to three byte slices in order.
type partsReader struct {
	parts [3][]byte
	i     int
}

// Read copies the next bytes of the parts into out; io.EOF after the last.
func (p *partsReader) Read(out []byte) (int, error) {
	n := 0
	for n < len(out) && p.i < len(p.parts) {
		c := copy(out[n:], p.parts[p.i])
		p.parts[p.i] = p.parts[p.i][c:]
		n += c
		if len(p.parts[p.i]) == 0 {
			p.i++
		}
	}
	if n == 0 && p.i >= len(p.parts) {
		return 0, io.EOF
	}
	return n, nil
}

// Usage options inserted into a streamed request body whose client did not
// ask for usage (stream_options absent, null, {} or include_usage
// false/null).
var (
	usageOption       = []byte(`,"stream_options":{"include_usage":true}}`) // replaces the body's closing brace
	usageMember       = []byte(`,"include_usage":true`)                     // added last in a non-empty stream_options
	usageMemberAlone  = []byte(`"include_usage":true`)                      // into an empty one
	closingBraceBytes = []byte(`}`)
)

// outgoing returns the engine body for a parsed request. With
// Config.InjectUsage, a stream whose client did not ask for usage (and did
// not set continuous_usage_stats) gets
// stream_options.include_usage=true: added as the last member of its
// stream_options object (the last duplicate key wins in every JSON parser
// engines use, so a false include_usage before it is overridden and other
// options such as continuous_usage_stats stay), or as a new stream_options
// in place of the body's closing brace when it has none (or null).
func (s *Server) outgoing(body []byte, req *oai.Request) outBody {
	out := outBody{n: int64(len(body))}
	out.parts[0] = body
	if !s.cfg.InjectUsage || !req.Stream || req.IncludeUsage || req.ContinuousUsage {
		// With vLLM's continuous_usage_stats every chunk would carry usage
		// the client did not ask for, and only usage-only chunks can be
		// kept from it: such a stream is left as the client sent it.
		return out
	}
	out.injected = true
	if req.HasStreamOptions {
		at := req.StreamOptionsEnd
		ins := usageMember
		if req.StreamOptionsEmpty {
			ins = usageMemberAlone
		}
		out.parts = [3][]byte{body[:at], ins, body[at:]}
		out.n += int64(len(ins))
		return out
	}
	end := len(body)
	for end > 0 && (body[end-1] == ' ' || body[end-1] == '\n' || body[end-1] == '\r' || body[end-1] == '\t') {
		end--
	}
	// body[end-1] is the closing brace: ParseRequest checked the object.
	out.parts = [3][]byte{body[:end-1], usageOption, nil}
	out.n = int64(end-1) + int64(len(usageOption))
	return out
}

// attempt runs the request on eng. It returns a non-nil error only when the
// failure may be retried on another engine (the connection was never
// established) and nothing has been written; every other outcome is written
// to w (or dropped, when the client has gone) here. held is the request's
// share of the buffered-bytes budget, which a buffered response adds to.
func (s *Server) attempt(ctx context.Context, w http.ResponseWriter, r *http.Request, op *operation, req *oai.Request, body *outBody, eng *engine, held *int64) (retryErr error) {
	ctx, a := s.startAttempt(ctx, eng, op.op, req)
	defer a.finish()
	if s.cfg.EngineHeader {
		// Set now, so the gateway's own errors name the engine tried too.
		w.Header()["X-Switchboard-Engine"] = eng.header // shared: no one mutates it
	}

	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	url := eng.opURL[op.op]
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	ureq, err := http.NewRequestWithContext(actx, http.MethodPost, url, body.reader())
	if err != nil {
		a.fail(ErrTypeInternal)
		writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "could not build the engine request", Err: err})
		return nil
	}
	ureq.ContentLength = body.n
	ureq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.reader()), nil }
	copyRequestHeaders(ureq.Header, r.Header, s.skipReq)
	s.trusted.setForwarded(ureq.Header, r)
	ureq.Header["Content-Type"] = jsonContentType // shared: no one mutates it
	ureq.Header.Set(RequestIDHeader, RequestIDFrom(r.Context()))
	if eng.auth != nil {
		ureq.Header["Authorization"] = eng.auth
	}
	s.prop.Inject(actx, propagation.HeaderCarrier(ureq.Header))

	var firstBy time.Time // the first-token deadline of a stream
	if req.Stream {
		if d := s.cfg.Timeouts.FirstToken; d > 0 {
			firstBy = a.start.Add(d)
		}
	} else if d := s.cfg.Timeouts.Attempt; d > 0 {
		t := time.AfterFunc(d, func() { cancel(errAttemptTimeout) })
		defer t.Stop()
	}
	var hdrTimer *time.Timer
	if req.Stream {
		// The wait for a stream's headers ends at the response-header
		// timeout or the first-token deadline, whichever comes first.
		cause, d := errHeaderTimeout, s.cfg.Timeouts.ResponseHeader
		if !firstBy.IsZero() && (d <= 0 || a.start.Add(d).After(firstBy)) {
			cause, d = errFirstTokenTimeout, firstBy.Sub(a.start)
		}
		if d > 0 {
			hdrTimer = time.AfterFunc(d, func() { cancel(cause) })
		}
	}
	resp, err := s.client.Transport.RoundTrip(ureq)
	if hdrTimer != nil {
		hdrTimer.Stop()
	}
	if err != nil {
		et, ae := s.classify(r, actx, err)
		a.fail(et)
		if et == ErrTypeConnect {
			s.pool.markFailed(eng, err)
			return ae
		}
		writeError(w, r, ae)
		return nil
	}
	defer resp.Body.Close()
	a.status = resp.StatusCode
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		a.fail(strconv.Itoa(resp.StatusCode))
		s.passError(w, r, resp, eng)
		return nil
	}
	ct := resp.Header.Get("Content-Type")
	switch {
	case isEventStream(ct):
		s.stream(w, r, resp, a, actx, cancel, op.end, body.injected, firstBy)
	case req.Stream && (!isJSON(ct) || resp.ContentLength < 0):
		// Another streamed framing (NDJSON, chunked JSON of unknown
		// length): passed through byte for byte, flushed per write, ended
		// by the body's end.
		s.copyBody(w, r, resp, a, actx, cancel, copyStream, firstBy)
	default:
		s.copyBody(w, r, resp, a, actx, cancel, copyWhole, time.Time{})
	}
	return nil
}

// jsonContentType is the Content-Type value of every engine request: the
// body has been checked to be a JSON object, whatever the client declared.
var jsonContentType = []string{"application/json"}

// classify maps an engine round-trip or body-read error to its error.type
// and the APIError the client gets. The client leaving wins over every
// other cause; then the gateway's own timeouts; a failed dial is a
// connect_error (the only retryable class); anything else means the engine
// dropped the connection.
func (s *Server) classify(r *http.Request, actx context.Context, err error) (string, *APIError) {
	if r.Context().Err() != nil {
		if context.Cause(r.Context()) == errServerShutdown {
			return ErrTypeShutdown, &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: ErrTypeShutdown, Message: "the gateway is shutting down", Err: err}
		}
		return ErrTypeClientCancelled, &APIError{Status: StatusClientClosedRequest, Type: TypeInvalidRequest, Message: "client closed request", Err: context.Canceled}
	}
	switch context.Cause(actx) {
	case errFirstTokenTimeout:
		return ErrTypeFirstToken, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: ErrTypeFirstToken, Message: "the engine produced no first token in time", Err: err}
	case errAttemptTimeout:
		return ErrTypeAttemptTimeout, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: ErrTypeAttemptTimeout, Message: "the engine did not complete the response in time", Err: err}
	case errHeaderTimeout:
		return ErrTypeHeaderTimeout, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: ErrTypeHeaderTimeout, Message: "the engine did not send response headers in time", Err: err}
	case errIdleTimeout:
		return ErrTypeIdleTimeout, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: ErrTypeIdleTimeout, Message: "the engine stream went idle for too long", Err: err}
	case errRequestTimeout:
		return ErrTypeRequestTimeout, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: ErrTypeRequestTimeout, Message: "the request took longer than the gateway's request timeout", Err: err}
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		if oe.Timeout() {
			return ErrTypeConnect, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: "engine_connect_timeout", Message: "timed out connecting to the engine", Err: err}
		}
		return ErrTypeConnect, &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: "engine_unreachable", Message: "the engine refused the connection", Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTypeRequestTimeout, &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: "engine_timeout", Message: "the engine did not answer in time", Err: err}
	}
	return ErrTypeEngineDisconnect, &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeEngineDisconnect, Message: "the engine closed the connection before completing the response", Err: err}
}

// maxErrorBody caps how much of an engine's error body is read.
const maxErrorBody = 64 << 10

// passError forwards an engine's non-2xx answer with its status (and its
// Retry-After). A body that already is an OpenAI error object
// ({"error":{...}}) passes unchanged; a JSON error of another shape (vLLM's
// older {"object":"error","message":...}, {"error":"..."}, FastAPI's
// {"detail":...}) is wrapped in one with its message, so clients always get
// the OpenAI envelope (shared/cases L15).
// Anything else (an HTML page, a stack trace, plain text, nothing) is not
// safe to show: it is replaced by an OpenAI error naming the engine and the
// status, and the original, capped, is logged at debug level.
func (s *Server) passError(w http.ResponseWriter, r *http.Request, resp *http.Response, eng *engine) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var probe struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"` // FastAPI's {"detail": ...}
	}
	jsonErr := json.Unmarshal(b, &probe) == nil
	if jsonErr && len(probe.Error) > 0 && probe.Error[0] == '{' {
		h := w.Header()
		copyResponseHeaders(h, resp.Header, true)
		h.Set("Content-Length", strconv.Itoa(len(b)))
		writeHeader(w, r, resp.StatusCode)
		_, _ = w.Write(b)
		return
	}
	msg := probe.Message
	if jsonErr && msg == "" {
		// {"error":"text"}, or FastAPI's {"detail":"text"} or
		// {"detail":[...validation errors...]} (shown as compact JSON).
		for _, raw := range []json.RawMessage{probe.Error, probe.Detail} {
			var str string
			switch {
			case len(raw) == 0 || string(raw) == "null":
			case json.Unmarshal(raw, &str) == nil:
				msg = str
			default:
				var c bytes.Buffer
				if json.Compact(&c, raw) == nil {
					msg = c.String()
				}
			}
			if msg != "" {
				break
			}
		}
	}
	if !jsonErr || msg == "" {
		if s.log.Enabled(r.Context(), slog.LevelDebug) {
			s.log.LogAttrs(r.Context(), slog.LevelDebug, "engine error body not shown to the client",
				slog.String("request_id", RequestIDFrom(r.Context())), slog.String("engine", eng.cfg.Name),
				slog.Int("status", resp.StatusCode), slog.String("content_type", resp.Header.Get("Content-Type")),
				slog.String("body", string(b[:min(len(b), maxLoggedErrorBody)])))
		}
		msg = "engine " + eng.cfg.Name + " answered " + strconv.Itoa(resp.StatusCode)
		if t := http.StatusText(resp.StatusCode); t != "" {
			msg += " " + t
		}
	}
	typ := TypeServer
	if resp.StatusCode < 500 {
		typ = TypeInvalidRequest
	}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	writeError(w, r, &APIError{Status: resp.StatusCode, Type: typ, Code: strconv.Itoa(resp.StatusCode), Message: msg})
}

// maxLoggedErrorBody caps how much of an engine error body that is not
// shown to the client goes to the debug log.
const maxLoggedErrorBody = 2 << 10

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	return len(ct) >= 17 && strings.EqualFold(ct[:17], "text/event-stream")
}

// isJSON reports whether a Content-Type is application/json (any params).
func isJSON(ct string) bool {
	return len(ct) >= 16 && strings.EqualFold(ct[:16], "application/json")
}
