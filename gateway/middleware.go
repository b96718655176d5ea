package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// RequestIDHeader carries the request id: taken from the client when
// present (capped and sanitised), generated otherwise, sent to the engine,
// echoed to the client and put on the spans (docs/cases.md L19).
const RequestIDHeader = "X-Request-Id"

// MaxRequestIDLen caps a client-supplied request id, in bytes.
const MaxRequestIDLen = 128

type ctxKey int

const stateKey ctxKey = 0

// reqState is the per-request state middleware and handlers share. It lives
// in the request context and dies with the request: no registry holds it.
// The handler goroutine alone writes it; the access log reads it after the
// handler has returned.
type reqState struct {
	id     string
	status int // the status written, 0 while the response has not started (then an implicit 200)
	// env is the error envelope of the matched route (withOperation).
	env envelope
	// op is the matched operation-table row; nil on other routes.
	op *operation
	// key is the request's API key (authenticate); nil when auth is off.
	key *apiKey

	// For the access log.
	start    time.Time
	model    string
	tried    [maxLoggedEngines]string // engines tried, in order
	attempts int                      // attempts made (may exceed len(tried))
	errType  string                   // error.type of the last attempt, or of the gateway's answer
	fallback string                   // the fallback model the request was last sent to; "" when none
	// legAnswer: the error answered is the last leg's own result, whose
	// error.type (possibly none: a sticky route's 404) its attempt
	// recorded; writeError leaves it as it is.
	legAnswer bool
	ttft      time.Duration // of the attempt that produced content; 0 = none
	inTok     int64         // usage of the last attempt; -1 = unknown
	outTok    int64
	// continued is the number of continuation legs (migration.go),
	// continuedOn their engines.
	continued   int
	continuedOn []string

	// For the key's token limit (limits.go): the request's prompt
	// estimate, and the tokens its attempts used (countUsage).
	promptEst, reservedOut int64
	// grant is the request's hold on its key's limits (admitKey).
	grant           keyGrant
	usedIn, usedOut int64

	// waited is the request's time spent waiting for its client (reading
	// its body, writing the response) and for engines (response headers,
	// body reads): its duration minus waited is the gateway's own time
	// (switchboard.gateway.overhead).
	waited time.Duration
}

// maxLoggedEngines caps the engines named on one access-log line.
const maxLoggedEngines = 4

// triedEngine records an attempt on the named engine.
func (st *reqState) triedEngine(name string) {
	if st.attempts < maxLoggedEngines {
		st.tried[st.attempts] = name
	}
	st.attempts++
}

func stateFrom(ctx context.Context) *reqState {
	if st, ok := ctx.Value(stateKey).(*reqState); ok {
		return st
	}
	return nil
}

// RequestIDFrom returns the request id of a request handled by the gateway,
// or "".
func RequestIDFrom(ctx context.Context) string {
	if st := stateFrom(ctx); st != nil {
		return st.id
	}
	return ""
}

// writeHeader writes the response status, recording it for the recoverer
// (the response has started) and the access log. Every status the gateway
// writes goes through here.
func writeHeader(w http.ResponseWriter, r *http.Request, status int) {
	if st := stateFrom(r.Context()); st != nil {
		st.status = status
	}
	w.WriteHeader(status)
}

// requestID assigns the request id and the per-request state.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := sanitizeRequestID(r.Header.Get(RequestIDHeader))
		if id == "" {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		st := &reqState{id: id, start: time.Now(), inTok: -1, outTok: -1}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stateKey, st)))
	})
}

// accessLog logs one line per request at info level once the handler has
// returned (health and readiness probes excepted): request id, method,
// route, model, engines tried, status, error.type, time to first token,
// duration and token usage. It runs inside requestID, so it sees the
// request's state, and outside otelhttp and the recoverer, so a recovered
// panic is logged with the 500 it became.
func (s *Server) accessLog(next http.Handler) http.Handler {
	if !s.cfg.AccessLog {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Deferred: a request the gateway aborts (panic(http.ErrAbortHandler)
		// after its response started) is logged too, as the panic unwinds.
		defer s.logRequest(r)
		next.ServeHTTP(w, r)
	})
}

// logRequest writes the access-log line of r.
func (s *Server) logRequest(r *http.Request) {
	if r.URL.Path == "/health" || r.URL.Path == "/ready" || !s.log.Enabled(r.Context(), slog.LevelInfo) {
		return
	}
	st := stateFrom(r.Context())
	if st == nil {
		return
	}
	route := ""
	if rc := chi.RouteContext(r.Context()); rc != nil {
		route = rc.RoutePattern()
	}
	status := st.status
	if status == 0 {
		status = http.StatusOK
	}
	attrs := make([]slog.Attr, 0, 18)
	attrs = append(attrs,
		slog.String("request_id", st.id),
		slog.String("method", r.Method),
		slog.String("route", route),
	)
	if route == "" { // no route matched (404, 405): say what was asked
		attrs = append(attrs, slog.String("path", r.URL.Path))
	}
	attrs = append(attrs,
		slog.Int("status", status),
		slog.Duration("duration", time.Since(st.start)),
	)
	if st.op != nil {
		attrs = append(attrs, slog.String("operation", st.op.name))
	}
	if st.key != nil {
		attrs = append(attrs, slog.String("key", st.key.name))
	}
	if st.model != "" {
		attrs = append(attrs, slog.String("model", st.model))
	}
	if st.fallback != "" {
		attrs = append(attrs, slog.String("fallback", st.fallback))
	}
	if st.attempts > 0 {
		n := min(st.attempts, maxLoggedEngines)
		attrs = append(attrs, slog.String("engines", strings.Join(st.tried[:n], ",")), slog.Int("attempts", st.attempts))
	}
	if st.continued > 0 {
		// The generation broke and was continued on these engines.
		attrs = append(attrs, slog.Int("continued", st.continued), slog.String("continued_on", strings.Join(st.continuedOn, ",")))
	}
	if st.errType != "" {
		attrs = append(attrs, slog.String(string(telemetry.AttrErrorType), st.errType))
	}
	if st.ttft > 0 {
		attrs = append(attrs, slog.Duration("ttft", st.ttft))
	}
	if st.inTok >= 0 {
		attrs = append(attrs, slog.Int64("input_tokens", st.inTok), slog.Int64("output_tokens", st.outTok))
	}
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// withOperation records the route's operation-table row in the request
// state before anything can answer, so even admission and body errors come
// in the route's envelope.
func withOperation(op *operation, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st := stateFrom(r.Context()); st != nil {
			st.op, st.env = op, op.env
		}
		next.ServeHTTP(w, r)
	})
}

// admit enforces Config.MaxConcurrentRequests on the proxied routes and
// counts their handlers, so Wait can tell when every one has returned.
// Over the limit the request is answered 503 with Retry-After before its
// body is read; no engine is contacted.
func (s *Server) admit(next http.Handler) http.Handler {
	return door(func(w http.ResponseWriter, r *http.Request) error {
		if max := s.set.Load().cfg.MaxConcurrentRequests; max > 0 && s.inflight.Add(1) > int64(max) {
			// Given back at once, so a flood of rejected requests does not
			// itself keep admissible ones out.
			s.inflight.Add(-1)
			if st := stateFrom(r.Context()); st != nil {
				st.errType = ErrTypeOverloaded
			}
			// No lingering drain: the gateway is shedding load, and a
			// connection held 2 s per refusal would add to it.
			closeStalled(w, http.NewResponseController(w))
			return errOverloaded("the gateway is at its limit of concurrent requests")
		} else if max <= 0 {
			s.inflight.Add(1)
		}
		defer s.inflight.Add(-1)
		next.ServeHTTP(w, r)
		return nil
	})
}

// sanitizeRequestID keeps a client id only if it is printable ASCII without
// spaces, truncated to MaxRequestIDLen bytes; otherwise it returns "".
func sanitizeRequestID(id string) string {
	if len(id) > MaxRequestIDLen {
		id = id[:MaxRequestIDLen]
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return ""
		}
	}
	return id
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// closeAfterUnreadBody closes the connection once the response is written,
// for a request whose body was not read to its end, with a lingering close
// as nginx's lingering_close: after the handler net/http reads and drops
// the unread body (whatever Connection: close says) when at most 256 KiB
// of it remains, and the read deadline bounds that drain at lingerTimeout.
// A larger declared remainder is not drained (net/http gives up at once),
// so a client sending it may still see a reset. A client still
// sending its body can then finish and read the answer, where closing
// with its bytes unread would send it a TCP reset that destroys the
// answer it has not read yet ("write: broken pipe" instead of the 413).
// A client that stalls its body holds the connection no longer than that.
func closeAfterUnreadBody(w http.ResponseWriter, rc *http.ResponseController) {
	w.Header().Set("Connection", "close")
	_ = rc.SetReadDeadline(time.Now().Add(lingerTimeout))
}

// closeStalled closes the connection at once after the response, without
// the drain: for a client whose body did not arrive within
// Config.BodyReadTimeout (it has shown it does not send;
// http.Server.ReadTimeout behaves the same), and for a request refused
// while the gateway sheds load.
func closeStalled(w http.ResponseWriter, rc *http.ResponseController) {
	w.Header().Set("Connection", "close")
	_ = rc.SetReadDeadline(time.Now())
}

// lingerTimeout bounds the drain of an unread body after an early answer
// (closeAfterUnreadBody): nginx's lingering_timeout is 5 s; the drain here
// is capped at net/http's 256 KiB, which a sending client delivers in far
// less.
const lingerTimeout = 2 * time.Second

// recoverer turns a panic in a handler into a 500 error object (when the
// response has not started) and logs it with its stack. It re-panics
// http.ErrAbortHandler, which net/http uses to abort a response silently.
// Engine slots are released by the attempt's own deferred end, which runs
// before this recover (docs/cases.md L01).
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p)
			}
			s.log.Error("panic serving request", "request_id", RequestIDFrom(r.Context()), "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if st := stateFrom(r.Context()); st != nil && st.status != 0 {
				// Too late for an error object: abort the connection so the
				// client does not mistake a cut body for a complete one.
				panic(http.ErrAbortHandler)
			}
			writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "internal error"})
		}()
		next.ServeHTTP(w, r)
	})
}
