package routing

import (
	"context"
	"sync/atomic"
)

// RoundRobinName is the config name of [RoundRobin].
const RoundRobinName = "round-robin"

// RoundRobin hands requests to the candidates in turn. With a changing
// candidate list (models with different engine sets) the rotation is per
// policy, not per model, which keeps Pick to one atomic add (as Caddy's
// round_robin selection does).
type RoundRobin struct {
	next atomic.Uint64
}

var _ Policy = (*RoundRobin)(nil)

// NewRoundRobin returns a round-robin policy starting at the first candidate.
func NewRoundRobin() *RoundRobin { return &RoundRobin{} }

// Pick returns the next candidate in turn, or [ErrNoEndpoint] when there is
// none. It does not allocate.
func (p *RoundRobin) Pick(_ context.Context, _ *Request, candidates []*Endpoint) (*Endpoint, error) {
	n := uint64(len(candidates))
	if n == 0 {
		return nil, ErrNoEndpoint
	}
	return candidates[(p.next.Add(1)-1)%n], nil
}

// roundRobinFactory is [RoundRobin]'s registry entry; it has no settings.
func roundRobinFactory() factory {
	return factory{build: func(*Config) Policy { return NewRoundRobin() }}
}
