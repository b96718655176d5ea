package telemetry

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// eventPair is the same recording done twice: through the SDK (the
// reference) and through EventHistograms, each into its own manual reader
// with temporality t.
type eventPair struct {
	sdk, ev           *Metrics
	sdkReader, reader *sdkmetric.ManualReader
}

func newEventPair(t *testing.T, temporality metricdata.Temporality) eventPair {
	return newEventPairLimit(t, temporality, 0)
}

// newEventPairLimit is newEventPair with a cardinality limit on both sides.
func newEventPairLimit(t *testing.T, temporality metricdata.Temporality, limit int) eventPair {
	t.Helper()
	sel := func(sdkmetric.InstrumentKind) metricdata.Temporality { return temporality }
	var p eventPair
	p.sdkReader = sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(sel))
	mpA := sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.sdkReader), sdkmetric.WithCardinalityLimit(limit))
	ev := NewEventHistograms(limit)
	p.reader = sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(sel), sdkmetric.WithProducer(ev.Producer(temporality, false)))
	mpB := sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	t.Cleanup(func() { _ = mpA.Shutdown(context.Background()); _ = mpB.Shutdown(context.Background()) })
	var err error
	if p.sdk, err = NewMetrics(mpA, WithVersion(testVersion)); err != nil {
		t.Fatal(err)
	}
	if p.ev, err = NewMetrics(mpB, WithVersion(testVersion), WithEventHistograms(ev)); err != nil {
		t.Fatal(err)
	}
	return p
}

// eventMetrics returns the two per-event instruments of rd's collection,
// by name.
func eventMetrics(t *testing.T, rd sdkmetric.Reader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != InterTokenLatencyName && m.Name != GenAIClientTimePerOutputChunkName {
				continue
			}
			if sm.Scope.Name != ScopeName || sm.Scope.Version != testVersion {
				t.Errorf("%s in scope %+v, want %s %s", m.Name, sm.Scope, ScopeName, testVersion)
			}
			if _, dup := out[m.Name]; dup {
				t.Errorf("%s reported twice", m.Name)
			}
			out[m.Name] = m
		}
	}
	return out
}

// record feeds the same samples to one Metrics: two engines, one of them
// in two incarnations (they share their series), an answered twin (same
// ITL series, its own GenAI series), samples on bucket boundaries, zero
// and past the last bound.
func (p eventPair) record(m *Metrics, round int) {
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	e1 := m.Engine("e1", WithServer("10.0.0.1", 8000))
	e1again := m.Engine("e1", WithServer("10.0.0.1", 8000))
	e2 := m.Engine("e2")
	a := e1.Attrs("m1", "chat", "chat")
	samples := []float64{0, 0.001, 0.0025, 0.012, 0.02, 0.5, 2.5, 3, 100}
	for i, v := range samples {
		m.RecordInterToken(ctx, a, v)
		if i%2 == 0 {
			m.RecordInterToken(ctx, a.Answered([]byte("m1")), v*2)
		}
		if i%3 == 0 {
			m.RecordInterToken(ctx, e1again.Attrs("m1", "chat", "chat"), v+0.01)
		}
	}
	if round == 0 { // e2 only in the first round: absent from later deltas
		m.RecordInterToken(ctx, e2.Attrs("m2", "text_completion", "completions"), 0.04)
	}
}

// forDelta removes min and max, which delta points of EventHistograms do
// not carry, and rounds the sums to 1e-9 s: a delta sum is the difference
// of two cumulative sums, so its last bits differ from the SDK's sum of
// the interval's samples.
func forDelta(m metricdata.Metrics) metricdata.Metrics {
	h := m.Data.(metricdata.Histogram[float64])
	pts := append([]metricdata.HistogramDataPoint[float64](nil), h.DataPoints...)
	for i := range pts {
		pts[i].Min, pts[i].Max = metricdata.Extrema[float64]{}, metricdata.Extrema[float64]{}
		pts[i].Sum = math.Round(pts[i].Sum*1e9) / 1e9
	}
	h.DataPoints = pts
	m.Data = h
	return m
}

// TestEventHistogramsMatchSDK: what EventHistograms report is what the
// SDK reports for the same records (names, units, descriptions, bounds,
// attributes, counts, sums, min and max), under both temporalities and
// over two collections.
func TestEventHistogramsMatchSDK(t *testing.T) {
	for _, temporality := range []metricdata.Temporality{metricdata.CumulativeTemporality, metricdata.DeltaTemporality} {
		t.Run(temporality.String(), func(t *testing.T) {
			p := newEventPair(t, temporality)
			for round := range 2 {
				p.record(p.sdk, round)
				p.record(p.ev, round)
				want, got := eventMetrics(t, p.sdkReader), eventMetrics(t, p.reader)
				if len(want) != 2 || len(got) != 2 {
					t.Fatalf("round %d: SDK reported %d per-event instruments, EventHistograms %d, want 2 and 2", round, len(want), len(got))
				}
				for name, w := range want {
					g := got[name]
					if temporality == metricdata.DeltaTemporality {
						w, g = forDelta(w), forDelta(g)
					}
					metricdatatest.AssertEqual(t, w, g, metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreExemplars())
				}
				// And the values themselves, for the plain ITL series of e1:
				// 9 samples plus 3 from the second incarnation per round.
				itl := got[InterTokenLatencyName].Data.(metricdata.Histogram[float64])
				e1 := attribute.NewSet(AttrEngine.String("e1"), AttrModel.String("m1"), AttrOperation.String("chat"))
				var found bool
				for _, pt := range itl.DataPoints {
					if !pt.Attributes.Equals(&e1) {
						continue
					}
					found = true
					// 9 samples, 5 answered twins (same series), 3 from the
					// second incarnation: 17 a round.
					wantCount := uint64(17)
					if temporality == metricdata.CumulativeTemporality {
						wantCount *= uint64(round + 1)
					}
					if pt.Count != wantCount {
						t.Errorf("round %d: e1 ITL count %d, want %d", round, pt.Count, wantCount)
					}
					// 0 and 0.001 (and the twin's 0) fall in the first bucket,
					// (-inf, 0.001].
					if first := pt.BucketCounts[0]; first != 3*uint64(wantCount/17) {
						t.Errorf("round %d: e1 ITL first bucket %d, want %d", round, first, 3*wantCount/17)
					}
				}
				if !found {
					t.Errorf("round %d: no ITL point for e1", round)
				}
			}
		})
	}
}

// TestEventHistogramsConcurrentSafe: records from many goroutines while
// collections run lose nothing; every point read mid-flight has a sum at
// least what its buckets' lower bounds account for (the sum is added
// before the bucket), and the last collection is exact, bucket by bucket.
func TestEventHistogramsConcurrentSafe(t *testing.T) {
	p := newEventPair(t, metricdata.CumulativeTemporality)
	a := p.ev.Engine("e1").Attrs("m1", "chat", "chat")
	// Worker i records 0.004 + 0.01*i: each worker its own ITL bucket.
	const workers, each = 8, 2000
	value := func(i int) float64 { return 0.004 + 0.01*float64(i) }
	var wg sync.WaitGroup
	done := make(chan struct{})
	collected := make(chan error, 1)
	go func() {
		defer close(collected)
		for {
			select {
			case <-done:
				return
			default:
			}
			var rm metricdata.ResourceMetrics
			if err := p.reader.Collect(context.Background(), &rm); err != nil {
				collected <- err
				return
			}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					h, ok := m.Data.(metricdata.Histogram[float64])
					if !ok {
						continue
					}
					for _, pt := range h.DataPoints {
						var floor float64 // what the counted samples add up to at least
						for i, c := range pt.BucketCounts[1:] {
							floor += float64(c) * pt.Bounds[i]
						}
						if pt.Sum < floor*(1-1e-9) {
							t.Errorf("%s: sum %v under the %v its buckets count", m.Name, pt.Sum, floor)
						}
						mn, _ := pt.Min.Value()
						mx, _ := pt.Max.Value()
						if mn < value(0) || mx > value(workers-1) || mn > mx {
							t.Errorf("%s: min %v max %v outside [%v, %v]", m.Name, mn, mx, value(0), value(workers-1))
						}
					}
				}
			}
		}
	}()
	for i := range workers {
		wg.Go(func() {
			for range each {
				p.ev.RecordInterToken(context.Background(), a, value(i))
			}
		})
	}
	wg.Wait()
	close(done)
	if err := <-collected; err != nil {
		t.Fatal(err)
	}
	got := eventMetrics(t, p.reader)
	for _, name := range []string{InterTokenLatencyName, GenAIClientTimePerOutputChunkName} {
		pt := got[name].Data.(metricdata.Histogram[float64]).DataPoints[0]
		want := make([]uint64, len(pt.BucketCounts))
		var sum float64
		for i := range workers {
			want[sort.SearchFloat64s(pt.Bounds, value(i))] += each
			sum += value(i) * each
		}
		if !slices.Equal(pt.BucketCounts, want) || pt.Count != workers*each || math.Abs(pt.Sum-sum) > 1e-6 {
			t.Errorf("%s: buckets %v count %d sum %v, want %v, %d and %v", name, pt.BucketCounts, pt.Count, pt.Sum, want, workers*each, sum)
		}
		if mn, _ := pt.Min.Value(); mn != value(0) {
			t.Errorf("%s: min %v, want %v", name, mn, value(0))
		}
		if mx, _ := pt.Max.Value(); mx != value(workers-1) {
			t.Errorf("%s: max %v, want %v", name, mx, value(workers-1))
		}
	}
}

// TestEventHistogramsCardinalityLimit: past the limit, new attribute sets
// go to the overflow series, exactly as the SDK's
// WithCardinalityLimit sends them.
func TestEventHistogramsCardinalityLimit(t *testing.T) {
	p := newEventPairLimit(t, metricdata.CumulativeTemporality, 3)
	for _, m := range []*Metrics{p.sdk, p.ev} {
		for i, name := range []string{"e1", "e2", "e3", "e4", "e5"} {
			m.RecordInterToken(context.Background(), m.Engine(name).Attrs("m1", "chat", "chat"), 0.01*float64(i+1))
		}
	}
	want, got := eventMetrics(t, p.sdkReader), eventMetrics(t, p.reader)
	for name, w := range want {
		metricdatatest.AssertEqual(t, w, got[name], metricdatatest.IgnoreTimestamp(), metricdatatest.IgnoreExemplars())
	}
	pts := got[InterTokenLatencyName].Data.(metricdata.Histogram[float64]).DataPoints
	if len(pts) != 3 || !pts[2].Attributes.Equals(&overflowSet) || pts[2].Count != 3 {
		t.Errorf("ITL points %+v, want e1, e2 and an overflow series of 3", pts)
	}
}

// TestEventHistogramsDropNonFinite: NaN and infinities are not recorded.
func TestEventHistogramsDropNonFinite(t *testing.T) {
	p := newEventPair(t, metricdata.CumulativeTemporality)
	a := p.ev.Engine("e1").Attrs("m1", "chat", "chat")
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0.5} {
		p.ev.RecordInterToken(context.Background(), a, v)
	}
	pt := eventMetrics(t, p.reader)[InterTokenLatencyName].Data.(metricdata.Histogram[float64]).DataPoints[0]
	if pt.Count != 1 || pt.Sum != 0.5 {
		t.Errorf("count %d sum %v, want 1 and 0.5", pt.Count, pt.Sum)
	}
}

// TestEventHistogramsBindOnce: a second Metrics given the same
// EventHistograms gets an error and records through its provider.
func TestEventHistogramsBindOnce(t *testing.T) {
	ev := NewEventHistograms(0)
	if _, err := NewMetrics(nil, WithEventHistograms(ev)); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := NewMetrics(mp, WithVersion(testVersion), WithEventHistograms(ev))
	if err == nil {
		t.Error("NewMetrics with bound EventHistograms: nil error")
	}
	if m.events != nil {
		t.Fatal("the second Metrics uses the bound EventHistograms")
	}
	m.RecordInterToken(context.Background(), m.Engine("e1").Attrs("m1", "chat", "chat"), 0.02)
	if got := eventMetrics(t, reader); len(got) != 2 {
		t.Errorf("the second Metrics reported %d per-event instruments through its provider, want 2", len(got))
	}
}

// TestEventHistogramsNoAllocs: a per-event record allocates nothing.
func TestEventHistogramsNoAllocs(t *testing.T) {
	p := newEventPair(t, metricdata.CumulativeTemporality)
	a := p.ev.Engine("e1").Attrs("m1", "chat", "chat")
	if n := testing.AllocsPerRun(1000, func() { p.ev.RecordInterToken(context.Background(), a, 0.02) }); n != 0 {
		t.Errorf("%v allocations per RecordInterToken, want 0", n)
	}
}

// TestSetupEventHistograms: Setup hands out EventHistograms when every
// reader takes them, and they reach the Prometheus handler; an OTLP
// exporter asking for exponential histograms, or a non-OTLP exporter,
// turns them off so the SDK records every instrument.
func TestSetupEventHistograms(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"prometheus only", nil, true},
		{"otlp", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"}, true},
		{"otlp delta", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none",
			"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta"}, true},
		{"otlp exponential histograms", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none",
			"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram"}, false},
		{"console exporter", map[string]string{"OTEL_METRICS_EXPORTER": "console", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.UnsetOTEL(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			p, _, _ := setup(t, DefaultConfig())
			if (p.Events != nil) != tc.want {
				t.Fatalf("Events %v, want set: %t", p.Events, tc.want)
			}
			m, err := NewMetrics(p.MeterProvider, WithEventHistograms(p.Events))
			if err != nil {
				t.Fatal(err)
			}
			a := m.Engine("e1").Attrs("m1", "chat", "chat")
			m.RecordInterToken(context.Background(), a, 0.02)
			m.RecordInterToken(context.Background(), a, 0.3)
			rec := httptest.NewRecorder()
			p.Prometheus.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			if rec.Code != http.StatusOK {
				t.Fatalf("/metrics: %d", rec.Code)
			}
			body := rec.Body.String()
			for _, want := range []string{
				`switchboard_engine_inter_token_latency_seconds_count{engine="e1",model="m1",operation="chat"} 2`,
				`switchboard_engine_inter_token_latency_seconds_bucket{engine="e1",model="m1",operation="chat",le="0.02"} 1`,
				`gen_ai_client_operation_time_per_output_chunk_seconds_count{`,
			} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}
