package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
)

// Causes given to the attempt context when a gateway timeout fires; they
// tell a timeout apart from the client going away.
var (
	errHeaderTimeout  = errors.New("engine response header timeout")
	errIdleTimeout    = errors.New("engine stream idle timeout")
	errRequestTimeout = errors.New("request timeout")
)

func (s *Server) proxyHandler(op oai.Operation) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { s.proxy(w, r, op) }
}

// proxy serves one generation request: read and validate the body, find the
// candidates, pick an engine, run the attempt, and fail over to another
// engine only when the connection to the picked one failed (nothing was
// sent, nothing reached the client).
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, op oai.Operation) {
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	req, err := oai.ParseRequest(op, body)
	if err != nil {
		var re *oai.RequestError
		if errors.As(err, &re) {
			err = errBadRequest(re.Param, re.Message)
		}
		writeError(w, r, err)
		return
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
	// Token accounting: have the engine report usage on every stream; the
	// chunk the client did not ask for is dropped on the way back.
	injected := false
	if s.cfg.InjectUsage && req.Stream && !req.IncludeUsage && !req.HasStreamOptions {
		body, injected = withUsageOption(body), true
	}
	rreq := routing.Request{Model: req.Model, Stream: req.Stream, SessionKey: req.User, PromptBytes: req.PromptBytes}
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
		retryErr := s.attempt(ctx, w, r, op, &req, body, injected, eng)
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

// readBody reads the whole body under the size limit. The bytes are kept
// for forwarding (and re-sending on fail-over).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, errBodyTooLarge(s.cfg.MaxBodyBytes)
	}
	rd := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		// One exact allocation; net/http ends the body at Content-Length.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(rd, body)
	} else {
		body, err = io.ReadAll(rd)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errBodyTooLarge(s.cfg.MaxBodyBytes)
		}
		if r.Context().Err() != nil {
			return nil, r.Context().Err()
		}
		return nil, errBadRequest("", "could not read the request body: "+err.Error())
	}
	if len(body) == 0 {
		return nil, errBodyEmpty
	}
	return body, nil
}

// attempt runs the request on eng. It returns a non-nil error only when the
// failure may be retried on another engine (the connection was never
// established) and nothing has been written; every other outcome is written
// to w (or dropped, when the client has gone) here.
func (s *Server) attempt(ctx context.Context, w http.ResponseWriter, r *http.Request, op oai.Operation, req *oai.Request, body []byte, injected bool, eng *engine) (retryErr error) {
	ctx, a := s.startAttempt(ctx, eng, op, req)
	defer a.finish()

	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	ureq, err := http.NewRequestWithContext(actx, http.MethodPost, eng.opURL[op], bytes.NewReader(body))
	if err != nil {
		a.fail(ErrTypeInternal)
		writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "could not build the engine request", Err: err})
		return nil
	}
	copyRequestHeaders(ureq.Header, r.Header)
	ureq.Header["Content-Type"] = jsonContentType // shared: no one mutates it
	ureq.Header.Set(RequestIDHeader, RequestIDFrom(r.Context()))
	if eng.auth != nil {
		ureq.Header["Authorization"] = eng.auth
	}
	s.prop.Inject(actx, propagation.HeaderCarrier(ureq.Header))

	var hdrTimer *time.Timer
	if d := s.cfg.Timeouts.ResponseHeader; d > 0 && req.Stream {
		hdrTimer = time.AfterFunc(d, func() { cancel(errHeaderTimeout) })
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
	if s.cfg.EngineHeader {
		w.Header().Set("X-Switchboard-Engine", eng.cfg.Name)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		a.fail(strconv.Itoa(resp.StatusCode))
		s.passError(w, r, resp)
		return nil
	}
	if req.Stream && !isJSON(resp.Header.Get("Content-Type")) {
		s.stream(w, r, resp, a, actx, cancel, injected)
	} else {
		s.copyBody(w, r, resp, a, actx, cancel)
	}
	return nil
}

// jsonContentType is the Content-Type value of every engine request: the
// body has been checked to be a JSON object, whatever the client declared.
var jsonContentType = []string{"application/json"}

// usageOption is appended to a streamed request body whose client set no
// stream_options.
const usageOption = `,"stream_options":{"include_usage":true}}`

// withUsageOption returns body (a JSON object without stream_options, as
// ParseRequest has checked) with stream_options.include_usage=true added
// before its closing brace. A null stream_options stays in front of the new
// one, and the last duplicate key wins in every JSON parser engines use.
func withUsageOption(body []byte) []byte {
	end := len(body)
	for end > 0 && (body[end-1] == ' ' || body[end-1] == '\n' || body[end-1] == '\r' || body[end-1] == '\t') {
		end--
	}
	out := make([]byte, 0, end-1+len(usageOption))
	out = append(out, body[:end-1]...) // without the closing brace
	return append(out, usageOption...)
}

// classify maps an engine round-trip or body-read error to its error.type
// and the APIError the client gets. The client leaving wins over every
// other cause; then the gateway's own timeouts; a failed dial is a
// connect_error (the only retryable class); anything else means the engine
// dropped the connection.
func (s *Server) classify(r *http.Request, actx context.Context, err error) (string, *APIError) {
	if r.Context().Err() != nil {
		return ErrTypeClientCancelled, &APIError{Status: StatusClientClosedRequest, Type: TypeInvalidRequest, Message: "client closed request", Err: context.Canceled}
	}
	switch context.Cause(actx) {
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

// passError forwards an engine's non-2xx answer with its status. A body that
// already is an OpenAI error object ({"error":{...}}) passes unchanged;
// anything else (vLLM's older {"object":"error",...}, plain text) is wrapped
// in one, so clients always get the OpenAI envelope (shared/cases L15).
func (s *Server) passError(w http.ResponseWriter, r *http.Request, resp *http.Response) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var probe struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
	}
	if json.Unmarshal(b, &probe) == nil && len(probe.Error) > 0 && probe.Error[0] == '{' {
		h := w.Header()
		copyResponseHeaders(h, resp.Header, true)
		h.Set("Content-Length", strconv.Itoa(len(b)))
		markHeaderWritten(r)
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(b)
		return
	}
	msg := probe.Message
	if msg == "" {
		msg = string(bytes.TrimSpace(b))
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
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

// isJSON reports whether a Content-Type is application/json (any params).
func isJSON(ct string) bool {
	return len(ct) >= 16 && strings.EqualFold(ct[:16], "application/json")
}
