package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names of the KV-cache event subscriptions and the precise
// prefix index built from them (vLLM's --kv-events-config; the gateway's
// kv_events section).
const (
	// KVEventsName counts the events received, unit {event}, by engine
	// and AttrKVEventType: stored (BlockStored), removed (BlockRemoved),
	// cleared (AllBlocksCleared), unknown (a type the decoder does not
	// know, skipped) and invalid (an event of a known type that failed
	// validation, dropped).
	KVEventsName = "switchboard.kv_events.events"
	// KVDecodeErrorsName counts messages that were not a well-formed
	// event batch, unit {message}, by engine.
	KVDecodeErrorsName = "switchboard.kv_events.decode_errors"
	// KVPeerErrorsName counts connections to an engine's publisher or
	// replay socket dropped for breaking the protocol's bounds (a frame
	// over the batch cap, a malformed or hung handshake), unit
	// {connection}, by engine.
	KVPeerErrorsName = "switchboard.kv_events.peer_errors"
	// KVGapsName counts sequence gaps, unit {gap}, by engine: batches the
	// subscriber never received (the engine's PUB high-water mark, a
	// reconnection).
	KVGapsName = "switchboard.kv_events.gaps"
	// KVReplaysName counts replay exchanges with an engine's replay
	// socket, unit {replay}, by engine and AttrKVReplayOutcome (ok, failed).
	KVReplaysName = "switchboard.kv_events.replays"
	// KVRestartsName counts publisher restarts seen (the sequence went
	// back), unit {restart}, by engine.
	KVRestartsName = "switchboard.kv_events.restarts"
	// KVOrphansName counts BlockStored events skipped because their
	// parent block is unknown to the index (after a loss of events, until
	// the conversations stored before it leave the engine's cache), unit
	// {event}, by engine.
	KVOrphansName = "switchboard.kv_events.orphans"
	// KVLagName is the time from an engine's batch timestamp to the
	// gateway applying it, unit s, by engine: network, queueing, and the
	// clock offset between the hosts.
	KVLagName = "switchboard.kv_events.lag"
	// KVIndexBlocksName is the blocks the precise index holds for an
	// engine, unit {block}, by engine.
	KVIndexBlocksName = "switchboard.kv_index.blocks"
	// KVIndexMemoryName is the precise index's memory, unit By, with no
	// attributes.
	KVIndexMemoryName = "switchboard.kv_index.memory"
	// KVIndexStaleName is the engines whose events are stale, routed on
	// the approximate index meanwhile, unit {engine}, with no attributes.
	KVIndexStaleName = "switchboard.kv_index.engines_stale"
	// KVIndexFallbacksName counts an engine's index turning stale, unit
	// {transition}, by engine.
	KVIndexFallbacksName = "switchboard.kv_index.fallbacks"
	// KVPredictionsName counts requests routed on an engine's events whose
	// answer then reported its cached prompt tokens
	// (usage.prompt_tokens_details.cached_tokens), unit {request}, by
	// engine and AttrKVPrediction: exact (the reported count is the one
	// predicted at pick time), over (the index said more was cached than
	// the engine found) and under (less).
	KVPredictionsName = "switchboard.kv_index.predictions"
	// KVPredictedTokensName and KVReportedTokensName sum the cached
	// prompt tokens predicted at pick time and then reported by the
	// engine over the same requests, unit {token}, by engine: their ratio
	// is the index's accuracy.
	KVPredictedTokensName = "switchboard.kv_index.predicted_tokens"
	KVReportedTokensName  = "switchboard.kv_index.reported_tokens"
	// TokenizeDurationName is the time of one tokenization call to an
	// engine's /tokenize for routing, unit s, by AttrTokenizeOutcome (ok,
	// error).
	TokenizeDurationName = "switchboard.tokenize.duration"
	// TokenizeWaitName is what tokenization added to a routing decision,
	// unit s: 0 for a cache hit, up to kv_events.tokenize.max_wait.
	TokenizeWaitName = "switchboard.tokenize.wait"
	// TokenizeCacheName counts token-cache look-ups of requests routed on
	// KV events, unit {request}, by AttrTokenizeCache: hit (the whole
	// prompt's tokens known), partial (a leading part known, from an
	// earlier prompt it extends), miss.
	TokenizeCacheName = "switchboard.tokenize.cache"
)

// Attribute keys of the KV-event instruments.
const (
	AttrKVEventType     = attribute.Key("type")
	AttrKVReplayOutcome = attribute.Key("outcome")
	AttrKVPrediction    = attribute.Key("outcome")
	AttrTokenizeOutcome = attribute.Key("outcome")
	AttrTokenizeCache   = attribute.Key("result")
)

// The values of AttrKVEventType, AttrKVPrediction, AttrTokenizeCache.
const (
	KVEventStored  = "stored"
	KVEventRemoved = "removed"
	KVEventCleared = "cleared"
	KVEventUnknown = "unknown"
	KVEventInvalid = "invalid"

	KVPredictionExact = "exact"
	KVPredictionOver  = "over"
	KVPredictionUnder = "under"

	TokenizeHit     = "hit"
	TokenizePartial = "partial"
	TokenizeMiss    = "miss"
)

// KVEngineCounts are one engine's cumulative subscription counters, as
// the observable counters report them.
type KVEngineCounts struct {
	// Stored, Removed, Cleared, Unknown, Invalid count events by
	// AttrKVEventType.
	Stored, Removed, Cleared, Unknown, Invalid uint64
	// DecodeErrors, PeerErrors, Gaps, Restarts, Orphans count what
	// their instruments say.
	DecodeErrors, PeerErrors, Gaps, Restarts, Orphans uint64
	// Replays and ReplayFailures count replay exchanges by outcome.
	Replays, ReplayFailures uint64
	// Blocks is what the index holds for the engine, in blocks.
	Blocks int64
}

// KVIndexTotals is the index as a whole.
type KVIndexTotals struct {
	// Bytes is the index's memory, in bytes.
	Bytes int64
	// Stale is the number of subscribed engines whose events are stale.
	Stale int64
}

// KVEventsFunc reports every subscribed engine's counts, by calling report
// once per engine, and returns the index's totals. It is called on each
// metric collection.
type KVEventsFunc func(report func(e *Engine, c KVEngineCounts)) KVIndexTotals

type kvInstruments struct {
	events, decodeErrors, gaps, replays, restarts metric.Int64ObservableCounter
	peerErrors, orphans                           metric.Int64ObservableCounter
	blocks, memory, stale                         metric.Int64ObservableGauge
	lag, tokenize, wait                           metric.Float64Histogram
	fallbacks, predictions, predicted, reported   metric.Int64Counter
	cache                                         metric.Int64Counter

	tokOK, tokErr                     []metric.RecordOption
	cacheHit, cachePartial, cacheMiss []metric.AddOption
	replayOK, replayFailed            attribute.KeyValue
}

func (r *kvInstruments) init(meter metric.Meter) []error {
	var errs []error
	nm := noop.NewMeterProvider().Meter("")
	oc := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			c, _ = nm.Int64ObservableCounter(name)
		}
		return c
	}
	og := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			g, _ = nm.Int64ObservableGauge(name)
		}
		return g
	}
	c := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			c, _ = nm.Int64Counter(name)
		}
		return c
	}
	h := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		if err != nil {
			errs = append(errs, err)
			h, _ = nm.Float64Histogram(name)
		}
		return h
	}
	r.events = oc(KVEventsName, "{event}", "KV-cache events received from engines, by type.")
	r.decodeErrors = oc(KVDecodeErrorsName, "{message}", "KV-cache event messages that did not decode.")
	r.peerErrors = oc(KVPeerErrorsName, "{connection}", "Connections to engines' KV-event sockets dropped for breaking the protocol's bounds.")
	r.orphans = oc(KVOrphansName, "{event}", "Stored-block events skipped because their parent block is unknown.")
	r.gaps = oc(KVGapsName, "{gap}", "Sequence gaps in an engine's KV-cache events.")
	r.replays = oc(KVReplaysName, "{replay}", "Replays of missed KV-cache event batches, by outcome.")
	r.restarts = oc(KVRestartsName, "{restart}", "KV-cache event publisher restarts seen.")
	r.blocks = og(KVIndexBlocksName, "{block}", "Blocks the precise prefix index holds, by engine.")
	r.memory = og(KVIndexMemoryName, "By", "Memory of the precise prefix index.")
	r.stale = og(KVIndexStaleName, "{engine}", "Engines whose KV-cache events are stale, routed on the approximate index.")
	r.lag = h(KVLagName, "Time from an engine's KV-cache event batch to the gateway applying it.", latencyBuckets)
	r.tokenize = h(TokenizeDurationName, "Tokenization calls to engines for routing, by outcome.", latencyBuckets)
	r.wait = h(TokenizeWaitName, "Time tokenization added to a routing decision.", latencyBuckets)
	r.fallbacks = c(KVIndexFallbacksName, "{transition}", "Engines whose KV-cache events turned stale.")
	r.predictions = c(KVPredictionsName, "{request}", "Requests routed on KV-cache events, by how the engine's reported cached tokens compared with the prediction.")
	r.predicted = c(KVPredictedTokensName, "{token}", "Cached prompt tokens predicted at routing time.")
	r.reported = c(KVReportedTokensName, "{token}", "Cached prompt tokens reported by the engine for the same requests.")
	r.cache = c(TokenizeCacheName, "{request}", "Token cache look-ups for routing, by result.")
	r.tokOK = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(AttrTokenizeOutcome.String("ok")))}
	r.tokErr = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(AttrTokenizeOutcome.String("error")))}
	r.cacheHit = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrTokenizeCache.String(TokenizeHit)))}
	r.cachePartial = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrTokenizeCache.String(TokenizePartial)))}
	r.cacheMiss = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrTokenizeCache.String(TokenizeMiss)))}
	r.replayOK, r.replayFailed = AttrKVReplayOutcome.String("ok"), AttrKVReplayOutcome.String("failed")
	return errs
}

// latencyBuckets are the bounds, in seconds, of the KV-event and
// tokenization latency histograms: 100 µs to 10 s.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}

// ObserveKVEvents registers fn as the source of the KV-event counters
// (switchboard.kv_events.events, .decode_errors, .peer_errors, .gaps, .replays,
// .restarts) and the index gauges (switchboard.kv_index.blocks, .memory,
// .engines_stale). Unregister the returned registration on shutdown.
func (m *Metrics) ObserveKVEvents(fn KVEventsFunc) (metric.Registration, error) {
	r := &m.kv
	return m.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t := fn(func(e *Engine, c KVEngineCounts) {
			for _, v := range [...]struct {
				n   uint64
				typ string
			}{{c.Stored, KVEventStored}, {c.Removed, KVEventRemoved}, {c.Cleared, KVEventCleared}, {c.Unknown, KVEventUnknown}, {c.Invalid, KVEventInvalid}} {
				o.ObserveInt64(r.events, int64(v.n), metric.WithAttributes(AttrEngine.String(e.name), AttrKVEventType.String(v.typ)))
			}
			o.ObserveInt64(r.decodeErrors, int64(c.DecodeErrors), e.engineObs...)
			o.ObserveInt64(r.gaps, int64(c.Gaps), e.engineObs...)
			o.ObserveInt64(r.peerErrors, int64(c.PeerErrors), e.engineObs...)
			o.ObserveInt64(r.orphans, int64(c.Orphans), e.engineObs...)
			o.ObserveInt64(r.restarts, int64(c.Restarts), e.engineObs...)
			o.ObserveInt64(r.replays, int64(c.Replays), metric.WithAttributes(AttrEngine.String(e.name), r.replayOK))
			o.ObserveInt64(r.replays, int64(c.ReplayFailures), metric.WithAttributes(AttrEngine.String(e.name), r.replayFailed))
			o.ObserveInt64(r.blocks, c.Blocks, e.engineObs...)
		})
		o.ObserveInt64(r.memory, t.Bytes)
		o.ObserveInt64(r.stale, t.Stale)
		return nil
	}, r.events, r.decodeErrors, r.peerErrors, r.orphans, r.gaps, r.replays, r.restarts, r.blocks, r.memory, r.stale)
}

// RecordKVLag records one batch's lag, in seconds, for engine e.
func (m *Metrics) RecordKVLag(ctx context.Context, e *Engine, seconds float64) {
	m.kv.lag.Record(ctx, seconds, e.engineRec...)
}

// RecordKVFallback counts engine e's index turning stale.
func (m *Metrics) RecordKVFallback(ctx context.Context, e *Engine) {
	m.kv.fallbacks.Add(ctx, 1, e.engineAdd...)
}

// kvPredictions are the values of AttrKVPrediction, in the order of
// Engine.kvPred.
var kvPredictions = [...]string{KVPredictionExact, KVPredictionOver, KVPredictionUnder}

// RecordKVPrediction compares the cached prompt tokens predicted for a
// request on engine e at pick time with those the engine reported. It
// does not allocate.
func (m *Metrics) RecordKVPrediction(ctx context.Context, e *Engine, predicted, reported int) {
	i := 0 // exact
	switch {
	case predicted > reported:
		i = 1
	case predicted < reported:
		i = 2
	}
	m.kv.predictions.Add(ctx, 1, e.kvPred[i]...)
	m.kv.predicted.Add(ctx, int64(predicted), e.engineAdd...)
	m.kv.reported.Add(ctx, int64(reported), e.engineAdd...)
}

// RecordTokenize records one tokenization call's duration, in seconds,
// and whether it succeeded.
func (m *Metrics) RecordTokenize(ctx context.Context, seconds float64, ok bool) {
	if ok {
		m.kv.tokenize.Record(ctx, seconds, m.kv.tokOK...)
	} else {
		m.kv.tokenize.Record(ctx, seconds, m.kv.tokErr...)
	}
}

// RecordTokenizeLookup counts one token-cache look-up by its result (one
// of the Tokenize values) and records what tokenization added to the
// routing decision, in seconds.
func (m *Metrics) RecordTokenizeLookup(ctx context.Context, result string, waited float64) {
	switch result {
	case TokenizeHit:
		m.kv.cache.Add(ctx, 1, m.kv.cacheHit...)
	case TokenizePartial:
		m.kv.cache.Add(ctx, 1, m.kv.cachePartial...)
	case TokenizeMiss:
		m.kv.cache.Add(ctx, 1, m.kv.cacheMiss...)
	}
	m.kv.wait.Record(ctx, waited)
}
