package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

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
	disagg   string                   // the disaggregation decision (telemetry.DisaggMode values); "" when none was made
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
	// console is the model's row on the console's models panel, set by
	// the request's first attempt; nil before one.
	console *modelStats

	// For the key's token limit (limits.go): the request's prompt
	// estimate, and the tokens its attempts used (countUsage).
	promptEst, reservedOut int64
	// grant is the request's hold on its key's limits (admitKey).
	grant           keyGrant
	usedIn, usedOut int64
	// costNano is the cost of its exchanges at the configured prices, in
	// 10^-9 USD (attempt.charge).
	costNano int64

	// rw and body are the response writer and the request body front
	// hands the handlers (in the state: no allocation of their own).
	rw   respWriter
	body countingBody

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

// front is the first middleware of the public handler, inside chi (so
// the route pattern is known when the request ends): it gives the request
// its id and per-request state, starts its server span (not for /health
// and /ready), wraps the response writer to count the body, and when the
// handler returns, even by a panic, ends the span, records the HTTP server
// metrics and writes the access-log line (Config.AccessLog). It does what
// otelhttp's middleware did, with one request copy and no allocation of
// its own beyond the state: a CPU profile put otelhttp at about 9% of the
// gateway's CPU per request and 18% of its allocations (BENCHMARKS.md,
// issue 24).
func (s *Server) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := sanitizeRequestID(r.Header.Get(RequestIDHeader))
		if id == "" {
			id = newRequestID()
		}
		w.Header().Set(RequestIDHeader, id)
		st := &reqState{id: id, start: time.Now(), inTok: -1, outTok: -1}
		st.rw.ResponseWriter = w
		ctx := r.Context()
		if r.Body != nil && r.Body != http.NoBody {
			// r is front's own copy below: the server keeps the body it
			// gave, and drains and closes it itself.
			st.body.ReadCloser = r.Body
		}
		probe := r.URL.Path == "/health" || r.URL.Path == "/ready"
		var span trace.Span
		if !probe {
			// Probes are polled every few seconds by every load balancer
			// and kubelet: no spans or HTTP metrics for them.
			ctx = s.prop.Extract(ctx, propagation.HeaderCarrier(r.Header))
			ctx, span = s.tracer.Start(ctx, spanMethod(r.Method), s.serverStart...)
			if span.IsRecording() {
				span.SetAttributes(requestSpanAttrs(r, id, s.trusted)...)
			}
		}
		r = r.WithContext(context.WithValue(ctx, stateKey, st))
		if st.body.ReadCloser != nil {
			r.Body = &st.body
		}
		// Deferred: a request the gateway aborts (panic(http.ErrAbortHandler)
		// after its response started) is ended and logged too, as the
		// panic unwinds.
		defer s.endRequest(r, st, span)
		next.ServeHTTP(&st.rw, r)
	})
}

// serverSpanStart are the options of every server span.
func serverSpanStart() []trace.SpanStartOption {
	return []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
}

// spanMethod is a server span's name before the route is known: the
// method, or "HTTP" for one semconv does not name.
func spanMethod(m string) string {
	if telemetry.KnownHTTPMethod(m) {
		return m
	}
	return "HTTP"
}

// requestSpanAttrs are semconv's request attributes of a server span
// (HTTP spans, semconv v1.43.0), set when it is recording: what otelhttp
// set, and the request id. client.address is the first X-Forwarded-For
// entry when the peer is one of the trusted proxies (as the engine's
// X-Forwarded-For is built: forwarded.go), the peer otherwise.
func requestSpanAttrs(r *http.Request, id string, trusted trustedProxies) []attribute.KeyValue {
	kvs := make([]attribute.KeyValue, 0, 12)
	if telemetry.KnownHTTPMethod(r.Method) {
		kvs = append(kvs, semconv.HTTPRequestMethodKey.String(r.Method))
	} else {
		kvs = append(kvs, semconv.HTTPRequestMethodKey.String("_OTHER"), semconv.HTTPRequestMethodOriginal(r.Method))
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	kvs = append(kvs, semconv.URLScheme(scheme), semconv.URLPath(r.URL.Path),
		semconv.NetworkProtocolVersion(telemetry.ProtocolVersion(r.ProtoMajor, r.ProtoMinor)), telemetry.AttrRequestID.String(id))
	if host, port, err := net.SplitHostPort(r.Host); err == nil {
		kvs = append(kvs, semconv.ServerAddress(host))
		if p, err := strconv.Atoi(port); err == nil {
			kvs = append(kvs, semconv.ServerPort(p))
		}
	} else if r.Host != "" {
		kvs = append(kvs, semconv.ServerAddress(r.Host))
	}
	if host, port, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		client := host
		if xff := r.Header.Get(hdrXFF); xff != "" && len(trusted) > 0 {
			if peer, err := netip.ParseAddr(host); err == nil && trusted.trusts(peer) {
				first, _, _ := strings.Cut(xff, ",")
				if first = strings.TrimSpace(first); first != "" {
					client = first
				}
			}
		}
		kvs = append(kvs, semconv.NetworkPeerAddress(host), semconv.ClientAddress(client))
		if p, err := strconv.Atoi(port); err == nil {
			kvs = append(kvs, semconv.NetworkPeerPort(p))
		}
	}
	if ua := r.UserAgent(); ua != "" {
		kvs = append(kvs, semconv.UserAgentOriginal(ua))
	}
	return kvs
}

// endRequest ends request r: its server span (name, route, status, body
// sizes), the HTTP server metrics and the access-log line. The status is
// the first one sent (st.rw), else the one the gateway meant to write
// (writeHeader: a panic may have come between), else net/http's implicit
// 200.
func (s *Server) endRequest(r *http.Request, st *reqState, span trace.Span) {
	status := st.rw.status
	if status == 0 {
		status = st.status
	}
	if status == 0 {
		status = http.StatusOK
	}
	route := ""
	if rc := chi.RouteContext(r.Context()); rc != nil {
		route = rc.RoutePattern()
	}
	now := time.Now() // one clock read for the duration metric and the console
	if span != nil {
		reqBytes := st.body.n
		s.metrics.RecordHTTPServer(r.Context(), telemetry.HTTPRequest{Route: route, Method: r.Method, Status: status,
			TLS: r.TLS != nil, ProtoMajor: r.ProtoMajor, ProtoMinor: r.ProtoMinor},
			now.Sub(st.start).Seconds(), reqBytes, st.rw.bytes)
		if span.IsRecording() {
			if route != "" {
				span.SetName(spanMethod(r.Method) + " " + route)
				span.SetAttributes(semconv.HTTPRoute(route))
			}
			span.SetAttributes(semconv.HTTPResponseStatusCode(status), semconv.HTTPRequestBodySize(int(reqBytes)),
				semconv.HTTPResponseBodySize(int(st.rw.bytes)))
			// A request that failed after its response started as a
			// success (a proxied stream cut, a panic after the first
			// write): error.type says what happened.
			markServerSpan(r.Context(), st)
			if status >= 500 {
				// semconv: a server span's status is Error for a 5xx only,
				// with error.type: the gateway's own when it has one, the
				// status code otherwise.
				et := st.errType
				if et == "" {
					et = strconv.Itoa(status)
				}
				span.SetAttributes(semconv.ErrorTypeKey.String(et))
				span.SetStatus(codes.Error, et)
			}
		}
		span.End()
	}
	if s.cfg.AccessLog {
		s.logRequest(r, st, route, status)
	}
	if r.URL.Path != "/health" && r.URL.Path != "/ready" {
		s.recordRequest(st, route, status, now)
	}
}

// markServerSpan records on the server span a request that failed after
// its response had started as a success (a stream cut by the engine, a
// client that went away mid-stream): its status code says 200, so
// error.type says what happened, and a failure that is not the client's
// sets the span's status to Error. (A 5xx status is marked by front's
// endRequest.)
func markServerSpan(ctx context.Context, st *reqState) {
	if st.errType == "" || st.status >= 400 {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(telemetry.AttrErrorType.String(st.errType))
	switch st.errType {
	case ErrTypeClientCancelled, ErrTypeClientStalled:
		span.AddEvent(telemetry.EventClientGone)
	default:
		span.SetStatus(codes.Error, st.errType)
	}
}

// respWriter is the public handler's response writer: it counts the body
// bytes written and keeps the first final status, for the server span and
// the HTTP server metrics. Flush and FlushError reach the connection's own
// (a wrapper that hid FlushError's error would hide a write deadline's),
// and Unwrap lets http.ResponseController reach the rest.
type respWriter struct {
	http.ResponseWriter
	status int   // the first status >= 200 written; 0 before
	bytes  int64 // body bytes written
}

func (w *respWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *respWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *respWriter) Flush() { _ = w.FlushError() }

func (w *respWriter) FlushError() error {
	if w.status == 0 {
		w.status = http.StatusOK // a flush commits net/http's implicit 200
	}
	switch f := w.ResponseWriter.(type) {
	case interface{ FlushError() error }:
		return f.FlushError()
	case http.Flusher:
		f.Flush()
		return nil
	}
	return http.ErrNotSupported
}

func (w *respWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// countingBody is the request body front hands the handlers: it counts
// the bytes read (http.server.request.body.size: what crossed the wire,
// not what the client declared).
type countingBody struct {
	io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

// logRequest writes the access-log line of r, whose state is st, route
// pattern route ("" when none matched) and status status.
func (s *Server) logRequest(r *http.Request, st *reqState, route string, status int) {
	if r.URL.Path == "/health" || r.URL.Path == "/ready" || !s.log.Enabled(r.Context(), slog.LevelInfo) {
		return
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
	if st.disagg != "" {
		attrs = append(attrs, slog.String("disaggregation", st.disagg))
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
	if st.costNano > 0 {
		attrs = append(attrs, slog.Float64("cost_usd", float64(st.costNano)/1e9))
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
		// A copy: a slice would keep the client's whole header alive for
		// as long as the id is kept (the console's ring of recent
		// requests keeps hundreds).
		id = strings.Clone(id[:MaxRequestIDLen])
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
			if st := stateFrom(r.Context()); st != nil && (st.status != 0 || st.rw.status != 0) {
				// Too late for an error object: abort the connection so the
				// client does not mistake a cut body for a complete one.
				if st.errType == "" {
					st.errType = ErrTypePanic // for the span, metrics and log
				}
				panic(http.ErrAbortHandler)
			}
			writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "internal error"})
		}()
		next.ServeHTTP(w, r)
	})
}
