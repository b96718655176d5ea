package gateway

import (
	"sync"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
)

// stickyEntries is how many response ids the gateway remembers with the
// engine that created them: 64 Ki ids of at most maxIDLen bytes, a few MiB
// at worst. An id it has forgotten (or one created through another gateway
// replica) is still found: the sticky routes then ask each engine in turn.
const stickyEntries = 1 << 16

// stickyIndex remembers which engine created which stored response
// (Responses API), so GET /v1/responses/{id} and its cancel go to that
// engine first. It is a fixed-capacity map that forgets the oldest id
// first. Safe for concurrent use.
type stickyIndex struct {
	mu   sync.Mutex
	max  int               // capacity, in ids
	m    map[string]string // id -> engine name
	ring []string          // ids in insertion order, ring[next] the oldest once full
	next int
}

// newStickyIndex returns an index of at most capacity ids. It holds
// nothing until ids arrive: a gateway that serves no stored responses
// pays nothing for it.
func newStickyIndex(capacity int) *stickyIndex {
	return &stickyIndex{max: capacity, m: make(map[string]string)}
}

// put remembers that engine created id.
func (x *stickyIndex) put(id, engine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.m[id]; ok {
		x.m[id] = engine
		return
	}
	if len(x.ring) < x.max {
		x.ring = append(x.ring, id)
	} else {
		delete(x.m, x.ring[x.next])
		x.ring[x.next] = id
		x.next = (x.next + 1) % len(x.ring)
	}
	x.m[id] = engine
}

// get returns the engine that created id, if remembered.
func (x *stickyIndex) get(id string) (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e, ok := x.m[id]
	return e, ok
}

// remember records the engine of a successful answer's response id, for
// a route whose row says so.
func (s *Server) remember(c *call) {
	a := c.a
	if a.errType == "" && a.respID != "" && validID(a.respID) {
		s.sticky.put(a.respID, c.eng.Name())
	}
}

// stickyOrder returns the engines to ask for the stored response id, of
// those whose API has op (a provider's may not): the one that created it
// first, when remembered and routable, then the others in the pool's
// order, those backing off a provider's rate limit last (asked only when
// the others have not got it). Empty when none serves op.
func (s *Server) stickyOrder(id string, rt *fleet.Route, op *operation) []*routing.Endpoint {
	now := time.Now()
	out := make([]*routing.Endpoint, 0, len(rt.Endpoints()))
	if name, found := s.sticky.get(id); found {
		for i, e := range rt.Engines() {
			if e.Name() == name && e.ServesOperation(op.name) {
				out = append(out, rt.Endpoints()[i])
				break
			}
		}
	}
	first := len(out) > 0
	for _, late := range [...]bool{false, true} {
		for i, ep := range rt.Endpoints() {
			e := rt.Engines()[i]
			if (first && ep == out[0]) || !e.ServesOperation(op.name) || e.BackingOff(now) != late {
				continue
			}
			out = append(out, ep)
		}
	}
	return out
}
