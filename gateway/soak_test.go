package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// The soak (shared/cases L01): a million requests through the gateway with
// every fast fault mixed in, and the proof that nothing per request outlives
// the request: the gauges read 0, no attempt is live, every attempt was
// recorded once, and the heap after a forced GC does not grow with volume.

// soakOutcome is what the soak client saw for one request.
type soakOutcome int

const (
	outDone      soakOutcome = iota // 200 stream ending in data: [DONE]
	outErrEvent                     // 200 stream ending in a data: {"error":...} event
	outStreamCut                    // 200 stream ending otherwise (read error, bare EOF)
	outOK                           // 200 non-stream, whole body
	outCut                          // 200 non-stream, body cut (read error)
	outCancelled                    // the client cancelled after the first content event
	out400
	out404
	out429
	out500
	out502
	out503
	out504
	outOtherStatus
	outTransportErr // the client got no response at all
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	outDone: "200 [DONE]", outErrEvent: "200 error event", outStreamCut: "200 stream cut",
	outOK: "200 body", outCut: "200 body cut", outCancelled: "client cancelled",
	out400: "400", out404: "404", out429: "429", out500: "500", out502: "502", out503: "503",
	out504: "504", outOtherStatus: "other status", outTransportErr: "transport error",
}

func statusOutcome(code int) soakOutcome {
	switch code {
	case 400:
		return out400
	case 404:
		return out404
	case 429:
		return out429
	case 500:
		return out500
	case 502:
		return out502
	case 503:
		return out503
	case 504:
		return out504
	}
	return outOtherStatus
}

// soakKind is one kind of request in the mix.
type soakKind struct {
	name     string
	weight   int    // in the schedule of sum(weight) slots
	path     string // "" = /v1/chat/completions
	stream   bool
	fault    string // X-Enginesim-Fault; "" sends no header
	body     string // "" = a generated body for path and stream
	cancel   bool   // the client cancels after the first content event
	want     soakOutcome
	errType  string // expected error.type on request.duration; noAttempt when no engine is reached
	parseErr bool   // one stream parse error expected
}

const noAttempt = "-"

// soakKinds is the request mix. Fast outcomes dominate; the faults that
// need a gateway timeout to fire (stall-*) are a few per thousand so the
// timeout paths are soaked without dominating the wall time. Every engine
// fault of the fault matrix that enginesim can inject per request is here;
// connection refused, connect timeout and the transport panic need a
// different engine setup and are covered by TestFaultMatrix.
var soakKinds = []soakKind{
	{name: "chat stream ok", weight: 300, stream: true, want: outDone},
	{name: "chat non-stream ok", weight: 200, want: outOK},
	{name: "completions stream ok", weight: 40, path: "/v1/completions", stream: true, want: outDone},
	{name: "completions non-stream ok", weight: 30, path: "/v1/completions", want: outOK},
	{name: "embeddings ok", weight: 20, path: "/v1/embeddings", want: outOK},
	{name: "chat stream reasoning+tool-call", weight: 20, stream: true, fault: "reasoning=2,tool-call", want: outDone},
	{name: "status=500 stream", weight: 20, stream: true, fault: "status=500", want: out500, errType: "500"},
	{name: "status=500 non-stream", weight: 20, fault: "status=500", want: out500, errType: "500"},
	{name: "status=429 stream", weight: 15, stream: true, fault: "status=429", want: out429, errType: "429"},
	{name: "status=429 non-stream", weight: 15, fault: "status=429", want: out429, errType: "429"},
	{name: "close-before-headers stream", weight: 15, stream: true, fault: "close-before-headers", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "close-before-headers non-stream", weight: 15, fault: "close-before-headers", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "close-after-headers stream", weight: 15, stream: true, fault: "close-after-headers", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "close-after-headers non-stream", weight: 15, fault: "close-after-headers", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "close-after=2 stream", weight: 20, stream: true, fault: "close-after=2", want: outErrEvent, errType: ErrTypeEngineDisconnect},
	{name: "close-after=2 non-stream", weight: 15, fault: "close-after=2", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "truncate stream", weight: 10, stream: true, fault: "truncate", want: outErrEvent, errType: ErrTypeEngineDisconnect},
	{name: "truncate non-stream", weight: 10, fault: "truncate", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "status=502 html non-stream", weight: 10, fault: "status=502,error-body=html", want: out502, errType: "502"},
	{name: "malformed stream", weight: 20, stream: true, fault: "malformed", want: outDone, parseErr: true},
	{name: "malformed non-stream", weight: 10, fault: "malformed", want: outOK},
	{name: "keepalive stream", weight: 25, stream: true, fault: "keepalive", want: outDone},
	{name: "no-content stream", weight: 15, stream: true, fault: "no-content", want: outDone},
	{name: "no-content non-stream", weight: 10, fault: "no-content", want: outOK},
	{name: "trickle stream", weight: 10, stream: true, fault: "trickle=0s", want: outDone},
	{name: "slow-headers=1ms non-stream", weight: 10, fault: "slow-headers=1ms", want: outOK},
	{name: "client cancel after first token", weight: 10, stream: true, fault: "stall-after=1", cancel: true, want: outCancelled, errType: ErrTypeClientCancelled},
	{name: "bad JSON", weight: 20, body: `{"model":"m","messages":[`, want: out400, errType: noAttempt},
	{name: "unknown model", weight: 20, body: `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`, want: out404, errType: noAttempt},
	{name: "stall-before-headers stream", weight: 3, stream: true, fault: "stall-before-headers", want: out504, errType: ErrTypeHeaderTimeout},
	{name: "stall-before-headers non-stream", weight: 1, fault: "stall-before-headers", want: out504, errType: ErrTypeRequestTimeout},
	{name: "stall-after=2 stream", weight: 3, stream: true, fault: "stall-after=2", want: outErrEvent, errType: ErrTypeIdleTimeout},
	{name: "stall-after=2 non-stream", weight: 2, fault: "stall-after=2", want: out504, errType: ErrTypeIdleTimeout},
	{name: "stall-after=0 stream (no first token)", weight: 2, stream: true, fault: "stall-after=0", want: outErrEvent, errType: ErrTypeFirstToken},
}

// soakBody returns the request body for k.
func soakBody(k *soakKind) []byte {
	if k.body != "" {
		return []byte(k.body)
	}
	switch k.path {
	case "/v1/embeddings":
		return []byte(`{"model":"m","input":"the quick brown fox"}`)
	case "/v1/completions":
		return fmt.Appendf(nil, `{"model":"m","prompt":"a b c d","max_tokens":4,"stream":%t,"stream_options":{"include_usage":%t}}`, k.stream, k.stream)
	}
	so := ""
	if k.stream {
		so = `"stream_options":{"include_usage":true},`
	}
	return fmt.Appendf(nil, `{"model":"m","stream":%t,%s"max_tokens":4,"messages":[{"role":"user","content":"a b c d e f"}]}`, k.stream, so)
}

// discardSpans is a span processor that keeps nothing. The soak samples a
// fraction of the requests (SOAK_SAMPLE, default 0.1) so that both the
// sampled path (recording spans with every attribute and event set, then
// ended) and the sampler-off path run a million times. The ended spans go
// to this processor and are dropped: a tracetest.SpanRecorder, as the unit
// tests use, keeps every ended span and would grow by ~100k spans per
// million requests, which would be the harness leaking, not the gateway,
// and would invalidate the heap measurement. An exporter pipeline
// (batcher) is not used either: its queue is bounded but its contents at a
// checkpoint would be noise.
type discardSpans struct{}

func (discardSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discardSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discardSpans) Shutdown(context.Context) error                  { return nil }
func (discardSpans) ForceFlush(context.Context) error                { return nil }

// seriesCount is the number of data points (attribute sets) of every
// instrument: it must stay bounded whatever the volume.
func seriesCount(rm metricdata.ResourceMetrics) int {
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				n += len(d.DataPoints)
			case metricdata.Sum[float64]:
				n += len(d.DataPoints)
			case metricdata.Gauge[int64]:
				n += len(d.DataPoints)
			case metricdata.Gauge[float64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[float64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[int64]:
				n += len(d.DataPoints)
			}
		}
	}
	return n
}

// waitLive waits (bounded) until no engine attempt is live.
func waitLive(h *harness, d time.Duration) int64 {
	testutil.Poll(d, func() bool { return h.gw.LiveAttempts() == 0 })
	return h.gw.LiveAttempts()
}

// memSample is the process's memory after a forced GC.
type memSample struct {
	heapInuse  uint64 // runtime.MemStats.HeapInuse
	heapAlloc  uint64 // runtime.MemStats.HeapAlloc (the live heap)
	stackInuse uint64 // runtime.MemStats.StackInuse (goroutine stacks are not heap)
	rss        uint64 // VmRSS, bytes
	goroutines int
}

// readMem forces a GC and reads the memory figures. Two collections: the
// first moves sync.Pool contents to the victim cache, the second frees
// them, so pooled buffers do not count.
func readMem() memSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, stackInuse: ms.StackInuse, rss: procStatus("VmRSS"), goroutines: runtime.NumGoroutine()}
}

// soakSample is one checkpoint.
type soakSample struct {
	requests int64
	// warm is measured as the process stands, keep-alive connections (and
	// their buffers and goroutines) included; quiet after every idle
	// connection was closed, which removes the connection-pool noise (how
	// many connections are idle depends on the fault mix's timing) and
	// leaves what requests may have left behind.
	warm, quiet memSample
	hwm         uint64 // VmHWM (peak RSS), bytes
	series      int    // metric data points across every instrument
	elapsed     time.Duration
}

// settleGoroutines waits (bounded) until the goroutine count stops falling
// (connection goroutines exit asynchronously after a close).
func settleGoroutines() {
	prev := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == prev {
			return
		}
		prev = n
	}
}

// procStatus returns a "VmXXX:" field of /proc/self/status in bytes (0 when
// unavailable).
func procStatus(field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func envInt(tb testing.TB, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(v, "_", ""), 10, 64)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// soakWorker is one client connection's worth of state, reused across its
// requests.
type soakWorker struct {
	client *http.Client
	url    string
	buf    bytes.Buffer
	br     *bufio.Reader
}

var contentLine = []byte(`"content":"tok`)

// do sends one request of kind k (body pre-built) and classifies what came
// back.
func (w *soakWorker) do(k *soakKind, body []byte) soakOutcome {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := k.path
	if path == "" {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url+path, bytes.NewReader(body))
	if err != nil {
		return outTransportErr
	}
	req.Header.Set("Content-Type", "application/json")
	if k.fault != "" {
		req.Header.Set(enginesim.FaultHeader, k.fault)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return outTransportErr
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return statusOutcome(resp.StatusCode)
	}
	if k.cancel {
		// Read events until the first content token, then go away.
		w.br.Reset(resp.Body)
		for {
			line, err := w.br.ReadSlice('\n')
			if bytes.Contains(line, contentLine) {
				cancel()
				_, _ = io.Copy(io.Discard, w.br)
				return outCancelled
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				return outStreamCut
			}
		}
	}
	w.buf.Reset()
	_, err = w.buf.ReadFrom(resp.Body)
	got := w.buf.Bytes()
	switch {
	case !k.stream && err != nil:
		return outCut
	case !k.stream:
		return outOK
	case err == nil && bytes.HasSuffix(got, []byte("data: [DONE]\n\n")):
		return outDone
	case bytes.HasSuffix(got, []byte("}}\n\n")) && bytes.HasPrefix(lastEvent(got), []byte(`data: {"error":`)):
		return outErrEvent
	}
	return outStreamCut
}

// lastEvent returns the last SSE event of a stream body.
func lastEvent(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n\n"))
	if i := bytes.LastIndex(b, []byte("\n\n")); i >= 0 {
		return b[i+2:]
	}
	return b
}

// BenchmarkSoak sends SOAK_REQUESTS (default 1,000,000) requests through an
// in-process gateway to three simulated engines, with SOAK_CONCURRENCY
// (default 32) keep-alive clients, mixing successes and every fast fault
// (soakKinds), and samples heap and RSS after a forced GC at 10k, 100k and
// 1M requests. The soak runs once whatever b.N is; run it alone with:
//
//	go test -run='^$' -bench='^BenchmarkSoak$' -benchtime=1x -timeout=60m ./gateway/
//
// It fails unless, at every checkpoint and at the end, every
// active_requests gauge reads 0 (and was never seen below 0), no attempt is
// live, the request.duration count equals the number of requests the
// engines received, and the heap in use after GC at 1M is within 10% of
// its value at 100k. BENCHMARKS.md records the figures.
func BenchmarkSoak(b *testing.B) {
	total := envInt(b, "SOAK_REQUESTS", 1_000_000)
	conc := int(envInt(b, "SOAK_CONCURRENCY", 32))
	sampleRatio := 0.1
	if v := os.Getenv("SOAK_SAMPLE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			b.Fatalf("SOAK_SAMPLE=%q: want a ratio in [0,1]", v)
		}
		sampleRatio = f
	}

	// Engines: instant prefill and decode so the soak measures the
	// gateway, not the simulated GPU.
	const nEngines = 3
	var sims []*enginesim.Engine
	var engines []fleet.EngineConfig
	for i := range nEngines {
		e, err := enginesim.New(enginesim.Config{Name: fmt.Sprintf("e%d", i+1), Models: []string{"m"},
			TTFT: time.Nanosecond, ITL: time.Nanosecond, OutputTokens: 4})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(e.Handler())
		b.Cleanup(func() {
			srv.CloseClientConnections()
			srv.Close()
		})
		sims = append(sims, e)
		engines = append(engines, fleet.EngineConfig{Name: fmt.Sprintf("e%d", i+1), URL: srv.URL, Models: []string{"m"}})
	}
	cfg := testConfig(engines...)
	// Small gateway timeouts so the stall-* kinds end quickly: the header
	// timeout (streams), the idle timeout and the request timeout (which
	// bounds the non-stream stall-before-headers kind). They are well above
	// the latency tail of a normal request with 32 clients on 2 busy cores
	// (a 50 ms header timeout and a 20 ms idle timeout fired on ~0.4% of
	// the healthy streams there).
	cfg.Timeouts.ResponseHeader = 250 * time.Millisecond
	cfg.Timeouts.FirstToken = 500 * time.Millisecond
	cfg.Timeouts.Idle = 100 * time.Millisecond
	cfg.Timeouts.Attempt = 0 // the request timeout bounds the non-stream stall-before-headers kind
	cfg.Timeouts.Request = time.Second
	// Probes every second (instead of the tests' hour) so the probe path is
	// soaked alongside, and a spurious failure could not keep an engine out
	// of routing for the rest of the run.
	cfg.Health.Interval = time.Second
	// Least-loaded routing reads the in-flight counters on every pick: a
	// leaked count would visibly skew traffic away from an engine.
	h := newHarness(b, cfg, withPolicy(routing.NewLeastLoaded(2)), withSampler(sdktrace.TraceIDRatioBased(sampleRatio)), withSpanProcessor(discardSpans{}))

	tr := h.srv.Client().Transport.(*http.Transport).Clone()
	tr.MaxIdleConns = 4 * conc
	tr.MaxIdleConnsPerHost = 2 * conc // every worker keeps its connection alive
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	schedule, bodies := soakSchedule(1, 2)
	counts := make([][numOutcomes]atomic.Int64, len(soakKinds))

	// The gauge watcher collects like a scraper, every 50 ms, and records
	// the lowest value any gauge ever had.
	var minGauge atomic.Int64
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopWatch:
				return
			case <-t.C:
			}
			var rm metricdata.ResourceMetrics
			if err := h.reader.Collect(context.Background(), &rm); err != nil {
				continue
			}
			for _, v := range gaugesOf(rm) {
				if v < minGauge.Load() {
					minGauge.Store(v)
				}
			}
		}
	}()
	stopWatcher := sync.OnceFunc(func() { close(stopWatch); <-watched })
	b.Cleanup(stopWatcher)

	var checkpoints []int64
	for _, c := range []int64{10_000, 100_000, 1_000_000} {
		if c < total {
			checkpoints = append(checkpoints, c)
		}
	}
	checkpoints = append(checkpoints, total)

	var samples []soakSample
	start := time.Now()
	b.ResetTimer()
	var next int64
	for _, cp := range checkpoints {
		var idx atomic.Int64
		idx.Store(next)
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				w := &soakWorker{client: client, url: h.srv.URL, br: bufio.NewReaderSize(nil, 4096)}
				for {
					i := idx.Add(1) - 1
					if i >= cp {
						return
					}
					ki := schedule[i%int64(len(schedule))]
					o := w.do(&soakKinds[ki], bodies[ki])
					counts[ki][o].Add(1)
				}
			})
		}
		wg.Wait()
		next = cp
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "soak: %d requests in %v\n", cp, time.Since(start).Round(time.Millisecond))
		}

		// Checkpoint: the clients are done; let the gateway's handlers end
		// (a cancelled client leaves before its handler does), then check
		// the gauges and measure.
		b.StopTimer()
		if n := waitLive(h, 5*time.Second); n != 0 {
			b.Fatalf("at %d requests: %d attempts still live", cp, n)
		}
		rm := h.collect()
		for k, v := range gaugesOf(rm) {
			if v != 0 {
				b.Fatalf("at %d requests: gauge %s = %d, want 0", cp, k, v)
			}
		}
		warm := readMem()
		tr.CloseIdleConnections()
		h.gw.client.CloseIdleConnections() // the engine transport (requests and probes)
		settleGoroutines()
		samples = append(samples, soakSample{requests: cp, warm: warm, quiet: readMem(),
			hwm: procStatus("VmHWM"), series: seriesCount(rm), elapsed: time.Since(start)})
		b.StartTimer()
	}
	wall := time.Since(start)
	b.StopTimer()
	stopWatcher()

	// The figures.
	mib := func(v uint64) string { return fmt.Sprintf("%.2f MiB", float64(v)/(1<<20)) }
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "soak: %d requests, %d workers, %d engines, sample ratio %g, wall %v (%.0f req/s), GOMAXPROCS %d\n",
		total, conc, nEngines, sampleRatio, wall.Round(time.Millisecond), float64(total)/wall.Seconds(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(&tbl, "| requests | heap in use | heap alloc | RSS | goroutines | heap in use, conns closed | heap alloc, conns closed | RSS, conns closed | goroutines, conns closed | peak RSS | metric series | elapsed |\n")
	fmt.Fprintf(&tbl, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range samples {
		fmt.Fprintf(&tbl, "| %d | %s | %s | %s | %d | %s | %s | %s | %d | %s | %d | %v |\n", s.requests,
			mib(s.warm.heapInuse), mib(s.warm.heapAlloc), mib(s.warm.rss), s.warm.goroutines,
			mib(s.quiet.heapInuse), mib(s.quiet.heapAlloc), mib(s.quiet.rss), s.quiet.goroutines,
			mib(s.hwm), s.series, s.elapsed.Round(time.Millisecond))
	}

	// Every request accounted for, per kind and outcome.
	var sent, mismatched, noEngine int64
	outTotals := [numOutcomes]int64{}
	wantTypes := map[string]int64{}
	var wantParseErrs int64
	fmt.Fprintf(&tbl, "\n| kind | requests | outcomes (client view) | expected |\n|---|---:|---|---|\n")
	for i := range soakKinds {
		k := &soakKinds[i]
		var n int64
		var parts []string
		for o := range numOutcomes {
			c := counts[i][o].Load()
			if c == 0 {
				continue
			}
			n += c
			outTotals[o] += c
			parts = append(parts, fmt.Sprintf("%s: %d", outcomeNames[o], c))
			if o != k.want {
				mismatched += c
			}
		}
		sent += n
		if k.errType == noAttempt {
			noEngine += n
		} else {
			wantTypes[k.errType] += n
		}
		if k.parseErr {
			wantParseErrs += n
		}
		fmt.Fprintf(&tbl, "| %s | %d | %s | %s |\n", k.name, n, strings.Join(parts, ", "), outcomeNames[k.want])
	}
	var parts []string
	for o := range numOutcomes {
		if outTotals[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", outcomeNames[o], outTotals[o]))
		}
	}
	fmt.Fprintf(&tbl, "| **all** | %d | %s | %d unexpected |\n", sent, strings.Join(parts, ", "), mismatched)

	// The gateway's view: request.duration per error.type, engine counts.
	rm := h.collect()
	gotTypes := errorTypesOf(rm, telemetry.RequestDurationName)
	var recorded uint64
	keys := map[string]bool{}
	for k, v := range gotTypes {
		recorded += v
		keys[k] = true
	}
	for k := range wantTypes {
		keys[k] = true
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Fprintf(&tbl, "\n| error.type | recorded | expected |\n|---|---:|---:|\n")
	for _, k := range names {
		label := k
		if label == "" {
			label = "(success)"
		}
		fmt.Fprintf(&tbl, "| %s | %d | %d |\n", label, gotTypes[k], wantTypes[k])
	}
	var received int64
	var perEngine []string
	for i, e := range sims {
		st := e.Stats()
		received += st.Received
		perEngine = append(perEngine, fmt.Sprintf("e%d received %d (completed %d, aborted %d, faulted %d)", i+1, st.Received, st.Completed, st.Aborted, st.Faulted))
	}
	parseErrs := counterTotal(rm, telemetry.ParseErrorsName)
	fmt.Fprintf(&tbl, "\nengines: %s\nrequest.duration count %d; engine requests %d; requests that reach an engine %d; parse errors %d (expected %d); lowest gauge seen %d\n",
		strings.Join(perEngine, "; "), recorded, received, sent-noEngine, parseErrs, wantParseErrs, minGauge.Load())
	nLog, firstLogs := h.serverLog.lines()
	fmt.Fprintf(&tbl, "net/http server log lines about the gateway: %d %q\n", nLog, firstLogs)
	b.Log("\n" + tbl.String())

	// The verdict.
	if sent != total {
		b.Fatalf("accounted %d requests, sent %d", sent, total)
	}
	if n := waitLive(h, 5*time.Second); n != 0 {
		b.Fatalf("%d attempts still live", n)
	}
	for k, v := range gaugesOf(h.collect()) {
		if v != 0 {
			b.Fatalf("gauge %s = %d, want 0", k, v)
		}
	}
	if nLog > 0 {
		b.Fatalf("net/http logged %d lines about the gateway's handler, first %q", nLog, firstLogs)
	}
	if m := minGauge.Load(); m < 0 {
		b.Fatalf("a gauge was observed at %d", m)
	}
	if int64(recorded) != received || received != sent-noEngine {
		b.Fatalf("request.duration count %d, engines received %d, requests that reach an engine %d: want all equal", recorded, received, sent-noEngine)
	}
	// Timing can legitimately turn a few requests (a gateway timeout firing
	// on a starved goroutine); more than 0.1% means the gateway misbehaves.
	if mismatched*1000 > total {
		b.Fatalf("%d requests had an unexpected outcome (over 0.1%%)", mismatched)
	}
	if mismatched > 0 {
		b.Logf("%d requests had an unexpected outcome (timing)", mismatched)
	}

	last := samples[len(samples)-1]
	b.ReportMetric(float64(last.warm.heapInuse), "heap-inuse-B")
	b.ReportMetric(float64(last.warm.heapAlloc), "heap-alloc-B")
	b.ReportMetric(float64(last.warm.rss), "rss-B")
	b.ReportMetric(float64(last.warm.goroutines), "goroutines")
	b.ReportMetric(float64(last.quiet.heapInuse), "heap-inuse-quiet-B")
	b.ReportMetric(float64(total)/wall.Seconds(), "req/s")
	var base *soakSample
	for i := range samples {
		if samples[i].requests == 100_000 {
			base = &samples[i]
		}
	}
	if base != nil {
		for _, s := range samples {
			if s.requests < 1_000_000 {
				continue
			}
			ratio := func(f func(m memSample) uint64) float64 { return float64(f(s.warm)) / float64(f(base.warm)) }
			qratio := func(f func(m memSample) uint64) float64 { return float64(f(s.quiet)) / float64(f(base.quiet)) }
			inuse := func(m memSample) uint64 { return m.heapInuse }
			alloc := func(m memSample) uint64 { return m.heapAlloc }
			b.ReportMetric(ratio(inuse), "heap-1M/100k")
			b.ReportMetric(qratio(inuse), "heap-quiet-1M/100k")
			b.Logf("at %d / at 100k: heap in use x%.3f, heap alloc x%.3f; with connections closed: heap in use x%.3f, heap alloc x%.3f",
				s.requests, ratio(inuse), ratio(alloc), qratio(inuse), qratio(alloc))
			if r := qratio(inuse); r > 1.10 {
				b.Fatalf("heap in use after GC (connections closed) grew from %s at 100k to %s at %d (x%.3f, limit 1.10)",
					mib(base.quiet.heapInuse), mib(s.quiet.heapInuse), s.requests, r)
			}
			if r := ratio(inuse); r > 1.10 {
				b.Fatalf("heap in use after GC grew from %s at 100k to %s at %d (x%.3f, limit 1.10)",
					mib(base.warm.heapInuse), mib(s.warm.heapInuse), s.requests, r)
			}
		}
	}
}

// counterTotal returns the total of an Int64 counter.
func counterTotal(rm metricdata.ResourceMetrics, name string) int64 {
	m, ok := findMetric(rm, name)
	if !ok {
		return 0
	}
	var n int64
	if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
		for _, dp := range sum.DataPoints {
			n += dp.Value
		}
	}
	return n
}

// soakSchedule returns the soak's request schedule and each kind's body:
// sum(weight) slots, each kind as many times as its weight, shuffled with
// the fixed seed (seed1, seed2); request i is kind schedule[i mod len].
func soakSchedule(seed1, seed2 uint64) (schedule []int, bodies [][]byte) {
	for i, k := range soakKinds {
		for range k.weight {
			schedule = append(schedule, i)
		}
	}
	rand.New(rand.NewPCG(seed1, seed2)).Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	bodies = make([][]byte, len(soakKinds))
	for i := range soakKinds {
		bodies[i] = soakBody(&soakKinds[i])
	}
	return schedule, bodies
}
