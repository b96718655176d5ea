package enginesim

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// The parent the tests send in traceparent.
const (
	testTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	testSpanID  = "00f067aa0ba902b7"
)

// tracedEngine serves an engine for cfg with a TracerProvider recording into the returned
// recorder.
func tracedEngine(t *testing.T, cfg Config) (*Engine, *tracetest.SpanRecorder, func(ctx context.Context, path, body string, hdr map[string]string) (*http.Response, error)) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	e, srv := startEngine(t, cfg)
	return e, rec, func(ctx context.Context, path, body string, hdr map[string]string) (*http.Response, error) {
		return send(t, ctx, srv, http.MethodPost, path, body, hdr)
	}
}

// endedSpans waits until rec holds n ended spans and returns them.
func endedSpans(t *testing.T, rec *tracetest.SpanRecorder, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	testutil.Eventually(t, 2*time.Second, func() bool { return len(rec.Ended()) >= n }, "ended spans")
	spans := rec.Ended()
	if len(spans) != n {
		t.Fatalf("%d spans ended, want %d", len(spans), n)
	}
	return spans
}

func attrMap(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTraceSpanParentAndAttributes(t *testing.T) {
	cfg := fastConfig()
	cfg.TTFT = 20 * time.Millisecond
	cfg.ITL = 2 * time.Millisecond
	const chatMsgs = `"messages":[{"role":"user","content":"one two three"}]`
	tests := []struct {
		name, path, body string
		wantID, finish   string
		completion       int
		stream           bool
		params           bool // temperature 0.5, top_p 0.9, n 2 in the body
	}{
		{"chat stream with usage", "/v1/chat/completions",
			`{"model":"m1","stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"temperature":0.5,"top_p":0.9,"n":2,` + chatMsgs + `}`,
			"chatcmpl-rid-1", `["length"]`, 5, true, true},
		{"chat stream without usage", "/v1/chat/completions",
			`{"model":"m1","stream":true,` + chatMsgs + `}`,
			"chatcmpl-rid-1", `["stop"]`, DefaultOutputTokens, true, false},
		{"chat non-stream", "/v1/chat/completions",
			`{"model":"m1","max_completion_tokens":4,"temperature":0.5,"top_p":0.9,"n":2,` + chatMsgs + `}`,
			"chatcmpl-rid-1", `["length"]`, 4, false, true},
		{"completions stream", "/v1/completions",
			`{"model":"m1","stream":true,"max_tokens":3,"prompt":"one two three"}`,
			"cmpl-rid-1", `["length"]`, 3, true, false},
		{"responses stream", "/v1/responses",
			`{"model":"m1","stream":true,"input":"one two three"}`,
			"resp_rid-1", `["stop"]`, DefaultOutputTokens, true, false},
		{"messages stream", "/v1/messages",
			`{"model":"m1","stream":true,"max_tokens":3,` + chatMsgs + `}`,
			"chatcmpl-rid-1", `["length"]`, 3, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, rec, post := tracedEngine(t, cfg)
			resp, err := post(context.Background(), tt.path, tt.body, map[string]string{
				"traceparent":  "00-" + testTraceID + "-" + testSpanID + "-01",
				"X-Request-Id": "rid-1",
			})
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			s := endedSpans(t, rec, 1)[0]
			if s.Name() != SpanName || s.SpanKind() != trace.SpanKindServer {
				t.Errorf("span %q kind %v, want %q SERVER", s.Name(), s.SpanKind(), SpanName)
			}
			if got := s.Parent(); got.TraceID().String() != testTraceID || got.SpanID().String() != testSpanID || !got.IsRemote() {
				t.Errorf("parent %v/%v remote %v, want %s/%s from traceparent", got.TraceID(), got.SpanID(), got.IsRemote(), testTraceID, testSpanID)
			}
			if s.SpanContext().TraceID().String() != testTraceID {
				t.Errorf("trace id %v, want the parent's", s.SpanContext().TraceID())
			}
			if s.Status().Code != codes.Unset {
				t.Errorf("status %v, want unset", s.Status())
			}
			a := attrMap(s)
			want := map[attribute.Key]any{
				AttrRequestID:        tt.wantID,
				AttrResponseModel:    "m1",
				AttrFinishReasons:    tt.finish,
				AttrPromptTokens:     int64(3),
				AttrCompletionTokens: int64(tt.completion),
				AttrTimeInQueue:      0.0,
			}
			if tt.params {
				want[AttrRequestTemperature], want[AttrRequestTopP], want[AttrRequestN] = 0.5, 0.9, int64(2)
			} else {
				want[AttrRequestTemperature], want[AttrRequestTopP], want[AttrRequestN] = 1.0, 1.0, int64(1)
			}
			if strings.Contains(tt.body, "max_") {
				want[AttrRequestMaxTokens] = int64(tt.completion)
			} else if _, ok := a[AttrRequestMaxTokens]; ok {
				t.Errorf("%s set without a max_tokens in the request", AttrRequestMaxTokens)
			}
			for k, v := range want {
				if got, ok := a[k]; !ok || got.AsInterface() != v {
					t.Errorf("%s = %v (set %v), want %v", k, got.AsInterface(), ok, v)
				}
			}
			e2e := a[AttrE2E].AsFloat64()
			if e2e < cfg.TTFT.Seconds() {
				t.Errorf("e2e %v, want at least the TTFT %v", e2e, cfg.TTFT)
			}
			if d := s.EndTime().Sub(s.StartTime()).Seconds(); d < e2e-0.001 || d > e2e+0.001 {
				t.Errorf("span lasts %vs, e2e %vs: want the same", d, e2e)
			}
			ttft, ok := a[AttrTimeToFirstToken]
			if tt.stream != ok {
				t.Fatalf("time_to_first_token set %v, want %v (streams only)", ok, tt.stream)
			}
			if ok {
				if v := ttft.AsFloat64(); v < cfg.TTFT.Seconds() || v > e2e {
					t.Errorf("ttft %v, want between the configured %v and e2e %v", v, cfg.TTFT, e2e)
				}
				decode := a[AttrTimeInDecode].AsFloat64()
				if tt.completion > 1 && decode <= 0 {
					t.Errorf("decode time %v with %d tokens", decode, tt.completion)
				}
				if got := a[AttrTimeInPrefill].AsFloat64(); got != ttft.AsFloat64() {
					t.Errorf("prefill %v, want the ttft %v (no queue)", got, ttft.AsFloat64())
				}
			}
		})
	}
}

func TestTraceClientCancelRecorded(t *testing.T) {
	_, rec, post := tracedEngine(t, fastConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := post(ctx, "/v1/chat/completions", `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{FaultHeader: "stall-after=2", "traceparent": "00-" + testTraceID + "-" + testSpanID + "-01"})
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for tokens := 0; tokens < 2 && sc.Scan(); {
		if strings.Contains(sc.Text(), `"content":"tok`) {
			tokens++
		}
	}
	cancel()
	resp.Body.Close()
	s := endedSpans(t, rec, 1)[0]
	if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "client disconnected") {
		t.Errorf("status %+v, want Error: client disconnected", s.Status())
	}
	a := attrMap(s)
	if got := a[AttrFinishReasons].AsString(); got != `["abort"]` {
		t.Errorf("finish_reasons %s, want [\"abort\"]", got)
	}
	if got := a[AttrCompletionTokens].AsInt64(); got != 2 {
		t.Errorf("completion tokens %d, want the 2 streamed", got)
	}
	var exc bool
	for _, ev := range s.Events() {
		if ev.Name == "exception" {
			for _, kv := range ev.Attributes {
				exc = exc || kv.Key == "exception.message" && kv.Value.AsString() == context.Canceled.Error()
			}
		}
	}
	if !exc {
		t.Errorf("events %+v, want an exception event with %q", s.Events(), context.Canceled)
	}
	if s.Parent().SpanID().String() != testSpanID {
		t.Errorf("parent %v", s.Parent().SpanID())
	}
}

func TestTraceFaultAndRejections(t *testing.T) {
	_, rec, post := tracedEngine(t, fastConfig())
	do := func(path, body string, hdr map[string]string) int {
		resp, err := post(context.Background(), path, body, hdr)
		if err != nil {
			return 0 // an aborted connection
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	chat := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	// No span: an unknown model (404), an invalid body (400), a route vLLM does not trace.
	if got := do("/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, nil); got != 404 {
		t.Fatalf("unknown model: %d", got)
	}
	if got := do("/v1/chat/completions", `{`, nil); got != 400 {
		t.Fatalf("bad body: %d", got)
	}
	if got := do("/v1/embeddings", `{"model":"m1","input":"hi"}`, nil); got != 200 {
		t.Fatalf("embeddings: %d", got)
	}
	// Spans with status Error: a stream cut by a fault, an injected 503, a missing terminator.
	do("/v1/chat/completions", chat, fault("close-after=1"))
	do("/v1/chat/completions", chat, fault("status=503"))
	do("/v1/chat/completions", chat, fault("truncate"))
	spans := endedSpans(t, rec, 3)
	for _, s := range spans {
		if s.Status().Code != codes.Error {
			t.Errorf("span status %+v, want Error", s.Status())
		}
		if got := attrMap(s)[AttrFinishReasons].AsString(); got != `["abort"]` {
			t.Errorf("finish_reasons %s", got)
		}
		if s.Parent().IsValid() {
			t.Errorf("parent %v without a traceparent, want none (a root span)", s.Parent())
		}
	}
}

func TestTraceTimeInQueue(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 1
	cfg.TTFT = 10 * time.Millisecond
	cfg.ITL = 5 * time.Millisecond
	e, rec, post := tracedEngine(t, cfg)
	body := `{"model":"m1","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	var wg sync.WaitGroup
	first := make(chan struct{})
	for i := range 2 {
		wg.Go(func() {
			if i == 1 {
				<-first
			}
			resp, err := post(context.Background(), "/v1/chat/completions", body, nil)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
		if i == 0 {
			testutil.Eventually(t, time.Second, func() bool { return e.Stats().Running == 1 }, "first sequence running")
			close(first)
		}
	}
	wg.Wait()
	var queued []float64
	for _, s := range endedSpans(t, rec, 2) {
		queued = append(queued, attrMap(s)[AttrTimeInQueue].AsFloat64())
	}
	// The second waited for the first's whole generation (10 ms + 9 x 5 ms).
	if min(queued[0], queued[1]) != 0 || max(queued[0], queued[1]) < 0.04 {
		t.Errorf("time_in_queue %v, want 0 and at least 40ms", queued)
	}
}

func TestTraceNilProviderNoWrap(t *testing.T) {
	e, err := New(fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	inner := e.routes()
	if h := e.traced(nil, inner); h != http.Handler(inner) {
		t.Error("a nil TracerProvider wraps the handler")
	}
}
