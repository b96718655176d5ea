package gateway

import (
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Model fallbacks (models.fallbacks, models.context_fallbacks): when the
// model a request named cannot answer it, the planner may send it to
// another model, a legFallback, before anything reached the client. Only
// the lists of the model the request named are followed, each in order,
// each model at most once per request, so no configuration can loop.

// FallbackHeader is the response header naming the model a request was
// sent to instead of the one it named (the configured fallback name);
// absent when no fallback was used.
const FallbackHeader = "X-Switchboard-Fallback"

// fallbackReason is why a request went to a fallback model; its name is
// the switchboard.request.fallbacks reason attribute.
type fallbackReason uint8

const (
	// fallbackUnavailable: no engine of the model could take the request
	// (none routable: down, ejected, drained, gone; or every one at its
	// max_in_flight).
	fallbackUnavailable fallbackReason = iota + 1
	// fallbackFailed: every leg the model's engines were given failed
	// before anything reached the client (a retry condition), and its
	// retries are over.
	fallbackFailed
	// fallbackContext: the request is too long for the model: its
	// max_tokens over max_model_len, or an engine's context-length 400.
	fallbackContext
	// fallbackContinuation: a generation broken after its first tokens
	// reached the client, with no engine of its model left to continue
	// it, is continued on the fallback from its text (carry.cross).
	fallbackContinuation
)

// String returns the reason's attribute value.
func (r fallbackReason) String() string {
	switch r {
	case fallbackUnavailable:
		return "unavailable"
	case fallbackFailed:
		return "failed"
	case fallbackContext:
		return "context"
	case fallbackContinuation:
		return "continuation"
	}
	return "none"
}

// fallbackTo is where a legFallback goes.
type fallbackTo struct {
	model  string       // the configured name (an alias or an engine model)
	target string       // the engine model it stands for
	route  *fleet.Route // its route when the planner chose it
	why    fallbackReason
}

// fallbacks is what one request may still fall back to.
type fallbacks struct {
	// model is the name the lists are configured under (the model the
	// request named, or the model its alias stands for): the metric's
	// model attribute.
	model string
	// general and context are its models.fallbacks and
	// models.context_fallbacks lists (shared with the settings: never
	// modified); pos is the next index in each.
	general, context []string
	pos              [2]int
	// tried are the engine models the request has been on, the one it
	// named first: none is gone to twice.
	tried []string
	// maxTokens is the request's max_tokens (0: not set); maxLen the
	// max_model_len of the model it is on (0: unknown).
	maxTokens, maxLen int64
	snapshot          func() *fleet.Snapshot
	// op is the request's operation name: a fallback model needs an
	// engine whose API has it (a provider's may not).
	op string
}

// any reports whether the request has a fallback list at all.
func (f *fallbacks) any() bool { return len(f.general)+len(f.context) > 0 }

// crossable reports whether a broken generation of the plan could be
// continued on a fallback model (models.fallbacks) once no engine of its
// model is left: the carry keeps the text the client got, and the list
// has a model not yet looked at.
func (p *plan) crossable() bool {
	return p.cr.crossable() && p.fb.pos[0] < len(p.fb.general) && !p.sticky
}

// cross moves a continuation to a fallback model when no engine of the
// request's model is left for it: the next model of models.fallbacks that
// has a routable engine (fallTo: the metric with reason continuation, the
// span event, the access log; the response header too when the client's
// response has not started, as for a non-streaming client), and the carry
// switched to tokenize the prompt and text on that model (carry.cross).
// nil when no fallback model can take it.
func (s *Server) cross(w http.ResponseWriter, r *http.Request, op *operation, in *inbound, out *outBody, rreq *routing.Request, p *plan) *fleet.Route {
	if !p.crossable() {
		return nil
	}
	next := p.fallback(fallbackContinuation)
	if next.kind != legFallback {
		return nil
	}
	rt := s.fallTo(w, r, op, in, out, rreq, p, next.fallback)
	p.cr.cross(next.fallback.model)
	return rt
}

// fallbacksFor returns the fallback lists of the request in's model: none
// on a sticky route, for a model not named in the body, or when neither
// list names the model (nor the model its alias stands for).
func (s *Server) fallbacksFor(op *operation, in *inbound) fallbacks {
	if op.sticky || op.model != modelBody || in.model == "" {
		return fallbacks{}
	}
	m := &in.set.cfg.Models
	key := in.model
	gen, ctx := m.Fallbacks[key], m.ContextFallbacks[key]
	if len(gen)+len(ctx) == 0 && in.target != in.model {
		key = in.target
		gen, ctx = m.Fallbacks[key], m.ContextFallbacks[key]
	}
	if len(gen)+len(ctx) == 0 {
		return fallbacks{}
	}
	return fallbacks{model: key, general: gen, context: ctx, tried: []string{in.target}, maxTokens: in.req.MaxTokens, snapshot: s.fleet.Snapshot, op: op.name}
}

// fallback decides the request's next model for why: the first model
// left in the list for why (context_fallbacks for fallbackContext,
// fallbacks otherwise) that the request has not been on, that has a
// routable engine under its max_in_flight in the current snapshot, and
// whose max_model_len is unknown or holds the request's max_tokens (and,
// for fallbackContext, is larger than the current model's). Models passed
// over are not looked at again. legNone when none is left, on a sticky
// route, or once the client has gone.
func (p *plan) fallback(why fallbackReason) nextLeg {
	f := &p.fb
	if !f.any() || p.sticky || p.ctx.Err() != nil {
		return nextLeg{}
	}
	list, pos := f.general, &f.pos[0]
	if why == fallbackContext {
		list, pos = f.context, &f.pos[1]
	}
	snap := f.snapshot()
	for ; *pos < len(list); *pos++ {
		m := list[*pos]
		target := m
		if a, ok := snap.Alias(m); ok {
			target = a.Target
		}
		if slices.Contains(f.tried, target) {
			continue
		}
		rt, err := snap.Lookup(target)
		if err != nil || !f.fits(rt.MaxModelLen(), why) {
			continue
		}
		eps := rt.Endpoints()
		if why == fallbackContinuation {
			eps = selfHosted(rt, eps) // a provider continues nothing
		}
		if cands, _ := admit(rt, eps, f.op, time.Now()); len(cands) == 0 {
			continue
		}
		*pos++
		return nextLeg{kind: legFallback, fallback: &fallbackTo{model: m, target: target, route: rt, why: why}}
	}
	return nextLeg{}
}

// fits reports whether a model of context length maxLen (0: unknown) may
// take the request as a fallback for why.
func (f *fallbacks) fits(maxLen int64, why fallbackReason) bool {
	switch {
	case maxLen == 0:
		return true
	case f.maxTokens > maxLen:
		return false
	}
	return why != fallbackContext || f.maxLen == 0 || maxLen > f.maxLen
}

// fallTo moves the request to the model to names: the engine body's model
// rewritten to it, the routing request's model, the plan's legs counted
// afresh (each model gets its own attempts), the response header, the
// counter, the server span's event and the access log's field. It returns
// the model's route.
func (s *Server) fallTo(w http.ResponseWriter, r *http.Request, op *operation, in *inbound, out *outBody, rreq *routing.Request, p *plan, to *fallbackTo) *fleet.Route {
	in.target = to.target
	if op.body == bodyForm {
		in.rename = []byte(to.target)
	} else {
		in.rename, _ = json.Marshal(to.target)
	}
	*out = s.outgoing(op, in, p.cr.asksIDs())
	rreq.Model = to.target
	// Another model's tokenizer: the prompt's token keys are not its.
	rreq.TokenKeys, rreq.TokenBlocks, in.kvPromptTokens = nil, 0, 0
	p.fb.tried = append(p.fb.tried, to.target)
	p.fb.maxLen = to.route.MaxModelLen()
	p.legs, p.lastErr = 0, nil
	w.Header()[FallbackHeader] = []string{to.model}
	ctx := r.Context()
	s.metrics.RecordFallback(ctx, p.fb.model, to.model, to.why.String())
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(telemetry.EventFallback, trace.WithAttributes(telemetry.AttrSpanModel.String(in.model),
			telemetry.AttrFallbackModel.String(to.model), telemetry.AttrFallbackReason.String(to.why.String())))
	}
	if st := stateFrom(ctx); st != nil {
		st.fallback = to.model
	}
	return to.route
}

// unservedFallbacks returns the fallback models of m that no engine of
// snap is known to serve (aliases resolved), sorted, once each: a reload
// logs them.
func unservedFallbacks(m ModelsConfig, snap *fleet.Snapshot) []string {
	var out []string
	for _, lists := range []map[string][]string{m.Fallbacks, m.ContextFallbacks} {
		for _, list := range lists {
			for _, fb := range list {
				if !snap.Known(fb) && !slices.Contains(out, fb) {
					out = append(out, fb)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
