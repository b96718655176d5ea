//go:build integration

package integration

// Tests on the shared stack integration/run.sh starts: two simulated engines
// (vLLM's llm_request spans over OTLP), a gateway, the OpenTelemetry
// Collector running the shipped otel-collector.yaml, Jaeger behind it for
// traces and Prometheus 3 for metrics (its OTLP receiver, fed by the
// collector, and a scrape of the gateway's admin /metrics). The tests read
// everything back from Jaeger's and Prometheus' HTTP APIs.
//
// The tests share the gateway, so metric checks compare before and after
// values of this test's own traffic, once the gateway is idle. They run
// before the other files' tests (Go runs files in name order), so no other
// test's traffic is in flight.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// stack is the shared stack, from run.sh's IT_* variables.
type stack struct {
	jaeger, prom, gateway, admin, otlpHTTP string
	service, engineService, model          string
	engines                                []string
	gatewayBin                             string
}

// needStack returns the shared stack, or skips the test when run.sh did not
// start one.
func needStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{
		jaeger: os.Getenv("IT_JAEGER_URL"), prom: os.Getenv("IT_PROM_URL"),
		gateway: os.Getenv("IT_GATEWAY_URL"), admin: os.Getenv("IT_GATEWAY_ADMIN_URL"),
		otlpHTTP: os.Getenv("IT_OTLP_HTTP_URL"), service: os.Getenv("IT_SERVICE"),
		engineService: os.Getenv("IT_ENGINE_SERVICE"), model: os.Getenv("IT_MODEL"),
		gatewayBin: os.Getenv("IT_GATEWAY_BIN"),
	}
	if e := os.Getenv("IT_ENGINE_URLS"); e != "" {
		s.engines = strings.Split(e, ",")
	}
	if s.jaeger == "" || s.prom == "" || s.gateway == "" || s.admin == "" || s.otlpHTTP == "" || s.service == "" ||
		s.engineService == "" || s.model == "" || s.gatewayBin == "" || len(s.engines) == 0 {
		t.Skip("the IT_* stack variables are not set: run integration/run.sh, which starts the collector, Jaeger, Prometheus, two engine simulators and a gateway")
	}
	return s
}

// stackHTTP is the tests' client: a short timeout on every call, so a hung
// backend fails the test instead of the run.
var stackHTTP = &http.Client{Timeout: 30 * time.Second}

// clientTracer is the test's own tracer, exporting to the shared collector:
// the test's span is the client span the gateway's server span is parented
// on, the top of a four-level trace (client, gateway server, engine attempt,
// engine).
func clientTracer(t *testing.T, s *stack) trace.Tracer {
	t.Helper()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(s.otlpHTTP+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	res := resource.NewSchemaless(semconv.ServiceName("it-client"))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(res))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("github.com/switchboard-gw/switchboard/integration")
}

// chat posts a chat completion to base, with the trace context of ctx in
// traceparent, X-Request-Id reqID (unless empty) and the engine fault spec
// fault (unless empty).
func chat(ctx context.Context, base, body, reqID, fault string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if reqID != "" {
		req.Header.Set("X-Request-Id", reqID)
	}
	if fault != "" {
		req.Header.Set("X-Enginesim-Fault", fault)
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	return stackHTTP.Do(req)
}

// tracedStream sends one streamed chat completion under a new client span
// and returns the trace id; the stream must end with [DONE].
func tracedStream(t *testing.T, tr trace.Tracer, base, model, reqID string, maxTokens int) string {
	t.Helper()
	ctx, span := tr.Start(context.Background(), "it client chat", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, model, maxTokens)
	resp, err := chat(ctx, base, body, reqID, "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream %s: %d %q", reqID, resp.StatusCode, b)
	}
	return span.SpanContext().TraceID().String()
}

// Jaeger's query API (/api/traces/{id}) answer, the parts the tests read.
type jgTrace struct {
	TraceID   string               `json:"traceID"`
	Spans     []jgSpan             `json:"spans"`
	Processes map[string]jgProcess `json:"processes"`
}

type jgSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64   `json:"startTime"` // µs
	Duration  int64   `json:"duration"`  // µs
	Tags      []jgTag `json:"tags"`
	Logs      []struct {
		Fields []jgTag `json:"fields"`
	} `json:"logs"`
	ProcessID string `json:"processID"`
}

type jgTag struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
}

type jgProcess struct {
	ServiceName string `json:"serviceName"`
}

// tag returns the span's tag key as text ("" when absent).
func (s *jgSpan) tag(key string) string {
	for _, kv := range s.Tags {
		if kv.Key == key {
			return fmt.Sprint(kv.Value)
		}
	}
	return ""
}

// parent returns the span id of the span's CHILD_OF reference ("" for a root).
func (s *jgSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// event reports whether the span has a log (span event) named name.
func (s *jgSpan) event(name string) bool {
	for _, l := range s.Logs {
		for _, f := range l.Fields {
			if f.Key == "event" && fmt.Sprint(f.Value) == name {
				return true
			}
		}
	}
	return false
}

// service returns the service that emitted sp.
func (tr *jgTrace) service(sp *jgSpan) string { return tr.Processes[sp.ProcessID].ServiceName }

// spans returns the trace's spans named op.
func (tr *jgTrace) spans(op string) []*jgSpan {
	var out []*jgSpan
	for i := range tr.Spans {
		if tr.Spans[i].OperationName == op {
			out = append(out, &tr.Spans[i])
		}
	}
	return out
}

// children returns the spans whose parent is sp.
func (tr *jgTrace) children(sp *jgSpan) []*jgSpan {
	var out []*jgSpan
	for i := range tr.Spans {
		if tr.Spans[i].parent() == sp.SpanID {
			out = append(out, &tr.Spans[i])
		}
	}
	return out
}

// jaegerTrace polls Jaeger for trace id until complete(trace) holds (20 s at
// most) and returns it; it fails the test with what it has otherwise.
func jaegerTrace(t *testing.T, s *stack, id string, complete func(*jgTrace) bool) *jgTrace {
	t.Helper()
	var last *jgTrace
	var lastErr error
	var done *jgTrace
	if testutil.Poll(20*time.Second, func() bool {
		tr, err := fetchTrace(s, id)
		if err == nil && complete(tr) {
			done = tr
			return true
		}
		if tr != nil {
			last = tr
		}
		lastErr = err
		return false
	}) {
		return done
	}
	var ops []string
	if last != nil {
		for _, sp := range last.Spans {
			ops = append(ops, fmt.Sprintf("%s(%s, parent %s)", sp.OperationName, last.service(&sp), sp.parent()))
		}
	}
	t.Fatalf("trace %s incomplete in Jaeger after 20 s: spans %v (last error %v)", id, ops, lastErr)
	return nil
}

// fetchTrace reads one trace from Jaeger's query API.
func fetchTrace(s *stack, id string) (*jgTrace, error) {
	resp, err := stackHTTP.Get(s.jaeger + "/api/traces/" + id)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /api/traces/%s: %s", id, resp.Status)
	}
	var body struct {
		Data []jgTrace `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if len(body.Data) != 1 {
		return nil, fmt.Errorf("GET /api/traces/%s: %d traces", id, len(body.Data))
	}
	return &body.Data[0], nil
}

// TestTraceStreamsFourLevels sends streamed chats with distinct request ids
// through the shared gateway, each under the test's own client span, and
// reads each trace back from Jaeger: the client span; the gateway's SERVER
// span "POST /v1/chat/completions" as its child; the engine attempt CLIENT
// span "chat it-model" under it, with gen_ai.operation.name,
// gen_ai.request.model, switchboard.request_id and a first_token event; and
// the simulator's own llm_request SERVER span (service IT_ENGINE_SERVICE,
// vLLM's attributes) as the attempt span's child. Both simulators answer
// (round-robin), so both of their exporters are covered (OTLP/gRPC and
// OTLP/HTTP).
func TestTraceStreamsFourLevels(t *testing.T) {
	s := needStack(t)
	tr := clientTracer(t, s)
	const streams, maxTokens = 4, 4
	ids := make([]string, streams)
	reqIDs := make([]string, streams)
	for i := range streams {
		reqIDs[i] = fmt.Sprintf("it-trace-%d-%d", os.Getpid(), i)
		ids[i] = tracedStream(t, tr, s.gateway, s.model, reqIDs[i], maxTokens)
	}
	engines := map[string]bool{}
	for i, id := range ids {
		trc := jaegerTrace(t, s, id, func(tr *jgTrace) bool {
			return len(tr.spans("it client chat")) == 1 && len(tr.spans("POST /v1/chat/completions")) == 1 &&
				len(tr.spans("chat "+s.model)) == 1 && len(tr.spans("llm_request")) == 1
		})
		client := trc.spans("it client chat")[0]
		server := trc.spans("POST /v1/chat/completions")[0]
		attempt := trc.spans("chat " + s.model)[0]
		engine := trc.spans("llm_request")[0]
		if client.parent() != "" {
			t.Errorf("%s: the client span has parent %s, want a root", reqIDs[i], client.parent())
		}
		if server.parent() != client.SpanID || trc.service(server) != s.service || server.tag("span.kind") != "server" {
			t.Errorf("%s: server span: parent %s (client %s), service %q, kind %q; want the client's child, %q, server",
				reqIDs[i], server.parent(), client.SpanID, trc.service(server), server.tag("span.kind"), s.service)
		}
		if attempt.parent() != server.SpanID || attempt.tag("span.kind") != "client" {
			t.Errorf("%s: attempt span: parent %s (server %s), kind %q; want the server span's CLIENT child",
				reqIDs[i], attempt.parent(), server.SpanID, attempt.tag("span.kind"))
		}
		for k, want := range map[string]string{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": s.model, "switchboard.request_id": reqIDs[i],
		} {
			if got := attempt.tag(k); got != want {
				t.Errorf("%s: attempt span %s = %q, want %q", reqIDs[i], k, got, want)
			}
		}
		if !attempt.event("first_token") {
			t.Errorf("%s: attempt span has no first_token event (logs %+v)", reqIDs[i], attempt.Logs)
		}
		engines[attempt.tag("switchboard.engine")] = true

		if engine.parent() != attempt.SpanID || trc.service(engine) != s.engineService || engine.tag("span.kind") != "server" {
			t.Errorf("%s: engine span: parent %s (attempt %s), service %q, kind %q; want the attempt span's child, %q, server",
				reqIDs[i], engine.parent(), attempt.SpanID, trc.service(engine), engine.tag("span.kind"), s.engineService)
		}
		for k, want := range map[string]string{
			"gen_ai.request.id":              "chatcmpl-" + reqIDs[i],
			"gen_ai.response.model":          s.model,
			"gen_ai.request.max_tokens":      strconv.Itoa(maxTokens),
			"gen_ai.usage.prompt_tokens":     "1",
			"gen_ai.usage.completion_tokens": strconv.Itoa(maxTokens),
			"gen_ai.response.finish_reasons": `["length"]`,
		} {
			if got := engine.tag(k); got != want {
				t.Errorf("%s: engine span %s = %q, want %q", reqIDs[i], k, got, want)
			}
		}
		ttft, err := strconv.ParseFloat(engine.tag("gen_ai.latency.time_to_first_token"), 64)
		if err != nil || ttft < 0.010 {
			t.Errorf("%s: engine span time_to_first_token %q, want at least the simulator's 10ms", reqIDs[i], engine.tag("gen_ai.latency.time_to_first_token"))
		}
		// The engine's work lies inside the attempt, but for its tail: the
		// attempt ends at [DONE], and the engine's span ends when its
		// handler returns, after it has written the response's end (the
		// gateway does not wait for it, and a busy machine can take a few
		// ms there): 20 ms of slack.
		if engine.StartTime < attempt.StartTime || engine.StartTime+engine.Duration > attempt.StartTime+attempt.Duration+20000 {
			t.Errorf("%s: engine span [%d +%d] outside the attempt [%d +%d] (µs)", reqIDs[i], engine.StartTime, engine.Duration, attempt.StartTime, attempt.Duration)
		}
	}
	if len(engines) != 2 {
		t.Errorf("attempts went to engines %v, want both simulators (round-robin)", engines)
	}
}

// TestTraceRetryAcrossEngines starts its own gateway (IT_GATEWAY_BIN, the
// shared collector) with two engines, round-robin: one that answers the
// gateway's first health probe and then goes away (its port refuses
// connections), and a live simulator. A refused connection is the one
// failure the gateway retries on another engine (gateway/proxy.go,
// result.retry: connFailed), so a request sent to the dead engine first is
// answered by the live one, and its trace has one server span with two
// attempt spans: the dead engine's (error.type connect_error, status
// error) and the live one's, which has the simulator's span as its child.
//
// The dead engine cannot be dead from the start: the gateway takes an
// engine's first failed probe as its verdict and routes nothing to it.
func TestTraceRetryAcrossEngines(t *testing.T) {
	s := needStack(t)
	var probes atomic.Int64
	dead := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			probes.Add(1)
		}
		// No keep-alive: the gateway holds no idle connection to this engine,
		// so its next request dials and is refused (a POST on a reused
		// connection the engine closed is an engine_disconnect, not retried).
		w.Header().Set("Connection", "close")
		w.WriteHeader(200)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = dead.Serve(ln) }()
	defer dead.Close()

	dir := t.TempDir()
	public, admin := freePort(t), freePort(t)
	cfg := fmt.Sprintf(`server:
  listen: %q
  max_attempts: 2
  health:
    interval: 10m
admin:
  listen: %q
routing:
  policy: round-robin
engines:
  - name: gone
    url: http://%s
    models: [%s]
  - name: live
    url: %s
    models: [%s]
`, public, admin, ln.Addr(), s.model, s.engines[0], s.model)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	service := fmt.Sprintf("switchboard-it-retry-%d", os.Getpid())
	start(t, []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + s.otlpHTTP, "OTEL_SERVICE_NAME=" + service,
		"OTEL_BSP_SCHEDULE_DELAY=200", "OTEL_METRICS_EXPORTER=none",
		"SWITCHBOARD_SERVER__ENGINE_STATS__ENABLED=false",
	}, s.gatewayBin, "--config", cfgPath)
	waitHTTP(t, "http://"+public+"/ready", 200)
	testutil.Poll(10*time.Second, func() bool { return probes.Load() != 0 })
	if probes.Load() == 0 {
		t.Fatal("the gateway never probed the engine that goes away")
	}
	dead.Close() // the port now refuses connections; the gateway still thinks it healthy

	tr := clientTracer(t, s)
	retried := 0
	for i := range 2 { // round-robin: one of two requests goes to the dead engine first
		reqID := fmt.Sprintf("it-retry-%d-%d", os.Getpid(), i)
		id := tracedStream(t, tr, "http://"+public, s.model, reqID, 3)
		trc := jaegerTrace(t, s, id, func(tr *jgTrace) bool {
			return len(tr.spans("POST /v1/chat/completions")) == 1 && len(tr.spans("llm_request")) == 1
		})
		server := trc.spans("POST /v1/chat/completions")[0]
		attempts := trc.spans("chat " + s.model)
		if len(attempts) == 1 {
			continue
		}
		retried++
		if len(attempts) != 2 {
			t.Fatalf("%s: %d attempt spans, want 1 or 2", reqID, len(attempts))
		}
		byEngine := map[string]*jgSpan{}
		for _, a := range attempts {
			byEngine[a.tag("switchboard.engine")] = a
			if a.parent() != server.SpanID {
				t.Errorf("%s: attempt on %s has parent %s, want the server span %s", reqID, a.tag("switchboard.engine"), a.parent(), server.SpanID)
			}
		}
		gone, live := byEngine["gone"], byEngine["live"]
		if gone == nil || live == nil {
			t.Fatalf("%s: attempts on %v, want gone and live", reqID, byEngine)
		}
		if gone.tag("error.type") != "connect_error" || gone.tag("otel.status_code") != "ERROR" {
			t.Errorf("%s: the dead engine's attempt: error.type %q, status %q; want connect_error, ERROR", reqID, gone.tag("error.type"), gone.tag("otel.status_code"))
		}
		if live.tag("error.type") != "" || !live.event("first_token") || gone.StartTime > live.StartTime {
			t.Errorf("%s: the live attempt: error.type %q, first_token %v, starts before the dead one %v", reqID, live.tag("error.type"), live.event("first_token"), gone.StartTime > live.StartTime)
		}
		if eng := trc.spans("llm_request")[0]; eng.parent() != live.SpanID {
			t.Errorf("%s: the engine span's parent is %s, want the live attempt %s", reqID, eng.parent(), live.SpanID)
		}
	}
	if retried == 0 {
		t.Error("no request was retried: neither went to the dead engine first")
	}
}

// TestTraceClientCancel cancels a stream the simulator stalls after two
// tokens (X-Enginesim-Fault: stall-after=2) and finds the cancellation in
// Jaeger on both sides: the gateway's attempt span has error.type
// client_cancelled and status ERROR, its server span error.type
// client_cancelled (or status code 499), and the simulator's llm_request span status
// ERROR, finish_reasons ["abort"] and an exception event (context canceled).
func TestTraceClientCancel(t *testing.T) {
	s := needStack(t)
	tr := clientTracer(t, s)
	ctx, span := tr.Start(context.Background(), "it client chat", trace.WithSpanKind(trace.SpanKindClient))
	ctx, cancel := context.WithCancel(ctx)
	reqID := fmt.Sprintf("it-cancel-%d", os.Getpid())
	resp, err := chat(ctx, s.gateway, `{"model":"`+s.model+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`, reqID, "stall-after=2")
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
	span.End()
	id := span.SpanContext().TraceID().String()
	trc := jaegerTrace(t, s, id, func(tr *jgTrace) bool {
		return len(tr.spans("POST /v1/chat/completions")) == 1 && len(tr.spans("chat "+s.model)) == 1 && len(tr.spans("llm_request")) == 1
	})
	server, attempt, engine := trc.spans("POST /v1/chat/completions")[0], trc.spans("chat " + s.model)[0], trc.spans("llm_request")[0]
	if got := attempt.tag("error.type"); got != "client_cancelled" || attempt.tag("otel.status_code") != "ERROR" {
		t.Errorf("attempt span: error.type %q, status %q; want client_cancelled, ERROR", got, attempt.tag("otel.status_code"))
	}
	// The stream's 200 headers were sent before the client left, so the
	// server span can only say it with error.type (or a 499, had nothing
	// been sent yet).
	if server.tag("error.type") != "client_cancelled" && server.tag("http.response.status_code") != "499" {
		t.Errorf("server span: error.type %q, http.response.status_code %q; want the cancellation recorded (error.type client_cancelled, or 499)",
			server.tag("error.type"), server.tag("http.response.status_code"))
	}
	if engine.parent() != attempt.SpanID || engine.tag("otel.status_code") != "ERROR" ||
		engine.tag("gen_ai.response.finish_reasons") != `["abort"]` || !engine.event("exception") {
		t.Errorf("engine span: parent %s (attempt %s), status %q, finish_reasons %q, exception event %v; want the attempt's child, ERROR, [\"abort\"], true",
			engine.parent(), attempt.SpanID, engine.tag("otel.status_code"), engine.tag("gen_ai.response.finish_reasons"), engine.event("exception"))
	}
}

// --- Prometheus ------------------------------------------------------------

// promSample is one series of an instant query's result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (p promSample) float() float64 {
	f, _ := strconv.ParseFloat(fmt.Sprint(p.Value[1]), 64)
	return f
}

// instant runs a PromQL instant query.
func instant(t *testing.T, s *stack, q string) []promSample {
	t.Helper()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []promSample `json:"result"`
		} `json:"data"`
	}
	promGet(t, s, "/api/v1/query?"+url.Values{"query": {q}}.Encode(), &out)
	if out.Status != "success" {
		t.Fatalf("query %s: %s %s", q, out.Status, out.Error)
	}
	return out.Data.Result
}

func promGet(t *testing.T, s *stack, path string, into any) {
	t.Helper()
	resp, err := stackHTTP.Get(s.prom + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("GET %s: %s: %v", path, resp.Status, err)
	}
}

// scalar runs q, which must return at most one series, and returns its
// value (0 when empty).
func scalar(t *testing.T, s *stack, q string) float64 {
	t.Helper()
	r := instant(t, s, q)
	if len(r) > 1 {
		t.Fatalf("query %s: %d series, want at most 1", q, len(r))
	}
	if len(r) == 0 {
		return 0
	}
	return r[0].float()
}

// settled returns q's value once it has not changed for 3 s (several OTLP
// exports: 500 ms export interval, the collector's 1 s batch), or fails
// after 30 s.
func settled(t *testing.T, s *stack, q string) float64 {
	t.Helper()
	v, since := scalar(t, s, q), time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for time.Since(since) < 3*time.Second {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not settle in 30 s (last %v)", q, v)
		}
		time.Sleep(250 * time.Millisecond)
		if n := scalar(t, s, q); n != v {
			v, since = n, time.Now()
		}
	}
	return v
}

// sel returns the label selector of the gateway's OTLP series plus extra
// matchers.
func (s *stack) sel(extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{job=%q%s}`, s.service, extra)
}

// TestPrometheusOTLPMetrics reads the gateway's metrics back from
// Prometheus, where the collector's otlp_http/prometheus exporter pushed them
// (job = the gateway's service.name, instance = its service.instance.id):
//   - switchboard_engine_active_requests counts a held stream (decode 1) and
//     has a series for each engine and phase, all back to 0 after traffic;
//   - the TTFT histogram's count and the success series of the duration
//     histogram's count grow by exactly the number of streams the test sent;
//   - the TTFT histogram has exemplars whose trace ids and span ids are
//     traces in Jaeger;
//   - the admin scrape job (switchboard-admin) has the active_requests
//     series too: the second path works.
func TestPrometheusOTLPMetrics(t *testing.T) {
	s := needStack(t)
	active := "switchboard_engine_active_requests" + s.sel("")
	// Some traffic first, so every series exists and the gateway is idle.
	for i := range 2 {
		tracedStream(t, clientTracer(t, s), s.gateway, s.model, fmt.Sprintf("it-prom-warm-%d-%d", os.Getpid(), i), 2)
	}

	// The in-flight gauge follows a stream held open in decode.
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := chat(ctx, s.gateway, `{"model":"`+s.model+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "", "stall-after=1")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), `"content":"tok`) {
	}
	decodeQ := "sum(switchboard_engine_active_requests" + s.sel(`phase="decode"`) + ")"
	if !testutil.Poll(15*time.Second, func() bool { return scalar(t, s, decodeQ) == 1 }) {
		t.Errorf("%s = %v while a stream is held in decode, want 1", decodeQ, scalar(t, s, decodeQ))
	}
	cancel()
	resp.Body.Close()

	series := instant(t, s, active)
	got := map[string]bool{}
	for _, r := range series {
		got[r.Metric["engine"]+"/"+r.Metric["phase"]] = true
		if r.Metric["instance"] != s.service+"-0" || r.Metric["service_name"] != s.service {
			t.Errorf("active_requests series %v: want instance %s-0 (service.instance.id) and service_name %s (promoted)", r.Metric, s.service, s.service)
		}
	}
	for _, e := range []string{"sim-a", "sim-b"} {
		for _, p := range []string{"prefill", "decode"} {
			if !got[e+"/"+p] {
				t.Errorf("no %s series for engine %s phase %s (have %v)", active, e, p, got)
			}
		}
	}
	idle := func() bool {
		for _, r := range instant(t, s, active) {
			if r.float() != 0 {
				return false
			}
		}
		return true
	}
	if !testutil.Poll(15*time.Second, idle) {
		t.Fatalf("active_requests not back to 0 after the cancelled stream: %v", instant(t, s, active))
	}

	ttftQ := "sum(switchboard_engine_time_to_first_token_seconds_count" + s.sel("") + ")"
	durQ := "sum(switchboard_engine_request_duration_seconds_count" + s.sel(`error_type=""`) + ")"
	ttft0, dur0 := settled(t, s, ttftQ), settled(t, s, durQ)
	const streams = 5
	tr := clientTracer(t, s)
	var traceIDs []string
	for i := range streams {
		traceIDs = append(traceIDs, tracedStream(t, tr, s.gateway, s.model, fmt.Sprintf("it-prom-%d-%d", os.Getpid(), i), 3))
	}
	if !testutil.Poll(20*time.Second, func() bool {
		return scalar(t, s, ttftQ)-ttft0 >= streams && scalar(t, s, durQ)-dur0 >= streams
	}) {
		t.Errorf("after %d streams: TTFT count %v -> %v, success duration count %v -> %v", streams, ttft0, scalar(t, s, ttftQ), dur0, scalar(t, s, durQ))
	}
	if d := settled(t, s, ttftQ) - ttft0; d != streams {
		t.Errorf("TTFT histogram count grew by %v, want exactly %d", d, streams)
	}
	if d := settled(t, s, durQ) - dur0; d != streams {
		t.Errorf("duration histogram count (success series) grew by %v, want exactly %d", d, streams)
	}
	if !testutil.Poll(15*time.Second, idle) {
		t.Errorf("active_requests not back to 0 after traffic: %v", instant(t, s, active))
	}

	// Exemplars: the TTFT samples' trace ids, which Jaeger has.
	var ex struct {
		Status string `json:"status"`
		Data   []struct {
			SeriesLabels map[string]string `json:"seriesLabels"`
			Exemplars    []struct {
				Labels map[string]string `json:"labels"`
			} `json:"exemplars"`
		} `json:"data"`
	}
	now := time.Now()
	promGet(t, s, "/api/v1/query_exemplars?"+url.Values{
		"query": {"switchboard_engine_time_to_first_token_seconds_bucket" + s.sel("")},
		"start": {strconv.FormatInt(now.Add(-10*time.Minute).Unix(), 10)},
		"end":   {strconv.FormatInt(now.Unix(), 10)},
	}.Encode(), &ex)
	type ref struct{ trace, span string }
	var refs []ref
	for _, d := range ex.Data {
		for _, e := range d.Exemplars {
			refs = append(refs, ref{e.Labels["trace_id"], e.Labels["span_id"]})
		}
	}
	if len(refs) == 0 {
		t.Errorf("no exemplars on switchboard_engine_time_to_first_token_seconds_bucket%s (status %s): the OTLP path should carry the trace ids", s.sel(""), ex.Status)
	}
	sent := map[string]bool{}
	for _, id := range traceIDs {
		sent[id] = true
	}
	checked := 0
	for _, r := range refs {
		if checked == 3 || r.trace == "" {
			continue
		}
		checked++
		trc := jaegerTrace(t, s, r.trace, func(tr *jgTrace) bool {
			for _, sp := range tr.Spans {
				if sp.SpanID == r.span {
					return true
				}
			}
			return false
		})
		for _, sp := range trc.Spans {
			if sp.SpanID == r.span && sp.OperationName != "chat "+s.model {
				t.Errorf("exemplar span %s is %q, want the engine attempt span", r.span, sp.OperationName)
			}
		}
	}

	// The second path: Prometheus scraping the gateway's admin /metrics.
	adminQ := `switchboard_engine_active_requests{job="switchboard-admin"}`
	if !testutil.Poll(15*time.Second, func() bool { return len(instant(t, s, adminQ)) >= 4 }) {
		t.Errorf("%s: %d series, want one per engine and phase (4)", adminQ, len(instant(t, s, adminQ)))
	}
	// Its histograms carry exemplars too (the admin /metrics answers the
	// scrape in a format that has them), with trace ids this test sent.
	var adminEx []string
	if !testutil.Poll(15*time.Second, func() bool {
		ex.Data = nil
		now := time.Now()
		promGet(t, s, "/api/v1/query_exemplars?"+url.Values{
			"query": {`switchboard_engine_time_to_first_token_seconds_bucket{job="switchboard-admin"}`},
			"start": {strconv.FormatInt(now.Add(-10*time.Minute).Unix(), 10)},
			"end":   {strconv.FormatInt(now.Unix(), 10)},
		}.Encode(), &ex)
		adminEx = adminEx[:0]
		for _, d := range ex.Data {
			for _, e := range d.Exemplars {
				if sent[e.Labels["trace_id"]] {
					adminEx = append(adminEx, e.Labels["trace_id"])
				}
			}
		}
		return len(adminEx) > 0
	}) {
		t.Errorf("no exemplar on the switchboard-admin job's TTFT histogram with a trace id this test sent (%d series with exemplars)", len(ex.Data))
	}
}

// TestPrometheusJunkModelsNoNewSeries floods the gateway with requests for
// 200 random model names (404 model_not_found) and checks that the number
// of series of the gateway's job in Prometheus does not change: a client
// cannot create series. A successful stream sent after the flood, once
// counted, shows that the export covering the flood has arrived.
func TestPrometheusJunkModelsNoNewSeries(t *testing.T) {
	s := needStack(t)
	junk := func(n int) {
		var wg sync.WaitGroup
		work := make(chan int)
		for range 8 {
			wg.Go(func() {
				for range work {
					model := fmt.Sprintf("junk-%016x", rand.Uint64())
					resp, err := chat(context.Background(), s.gateway, `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`, "", "")
					if err != nil {
						t.Error(err)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusNotFound {
						t.Errorf("model %s: status %d, want 404", model, resp.StatusCode)
					}
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
	}
	// A few first, so the series the error path records once (if any) exist.
	junk(5)
	tracedStream(t, clientTracer(t, s), s.gateway, s.model, fmt.Sprintf("it-junk-warm-%d", os.Getpid()), 2)
	countQ := "count(" + s.sel(`__name__=~".+"`) + ")"
	ttftQ := "sum(switchboard_engine_time_to_first_token_seconds_count" + s.sel("") + ")"
	before, ttft0 := settled(t, s, countQ), settled(t, s, ttftQ)
	if before == 0 {
		t.Fatalf("%s = 0: no series of the gateway's job in Prometheus", countQ)
	}
	junk(200)
	tracedStream(t, clientTracer(t, s), s.gateway, s.model, fmt.Sprintf("it-junk-after-%d", os.Getpid()), 2)
	if !testutil.Poll(20*time.Second, func() bool { return scalar(t, s, ttftQ) > ttft0 }) {
		t.Fatal("the stream sent after the flood never reached Prometheus")
	}
	if after := settled(t, s, countQ); after != before {
		var names []string
		for _, r := range instant(t, s, "count by (__name__) ("+s.sel(`__name__=~".+"`)+")") {
			names = append(names, fmt.Sprintf("%s=%v", r.Metric["__name__"], r.float()))
		}
		t.Errorf("series of job %s: %v before the junk-model flood, %v after; by name now: %v", s.service, before, after, names)
	}
}

// TestPrometheusGenAIConventions reads the GenAI client instruments back
// from Prometheus (the OTLP path) with the pinned conventions' names
// (semantic-conventions v1.41.1, translated by Prometheus' OTLP receiver:
// dots to underscores, _seconds for unit s) and their required and
// conditionally required attributes as labels: gen_ai.operation.name,
// gen_ai.provider.name (the default "vllm"), gen_ai.request.model,
// server.address with server.port, gen_ai.token.type on token usage, and
// gen_ai.response.model (the simulator answers with the model asked for).
// The gen_ai.server.* family is absent.
func TestPrometheusGenAIConventions(t *testing.T) {
	s := needStack(t)
	for i := range 2 {
		tracedStream(t, clientTracer(t, s), s.gateway, s.model, fmt.Sprintf("it-genai-%d-%d", os.Getpid(), i), 3)
	}
	names := []string{
		"gen_ai_client_operation_duration_seconds_count",
		"gen_ai_client_operation_time_to_first_chunk_seconds_count",
		"gen_ai_client_operation_time_per_output_chunk_seconds_count",
		"gen_ai_client_token_usage_count",
	}
	for _, name := range names {
		q := name + s.sel("")
		var series []promSample
		if !testutil.Poll(20*time.Second, func() bool { series = instant(t, s, q); return len(series) > 0 }) {
			t.Errorf("%s: no series", q)
			continue
		}
		for _, r := range series {
			m := r.Metric
			if m["gen_ai_operation_name"] != "chat" || m["gen_ai_provider_name"] != "vllm" || m["gen_ai_request_model"] != s.model ||
				m["gen_ai_response_model"] != s.model || m["server_address"] != "127.0.0.1" || m["server_port"] == "" {
				t.Errorf("%s series %v: want gen_ai_operation_name=chat, gen_ai_provider_name=vllm, gen_ai_request_model and gen_ai_response_model=%s, server_address=127.0.0.1 and a server_port", name, m, s.model)
			}
			if _, ok := m["error_type"]; ok && name != "gen_ai_client_operation_duration_seconds_count" {
				t.Errorf("%s series %v has error_type: the conventions put it on operation.duration only", name, m)
			}
			if tt := m["gen_ai_token_type"]; strings.HasPrefix(name, "gen_ai_client_token_usage") != (tt == "input" || tt == "output") {
				t.Errorf("%s series %v: gen_ai_token_type %q", name, m, tt)
			}
		}
	}
	if r := instant(t, s, `count({__name__=~"gen_ai_server_.*",job="`+s.service+`"})`); len(r) > 0 {
		t.Errorf("gen_ai.server.* series are exported: %v", r)
	}
}
