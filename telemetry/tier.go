package telemetry

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Tier instruments: how traffic spreads over the engine tiers
// (engines[].tier: self-hosted first, hosted providers after).
const (
	// TierLegsName counts engine legs by the tier of their engine
	// (AttrTier), unit {leg}: every attempt, retry, continuation and
	// decode leg; a tier's share of the traffic is its count over the
	// sum.
	TierLegsName = "switchboard.tier.legs"
	// TierOverflowsName counts requests that went to a higher tier
	// because every engine of a lower one serving their model was full
	// (max_in_flight, max_queue_depth, a provider's back-off), by the
	// tier they left (AttrTier) and the one they went to (AttrTierTo),
	// unit {request}; once per request.
	TierOverflowsName = "switchboard.tier.overflows"
	// TierFallbacksName counts retries that went to a higher tier after
	// the engines of the lower one failed before content, by the tier
	// they left (AttrTier) and the one they went to (AttrTierTo), unit
	// {leg}.
	TierFallbacksName = "switchboard.tier.fallbacks"
)

// AttrTier is an engine tier (engines[].tier), an integer >= 0;
// AttrTierTo the tier a request spilled or fell back to.
const (
	AttrTier   = attribute.Key("switchboard.tier")
	AttrTierTo = attribute.Key("switchboard.tier.to")
)

type tierInstruments struct {
	legs, overflows, fallbacks metric.Int64Counter
	// opts caches the attribute options of each tier and tier pair, so
	// recording allocates nothing after a tier's first leg; tiers are
	// configured, so the cache is bounded.
	opts sync.Map // int or [2]int -> []metric.AddOption
}

func (t *tierInstruments) init(meter metric.Meter) []error {
	var errs []error
	for _, c := range []struct {
		into       *metric.Int64Counter
		name, unit string
		desc       string
	}{
		{&t.legs, TierLegsName, "{leg}", "Engine legs by the tier of their engine."},
		{&t.overflows, TierOverflowsName, "{request}", "Requests that went to a higher tier because every engine of the lower one was full."},
		{&t.fallbacks, TierFallbacksName, "{leg}", "Retries that went to a higher tier after the lower one's engines failed before content."},
	} {
		var err error
		if *c.into, err = meter.Int64Counter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc)); err != nil {
			*c.into, _ = noop.NewMeterProvider().Meter("").Int64Counter(c.name)
			errs = append(errs, err)
		}
	}
	return errs
}

// opt returns the stored option slice of key's attributes: passing a
// stored slice with ... allocates nothing, where an option built per call
// costs the boxed option and the variadic slice.
func (t *tierInstruments) opt(key any, attrs ...attribute.KeyValue) []metric.AddOption {
	if o, ok := t.opts.Load(key); ok {
		return o.([]metric.AddOption)
	}
	o, _ := t.opts.LoadOrStore(key, []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))})
	return o.([]metric.AddOption)
}

// RecordTierLeg counts one engine leg on an engine of tier.
func (m *Metrics) RecordTierLeg(ctx context.Context, tier int) {
	m.tier.legs.Add(ctx, 1, m.tier.opt(tier, AttrTier.Int(tier))...)
}

// RecordTierOverflow counts one request that spilled from tier from
// (every engine of it full) to tier to.
func (m *Metrics) RecordTierOverflow(ctx context.Context, from, to int) {
	m.tier.overflows.Add(ctx, 1, m.tier.opt([2]int{from, to}, AttrTier.Int(from), AttrTierTo.Int(to))...)
}

// RecordTierFallback counts one retry that fell back from tier from to
// tier to.
func (m *Metrics) RecordTierFallback(ctx context.Context, from, to int) {
	m.tier.fallbacks.Add(ctx, 1, m.tier.opt([2]int{from, to}, AttrTier.Int(from), AttrTierTo.Int(to))...)
}
