package gateway

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// tierCounts are one tier's counts in this process, for GET /admin/engines
// (the metrics have them too: telemetry.TierLegsName and the others).
type tierCounts struct {
	legs, overflowsFrom, overflowsTo, fallbacksTo atomic.Int64
}

// tierStats holds the counts of every tier that had a leg or an overflow;
// tiers are configured numbers, so the map is bounded.
type tierStats struct {
	m sync.Map // int -> *tierCounts
}

func (t *tierStats) of(tier int) *tierCounts {
	if c, ok := t.m.Load(tier); ok {
		return c.(*tierCounts)
	}
	c, _ := t.m.LoadOrStore(tier, new(tierCounts))
	return c.(*tierCounts)
}

// leg counts a leg on an engine of tier; a retry that went to a higher
// tier than the request's previous leg is a fallback.
func (t *tierStats) leg(ctx context.Context, m *telemetry.Metrics, p *plan, tier int, retry bool) {
	t.of(tier).legs.Add(1)
	m.RecordTierLeg(ctx, tier)
	if retry && p.onTier && tier > p.tier {
		t.of(tier).fallbacksTo.Add(1)
		m.RecordTierFallback(ctx, p.tier, tier)
	}
	p.onTier, p.tier = true, tier
}

// overflow counts a request that spilled from tier from to tier to.
func (t *tierStats) overflow(ctx context.Context, m *telemetry.Metrics, from, to int) {
	t.of(from).overflowsFrom.Add(1)
	t.of(to).overflowsTo.Add(1)
	m.RecordTierOverflow(ctx, from, to)
}

// TierStatus is one tier in GET /admin/engines: its engines, and what
// this process sent it since it started.
type TierStatus struct {
	// Tier is the tier (engines[].tier).
	Tier int `json:"tier"`
	// Engines are the names of the tier's engines in the fleet now.
	Engines []string `json:"engines"`
	// Legs counts the engine legs sent to the tier's engines; Share is
	// Legs over every tier's, 0..1.
	Legs  int64   `json:"legs"`
	Share float64 `json:"share"`
	// OverflowsIn counts requests that spilled to the tier because a
	// lower one was full; OverflowsOut those that left it for a higher
	// one; FallbacksIn retries that came to it after a lower tier failed
	// before content.
	OverflowsIn  int64 `json:"overflows_in"`
	OverflowsOut int64 `json:"overflows_out"`
	FallbacksIn  int64 `json:"fallbacks_in"`
}

// Tiers returns every tier that has an engine or had traffic, lowest
// first.
func (s *Server) Tiers() []TierStatus {
	byTier := map[int]*TierStatus{}
	get := func(t int) *TierStatus {
		ts := byTier[t]
		if ts == nil {
			ts = &TierStatus{Tier: t, Engines: []string{}}
			byTier[t] = ts
		}
		return ts
	}
	for _, e := range s.fleet.Engines() {
		ts := get(e.Tier())
		ts.Engines = append(ts.Engines, e.Name())
	}
	var total int64
	s.tiers.m.Range(func(k, v any) bool {
		c := v.(*tierCounts)
		ts := get(k.(int))
		ts.Legs, ts.OverflowsIn, ts.OverflowsOut, ts.FallbacksIn = c.legs.Load(), c.overflowsTo.Load(), c.overflowsFrom.Load(), c.fallbacksTo.Load()
		total += ts.Legs
		return true
	})
	out := make([]TierStatus, 0, len(byTier))
	for _, ts := range byTier {
		if total > 0 {
			ts.Share = float64(ts.Legs) / float64(total)
		}
		out = append(out, *ts)
	}
	slices.SortFunc(out, func(a, b TierStatus) int { return a.Tier - b.Tier })
	return out
}

// selfHosted returns the candidates whose engine is not a provider's:
// cands itself when none is.
func selfHosted(rt *fleet.Route, cands []*routing.Endpoint) []*routing.Endpoint {
	if !rt.Limited() {
		return cands // a route with a provider engine is limited
	}
	return slices.DeleteFunc(slices.Clone(cands), func(ep *routing.Endpoint) bool {
		e := rt.Engine(ep)
		return e == nil || e.IsProvider()
	})
}

// errUnsupportedByEngines is the 404 for a route no engine of the model
// serves: every one is a provider whose API does not have it.
func errUnsupportedByEngines(op *operation, model string) *APIError {
	return &APIError{Status: 404, Type: TypeInvalidRequest, Code: "model_not_found",
		Message: "model " + strconv.Quote(model) + " is served only by hosted providers whose API has no " + op.paths[0]}
}
