package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	prometheusbridge "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Gone engines' series.
//
// Under cumulative temporality the OTel Go SDK (v1.47) keeps every
// attribute set a synchronous instrument has seen, for the life of the
// meter provider, and every collection reports it again: an engine that
// went away (a Kubernetes pod replaced by a rollout, an engine removed by a
// reload) would have its switchboard.engine.* histogram and counter series
// exported on every scrape and push forever, and engine churn would grow
// the exported cardinality without bound. The SDK cannot forget a
// synchronous series yet (open-telemetry/opentelemetry-go#8905,
// "Experimental synchronous instrument Finish support", covers
// Int64Counter only and is not in v1.47), so the series are dropped where
// they leave the process: the Prometheus gatherer and the OTLP exporter.
//
// The GenAI client instruments (gen_ai.client.*) carry no engine attribute
// but server.address and server.port, the engine's URL host and port:
// under Kubernetes discovery each pod's IP, so they churn the same way.
// [WithServerLive] drops those by server.

// DefaultSeriesLinger is how long the series of an engine that is no
// longer live keep being exported, counted from the last collection that
// found the engine live ([Providers.SetEngineLive]), so its last samples
// reach every exporter at least once more. Five minutes: more than twice
// the OTLP default export interval (OTEL_METRIC_EXPORT_INTERVAL, 60 s) and
// a typical scrape interval (15 s to 1 min), and as long as Prometheus's
// staleness lookback and the Collector Prometheus exporter's default
// metric_expiration, after which those stop showing a series anyway.
const DefaultSeriesLinger = 5 * time.Minute

// SeriesOption configures [Providers.SetEngineLive].
type SeriesOption func(*seriesRule)

// WithSeriesLinger sets how long a gone engine's series keep being
// exported (default [DefaultSeriesLinger]). It should exceed the longest
// interval between two collections (the OTLP export interval, the
// Prometheus scrape interval) plus the time the engine takes to go from
// its last live collection to gone; a shorter linger may drop an engine's
// last samples before any exporter saw them. Zero or negative keeps the
// default.
func WithSeriesLinger(d time.Duration) SeriesOption {
	return func(r *seriesRule) {
		if d > 0 {
			r.linger = d
		}
	}
}

// WithServerLive makes [Providers.SetEngineLive] drop, too, the data
// points of the GenAI client instruments (gen_ai.client.operation.duration,
// gen_ai.client.operation.time_to_first_chunk,
// gen_ai.client.operation.time_per_output_chunk, gen_ai.client.token.usage:
// the gen_ai.client.* metrics of [ScopeName], gen_ai_client_* families on
// the Prometheus handler) whose server ([AttrServerAddress] and
// [AttrServerPort], as [WithServer] set them) no live engine has, once it
// has been gone for the linger, with the same linger and the same
// bookkeeping as engine names, keyed by (address, port) instead.
//
// live is given the point's server.address, a string, and its
// server.port, an int attribute (the Prometheus label parsed as a decimal
// number), or 0 when the point has none (or one of another type or that
// does not parse): live should then match the address on any port. A
// point without server.address (or with an empty one: an engine built
// without [WithServer]) is never dropped by server. A point that
// has an engine attribute as well is kept only while both its engine and
// its server are live or within the linger.
//
// Only those instruments are judged by server: other instruments with a
// server.address name other servers (instrumentation on the same meter
// provider, such as otelhttp's http.server.* metrics, carries the
// gateway's own address, from the request's Host), which no engine has, so
// they would be dropped after the linger. live is called like SetEngineLive's (at collection time,
// once per (address, port) per collection, possibly from two collections
// at once): it must be cheap and safe for concurrent use. A nil live
// judges no point by server (the default).
func WithServerLive(live func(address string, port int) bool) SeriesOption {
	return func(r *seriesRule) { r.server = live }
}

// withSeriesClock sets the clock the linger is measured by (tests); nil
// keeps time.Now.
func withSeriesClock(now func() time.Time) SeriesOption {
	return func(r *seriesRule) {
		if now != nil {
			r.now = now
		}
	}
}

// SetEngineLive makes every metric export drop the data points whose
// engine attribute ([AttrEngine]) names an engine that live reports is no
// longer live, once it has been gone for the linger ([WithSeriesLinger],
// default [DefaultSeriesLinger]): the Prometheus handler's samples (a
// metric family left with none is left out), and the points of the OTLP
// exporter [Setup] built. Data points with no engine attribute (the
// gateway's own overhead, target_info, the runtime collectors, the
// cardinality limit's overflow series, and the gen_ai.client.* instruments
// unless [WithServerLive] judges them by server) are never dropped, and
// neither are delta-temporality points (each is new data; the SDK forgets
// a delta series that saw no measurement). The SDK still holds the dropped
// series (bounded by the cardinality limit); an engine that comes back
// under the same name (a server at the same address and port) is exported
// again, its cumulative values continuing where they were.
//
// live is called at collection time only (a Prometheus scrape, an OTLP
// export), never on the request path, once per engine name per
// collection, possibly from two collections at once: it must be cheap and
// safe for concurrent use. An engine that became live and went away
// between two collections is dropped without a linger (no collection saw
// it live); so is one first seen after [Setup] already gone.
//
// The linger is counted from the last collection that found the engine
// live, and the bookkeeping holds one entry per engine (and, with
// [WithServerLive], per server) seen live within the last linger: its
// memory follows the live engines and the churn rate, not the number of
// engines that ever existed.
//
// Until SetEngineLive is called, everything is exported; a nil live
// restores that. It may be called at any time, from any goroutine. On
// Providers not built by [Setup] it does nothing.
func (p *Providers) SetEngineLive(live func(engine string) bool, opts ...SeriesOption) {
	if p == nil || p.series == nil {
		return
	}
	if live == nil {
		p.series.rule.Store(nil)
		return
	}
	r := &seriesRule{live: live, linger: DefaultSeriesLinger, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(r)
		}
	}
	p.series.rule.Store(r)
}

// seriesRule is what SetEngineLive installed.
type seriesRule struct {
	live   func(engine string) bool
	server func(address string, port int) bool // nil: no point is judged by server (WithServerLive)
	linger time.Duration
	now    func() time.Time
}

// serverKey is a GenAI data point's server: its server.address, and its
// server.port or 0 when it has none.
type serverKey struct {
	address string
	port    int
}

// seriesFilter decides, at collection time, which engines' (and
// servers') series are exported. One filter is shared by every exporter of
// a Providers, so a collection by either (scrape or push) counts as having
// seen an engine live. Safe for concurrent use.
type seriesFilter struct {
	rule atomic.Pointer[seriesRule] // nil: export everything

	mu sync.Mutex
	// lastLive is, per engine name, the time of the last collection that
	// found it live. Entries older than the linger are swept at the end
	// of every collection, so it holds the engines live within the last
	// linger and no more.
	lastLive map[string]time.Time
	// serverLastLive is lastLive for servers (WithServerLive), swept the
	// same way: the servers live within the last linger.
	serverLastLive map[serverKey]time.Time
}

func newSeriesFilter() *seriesFilter {
	return &seriesFilter{lastLive: map[string]time.Time{}, serverLastLive: map[serverKey]time.Time{}}
}

// seriesPass is one collection's view of the filter: one clock reading
// and one verdict per engine name and per server.
type seriesPass struct {
	f              *seriesFilter
	rule           *seriesRule
	now            time.Time
	verdicts       map[string]bool
	serverVerdicts map[serverKey]bool
}

// begin starts filtering one collection, or returns nil when everything is
// exported (no rule installed, or no filter).
func (f *seriesFilter) begin() *seriesPass {
	if f == nil {
		return nil
	}
	r := f.rule.Load()
	if r == nil {
		return nil
	}
	return &seriesPass{f: f, rule: r, now: r.now()}
}

// keep reports whether the series of engine are exported in this pass.
func (s *seriesPass) keep(engine string) bool {
	if k, ok := s.verdicts[engine]; ok {
		return k
	}
	k := judge(s, s.f.lastLive, engine, s.rule.live(engine))
	if s.verdicts == nil {
		s.verdicts = map[string]bool{}
	}
	s.verdicts[engine] = k
	return k
}

// keepServer reports whether the GenAI series of server k are exported in
// this pass. Call only when the rule has a server liveness.
func (s *seriesPass) keepServer(k serverKey) bool {
	if v, ok := s.serverVerdicts[k]; ok {
		return v
	}
	v := judge(s, s.f.serverLastLive, k, s.rule.server(k.address, k.port))
	if s.serverVerdicts == nil {
		s.serverVerdicts = map[serverKey]bool{}
	}
	s.serverVerdicts[k] = v
	return v
}

// judge returns the verdict on key k of book (lastLive or serverLastLive),
// which this pass found live or not: kept while live, and for the linger
// after the last pass that found it live, which it records.
func judge[K comparable](s *seriesPass, book map[K]time.Time, k K, live bool) bool {
	s.f.mu.Lock()
	t, seen := book[k]
	if live && (!seen || s.now.After(t)) {
		book[k] = s.now
	}
	s.f.mu.Unlock()
	return live || seen && s.now.Sub(t) < s.rule.linger
}

// keepSet reports whether a data point with attributes set is exported:
// one without an engine attribute always is.
func (s *seriesPass) keepSet(set *attribute.Set) bool {
	v, ok := set.Value(AttrEngine)
	return !ok || v.Type() != attribute.STRING || s.keep(v.AsString())
}

// keepGenAISet is keepSet for a point of a GenAI client instrument (call
// only when the rule has a server liveness): its engine, if it has one,
// and its server, if it has a server.address, must both be kept. Both are
// asked, so the bookkeeping records every live one a pass saw.
func (s *seriesPass) keepGenAISet(set *attribute.Set) bool {
	keep := s.keepSet(set)
	v, ok := set.Value(AttrServerAddress)
	if !ok || v.Type() != attribute.STRING || v.AsString() == "" {
		return keep
	}
	k := serverKey{address: v.AsString()}
	if p, ok := set.Value(AttrServerPort); ok && p.Type() == attribute.INT64 {
		k.port = int(p.AsInt64())
	}
	return s.keepServer(k) && keep
}

// The Prometheus label names of server.address and server.port: the
// exporter escapes a dot to an underscore (unless configured to keep UTF-8
// names, so both spellings are read).
const (
	promServerAddress = "server_address"
	promServerPort    = "server_port"
)

// keepLabels is keepSet for a Prometheus sample's labels, and
// keepGenAISet when genai (a family of a GenAI client instrument, with a
// server liveness).
func (s *seriesPass) keepLabels(labels []*dto.LabelPair, genai bool) bool {
	var engine, address, port string
	hasEngine := false
	for _, l := range labels {
		switch l.GetName() {
		case string(AttrEngine):
			engine, hasEngine = l.GetValue(), true
		case promServerAddress, string(AttrServerAddress):
			address = l.GetValue()
		case promServerPort, string(AttrServerPort):
			port = l.GetValue()
		}
	}
	keep := !hasEngine || s.keep(engine)
	if genai && address != "" {
		k := serverKey{address: address}
		if port != "" {
			k.port, _ = strconv.Atoi(port) // 0 when not a number
		}
		keep = s.keepServer(k) && keep
	}
	return keep
}

// genAIMetric reports whether metric name of scope is a GenAI client
// instrument of Switchboard's, judged by server (WithServerLive).
func genAIMetric(scope, name string) bool {
	return scope == ScopeName && strings.HasPrefix(name, "gen_ai.client.")
}

// genAIFamily is genAIMetric for a Prometheus family name (the exporter
// runs WithoutScopeInfo, so the scope is not on the samples: the name
// alone tells, gen_ai_client_* escaped or gen_ai.client.* kept as UTF-8).
func genAIFamily(name string) bool {
	return strings.HasPrefix(name, "gen_ai_client_") || strings.HasPrefix(name, "gen_ai.client.")
}

// end sweeps the entries past the linger: an engine or server not seen
// live for that long needs no entry (its series are dropped without one).
func (s *seriesPass) end() {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	sweep(s.f.lastLive, s.now, s.rule.linger)
	sweep(s.f.serverLastLive, s.now, s.rule.linger)
}

// sweep deletes the entries of book last found live a linger or more
// before now.
func sweep[K comparable](book map[K]time.Time, now time.Time, linger time.Duration) {
	for k, t := range book {
		if now.Sub(t) >= linger {
			delete(book, k)
		}
	}
}

// keepPoints returns pts without the points keep rejects: pts itself when
// it keeps them all, else a new slice (the SDK reuses pts between
// collections, so it is never written).
func keepPoints[P any](pts []P, attrs func(*P) *attribute.Set, keep func(*attribute.Set) bool) ([]P, bool) {
	var out []P
	dropped := false
	for i := range pts {
		if keep(attrs(&pts[i])) {
			if dropped {
				out = append(out, pts[i])
			}
			continue
		}
		if !dropped {
			dropped = true
			out = make([]P, i, len(pts)-1)
			copy(out, pts[:i])
		}
	}
	if !dropped {
		return pts, false
	}
	return out, true
}

func dpAttrs[N int64 | float64](p *metricdata.DataPoint[N]) *attribute.Set { return &p.Attributes }

func histAttrs[N int64 | float64](p *metricdata.HistogramDataPoint[N]) *attribute.Set {
	return &p.Attributes
}

func expHistAttrs[N int64 | float64](p *metricdata.ExponentialHistogramDataPoint[N]) *attribute.Set {
	return &p.Attributes
}

func summaryAttrs(p *metricdata.SummaryDataPoint) *attribute.Set { return &p.Attributes }

// keepCumulative is keepPoints for a cumulative aggregation; a delta one
// is kept whole (each delta point is new data, and the SDK forgets delta
// series itself).
func keepCumulative[P any](t metricdata.Temporality, pts []P, attrs func(*P) *attribute.Set, keep func(*attribute.Set) bool) ([]P, bool) {
	if t == metricdata.DeltaTemporality {
		return pts, false
	}
	return keepPoints(pts, attrs, keep)
}

// filterData returns d without the data points keep rejects, the number
// of points left, and whether anything was dropped. Delta sums and
// histograms are kept whole; an aggregation of a type it does not know is
// kept whole.
func filterData(d metricdata.Aggregation, keep func(*attribute.Set) bool) (metricdata.Aggregation, int, bool) {
	var n int
	var ch bool
	switch a := d.(type) {
	case metricdata.Sum[int64]:
		a.DataPoints, ch = keepCumulative(a.Temporality, a.DataPoints, dpAttrs[int64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.Sum[float64]:
		a.DataPoints, ch = keepCumulative(a.Temporality, a.DataPoints, dpAttrs[float64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.Gauge[int64]:
		a.DataPoints, ch = keepPoints(a.DataPoints, dpAttrs[int64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.Gauge[float64]:
		a.DataPoints, ch = keepPoints(a.DataPoints, dpAttrs[float64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.Histogram[int64]:
		a.DataPoints, ch = keepCumulative(a.Temporality, a.DataPoints, histAttrs[int64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.Histogram[float64]:
		a.DataPoints, ch = keepCumulative(a.Temporality, a.DataPoints, histAttrs[float64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.ExponentialHistogram[int64]:
		a.DataPoints, ch = keepCumulative(a.Temporality, a.DataPoints, expHistAttrs[int64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.ExponentialHistogram[float64]:
		a.DataPoints, ch = keepCumulative(a.Temporality, a.DataPoints, expHistAttrs[float64], keep)
		d, n = a, len(a.DataPoints)
	case metricdata.Summary:
		a.DataPoints, ch = keepPoints(a.DataPoints, summaryAttrs, keep)
		d, n = a, len(a.DataPoints)
	default:
		return d, 1, false
	}
	return d, n, ch
}

// resourceMetrics returns rm without the data points s drops: rm itself
// when nothing is dropped, else a copy that shares everything it kept with
// rm and writes nothing of it. A metric left without points, and a scope
// left without metrics, are left out.
func (s *seriesPass) resourceMetrics(rm *metricdata.ResourceMetrics) *metricdata.ResourceMetrics {
	var out *metricdata.ResourceMetrics
	keepEngine, keepGenAI := s.keepSet, s.keepSet
	if s.rule.server != nil {
		keepGenAI = s.keepGenAISet
	}
	for i, sm := range rm.ScopeMetrics {
		var ms []metricdata.Metrics
		changed := false
		for j, m := range sm.Metrics {
			keep := keepEngine
			if genAIMetric(sm.Scope.Name, m.Name) {
				keep = keepGenAI
			}
			d, n, ch := filterData(m.Data, keep)
			if !ch {
				if changed {
					ms = append(ms, m)
				}
				continue
			}
			if !changed {
				changed = true
				ms = make([]metricdata.Metrics, j, len(sm.Metrics))
				copy(ms, sm.Metrics[:j])
			}
			if n > 0 {
				m.Data = d
				ms = append(ms, m)
			}
		}
		if !changed {
			if out != nil {
				out.ScopeMetrics = append(out.ScopeMetrics, sm)
			}
			continue
		}
		if out == nil {
			out = &metricdata.ResourceMetrics{Resource: rm.Resource, ScopeMetrics: make([]metricdata.ScopeMetrics, i, len(rm.ScopeMetrics))}
			copy(out.ScopeMetrics, rm.ScopeMetrics[:i])
		}
		if len(ms) > 0 {
			sm.Metrics = ms
			out.ScopeMetrics = append(out.ScopeMetrics, sm)
		}
	}
	if out == nil {
		return rm
	}
	return out
}

// families returns mfs without the samples s drops: mfs itself when
// nothing is dropped, else a new slice; a family that loses samples is
// replaced by a new one (mfs's are not written), and one left with none is
// left out.
func (s *seriesPass) families(mfs []*dto.MetricFamily) []*dto.MetricFamily {
	var out []*dto.MetricFamily
	changed := false
	for i, mf := range mfs {
		var kept []*dto.Metric
		dropped := false
		genai := s.rule.server != nil && genAIFamily(mf.GetName())
		for j, m := range mf.GetMetric() {
			if s.keepLabels(m.GetLabel(), genai) {
				if dropped {
					kept = append(kept, m)
				}
				continue
			}
			if !dropped {
				dropped = true
				kept = make([]*dto.Metric, j, len(mf.GetMetric())-1)
				copy(kept, mf.GetMetric()[:j])
			}
		}
		if !dropped {
			if changed {
				out = append(out, mf)
			}
			continue
		}
		if !changed {
			changed = true
			out = make([]*dto.MetricFamily, i, len(mfs))
			copy(out, mfs[:i])
		}
		if len(kept) > 0 {
			out = append(out, &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit, Metric: kept})
		}
	}
	if !changed {
		return mfs
	}
	return out
}

// seriesGatherer is the Prometheus handler's gatherer: g's families
// without the gone engines' (and servers') samples.
type seriesGatherer struct {
	g prometheus.Gatherer
	f *seriesFilter
}

var _ prometheus.Gatherer = seriesGatherer{}

// Gather implements prometheus.Gatherer. A partial result that comes with
// an error is filtered too, and the error returned with it.
func (g seriesGatherer) Gather() ([]*dto.MetricFamily, error) {
	mfs, err := g.g.Gather()
	pass := g.f.begin()
	if pass == nil {
		return mfs, err
	}
	defer pass.end()
	return pass.families(mfs), err
}

// seriesExporter is an OTLP metric exporter that leaves out the gone
// engines' (and servers') data points. Temporality, Aggregation, ForceFlush and Shutdown
// are the wrapped exporter's, so the periodic reader selects what the
// exporter's own OTEL_* settings ask for (temporality preference
// included).
type seriesExporter struct {
	sdkmetric.Exporter
	f *seriesFilter
}

var _ sdkmetric.Exporter = (*seriesExporter)(nil)

// Export implements sdkmetric.Exporter: rm, or a filtered copy of it,
// goes to the wrapped exporter. rm is not written.
func (e *seriesExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	pass := e.f.begin()
	if pass == nil {
		return e.Exporter.Export(ctx, rm)
	}
	defer pass.end()
	return e.Exporter.Export(ctx, pass.resourceMetrics(rm))
}

// newMetricReader builds the metric reader OTEL_METRICS_EXPORTER asks for.
// For "otlp" (also when it is unset) it builds what autoexport would (an
// OTLP exporter for OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, else
// OTEL_EXPORTER_OTLP_PROTOCOL: grpc, or http/protobuf by default; the
// exporter reads its endpoint, headers, compression, timeout and
// temporality preference itself; the producers of OTEL_METRICS_PRODUCERS;
// a periodic reader, which reads OTEL_METRIC_EXPORT_INTERVAL and
// OTEL_METRIC_EXPORT_TIMEOUT), but with the exporter wrapped by f:
// autoexport's reader cannot be wrapped (an sdkmetric.Reader cannot be
// implemented outside the SDK) and it takes no exporter of ours. Any other
// value (console, none, or one registered with autoexport) goes to
// autoexport unfiltered.
func newMetricReader(ctx context.Context, f *seriesFilter, events *EventHistograms) (_ sdkmetric.Reader, eventsOK bool, _ error) {
	if e := os.Getenv("OTEL_METRICS_EXPORTER"); e != "" && e != "otlp" {
		r, err := autoexport.NewMetricReader(ctx)
		// "none" has no reader to miss the producer; any other exporter
		// takes no producer of ours.
		return r, err == nil && autoexport.IsNoneMetricReader(r), err
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdkmetric.Exporter
	var err error
	switch proto {
	case "grpc":
		exp, err = otlpmetricgrpc.New(ctx)
	case "", "http/protobuf":
		exp, err = otlpmetrichttp.New(ctx)
	default:
		return nil, false, fmt.Errorf("invalid OTLP protocol %q for metrics: want grpc or http/protobuf", proto)
	}
	if err != nil {
		return nil, false, err
	}
	producers, err := metricProducers()
	if err != nil {
		return nil, false, errors.Join(err, exp.Shutdown(ctx))
	}
	var opts []sdkmetric.PeriodicReaderOption
	for _, pr := range producers {
		opts = append(opts, sdkmetric.WithProducer(pr))
	}
	// The per-event histograms are explicit-bucket histograms: they go
	// to this reader when its histogram aggregation is that too
	// (OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION unset or
	// explicit_bucket_histogram), with its temporality.
	switch a := exp.Aggregation(sdkmetric.InstrumentKindHistogram).(type) {
	case sdkmetric.AggregationExplicitBucketHistogram:
		opts = append(opts, sdkmetric.WithProducer(events.Producer(exp.Temporality(sdkmetric.InstrumentKindHistogram), a.NoMinMax)))
		eventsOK = true
	case sdkmetric.AggregationDefault:
		opts = append(opts, sdkmetric.WithProducer(events.Producer(exp.Temporality(sdkmetric.InstrumentKindHistogram), false)))
		eventsOK = true
	}
	return sdkmetric.NewPeriodicReader(&seriesExporter{Exporter: exp, f: f}, opts...), eventsOK, nil
}

// metricProducers returns the producers OTEL_METRICS_PRODUCERS names, as
// autoexport reads it (a comma-separated list of "prometheus", the bridge
// from the default Prometheus registry, and "none"): an unknown name is an
// error.
func metricProducers() ([]sdkmetric.Producer, error) {
	v := os.Getenv("OTEL_METRICS_PRODUCERS")
	if v == "" {
		return nil, nil
	}
	var out []sdkmetric.Producer
	seen := map[string]bool{}
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if seen[name] {
			continue
		}
		seen[name] = true
		switch name {
		case "prometheus":
			out = append(out, prometheusbridge.NewMetricProducer())
		case "none":
		default:
			return nil, fmt.Errorf("OTEL_METRICS_PRODUCERS: unknown metric producer %q: want prometheus or none", name)
		}
	}
	return out, nil
}
