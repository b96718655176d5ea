package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/telemetry"
	"go.opentelemetry.io/otel/propagation"
)

// exchange runs one leg of the request on eng: it starts the attempt
// (span, slot, timers), sends the request, asks the planner (p.next, the
// one place that decides) what follows the engine's answer and, unless
// another leg follows, relays that answer to the client. It returns the
// next leg, or legNone and the error the client is to get (nil when the
// answer was relayed, or when the relay failed after bytes reached the
// client and ended the response itself). A leg followed by another has
// sent nothing to the client.
func (s *Server) exchange(ctx context.Context, w http.ResponseWriter, r *http.Request, op *operation, in *inbound, out *outBody, eng *fleet.Engine, p *plan) (nextLeg, error) {
	p.cr.restart() // a leg before it reached nothing of the client
	ctx, a := s.startAttempt(ctx, eng, op, in)
	defer a.finish()
	if d := p.pd; d != nil && d.mode != telemetry.DisaggModeAggregated {
		// A decode leg: the client's wait began before it.
		a.pd, a.carried = d, out == &d.body
		if a.span.IsRecording() {
			a.span.SetAttributes(telemetry.AttrLeg.String("decode"))
		}
	}
	if eng.IsProvider() {
		// A provider sends no token ids and takes no vLLM continuation:
		// its stream, if it breaks, ends there.
		if p.cr != nil {
			p.cr.exclude(exclProvider)
		}
		if !a.carried {
			pb := s.engineOut(op, in, eng, false)
			out = &pb
		}
	}
	if in.set.cfg.EngineHeader {
		// Set now, so the gateway's own errors name the engine tried too.
		w.Header()["X-Switchboard-Engine"] = eng.Header() // shared: no one mutates it
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	c := call{set: in.set, op: op, target: in.target, stream: in.stream, observe: in.observe, out: out, a: a, eng: eng, actx: actx, cancel: cancel, cr: p.cr}
	defer c.stop()
	o := s.send(&c, r, out)
	if o.resp != nil {
		defer o.resp.Body.Close()
	}
	if a.carried && !o.connFailed {
		a.pd.sent = true // the engine got the params (and may have read the KV)
	}
	o.errType = a.errType
	if next := p.next(&o); next.kind != legNone {
		if o.resp != nil && o.resp.ContentLength >= 0 && o.resp.ContentLength <= maxDrain {
			// Read the short answer so the connection is reused; one of
			// unknown length may stall, and is dropped with its connection.
			_, _ = io.CopyN(io.Discard, o.resp.Body, maxDrain)
		}
		return next, nil
	}
	switch {
	case o.err != nil:
		return nextLeg{}, o.err
	case o.resp.StatusCode == http.StatusTooManyRequests && eng.IsProvider():
		return nextLeg{}, providerLimited(w, o.resp, eng, o.backedOff)
	case o.resp.StatusCode < 200 || o.resp.StatusCode > 299:
		return nextLeg{}, s.passError(w, r, o.resp, eng)
	}
	// Held on every leg, the last one too: a request whose every leg
	// timed out before content gets a real 504, not a 200 with an error
	// event.
	c.holdFirst = in.stream && !p.sticky && in.set.retryOn.has(retryFirstToken)
	ae, k := s.relay(w, r, &c, o.resp)
	if k != nil {
		// The stream broke after bytes reached the client: continued on
		// another engine, or ended here.
		if p.cr != nil {
			p.cr.link, p.cr.cut = a.span.SpanContext(), k
		}
		if next := p.next(&outcome{stage: stageCut, cut: k, errType: a.errType}); next.kind != legNone {
			return next, nil
		}
		if in.observe {
			return nextLeg{}, k.err // a whole answer: nothing was sent yet
		}
		s.answerComplete(r)
		endCut(w, k, op.framing)
		return nextLeg{}, nil
	}
	if ae == nil {
		return nextLeg{}, nil
	}
	// Nothing reached the client.
	ro := outcome{stage: stageRelay, err: ae, errType: a.errType, held: c.holdFirst}
	if next := p.next(&ro); next.kind != legNone {
		return next, nil
	}
	return nextLeg{}, ae
}

// maxDrain is how much of an unused engine answer is read before its body
// is closed, so its keep-alive connection can be reused.
const maxDrain = 4 << 10

// call is one engine attempt's request-scoped state, shared by send and
// commit.
type call struct {
	set     *settings
	op      *operation
	target  string // the engine model the request is on (a provider's URL may name it)
	stream  bool   // the client asked for a stream
	observe bool   // a non-streaming request sent as a stream, to reassemble
	out     *outBody
	a       *attempt
	eng     *fleet.Engine
	actx    context.Context // the attempt's context: cancelled by its timeouts
	cancel  context.CancelCauseFunc
	firstBy time.Time // a stream's first-token deadline; zero when none
	// holdFirst: a first-token timeout may be retried, so the stream
	// sends nothing before its first content event.
	holdFirst bool
	timer     *time.Timer // a non-streaming answer's attempt timeout
	// cr is the request's continuation state on a continuable route
	// (nil otherwise); resumed is set on a continuation leg, whose
	// request goes to path (not the client's) and whose stream is
	// appended to a response that has started.
	cr      *carry
	path    string
	resumed bool
}

// maxReplays caps how often net/http sends one leg's request again
// (replayOnStaleConn).
const maxReplays = 1

// errReplayed ends a leg whose request was already sent again once on
// another connection and failed there too: the engine read it twice and
// answered neither (classified engine_disconnect).
var errReplayed = errors.New("the engine closed the connection before answering, twice")

// rewind is the engine request's GetBody: net/http calls it for each
// re-send of the request on another connection (replayOnStaleConn). The
// first re-send gets the body again; a second gets errReplayed, which ends
// the round trip, so one failing request is not sent through every idle
// connection of the pool.
func (b *outBody) rewind() (io.ReadCloser, error) {
	b.replays++
	if b.replays > maxReplays {
		return nil, errReplayed
	}
	return io.NopCloser(b.reader()), nil
}

// stop stops the attempt timeout.
func (c *call) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// send sends the request to the engine and waits for its response headers
// under the gateway's timeouts.
func (s *Server) send(c *call, r *http.Request, body *outBody) outcome {
	a, eng, op := c.a, c.eng, c.op
	t0 := time.Now()
	var url string
	switch {
	case c.path != "":
		url = eng.Base() + c.path
	case eng.IsProvider():
		model := c.target
		if name, _, ok := eng.MapModel(model); ok {
			model = name
		}
		url = eng.RequestURL(r.URL.Path, r.URL.RawQuery, model)
	default:
		var ok bool
		url, ok = eng.PathURL(r.URL.Path)
		if !ok || r.URL.RawPath != "" {
			url = eng.Base() + r.URL.EscapedPath()
		}
		if r.URL.RawQuery != "" {
			url += "?" + r.URL.RawQuery
		}
	}
	var rd io.Reader
	if op.body != bodyNone {
		rd = body.sendReader()
	}
	ureq, err := http.NewRequestWithContext(c.actx, op.method, url, rd)
	if err != nil {
		a.fail(ErrTypeInternal)
		return outcome{err: &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "could not build the engine request", Err: err}}
	}
	copyRequestHeaders(ureq.Header, r.Header, s.skipReq)
	if eng.IsProvider() {
		// A hosted API learns nothing of the client's network or of an
		// account the client named: the gateway's key is the account.
		for _, k := range providerDropped {
			delete(ureq.Header, k)
		}
	} else {
		s.trusted.setForwarded(ureq.Header, r)
	}
	replayOnStaleConn(ureq.Header)
	body.replays = 0 // this leg's re-sends (rewind)
	switch op.body {
	case bodyJSON:
		ureq.ContentLength = body.n
		ureq.GetBody = body.rewind
		ureq.Header["Content-Type"] = jsonContentType // shared: no one mutates it
	case bodyForm:
		// The client's multipart Content-Type (its boundary), the one
		// value that was parsed.
		ureq.Header["Content-Type"] = r.Header["Content-Type"][:1]
		ureq.ContentLength = body.n
		ureq.GetBody = body.rewind
	case bodyNone:
		delete(ureq.Header, "Content-Type")
	}
	ureq.Header.Set(RequestIDHeader, RequestIDFrom(r.Context()))
	eng.SetAuth(ureq.Header, r.URL.Path)
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
	rt := s.client.Transport
	if own := eng.Transport(); own != nil {
		rt = own
	}
	resp, err := rt.RoundTrip(ureq)
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
			s.fleet.MarkFailed(eng, err)
			return outcome{err: ae, connFailed: true}
		}
		return outcome{err: ae}
	}
	a.status = resp.StatusCode
	s.metrics.RecordFirstByte(a.ctx, a.attrs, wait.Seconds())
	var backedOff time.Duration
	if eng.IsProvider() {
		var o outcome
		var done bool
		if o, done, backedOff = s.providerAnswer(c, r, resp); done {
			return o
		}
	}
	// An engine that does not hold a stored response (a sticky route's
	// 404) did nothing wrong: that is not an engine error, on any engine.
	if (resp.StatusCode < 200 || resp.StatusCode > 299) && !(op.sticky && resp.StatusCode == http.StatusNotFound) {
		a.fail(strconv.Itoa(resp.StatusCode))
	}
	return outcome{resp: resp, backedOff: backedOff}
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
//
// The lean engine client (internal/h1, the default) follows the same rule
// and re-sends once, on a new connection. net/http sends the request again
// on the next connection of its pool, which may be stale too, and again
// until one fails that was new: a request that an engine reads and then
// drops (a close before headers, an engine that dies on it) would be sent
// through every idle connection to it. rewind caps that at one re-send per
// leg (maxReplays) with either client; a body-less request is never
// re-read, so net/http re-sends it without asking.
func replayOnStaleConn(h http.Header) {
	if _, ok := h["Idempotency-Key"]; ok {
		return
	}
	if _, ok := h["X-Idempotency-Key"]; ok {
		return
	}
	h["Idempotency-Key"] = nil
}

// relay relays an engine's 2xx answer to the client as its framing says
// (an event stream, another streamed framing, or one body). It returns
// the error the client is to get when the relay failed before anything
// reached it, nil otherwise (a relay cut after its first byte ends the
// response itself: an error event, or an aborted body).
func (s *Server) relay(w http.ResponseWriter, r *http.Request, c *call, resp *http.Response) (*APIError, *cut) {
	if c.op.remember {
		defer func() { s.remember(c) }()
	}
	ct := resp.Header.Get("Content-Type")
	switch {
	case c.observe && isEventStream(ct):
		return s.reassembleStream(w, r, resp, c)
	case isEventStream(ct):
		if !c.stream {
			// An event stream the client did not flag as one (speech,
			// images): the idle timeout bounds it, not the attempt
			// timeout meant for one-piece answers.
			c.stop()
		}
		return s.stream(w, r, resp, c)
	}
	// Only an event stream is held back before its first token.
	c.holdFirst = false
	if c.observe {
		// Asked for a stream, the engine answered one body: it is
		// relayed, and accounted, as one.
		c.a.stream = false
	}
	switch {
	case c.stream && (!isJSON(ct) || resp.ContentLength < 0):
		// Another streamed framing (NDJSON, chunked JSON of unknown
		// length): passed through byte for byte, flushed per write, ended
		// by the body's end.
		return s.copyBody(w, r, resp, c, copyStream), nil
	default:
		return s.copyBody(w, r, resp, c, copyWhole), nil
	}
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	return len(ct) >= 17 && strings.EqualFold(ct[:17], "text/event-stream")
}

// isJSON reports whether a Content-Type is application/json (any params).
func isJSON(ct string) bool {
	return len(ct) >= 16 && strings.EqualFold(ct[:16], "application/json")
}
