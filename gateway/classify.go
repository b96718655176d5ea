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
	"strconv"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
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

// classify maps an engine round-trip or body-read error to its error.type
// and the APIError the client gets. The client leaving wins over every
// other cause; then the gateway's own timeouts, when err is the timeout's
// doing (endedBy); a failed dial is a connect_error (the only retryable
// class); anything else means the engine dropped the connection.
func (s *Server) classify(r *http.Request, actx context.Context, err error) (string, *APIError) {
	if r.Context().Err() != nil {
		if context.Cause(r.Context()) == errServerShutdown {
			// Not err itself: over HTTP/2 the transport returns
			// context.Canceled, which writeError takes for a client that
			// left (a bodyless 499).
			return ErrTypeShutdown, &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: ErrTypeShutdown, Message: "the gateway is shutting down", Err: errServerShutdown}
		}
		return ErrTypeClientCancelled, &APIError{Status: StatusClientClosedRequest, Type: TypeInvalidRequest, Message: "client closed request", Err: context.Canceled}
	}
	cause := context.Cause(actx)
	if !endedBy(actx, err) {
		// A timer that fired after the engine's own failure (a close
		// before headers, a cut body) does not rename it.
		cause = nil
	}
	switch cause {
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

// endedBy reports whether err is ctx's own ending rather than a transport
// error that happened on its own: ctx is done and err is its cause or a
// context error. net/http returns the cause when a cancellation ends a
// round trip (or a body read) it was waiting in, and HTTP/2 returns
// ctx.Err(); an io.EOF, a reset or a closed connection is what the engine
// did, even when a gateway timer fired before the error was classified.
func endedBy(ctx context.Context, err error) bool {
	cause := context.Cause(ctx)
	return cause != nil && (errors.Is(err, cause) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// maxErrorBody caps how much of an engine's error body is read.
const maxErrorBody = 64 << 10

// passError forwards an engine's non-2xx answer with its status (and its
// Retry-After), its body in the route's error envelope: written here when
// the engine's body is passed unchanged (nil is returned), else returned as
// the APIError the client gets. A body that already
// is an error object of that envelope passes unchanged: on OpenAI routes
// any {"error":{...}}, on Anthropic routes {"type":"error","error":{...}}.
// A JSON error of another shape (vLLM's older {"object":"error",
// "message":...}, {"error":"..."}, FastAPI's {"detail":...}, the other
// envelope) is rewritten in the route's envelope with its message, so
// clients always get the error shape their SDK parses (docs/cases.md L15).
// Anything else (an HTML page, a stack trace, plain text, nothing) is not
// safe to show: it is replaced by an error naming the engine and the
// status, and the original, capped, is logged at debug level.
func (s *Server) passError(w http.ResponseWriter, r *http.Request, resp *http.Response, eng *fleet.Engine) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	s.answerComplete(r)
	env := envOpenAI
	if st := stateFrom(r.Context()); st != nil {
		env = st.env
	}
	var probe struct {
		Type    string          `json:"type"`
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"` // FastAPI's {"detail": ...}
	}
	jsonErr := json.Unmarshal(b, &probe) == nil
	errObject := jsonErr && len(probe.Error) > 0 && probe.Error[0] == '{'
	if errObject && (env == envOpenAI || probe.Type == "error") {
		h := w.Header()
		copyResponseHeaders(h, resp.Header, true)
		h.Set("Content-Length", strconv.Itoa(len(b)))
		writeHeader(w, r, resp.StatusCode)
		_, _ = w.Write(b)
		return nil
	}
	if errObject {
		// The other envelope's error object: keep its message.
		var inner struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(probe.Error, &inner)
		probe.Message, probe.Error = inner.Message, nil
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
				slog.String("request_id", RequestIDFrom(r.Context())), slog.String("engine", eng.Name()),
				slog.Int("status", resp.StatusCode), slog.String("content_type", resp.Header.Get("Content-Type")),
				slog.String("body", string(b[:min(len(b), maxLoggedErrorBody)])))
		}
		msg = "engine " + eng.Name() + " answered " + strconv.Itoa(resp.StatusCode)
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
	return &APIError{Status: resp.StatusCode, Type: typ, Code: strconv.Itoa(resp.StatusCode), Message: msg}
}

// maxLoggedErrorBody caps how much of an engine error body that is not
// shown to the client goes to the debug log.
const maxLoggedErrorBody = 2 << 10
