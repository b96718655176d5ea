package telemetry

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestGenAIConventions compares the gen_ai.* instruments the gateway emits
// with the table transcribed from the pinned conventions
// (genaispec_test.go): the client family is emitted whole, with the
// conventions' names, units and advised buckets (operation.duration's
// extended to the longest timeout), every required attribute, the
// conditionally required ones under their conditions, and no attribute
// the conventions do not list for that metric; the model-server family
// (gen_ai.server.*) is not emitted (see the package docs for why).
func TestGenAIConventions(t *testing.T) {
	if !strings.Contains(GenAIConventions, genaiSpecVersion) || !strings.Contains(GenAIConventions, genaiSpecCommit) {
		t.Fatalf("GenAIConventions = %q, but the table is from %s (%s)", GenAIConventions, genaiSpecVersion, genaiSpecCommit)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	const longest = 10 * time.Minute
	m, err := NewMetrics(mp, WithLongestTimeout(longest))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// One engine with a known address, one without: server.port must
	// follow server.address.
	withAddr := m.Engine("e1", WithServer("10.1.2.3", 8000)).Attrs("m", "chat", "chat")
	noAddr := m.Engine("e2").Attrs("m", "text_completion", "completions").Answered([]byte("m"))
	for _, a := range []*Attrs{withAddr, noAddr} {
		m.RecordFirstToken(ctx, a, 0.1)
		m.RecordInterToken(ctx, a, 0.02)
		m.RecordEnd(ctx, a, Outcome{Seconds: 1, InputTokens: 3, OutputTokens: 4})
		m.RecordEnd(ctx, a, Outcome{Seconds: 2, ErrorType: "503", InputTokens: -1, OutputTokens: -1})
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	emitted := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if strings.HasPrefix(mt.Name, "gen_ai.") {
				emitted[mt.Name] = mt
			}
		}
	}

	for _, spec := range genaiSpecMetrics {
		mt, ok := emitted[spec.Name]
		delete(emitted, spec.Name)
		if strings.HasPrefix(spec.Name, "gen_ai.server.") {
			if ok {
				t.Errorf("%s is emitted: a gateway emits the client family only", spec.Name)
			}
			continue
		}
		if !ok {
			t.Errorf("%s (conventions %s) is not emitted", spec.Name, genaiSpecVersion)
			continue
		}
		if mt.Unit != spec.Unit {
			t.Errorf("%s: unit %q, conventions %q", spec.Name, mt.Unit, spec.Unit)
		}
		wantBuckets := spec.Buckets
		if spec.Name == GenAIClientOperationDurationName {
			wantBuckets = GenAIOperationBuckets(longest)
			if !slices.Equal(wantBuckets[:len(spec.Buckets)], spec.Buckets) || wantBuckets[len(wantBuckets)-1] < longest.Seconds() ||
				len(wantBuckets) > len(spec.Buckets) && wantBuckets[len(wantBuckets)-2] >= longest.Seconds() {
				t.Errorf("%s: buckets %v do not extend the conventions' %v just past %v", spec.Name, wantBuckets, spec.Buckets, longest)
			}
		}
		levels := map[string]string{}
		for _, a := range spec.Attrs {
			levels[a.Key] = a.Level
		}
		check := func(attrs attribute.Set, bounds []float64, failed bool) {
			if !slices.Equal(bounds, wantBuckets) {
				t.Errorf("%s: buckets %v, want %v", spec.Name, bounds, wantBuckets)
			}
			for _, kv := range attrs.ToSlice() {
				if _, ok := levels[string(kv.Key)]; !ok {
					t.Errorf("%s: attribute %s is not in the conventions for this metric", spec.Name, kv.Key)
				}
			}
			for key, level := range levels {
				has := attrs.HasValue(attribute.Key(key))
				switch {
				case level == "required" && !has:
					t.Errorf("%s: required attribute %s missing from %v", spec.Name, key, attrs.ToSlice())
				case key == "gen_ai.request.model" && !has:
					t.Errorf("%s: gen_ai.request.model is available but missing", spec.Name)
				case key == "server.port" && has != attrs.HasValue("server.address"):
					t.Errorf("%s: server.port must be set exactly when server.address is: %v", spec.Name, attrs.ToSlice())
				case key == "error.type" && has != failed:
					t.Errorf("%s: error.type set=%v on a point with failure=%v", spec.Name, has, failed)
				}
			}
			if v, ok := attrs.Value("gen_ai.provider.name"); ok && v.AsString() != DefaultProvider {
				t.Errorf("%s: gen_ai.provider.name %q, want the default %q", spec.Name, v.AsString(), DefaultProvider)
			}
		}
		switch d := mt.Data.(type) {
		case metricdata.Histogram[float64]:
			if spec.Kind != "histogram" {
				t.Errorf("%s: a histogram, conventions %s", spec.Name, spec.Kind)
			}
			for _, dp := range d.DataPoints {
				// The failed attempts, and only they, lasted 2 s.
				check(dp.Attributes, dp.Bounds, dp.Sum == 2*float64(dp.Count))
			}
			if len(d.DataPoints) == 0 {
				t.Errorf("%s: no data points", spec.Name)
			}
		case metricdata.Histogram[int64]:
			if spec.Kind != "histogram" {
				t.Errorf("%s: a histogram, conventions %s", spec.Name, spec.Kind)
			}
			for _, dp := range d.DataPoints {
				check(dp.Attributes, dp.Bounds, false)
				if v, _ := dp.Attributes.Value("gen_ai.token.type"); v.AsString() != "input" && v.AsString() != "output" {
					t.Errorf("%s: gen_ai.token.type %q", spec.Name, v.AsString())
				}
			}
		default:
			t.Errorf("%s: data %T, conventions %s", spec.Name, mt.Data, spec.Kind)
		}
	}
	for name := range emitted {
		t.Errorf("%s is emitted but not in the conventions %s", name, genaiSpecVersion)
	}
}

// TestGenAISpanKeys: every conventions key telemetry defines for the engine
// span is one the pinned conventions list for the inference client span
// (genaiSpecSpanAttrs), so a misspelt key fails here rather than on a
// dashboard; http.response.status_code, which the GenAI span does not list,
// is the HTTP conventions' own.
func TestGenAISpanKeys(t *testing.T) {
	listed := map[string]bool{}
	for _, a := range genaiSpecSpanAttrs {
		listed[a.Key] = true
	}
	for _, k := range []attribute.Key{
		AttrGenAIOp, AttrGenAIProvider, AttrGenAIReqModel, AttrGenAIRespModel, AttrGenAIFinish,
		AttrGenAIStream, AttrGenAIFirstChunk, AttrGenAIResponseID, AttrGenAIInputTok, AttrGenAIOutputTok,
		AttrGenAIMaxTokens, AttrGenAITemperature, AttrGenAITopP, AttrGenAITopK, AttrGenAIFrequencyPenalty,
		AttrGenAIPresencePenalty, AttrGenAISeed, AttrGenAIChoiceCount, AttrGenAIStopSequences,
		AttrGenAIOutputType, AttrServerAddress, AttrServerPort, AttrErrorType,
	} {
		if !listed[string(k)] {
			t.Errorf("%s is not an attribute of the conventions' inference client span", k)
		}
	}
	if AttrHTTPStatus != "http.response.status_code" {
		t.Errorf("AttrHTTPStatus = %s, want http.response.status_code", AttrHTTPStatus)
	}
}
