package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	"google.golang.org/grpc"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// newFakeClock returns the linger's clock in these tests.
func newFakeClock() *testutil.Clock {
	return testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

// liveSet is the engine liveness the tests switch. Safe for concurrent use.
type liveSet struct {
	mu    sync.Mutex
	names map[string]bool
	calls int
}

func newLiveSet(names ...string) *liveSet {
	l := &liveSet{names: map[string]bool{}}
	for _, n := range names {
		l.names[n] = true
	}
	return l
}

func (l *liveSet) Live(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	return l.names[name]
}

func (l *liveSet) set(name string, live bool) {
	l.mu.Lock()
	l.names[name] = live
	l.mu.Unlock()
}

// sdkEngines returns, per metric name, the engine attribute of each data
// point ("-" for a point without one), sorted.
func sdkEngines(rm *metricdata.ResourceMetrics) map[string][]string {
	return sdkPoints(rm, func(_, metric string) string { return metric }, func(s attribute.Set) string {
		if v, ok := s.Value(AttrEngine); ok {
			return v.AsString()
		}
		return "-"
	})
}

// sdkPoints returns, per key(scope, metric), of(attributes) for each data
// point of the histogram and int64 sum metrics (the type's name for any
// other), sorted.
func sdkPoints(rm *metricdata.ResourceMetrics, key func(scope, metric string) string, of func(attribute.Set) string) map[string][]string {
	out := map[string][]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var vs []string
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					vs = append(vs, of(p.Attributes))
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					vs = append(vs, of(p.Attributes))
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					vs = append(vs, of(p.Attributes))
				}
			default:
				vs = append(vs, fmt.Sprintf("%T", d))
			}
			slices.Sort(vs)
			out[key(sm.Scope.Name, m.Name)] = vs
		}
	}
	return out
}

// recordTwoEngines records, on e1 and e2, a TTFT sample (with its
// gen_ai.* twin, which has no engine attribute), a parse error on e2 only,
// and a step duration (no engine).
func recordTwoEngines(t *testing.T, m *Metrics) {
	t.Helper()
	ctx := context.Background()
	a1 := m.Engine("e1").Attrs("m1", "chat", "chat")
	a2 := m.Engine("e2").Attrs("m1", "chat", "chat")
	m.RecordFirstToken(ctx, a1, 0.1)
	m.RecordFirstToken(ctx, a2, 0.2)
	m.RecordParseError(ctx, a2)
	m.RecordStep(ctx, StepParse, 0.0001)
}

func filterOnce(f *seriesFilter, rm *metricdata.ResourceMetrics) *metricdata.ResourceMetrics {
	pass := f.begin()
	if pass == nil {
		return rm
	}
	defer pass.end()
	return pass.resourceMetrics(rm)
}

func TestSeriesFilterManualReader(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	recordTwoEngines(t, m)
	collect := func() *metricdata.ResourceMetrics {
		rm := &metricdata.ResourceMetrics{}
		if err := reader.Collect(context.Background(), rm); err != nil {
			t.Fatal(err)
		}
		return rm
	}

	f := newSeriesFilter()
	rm := collect()
	if got := filterOnce(f, rm); got != rm {
		t.Error("no rule installed: the export is not rm itself")
	}

	clk := newFakeClock()
	live := newLiveSet("e1", "e2")
	const linger = 5 * time.Minute
	f.rule.Store(&seriesRule{live: live.Live, linger: linger, now: clk.Now})
	rm = collect()
	if got := filterOnce(f, rm); got != rm {
		t.Error("every engine live: the export is not rm itself")
	}
	all := sdkEngines(rm)
	if want := []string{"e1", "e2"}; !slices.Equal(all[TimeToFirstTokenName], want) || !slices.Equal(all[ParseErrorsName], []string{"e2"}) {
		t.Fatalf("collected %v, want %s on e1 and e2, %s on e2", all, TimeToFirstTokenName, ParseErrorsName)
	}

	// e2 goes away: exported for the linger after the last collection
	// that found it live, then left out.
	live.set("e2", false)
	clk.Advance(linger - time.Second)
	if got := sdkEngines(filterOnce(f, collect())); !slices.Equal(got[TimeToFirstTokenName], []string{"e1", "e2"}) {
		t.Errorf("within the linger: %s on %v, want e1 and e2", TimeToFirstTokenName, got[TimeToFirstTokenName])
	}
	clk.Advance(time.Second)
	rm = collect()
	before := sdkEngines(rm)
	got := sdkEngines(filterOnce(f, rm))
	if !slices.Equal(got[TimeToFirstTokenName], []string{"e1"}) {
		t.Errorf("past the linger: %s on %v, want e1 only", TimeToFirstTokenName, got[TimeToFirstTokenName])
	}
	if _, ok := got[ParseErrorsName]; ok {
		t.Errorf("past the linger: %s (e2 only) still exported: %v", ParseErrorsName, got[ParseErrorsName])
	}
	for _, name := range []string{GenAIClientTimeToFirstChunkName, StepDurationName} {
		if !slices.Equal(got[name], []string{"-", "-"}) && !slices.Equal(got[name], []string{"-"}) {
			t.Errorf("%s (no engine attribute) = %v, want kept", name, got[name])
		}
	}
	if after := sdkEngines(rm); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("filtering wrote the SDK's data:\nbefore %v\nafter  %v", before, after)
	}
	f.mu.Lock()
	n := len(f.lastLive)
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("%d engines in the bookkeeping, want 1 (e1; e2 swept past its linger)", n)
	}

	// Back under the same name: exported again, its cumulative count
	// continuing.
	live.set("e2", true)
	m.RecordFirstToken(context.Background(), m.Engine("e2").Attrs("m1", "chat", "chat"), 0.3)
	rm = filterOnce(f, collect())
	if got := sdkEngines(rm); !slices.Equal(got[TimeToFirstTokenName], []string{"e1", "e2"}) || !slices.Equal(got[ParseErrorsName], []string{"e2"}) {
		t.Errorf("e2 back: %v", got)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != TimeToFirstTokenName {
				continue
			}
			for _, p := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
				if v, _ := p.Attributes.Value(AttrEngine); v.AsString() == "e2" && p.Count != 2 {
					t.Errorf("e2 back: TTFT count %d, want 2 (cumulative)", p.Count)
				}
			}
		}
	}

	// A live engine's name is asked once per collection, however many
	// series carry it.
	live.mu.Lock()
	live.calls = 0
	live.mu.Unlock()
	filterOnce(f, collect())
	live.mu.Lock()
	calls := live.calls
	live.mu.Unlock()
	if calls != 2 {
		t.Errorf("live called %d times in one collection, want 2 (once per engine)", calls)
	}
}

// TestSeriesFilterDelta: a delta point is new data; it is never dropped,
// even for an engine gone for longer than the linger.
func TestSeriesFilterDelta(t *testing.T) {
	reader := sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(func(sdkmetric.InstrumentKind) metricdata.Temporality {
		return metricdata.DeltaTemporality
	}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	f := newSeriesFilter()
	f.rule.Store(&seriesRule{live: newLiveSet("e1").Live, linger: time.Minute, now: clk.Now})
	recordTwoEngines(t, m)
	rm := &metricdata.ResourceMetrics{}
	if err := reader.Collect(context.Background(), rm); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if got := sdkEngines(filterOnce(f, rm)); !slices.Equal(got[TimeToFirstTokenName], []string{"e1", "e2"}) || !slices.Equal(got[ParseErrorsName], []string{"e2"}) {
		t.Errorf("delta points of a never-live engine: %v, want kept", got)
	}
}

// TestSeriesFilterBounded: the bookkeeping holds the engines live within
// the last linger, however many came and went before.
func TestSeriesFilterBounded(t *testing.T) {
	clk := newFakeClock()
	live := newLiveSet("static")
	f := newSeriesFilter()
	const linger, step = 5 * time.Minute, time.Minute
	f.rule.Store(&seriesRule{live: live.Live, linger: linger, now: clk.Now})
	maxEntries := 0
	for i := range 10000 {
		name := fmt.Sprintf("pod-%d", i)
		live.set(name, true)
		pass := f.begin()
		if !pass.keep(name) || !pass.keep("static") {
			t.Fatalf("%s: a live engine dropped", name)
		}
		pass.end()
		live.set(name, false)
		clk.Advance(step)
		pass = f.begin()
		if !pass.keep(name) {
			t.Fatalf("%s: dropped one step after it went away, within the linger", name)
		}
		if i >= 6 && pass.keep(fmt.Sprintf("pod-%d", i-6)) {
			t.Fatalf("pod-%d: still exported six steps (past the linger) after it went away", i-6)
		}
		pass.end()
		f.mu.Lock()
		maxEntries = max(maxEntries, len(f.lastLive))
		f.mu.Unlock()
		live.mu.Lock()
		delete(live.names, name) // the test's own set must not grow either
		live.mu.Unlock()
	}
	// Live within the last linger: "static" and at most linger/step pods.
	if want := int(linger/step) + 1; maxEntries > want {
		t.Errorf("bookkeeping reached %d entries, want at most %d", maxEntries, want)
	}
}

func TestKeepPoints(t *testing.T) {
	set := func(p *int) *attribute.Set { s := attribute.NewSet(attribute.Int("v", *p)); return &s }
	odd := func(s *attribute.Set) bool { v, _ := s.Value("v"); return v.AsInt64()%2 == 1 }
	all := []int{1, 3, 5}
	if got, ch := keepPoints(all, set, odd); ch || &got[0] != &all[0] {
		t.Errorf("nothing dropped: %v (changed %t), want the input slice itself", got, ch)
	}
	in := []int{2, 1, 4, 3, 6}
	got, ch := keepPoints(in, set, odd)
	if !ch || !slices.Equal(got, []int{1, 3}) || !slices.Equal(in, []int{2, 1, 4, 3, 6}) {
		t.Errorf("keepPoints(%v) = %v (changed %t); input after %v", []int{2, 1, 4, 3, 6}, got, ch, in)
	}
	if got, ch := keepPoints([]int{2, 4}, set, odd); !ch || len(got) != 0 {
		t.Errorf("all dropped: %v (changed %t)", got, ch)
	}
}

func TestSetEngineLiveNil(t *testing.T) {
	var none *Providers
	none.SetEngineLive(newLiveSet().Live) // no panic
	(&Providers{}).SetEngineLive(newLiveSet().Live)

	f := newSeriesFilter()
	p := &Providers{series: f}
	p.SetEngineLive(newLiveSet().Live, WithSeriesLinger(-1), nil)
	r := f.rule.Load()
	if r == nil || r.linger != DefaultSeriesLinger || r.now == nil {
		t.Fatalf("rule %+v, want the default linger and clock", r)
	}
	p.SetEngineLive(newLiveSet().Live, WithSeriesLinger(time.Minute))
	if r := f.rule.Load(); r.linger != time.Minute {
		t.Errorf("linger %v, want 1m", r.linger)
	}
	p.SetEngineLive(nil)
	if f.begin() != nil {
		t.Error("SetEngineLive(nil): still filtering")
	}
}

// promEngines returns the engine label of each sample of family name
// ("-" for none), sorted, and whether the family is there.
func promEngines(mfs map[string]*dto.MetricFamily, name string) ([]string, bool) {
	mf, ok := mfs[name]
	if !ok {
		return nil, false
	}
	var es []string
	for _, m := range mf.GetMetric() {
		e := testutil.Label(m, "engine")
		if e == "" {
			e = "-"
		}
		es = append(es, e)
	}
	slices.Sort(es)
	return es, true
}

// TestSetEngineLivePrometheus scrapes the Prometheus handler Setup built.
func TestSetEngineLivePrometheus(t *testing.T) {
	testutil.UnsetOTEL(t)
	p, _, _ := setup(t, DefaultConfig())
	m, err := NewMetrics(p.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	recordTwoEngines(t, m)
	const ttft, parse = "switchboard_engine_time_to_first_token_seconds", "switchboard_engine_stream_parse_errors_total"

	if es, _ := promEngines(testutil.ScrapeHandler(t, p.Prometheus), ttft); !slices.Equal(es, []string{"e1", "e2"}) {
		t.Errorf("before SetEngineLive: %s on %v, want e1 and e2", ttft, es)
	}
	clk := newFakeClock()
	live := newLiveSet("e1", "e2")
	p.SetEngineLive(live.Live, WithSeriesLinger(time.Minute), withSeriesClock(clk.Now))
	testutil.ScrapeHandler(t, p.Prometheus) // sees both live
	live.set("e2", false)
	clk.Advance(59 * time.Second)
	if es, _ := promEngines(testutil.ScrapeHandler(t, p.Prometheus), ttft); !slices.Equal(es, []string{"e1", "e2"}) {
		t.Errorf("within the linger: %s on %v, want e1 and e2", ttft, es)
	}
	clk.Advance(time.Second)
	mfs := testutil.ScrapeHandler(t, p.Prometheus)
	if es, _ := promEngines(mfs, ttft); !slices.Equal(es, []string{"e1"}) {
		t.Errorf("past the linger: %s on %v, want e1", ttft, es)
	}
	if es, ok := promEngines(mfs, parse); ok {
		t.Errorf("past the linger: %s (e2 only) still there: %v", parse, es)
	}
	for _, name := range []string{"gen_ai_client_operation_time_to_first_chunk_seconds", "switchboard_gateway_step_duration_seconds", "target_info", "go_goroutines"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("%s (no engine label) left out", name)
		}
	}
	// The OpenMetrics exposition is filtered the same way.
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	p.Prometheus.ServeHTTP(rec, req)
	if body := rec.Body.String(); rec.Code != http.StatusOK || strings.Contains(body, `engine="e2"`) || !strings.Contains(body, `engine="e1"`) {
		t.Errorf("OpenMetrics scrape (status %d, %s): want e1's series and none of e2's", rec.Code, rec.Header().Get("Content-Type"))
	}

	p.SetEngineLive(nil)
	if es, _ := promEngines(testutil.ScrapeHandler(t, p.Prometheus), ttft); !slices.Equal(es, []string{"e1", "e2"}) {
		t.Errorf("SetEngineLive(nil): %s on %v, want e1 and e2 again", ttft, es)
	}
}

// otlpEngines returns, per metric name of the Switchboard scope, the engine
// attribute of each data point ("-" for none), sorted, from one export
// request.
func otlpEngines(req *colmetricpb.ExportMetricsServiceRequest) map[string][]string {
	out := map[string][]string{}
	eng := func(kvs []*commonpb.KeyValue) string {
		if e := attrString(kvs, "engine"); e != "" {
			return e
		}
		return "-"
	}
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			if sm.GetScope().GetName() != ScopeName {
				continue
			}
			for _, mt := range sm.GetMetrics() {
				var es []string
				for _, dp := range mt.GetHistogram().GetDataPoints() {
					es = append(es, eng(dp.GetAttributes()))
				}
				for _, dp := range mt.GetSum().GetDataPoints() {
					es = append(es, eng(dp.GetAttributes()))
				}
				slices.Sort(es)
				out[mt.GetName()] = es
			}
		}
	}
	return out
}

// temporality returns the aggregation temporality of metric name in req.
func temporality(req *colmetricpb.ExportMetricsServiceRequest, name string) metricpb.AggregationTemporality {
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, mt := range sm.GetMetrics() {
				if mt.GetName() == name {
					return mt.GetHistogram().GetAggregationTemporality()
				}
			}
		}
	}
	return metricpb.AggregationTemporality_AGGREGATION_TEMPORALITY_UNSPECIFIED
}

// grpcReceiver is an OTLP/gRPC metrics receiver keeping every request.
type grpcReceiver struct {
	colmetricpb.UnimplementedMetricsServiceServer
	mu   sync.Mutex
	reqs []*colmetricpb.ExportMetricsServiceRequest
}

func (g *grpcReceiver) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	g.mu.Lock()
	g.reqs = append(g.reqs, req)
	g.mu.Unlock()
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

func (g *grpcReceiver) Metrics() []*colmetricpb.ExportMetricsServiceRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.reqs)
}

// TestSetEngineLiveOTLP exports through the OTLP metric reader Setup
// built, over OTLP/HTTP and OTLP/gRPC to in-process receivers, with the
// export interval so long that only ForceFlush exports.
func TestSetEngineLiveOTLP(t *testing.T) {
	for _, proto := range []string{"http/protobuf", "grpc"} {
		t.Run(strings.ReplaceAll(proto, "/", "-"), func(t *testing.T) {
			testutil.UnsetOTEL(t)
			var received func() []*colmetricpb.ExportMetricsServiceRequest
			if proto == "grpc" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := grpc.NewServer()
				rc := &grpcReceiver{}
				colmetricpb.RegisterMetricsServiceServer(srv, rc)
				go func() { _ = srv.Serve(ln) }()
				t.Cleanup(srv.Stop) // after setup's shutdown has flushed

				t.Setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://"+ln.Addr().String())
				t.Setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", proto)
				t.Setenv("OTEL_TRACES_EXPORTER", "none")
				received = rc.Metrics
			} else {
				rc := &testutil.OTLPReceiver{}
				srv := httptest.NewServer(rc)
				t.Cleanup(srv.Close)
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
				t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
				received = rc.Metrics
			}
			t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000") // an hour: ForceFlush exports
			p, _, _ := setup(t, DefaultConfig())
			if !p.OTLPMetrics {
				t.Fatal("OTLPMetrics = false")
			}
			// As the binary does: the per-event histograms through the
			// producer on the OTLP reader, retired like the rest.
			if p.Events == nil {
				t.Fatal("Setup gave no EventHistograms for an OTLP reader")
			}
			m, err := NewMetrics(p.MeterProvider, WithEventHistograms(p.Events))
			if err != nil {
				t.Fatal(err)
			}
			recordTwoEngines(t, m)
			for _, e := range []string{"e1", "e2"} {
				m.RecordInterToken(context.Background(), m.Engine(e).Attrs("m1", "chat", "chat"), 0.02)
			}
			clk := newFakeClock()
			live := newLiveSet("e1", "e2")
			p.SetEngineLive(live.Live, WithSeriesLinger(time.Minute), withSeriesClock(clk.Now))
			flush := func() map[string][]string {
				t.Helper()
				n := len(received())
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := p.MeterProvider.ForceFlush(ctx); err != nil {
					t.Fatalf("ForceFlush: %v", err)
				}
				reqs := received()
				if len(reqs) != n+1 {
					t.Fatalf("%d export requests after ForceFlush, want %d", len(reqs), n+1)
				}
				if got := temporality(reqs[n], TimeToFirstTokenName); got != metricpb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE {
					t.Errorf("%s temporality %v, want cumulative", TimeToFirstTokenName, got)
				}
				return otlpEngines(reqs[n])
			}

			if got := flush(); !slices.Equal(got[TimeToFirstTokenName], []string{"e1", "e2"}) || !slices.Equal(got[ParseErrorsName], []string{"e2"}) ||
				!slices.Equal(got[InterTokenLatencyName], []string{"e1", "e2"}) {
				t.Errorf("both live: %v", got)
			}
			live.set("e2", false)
			clk.Advance(30 * time.Second)
			if got := flush(); !slices.Equal(got[TimeToFirstTokenName], []string{"e1", "e2"}) {
				t.Errorf("within the linger: %s on %v, want e1 and e2", TimeToFirstTokenName, got[TimeToFirstTokenName])
			}
			clk.Advance(30 * time.Second)
			got := flush()
			for _, name := range []string{TimeToFirstTokenName, InterTokenLatencyName} {
				if !slices.Equal(got[name], []string{"e1"}) {
					t.Errorf("past the linger: %s on %v, want e1", name, got[name])
				}
			}
			if es, ok := got[ParseErrorsName]; ok {
				t.Errorf("past the linger: %s (e2 only) still exported: %v", ParseErrorsName, es)
			}
			for _, name := range []string{GenAIClientTimeToFirstChunkName, StepDurationName} {
				if es := got[name]; len(es) == 0 || es[0] != "-" {
					t.Errorf("%s (no engine attribute) = %v, want kept", name, es)
				}
			}
		})
	}
}

// TestSetupOTLPTemporalityPreference: the wrapped exporter's temporality
// (OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE) reaches the reader,
// and delta points are never dropped.
func TestSetupOTLPTemporalityPreference(t *testing.T) {
	rc, p, m := setupOTLPHTTP(t, "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
	clk := newFakeClock()
	p.SetEngineLive(newLiveSet("e1").Live, WithSeriesLinger(time.Minute), withSeriesClock(clk.Now))
	clk.Advance(time.Hour)
	recordTwoEngines(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.MeterProvider.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := rc.Metrics()
	if len(reqs) != 1 {
		t.Fatalf("%d export requests, want 1", len(reqs))
	}
	if got := temporality(reqs[0], TimeToFirstTokenName); got != metricpb.AggregationTemporality_AGGREGATION_TEMPORALITY_DELTA {
		t.Errorf("%s temporality %v, want delta", TimeToFirstTokenName, got)
	}
	if got := otlpEngines(reqs[0]); !slices.Equal(got[TimeToFirstTokenName], []string{"e1", "e2"}) {
		t.Errorf("delta: %s on %v, want e1 and e2", TimeToFirstTokenName, got[TimeToFirstTokenName])
	}
}

// TestSetupMetricReaderSelection: what newMetricReader accepts and
// refuses, as autoexport does.
func TestSetupMetricReaderSelection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		metrics bool
		wantErr string
	}{
		{name: "otlp named", env: map[string]string{"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, metrics: true},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}, metrics: true},
		{name: "metrics protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "carrier-pigeon"}, wantErr: "carrier-pigeon"},
		{name: "producers", env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:1", "OTEL_METRICS_PRODUCERS": "prometheus,none"}, metrics: true},
		{name: "unknown producer", env: map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:1", "OTEL_METRICS_PRODUCERS": "abacus"}, wantErr: "abacus"},
		{name: "console through autoexport", env: map[string]string{"OTEL_METRICS_EXPORTER": "console"}, metrics: true},
		{name: "unknown exporter through autoexport", env: map[string]string{"OTEL_METRICS_EXPORTER": "abacus"}, wantErr: "metric reader"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.UnsetOTEL(t)
			t.Setenv("OTEL_TRACES_EXPORTER", "none")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			p, shutdown, err := Setup(context.Background(), DefaultConfig(), slog.New(slog.DiscardHandler))
			if tc.wantErr != "" {
				if err == nil {
					_ = shutdown(context.Background())
					t.Fatal("Setup: nil error")
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Setup: %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			defer func() {
				// Nothing listens: bound the flush.
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_ = shutdown(ctx)
			}()
			if p.OTLPMetrics != tc.metrics {
				t.Errorf("OTLPMetrics = %t, want %t", p.OTLPMetrics, tc.metrics)
			}
		})
	}
}

// TestSetEngineLiveConcurrent scrapes, flushes and switches the rule
// (with a server liveness) at once (for the race detector).
func TestSetEngineLiveConcurrent(t *testing.T) {
	_, p, m := setupOTLPHTTP(t)
	clk := newFakeClock()
	live := newLiveSet("e1")
	servers := newServerSet("10.0.0.1:8000")
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Go(func() {
			for i := range 20 {
				switch g {
				case 0:
					rec := httptest.NewRecorder()
					p.Prometheus.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
				case 1:
					_ = p.MeterProvider.ForceFlush(context.Background())
				default:
					if i%5 == 0 {
						p.SetEngineLive(nil)
					} else {
						p.SetEngineLive(live.Live, WithServerLive(servers.Live), withSeriesClock(clk.Now))
					}
					recordTwoEngines(t, m)
					recordServers(m)
					live.set("e2", i%2 == 0)
					servers.set("10.0.0.2:8000", i%2 == 0)
					clk.Advance(time.Minute)
				}
			}
		})
	}
	wg.Wait()
}

// serverSet is the server liveness the tests switch, by "address:port".
// Safe for concurrent use.
type serverSet struct {
	mu    sync.Mutex
	live  map[string]bool
	calls int
	asked []string // every (address, port) asked, as "address:port"
}

func newServerSet(servers ...string) *serverSet {
	s := &serverSet{live: map[string]bool{}}
	for _, a := range servers {
		s.live[a] = true
	}
	return s
}

func (s *serverSet) Live(address string, port int) bool {
	k := net.JoinHostPort(address, fmt.Sprint(port))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.asked = append(s.asked, k)
	return s.live[k]
}

func (s *serverSet) set(server string, live bool) {
	s.mu.Lock()
	if live {
		s.live[server] = true
	} else {
		delete(s.live, server)
	}
	s.mu.Unlock()
}

// serverOf is a point's server as "address:port" ("address:-" without a
// port), or "-" without server.address.
func serverOf(s attribute.Set) string {
	a, ok := s.Value(AttrServerAddress)
	if !ok {
		return "-"
	}
	if p, ok := s.Value(AttrServerPort); ok {
		return net.JoinHostPort(a.AsString(), fmt.Sprint(p.AsInt64()))
	}
	return a.AsString() + ":-"
}

// sdkServers returns, per "scope metric" name (the metric name alone in
// Switchboard's scope), the server of each data point (serverOf), sorted.
func sdkServers(rm *metricdata.ResourceMetrics) map[string][]string {
	return sdkPoints(rm, func(scope, metric string) string {
		if scope != ScopeName {
			return scope + " " + metric
		}
		return metric
	}, serverOf)
}

// genAIInstruments are the four GenAI client instruments, each recorded
// by recordServers.
var genAIInstruments = []string{GenAIClientOperationDurationName, GenAIClientTimeToFirstChunkName, GenAIClientTimePerOutputChunkName, GenAIClientTokenUsageName}

// recordServers records, on engines a (10.0.0.1:8000), b (10.0.0.2:8000)
// and c (no server), a sample of every GenAI client instrument (and its
// switchboard.engine.* twin, with the engine attribute and no server).
func recordServers(m *Metrics) {
	ctx := context.Background()
	for _, e := range []*Engine{
		m.Engine("a", WithServer("10.0.0.1", 8000)),
		m.Engine("b", WithServer("10.0.0.2", 8000)),
		m.Engine("c"),
	} {
		at := e.Attrs("m1", "chat", "chat")
		m.RecordFirstToken(ctx, at, 0.1)
		m.RecordInterToken(ctx, at, 0.01)
		m.RecordEnd(ctx, at, Outcome{Seconds: 1, InputTokens: 10, OutputTokens: 20})
	}
}

// genAIServers is the server of every point of each GenAI client
// instrument, as recordServers records them with servers of a, b and c
// (token usage has an input and an output point per engine).
func genAIServers(servers ...string) map[string][]string {
	out := map[string][]string{}
	for _, name := range genAIInstruments {
		var ss []string
		for _, s := range servers {
			ss = append(ss, s)
			if name == GenAIClientTokenUsageName {
				ss = append(ss, s)
			}
		}
		slices.Sort(ss)
		out[name] = ss
	}
	return out
}

func checkGenAI(t *testing.T, when string, got map[string][]string, want map[string][]string) {
	t.Helper()
	for name, w := range want {
		if !slices.Equal(got[name], w) {
			t.Errorf("%s: %s on %v, want %v", when, name, got[name], w)
		}
	}
}

// TestSeriesFilterServers: the GenAI client instruments' points of a
// server no live engine has are dropped past the linger and kept within
// it; a point without server.address is never dropped; the engine series
// and other scopes' server.address are not judged by server; a server
// that comes back is exported again with its cumulative values.
func TestSeriesFilterServers(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	recordServers(m)
	// Another scope's instruments with a server.address no engine has:
	// otelhttp's server metrics (the gateway's own address), and a
	// gen_ai.client.* instrument of some client library.
	httpCount, _ := mp.Meter("go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp").Int64Counter("http.server.request.count")
	httpCount.Add(context.Background(), 1, metric.WithAttributes(AttrServerAddress.String("gw.example"), AttrServerPort.Int(8080)))
	other, _ := mp.Meter("example.com/genai-client").Int64Counter(GenAIClientTokenUsageName)
	other.Add(context.Background(), 1, metric.WithAttributes(AttrServerAddress.String("api.example.com"), AttrServerPort.Int(443)))
	const foreignHTTP, foreignGenAI = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp http.server.request.count", "example.com/genai-client " + GenAIClientTokenUsageName
	collect := func() *metricdata.ResourceMetrics {
		rm := &metricdata.ResourceMetrics{}
		if err := reader.Collect(context.Background(), rm); err != nil {
			t.Fatal(err)
		}
		return rm
	}

	clk := newFakeClock()
	engines := newLiveSet("a", "b", "c")
	servers := newServerSet("10.0.0.1:8000", "10.0.0.2:8000")
	const linger = 5 * time.Minute
	f := newSeriesFilter()
	f.rule.Store(&seriesRule{live: engines.Live, server: servers.Live, linger: linger, now: clk.Now})
	rm := collect()
	if got := filterOnce(f, rm); got != rm {
		t.Error("every server live: the export is not rm itself")
	}
	all := genAIServers("10.0.0.1:8000", "10.0.0.2:8000", "-")
	checkGenAI(t, "all live", sdkServers(rm), all)

	// b's server goes away (its engine name stays live: a pod replaced
	// under a stable name gets a new address).
	servers.set("10.0.0.2:8000", false)
	clk.Advance(linger - time.Second)
	checkGenAI(t, "within the linger", sdkServers(filterOnce(f, collect())), all)
	clk.Advance(time.Second)
	rm = collect()
	before := sdkServers(rm)
	got := sdkServers(filterOnce(f, rm))
	checkGenAI(t, "past the linger", got, genAIServers("10.0.0.1:8000", "-"))
	if es := sdkEngines(filterOnce(f, collect())); !slices.Equal(es[TimeToFirstTokenName], []string{"a", "b", "c"}) {
		t.Errorf("past the linger: %s on %v, want a, b and c (engines are not judged by server)", TimeToFirstTokenName, es[TimeToFirstTokenName])
	}
	if !slices.Equal(got[foreignHTTP], []string{"gw.example:8080"}) || !slices.Equal(got[foreignGenAI], []string{"api.example.com:443"}) {
		t.Errorf("another scope's server.address judged by server: %v, %v", got[foreignHTTP], got[foreignGenAI])
	}
	if after := sdkServers(rm); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("filtering wrote the SDK's data:\nbefore %v\nafter  %v", before, after)
	}
	f.mu.Lock()
	n := len(f.serverLastLive)
	f.mu.Unlock()
	if n != 1 {
		t.Errorf("%d servers in the bookkeeping, want 1 (10.0.0.1:8000; 10.0.0.2:8000 swept past its linger)", n)
	}

	// Back at the same address and port: exported again, cumulative.
	servers.set("10.0.0.2:8000", true)
	m.RecordFirstToken(context.Background(), m.Engine("b", WithServer("10.0.0.2", 8000)).Attrs("m1", "chat", "chat"), 0.3)
	rm = filterOnce(f, collect())
	checkGenAI(t, "back", sdkServers(rm), all)
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != GenAIClientTimeToFirstChunkName {
				continue
			}
			for _, p := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
				if serverOf(p.Attributes) == "10.0.0.2:8000" {
					found = true
					if p.Count != 2 {
						t.Errorf("back: %s count %d, want 2 (cumulative)", mt.Name, p.Count)
					}
				}
			}
		}
	}
	if !found {
		t.Errorf("back: no %s point of 10.0.0.2:8000", GenAIClientTimeToFirstChunkName)
	}

	// A server is asked once per collection, however many points carry
	// it; a point without server.address asks nothing.
	servers.mu.Lock()
	servers.calls, servers.asked = 0, nil
	servers.mu.Unlock()
	filterOnce(f, collect())
	servers.mu.Lock()
	asked := slices.Sorted(slices.Values(servers.asked))
	servers.mu.Unlock()
	if !slices.Equal(asked, []string{"10.0.0.1:8000", "10.0.0.2:8000"}) {
		t.Errorf("server liveness asked for %v in one collection, want each server once", asked)
	}

	// Every server gone for longer than the linger, every engine too:
	// c's GenAI points (no server.address) and the other scopes' stay.
	servers.set("10.0.0.1:8000", false)
	servers.set("10.0.0.2:8000", false)
	for _, e := range []string{"a", "b", "c"} {
		engines.set(e, false)
	}
	clk.Advance(linger)
	got = sdkServers(filterOnce(f, collect()))
	checkGenAI(t, "all gone", got, genAIServers("-"))
	if _, ok := got[TimeToFirstTokenName]; ok {
		t.Errorf("all gone: %s still exported", TimeToFirstTokenName)
	}
	if !slices.Equal(got[foreignHTTP], []string{"gw.example:8080"}) || !slices.Equal(got[foreignGenAI], []string{"api.example.com:443"}) {
		t.Errorf("all gone: another scope's points %v, %v, want kept", got[foreignHTTP], got[foreignGenAI])
	}
}

// TestSeriesFilterEngineAndServer: a GenAI point with both an engine and
// a server.address is kept only while both are live or within the linger;
// one with server.address and no server.port is asked with port 0.
func TestSeriesFilterEngineAndServer(t *testing.T) {
	clk := newFakeClock()
	engines := newLiveSet("e-live", "e-gone")
	servers := newServerSet("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:0")
	const linger = time.Minute
	f := newSeriesFilter()
	f.rule.Store(&seriesRule{live: engines.Live, server: servers.Live, linger: linger, now: clk.Now})
	pt := func(kvs ...attribute.KeyValue) metricdata.DataPoint[int64] {
		return metricdata.DataPoint[int64]{Attributes: attribute.NewSet(kvs...), Value: 1}
	}
	srv := func(addr string, port int) []attribute.KeyValue {
		return []attribute.KeyValue{AttrServerAddress.String(addr), AttrServerPort.Int(port)}
	}
	rm := &metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{
		Scope: instrumentation.Scope{Name: ScopeName},
		Metrics: []metricdata.Metrics{{
			Name: GenAIClientTokenUsageName,
			Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, DataPoints: []metricdata.DataPoint[int64]{
				pt(append(srv("10.0.0.1", 8000), AttrEngine.String("e-live"))...), // both live
				pt(append(srv("10.0.0.2", 8000), AttrEngine.String("e-gone"))...), // engine goes
				pt(append(srv("10.0.0.9", 8000), AttrEngine.String("e-live"))...), // server never live
				pt(AttrServerAddress.String("10.0.0.3")),                          // no port: asked with 0
				pt(AttrServerAddress.String(""), AttrServerPort.Int(1)),           // empty address: not judged
			}},
		}},
	}}}
	kept := func() []string {
		var out []string
		for _, sm := range filterOnce(f, rm).ScopeMetrics {
			for _, m := range sm.Metrics {
				for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
					e, _ := p.Attributes.Value(AttrEngine)
					out = append(out, serverOf(p.Attributes)+"/"+e.AsString())
				}
			}
		}
		return out
	}
	// 10.0.0.9:8000 was never found live: dropped at once.
	want := []string{"10.0.0.1:8000/e-live", "10.0.0.2:8000/e-gone", "10.0.0.3:-/", ":1/"}
	if got := kept(); !slices.Equal(got, want) {
		t.Errorf("all but one live: kept %v, want %v", got, want)
	}
	engines.set("e-gone", false)
	clk.Advance(linger)
	want = []string{"10.0.0.1:8000/e-live", "10.0.0.3:-/", ":1/"}
	if got := kept(); !slices.Equal(got, want) {
		t.Errorf("e-gone past the linger, its server live: kept %v, want %v", got, want)
	}
	servers.mu.Lock()
	asked := slices.Clone(servers.asked)
	servers.mu.Unlock()
	if !slices.Contains(asked, "10.0.0.3:0") || slices.Contains(asked, ":1") {
		t.Errorf("asked %v: want 10.0.0.3 asked with port 0, the empty address never", asked)
	}
	// A point with both kept on the engine's linger while its server is
	// live, and on the server's while its engine is.
	servers.set("10.0.0.1:8000", false)
	clk.Advance(linger - time.Second)
	if got := kept(); !slices.Contains(got, "10.0.0.1:8000/e-live") {
		t.Errorf("server within its linger: kept %v", got)
	}
	clk.Advance(time.Second)
	if got := kept(); slices.Contains(got, "10.0.0.1:8000/e-live") {
		t.Errorf("server past its linger, engine live: kept %v", got)
	}
}

// TestSeriesFilterServersBounded: the server bookkeeping holds the
// servers live within the last linger, through a churn of 10,000
// addresses (a pod IP each).
func TestSeriesFilterServersBounded(t *testing.T) {
	clk := newFakeClock()
	servers := newServerSet("10.0.0.1:8000")
	f := newSeriesFilter()
	const linger, step = 5 * time.Minute, time.Minute
	f.rule.Store(&seriesRule{live: newLiveSet().Live, server: servers.Live, linger: linger, now: clk.Now})
	pod := func(i int) serverKey { return serverKey{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), 8000} }
	key := func(k serverKey) string { return net.JoinHostPort(k.address, fmt.Sprint(k.port)) }
	static := serverKey{"10.0.0.1", 8000}
	maxEntries := 0
	for i := range 10000 {
		k := pod(i + 256)
		servers.set(key(k), true)
		pass := f.begin()
		if !pass.keepServer(k) || !pass.keepServer(static) {
			t.Fatalf("%v: a live server dropped", k)
		}
		pass.end()
		servers.set(key(k), false) // deleted: the test's own set does not grow
		clk.Advance(step)
		pass = f.begin()
		if !pass.keepServer(k) {
			t.Fatalf("%v: dropped one step after it went away, within the linger", k)
		}
		if i >= 6 && pass.keepServer(pod(i+256-6)) {
			t.Fatalf("%v: still exported six steps (past the linger) after it went away", pod(i+256-6))
		}
		pass.end()
		f.mu.Lock()
		maxEntries = max(maxEntries, len(f.serverLastLive))
		f.mu.Unlock()
		servers.mu.Lock()
		servers.asked = servers.asked[:0]
		servers.mu.Unlock()
	}
	if want := int(linger/step) + 1; maxEntries > want {
		t.Errorf("server bookkeeping reached %d entries, want at most %d", maxEntries, want)
	}
	f.mu.Lock()
	n, e := len(f.serverLastLive), len(f.lastLive)
	f.mu.Unlock()
	if n > int(linger/step)+1 || e != 0 {
		t.Errorf("after the churn: %d servers, %d engines in the bookkeeping", n, e)
	}
}

func TestWithServerLive(t *testing.T) {
	f := newSeriesFilter()
	p := &Providers{series: f}
	p.SetEngineLive(newLiveSet().Live)
	if r := f.rule.Load(); r.server != nil {
		t.Error("without WithServerLive: a server liveness installed")
	}
	p.SetEngineLive(newLiveSet().Live, WithServerLive(newServerSet().Live))
	if r := f.rule.Load(); r.server == nil {
		t.Error("WithServerLive: no server liveness installed")
	}
	p.SetEngineLive(newLiveSet().Live, WithServerLive(nil))
	if r := f.rule.Load(); r.server != nil {
		t.Error("WithServerLive(nil): a server liveness installed")
	}
}

// recordForeignServer records, on mp, a counter of another scope with a
// server.address no engine has, as otelhttp's server metrics carry the
// gateway's own.
func recordForeignServer(t *testing.T, mp metric.MeterProvider) {
	t.Helper()
	c, err := mp.Meter("go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp").Int64Counter("http.server.request.count")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(context.Background(), 1, metric.WithAttributes(AttrServerAddress.String("gw.example"), AttrServerPort.Int(8080)))
}

// promServers returns, per gen_ai_client_* family, the server of each
// sample ("address:port", "-" for none), sorted.
func promServers(mfs map[string]*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "gen_ai_client_") {
			continue
		}
		var ss []string
		for _, m := range mf.GetMetric() {
			s := "-"
			if a := testutil.Label(m, "server_address"); a != "" {
				s = net.JoinHostPort(a, testutil.Label(m, "server_port"))
			}
			ss = append(ss, s)
		}
		slices.Sort(ss)
		out[name] = ss
	}
	return out
}

// TestSetEngineLiveServersPrometheus scrapes the Prometheus handler Setup
// built, with WithServerLive.
func TestSetEngineLiveServersPrometheus(t *testing.T) {
	testutil.UnsetOTEL(t)
	p, _, _ := setup(t, DefaultConfig())
	m, err := NewMetrics(p.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	recordServers(m)
	recordForeignServer(t, p.MeterProvider)
	const httpCount, ttft = "http_server_request_count_total", "switchboard_engine_time_to_first_token_seconds"

	clk := newFakeClock()
	servers := newServerSet("10.0.0.1:8000", "10.0.0.2:8000")
	p.SetEngineLive(newLiveSet("a", "b", "c").Live, WithServerLive(servers.Live), WithSeriesLinger(time.Minute), withSeriesClock(clk.Now))
	got := promServers(testutil.ScrapeHandler(t, p.Prometheus))
	if len(got) != len(genAIInstruments) {
		t.Fatalf("gen_ai_client_* families %v, want %d", got, len(genAIInstruments))
	}
	for name, ss := range got {
		if w := []string{"-", "10.0.0.1:8000", "10.0.0.2:8000"}; !slices.Equal(slices.Compact(ss), w) {
			t.Errorf("all live: %s on %v, want %v", name, ss, w)
		}
	}
	servers.set("10.0.0.2:8000", false)
	clk.Advance(59 * time.Second)
	for name, ss := range promServers(testutil.ScrapeHandler(t, p.Prometheus)) {
		if !slices.Contains(ss, "10.0.0.2:8000") {
			t.Errorf("within the linger: %s on %v, want 10.0.0.2:8000 kept", name, ss)
		}
	}
	clk.Advance(time.Second)
	mfs := testutil.ScrapeHandler(t, p.Prometheus)
	got = promServers(mfs)
	if len(got) != len(genAIInstruments) {
		t.Errorf("past the linger: gen_ai_client_* families %v, want %d", got, len(genAIInstruments))
	}
	for name, ss := range got {
		if w := []string{"-", "10.0.0.1:8000"}; !slices.Equal(slices.Compact(ss), w) {
			t.Errorf("past the linger: %s on %v, want %v", name, ss, w)
		}
	}
	if mf, ok := mfs[httpCount]; !ok || testutil.Label(mf.GetMetric()[0], "server_address") != "gw.example" {
		t.Errorf("%s (another scope's server.address) left out", httpCount)
	}
	if es, _ := promEngines(mfs, ttft); !slices.Equal(es, []string{"a", "b", "c"}) {
		t.Errorf("past the linger: %s on %v, want a, b and c", ttft, es)
	}
}

// otlpServers is promServers for the gen_ai.client.* metrics of the
// Switchboard scope in one OTLP export request.
func otlpServers(req *colmetricpb.ExportMetricsServiceRequest) map[string][]string {
	out := map[string][]string{}
	srv := func(kvs []*commonpb.KeyValue) string {
		a := attrString(kvs, string(AttrServerAddress))
		if a == "" {
			return "-"
		}
		for _, kv := range kvs {
			if kv.GetKey() == string(AttrServerPort) {
				return net.JoinHostPort(a, fmt.Sprint(kv.GetValue().GetIntValue()))
			}
		}
		return a + ":-"
	}
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, mt := range sm.GetMetrics() {
				if sm.GetScope().GetName() != ScopeName || !strings.HasPrefix(mt.GetName(), "gen_ai.client.") {
					if mt.GetName() == "http.server.request.count" {
						for _, dp := range mt.GetSum().GetDataPoints() {
							out[mt.GetName()] = append(out[mt.GetName()], srv(dp.GetAttributes()))
						}
					}
					continue
				}
				var ss []string
				for _, dp := range mt.GetHistogram().GetDataPoints() {
					ss = append(ss, srv(dp.GetAttributes()))
				}
				slices.Sort(ss)
				out[mt.GetName()] = ss
			}
		}
	}
	return out
}

// TestSetEngineLiveServersOTLP exports through the OTLP/HTTP metric
// reader Setup built, with WithServerLive.
func TestSetEngineLiveServersOTLP(t *testing.T) {
	rc, p, m := setupOTLPHTTP(t)
	recordServers(m)
	recordForeignServer(t, p.MeterProvider)
	clk := newFakeClock()
	servers := newServerSet("10.0.0.1:8000", "10.0.0.2:8000")
	p.SetEngineLive(newLiveSet("a", "b", "c").Live, WithServerLive(servers.Live), WithSeriesLinger(time.Minute), withSeriesClock(clk.Now))
	flush := func() map[string][]string {
		t.Helper()
		n := len(rc.Metrics())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.MeterProvider.ForceFlush(ctx); err != nil {
			t.Fatalf("ForceFlush: %v", err)
		}
		reqs := rc.Metrics()
		if len(reqs) != n+1 {
			t.Fatalf("%d export requests after ForceFlush, want %d", len(reqs), n+1)
		}
		return otlpServers(reqs[n])
	}
	check := func(when string, got map[string][]string, servers ...string) {
		t.Helper()
		checkGenAI(t, when, got, genAIServers(servers...))
		if !slices.Equal(got["http.server.request.count"], []string{"gw.example:8080"}) {
			t.Errorf("%s: http.server.request.count (another scope's server.address) on %v, want kept", when, got["http.server.request.count"])
		}
	}
	check("all live", flush(), "-", "10.0.0.1:8000", "10.0.0.2:8000")
	servers.set("10.0.0.2:8000", false)
	clk.Advance(30 * time.Second)
	check("within the linger", flush(), "-", "10.0.0.1:8000", "10.0.0.2:8000")
	clk.Advance(30 * time.Second)
	check("past the linger", flush(), "-", "10.0.0.1:8000")
}

// setupOTLPHTTP runs Setup exporting metrics over OTLP/HTTP to an
// in-process receiver, with the export interval at an hour (ForceFlush
// exports) and the extra environment variables env (name, value pairs),
// and builds the Metrics on its provider.
func setupOTLPHTTP(t *testing.T, env ...string) (*testutil.OTLPReceiver, *Providers, *Metrics) {
	t.Helper()
	testutil.UnsetOTEL(t)
	rc := &testutil.OTLPReceiver{}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close) // after setup's shutdown has flushed
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	p, _, _ := setup(t, DefaultConfig())
	m, err := NewMetrics(p.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	return rc, p, m
}
