package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// BenchmarkGatewayOverhead measures one request end to end, directly against
// a simulated engine (the baseline) and through the gateway, in the same
// run, so the difference is what the gateway adds: body parse, routing,
// span and slot lifecycle, header handling, SSE scanning and the extra
// loopback hop. allocs/op counts the whole process (client, gateway and
// engine), so the gateway's own share is the difference between the rows.
// The sampler is off, as for most production traffic; metrics are recorded.
//
//	go test -run='^$' -bench=GatewayOverhead -benchmem -count=5 ./gateway/
func BenchmarkGatewayOverhead(b *testing.B) {
	for _, tc := range []struct {
		name, body string
	}{
		{"stream-16tok", `{"model":"m","stream":true,"max_tokens":16,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello there"}]}`},
		{"nonstream-16tok", `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`},
	} {
		_, simSrv := sim(b, enginesim.Config{Models: []string{"m"}, TTFT: time.Nanosecond, ITL: time.Nanosecond})
		cfg := testConfig(EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
		h := newHarness(b, cfg, withSampler(sdktrace.NeverSample())) // access log on (to a discarding text handler), as by default
		cfg.AccessLog = false
		quiet := newHarness(b, cfg, withSampler(sdktrace.NeverSample()))
		cfg.AccessLog = true
		cfg.ObserveNonStreaming = true
		observing := newHarness(b, cfg, withSampler(sdktrace.NeverSample()))
		tr := &http.Transport{MaxIdleConnsPerHost: 16}
		b.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Transport: tr}
		run := func(b *testing.B, base string) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(tc.body))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		}
		b.Run(tc.name+"/direct", func(b *testing.B) { run(b, simSrv.URL) })
		b.Run(tc.name+"/gateway", func(b *testing.B) { run(b, h.srv.URL) })
		b.Run(tc.name+"/gateway-no-access-log", func(b *testing.B) { run(b, quiet.srv.URL) })
		if !strings.Contains(tc.body, `"stream":true`) {
			// server.observe_non_streaming: streamed from the engine and
			// reassembled.
			b.Run(tc.name+"/gateway-observe", func(b *testing.B) { run(b, observing.srv.URL) })
		}
	}
}
