package gateway

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// proxyHandler is the handler of one operation-table row.
func (s *Server) proxyHandler(op *operation) http.HandlerFunc {
	ot := s.metrics.Operation(op.name)
	proxy := door(func(w http.ResponseWriter, r *http.Request) error { return s.proxy(w, r, op) })
	return func(w http.ResponseWriter, r *http.Request) {
		if st := stateFrom(r.Context()); st != nil {
			defer func() {
				// The gateway's own time: everything but the waits for the
				// client's body and for the engines (reqState.waited).
				s.metrics.RecordOverhead(r.Context(), ot, (time.Since(st.start) - st.waited).Seconds())
			}()
		}
		proxy(w, r)
	}
}

// proxy serves one operation-table route: it reads and checks the request
// as its row says, finds the candidates, and runs the request's plan, one
// leg (exchange) at a time, until a leg's answer is relayed or nothing is
// left to try. It returns the error the client is to get, nil when the
// response has been written; it never writes an error itself.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, op *operation) error {
	arrived := time.Now()
	var held int64 // bytes of the buffered-bytes budget this request holds
	defer func() { s.buffered.give(held) }()
	in, err := s.read(w, r, op, s.set.Load(), &held)
	if err != nil {
		return err
	}
	st := stateFrom(r.Context())
	if st != nil {
		st.model = in.model
	}
	if err := s.authorize(st, in.set, op, in.model); err != nil {
		return err
	}
	rt, err := s.candidates(op, &in)
	set := in.set
	if in.req.KVTransfer && (op.migrate == migrateChat || op.migrate == migrateCompletion) &&
		(set.cfg.Disaggregation.Enabled || (err == nil && rt.Disaggregable())) {
		return errClientKVParams
	}
	p := plan{set: set, ctx: r.Context(), sticky: op.sticky, max: set.cfg.MaxAttempts, budget: &s.retries, metrics: s.metrics, now: time.Now,
		fb: s.fallbacksFor(op, &in)}
	if d := set.cfg.Retry.Within; d > 0 {
		p.deadline = arrived.Add(d)
	}
	defer p.done()
	var first nextLeg // a fallback before any leg: the model cannot take the request
	switch {
	case err != nil:
		// No engine of the model is routable (or none serves it now).
		if first = p.fallback(fallbackUnavailable); first.kind == legNone {
			return err
		}
	case op.class == classGenerative:
		p.fb.maxLen = rt.MaxModelLen()
		if ae := overContext(in.req.MaxTokensParam, in.req.MaxTokens, p.fb.maxLen); ae != nil {
			if first = p.fallback(fallbackContext); first.kind == legNone {
				return ae
			}
		}
	}
	in.observe = observes(op, &in)
	ctx := r.Context()
	if d := set.cfg.Timeouts.Request; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, d, errRequestTimeout)
		defer cancel()
	}
	if p.cr = newCarry(op, &in); p.cr != nil {
		defer func() { s.buffered.give(p.cr.buffered) }()
		if len(p.fb.general) > 0 && !p.sticky && (op.migrate != migrateCompletion || textPrompt(in.body)) {
			// A break with no engine of the model left may cross to a
			// fallback model, from the text the client got.
			p.cr.keepText = true
		}
	}
	in.capOut = spendCap(st, op, &in)
	out := s.outgoing(op, &in, p.cr.asksIDs())
	rreq := routing.Request{Model: in.target, Stream: in.stream, SessionKey: in.req.User, PromptBytes: in.req.PromptBytes, PrefixHashes: in.req.PrefixHashes}
	if set.sessionHeader != "" {
		if v := r.Header[set.sessionHeader]; len(v) > 0 && v[0] != "" {
			rreq.SessionKey = v[0]
		}
	}
	if first.kind == legFallback {
		rt = s.fallTo(w, r, op, &in, &out, &rreq, &p, first.fallback)
	}
	if max := set.cfg.MaxPendingPerModel; max > 0 && in.target != "" && op.class == classGenerative && s.pendingFor(in.target).Load() >= int64(max) {
		return errOverloaded("too many requests are waiting for model " + strconv.Quote(in.model))
	}
	grant, err := s.admitKey(w, r, st, op, &in)
	if err != nil {
		return err
	}
	if grant != nil {
		defer s.settle(r.Context(), st, grant)
	}
	if set.kvBlocks > 0 && s.tok != nil && set.kvBlocks == s.tok.blockSize && first.kind != legFallback {
		s.tokenKeys(ctx, op, &in, rt, &rreq)
	}
	candidates := legCands(op, rt)
	if op.sticky {
		candidates = s.stickyOrder(in.id, rt, op)
		if len(candidates) == 0 {
			return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found",
				Message: "no engine that serves " + op.paths[0] + " is available"}
		}
		p.max = len(candidates) // a stored response is looked for on every engine
	}
	// pre is the engine the first leg goes to when a disaggregation
	// decision picked it (the decode engine picked first).
	var pre *routing.Endpoint
	if first.kind != legFallback && op.class == classGenerative {
		d, err := s.decideDisagg(ctx, op, &in, rt, &rreq)
		if err != nil {
			return err
		}
		if d != nil {
			pre, p.pd = d.decode, d
			defer d.done(ctx, s.metrics)
			if d.mode == telemetry.DisaggModeDisaggregated {
				stop, fromLeg, err := s.prefill(ctx, w, r, op, &in, rt, &rreq, &p, d)
				if stop {
					// Counted as decided: the prefill failed, or the client left.
					s.metrics.RecordDisaggregation(ctx, d.mode)
					if st != nil {
						st.disagg = d.mode
						st.legAnswer = fromLeg && err != nil
					}
					return err
				}
				p.legs = 0 // the decode legs have the request's attempts
			}
			s.metrics.RecordDisaggregation(ctx, d.mode)
			if st != nil {
				st.disagg = d.mode
			}
		}
	}
	var tried []*routing.Endpoint
	leg := nextLeg{kind: legAttempt}
	usable, usableSelf := 0, 0 // admit's counts of the engines a leg, a continuation, could go to now
	for {
		var ep *routing.Endpoint
		if op.sticky {
			ep = candidates[0]
		} else {
			if leg.kind == legContinue {
				// A continuation re-sends token ids or a vLLM
				// continue_final_message: a provider takes neither. Left
				// out before the tier is chosen, so a self-hosted engine
				// only over its queue depth still continues.
				candidates = selfHosted(rt, candidates)
			}
			var ad admission
			candidates, ad = admit(rt, candidates, op.name, time.Now())
			usable, usableSelf = ad.usable, ad.usableSelf
			if ad.unsupported && len(tried) == 0 {
				return errUnsupportedByEngines(op, in.model)
			}
			if ad.spill >= 0 && !p.spilled && (leg.kind == legAttempt || leg.kind == legNone) && len(candidates) > 0 {
				// An overflow is the first leg's: a retry that goes up a
				// tier is a fallback (tiers.leg).
				p.spilled = true
				if e := rt.Engine(candidates[0]); e != nil {
					s.tiers.overflow(ctx, s.metrics, ad.spill, e.Tier())
				}
			}
			if len(candidates) == 0 && leg.kind == legContinue {
				if nrt := s.cross(w, r, op, &in, &out, &rreq, &p); nrt != nil {
					rt, candidates, tried = nrt, legCands(op, nrt), tried[:0]
					continue
				}
				return s.unresumed(w, op, &p)
			}
			if len(candidates) == 0 {
				// Every engine of the model is at its max_in_flight.
				if next := p.fallback(fallbackUnavailable); next.kind == legFallback {
					rt = s.fallTo(w, r, op, &in, &out, &rreq, &p, next.fallback)
					candidates, tried = legCands(op, rt), tried[:0]
					leg = nextLeg{}
					continue
				}
				return errOverloaded("every engine serving model " + strconv.Quote(in.model) + " is at its limit of requests in flight or backing off its provider's rate limit")
			}
			if pre != nil && slices.Contains(candidates, pre) {
				ep, err = pre, nil
			} else {
				t0 := time.Now()
				ep, err = set.policy.Pick(ctx, &rreq, candidates)
				s.metrics.RecordStep(ctx, telemetry.StepPick, time.Since(t0).Seconds())
				in.kvOn, in.kvPredicted = ep, rreq.PredictedCached()
				if n, bs := in.kvPromptTokens, set.kvBlocks; n > 0 && bs > 0 {
					// An engine computes a prompt found whole from its last
					// token again, for its logits: it reports at most the
					// whole blocks before that token cached (vLLM's
					// get_computed_blocks).
					in.kvPredicted = min(in.kvPredicted, (n-1)/bs*bs)
				}
			}
			pre = nil
			if err != nil {
				if leg.kind == legContinue {
					if nrt := s.cross(w, r, op, &in, &out, &rreq, &p); nrt != nil {
						rt, candidates, tried = nrt, legCands(op, nrt), tried[:0]
						continue
					}
					return s.unresumed(w, op, &p)
				}
				return err
			}
		}
		eng := rt.Engine(ep)
		if eng == nil { // a policy returned a non-candidate: a bug, not an input
			return &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "routing policy returned an unknown engine"}
		}
		p.legs++
		if !op.sticky { // a sticky route's next engine is a lookup, not traffic
			s.tiers.leg(ctx, s.metrics, &p, eng.Tier(), leg.kind == legRetry)
		}
		p.others = len(candidates) > 1 || usable > 1
		if p.cr != nil {
			// Worth holding an engine's own end back: another engine of
			// the model (self-hosted: a provider continues nothing), or a
			// fallback model, could continue.
			p.cr.others = usableSelf > 1 || p.crossable()
		}
		if leg.reason != retryNone { // counted when the retry happens; not a sticky route's lookup of the next engine
			s.metrics.RecordRetry(ctx, leg.reason.String())
		}
		if leg.kind == legContinue {
			if leg, err = s.continuation(ctx, w, r, op, &in, eng, &p); leg.kind == legNone {
				return err // nil once the client's response has started: it was ended there
			}
		} else {
			legOut := &out
			if d := p.pd; d != nil && d.params != nil && (leg.kind == legAttempt || leg.reason == retryConnect && !d.sent) && pairs(eng, d.group) {
				// The decode leg, or its retry after an engine that never
				// got it: the prefill engine still holds the KV cache. A
				// retry after a decode engine that got the request goes
				// as the client's request: that engine may have read the
				// KV cache, which vLLM frees once read. So does a leg on
				// an engine of another group than the prefill engine's,
				// which could not reach it.
				if legOut, err = d.decodeBody(&out); err != nil {
					return &APIError{Status: http.StatusInternalServerError, Type: TypeServer, Code: "internal_error", Message: "could not build the decode request", Err: err}
				}
			}
			if leg, err = s.exchange(ctx, w, r, op, &in, legOut, eng, &p); leg.kind == legNone {
				if err != nil && st != nil {
					st.legAnswer = true
				}
				return err
			}
		}
		// The leg has ended: its context is cancelled and its body
		// closed, so the engine has stopped working on it.
		if leg.kind == legFallback {
			// Another model: its own engines, its own attempts.
			rt = s.fallTo(w, r, op, &in, &out, &rreq, &p, leg.fallback)
			candidates, tried = legCands(op, rt), tried[:0]
			leg = nextLeg{}
			continue
		}
		tried = append(tried, ep)
		if f, ok := set.policy.(routing.Forgetter); ok && !op.sticky && leg.kind == legRetry {
			// Nothing reached the client and a retry follows: a policy
			// that learned from sending the prompt there unlearns it,
			// so the prompt's next turn goes to the engine that serves
			// the retry rather than tying with the failing one.
			f.Forget(&rreq, ep)
		}
		if ae := s.pause(ctx, r, leg.wait); ae != nil {
			return ae
		}
		if op.sticky {
			candidates = without(candidates, ep)
			continue
		}
		// The routing view may have changed while the leg ran (an engine
		// ejected, drained, removed or back): the next leg picks from the
		// current one, without the engines already tried, or the same
		// engine when it is the only one left.
		cur, err := s.currentRoute(&in)
		if err == nil {
			rt = cur
			candidates = excluding(legCands(op, rt), tried)
			if len(candidates) == 0 && leg.same && slices.Contains(legCands(op, rt), ep) {
				candidates = []*routing.Endpoint{ep}
			}
		}
		if leg.kind == legContinue && (len(candidates) == 0 || err != nil) {
			// No engine of the model is left: a fallback model may
			// continue from the text (its tokenizer need not read the
			// ids), or the stream ends.
			if nrt := s.cross(w, r, op, &in, &out, &rreq, &p); nrt != nil {
				rt, candidates, tried = nrt, legCands(op, nrt), tried[:0]
				continue
			}
			return s.unresumed(w, op, &p)
		}
		if len(candidates) == 0 || err != nil {
			// Nowhere left to go on this model: another one, or the last
			// leg's own error (a refused connection stays a 502) when it
			// was the gateway's.
			if next := p.fallback(fallbackFailed); next.kind == legFallback {
				rt = s.fallTo(w, r, op, &in, &out, &rreq, &p, next.fallback)
				candidates, tried = legCands(op, rt), tried[:0]
				leg = nextLeg{}
				continue
			}
			switch {
			case err != nil:
				return err
			case p.lastErr != nil:
				return p.lastErr
			}
			return routing.ErrNoEndpoint
		}
	}
}

// unresumed ends a broken stream whose continuation found no engine to go
// to (every other engine gone, full or refused by the policy since the
// planner decided): counted as no_engine, and ended as without
// continuation. A streaming client's response has started, so there is no
// error to return; a non-streaming client's error is returned.
func (s *Server) unresumed(w http.ResponseWriter, op *operation, p *plan) error {
	k := p.cr.cut
	s.metrics.RecordMigration(p.ctx, k.reason, migrationNoEngine)
	if p.cr.ra != nil {
		return k.err // a whole answer: nothing was sent yet
	}
	if st := stateFrom(p.ctx); st != nil {
		s.leaseBack(p.ctx, &st.grant)
	}
	endCut(w, k, op.framing)
	return nil
}

// pause waits d (a retry's back-off; nothing when d <= 0) unless ctx ends
// first, and then returns the client's error for its cause (499 for a
// client that left, 504 for the request timeout).
func (s *Server) pause(ctx context.Context, r *http.Request, d time.Duration) *APIError {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		_, ae := s.classify(r, ctx, context.Cause(ctx))
		return ae
	}
}

// legCands returns the engines of rt a leg of op may go to: for a
// generative route, those that may generate a whole answer (not the
// prefill-only engines: fleet.Route.Decode), else every one. Shared
// slices: never modified.
func legCands(op *operation, rt *fleet.Route) []*routing.Endpoint {
	if op.class == classGenerative {
		return rt.Decode()
	}
	return rt.Endpoints()
}

// currentRoute returns the route of in's model in the current routing
// snapshot (every routable engine when it names none).
func (s *Server) currentRoute(in *inbound) (*fleet.Route, error) {
	if in.target == "" {
		snap := s.fleet.Snapshot()
		return allRoute(snap)
	}
	rt, err := s.fleet.Lookup(in.target)
	return rt, lookupError(in.model, err) // never name an alias's target
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

// admissible returns the candidates a leg may go to now (admit, for no
// operation in particular).
func admissible(rt *fleet.Route, cands []*routing.Endpoint) []*routing.Endpoint {
	out, _ := admit(rt, cands, "", time.Now())
	return out
}

// admission is what admit found besides the candidates it returned.
type admission struct {
	// spill is the lowest tier of the serving candidates when the
	// candidates are of a higher one (an overflow), else -1.
	spill int
	// unsupported: no candidate serves the operation.
	unsupported bool
	// usable counts the candidates, of any tier, that serve the
	// operation and could take a leg now (room, or only over their queue
	// depth): whether another engine than the one picked is left (the
	// planner's others) reads it, not the narrowed candidates.
	usable int
	// usableSelf counts those of usable that are self-hosted: the
	// engines a continuation could go to.
	usableSelf int
}

// room is how an engine can take a new request.
type room int

const (
	roomNone   room = iota // at its max_in_flight, or a provider backing off
	roomQueued             // its fresh stats' queue is at its max_queue_depth
	roomFree
)

// roomOf returns e's room at now.
func roomOf(e *fleet.Engine, ep *routing.Endpoint, now time.Time) room {
	if limit := e.MaxInFlight(); limit > 0 {
		if pf, dc := ep.InFlight(); pf+dc >= limit {
			return roomNone
		}
	}
	if e.BackingOff(now) {
		return roomNone
	}
	if q := e.MaxQueueDepth(); q > 0 {
		if st := ep.Stats(); st.Fresh(now) && st.Waiting >= q {
			return roomQueued
		}
	}
	return roomFree
}

// admitMemo is how many candidates admit remembers between its passes:
// more than a model's engines in most fleets.
const admitMemo = 32

// admit returns the candidates a leg of operation op (its name; "" for
// any) may go to at now: the engines that serve op (a provider serves
// its API's routes only), of the lowest tier that has one with room
// (under its max_in_flight and max_queue_depth, not backing off a
// provider's 429), and of those the ones with room; when no engine has
// room but some are only over their queue depth, the lowest tier of
// those (a queue is not a refusal). cands itself when all qualify (no
// allocation), a new slice otherwise, empty when every engine is full;
// and what it found (admission).
func admit(rt *fleet.Route, cands []*routing.Endpoint, op string, now time.Time) (out []*routing.Endpoint, ad admission) {
	ad.spill = -1
	if !rt.Limited() && !rt.Tiered() {
		ad.usable, ad.usableSelf = len(cands), len(cands) // a route with a provider is limited
		return cands, ad
	}
	const none = int(^uint(0) >> 1)
	lowest, free, queued, served := none, none, none, 0
	// What the first pass found of each candidate, for the second: a
	// candidate is kept on the same reading of its room (counts move
	// under concurrent requests), and nothing is looked up twice. The
	// first admitMemo candidates; any beyond are read again.
	var memo [admitMemo]struct {
		e    *fleet.Engine // nil: not read yet, or not serving op
		tier int
		room room
	}
	// look returns ep's engine (nil when it does not serve op), tier and
	// room, the i-th candidate's from memo when read already.
	look := func(i int, ep *routing.Endpoint) (*fleet.Engine, int, room) {
		if i < admitMemo && memo[i].e != nil {
			return memo[i].e, memo[i].tier, memo[i].room
		}
		e := rt.Engine(ep)
		if e == nil || op != "" && !e.ServesOperation(op) {
			return nil, 0, roomNone
		}
		return e, e.Tier(), roomOf(e, ep, now)
	}
	for i, ep := range cands {
		e, t, r := look(i, ep)
		if e == nil {
			continue
		}
		if i < admitMemo {
			memo[i].e, memo[i].tier, memo[i].room = e, t, r
		}
		served++
		lowest = min(lowest, t)
		switch r {
		case roomFree:
			free = min(free, t)
			queued = min(queued, t)
		case roomQueued:
			queued = min(queued, t)
		default:
			continue
		}
		ad.usable++
		if !e.IsProvider() {
			ad.usableSelf++
		}
	}
	if served == 0 {
		ad.unsupported = len(cands) > 0
		return nil, ad
	}
	tier, want := free, roomFree
	if free == none {
		tier, want = queued, roomQueued
	}
	if tier == none {
		return nil, ad
	}
	if tier > lowest {
		ad.spill = lowest
	}
	keep := func(i int, ep *routing.Endpoint) bool {
		e, t, r := look(i, ep)
		return e != nil && t == tier && r >= want
	}
	drop := -1
	for i, ep := range cands {
		if !keep(i, ep) {
			drop = i
			break
		}
	}
	if drop < 0 {
		return cands, ad
	}
	out = make([]*routing.Endpoint, 0, len(cands)-1)
	out = append(out, cands[:drop]...)
	for i, ep := range cands[drop+1:] {
		if keep(drop+1+i, ep) {
			out = append(out, ep)
		}
	}
	return out, ad
}

// allRoute returns every routable engine, for a request that names no
// model. Errors: 503, saying "drained" when every engine is.
func allRoute(snap *fleet.Snapshot) (*fleet.Route, error) {
	if len(snap.All().Endpoints()) > 0 {
		return snap.All(), nil
	}
	if snap.AllDrained() {
		return nil, errDrained("every engine is drained: each finishes its requests in flight and takes no new ones")
	}
	return nil, routing.ErrNoEndpoint
}

// candidates resolves the request's model (aliases included) to the route
// of engines that serve it, or of every routable engine when it names
// none. Errors: 404 model_not_found, 503 when no engine serving it is
// routable.
func (s *Server) candidates(op *operation, in *inbound) (*fleet.Route, error) {
	snap := s.fleet.Snapshot()
	in.target = in.model
	if in.model == "" {
		return allRoute(snap)
	}
	if a, ok := snap.Alias(in.model); ok {
		in.target = a.Target
		if op.body == bodyForm {
			in.rename = a.Raw
		} else {
			in.rename = a.Quoted
		}
	}
	rt, err := s.fleet.Lookup(in.target)
	return rt, lookupError(in.model, err) // never name an alias's target
}
