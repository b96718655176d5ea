package gateway

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestGaugesReturnToZeroAfterMixedBatch runs a concurrent mix of streaming
// and non-streaming successes, engine faults, bad input and unknown models,
// reads the gauges through the ManualReader all along (never below 0), and
// requires exactly 0 at the end, with the sampler on and off.
func TestGaugesReturnToZeroAfterMixedBatch(t *testing.T) {
	for _, sc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"always-on", sdktrace.AlwaysSample()}, {"always-off", sdktrace.NeverSample()}} {
		t.Run(sc.name, func(t *testing.T) {
			_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
			_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL}, fleet.EngineConfig{Name: "e2", URL: s2.URL})
			// One leg per request: the continuation's accounting across
			// legs is TestContinuation*'s.
			cfg.Migration.Limit = 0
			h := newHarness(t, cfg, withSampler(sc.sampler), withPolicy(routing.NewLeastLoaded(2)))
			type req struct {
				body, fault string
				engine      bool // reaches an engine
				path        string
			}
			kinds := []req{
				{`{"model":"m","stream":true,"max_tokens":4,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b"}]}`, "", true, ""},
				{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"a b"}]}`, "", true, ""},
				{`{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, "close-after=2", true, ""},
				{`{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, "status=500", true, ""},
				{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, "close-before-headers", true, ""},
				{`{"model":"m","prompt":"x y","max_tokens":3,"stream":true}`, "", true, "/v1/completions"},
				{`{"model":"m","messages":[{"role":"user","content":"hi"}], x}`, "", false, ""},
				{`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, "", false, ""},
			}
			stop := make(chan struct{})
			var negatives atomic.Int64
			var reads atomic.Int64
			var watcher sync.WaitGroup
			watcher.Add(1)
			go func() {
				defer watcher.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					for k, v := range h.gauges() {
						if v < 0 {
							negatives.Add(1)
							t.Errorf("gauge %s observed at %d", k, v)
						}
					}
					reads.Add(1)
					time.Sleep(time.Millisecond)
				}
			}()
			const perKind = 6
			var wg sync.WaitGroup
			var engineReqs atomic.Int64
			for i := range perKind * len(kinds) {
				k := kinds[i%len(kinds)]
				if k.engine {
					engineReqs.Add(1)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					path := "/v1/chat/completions"
					if k.path != "" {
						path = k.path
					}
					var hdr []string
					if k.fault != "" {
						hdr = []string{"X-Enginesim-Fault", k.fault}
					}
					resp := h.post(path, k.body, hdr...)
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}()
			}
			wg.Wait()
			close(stop)
			watcher.Wait()
			h.waitIdle()
			if reads.Load() == 0 {
				t.Fatal("the gauge watcher never read")
			}
			if n := h.histCount(telemetry.RequestDurationName); n != uint64(engineReqs.Load()) {
				t.Errorf("duration samples %d, want %d (one per engine attempt)", n, engineReqs.Load())
			}
			et := h.errorTypes()
			want := map[string]uint64{"": 3 * perKind, ErrTypeEngineDisconnect: 2 * perKind, "500": perKind}
			if fmt.Sprint(et) != fmt.Sprint(want) {
				t.Errorf("error types %v, want %v", et, want)
			}
		})
	}
}
