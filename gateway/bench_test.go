package gateway

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/quota"
)

// BenchmarkGatewayOverhead measures one request end to end, directly against
// a simulated engine (the baseline) and through the gateway, in the same
// run, so the difference is what the gateway adds: body parse, routing,
// span and slot lifecycle, header handling, SSE scanning and the extra
// loopback hop. allocs/op counts the whole process (client, gateway and
// engine), so the gateway's own share is the difference between the rows.
// The sampler is off, as for most production traffic; metrics are recorded.
// gateway-no-migration is the gateway with continuation off
// (migration.limit 0): the engine is not asked for token ids, so the
// difference to gateway is what continuation costs a stream (the
// engine's larger chunks included).
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
		cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
		h := newHarness(b, cfg, withSampler(sdktrace.NeverSample())) // access log on (to a discarding text handler), as by default
		cfg.AccessLog = false
		quiet := newHarness(b, cfg, withSampler(sdktrace.NeverSample()))
		cfg.AccessLog = true
		cfg.Migration.Limit = 0
		noMigration := newHarness(b, cfg, withSampler(sdktrace.NeverSample()))
		cfg.Migration.Limit = DefaultMigrationConfig().Limit
		cfg.ObserveNonStreaming = true
		observing := newHarness(b, cfg, withSampler(sdktrace.NeverSample()))
		tr := &http.Transport{MaxIdleConnsPerHost: 16}
		b.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Transport: tr}
		run := func(b *testing.B, base string) {
			b.ReportAllocs()
			for b.Loop() {
				benchChat(b, client, base, tc.body, "")
			}
		}
		b.Run(tc.name+"/direct", func(b *testing.B) { run(b, simSrv.URL) })
		b.Run(tc.name+"/gateway", func(b *testing.B) { run(b, h.srv.URL) })
		b.Run(tc.name+"/gateway-no-access-log", func(b *testing.B) { run(b, quiet.srv.URL) })
		// migration.limit 0: no token ids asked of the engine, none cut.
		b.Run(tc.name+"/gateway-no-migration", func(b *testing.B) { run(b, noMigration.srv.URL) })
		if !strings.Contains(tc.body, `"stream":true`) {
			// server.observe_non_streaming: streamed from the engine and
			// reassembled.
			b.Run(tc.name+"/gateway-observe", func(b *testing.B) { run(b, observing.srv.URL) })
		}
	}
}

// BenchmarkKeyLimits measures what API keys and their limits add to one
// non-streaming request, against auth off, in the same run: auth (a key,
// no limits: one SHA-256 and a constant-time compare per key), limits in
// this process (quota.Memory) and limits in a real Redis on loopback
// (quota.Redis: one round trip to admit, one to release). The limits are
// set far above the load, so every request is admitted. cpu-µs/op is this
// process's user+system CPU per request (client, gateway and engine: the
// same in every row, so the differences are the gateway's);
// redis-cpu-µs/op is the Redis server's own, from INFO cpu.
//
//	go test -run='^$' -bench=KeyLimits -benchmem -count=5 ./gateway/
func BenchmarkKeyLimits(b *testing.B) {
	const body = `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hello there"}]}`
	_, simSrv := sim(b, enginesim.Config{Models: []string{"m"}, TTFT: time.Nanosecond, ITL: time.Nanosecond})
	rds := redistest.Start(b)
	rc := quota.DefaultRedisConfig()
	rc.Address = rds.Addr()
	redisStore, err := quota.NewRedis(rc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = redisStore.Close() })
	info := redis.NewClient(&redis.Options{Addr: rds.Addr()})
	b.Cleanup(func() { _ = info.Close() })
	redisCPU := func() float64 {
		s, err := info.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		var total float64
		for _, line := range strings.Split(s, "\r\n") {
			for _, k := range []string{"used_cpu_user:", "used_cpu_sys:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					f, _ := strconv.ParseFloat(v, 64)
					total += f
				}
			}
		}
		return total
	}
	limits := KeyLimits{RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 40, Concurrent: 1 << 20}
	gw := func(keyed bool, l KeyLimits, opts ...Option) *harness {
		cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
		cfg.AccessLog = false
		if keyed {
			cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}, Limits: l}}}
		}
		return newHarnessWith(b, cfg, opts, withSampler(sdktrace.NeverSample()))
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	run := func(b *testing.B, h *harness, keyed bool) {
		b.ReportAllocs()
		cpu0, r0 := processCPU(), redisCPU()
		auth := ""
		if keyed {
			auth = "Bearer k-1"
		}
		for b.Loop() {
			benchChat(b, client, h.srv.URL, body, auth)
		}
		b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		b.ReportMetric((redisCPU()-r0)*1e6/float64(b.N), "redis-cpu-µs/op")
	}
	b.Run("auth-off", func(b *testing.B) { run(b, gw(false, KeyLimits{}), false) })
	b.Run("auth", func(b *testing.B) { run(b, gw(true, KeyLimits{}), true) })
	b.Run("limits-memory", func(b *testing.B) { run(b, gw(true, limits), true) })
	b.Run("limits-redis", func(b *testing.B) { run(b, gw(true, limits, WithQuotaStore(redisStore)), true) })
}

// processCPU is this process's user plus system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchChat posts one chat request to base and reads its answer, which
// must be 200; auth, when set, is its Authorization header.
func benchChat(b *testing.B, client *http.Client, base, body, auth string) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
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
