package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

func TestGRPCTarget(t *testing.T) {
	tests := []struct {
		in, host string
		secure   bool
		wantErr  bool
	}{
		{in: "127.0.0.1:4317", host: "127.0.0.1:4317"},
		{in: "http://collector:4317", host: "collector:4317"},
		{in: "grpc://jaeger:4317", host: "jaeger:4317"},
		{in: "https://otel.example:443", host: "otel.example:443", secure: true},
		{in: "ftp://x:1", wantErr: true},
		{in: "http://", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tc := range tests {
		host, secure, err := grpcTarget(tc.in)
		if tc.wantErr != (err != nil) || host != tc.host || secure != tc.secure {
			t.Errorf("grpcTarget(%q) = %q, %v, %v; want %q, %v, error %v", tc.in, host, secure, err, tc.host, tc.secure, tc.wantErr)
		}
	}
}

func TestTracerProviderErrors(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
	if _, err := newTracerProvider(context.Background(), "http://127.0.0.1:4318"); err == nil || !strings.Contains(err.Error(), "unsupported OTLP protocol") {
		t.Errorf("http/json: %v", err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
	if _, err := newTracerProvider(context.Background(), "127.0.0.1:4318"); err == nil {
		t.Error("http/protobuf with host:port: no error")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "")
	tp, err := newTracerProvider(context.Background(), "grpc://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = tp.Shutdown(ctx) // nothing buffered: no connection needed
}

// TestServeExportsSpans runs the command with --otlp-traces-endpoint over OTLP/HTTP and
// checks that the llm_request span of a request is exported, with OTEL_SERVICE_NAME, by the
// time serve returns (the provider is flushed on exit).
func TestServeExportsSpans(t *testing.T) {
	var (
		mu    sync.Mutex
		spans []*tracepb.Span
		svc   []string
		path  string
	)
	col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req colltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		path = r.URL.Path
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					svc = append(svc, kv.Value.GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
		mu.Unlock()
		out, _ := proto.Marshal(&colltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	defer col.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "sim-under-test")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, []string{"--listen", "127.0.0.1:0", "--model", "m", "--ttft", "1ms", "--itl", "1ms", "--otlp-traces-endpoint", col.URL},
			io.Discard, slog.New(slog.DiscardHandler), func(a net.Addr) { addrc <- a })
	}()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("serve returned early: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr.String()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return after cancellation")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(spans) != 1 || spans[0].Name != "llm_request" || spans[0].Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Fatalf("exported spans %v, want one llm_request SERVER span", spans)
	}
	if got := spans[0].ParentSpanId; len(got) != 8 || got[0] != 0x00 || got[1] != 0xf0 {
		t.Errorf("parent span id %x, want 00f067aa0ba902b7", got)
	}
	if len(svc) != 1 || svc[0] != "sim-under-test" || path != "/v1/traces" {
		t.Errorf("service.name %v at %s, want sim-under-test at /v1/traces", svc, path)
	}
}
