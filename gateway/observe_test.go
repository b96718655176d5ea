package gateway

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestGatewayOverheadMetrics: every proxied request records its overhead
// under its operation, one parse and one pick per request, one prepare and
// one time-to-first-byte per attempt, and a stream (or an observed answer) its largest gap; the
// overhead excludes the engine's time (a 40 ms first token and 10 ms
// steps), so it stays far below the request's duration.
func TestGatewayOverheadMetrics(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 40 * time.Millisecond, ITL: 10 * time.Millisecond, OutputTokens: 5})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	const streams, unary = 3, 2
	for i := range streams + unary {
		stream := i < streams
		body := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]` + map[bool]string{true: `,"stream":true}`, false: `}`}[stream]
		resp := h.post("/v1/chat/completions", body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	rm := h.collect()
	count := func(name string, match ...attribute.KeyValue) (n uint64, sum, maxv float64) {
		m, ok := findMetric(rm, name)
		if !ok {
			return 0, 0, 0
		}
		for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			if hasAll(dp.Attributes, match) {
				n += dp.Count
				sum += dp.Sum
				if v, ok := dp.Max.Value(); ok && v > maxv {
					maxv = v
				}
			}
		}
		return n, sum, maxv
	}
	chat := telemetry.AttrOperation.String("chat")
	n, _, worst := count(telemetry.GatewayOverheadName, chat)
	if n != streams+unary {
		t.Errorf("overhead samples %d, want %d", n, streams+unary)
	}
	// Each request waits at least 40 ms + 4 × 10 ms on the engine; the
	// gateway's own share is microseconds, bounded here far above that
	// (a loaded CI machine) but below the engine's time.
	if worst <= 0 || worst >= 0.04 {
		t.Errorf("largest overhead %v s: want >0 and below the engine's 40 ms", worst)
	}
	for step, want := range map[string]uint64{"parse": streams + unary, "pick": streams + unary, "prepare": streams + unary} {
		if n, _, _ := count(telemetry.StepDurationName, telemetry.AttrStep.String(step)); n != want {
			t.Errorf("step %s: %d samples, want %d", step, n, want)
		}
	}
	if n, sum, _ := count(telemetry.TimeToFirstByteName, telemetry.AttrEngine.String("e1"), chat); n != streams+unary || sum <= 0 {
		t.Errorf("time to first byte: %d samples (sum %v), want %d", n, sum, streams+unary)
	}
	// Streams, and the non-streaming requests observed (continuation is
	// on); the gap between two tokens is the 10 ms step.
	if n, _, g := count(telemetry.StreamMaxGapName, telemetry.AttrEngine.String("e1")); n != streams+unary || g < 0.009 {
		t.Errorf("max gap: %d samples, largest %v s; want %d samples of at least the 10 ms step", n, g, streams+unary)
	}
}

// TestGenAISpanAttributes: the engine span carries the GenAI attributes of
// the pinned conventions: provider and server at start, the request's
// sampling parameters, stream flag, the engine's response model, finish
// reasons and time to first chunk; and only keys the conventions list for
// the inference span (or Switchboard's own).
func TestGenAISpanAttributes(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond, OutputTokens: 3})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}, ProviderName: "acme"}))
	for _, body := range []string{
		`{"model":"m","stream":true,"max_tokens":2,"temperature":0.5,"top_p":0.9,"seed":7,"n":1,"stop":["x"],"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}`,
	} {
		resp := h.post("/v1/chat/completions", body)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	var got []map[attribute.Key]attribute.Value
	for _, sp := range h.spans.Ended() {
		if !strings.HasPrefix(sp.Name(), "chat ") {
			continue
		}
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range sp.Attributes() {
			m[kv.Key] = kv.Value
		}
		got = append(got, m)
		checkSpanKeys(t, sp)
	}
	if len(got) != 2 {
		t.Fatalf("%d engine spans, want 2", len(got))
	}
	host, port := srvHostPort(t, srv.URL)
	for i, want := range []map[attribute.Key]any{
		{"gen_ai.provider.name": "acme", "server.address": host, "server.port": int64(port), "gen_ai.request.stream": true,
			"gen_ai.request.temperature": 0.5, "gen_ai.request.top_p": 0.9, "gen_ai.request.seed": int64(7), "gen_ai.request.stop_sequences": []string{"x"},
			"gen_ai.request.max_tokens": int64(2), "gen_ai.response.model": "m", "gen_ai.response.finish_reasons": []string{"length"}},
		{"gen_ai.provider.name": "acme", "gen_ai.output.type": "json", "gen_ai.response.model": "m", "gen_ai.response.finish_reasons": []string{"stop"}},
	} {
		for k, v := range want {
			if got[i][k].AsInterface() == nil || !equalValue(got[i][k].AsInterface(), v) {
				t.Errorf("span %d: %s = %v, want %v", i, k, got[i][k].AsInterface(), v)
			}
		}
	}
	if _, ok := got[0]["gen_ai.response.time_to_first_chunk"]; !ok {
		t.Error("streamed span has no gen_ai.response.time_to_first_chunk")
	}
	for _, k := range []attribute.Key{"gen_ai.request.stream", "gen_ai.response.time_to_first_chunk", "gen_ai.request.choice.count"} {
		if _, ok := got[1][k]; ok {
			t.Errorf("non-streamed span has %s", k)
		}
	}
	if _, ok := got[0]["gen_ai.request.choice.count"]; ok {
		t.Error("n=1 gave gen_ai.request.choice.count (only set when not 1)")
	}
}

// genaiSpanKeys are the gen_ai.* span attributes of the pinned conventions'
// inference span that the gateway may set (the full list is
// telemetry/genaispec_test.go's genaiSpecSpanAttrs).
var genaiSpanKeys = []string{
	"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.output.type", "gen_ai.request.choice.count", "gen_ai.request.model",
	"gen_ai.request.seed", "gen_ai.request.stream", "gen_ai.request.frequency_penalty", "gen_ai.request.max_tokens",
	"gen_ai.request.presence_penalty", "gen_ai.request.stop_sequences", "gen_ai.request.temperature", "gen_ai.request.top_k",
	"gen_ai.request.top_p", "gen_ai.response.finish_reasons", "gen_ai.response.id", "gen_ai.response.model",
	"gen_ai.response.time_to_first_chunk", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
}

func checkSpanKeys(t *testing.T, sp sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, kv := range sp.Attributes() {
		k := string(kv.Key)
		if strings.HasPrefix(k, "gen_ai.") && !slices.Contains(genaiSpanKeys, k) {
			t.Errorf("span %q: %s is not an inference-span attribute of the conventions", sp.Name(), k)
		}
	}
}

func equalValue(got, want any) bool {
	switch w := want.(type) {
	case []string:
		g, ok := got.([]string)
		return ok && slices.Equal(g, w)
	default:
		return got == want
	}
}

func srvHostPort(t *testing.T, u string) (string, int) {
	t.Helper()
	hp := strings.TrimPrefix(u, "http://")
	i := strings.LastIndexByte(hp, ':')
	var port int
	for _, c := range hp[i+1:] {
		port = port*10 + int(c-'0')
	}
	return hp[:i], port
}

// TestServerSpanMarksFailureAfterStart: a stream that fails after its 200
// went out shows the failure on the gateway's server span too: error.type
// and status Error for an engine that cut the stream; error.type without
// Error for a client that went away.
func TestServerSpanMarksFailureAfterStart(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, OutputTokens: 50})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	const body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

	resp := h.post("/v1/chat/completions", body, "X-Enginesim-Fault", "close-after=2")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil { // the stream has started
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	h.waitIdle()

	want := map[string]codes.Code{ErrTypeEngineDisconnect: codes.Error, ErrTypeClientCancelled: codes.Unset}
	var got map[string]codes.Code
	if !testutil.Poll(5*time.Second, func() bool {
		got = map[string]codes.Code{}
		for _, sp := range h.spans.Ended() {
			if sp.SpanKind() != trace.SpanKindServer {
				continue
			}
			for _, kv := range sp.Attributes() {
				if kv.Key == telemetry.AttrErrorType {
					got[kv.Value.AsString()] = sp.Status().Code
				}
			}
		}
		return len(got) == len(want)
	}) {
		t.Fatalf("server spans' error types %v, want %v", got, want)
	}
	for k, v := range want {
		if c, ok := got[k]; !ok || c != v {
			t.Errorf("server span with error.type %s: status %v (present %v), want %v", k, c, ok, v)
		}
	}
}

// startCapture is a sampler that samples everything and keeps the
// attributes each engine span had when it started.
type startCapture struct {
	mu    sync.Mutex
	attrs map[string][]attribute.KeyValue
}

func (c *startCapture) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	if p.Kind == trace.SpanKindClient {
		c.mu.Lock()
		c.attrs[p.Name] = slices.Clone(p.Attributes)
		c.mu.Unlock()
	}
	return sdktrace.AlwaysSample().ShouldSample(p)
}

func (c *startCapture) Description() string { return "startCapture" }

// TestGenAISamplingAttributesAtStart: the attributes the GenAI conventions
// call sampling-relevant are given to the sampler when the engine span
// starts, with the model the engine is asked for (an alias's target), as
// in the span name.
func TestGenAISamplingAttributesAtStart(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond, OutputTokens: 2})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.Models.Aliases = map[string]string{"public": "m"}
	capture := &startCapture{attrs: map[string][]attribute.KeyValue{}}
	h := newHarness(t, cfg, withSampler(capture))
	resp := h.post("/v1/chat/completions", `{"model":"public","messages":[{"role":"user","content":"hi"}]}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	host, port := srvHostPort(t, srv.URL)
	capture.mu.Lock()
	got := capture.attrs["chat m"]
	capture.mu.Unlock()
	want := []attribute.KeyValue{
		telemetry.AttrGenAIOp.String("chat"), telemetry.AttrGenAIReqModel.String("m"), telemetry.AttrGenAIProvider.String("vllm"),
		telemetry.AttrServerAddress.String(host), telemetry.AttrServerPort.Int(port),
	}
	for _, kv := range want {
		if !slices.Contains(got, kv) {
			t.Errorf("sampler saw %v at start; missing %v", got, kv)
		}
	}
	var alias string
	for _, sp := range h.spans.Ended() {
		for _, kv := range sp.Attributes() {
			if kv.Key == "switchboard.model_alias" {
				alias = kv.Value.AsString()
			}
		}
	}
	if alias != "public" {
		t.Errorf("switchboard.model_alias = %q, want the name the client used", alias)
	}
}
