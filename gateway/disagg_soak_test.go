package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// pdSoakKind is one kind of request of the disaggregated soak: its fault
// (X-Enginesim-Fault, which both legs get: each fault acts on one leg
// only), whether it streams, and the status its client must get.
type pdSoakKind struct {
	name, fault string
	stream      bool
	status      int
	mode        string // the disaggregation mode counted
	cancel      bool   // the client leaves after the first content event
	continued   bool   // its decode leg breaks and is continued on the other decode engine
}

var pdSoakKinds = []pdSoakKind{
	{name: "stream ok", stream: true, status: 200, mode: telemetry.DisaggModeDisaggregated},
	{name: "non-stream ok", status: 200, mode: telemetry.DisaggModeDisaggregated},
	{name: "prefill without params", fault: "kv-no-params", stream: true, status: 200, mode: telemetry.DisaggModeRecompute},
	// The decode engine ends the stream with vLLM's in-band error (the
	// fail policy) after its role chunk: continued on the other decode
	// engine, which computes the prompt (a plain request), so the client
	// gets the whole answer. A non-streaming request is read as a stream,
	// and continued the same way.
	{name: "kv pull fails, stream", fault: "kv-pull-fail", stream: true, status: 200, mode: telemetry.DisaggModeDisaggregated, continued: true},
	{name: "kv pull fails", fault: "kv-pull-fail", status: 200, mode: telemetry.DisaggModeDisaggregated, continued: true},
	{name: "prefill 503", fault: "status=503", status: 503, mode: telemetry.DisaggModeDisaggregated}, // decided, then failed
	{name: "client gone mid-stream", stream: true, cancel: true, mode: telemetry.DisaggModeDisaggregated},
}

// BenchmarkSoakDisaggregated sends SOAK_REQUESTS (default 100,000) chat
// requests, every one disaggregated, through an in-process gateway to one
// prefill and two decode engines, with SOAK_CONCURRENCY (default 32)
// clients, mixing successes, streams and not, a prefill without
// kv_transfer_params, failed KV pulls, failed prefills and clients that
// leave mid-stream (pdSoakKinds, in turn); a decode leg whose KV pull
// failed is continued on the other decode engine. At the end every phase gauge
// of the three engines is exactly 0 and never read below 0, no attempt is
// live, each kind got its status every time, the decisions add up by
// mode, each engine recorded one duration per leg, and the heap in use
// after GC grew by no more than the soak's gate between 10% of the
// requests and the end.
func BenchmarkSoakDisaggregated(b *testing.B) {
	total := envInt(b, "SOAK_REQUESTS", 100_000)
	conc := int(envInt(b, "SOAK_CONCURRENCY", 32))
	var engines []fleet.EngineConfig
	for _, e := range []struct{ name, role string }{{"p1", "prefill"}, {"d1", "decode"}, {"d2", "decode"}} {
		sim, err := enginesim.New(enginesim.Config{Name: e.name, Models: []string{"m"}, KVEngineID: e.name,
			TTFT: time.Nanosecond, ITL: time.Nanosecond, OutputTokens: 4, PromptTokensDetails: true,
			// The prefill engine holds the KV of every failed pull until its
			// lease ends: a short lease keeps the simulator's own memory (in
			// this process's heap) from growing with the run.
			KVLeaseDuration: 200 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		srv := newLoopbackServer(b, sim.Handler())
		engines = append(engines, fleet.EngineConfig{Name: e.name, URL: srv, Models: []string{"m"}, Role: e.role})
	}
	cfg := testConfig(engines...)
	cfg.Disaggregation.Enabled = true
	cfg.Disaggregation.MinUncachedTokens = 0 // every chat request
	cfg.MaxAttempts = 1
	cfg.Timeouts.Request = 5 * time.Second
	// No ejection: the failed KV pulls would take the decode engines out
	// in turn, and whether a break finds another engine would then depend
	// on timing. (Ejection has its own soak kinds in BenchmarkSoak.)
	cfg.Outlier.Enabled = false
	h := newHarness(b, cfg, withPolicy(routing.NewLeastLoaded(2)), withSampler(sdktrace.TraceIDRatioBased(0.1)), withSpanProcessor(discardSpans{}))
	tr := h.srv.Client().Transport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2 * conc
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	var minGauge atomic.Int64
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			for _, v := range h.gauges() {
				if v < minGauge.Load() {
					minGauge.Store(v)
				}
			}
		}
	}()
	stopWatcher := sync.OnceFunc(func() { close(stop); <-watched })
	b.Cleanup(stopWatcher)

	bodies := make([][]byte, len(pdSoakKinds))
	for i, k := range pdSoakKinds {
		bodies[i] = fmt.Appendf(nil, `{"model":"m","stream":%t,"max_tokens":4,"messages":[{"role":"user","content":"soak %d %s"}]}`, k.stream, i, strings.Repeat("w ", 40))
	}
	counts := make([]atomic.Int64, len(pdSoakKinds))
	wrong := make([]atomic.Int64, len(pdSoakKinds))
	var next atomic.Int64
	run := func(upTo int64) {
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				for {
					n := next.Add(1)
					if n > upTo {
						return
					}
					i := int(n % int64(len(pdSoakKinds)))
					k := &pdSoakKinds[i]
					counts[i].Add(1)
					if !pdSoakOne(client, h.srv.URL, k, bodies[i]) {
						wrong[i].Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	b.ResetTimer()
	start := time.Now()
	first := max(total/10, 1)
	run(first)
	waitLive(h, 5*time.Second)
	tr.CloseIdleConnections()
	settleGoroutines()
	base := readMem()
	run(total)
	elapsed := time.Since(start)
	b.StopTimer()
	if n := waitLive(h, 5*time.Second); n != 0 {
		b.Errorf("%d attempts still live", n)
	}
	stopWatcher()
	tr.CloseIdleConnections()
	settleGoroutines()
	end := readMem()

	rm := h.collect()
	for k, v := range gaugesOf(rm) {
		if v != 0 {
			b.Errorf("gauge %s = %d at the end, want 0", k, v)
		}
	}
	if m := minGauge.Load(); m < 0 {
		b.Errorf("a gauge read %d", m)
	}
	wantModes := map[string]int64{}
	for i, k := range pdSoakKinds {
		if n := wrong[i].Load(); n != 0 {
			b.Errorf("%s: %d of %d requests got the wrong answer", k.name, n, counts[i].Load())
		}
		if k.mode != "" {
			wantModes[k.mode] += counts[i].Load()
		}
	}
	gotModes := countsBy(rm, telemetry.DisaggRequestsName, telemetry.AttrDisaggMode)
	for _, m := range []string{telemetry.DisaggModeDisaggregated, telemetry.DisaggModeRecompute, telemetry.DisaggModeAggregated} {
		if gotModes[m] != wantModes[m] {
			b.Errorf("mode %s counted %d, want %d", m, gotModes[m], wantModes[m])
		}
	}
	// Legs per engine: every request one prefill leg on p1; every one but
	// the failed prefills a decode leg on d1 or d2.
	var prefills, decodes, continued int64
	for i, k := range pdSoakKinds {
		prefills += counts[i].Load()
		if k.status != http.StatusServiceUnavailable {
			decodes += counts[i].Load()
		}
		if k.continued {
			continued += counts[i].Load()
		}
	}
	decodes += continued // each continuation is a leg on the other decode engine
	if got := countsBy(rm, telemetry.MigrationsName, telemetry.AttrMigrationOutcome)[migrationRescued]; got != continued {
		b.Errorf("continuations rescued %d, want %d", got, continued)
	}
	legs := map[string]uint64{}
	if m, ok := findMetric(rm, telemetry.RequestDurationName); ok {
		for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
			e, _ := dp.Attributes.Value(telemetry.AttrEngine)
			legs[e.AsString()] += dp.Count
		}
	}
	if legs["p1"] != uint64(prefills) || legs["d1"]+legs["d2"] != uint64(decodes) {
		b.Errorf("legs: p1 %d (want %d), d1+d2 %d (want %d)", legs["p1"], prefills, legs["d1"]+legs["d2"], decodes)
	}
	mib := func(v uint64) string { return fmt.Sprintf("%.2f MiB", float64(v)/(1<<20)) }
	b.ReportMetric(float64(total)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(end.heapInuse)/float64(base.heapInuse), "heap-end/10%")
	b.Logf("disaggregated soak: %d requests, %d workers, %.0f req/s; heap in use after GC %s at %d, %s at the end (x%.3f); goroutines %d -> %d; modes %v",
		total, conc, float64(total)/elapsed.Seconds(), mib(base.heapInuse), first, mib(end.heapInuse), float64(end.heapInuse)/float64(base.heapInuse), base.goroutines, end.goroutines, gotModes)
	if heapGrew(base.heapInuse, end.heapInuse) {
		b.Errorf("heap in use after GC grew from %s to %s (limit x%.2f and %s)", mib(base.heapInuse), mib(end.heapInuse), soakHeapRatio, mib(soakHeapFloor))
	}
}

// pdSoakOne sends one request of kind k and reports whether its client got
// what the kind must get.
func pdSoakOne(client *http.Client, base string, k *pdSoakKind, body []byte) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	if k.fault != "" {
		req.Header.Set(enginesim.FaultHeader, k.fault)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if k.cancel {
		buf := make([]byte, 512)
		for {
			n, err := resp.Body.Read(buf)
			if strings.Contains(string(buf[:n]), `"content":"tok`) || err != nil {
				cancel()
				return resp.StatusCode == http.StatusOK
			}
		}
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != k.status {
		return false
	}
	switch {
	case k.status != http.StatusOK:
		return strings.Contains(string(b), `"error"`)
	case k.stream:
		return strings.HasSuffix(string(b), "data: [DONE]\n\n") && strings.Contains(string(b), `"content":"tok3 "`)
	}
	return strings.Contains(string(b), `"content":"tok0 tok1 tok2 tok3 "`)
}

// newLoopbackServer serves h on a loopback listener closed when the
// benchmark ends, and returns its URL.
func newLoopbackServer(b *testing.B, h http.Handler) string {
	b.Helper()
	srv := httptest.NewServer(h)
	b.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL
}
