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
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
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

// proxyHandler is the handler of one operation-table row.
func (s *Server) proxyHandler(op *operation) http.HandlerFunc {
	ot := s.metrics.Operation(op.name)
	return func(w http.ResponseWriter, r *http.Request) {
		if st := stateFrom(r.Context()); st != nil {
			defer func() {
				// The gateway's own time: everything but the waits for the
				// client's body and for the engines (reqState.waited).
				s.metrics.RecordOverhead(r.Context(), ot, (time.Since(st.start) - st.waited).Seconds())
				markServerSpan(r.Context(), st)
			}()
		}
		s.proxy(w, r, op)
	}
}

// markServerSpan records on the server span a request that failed after
// its response had started as a success (a stream cut by the engine, a
// client that went away mid-stream): its status code says 200, so
// error.type says what happened, and a failure that is not the client's
// sets the span's status to Error. (Before the response starts, otelhttp
// records the error status itself.)
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
		span.AddEvent("client went away")
	default:
		span.SetStatus(codes.Error, st.errType)
	}
}

// inbound is a client request as the gateway routes it: its body (kept for
// forwarding and fail-over) and what the route's row says to read from it.
type inbound struct {
	// set is the settings snapshot the request runs under, loaded once
	// when it arrives: a reload never changes a request midway.
	set  *settings
	body []byte
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
	rename []byte
	stream bool
	// observe: a non-streaming request sent to the engine as a stream and
	// reassembled (Config.ObserveNonStreaming).
	observe bool
	// id is the {id} path parameter of a sticky route.
	id string
}

// proxy serves one operation-table route: read and check the request as
// its row says, find the candidates, pick an engine and run attempts until
// one is committed to the client (commit) or there is nothing left to try.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, op *operation) {
	arrived := time.Now()
	var held int64 // bytes of the buffered-bytes budget this request holds
	defer func() { s.buffered.give(held) }()
	in, err := s.read(w, r, op, s.set.Load(), &held)
	if err != nil {
		writeError(w, r, err)
		return
	}
	st := stateFrom(r.Context())
	if st != nil {
		st.model = in.model
	}
	if err := s.authorize(st, in.set, op, in.model); err != nil {
		writeError(w, r, err)
		return
	}
	rt, err := s.candidates(op, &in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	set := in.set
	in.observe = set.cfg.ObserveNonStreaming && op.observe && !in.stream && in.req.Streamable && !in.req.HasStreamOptions
	ctx := r.Context()
	if d := set.cfg.Timeouts.Request; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, errRequestTimeout)
		defer cancel()
	}
	out := s.outgoing(op, &in)
	rreq := routing.Request{Model: in.target, Stream: in.stream, SessionKey: in.req.User, PromptBytes: in.req.PromptBytes, PrefixHashes: in.req.PrefixHashes}
	if set.sessionHeader != "" {
		if v := r.Header[set.sessionHeader]; len(v) > 0 && v[0] != "" {
			rreq.SessionKey = v[0]
		}
	}
	if max := set.cfg.MaxPendingPerModel; max > 0 && in.target != "" && op.class == classGenerative && s.pendingFor(in.target).Load() >= int64(max) {
		writeError(w, r, errOverloaded("too many requests are waiting for model "+strconv.Quote(in.model)))
		return
	}
	grant, err := s.admitKey(w, r, st, op, &in)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if grant != nil {
		defer s.settle(r.Context(), st, grant)
	}
	candidates := rt.eps
	if op.sticky {
		candidates = s.stickyOrder(in.id, rt)
	}
	rs := retryState{s: s, set: set, ctx: r.Context(), sticky: op.sticky, max: set.cfg.MaxAttempts}
	var tried []*routing.Endpoint
	retried := retryNone // why the coming attempt is a retry
	if op.sticky {
		rs.max = len(candidates) // a stored response is looked for on every engine
	}
	if d := set.cfg.Retry.Within; d > 0 {
		rs.deadline = arrived.Add(d)
	}
	defer rs.done()
	for n := 1; ; n++ {
		var ep *routing.Endpoint
		if op.sticky {
			ep = candidates[0]
		} else {
			candidates = admissible(rt, candidates)
			if len(candidates) == 0 {
				// Every engine of the model is at its max_in_flight.
				writeError(w, r, errOverloaded("every engine serving model "+strconv.Quote(in.model)+" is at its limit of requests in flight"))
				return
			}
			t0 := time.Now()
			ep, err = set.policy.Pick(ctx, &rreq, candidates)
			s.metrics.RecordStep(ctx, telemetry.StepPick, time.Since(t0).Seconds())
			if err != nil {
				writeError(w, r, err)
				return
			}
		}
		eng := rt.engineFor(ep)
		if eng == nil { // a policy returned a non-candidate: a bug, not an input
			writeError(w, r, &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "routing policy returned an unknown engine"})
			return
		}
		rs.n, rs.others = n, len(candidates) > 1
		if retried != retryNone { // counted when the retry happens; not a sticky route's lookup of the next engine
			s.metrics.RecordRetry(ctx, retried.String())
		}
		if !s.exchange(ctx, w, r, op, &in, &out, eng, &rs) {
			return
		}
		// The attempt has ended: its context is cancelled and its body
		// closed, so the engine has stopped working on it.
		retried = rs.reason
		tried = append(tried, ep)
		if f, ok := set.policy.(routing.Forgetter); ok && !op.sticky {
			// Nothing reached the client and a retry follows: a policy
			// that learned from sending the prompt there unlearns it,
			// so the prompt's next turn goes to the engine that serves
			// the retry rather than tying with the failing one.
			f.Forget(&rreq, ep)
		}
		if rs.wait > 0 {
			t := time.NewTimer(rs.wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				_, ae := s.classify(r, ctx, context.Cause(ctx))
				writeError(w, r, ae)
				return
			}
		}
		if op.sticky {
			candidates = without(candidates, ep)
			continue
		}
		// The routing view may have changed while the attempt ran (an
		// engine ejected, drained, removed or back): the next attempt
		// picks from the current one, without the engines already tried,
		// or the same engine when it is the only one left.
		if rt, err = s.currentRoute(&in); err != nil {
			writeError(w, r, err)
			return
		}
		candidates = excluding(rt.eps, tried)
		if len(candidates) == 0 && rs.same && slices.Contains(rt.eps, ep) {
			candidates = []*routing.Endpoint{ep}
		}
		if len(candidates) == 0 {
			// Nowhere left to go: the last attempt's own error (a refused
			// connection stays a 502) when it was the gateway's.
			if rs.lastErr != nil {
				writeError(w, r, rs.lastErr)
			} else {
				writeError(w, r, routing.ErrNoEndpoint)
			}
			return
		}
	}
}

// currentRoute returns the route of in's model in the current routing
// snapshot (every routable engine when it names none).
func (s *Server) currentRoute(in *inbound) (*route, error) {
	if in.target == "" {
		snap := s.pool.snap.Load()
		if len(snap.all.eps) == 0 {
			return nil, routing.ErrNoEndpoint
		}
		return &snap.all, nil
	}
	return s.pool.lookup(in.target)
}

// pendingFor returns the counter of model's generative attempts that have
// no first token yet (Config.MaxPendingPerModel), creating it on first
// use; model is a served model name (the route lookup found it), so the
// set is bounded.
func (s *Server) pendingFor(model string) *atomic.Int64 {
	if c, ok := s.pending.Load(model); ok {
		return c.(*atomic.Int64)
	}
	c, _ := s.pending.LoadOrStore(model, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// admissible returns the candidates whose engine is under its
// EngineConfig.MaxInFlight: cands itself when all are (no allocation), a
// new slice otherwise.
func admissible(rt *route, cands []*routing.Endpoint) []*routing.Endpoint {
	if !rt.limited {
		return cands
	}
	full := -1
	for i, ep := range cands {
		if atCapacity(rt, ep) {
			full = i
			break
		}
	}
	if full < 0 {
		return cands
	}
	out := make([]*routing.Endpoint, 0, len(cands)-1)
	out = append(out, cands[:full]...)
	for _, ep := range cands[full+1:] {
		if !atCapacity(rt, ep) {
			out = append(out, ep)
		}
	}
	return out
}

// atCapacity reports whether ep's engine has a MaxInFlight and is at it.
// The limit is the engine's current one: a reload may change it under the
// requests in flight, which count against the new limit.
func atCapacity(rt *route, ep *routing.Endpoint) bool {
	e := rt.engineFor(ep)
	if e == nil {
		return false
	}
	limit := e.maxInFlight.Load()
	if limit <= 0 {
		return false
	}
	pf, dc := ep.InFlight()
	return pf+dc >= limit
}

// read reads and checks the request as op's row says: the body (under the
// size limits), the model and the stream flag. Errors are APIErrors (400,
// 413, 415, 408, 503) or the client's context error; no engine slot is
// taken for any of them.
func (s *Server) read(w http.ResponseWriter, r *http.Request, op *operation, set *settings, held *int64) (in inbound, err error) {
	in.set = set
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

// candidates resolves the request's model (aliases included) to the route
// of engines that serve it, or of every routable engine when it names
// none. Errors: 404 model_not_found, 503 when no engine serving it is
// routable.
func (s *Server) candidates(op *operation, in *inbound) (*route, error) {
	snap := s.pool.snap.Load()
	in.target = in.model
	if in.model == "" {
		if len(snap.all.eps) == 0 {
			return nil, routing.ErrNoEndpoint
		}
		return &snap.all, nil
	}
	if a, ok := snap.aliases[in.model]; ok {
		in.target = a.target
		if op.body == bodyForm {
			in.rename = a.raw
		} else {
			in.rename = a.quoted
		}
	}
	rt, err := s.pool.lookup(in.target)
	if _, ok := err.(*APIError); ok && in.target != in.model {
		return nil, errModelNotFound(in.model) // never name an alias's target
	}
	return rt, err
}

// exchange runs one attempt of the request on eng: it sends the request,
// decides on the result (rs.decide, the one place that does) and, unless
// it is tried again, commits it to the client. It reports whether the
// request should be tried again (rs then says where, after what wait and
// why). Nothing has reached the client then: a result is only what
// arrived before the response is committed.
func (s *Server) exchange(ctx context.Context, w http.ResponseWriter, r *http.Request, op *operation, in *inbound, out *outBody, eng *engine, rs *retryState) (again bool) {
	ctx, a := s.startAttempt(ctx, eng, op, in)
	defer a.finish()
	if in.set.cfg.EngineHeader {
		// Set now, so the gateway's own errors name the engine tried too.
		w.Header()["X-Switchboard-Engine"] = eng.header // shared: no one mutates it
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c := call{set: in.set, op: op, stream: in.stream, observe: in.observe, out: out, a: a, eng: eng, actx: actx, cancel: cancel}
	defer c.stop()
	res := s.send(&c, r, out)
	if res.resp != nil {
		defer res.resp.Body.Close()
	}
	if rs.decide(&res, a.errType) {
		if res.resp != nil && res.resp.ContentLength >= 0 && res.resp.ContentLength <= maxDrain {
			// Read the short answer so the connection is reused; one of
			// unknown length may stall, and is dropped with its connection.
			_, _ = io.CopyN(io.Discard, res.resp.Body, maxDrain)
		}
		return true
	}
	// Held on every attempt, the last one too: a request whose every
	// attempt timed out before content gets a real 504, not a 200 with an
	// error event.
	c.holdFirst = in.stream && !rs.sticky && rs.set.retryOn.has(retryFirstToken)
	s.commit(w, r, &c, &res)
	if c.unsent != nil {
		if rs.decide(&result{err: c.unsent}, c.unsentType) {
			return true
		}
		writeError(w, r, c.unsent)
	}
	return false
}

// maxDrain is how much of an unused engine answer is read before its body
// is closed, so its keep-alive connection can be reused.
const maxDrain = 4 << 10

// call is one engine attempt's request-scoped state, shared by send and
// commit.
type call struct {
	set     *settings
	op      *operation
	stream  bool // the client asked for a stream
	observe bool // a non-streaming request sent as a stream, to reassemble
	out     *outBody
	a       *attempt
	eng     *engine
	actx    context.Context // the attempt's context: cancelled by its timeouts
	cancel  context.CancelCauseFunc
	firstBy time.Time // a stream's first-token deadline; zero when none
	// holdFirst: a first-token timeout may be retried, so the stream
	// sends nothing before its first content event; unsent is then the
	// error of a stream that timed out with nothing sent, for exchange to
	// retry or write.
	holdFirst  bool
	unsent     *APIError
	unsentType string      // unsent's error type
	timer      *time.Timer // a non-streaming answer's attempt timeout
}

// stop stops the attempt timeout.
func (c *call) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// result is what one engine attempt produced before anything reached the
// client: the engine's response (its headers; the body not yet read), or
// the gateway's error for a request that got no response.
type result struct {
	resp *http.Response
	err  *APIError
	// connFailed: the connection to the engine was never established, so
	// the engine did not see the request.
	connFailed bool
}

// send sends the request to the engine and waits for its response headers
// under the gateway's timeouts.
func (s *Server) send(c *call, r *http.Request, body *outBody) result {
	a, eng, op := c.a, c.eng, c.op
	t0 := time.Now()
	url, ok := eng.urls[r.URL.Path]
	if !ok || r.URL.RawPath != "" {
		url = eng.base + r.URL.EscapedPath()
	}
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	var rd io.Reader
	if op.body != bodyNone {
		rd = body.sendReader()
	}
	ureq, err := http.NewRequestWithContext(c.actx, op.method, url, rd)
	if err != nil {
		a.fail(ErrTypeInternal)
		return result{err: &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "could not build the engine request", Err: err}}
	}
	copyRequestHeaders(ureq.Header, r.Header, s.skipReq)
	s.trusted.setForwarded(ureq.Header, r)
	replayOnStaleConn(ureq.Header)
	switch op.body {
	case bodyJSON:
		ureq.ContentLength = body.n
		ureq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.reader()), nil }
		ureq.Header["Content-Type"] = jsonContentType // shared: no one mutates it
	case bodyForm:
		// The client's multipart Content-Type (its boundary), the one
		// value that was parsed.
		ureq.Header["Content-Type"] = r.Header["Content-Type"][:1]
		ureq.ContentLength = body.n
		ureq.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.reader()), nil }
	case bodyNone:
		delete(ureq.Header, "Content-Type")
	}
	ureq.Header.Set(RequestIDHeader, RequestIDFrom(r.Context()))
	if eng.auth != nil {
		ureq.Header["Authorization"] = eng.auth
	}
	s.prop.Inject(c.actx, propagation.HeaderCarrier(ureq.Header))

	if c.stream {
		if d := c.set.cfg.Timeouts.FirstToken; d > 0 {
			c.firstBy = a.start.Add(d)
		}
	} else if d := c.set.cfg.Timeouts.Attempt; d > 0 {
		cancel := c.cancel
		c.timer = time.AfterFunc(d, func() { cancel(errAttemptTimeout) })
	}
	var hdrTimer *time.Timer
	if c.stream {
		// The wait for a stream's headers ends at the response-header
		// timeout or the first-token deadline, whichever comes first.
		cause, d := errHeaderTimeout, c.set.cfg.Timeouts.ResponseHeader
		if !c.firstBy.IsZero() && (d <= 0 || a.start.Add(d).After(c.firstBy)) {
			cause, d = errFirstTokenTimeout, c.firstBy.Sub(a.start)
		}
		if d > 0 {
			cancel := c.cancel
			hdrTimer = time.AfterFunc(d, func() { cancel(cause) })
		}
	}
	sent := time.Now()
	s.metrics.RecordStep(c.actx, telemetry.StepPrepare, sent.Sub(t0).Seconds())
	resp, err := s.client.Transport.RoundTrip(ureq)
	wait := time.Since(sent)
	if st := stateFrom(r.Context()); st != nil {
		st.waited += wait
	}
	if hdrTimer != nil {
		hdrTimer.Stop()
	}
	if err != nil {
		et, ae := s.classify(r, c.actx, err)
		a.fail(et)
		if et == ErrTypeConnect {
			s.pool.markFailed(eng, err)
			return result{err: ae, connFailed: true}
		}
		return result{err: ae}
	}
	a.status = resp.StatusCode
	s.metrics.RecordFirstByte(a.ctx, a.attrs, wait.Seconds())
	// An engine that does not hold a stored response (a sticky route's
	// 404) did nothing wrong: that is not an engine error, on any engine.
	if (resp.StatusCode < 200 || resp.StatusCode > 299) && !(op.sticky && resp.StatusCode == http.StatusNotFound) {
		a.fail(strconv.Itoa(resp.StatusCode))
	}
	return result{resp: resp}
}

// replayOnStaleConn lets net/http send the request again on a new
// connection when a kept-alive one fails before the engine answered a byte
// (Transport: a request is replayed on "a network error if the connection
// has been already used successfully", and a POST is replayed only when
// its header has an Idempotency-Key; a key with no values is not sent).
//
// That is the keep-alive race: the engine closes an idle connection
// (uvicorn, vLLM's server, after 5 s idle; every connection at once when
// the engine stops) while the gateway is taking it from its pool. Nothing
// of the request was processed, yet without this the client got a 502
// engine_disconnect and, with retry.on's default, no retry (reset is opt
// in: a connection closed mid-request may have done work). The replay is
// safe for every engine route here: the engine either closed the idle
// connection unread, or died holding the request, and vLLM keeps nothing
// of a request it did not answer. The replay stays inside the attempt (one
// span, one slot); a new connection that fails again is the engine's
// failure, classified as before. A client's own Idempotency-Key (or
// X-Idempotency-Key) is forwarded untouched and has the same effect.
func replayOnStaleConn(h http.Header) {
	if _, ok := h["Idempotency-Key"]; ok {
		return
	}
	if _, ok := h["X-Idempotency-Key"]; ok {
		return
	}
	h["Idempotency-Key"] = nil
}

// commit writes an attempt's result to the client: the gateway's error in
// the route's envelope, the engine's error status (its body checked and
// put in the route's envelope), or the engine's response relayed as its
// framing says. It is the only place an attempt's outcome reaches the
// client.
func (s *Server) commit(w http.ResponseWriter, r *http.Request, c *call, res *result) {
	if res.err != nil {
		writeError(w, r, res.err)
		return
	}
	resp := res.resp
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		s.passError(w, r, resp, c.eng)
		return
	}
	if c.op.remember {
		defer func() { s.remember(c) }()
	}
	ct := resp.Header.Get("Content-Type")
	switch {
	case c.observe && isEventStream(ct):
		s.reassembleStream(w, r, resp, c)
	case isEventStream(ct):
		if !c.stream {
			// An event stream the client did not flag as one (speech,
			// images): the idle timeout bounds it, not the attempt
			// timeout meant for one-piece answers.
			c.stop()
		}
		s.stream(w, r, resp, c)
	case c.stream && (!isJSON(ct) || resp.ContentLength < 0):
		// Another streamed framing (NDJSON, chunked JSON of unknown
		// length): passed through byte for byte, flushed per write, ended
		// by the body's end.
		s.copyBody(w, r, resp, c, copyStream)
	default:
		s.copyBody(w, r, resp, c, copyWhole)
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
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, held *int64, limit int64, timeout time.Duration) (body []byte, err error) {
	rc := http.NewResponseController(w)
	defer func() {
		if err != nil && err != errBodyEmpty {
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

// outBody is the body sent to an engine: the client's bytes with at most
// two edits (the model an alias stands for, the usage option), as up to
// five slices of the original body and constants, so nothing is copied.
type outBody struct {
	parts [7][]byte // up to three edits
	n     int64
	// injected is set when the usage option was added for a client that
	// did not ask for usage: the usage chunk is then kept from it.
	injected bool
}

// reader returns a reader over the whole body.
func (b *outBody) reader() io.Reader {
	return &partsReader{parts: b.parts}
}

// maxFlatBody is the largest spliced body sendReader copies into one
// buffer.
const maxFlatBody = 64 << 10

// sendReader returns the body for the engine request as a *bytes.Reader
// when it is small or unedited: net/http then writes the request's headers
// and body with one write (for a reader it does not know to be in memory,
// it flushes the headers first: one more syscall per request). A body that
// is not edited is read in place; an edited one up to maxFlatBody is
// copied into one buffer; a larger one is read part by part.
func (b *outBody) sendReader() io.Reader {
	var only []byte
	parts := 0
	for _, p := range b.parts {
		if len(p) > 0 {
			only = p
			parts++
		}
	}
	switch {
	case parts <= 1:
		return bytes.NewReader(only)
	case b.n <= maxFlatBody:
		flat := make([]byte, 0, b.n)
		for _, p := range b.parts {
			flat = append(flat, p...)
		}
		return bytes.NewReader(flat)
	default:
		return b.reader()
	}
}

// partsReader reads byte slices in order.
type partsReader struct {
	parts [7][]byte // up to three edits
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

// edit replaces body[at:end] with ins.
type edit struct {
	at, end int
	ins     []byte
}

// splice builds the outBody of body with edits, which are in body order
// and do not overlap.
func splice(body []byte, edits ...edit) outBody {
	var out outBody
	prev, k := 0, 0
	for _, e := range edits {
		out.parts[k], out.parts[k+1] = body[prev:e.at], e.ins
		k += 2
		prev = e.end
	}
	out.parts[k] = body[prev:]
	for _, p := range out.parts {
		out.n += int64(len(p))
	}
	return out
}

// Usage options inserted into a streamed request body whose client did not
// ask for usage (stream_options absent, null, {} or include_usage
// false/null).
var (
	usageOption       = []byte(`,"stream_options":{"include_usage":true}}`)               // replaces the body's closing brace
	streamUsageOption = []byte(`,"stream":true,"stream_options":{"include_usage":true}}`) // the same, for a body without stream
	jsonTrue          = []byte(`true`)
	usageMember       = []byte(`,"include_usage":true`) // added last in a non-empty stream_options
	usageMemberAlone  = []byte(`"include_usage":true`)  // into an empty one
)

// outgoing returns the engine body of a request: the client's bytes, with
// the model replaced when the client named an alias, and, with
// Config.InjectUsage on a route that allows it, a stream whose client did
// not ask for usage (and did not set continuous_usage_stats) given
// stream_options.include_usage=true: added as the last member of its
// stream_options object (the last duplicate key wins in every JSON parser
// engines use, so a false include_usage before it is overridden and other
// options such as continuous_usage_stats stay), or as a new stream_options
// in place of the body's closing brace when it has none (or null).
func (s *Server) outgoing(op *operation, in *inbound) outBody {
	body := in.body
	var edits [3]edit
	n := 0
	if in.rename != nil {
		switch op.body {
		case bodyJSON:
			if in.req.ModelEnd > 0 {
				edits[n] = edit{in.req.ModelStart, in.req.ModelEnd, in.rename}
				n++
			}
		case bodyForm:
			if in.form.ModelEnd > 0 {
				edits[n] = edit{in.form.ModelStart, in.form.ModelEnd, in.rename}
				n++
			}
		}
	}
	req := &in.req
	// closing is the edit that replaces the body's closing brace (the
	// parser checked the object) with ins.
	closing := func(ins []byte) edit {
		end := len(body)
		for end > 0 && (body[end-1] == ' ' || body[end-1] == '\n' || body[end-1] == '\r' || body[end-1] == '\t') {
			end--
		}
		return edit{end - 1, len(body), ins}
	}
	// With vLLM's continuous_usage_stats every chunk would carry usage the
	// client did not ask for, and only usage-only chunks can be kept from
	// it: such a stream is left as the client sent it.
	inject := in.set.cfg.InjectUsage && op.injectUsage && op.body == bodyJSON && req.Stream && !req.IncludeUsage && !req.ContinuousUsage
	switch {
	case in.observe:
		// A non-streaming request asked for as a stream with usage; it
		// has no stream_options (in.observe requires it).
		if req.StreamEnd > 0 {
			edits[n] = edit{req.StreamStart, req.StreamEnd, jsonTrue}
			n++
			edits[n] = closing(usageOption)
		} else {
			edits[n] = closing(streamUsageOption)
		}
		n++
	case inject:
		if req.HasStreamOptions {
			at := req.StreamOptionsEnd
			ins := usageMember
			if req.StreamOptionsEmpty {
				ins = usageMemberAlone
			}
			edits[n] = edit{at, at, ins}
		} else {
			edits[n] = closing(usageOption)
		}
		n++
	}
	// In body order (insertion sort of at most three).
	for i := 1; i < n; i++ {
		for j := i; j > 0 && edits[j].at < edits[j-1].at; j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
	out := splice(body, edits[:n]...)
	out.injected = inject || in.observe
	return out
}

// jsonContentType is the Content-Type value of every engine request: the
// body has been checked to be a JSON object, whatever the client declared.
var jsonContentType = []string{"application/json"}

// classify maps an engine round-trip or body-read error to its error.type
// and the APIError the client gets. The client leaving wins over every
// other cause; then the gateway's own timeouts, when err is the timeout's
// doing (endedBy); a failed dial is a connect_error (the only retryable
// class); anything else means the engine dropped the connection.
func (s *Server) classify(r *http.Request, actx context.Context, err error) (string, *APIError) {
	if r.Context().Err() != nil {
		if context.Cause(r.Context()) == errServerShutdown {
			return ErrTypeShutdown, &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: ErrTypeShutdown, Message: "the gateway is shutting down", Err: err}
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
// Retry-After), its body in the route's error envelope. A body that already
// is an error object of that envelope passes unchanged: on OpenAI routes
// any {"error":{...}}, on Anthropic routes {"type":"error","error":{...}}.
// A JSON error of another shape (vLLM's older {"object":"error",
// "message":...}, {"error":"..."}, FastAPI's {"detail":...}, the other
// envelope) is rewritten in the route's envelope with its message, so
// clients always get the error shape their SDK parses (shared/cases L15).
// Anything else (an HTML page, a stack trace, plain text, nothing) is not
// safe to show: it is replaced by an error naming the engine and the
// status, and the original, capped, is logged at debug level.
func (s *Server) passError(w http.ResponseWriter, r *http.Request, resp *http.Response, eng *engine) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
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
		return
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
