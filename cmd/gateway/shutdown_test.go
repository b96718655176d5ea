package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// durationCount returns, from the last metrics export rc received, the
// count of switchboard.engine.request.duration points whose error.type is
// errType, and how many exports there were.
func durationCount(rc *testutil.OTLPReceiver, errType string) (uint64, int) {
	exports := rc.Metrics()
	if len(exports) == 0 {
		return 0, 0
	}
	var n uint64
	for _, rm := range exports[len(exports)-1].ResourceMetrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "switchboard.engine.request.duration" {
					continue
				}
				for _, dp := range m.GetHistogram().GetDataPoints() {
					for _, kv := range dp.Attributes {
						if kv.Key == "error.type" && kv.Value.GetStringValue() == errType {
							n += dp.Count
						}
					}
				}
			}
		}
	}
	return n, len(exports)
}

// TestRunShutdownEndsStreamsExplicitly: a stream still open at
// server.shutdown_timeout ends, promptly at the deadline, with a final SSE
// error event whose code is server_shutdown (not a silent cut); run returns
// nil; and the stream's handler has returned, with
// its slot released and its duration recorded as server_shutdown, before
// the telemetry providers flush: the last OTLP export holds that sample.
func TestRunShutdownEndsStreamsExplicitly(t *testing.T) {
	testutil.UnsetOTEL(t)
	rec := &testutil.OTLPReceiver{}
	collector := httptest.NewServer(rec)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000") // only the final export at shutdown
	const timeout = 300 * time.Millisecond
	p := startRun(t, demoArgs, []string{
		"SWITCHBOARD_SIMULATE__TTFT=1ms",
		"SWITCHBOARD_SIMULATE__ITL=50ms",
		"SWITCHBOARD_SERVER__SHUTDOWN_TIMEOUT=" + timeout.String(),
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	resp := postChat(t, client, p.public, 200) // ~10 s of tokens
	defer resp.Body.Close()
	start := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- p.stop(t, 15*time.Second) }()
	evs, err := readSSE(resp.Body, nil)
	if err != nil {
		t.Fatalf("stream read error %v: the stream was cut instead of ended", err)
	}
	if len(evs) < 2 {
		t.Fatalf("got %d events", len(evs))
	}
	last := evs[len(evs)-1].data
	var e struct {
		Error struct {
			Code, Type string
		}
	}
	if json.Unmarshal([]byte(last), &e) != nil || e.Error.Code != "server_shutdown" || e.Error.Type != "service_unavailable_error" {
		t.Errorf("last event %q, want an error event with code server_shutdown", last)
	}
	if err := <-stopped; err != nil {
		t.Errorf("run = %v, want nil", err)
	}
	if elapsed := time.Since(start); elapsed < timeout || elapsed > timeout+3*time.Second {
		t.Errorf("run returned %s after cancel, want about server.shutdown_timeout (%s)", elapsed, timeout)
	}
	if n, exports := durationCount(rec, "server_shutdown"); n != 1 {
		t.Errorf("last of %d OTLP exports has %d server_shutdown durations, want 1 (the handler must finish before the flush)", exports, n)
	}
	if !strings.Contains(p.logs.String(), "shutdown deadline passed") {
		t.Errorf("no deadline warning logged:\n%s", p.logs)
	}
}
