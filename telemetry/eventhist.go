package telemetry

import (
	"context"
	"errors"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// EventHistograms holds the two histograms recorded per stream event.
//
// Two instruments are recorded once per content event of every stream,
// not once per request: switchboard.engine.inter_token_latency and
// gen_ai.client.operation.time_per_output_chunk. Through the OTel Go SDK
// (v1.47) each record resolves its attribute set again
// (attrnorm.SetDedup walks every attribute), looks the series up in a
// map, and offers the sample to the exemplar reservoir: 0.36 µs for the
// two (BenchmarkRecordInterToken/sdk; 0.03 µs here,
// BenchmarkRecordInterToken/events), 6.6% of the gateway's CPU on a
// 16-token stream (BENCHMARKS.md, issue 24).
//
// EventHistograms keeps those two instruments outside the SDK: each
// (instrument, attribute set) is one series of atomic bucket counters that
// the engine's cached [Attrs] point at directly, so a record is a bucket
// search and a few atomic adds, with no lookup and no allocation. The
// series reach every reader through a [sdkmetric.Producer] per reader
// ([EventHistograms.Producer]), with the reader's temporality, as the
// same explicit-bucket histograms (same names, units, descriptions,
// boundaries and attributes) the SDK would have produced. What differs:
// these two instruments carry no exemplars (the per-request histograms,
// time to first token, duration and the stream's largest gap, keep
// theirs, and they find the same traces), and their delta points carry no
// min and max. [Setup] uses them only when every reader it builds can
// take them (the Prometheus reader and its own OTLP reader with
// explicit-bucket histograms); [NewMetrics] without [WithEventHistograms]
// records both through the SDK as before.
//
// One EventHistograms serves one [Metrics]. Create it with
// [NewEventHistograms], register [EventHistograms.Producer] on every
// reader of the meter provider, and pass it to [NewMetrics] with
// [WithEventHistograms]. Safe for concurrent use.
type EventHistograms struct {
	start time.Time
	// scope is set when a Metrics binds the histograms (the scope's
	// version is the Metrics'); nil until then, and Produce reports
	// nothing.
	scope atomic.Pointer[instrumentation.Scope]
	itl   *eventInstrument
	chunk *eventInstrument
}

// NewEventHistograms returns empty per-event histograms. cardinalityLimit
// caps the series of each instrument as the SDK's WithCardinalityLimit
// does (telemetry.cardinality_limit): past limit-1 attribute sets, new
// sets record into one overflow series, otel.metric.overflow=true. Zero
// or negative: no cap.
func NewEventHistograms(cardinalityLimit int) *EventHistograms {
	return &EventHistograms{
		start: time.Now(),
		itl:   newEventInstrument(InterTokenLatencyName, "s", itlDescription, itlBuckets, cardinalityLimit),
		chunk: newEventInstrument(GenAIClientTimePerOutputChunkName, "s", chunkDescription, genaiDurationBuckets, cardinalityLimit),
	}
}

// errEventHistogramsBound is returned by NewMetrics when the histograms
// already belong to another Metrics.
var errEventHistogramsBound = errors.New("telemetry: event histograms already bound to a Metrics")

// bind makes h report under scope; it fails when h is already bound.
func (h *EventHistograms) bind(scope instrumentation.Scope) error {
	if !h.scope.CompareAndSwap(nil, &scope) {
		return errEventHistogramsBound
	}
	return nil
}

// Producer returns a producer of the histograms for one reader, with the
// reader's temporality for histograms (the Prometheus reader and the OTLP
// default are cumulative; OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
// may make OTLP's delta). noMinMax leaves min and max out, as the reader's
// explicit-bucket aggregation says. Give each reader its own producer: a
// delta producer remembers what it last reported.
func (h *EventHistograms) Producer(temporality metricdata.Temporality, noMinMax bool) sdkmetric.Producer {
	return &eventProducer{h: h, delta: temporality == metricdata.DeltaTemporality, noMinMax: noMinMax}
}

// eventInstrument is one histogram instrument: its series by attribute
// set.
type eventInstrument struct {
	name, unit, desc string
	bounds           []float64
	limit            int // the cardinality limit; <= 0 none

	mu       sync.Mutex
	byAttr   map[attribute.Distinct]*eventSeries
	all      []*eventSeries // creation order, for a stable export order
	overflow *eventSeries   // past the limit; nil until needed
}

func newEventInstrument(name, unit, desc string, bounds []float64, limit int) *eventInstrument {
	return &eventInstrument{name: name, unit: unit, desc: desc, bounds: bounds, limit: limit, byAttr: map[attribute.Distinct]*eventSeries{}}
}

// overflowSet is the attribute set of the series past the cardinality
// limit, the SDK's.
var overflowSet = attribute.NewSet(attribute.Bool("otel.metric.overflow", true))

// series returns the series of set, creating it on first use. Every
// [Attrs] with an equal set (an attempt's twin, another incarnation of the
// same engine) shares it, so one exported point covers them all, as one
// SDK series would.
func (in *eventInstrument) series(set attribute.Set) *eventSeries {
	in.mu.Lock()
	defer in.mu.Unlock()
	if s, ok := in.byAttr[set.Equivalent()]; ok {
		return s
	}
	if in.limit > 0 && len(in.byAttr) >= in.limit-1 {
		if in.overflow == nil {
			in.overflow = in.newSeries(overflowSet)
		}
		return in.overflow
	}
	s := in.newSeries(set)
	in.byAttr[set.Equivalent()] = s
	return s
}

// newSeries makes an empty series of set and lists it for export. The
// caller holds in.mu.
func (in *eventInstrument) newSeries(set attribute.Set) *eventSeries {
	s := &eventSeries{attrs: set, bounds: in.bounds, counts: make([]atomic.Uint64, len(in.bounds)+1)}
	s.min.Store(math.Float64bits(math.Inf(1)))
	s.max.Store(math.Float64bits(math.Inf(-1)))
	in.all = append(in.all, s)
	return s
}

// snapshot returns the instrument's series, for one collection.
func (in *eventInstrument) snapshot() []*eventSeries {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.all[:len(in.all):len(in.all)]
}

// eventSeries is one cumulative explicit-bucket histogram series, updated
// with atomics only. Bucket i counts the samples in (bounds[i-1],
// bounds[i]]; the last counts those above every bound, as the OTel
// explicit-bucket aggregation does. The count is the sum of the buckets,
// so a point read while samples arrive still has a count equal to its
// buckets' total (the Prometheus +Inf bucket).
type eventSeries struct {
	attrs  attribute.Set
	bounds []float64
	counts []atomic.Uint64
	sum    atomic.Uint64 // math.Float64bits
	min    atomic.Uint64 // math.Float64bits; +Inf until the first sample
	max    atomic.Uint64 // math.Float64bits; -Inf until the first sample
}

// record adds one sample. NaN and infinite samples are dropped (a
// duration is never either). It does not allocate.
func (s *eventSeries) record(v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	// The sum and the extrema first, the bucket last: a collection that
	// sees the sample counted sees it in the sum, min and max too. The
	// reverse does not hold: a point read while samples arrive may have a
	// sum (and a min or max) that includes a sample its buckets do not
	// count yet; the next collection counts it. The SDK's swap of a hot
	// and a cold copy is exact at a cost per record this path avoids.
	for {
		old := s.sum.Load()
		if s.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	for {
		old := s.min.Load()
		if v >= math.Float64frombits(old) || s.min.CompareAndSwap(old, math.Float64bits(v)) {
			break
		}
	}
	for {
		old := s.max.Load()
		if v <= math.Float64frombits(old) || s.max.CompareAndSwap(old, math.Float64bits(v)) {
			break
		}
	}
	s.counts[sort.SearchFloat64s(s.bounds, v)].Add(1)
}

// read returns the series' bucket counts (into counts, reused when long
// enough), their total and the sum.
func (s *eventSeries) read(counts []uint64) ([]uint64, uint64, float64) {
	counts = counts[:0]
	var total uint64
	for i := range s.counts {
		c := s.counts[i].Load()
		counts = append(counts, c)
		total += c
	}
	return counts, total, math.Float64frombits(s.sum.Load())
}

// eventProducer reports the histograms to one reader.
type eventProducer struct {
	h        *EventHistograms
	delta    bool
	noMinMax bool

	// For delta temporality: what the last collection reported of each
	// series, and when.
	mu   sync.Mutex
	last map[*eventSeries]*eventLast
	prev time.Time
}

type eventLast struct {
	counts []uint64
	total  uint64
	sum    float64
}

var _ sdkmetric.Producer = (*eventProducer)(nil)

// Produce implements [sdkmetric.Producer]: one explicit-bucket histogram
// per instrument that has a series, each series one data point. It never
// fails.
func (p *eventProducer) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	scope := p.h.scope.Load()
	if scope == nil {
		return nil, nil
	}
	now := time.Now()
	start := p.h.start
	if p.delta {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.last == nil {
			p.last = map[*eventSeries]*eventLast{}
		} else {
			start = p.prev
		}
		p.prev = now
	}
	var out []metricdata.Metrics
	for _, in := range [...]*eventInstrument{p.h.itl, p.h.chunk} {
		if m, ok := p.collect(in, start, now); ok {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return []metricdata.ScopeMetrics{{Scope: *scope, Metrics: out}}, nil
}

// collect returns in's data points; false when none has a sample (since
// the last collection, for delta).
func (p *eventProducer) collect(in *eventInstrument, start, now time.Time) (metricdata.Metrics, bool) {
	temporality := metricdata.CumulativeTemporality
	if p.delta {
		temporality = metricdata.DeltaTemporality
	}
	var pts []metricdata.HistogramDataPoint[float64]
	bounds := slices.Clone(in.bounds) // the exporter's own copy
	for _, s := range in.snapshot() {
		counts, total, sum := s.read(make([]uint64, 0, len(s.counts)))
		if p.delta {
			l := p.last[s]
			if l == nil {
				l = &eventLast{}
				p.last[s] = l
			}
			if total == l.total {
				continue
			}
			d := make([]uint64, len(counts))
			for i, c := range counts {
				if i < len(l.counts) {
					d[i] = c - l.counts[i]
				} else {
					d[i] = c
				}
			}
			l.counts, l.total, l.sum, counts, total, sum = counts, total, sum, d, total-l.total, sum-l.sum
		} else if total == 0 {
			continue
		}
		pt := metricdata.HistogramDataPoint[float64]{
			Attributes:   s.attrs,
			StartTime:    start,
			Time:         now,
			Count:        total,
			Bounds:       bounds,
			BucketCounts: counts,
			Sum:          sum,
		}
		if !p.delta && !p.noMinMax {
			pt.Min = metricdata.NewExtrema(math.Float64frombits(s.min.Load()))
			pt.Max = metricdata.NewExtrema(math.Float64frombits(s.max.Load()))
		}
		pts = append(pts, pt)
	}
	if len(pts) == 0 {
		return metricdata.Metrics{}, false
	}
	return metricdata.Metrics{
		Name:        in.name,
		Description: in.desc,
		Unit:        in.unit,
		Data:        metricdata.Histogram[float64]{Temporality: temporality, DataPoints: pts},
	}, true
}
