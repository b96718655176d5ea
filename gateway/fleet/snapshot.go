package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/switchboard-gw/switchboard/routing"
)

var (
	// ErrModelNotFound is a model no engine in the fleet serves (as far
	// as the engines with known models say).
	ErrModelNotFound = errors.New("model not found")
	// ErrDrained is a model whose every engine is draining: it finishes
	// the requests it has and takes no new ones.
	ErrDrained = errors.New("every engine is drained")
	// ErrModelPending is a model no engine is known to serve while some
	// engine has not reported its models yet (discovery pending): it may
	// yet be served.
	ErrModelPending = errors.New("model discovery pending")
)

// Route is the candidate list for one model: parallel slices, so a policy
// gets []*routing.Endpoint without a per-request copy. It is part of an
// immutable [Snapshot]: never modify what its methods return.
type Route struct {
	eps  []*routing.Endpoint
	engs []*Engine
	// limited: some engine of the route has a circuit breaker
	// (EngineConfig.MaxInFlight), a queue-depth threshold
	// (MaxQueueDepth) or is a provider (which may be backing off), so
	// candidates are checked against them.
	limited bool
	// tiered: the route's engines are of more than one tier
	// (EngineConfig.Tier); tier0 is the first engine's tier.
	tiered bool
	tier0  int
	// byEP maps the endpoints to their engines in a route of at least
	// indexedRoute engines (Engine); nil in a smaller one.
	byEP map[*routing.Endpoint]*Engine
	// maxLen is the smallest max_model_len the route's engines report for
	// its model in GET /v1/models, in tokens; 0 when none reports one.
	maxLen int64
	// decode and prefill are the endpoints of Decode and Prefill (eps
	// itself when they are all of it); disagg is Disaggregable. Set by
	// finish.
	decode, prefill []*routing.Endpoint
	disagg          bool
}

// Endpoints returns the route's routable endpoints, in fleet order. The
// slice is shared: callers must not modify it.
func (rt *Route) Endpoints() []*routing.Endpoint { return rt.eps }

// Engines returns the engines of Endpoints, index for index. The slice is
// shared: callers must not modify it.
func (rt *Route) Engines() []*Engine { return rt.engs }

// Limited reports whether some engine of the route has a circuit breaker
// (EngineConfig.MaxInFlight), a queue-depth threshold (MaxQueueDepth) or
// is a provider that may be backing off ([Engine.BackingOff]), so
// candidates must be checked against them.
func (rt *Route) Limited() bool { return rt.limited }

// Tiered reports whether the route's engines are of more than one tier
// (EngineConfig.Tier), so a request goes to the lowest one with room.
func (rt *Route) Tiered() bool { return rt.tiered }

// add appends e to the route.
func (rt *Route) add(e *Engine) {
	t := e.Tier()
	if len(rt.engs) == 0 {
		rt.tier0 = t
	} else if t != rt.tier0 {
		rt.tiered = true
	}
	rt.eps = append(rt.eps, e.ep)
	rt.engs = append(rt.engs, e)
	rt.limited = rt.limited || e.maxInFlight.Load() > 0 || e.maxQueue.Load() > 0 || e.prov != nil
}

// MaxModelLen returns the model's context length in tokens (prompt and
// completion together), as its engines report it in GET /v1/models
// (vLLM's max_model_len): the smallest among the route's engines when
// they differ, engines that report none left out; 0 when none reports it
// (a static engine serving another server, say), meaning unknown.
func (rt *Route) MaxModelLen() int64 { return rt.maxLen }

// Decode returns the endpoints a whole generation may go to: those whose
// engine's role is not RolePrefill, in fleet order. It is Endpoints
// itself (the same slice) when the route has no RolePrefill engine, and
// also when every engine of the route is RolePrefill, so a model is never
// stranded; the route holds only routable engines, so prefill engines
// take whole generations while no other engine of the model is routable.
// Built with the snapshot: no allocation per request. The slice is
// shared: callers must not modify it.
func (rt *Route) Decode() []*routing.Endpoint { return rt.decode }

// Prefill returns the endpoints that may do the prefill of a
// disaggregated request: those whose engine's role is RolePrefill or
// RoleBoth, in fleet order (Endpoints itself when the route has no
// RoleDecode engine). Built with the snapshot; the slice is shared:
// callers must not modify it.
func (rt *Route) Prefill() []*routing.Endpoint { return rt.prefill }

// Disaggregable reports whether the route has at least one routable
// RolePrefill engine and at least one routable RoleDecode engine, so a
// request may be split into a prefill and a decode leg. A route of
// RoleBoth engines only never is.
func (rt *Route) Disaggregable() bool { return rt.disagg }

// finish computes Decode, Prefill and Disaggregable from the route's
// engines, once, when the snapshot is built.
func (rt *Route) finish() {
	if len(rt.eps) >= indexedRoute {
		rt.byEP = make(map[*routing.Endpoint]*Engine, len(rt.eps))
		for i, ep := range rt.eps {
			rt.byEP[ep] = rt.engs[i]
		}
	}
	var nPrefill, nDecode int
	for _, e := range rt.engs {
		switch e.role {
		case RolePrefill:
			nPrefill++
		case RoleDecode:
			nDecode++
		}
	}
	rt.disagg = nPrefill > 0 && nDecode > 0
	rt.decode, rt.prefill = rt.eps, rt.eps
	if nPrefill > 0 && nPrefill < len(rt.engs) {
		rt.decode = rt.withRole(func(r Role) bool { return r != RolePrefill })
	}
	if nDecode > 0 {
		rt.prefill = rt.withRole(func(r Role) bool { return r != RoleDecode })
	}
}

// withRole returns the route's endpoints whose engine's role keep
// accepts, in order.
func (rt *Route) withRole(keep func(Role) bool) []*routing.Endpoint {
	var out []*routing.Endpoint
	for i, e := range rt.engs {
		if keep(e.role) {
			out = append(out, rt.eps[i])
		}
	}
	return out
}

// Engine returns the engine of ep, one of the route's endpoints (of
// Endpoints, Decode or Prefill), or nil when ep is not one of them.
func (rt *Route) Engine(ep *routing.Endpoint) *Engine {
	if rt.byEP != nil {
		return rt.byEP[ep]
	}
	for i, e := range rt.eps {
		if e == ep {
			return rt.engs[i]
		}
	}
	return nil
}

// indexedRoute is the route size from which Engine looks endpoints up in
// a map rather than the slice: admission looks up every candidate, so a
// scan would be quadratic in a large fleet.
const indexedRoute = 16

// Snapshot is an immutable view of the fleet used by the request path:
// load it once per decision with [Fleet.Snapshot].
type Snapshot struct {
	routes  map[string]*Route // routable engines (healthy, awake, not blocked by their stats), per model
	all     Route             // every routable engine, for requests that name no model
	known   map[string]bool   // every model of every engine with known models
	pending bool              // some engine has not reported its models yet
	// drained are the known models whose every engine is draining (the
	// admin API's drain, a discovery source's not-ready endpoint; a
	// removed incarnation finishing its requests is no longer in the
	// fleet's engines and does not count); allDrained says it of the
	// whole fleet (at least one engine, every one draining).
	drained    map[string]bool
	allDrained bool
	// aliases are Config.Aliases with their replacement bytes.
	aliases map[string]Alias
	// cards are the GET /v1/models entries by id (served models and
	// aliases), modelsBody the whole list; nil when no routable engine has
	// reported models.
	cards      map[string]ModelCard
	modelsBody []byte
}

// Alias is a public model name's target, the engine model it stands for,
// with the bytes that replace the name in a request body. Its slices are
// shared: never modify them.
type Alias struct {
	// Target is the engine model the alias stands for.
	Target string
	// Quoted is Target as a JSON string (quotes included), for a JSON body.
	Quoted []byte
	// Raw is Target's bytes, for a multipart form field.
	Raw []byte
}

// ModelCard is one entry of GET /v1/models, with the fields vLLM's
// ModelCard has (vllm/entrypoints/openai/protocol.py): root is the served
// weights (an adapter's path), parent the base model of a LoRA adapter,
// max_model_len the context length in tokens.
type ModelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        *string `json:"root,omitempty"`
	Parent      *string `json:"parent"`
	MaxModelLen *int64  `json:"max_model_len,omitempty"`
}

// All returns the route of every routable engine, for a request that
// names no model; it has no endpoint when none is routable.
func (s *Snapshot) All() *Route { return &s.all }

// Alias returns what the public model name model stands for, and whether
// it is an alias.
func (s *Snapshot) Alias(model string) (Alias, bool) {
	a, ok := s.aliases[model]
	return a, ok
}

// AllDrained reports whether the fleet has engines and every one is
// draining, so none takes new requests.
func (s *Snapshot) AllDrained() bool { return s.allDrained }

// Known reports whether some engine with known models serves model, or
// model is an alias of such a model, routable or not.
func (s *Snapshot) Known(model string) bool { return s.known[model] }

// Cards returns the GET /v1/models entries by id, served models and
// aliases of the routable engines; nil when no routable engine has
// reported models. The map is shared: callers must not modify it.
func (s *Snapshot) Cards() map[string]ModelCard { return s.cards }

// ModelsBody returns the GET /v1/models body (every card, sorted by id);
// nil when no routable engine has reported models. The slice is shared:
// callers must not modify it.
func (s *Snapshot) ModelsBody() []byte { return s.modelsBody }

// Lookup returns the route of model (an engine model, not an alias).
// Errors: ErrDrained when the model is known and every engine serving it
// is draining, routing.ErrNoEndpoint when it is known but no engine
// serving it is routable for another reason, ErrModelPending when no engine is known to serve
// it but an engine has not reported its models yet (its first probe is to
// come), ErrModelNotFound otherwise; each wrapped with the model's name.
func (s *Snapshot) Lookup(model string) (*Route, error) {
	if rt, ok := s.routes[model]; ok {
		return rt, nil
	}
	switch {
	case s.drained[model]:
		return nil, fmt.Errorf("%w: model %q", ErrDrained, model)
	case s.known[model]:
		return nil, fmt.Errorf("%w: model %q", routing.ErrNoEndpoint, model)
	case s.pending:
		return nil, fmt.Errorf("%w: %q", ErrModelPending, model)
	}
	return nil, fmt.Errorf("%w: %q", ErrModelNotFound, model)
}

// Snapshot returns the current routing view. It is immutable: a change
// (health and stats verdicts, ejections, the admin API, discovery, a
// reload) builds a new one.
func (f *Fleet) Snapshot() *Snapshot { return f.snap.Load() }

// Lookup is Snapshot().Lookup(model).
func (f *Fleet) Lookup(model string) (*Route, error) { return f.snap.Load().Lookup(model) }

func (f *Fleet) rebuild() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebuildLocked()
}

func (f *Fleet) rebuildLocked() {
	s := &Snapshot{routes: map[string]*Route{}, known: map[string]bool{}, drained: map[string]bool{}, aliases: f.aliases}
	cards := map[string]ModelCard{}
	s.allDrained = len(f.engines) > 0
	for _, e := range f.engines {
		draining := e.state() == routing.StateDraining
		s.allDrained = s.allDrained && draining
		ms := e.knownModels()
		if ms == nil {
			// Only until the engine's first probe: an engine that was
			// down at start must not turn every unknown model (a typo)
			// into a 503 for as long as it stays down.
			if !e.probed.Load() {
				s.pending = true
			}
			continue
		}
		// A sleeping or self-reported unhealthy engine (fresh stats) is
		// left out like an unhealthy one: it keeps its slots and its
		// health verdict, and comes back when woken or when its stats say
		// so or expire.
		ok := e.routable()
		if ok {
			s.all.add(e)
		}
		var ec map[string]ModelCard
		if c := e.cards.Load(); c != nil {
			ec = *c
		}
		for _, m := range ms {
			if d, seen := s.drained[m]; !seen || d {
				s.drained[m] = draining // every engine of m so far drains
			}
			s.known[m] = true
			if !ok {
				continue
			}
			if _, seen := cards[m]; !seen {
				card, found := ec[m]
				if !found {
					card = ModelCard{ID: m, Object: "model", Created: f.started, OwnedBy: "switchboard"}
				}
				cards[m] = card
			}
			rt := s.routes[m]
			if rt == nil {
				rt = &Route{}
				s.routes[m] = rt
			}
			rt.add(e)
			if c, found := ec[m]; found && c.MaxModelLen != nil && *c.MaxModelLen > 0 && (rt.maxLen == 0 || *c.MaxModelLen < rt.maxLen) {
				rt.maxLen = *c.MaxModelLen
			}
		}
	}
	s.all.finish()
	for m, rt := range s.routes {
		rt.finish()
		delete(s.drained, m) // routable: not drained, whatever else drains
	}
	for name, a := range f.aliases {
		s.known[name] = s.known[a.Target]
		if s.drained[a.Target] {
			s.drained[name] = true
		}
		if c, ok := cards[a.Target]; ok {
			c.ID = name
			cards[name] = c
		}
	}
	if len(cards) > 0 {
		names := make([]string, 0, len(cards))
		for m := range cards {
			names = append(names, m)
		}
		sort.Strings(names)
		list := struct {
			Object string      `json:"object"`
			Data   []ModelCard `json:"data"`
		}{Object: "list", Data: make([]ModelCard, len(names))}
		for i, n := range names {
			list.Data[i] = cards[n]
		}
		s.modelsBody, _ = json.Marshal(list)
		s.cards = cards
	}
	f.snap.Store(s)
	f.reconcileKVLocked()
}

// aliasesOf builds the alias table of Config.Aliases.
func aliasesOf(m map[string]string) map[string]Alias {
	out := make(map[string]Alias, len(m))
	for name, target := range m {
		q, _ := json.Marshal(target)
		out[name] = Alias{Target: target, Quoted: q, Raw: []byte(target)}
	}
	return out
}
