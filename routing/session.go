package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/switchboard-gw/switchboard/internal/stablehash"
	"golang.org/x/net/http/httpguts"
)

// SessionAffinityName is the config name of [SessionAffinity].
const SessionAffinityName = "session-affinity"

// SessionAffinity sends every request of a session to the same engine, so
// the engine's KV cache of the conversation so far is reused, with
// consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam,
// "Consistent Hashing with Bounded Loads", SODA 2018; the variant Vimeo
// runs in HAProxy as hash-balance-factor).
//
// Every engine name is placed on a 64-bit hash ring VirtualNodes times
// (hashes of "name#0", "name#1", ...). A session key hashes to a point; its
// engine is the first engine clockwise from that point whose load is below
// the bound ceil((1+ε)·(L+1)/n), where L is the candidates' total in-flight
// requests, n their number and ε = LoadFactor: an engine already carrying
// more than its share is skipped to the next one on the ring, so a hot
// session cannot pile onto one engine, and the session returns to its home
// engine when the load evens out.
//
// The mapping depends only on the candidates' names (never on their order,
// the process or the time), so gateway replicas with the same engines agree
// while no engine is near the bound (each replica applies the bound to its
// own in-flight counts, so under load replicas may spill a session
// differently).
// Adding an engine to n moves about 1/(n+1) of the sessions, all of them to
// the new engine; removing one moves only the sessions it had. (A session
// hashed modulo the engine count, as most routers do, moves n/(n+1) of all
// sessions on every scale event and cools every cache.)
//
// A request without a session key goes to the fallback policy.
type SessionAffinity struct {
	header   string
	vnodes   int
	factor   float64 // 1+ε
	fallback Policy
}

var (
	_ Policy       = (*SessionAffinity)(nil)
	_ SessionKeyed = (*SessionAffinity)(nil)
	_ PrefixHasher = (*SessionAffinity)(nil)
	_ Forgetter    = (*SessionAffinity)(nil)
	_ KVRouter     = (*SessionAffinity)(nil)
)

// SessionAffinityConfig tunes [SessionAffinity] (routing.session_affinity).
type SessionAffinityConfig struct {
	// Header is the request header carrying the session key, default
	// x-session-id; when it is absent the body's "user" field is the key.
	Header string `koanf:"header"`
	// VirtualNodes is how many points each engine has on the hash ring,
	// 1..10000, default 160 (libketama's 160 points per server): with n
	// engines the sessions an engine owns vary by about 1/sqrt(VirtualNodes)
	// around 1/n (about 8% at 160).
	VirtualNodes int `koanf:"virtual_nodes"`
	// LoadFactor is the ε of the load bound (1+ε)× the average in-flight
	// load, > 0, default 0.25 (HAProxy's hash-balance-factor 125 and SGLang's
	// prefix_hash_load_factor 1.25): small enough that a hot session moves
	// off an engine before it is a quarter above its share, large enough
	// that sessions rarely leave their home engine under even load.
	LoadFactor float64 `koanf:"load_factor"`
	// Fallback is the policy for requests without a session key, default
	// least-loaded; it must not be session-affinity. It is built from the
	// rest of [Config], its own section included.
	Fallback string `koanf:"fallback"`
}

// defaultSessionAffinityConfig returns the defaults documented on
// [SessionAffinityConfig].
func defaultSessionAffinityConfig() SessionAffinityConfig {
	return SessionAffinityConfig{Header: "x-session-id", VirtualNodes: 160, LoadFactor: 0.25, Fallback: LeastLoadedName}
}

// Validate reports every problem with c, joined; each message starts with
// its key under routing.session_affinity, and an unknown fallback wraps
// [ErrUnknownPolicy].
func (c SessionAffinityConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if !httpguts.ValidHeaderFieldName(c.Header) {
		bad("routing.session_affinity.header must be a header name (letters, digits and !#$%%&'*+-.^_`|~), got %q", c.Header)
	}
	if c.VirtualNodes < 1 || c.VirtualNodes > 10000 {
		bad("routing.session_affinity.virtual_nodes must be 1..10000, got %d", c.VirtualNodes)
	}
	if !(c.LoadFactor > 0 && c.LoadFactor <= 1000) {
		bad("routing.session_affinity.load_factor must be > 0 and <= 1000, got %v", c.LoadFactor)
	}
	if c.Fallback == SessionAffinityName {
		bad("routing.session_affinity.fallback must not be %s itself", SessionAffinityName)
	} else if r := registered(); !r.has(c.Fallback) {
		errs = append(errs, r.unknown("routing.session_affinity.fallback", c.Fallback))
	}
	return errors.Join(errs...)
}

// sessionAffinityFactory is [SessionAffinity]'s registry entry; the
// fallback is the registered policy Fallback names, built from the same
// config.
func sessionAffinityFactory() factory {
	return factory{
		build: func(c *Config) Policy {
			sa := c.SessionAffinity
			return NewSessionAffinity(sa.VirtualNodes, sa.LoadFactor, registered().byName[sa.Fallback].build(c), sa.Header)
		},
		defaults: func(c *Config) { c.SessionAffinity = defaultSessionAffinityConfig() },
		validate: func(c *Config) error { return c.SessionAffinity.Validate() },
	}
}

// maxSessionKeyBytes is how much of a session key is hashed: keys that
// differ only after it share an engine. It bounds the work a huge header
// can cause.
const maxSessionKeyBytes = 1024

// NewSessionAffinity returns a session-affinity policy with vnodes virtual
// nodes per engine (below 1: 1), load factor epsilon (the bound is
// (1+epsilon)× the average; negative: 0; +Inf turns the bound off) and the
// policy for requests without a session key (nil: least-loaded with prefill
// weight 1). header names the request header carrying the session key (""
// means x-session-id).
func NewSessionAffinity(vnodes int, epsilon float64, fallback Policy, header string) *SessionAffinity {
	if fallback == nil {
		fallback = NewLeastLoaded(1)
	}
	if header == "" {
		header = defaultSessionAffinityConfig().Header
	}
	return &SessionAffinity{header: header, vnodes: max(vnodes, 1), factor: 1 + max(epsilon, 0), fallback: fallback}
}

// PrefixBlocks passes the fallback policy's prompt blocks through (0, 0
// when the fallback does not route on prefixes), so a prefix-aware or
// scorer fallback gets its hashes.
func (p *SessionAffinity) PrefixBlocks() (blockBytes, maxBlocks int) {
	if ph, ok := p.fallback.(PrefixHasher); ok {
		return ph.PrefixBlocks()
	}
	return 0, 0
}

// KVBlockSize passes the fallback policy's token block size through (0
// when the fallback does not route on KV-cache events), so a
// precise-prefix fallback gets its token keys.
func (p *SessionAffinity) KVBlockSize() int {
	if kr, ok := p.fallback.(KVRouter); ok {
		return kr.KVBlockSize()
	}
	return 0
}

// Forget passes a request without a session key to the fallback policy,
// which picked its engine, when the fallback is a [Forgetter]; the ring
// itself learns nothing from where it sends a session.
func (p *SessionAffinity) Forget(req *Request, e *Endpoint) {
	if f, ok := p.fallback.(Forgetter); ok && req.SessionKey == "" {
		f.Forget(req, e)
	}
}

// SessionHeader returns the header the gateway reads the session key from.
func (p *SessionAffinity) SessionHeader() string { return p.header }

// Pick returns the session's engine as described on [SessionAffinity], the
// fallback policy's pick when req has no session key, or [ErrNoEndpoint]
// when there is no candidate. It does not allocate once every candidate's
// ring points are built (on its first pick, once per engine incarnation).
func (p *SessionAffinity) Pick(ctx context.Context, req *Request, candidates []*Endpoint) (*Endpoint, error) {
	if len(candidates) == 0 {
		return nil, ErrNoEndpoint
	}
	if req.SessionKey == "" {
		return p.fallback.Pick(ctx, req, candidates)
	}
	key := req.SessionKey
	if len(key) > maxSessionKeyBytes {
		key = key[:maxSessionKeyBytes]
	}
	return p.pick(stablehash.String(key), candidates), nil
}

// pick returns the first candidate clockwise from point h whose load is
// under the bound, or the first clockwise when none is. With factor >= 1
// not every engine can be above the average, but the load counters are
// read twice (for the average, then per engine) and may move in between,
// so the fallback is reachable.
func (p *SessionAffinity) pick(h uint64, candidates []*Endpoint) *Endpoint {
	var total int64
	for _, e := range candidates {
		pf, dc := e.InFlight()
		total += pf + dc
	}
	bound := int64(math.MaxInt64)
	if b := math.Ceil(p.factor * float64(total+1) / float64(len(candidates))); b < float64(math.MaxInt64) {
		bound = int64(b)
	}
	var (
		home, best        *Endpoint
		homeDist, bestDst uint64
	)
	for _, e := range candidates {
		d := p.distance(e, h)
		if home == nil || d < homeDist || d == homeDist && e.name < home.name {
			home, homeDist = e, d
		}
		pf, dc := e.InFlight()
		if pf+dc >= bound {
			continue
		}
		if best == nil || d < bestDst || d == bestDst && e.name < best.name {
			best, bestDst = e, d
		}
	}
	if best == nil {
		return home
	}
	return best
}

// distance returns the clockwise distance on the ring from h to e's first
// virtual node at or after h (wrapping around). Visiting engines in order
// of this distance is walking the ring from h and skipping engines already
// seen, so no combined ring is ever built: each engine keeps its own sorted
// points, and a candidate list of any composition works as it is.
func (p *SessionAffinity) distance(e *Endpoint, h uint64) uint64 {
	pts := e.ringPointsFor(p.vnodes)
	i, _ := slices.BinarySearch(pts, h)
	if i == len(pts) {
		i = 0
	}
	return pts[i] - h // wraps: unsigned arithmetic is the ring
}

// ringPointsFor returns e's sorted virtual node hashes for vnodes virtual
// nodes, building and caching them on first use (an engine's points depend
// only on its name).
func (e *Endpoint) ringPointsFor(vnodes int) []uint64 {
	if r := e.ring.Load(); r != nil && r.vnodes == vnodes {
		return r.points
	}
	pts := make([]uint64, vnodes)
	buf := make([]byte, 0, len(e.name)+24)
	for i := range pts {
		buf = strconv.AppendInt(append(append(buf[:0], e.name...), '#'), int64(i), 10)
		pts[i] = stablehash.String(string(buf))
	}
	slices.Sort(pts)
	e.ring.Store(&ringPoints{vnodes: vnodes, points: pts})
	return pts
}
