//go:build integration

package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an OTLP/HTTP receiver that keeps what it is sent.
type collector struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	metrics []*metricspb.Metric
	srv     *httptest.Server
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", otlpHandler(&colltrace.ExportTraceServiceResponse{}, func(req *colltrace.ExportTraceServiceRequest) {
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
	}, &c.mu))
	mux.HandleFunc("POST /v1/metrics", otlpHandler(&collmetrics.ExportMetricsServiceResponse{}, func(req *collmetrics.ExportMetricsServiceRequest) {
		for _, rm := range req.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				c.metrics = append(c.metrics, sm.Metrics...)
			}
		}
	}, &c.mu))
	c.srv = httptest.NewServer(mux)
	t.Cleanup(c.srv.Close)
	return c
}

// otlpHandler serves one OTLP/HTTP protobuf export endpoint: it decodes the
// request into a new Req, hands it to keep under mu, and answers resp.
func otlpHandler[Req any, PReq interface {
	*Req
	proto.Message
}](resp proto.Message, keep func(PReq), mu *sync.Mutex) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		req := PReq(new(Req))
		if err := proto.Unmarshal(b, req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		keep(req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(resp)
		_, _ = w.Write(out)
	}
}

// lastGauge returns the latest exported value of active_requests for
// engine/phase, and whether one was seen.
func (c *collector) lastGauge(engine, phase string) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var v int64
	found := false
	for _, m := range c.metrics {
		if m.Name != "switchboard.engine.active_requests" {
			continue
		}
		for _, dp := range m.GetSum().GetDataPoints() {
			if attr(dp.Attributes, "engine") == engine && attr(dp.Attributes, "phase") == phase {
				v, found = dp.GetAsInt(), true
			}
		}
	}
	return v, found
}

func (c *collector) histCount(name string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n uint64
	for _, m := range c.metrics {
		if m.Name != name {
			continue
		}
		var latest uint64
		for _, dp := range m.GetHistogram().GetDataPoints() {
			latest += dp.Count
		}
		n = latest // cumulative: the last export holds the total
	}
	return n
}

func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// build returns a binary of pkg (./cmd/gateway or ./cmd/enginesim): the one
// integration/run.sh built (IT_GATEWAY_BIN, IT_ENGINESIM_BIN), else a fresh
// go build into dir.
func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	if bin := os.Getenv(map[string]string{"./cmd/gateway": "IT_GATEWAY_BIN", "./cmd/enginesim": "IT_ENGINESIM_BIN"}[pkg]); bin != "" {
		return bin
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// proc is a started binary whose output is kept for failure messages.
type proc struct {
	cmd *exec.Cmd
	out *bytes.Buffer
	mu  *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func start(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), out: &bytes.Buffer{}, mu: &sync.Mutex{}}
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout = lockedWriter{p.mu, p.out}
	p.cmd.Stderr = lockedWriter{p.mu, p.out}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.output())
		}
	})
	return p
}

// cleanEnv is the test's environment without OTEL_* and SWITCHBOARD_*
// variables: a child process sees only the ones a test sets.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "SWITCHBOARD_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func waitHTTP(t *testing.T, url string, want int) {
	t.Helper()
	if !testutil.Poll(20*time.Second, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == want
	}) {
		t.Fatalf("%s did not answer %d in time", url, want)
	}
}

// TestGatewayBinaryExportsOTLP runs the gateway binary in front of two
// engine simulator processes and checks, from the outside: streaming and
// non-streaming requests, an engine fault, a client that goes away; the
// engine span under the server span in one trace, exported over OTLP; the
// in-flight gauges back at 0 both over OTLP and on /metrics; and a graceful
// SIGTERM that lets a running stream finish.
func TestGatewayBinaryExportsOTLP(t *testing.T) {
	dir := t.TempDir()
	gwBin := build(t, dir, "./cmd/gateway")
	simBin := build(t, dir, "./cmd/enginesim")
	col := newCollector(t)

	var engines []string
	for i := range 2 {
		addr := freePort(t)
		start(t, nil, simBin, "--listen", addr, "--name", fmt.Sprintf("sim%d", i), "--model", "it-model", "--ttft", "20ms", "--itl", "10ms")
		waitHTTP(t, "http://"+addr+"/health", 200)
		engines = append(engines, fmt.Sprintf("  - name: sim%d\n    url: http://%s\n", i, addr))
	}
	public, admin := freePort(t), freePort(t)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	cfg := "server:\n  listen: \"" + public + "\"\n  shutdown_timeout: 10s\nadmin:\n  listen: \"" + admin + "\"\nrouting:\n  policy: least-loaded\nengines:\n" + strings.Join(engines, "")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.srv.URL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_METRIC_EXPORT_INTERVAL=300",
		"OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_SERVICE_NAME=switchboard-it",
	}
	if extra := os.Getenv("IT_GATEWAY_ENV"); extra != "" {
		env = append(env, strings.Split(extra, ",")...)
	}
	gw := start(t, env, gwBin, "--config", cfgPath)
	waitHTTP(t, "http://"+public+"/ready", 200)

	post := func(ctx context.Context, body string, hdr ...string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+public+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		return http.DefaultClient.Do(req)
	}
	const streamBody = `{"model":"it-model","stream":true,"max_tokens":5,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	for range 3 {
		resp, err := post(context.Background(), streamBody)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Count(string(b), `"content":"tok`) != 5 {
			t.Fatalf("stream: %d %q", resp.StatusCode, b)
		}
	}
	resp, err := post(context.Background(), `{"model":"it-model","messages":[{"role":"user","content":"hi"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"finish_reason":"stop"`)) {
		t.Fatalf("non-stream: %d %s", resp.StatusCode, b)
	}
	resp, err = post(context.Background(), streamBody, "X-Enginesim-Fault", "close-after=2")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte(`data: {"error":`)) || bytes.Contains(b, []byte("[DONE]")) {
		t.Fatalf("mid-stream failure: %q", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	if resp, err := post(ctx, streamBody, "X-Enginesim-Fault", "stall-before-headers"); err == nil {
		resp.Body.Close()
	}
	cancel()

	// Over OTLP: the engine span is a CLIENT child of the SERVER span.
	deadline := time.Now().Add(10 * time.Second)
	var server, client *tracepb.Span
	testutil.Poll(time.Until(deadline), func() bool {
		col.mu.Lock()
		for _, s := range col.spans {
			if s.Kind == tracepb.Span_SPAN_KIND_SERVER && s.Name == "POST /v1/chat/completions" {
				server = s
			}
		}
		for _, s := range col.spans {
			if server != nil && s.Kind == tracepb.Span_SPAN_KIND_CLIENT && bytes.Equal(s.ParentSpanId, server.SpanId) {
				client = s
			}
		}
		col.mu.Unlock()
		return server != nil && client != nil
	})
	if server == nil || client == nil {
		t.Fatalf("no server span with an engine child span exported (server %v, client %v)", server != nil, client != nil)
	}
	if client.Name != "chat it-model" || !bytes.Equal(client.TraceId, server.TraceId) {
		t.Errorf("engine span %q, trace %x vs %x", client.Name, client.TraceId, server.TraceId)
	}

	// Over OTLP and on /metrics: every gauge back at 0, TTFT recorded.
	testutil.Poll(time.Until(deadline), func() bool {
		for _, e := range []string{"sim0", "sim1"} {
			for _, p := range []string{"prefill", "decode"} {
				if v, seen := col.lastGauge(e, p); !seen || v != 0 {
					return false
				}
			}
		}
		return col.histCount("switchboard.engine.time_to_first_token") >= 5
	})
	for _, e := range []string{"sim0", "sim1"} {
		for _, p := range []string{"prefill", "decode"} {
			if v, seen := col.lastGauge(e, p); !seen || v != 0 {
				t.Errorf("OTLP gauge %s/%s = %d (seen %v), want 0", e, p, v, seen)
			}
		}
	}
	// The non-streaming request is read as a stream (it may be continued:
	// migration.non_streaming), so it has a first token too.
	if n := col.histCount("switchboard.engine.time_to_first_token"); n != 5 {
		t.Errorf("OTLP TTFT samples %d, want 5 (three clean streams, the non-streaming answer read as a stream, and one cut after two tokens)", n)
	}
	active := testutil.Samples(testutil.Scrape(t, http.DefaultClient, "http://"+admin+"/metrics"), "switchboard_engine_active_requests", "engine", "phase")
	gauges := len(active)
	for series, v := range active {
		if v != 0 {
			t.Errorf("/metrics: switchboard_engine_active_requests %s = %v", series, v)
		}
	}
	if gauges != 4 {
		t.Errorf("/metrics has %d active_requests series, want 4", gauges)
	}

	// SIGTERM during a stream: the stream finishes, the process exits 0.
	long := `{"model":"it-model","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hi"}]}`
	resp, err = post(context.Background(), long)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Count(string(b), `"content":"tok`) != 40 {
		t.Errorf("stream during shutdown: err %v, %d tokens, tail %q", err, strings.Count(string(b), `"content":"tok`), string(b[max(0, len(b)-80):]))
	}
	done := make(chan error, 1)
	go func() { done <- gw.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("gateway exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Error("gateway did not exit after SIGTERM")
	}
}
