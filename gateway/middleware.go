package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"runtime/debug"
)

// RequestIDHeader carries the request id: taken from the client when
// present (capped and sanitised), generated otherwise, sent to the engine,
// echoed to the client and put on the spans (shared/cases L19).
const RequestIDHeader = "X-Request-Id"

// MaxRequestIDLen caps a client-supplied request id, in bytes.
const MaxRequestIDLen = 128

type ctxKey int

const stateKey ctxKey = 0

// reqState is the per-request state middleware and handlers share. It lives
// in the request context and dies with the request: no registry holds it.
type reqState struct {
	id            string
	headerWritten bool // the handler has started the response
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

func markHeaderWritten(r *http.Request) {
	if st := stateFrom(r.Context()); st != nil {
		st.headerWritten = true
	}
}

// requestID assigns the request id and the per-request state.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := sanitizeRequestID(r.Header.Get(RequestIDHeader))
		if id == "" {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		st := &reqState{id: id}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stateKey, st)))
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

// recoverer turns a panic in a handler into a 500 OpenAI error (when the
// response has not started) and logs it with its stack. It re-panics
// http.ErrAbortHandler, which net/http uses to abort a response silently.
// Engine slots are released by the attempt's own deferred end, which runs
// before this recover (shared/cases L01).
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
			if st := stateFrom(r.Context()); st != nil && st.headerWritten {
				// Too late for an error object: abort the connection so the
				// client does not mistake a cut body for a complete one.
				panic(http.ErrAbortHandler)
			}
			writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "internal error"})
		}()
		next.ServeHTTP(w, r)
	})
}
