package telemetry

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testVersion is the application version newTestMetrics passes, which the
// scope of its metrics carries.
const testVersion = "1.2.3-test"

// newTestMetrics returns Metrics recording into a manual reader, with the
// scope version testVersion.
func newTestMetrics(t *testing.T) (*Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := NewMetrics(mp, WithVersion(testVersion))
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	return m, reader
}

// collectScope collects rd and returns Switchboard's scope.
func collectScope(t *testing.T, rd sdkmetric.Reader) metricdata.ScopeMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name == ScopeName {
			return sm
		}
	}
	t.Fatalf("no scope %q in %+v", ScopeName, rm.ScopeMetrics)
	return metricdata.ScopeMetrics{}
}

// hdp is the cumulative histogram data point that recording values under
// attrs produces: explicit bounds, upper-inclusive buckets.
func hdp[N int64 | float64](attrs attribute.Set, bounds []float64, values ...N) metricdata.HistogramDataPoint[N] {
	dp := metricdata.HistogramDataPoint[N]{Attributes: attrs, Bounds: bounds, BucketCounts: make([]uint64, len(bounds)+1)}
	var lo, hi N
	for i, v := range values {
		b := len(bounds)
		for j, ub := range bounds {
			if float64(v) <= ub {
				b = j
				break
			}
		}
		dp.BucketCounts[b]++
		dp.Count++
		dp.Sum += v
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	if len(values) > 0 {
		dp.Min, dp.Max = metricdata.NewExtrema(lo), metricdata.NewExtrema(hi)
	}
	return dp
}

func hist[N int64 | float64](dps ...metricdata.HistogramDataPoint[N]) metricdata.Histogram[N] {
	return metricdata.Histogram[N]{Temporality: metricdata.CumulativeTemporality, DataPoints: dps}
}

func set(kvs ...attribute.KeyValue) attribute.Set { return attribute.NewSet(kvs...) }

// TestMetricsRecord records through every method and compares the whole
// collected scope: names, units, bucket boundaries, attributes and values.
func TestMetricsRecord(t *testing.T) {
	m, reader := newTestMetrics(t)
	ctx := context.Background()
	e1, e2 := m.Engine("e1", WithServer("10.0.0.1", 8000)), m.Engine("e2", WithProvider("openai"))
	chat := e1.Attrs("m1", "chat", "chat")
	text := e2.Attrs("m1", "text_completion", "completions").Answered([]byte("m1"))
	if e1.Attrs("m1", "chat", "chat").Answered([]byte("other")) != chat {
		t.Error("an answer naming another model changed the attribute sets")
	}

	m.RecordFirstToken(ctx, chat, 0.05)
	m.RecordFirstToken(ctx, text, 0.3)
	m.RecordInterToken(ctx, chat, 0.012)
	m.RecordInterToken(ctx, chat, 0.033)
	m.RecordEnd(ctx, chat, Outcome{Seconds: 1.5, InputTokens: 10, OutputTokens: 20})
	m.RecordEnd(ctx, chat, Outcome{Seconds: 0.3, ErrorType: "503", InputTokens: -1, OutputTokens: -1})
	m.RecordEnd(ctx, text, Outcome{Seconds: 2, InputTokens: 7, OutputTokens: -1}) // no output usage
	m.RecordParseError(ctx, chat)
	m.RecordParseError(ctx, chat)
	m.RecordFirstByte(ctx, chat, 0.004)
	m.RecordMaxGap(ctx, text, 0.2)
	m.RecordStep(ctx, StepParse, 0.00002)
	m.RecordStep(ctx, StepPick, 0.000001)
	m.RecordStep(ctx, StepPick, 0.000003)
	m.RecordOverhead(ctx, m.Operation("chat"), 0.0002)
	reg, err := m.ObserveInFlight(func(report func(e *Engine, prefill, decode int64)) {
		report(e1, 2, 3)
		report(e2, 0, 1)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	e1m1 := []attribute.KeyValue{AttrEngine.String("e1"), AttrModel.String("m1"), AttrOperation.String("chat")}
	e2m1 := []attribute.KeyValue{AttrEngine.String("e2"), AttrModel.String("m1"), AttrOperation.String("completions")}
	gChat := []attribute.KeyValue{AttrGenAIOp.String("chat"), AttrGenAIReqModel.String("m1"), AttrGenAIProvider.String("vllm"),
		AttrServerAddress.String("10.0.0.1"), AttrServerPort.Int(8000)}
	gText := []attribute.KeyValue{AttrGenAIOp.String("text_completion"), AttrGenAIReqModel.String("m1"), AttrGenAIRespModel.String("m1"), AttrGenAIProvider.String("openai")}
	with := func(kvs []attribute.KeyValue, more ...attribute.KeyValue) attribute.Set {
		return set(append(slices.Clone(kvs), more...)...)
	}
	errType := AttrErrorType.String("503")

	want := metricdata.ScopeMetrics{
		Scope: instrumentation.Scope{Name: ScopeName, Version: testVersion},
		Metrics: []metricdata.Metrics{
			{
				Name: ActiveRequestsName, Unit: "{request}",
				Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: false,
					DataPoints: []metricdata.DataPoint[int64]{
						{Attributes: set(AttrEngine.String("e1"), AttrPhase.String("prefill")), Value: 2},
						{Attributes: set(AttrEngine.String("e1"), AttrPhase.String("decode")), Value: 3},
						{Attributes: set(AttrEngine.String("e2"), AttrPhase.String("prefill")), Value: 0},
						{Attributes: set(AttrEngine.String("e2"), AttrPhase.String("decode")), Value: 1},
					}},
			},
			{
				Name: TimeToFirstTokenName, Unit: "s",
				Data: hist(hdp(set(e1m1...), ttftBuckets, 0.05), hdp(set(e2m1...), ttftBuckets, 0.3)),
			},
			{
				Name: InterTokenLatencyName, Unit: "s",
				Data: hist(hdp(set(e1m1...), itlBuckets, 0.012, 0.033)),
			},
			{
				Name: RequestDurationName, Unit: "s",
				Data: hist(
					hdp(set(e1m1...), durationBuckets, 1.5),
					hdp(with(e1m1, errType), durationBuckets, 0.3),
					hdp(set(e2m1...), durationBuckets, 2.0),
				),
			},
			{
				Name: ParseErrorsName, Unit: "{event}",
				Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true,
					DataPoints: []metricdata.DataPoint[int64]{{Attributes: set(e1m1...), Value: 2}}},
			},
			{
				Name: TimeToFirstByteName, Unit: "s",
				Data: hist(hdp(set(e1m1...), ttftBuckets, 0.004)),
			},
			{
				Name: StreamMaxGapName, Unit: "s",
				Data: hist(hdp(set(e2m1...), ttftBuckets, 0.2)),
			},
			{
				Name: GatewayOverheadName, Unit: "s",
				Data: hist(hdp(set(AttrOperation.String("chat")), overheadBuckets, 0.0002)),
			},
			{
				Name: StepDurationName, Unit: "s",
				Data: hist(hdp(set(AttrStep.String("parse")), overheadBuckets, 0.00002), hdp(set(AttrStep.String("pick")), overheadBuckets, 0.000001, 0.000003)),
			},
			{
				Name: GenAIClientOperationDurationName, Unit: "s",
				Data: hist(
					hdp(set(gChat...), genaiDurationBuckets, 1.5),
					hdp(with(gChat, errType), genaiDurationBuckets, 0.3),
					hdp(set(gText...), genaiDurationBuckets, 2.0),
				),
			},
			{
				Name: GenAIClientTimeToFirstChunkName, Unit: "s",
				Data: hist(hdp(set(gChat...), genaiDurationBuckets, 0.05), hdp(set(gText...), genaiDurationBuckets, 0.3)),
			},
			{
				Name: GenAIClientTimePerOutputChunkName, Unit: "s",
				Data: hist(hdp(set(gChat...), genaiDurationBuckets, 0.012, 0.033)),
			},
			{
				Name: GenAIClientTokenUsageName, Unit: "{token}",
				Data: hist(
					hdp(with(gChat, AttrGenAITokType.String("input")), tokenBuckets, int64(10)),
					hdp(with(gChat, AttrGenAITokType.String("output")), tokenBuckets, int64(20)),
					hdp(with(gText, AttrGenAITokType.String("input")), tokenBuckets, int64(7)),
				),
			},
		},
	}

	got := collectScope(t, reader)
	// Descriptions are prose, not part of the contract: require one, then
	// take it from what was collected.
	desc := map[string]string{}
	for _, mt := range got.Metrics {
		if mt.Description == "" {
			t.Errorf("%s has no description", mt.Name)
		}
		desc[mt.Name] = mt.Description
	}
	for i := range want.Metrics {
		want.Metrics[i].Description = desc[want.Metrics[i].Name]
	}
	metricdatatest.AssertEqual(t, want, got, metricdatatest.IgnoreTimestamp())
}

// TestMetricsErrorTypeOnlyOnFailure checks the success and failure paths
// separately: error.type never appears on a successful attempt.
func TestMetricsErrorTypeOnlyOnFailure(t *testing.T) {
	m, reader := newTestMetrics(t)
	a := m.Engine("e1").Attrs("m1", "chat", "chat")
	m.RecordEnd(context.Background(), a, Outcome{Seconds: 0.2, InputTokens: -1, OutputTokens: -1})
	for _, mt := range collectScope(t, reader).Metrics {
		h, ok := mt.Data.(metricdata.Histogram[float64])
		if !ok {
			continue
		}
		for _, dp := range h.DataPoints {
			if dp.Attributes.HasValue(AttrErrorType) {
				t.Errorf("%s: error.type on a success: %v", mt.Name, dp.Attributes.ToSlice())
			}
		}
	}

	m.RecordEnd(context.Background(), a, Outcome{Seconds: 0.4, ErrorType: "client_cancelled", InputTokens: -1, OutputTokens: -1})
	var failures int
	for _, mt := range collectScope(t, reader).Metrics {
		h, ok := mt.Data.(metricdata.Histogram[float64])
		if !ok {
			continue
		}
		for _, dp := range h.DataPoints {
			if v, ok := dp.Attributes.Value(AttrErrorType); ok {
				failures++
				if v.AsString() != "client_cancelled" || dp.Count != 1 || dp.Sum != 0.4 {
					t.Errorf("%s failure point: %v count %d sum %v", mt.Name, dp.Attributes.ToSlice(), dp.Count, dp.Sum)
				}
			}
		}
	}
	if failures != 2 { // switchboard.engine.request.duration and gen_ai.client.operation.duration
		t.Errorf("%d failure data points, want 2", failures)
	}
}

func TestObserveInFlightUnregister(t *testing.T) {
	m, reader := newTestMetrics(t)
	e := m.Engine("e1")
	calls := 0
	reg, err := m.ObserveInFlight(func(report func(*Engine, int64, int64)) {
		calls++
		report(e, 1, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	collectScope(t, reader)
	if calls != 1 {
		t.Fatalf("callback ran %d times on one collection, want 1", calls)
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("callback ran after Unregister")
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name == ActiveRequestsName {
				if s := mt.Data.(metricdata.Sum[int64]); len(s.DataPoints) != 0 {
					t.Errorf("active requests still reported after Unregister: %+v", s.DataPoints)
				}
			}
		}
	}
}

func TestNewMetricsNilProvider(t *testing.T) {
	m, err := NewMetrics(nil)
	if err != nil || m == nil {
		t.Fatalf("NewMetrics(nil) = %v, %v; want usable no-op metrics", m, err)
	}
	// Every method works on the no-op instruments.
	a := m.Engine("e1").Attrs("m1", "chat", "chat")
	ctx := context.Background()
	m.RecordFirstToken(ctx, a, 1)
	m.RecordInterToken(ctx, a, 1)
	m.RecordParseError(ctx, a)
	m.RecordEnd(ctx, a, Outcome{Seconds: 1, ErrorType: "500"})
	reg, err := m.ObserveInFlight(func(func(*Engine, int64, int64)) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
}

func TestEngineAttrsCached(t *testing.T) {
	m, _ := newTestMetrics(t)
	e := m.Engine("e1")
	if e.Name() != "e1" {
		t.Errorf("Name() = %q", e.Name())
	}
	a := e.Attrs("m1", "chat", "chat")
	if b := e.Attrs("m1", "chat", "chat"); a != b {
		t.Errorf("Attrs(m1, chat) returned %p then %p, want the cached pointer", a, b)
	}
	if a.SpanName() != "chat m1" {
		t.Errorf("SpanName() = %q, want %q", a.SpanName(), "chat m1")
	}
	others := map[string]*Attrs{
		"other model":  e.Attrs("m2", "chat", "chat"),
		"other op":     e.Attrs("m1", "embeddings", "embeddings"),
		"other engine": m.Engine("e2").Attrs("m1", "chat", "chat"),
	}
	for name, o := range others {
		if o == a {
			t.Errorf("%s: got the (m1, chat) attrs of e1", name)
		}
	}
	if got := others["other op"].SpanName(); got != "embeddings m1" {
		t.Errorf("SpanName() = %q, want %q", got, "embeddings m1")
	}
	// Adding a pair keeps the earlier ones (copy-on-write map).
	if b := e.Attrs("m1", "chat", "chat"); a != b {
		t.Error("Attrs(m1, chat) changed after other pairs were added")
	}
	if n := testing.AllocsPerRun(100, func() { e.Attrs("m1", "chat", "chat") }); n != 0 {
		t.Errorf("cached Attrs lookup allocates %v times, want 0", n)
	}
}

func TestEngineAttrsConcurrentSafe(t *testing.T) {
	m, _ := newTestMetrics(t)
	e := m.Engine("e1")
	const workers = 8
	models := []string{"a", "b", "c", "d"}
	got := make([][]*Attrs, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, md := range models {
				got[w] = append(got[w], e.Attrs(md, "chat", "chat"))
			}
		}()
	}
	wg.Wait()
	for w := 1; w < workers; w++ {
		for i := range models {
			if got[w][i] != got[0][i] {
				t.Errorf("worker %d got a different *Attrs for %q", w, models[i])
			}
		}
	}
}

// TestRecordSuccessPathNoAllocs records through a real SDK meter provider:
// the per-token and per-request success paths must not allocate.
func TestRecordSuccessPathNoAllocs(t *testing.T) {
	m, _ := newTestMetrics(t)
	a := m.Engine("e1").Attrs("m1", "chat", "chat")
	// The gateway records with the request context, which carries a
	// sampled span: exemplars are offered too.
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled}))
	ok := Outcome{Seconds: 1.2, InputTokens: 12, OutputTokens: 40}
	// The first measurement of a series creates its aggregation state.
	m.RecordFirstToken(ctx, a, 0.1)
	m.RecordInterToken(ctx, a, 0.02)
	m.RecordEnd(ctx, a, ok)
	m.RecordParseError(ctx, a)

	for _, tc := range []struct {
		name string
		fn   func()
	}{
		{"RecordFirstToken", func() { m.RecordFirstToken(ctx, a, 0.1) }},
		{"RecordInterToken", func() { m.RecordInterToken(ctx, a, 0.02) }},
		{"RecordEnd", func() { m.RecordEnd(ctx, a, ok) }},
		{"RecordParseError", func() { m.RecordParseError(ctx, a) }},
	} {
		if n := testing.AllocsPerRun(1000, tc.fn); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", tc.name, n)
		}
	}
}

// BenchmarkRecordInterToken: one per-event record of the two per-event
// histograms, through the SDK (sdk) and through EventHistograms (events),
// as the binary records them.
func BenchmarkRecordInterToken(b *testing.B) {
	for _, name := range []string{"sdk", "events"} {
		b.Run(name, func(b *testing.B) {
			var opts []MetricsOption
			var readerOpts []sdkmetric.ManualReaderOption
			if name == "events" {
				ev := NewEventHistograms(0)
				opts = append(opts, WithEventHistograms(ev))
				readerOpts = append(readerOpts, sdkmetric.WithProducer(ev.Producer(metricdata.CumulativeTemporality, false)))
			}
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader(readerOpts...)))
			defer func() { _ = mp.Shutdown(context.Background()) }()
			m, err := NewMetrics(mp, opts...)
			if err != nil {
				b.Fatal(err)
			}
			a := m.Engine("e1").Attrs("m1", "chat", "chat")
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				m.RecordInterToken(ctx, a, 0.02)
			}
		})
	}
}

// TestObserveEngineStats: the four engine stats gauges carry the engine
// attribute only, and an unknown (negative) KV usage or hit ratio is not
// observed at all.
func TestObserveEngineStats(t *testing.T) {
	m, reader := newTestMetrics(t)
	e1, e2 := m.Engine("e1"), m.Engine("e2")
	reg, err := m.ObserveEngineStats(func(report func(*Engine, EngineStats)) {
		report(e1, EngineStats{QueueDepth: 3, KVCacheUsage: 0.25, PrefixCacheHitRatio: 0.5, AccountingDrift: -2})
		report(e2, EngineStats{QueueDepth: 0, KVCacheUsage: -1, PrefixCacheHitRatio: -1, AccountingDrift: 0})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	s1, s2 := set(AttrEngine.String("e1")), set(AttrEngine.String("e2"))
	want := metricdata.ScopeMetrics{
		Scope: instrumentation.Scope{Name: ScopeName, Version: testVersion},
		Metrics: []metricdata.Metrics{
			{Name: QueueDepthName, Unit: "{request}", Data: metricdata.Gauge[int64]{DataPoints: []metricdata.DataPoint[int64]{
				{Attributes: s1, Value: 3}, {Attributes: s2, Value: 0}}}},
			{Name: KVCacheUsageName, Unit: "1", Data: metricdata.Gauge[float64]{DataPoints: []metricdata.DataPoint[float64]{
				{Attributes: s1, Value: 0.25}}}},
			{Name: PrefixCacheHitRatioName, Unit: "1", Data: metricdata.Gauge[float64]{DataPoints: []metricdata.DataPoint[float64]{
				{Attributes: s1, Value: 0.5}}}},
			{Name: AccountingDriftName, Unit: "{request}", Data: metricdata.Gauge[int64]{DataPoints: []metricdata.DataPoint[int64]{
				{Attributes: s1, Value: -2}, {Attributes: s2, Value: 0}}}},
		},
	}
	got := collectScope(t, reader)
	for i := range got.Metrics {
		if !strings.Contains(got.Metrics[i].Description, "scrape") {
			t.Errorf("%s: description %q does not say where the value comes from", got.Metrics[i].Name, got.Metrics[i].Description)
		}
		got.Metrics[i].Description = ""
	}
	metricdatatest.AssertEqual(t, want, got, metricdatatest.IgnoreTimestamp())
}

// TestObserveEngineState reports one engine ready, one draining and one
// ejected: each gets 1 for its state and 0 for the four others, with the
// engine, state and role attributes only (role both when not given, an
// empty WithRole keeping it).
func TestObserveEngineState(t *testing.T) {
	m, reader := newTestMetrics(t)
	e1, e2, e3 := m.Engine("e1"), m.Engine("e2", WithRole("prefill")), m.Engine("e3", WithRole(""))
	reg, err := m.ObserveEngineState(func(report func(e *Engine, state int)) {
		report(e1, 0)
		report(e2, 3)
		report(e3, 4)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()
	got := map[string]int64{}
	for _, mt := range collectScope(t, reader).Metrics {
		if mt.Name != EngineStateName {
			continue
		}
		if mt.Unit != "1" {
			t.Errorf("unit %q", mt.Unit)
		}
		for _, dp := range mt.Data.(metricdata.Gauge[int64]).DataPoints {
			e, _ := dp.Attributes.Value(AttrEngine)
			s, _ := dp.Attributes.Value(AttrState)
			r, _ := dp.Attributes.Value(AttrRole)
			if dp.Attributes.Len() != 3 {
				t.Errorf("attributes %v", dp.Attributes.ToSlice())
			}
			got[e.AsString()+"/"+r.AsString()+"/"+s.AsString()] = dp.Value
		}
	}
	want := map[string]int64{
		"e1/both/ready": 1, "e1/both/unhealthy": 0, "e1/both/sleeping": 0, "e1/both/draining": 0, "e1/both/ejected": 0,
		"e2/prefill/ready": 0, "e2/prefill/unhealthy": 0, "e2/prefill/sleeping": 0, "e2/prefill/draining": 1, "e2/prefill/ejected": 0,
		"e3/both/ready": 0, "e3/both/unhealthy": 0, "e3/both/sleeping": 0, "e3/both/draining": 0, "e3/both/ejected": 1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
