//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The ports otel-collector.yaml (as shipped) and jaeger.yaml listen on.
var fixedPorts = []string{"4317", "4318", "8888", "8889", "14317", "16685", "16686"}

// TestCollectorToJaeger runs the shipped otel-collector.yaml in a real
// OpenTelemetry Collector, with a real Jaeger behind it, and the gateway
// exporting to the collector over OTLP/HTTP. Traces are read back from
// Jaeger's query API and metrics from the collector's Prometheus exporter.
// integration/run.sh builds both tools and sets the variables.
func TestCollectorToJaeger(t *testing.T) {
	otelcol, jaeger := os.Getenv("IT_OTELCOL_BIN"), os.Getenv("IT_JAEGER_BIN")
	if otelcol == "" || jaeger == "" {
		t.Skip("IT_OTELCOL_BIN and IT_JAEGER_BIN are not set: run integration/run.sh, which builds the collector and Jaeger")
	}
	var busy []string
	for _, p := range fixedPorts {
		ln, err := net.Listen("tcp", "127.0.0.1:"+p)
		if err != nil {
			busy = append(busy, p)
			continue
		}
		ln.Close()
	}
	if len(busy) > 0 {
		t.Fatalf("ports %v are in use; the collector and Jaeger need them", busy)
	}

	start(t, nil, jaeger, "--config", "jaeger.yaml")
	waitHTTP(t, "http://127.0.0.1:16686/api/services", 200)
	col := start(t, []string{"JAEGER_OTLP_ENDPOINT=127.0.0.1:14317"}, otelcol, "--config", filepath.Join("..", "otel-collector.yaml"))
	waitHTTP(t, "http://127.0.0.1:8889/metrics", 200)
	waitTCP(t, "127.0.0.1:4318")

	dir := t.TempDir()
	gwBin := build(t, dir, "./cmd/gateway")
	public := freePort(t)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	cfg := "server:\n  listen: \"" + public + "\"\nadmin:\n  listen: \"\"\nsimulate:\n  engines: 2\n  models: [it-model]\n  ttft: 10ms\n  itl: 5ms\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	service := fmt.Sprintf("switchboard-it-%d", os.Getpid())
	start(t, []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318",
		"OTEL_SERVICE_NAME=" + service,
		"OTEL_METRIC_EXPORT_INTERVAL=500",
		"OTEL_BSP_SCHEDULE_DELAY=200",
	}, gwBin, "--config", cfgPath)
	waitHTTP(t, "http://"+public+"/ready", 200)

	const streams = 3
	for i := range streams {
		req, _ := http.NewRequest(http.MethodPost, "http://"+public+"/v1/chat/completions",
			strings.NewReader(`{"model":"it-model","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("X-Request-Id", fmt.Sprintf("it-req-%d", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("stream %d: %q", i, b)
		}
	}

	// Jaeger: each request is one trace, the engine span CHILD_OF the
	// server span, carrying the request id and GenAI attributes.
	type span struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	}
	type trace struct {
		Spans []span `json:"spans"`
	}
	var traces []trace
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://127.0.0.1:16686/api/traces?limit=50&service=" + service)
		if err == nil {
			var body struct {
				Data []trace `json:"data"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			traces = traces[:0]
			for _, tr := range body.Data { // skip the /ready probes' traces
				for _, sp := range tr.Spans {
					if sp.OperationName == "POST /v1/chat/completions" {
						traces = append(traces, tr)
						break
					}
				}
			}
			if len(traces) >= streams {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(traces) != streams {
		t.Fatalf("Jaeger has %d traces for %s, want %d\ncollector log:\n%s", len(traces), service, streams, col.output())
	}
	ids := map[string]bool{}
	for _, tr := range traces {
		var server, client *span
		for i := range tr.Spans {
			switch tr.Spans[i].OperationName {
			case "POST /v1/chat/completions":
				server = &tr.Spans[i]
			case "chat it-model":
				client = &tr.Spans[i]
			}
		}
		if server == nil || client == nil {
			t.Fatalf("trace spans %+v: want the server span and the engine span", tr.Spans)
		}
		if len(client.References) != 1 || client.References[0].RefType != "CHILD_OF" || client.References[0].SpanID != server.SpanID {
			t.Errorf("engine span references %+v, want CHILD_OF %s", client.References, server.SpanID)
		}
		tags := map[string]string{}
		for _, kv := range client.Tags {
			tags[kv.Key] = fmt.Sprint(kv.Value)
		}
		if tags["gen_ai.operation.name"] != "chat" || tags["gen_ai.request.model"] != "it-model" || tags["switchboard.released_phase"] != "decode" {
			t.Errorf("engine span tags %v", tags)
		}
		ids[tags["switchboard.request_id"]] = true
	}
	for i := range streams {
		if !ids[fmt.Sprintf("it-req-%d", i)] {
			t.Errorf("no engine span with switchboard.request_id=it-req-%d (got %v)", i, ids)
		}
	}

	// The collector's Prometheus exporter: gauges at 0, one TTFT sample per
	// stream, for this gateway's service.name.
	var active, ttft map[string]float64
	for time.Now().Before(deadline) {
		active, ttft = scrape(t, "http://127.0.0.1:8889/metrics", service)
		var n float64
		for _, v := range ttft {
			n += v
		}
		if len(active) == 4 && n == streams {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(active) != 4 {
		t.Errorf("collector exports %d active_requests series for %s, want 4: %v", len(active), service, active)
	}
	for k, v := range active {
		if v != 0 {
			t.Errorf("collector: active_requests %s = %v, want 0", k, v)
		}
	}
	var n float64
	for _, v := range ttft {
		n += v
	}
	if n != streams {
		t.Errorf("collector: TTFT sample count %v, want %d (%v)", n, streams, ttft)
	}
}

// scrape returns the active_requests values by engine/phase and the TTFT
// histogram counts by engine, for one service.name.
func scrape(t *testing.T, url, service string) (active, ttft map[string]float64) {
	t.Helper()
	active, ttft = map[string]float64{}, map[string]float64{}
	resp, err := http.Get(url)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("collector /metrics: %v", err)
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["service_name"] != service {
				continue
			}
			switch name {
			case "switchboard_engine_active_requests":
				active[labels["engine"]+"/"+labels["phase"]] = m.GetGauge().GetValue()
			case "switchboard_engine_time_to_first_token_seconds":
				ttft[labels["engine"]] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return active, ttft
}

func waitTCP(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not accept connections in time", addr)
}
