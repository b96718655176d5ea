package telemetry

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// setup calls Setup with cfg, logging into the returned buffer, and shuts
// the providers down at the end of the test unless the test did.
func setup(t *testing.T, cfg Config) (*Providers, func(context.Context) error, *testutil.LockedBuffer) {
	t.Helper()
	logs := &testutil.LockedBuffer{}
	p, shutdown, err := Setup(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	var once sync.Once
	var serr error
	stop := func(ctx context.Context) error {
		once.Do(func() { serr = shutdown(ctx) })
		return serr
	}
	t.Cleanup(func() { _ = stop(context.Background()) })
	return p, stop, logs
}

func TestSetupWithoutOTLP(t *testing.T) {
	testutil.UnsetOTEL(t)
	cfg := DefaultConfig()
	cfg.ServiceName = "sb-prom-test"
	p, shutdown, logs := setup(t, cfg)
	if p.OTLPTraces || p.OTLPMetrics {
		t.Errorf("OTLPTraces=%t OTLPMetrics=%t with no OTEL_* set, want false", p.OTLPTraces, p.OTLPMetrics)
	}
	if n := strings.Count(logs.String(), "no OTLP exporter configured"); n != 1 {
		t.Errorf("%d log lines say no OTLP exporter is configured, want 1:\n%s", n, logs)
	}
	if p.Propagator == nil || p.TracerProvider == nil || p.MeterProvider == nil || p.Prometheus == nil {
		t.Fatalf("incomplete providers: %+v", p)
	}

	m, err := NewMetrics(p.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	a := m.Engine("e1").Attrs("m1", "chat", "chat")
	m.RecordFirstToken(context.Background(), a, 0.07)
	m.RecordFirstToken(context.Background(), a, 3)

	mfs := testutil.ScrapeHandler(t, p.Prometheus)
	ttft := mfs["switchboard_engine_time_to_first_token_seconds"]
	if ttft == nil || ttft.GetType() != dto.MetricType_HISTOGRAM || len(ttft.GetMetric()) != 1 {
		t.Fatalf("switchboard_engine_time_to_first_token_seconds = %v, want one histogram series", ttft)
	}
	mt := ttft.GetMetric()[0]
	if testutil.Label(mt, "engine") != "e1" || testutil.Label(mt, "model") != "m1" {
		t.Errorf("labels %v, want engine=e1 model=m1", mt.GetLabel())
	}
	h := mt.GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() != 3.07 {
		t.Errorf("count %d sum %v, want 2 and 3.07", h.GetSampleCount(), h.GetSampleSum())
	}
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if len(bounds) < len(ttftBuckets) || !equalFloats(bounds[:len(ttftBuckets)], ttftBuckets) {
		t.Errorf("bucket bounds %v, want ttftBuckets %v (+Inf)", bounds, ttftBuckets)
	}
	// The resource is exported as target_info; runtime collectors are there.
	if ti := mfs["target_info"]; ti == nil || testutil.Label(ti.GetMetric()[0], "service_name") != "sb-prom-test" {
		t.Errorf("target_info = %v, want service_name=sb-prom-test", ti)
	}
	if mfs["go_goroutines"] == nil {
		t.Error("no Go runtime metrics (go_goroutines)")
	}
	// Exemplars reach a scraper that asks for OpenMetrics: a sample
	// recorded under a sampled span links to its trace.
	sctx, span := p.TracerProvider.Tracer("telemetry-test").Start(context.Background(), "exemplar-span")
	m.RecordFirstToken(sctx, a, 0.3)
	span.End()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	p.Prometheus.ServeHTTP(rec, req)
	if want := `trace_id="` + span.SpanContext().TraceID().String() + `"`; !strings.Contains(rec.Body.String(), want) {
		t.Errorf("OpenMetrics exposition has no exemplar with %s (Content-Type %q)", want, rec.Header().Get("Content-Type"))
	}
	if err := shutdown(context.Background()); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSetupCardinalityLimit checks the configured limit reaches the meter
// provider: past it, new attribute sets fold into the overflow series.
func TestSetupCardinalityLimit(t *testing.T) {
	testutil.UnsetOTEL(t)
	cfg := DefaultConfig()
	cfg.CardinalityLimit = 3
	p, _, _ := setup(t, cfg)
	m, err := NewMetrics(p.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	e := m.Engine("e1")
	for _, model := range []string{"a", "b", "c", "d", "e"} {
		m.RecordParseError(context.Background(), e.Attrs(model, "chat", "chat"))
	}
	series := testutil.ScrapeHandler(t, p.Prometheus)["switchboard_engine_stream_parse_errors_total"].GetMetric()
	var total float64
	overflow := false
	for _, s := range series {
		total += s.GetCounter().GetValue()
		overflow = overflow || testutil.Label(s, "otel_metric_overflow") == "true"
	}
	if len(series) != 3 || !overflow || total != 5 {
		t.Errorf("%d series (overflow %t) totalling %v, want 3 including the overflow series, totalling 5", len(series), overflow, total)
	}
}

func serviceName(r *resourcepb.Resource) string {
	for _, kv := range r.GetAttributes() {
		if kv.GetKey() == "service.name" {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

func attrString(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestSetupOTLPExport points OTEL_EXPORTER_OTLP_ENDPOINT at an OTLP/HTTP
// receiver and checks a span and a metric recorded through the providers
// arrive, flushed by shutdown, under OTEL_SERVICE_NAME.
func TestSetupOTLPExport(t *testing.T) {
	testutil.UnsetOTEL(t)
	rc := &testutil.OTLPReceiver{}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "50") // milliseconds
	t.Setenv("OTEL_SERVICE_NAME", "sb-otlp-test") // wins over Config.ServiceName

	cfg := DefaultConfig()
	cfg.ServiceName = "from-config"
	p, shutdown, logs := setup(t, cfg)
	if !p.OTLPTraces || !p.OTLPMetrics {
		t.Fatalf("OTLPTraces=%t OTLPMetrics=%t with OTEL_EXPORTER_OTLP_ENDPOINT set, want true", p.OTLPTraces, p.OTLPMetrics)
	}
	if strings.Contains(logs.String(), "no OTLP exporter configured") {
		t.Errorf("logged that no exporter is configured:\n%s", logs)
	}

	sctx, span := p.TracerProvider.Tracer("telemetry-test").Start(context.Background(), "probe-span")
	if !span.IsRecording() {
		t.Error("span not recording under the default sampler")
	}
	m, err := NewMetrics(p.MeterProvider)
	if err != nil {
		t.Fatal(err)
	}
	// Recorded under the sampled span: the sample's exemplar carries its
	// trace id (the SDK's default trace_based exemplar filter).
	m.RecordFirstToken(sctx, m.Engine("e1").Attrs("m1", "chat", "chat"), 0.25)
	span.End()
	traceID := span.SpanContext().TraceID()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}

	traces, metrics := rc.Traces(), rc.Metrics()
	if errs := rc.Errors(); len(errs) > 0 {
		t.Errorf("receiver errors: %v", errs)
	}
	var spanFound bool
	for _, req := range traces {
		for _, rs := range req.GetResourceSpans() {
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					if s.GetName() == "probe-span" {
						spanFound = true
						if got := serviceName(rs.GetResource()); got != "sb-otlp-test" {
							t.Errorf("span service.name = %q, want sb-otlp-test", got)
						}
					}
				}
			}
		}
	}
	if !spanFound {
		t.Errorf("probe-span not received (%d trace requests)", len(traces))
	}

	var points uint64
	for _, req := range metrics {
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				if sm.GetScope().GetName() != ScopeName {
					continue
				}
				for _, mt := range sm.GetMetrics() {
					if mt.GetName() != TimeToFirstTokenName {
						continue
					}
					if got := serviceName(rm.GetResource()); got != "sb-otlp-test" {
						t.Errorf("metric service.name = %q, want sb-otlp-test", got)
					}
					if mt.GetUnit() != "s" {
						t.Errorf("unit %q, want s", mt.GetUnit())
					}
					for _, dp := range mt.GetHistogram().GetDataPoints() {
						if attrString(dp.GetAttributes(), "engine") != "e1" || attrString(dp.GetAttributes(), "model") != "m1" {
							t.Errorf("data point attributes %v", dp.GetAttributes())
						}
						if !equalFloats(dp.GetExplicitBounds(), ttftBuckets) {
							t.Errorf("bounds %v, want %v", dp.GetExplicitBounds(), ttftBuckets)
						}
						if dp.GetCount() == 1 && dp.GetSum() == 0.25 {
							points++
							if ex := dp.GetExemplars(); len(ex) != 1 || string(ex[0].GetTraceId()) != string(traceID[:]) || ex[0].GetAsDouble() != 0.25 {
								t.Errorf("exemplars %v, want one of 0.25 with trace id %s", ex, traceID)
							}
						}
					}
				}
			}
		}
	}
	if points == 0 {
		t.Errorf("no %s data point with the recorded sample among %d metric requests", TimeToFirstTokenName, len(metrics))
	}
}

func TestSetupSampler(t *testing.T) {
	for _, tc := range []struct {
		sampler   string
		recording bool
	}{
		{"", true}, // parentbased_always_on
		{"always_off", false},
		{"parentbased_always_off", false},
		{"always_on", true},
	} {
		t.Run("sampler="+tc.sampler, func(t *testing.T) {
			testutil.UnsetOTEL(t)
			if tc.sampler != "" {
				t.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
			}
			p, _, _ := setup(t, DefaultConfig())
			_, span := p.TracerProvider.Tracer("telemetry-test").Start(context.Background(), "s")
			defer span.End()
			if span.IsRecording() != tc.recording || span.SpanContext().IsSampled() != tc.recording {
				t.Errorf("IsRecording=%t IsSampled=%t, want %t", span.IsRecording(), span.SpanContext().IsSampled(), tc.recording)
			}
		})
	}
}

func TestSetupExporterSelection(t *testing.T) {
	for _, tc := range []struct {
		name              string
		env               map[string]string
		traces, metrics   bool
		logged, notLogged string
		wantErr           bool
	}{
		{
			name:   "none",
			env:    map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"},
			logged: "no OTLP exporter configured",
		},
		{
			name:    "prometheus metrics exporter is the admin endpoint",
			env:     map[string]string{"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none"},
			logged:  "OTEL_METRICS_EXPORTER=prometheus",
			metrics: false,
		},
		{
			name:      "traces only through the per-signal endpoint",
			env:       map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"},
			traces:    true,
			logged:    "telemetry export configured",
			notLogged: "no OTLP exporter configured",
		},
		{
			name:      "OTEL_SDK_DISABLED wins over an endpoint",
			env:       map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
			logged:    "OTEL_SDK_DISABLED=true",
			notLogged: "telemetry export configured",
		},
		{
			name:    "unknown protocol",
			env:     map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"},
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testutil.UnsetOTEL(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			logs := &testutil.LockedBuffer{}
			p, shutdown, err := Setup(context.Background(), DefaultConfig(), slog.New(slog.NewTextHandler(logs, nil)))
			if tc.wantErr {
				if err == nil {
					_ = shutdown(context.Background())
					t.Fatal("Setup: nil error")
				}
				return
			}
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			defer func() {
				// Nothing listens on the per-signal endpoint: bound the flush.
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_ = shutdown(ctx)
			}()
			if p.OTLPTraces != tc.traces || p.OTLPMetrics != tc.metrics {
				t.Errorf("OTLPTraces=%t OTLPMetrics=%t, want %t %t", p.OTLPTraces, p.OTLPMetrics, tc.traces, tc.metrics)
			}
			if !strings.Contains(logs.String(), tc.logged) {
				t.Errorf("log does not mention %q:\n%s", tc.logged, logs)
			}
			if tc.notLogged != "" && strings.Contains(logs.String(), tc.notLogged) {
				t.Errorf("log mentions %q:\n%s", tc.notLogged, logs)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"defaults", DefaultConfig(), nil},
		{"no limit", Config{ServiceName: "x", CardinalityLimit: 0, SeriesLinger: time.Second}, nil},
		{"all wrong", Config{CardinalityLimit: -1, SeriesLinger: -time.Second}, []string{"telemetry.service_name", "telemetry.cardinality_limit must be >= 0, got -1", "telemetry.series_linger must be > 0, got -1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, missing %q", err, w)
				}
			}
		})
	}
}
