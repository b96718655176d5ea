package enginesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; nil = valid
	}{
		{"zero", Config{}, nil},
		{"full", Config{Name: "e", Models: []string{"a", "b"}, TTFT: time.Second, Fault: "trickle"}, nil},
		{"negative ttft", Config{TTFT: -1}, []string{"ttft must not be negative"}},
		{"all negatives", Config{
			TTFTPerPromptToken: -1, ITL: -1, OutputTokens: -1, MaxOutputTokens: -1, MaxNumSeqs: -1,
			KVCacheBlocks: -1, BlockSize: -1, EmbeddingDim: -1, MaxModelLen: -1,
		}, []string{
			"ttft per prompt token", "itl", "output tokens", "max output tokens", "max model len", "max num seqs",
			"kv cache blocks", "block size", "embedding dim",
		}},
		{"bad models", Config{Models: []string{"a", "", "a"}}, []string{"model 1 has an empty name", `model "a" listed twice`}},
		{"bad fault", Config{Fault: "explode"}, []string{"default fault", "unknown fault"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == nil {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v, missing %q", err, w)
				}
			}
			if _, nerr := New(tc.cfg); nerr == nil {
				t.Errorf("New accepted an invalid config")
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Name: "enginesim", Models: []string{"sim-model"}, TTFT: 20 * time.Millisecond, ITL: 10 * time.Millisecond,
		OutputTokens: 16, MaxOutputTokens: 4096, MaxModelLen: 8192, MaxNumSeqs: 256, KVCacheBlocks: 1024, BlockSize: 16,
		EmbeddingDim: 16, KVLeaseDuration: 30 * time.Second, KVLoadFailurePolicy: "fail", MaxNumBatchedTokens: 2048,
	}
	// The engine id is a new random UUID.
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(e.cfg.KVEngineID) {
		t.Errorf("KVEngineID = %q, want a UUID", e.cfg.KVEngineID)
	}
	want.KVEngineID = e.cfg.KVEngineID
	if fmt.Sprintf("%+v", e.cfg) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults = %+v\nwant %+v", e.cfg, want)
	}
}

func TestScheduling(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 1
	cfg.TTFT = 100 * time.Millisecond
	e, srv := startEngine(t, cfg)

	var wg sync.WaitGroup
	status := make([]int, 2)
	for i := range 2 {
		if i == 1 {
			testutil.Eventually(t, time.Second, func() bool { return e.Stats().Running == 1 }, "first request running")
		}
		wg.Go(func() {
			resp, err := send(t, nil, srv, "POST", "/v1/chat/completions", chatUnaryBody, nil)
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			status[i] = resp.StatusCode
		})
	}
	testutil.Eventually(t, time.Second, func() bool {
		s := e.Stats()
		return s.Running == 1 && s.Waiting == 1
	}, "one running, one waiting")
	if got := gaugeValue(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricNumRequestsWaiting, "m1"); got != 1 {
		t.Errorf("%s = %v, want 1", MetricNumRequestsWaiting, got)
	}
	wg.Wait()
	if status[0] != 200 || status[1] != 200 {
		t.Errorf("statuses %v", status)
	}
	wantOutcome(t, e, 2, 0, 0)
}

func TestSchedulingAbortWhileWaiting(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 1
	e, srv := startEngine(t, cfg)

	// The first request holds the only slot until its client leaves.
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	resp1, err := send(t, ctx1, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("stall-after=0"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp1.Body.Close() }()
	testutil.Eventually(t, time.Second, func() bool { return e.Stats().Running == 1 }, "first running")

	// The second and third wait; the second's client gives up while queued.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	done2 := make(chan error, 1)
	go func() {
		resp, err := send(t, ctx2, srv, "POST", "/v1/chat/completions", chatUnaryBody, nil)
		if err == nil {
			_ = resp.Body.Close()
		}
		done2 <- err
	}()
	testutil.Eventually(t, time.Second, func() bool { return e.Stats().Waiting == 1 }, "second waiting")
	done3 := make(chan int, 1)
	go func() {
		resp, err := send(t, nil, srv, "POST", "/v1/chat/completions", chatUnaryBody, nil)
		if err != nil {
			done3 <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		done3 <- resp.StatusCode
	}()
	testutil.Eventually(t, time.Second, func() bool { return e.Stats().Waiting == 2 }, "two waiting")

	cancel2()
	if err := <-done2; !errors.Is(err, context.Canceled) {
		t.Errorf("second request error = %v", err)
	}
	testutil.Eventually(t, time.Second, func() bool {
		s := e.Stats()
		return s.Aborted == 1 && s.Waiting == 1 && s.Running == 1
	}, "queued request aborted")

	cancel1() // frees the slot for the third request
	if got := <-done3; got != 200 {
		t.Errorf("third request status %d", got)
	}
	wantOutcome(t, e, 1, 2, 0)
}

func TestPrefixCache(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.TTFT = time.Millisecond
	cfg.TTFTPerPromptToken = 20 * time.Millisecond
	e, srv := startEngine(t, cfg)
	prompt := "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9" // 10 tokens: 2 full blocks + 2
	run := func(model, prompt string) time.Duration {
		t.Helper()
		start := time.Now()
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, model, prompt)
		resp := mustSend(t, srv, "POST", "/v1/completions", body, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		return time.Since(start)
	}
	steps := []struct {
		name          string
		model, prompt string
		queries, hits int64 // cumulative
	}{
		{"cold", "m1", prompt, 10, 0},
		{"repeat", "m1", prompt, 20, 8},
		{"other model", "m2", prompt, 30, 8},
		{"shared first block", "m1", "w0 w1 w2 w3 x4 x5 x6 x7", 38, 12},
		{"different first block", "m1", "x0 w1 w2 w3 w4 w5 w6 w7", 46, 12},
	}
	var cold, warm time.Duration
	for _, st := range steps {
		d := run(st.model, st.prompt)
		switch st.name {
		case "cold":
			cold = d
		case "repeat":
			warm = d
		}
		s := e.Stats()
		if s.PrefixCacheQueries != st.queries || s.PrefixCacheHits != st.hits {
			t.Errorf("%s: queries %d hits %d, want %d %d", st.name, s.PrefixCacheQueries, s.PrefixCacheHits, st.queries, st.hits)
		}
	}
	// Cold: 10 uncached tokens (>= 200ms). Warm: 2 uncached tokens (~40ms).
	if cold < 200*time.Millisecond || warm >= 150*time.Millisecond {
		t.Errorf("cold %v, warm %v: want cold >= 200ms and warm < 150ms", cold, warm)
	}
	mfs := testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")
	if got := counterValue(t, mfs, MetricPrefixCacheHits, "m1"); got != 12 {
		t.Errorf("%s{m1} = %v, want 12", MetricPrefixCacheHits, got)
	}
	if got := counterValue(t, mfs, MetricPrefixCacheQueries, "m2"); got != 10 {
		t.Errorf("%s{m2} = %v, want 10", MetricPrefixCacheQueries, got)
	}
	waitIdle(t, e, 0)
}

func TestPrefixCacheLRU(t *testing.T) {
	c := newPrefixCache(2, 3)
	words := func(s string) []string { return strings.Fields(s) }
	steps := []struct {
		prompt string
		want   int
	}{
		{"a b c d", 0},     // blocks ab, abcd cached
		{"a b c d", 2},     // both hit; the last block is computed again for its logits, as in vLLM
		{"e f", 0},         // ef cached; 3 blocks now
		{"g h", 0},         // gh cached: evicts abcd (a tail block is evicted before its head)
		{"a b c d", 2},     // only ab left
		{"a b x", 2},       // partial block never hashed
		{"x a b", 0},       // positions matter; evicts gh
		{"a b c d e f", 4}, // ab and abcd were touched again in steps 4 and 5; evicts xa
		{"x a", 0},         // evicted
		{"g h", 0},         // evicted
	}
	for i, st := range steps {
		if got := c.lookupAndInsert("m", words(st.prompt)); got != st.want {
			t.Errorf("step %d %q: cached %d, want %d", i, st.prompt, got, st.want)
		}
		if c.lru.Len() > 3 || len(c.index) != c.lru.Len() {
			t.Errorf("step %d: lru %d entries, index %d", i, c.lru.Len(), len(c.index))
		}
	}
}

func TestKVCacheUsage(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 2
	cfg.KVCacheBlocks = 4
	e, srv := startEngine(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// 3 prompt tokens + 2 generated = 5 tokens = 3 blocks of 2, then the sequence stalls.
	resp, err := send(t, ctx, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("stall-after=2"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	testutil.Eventually(t, time.Second, func() bool { return e.kvCacheUsage() == 0.75 }, "kv usage 0.75")
	if got := gaugeValue(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricKVCacheUsagePerc, "m1"); got != 0.75 {
		t.Errorf("%s = %v, want 0.75", MetricKVCacheUsagePerc, got)
	}

	// A second sequence pushes the total past capacity: usage is capped at 1.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	resp2, err := send(t, ctx2, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("stall-after=2"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp2.Body.Close() }()
	testutil.Eventually(t, time.Second, func() bool { return e.kvCacheUsage() == 1 && e.kvBlocks.Load() == 6 }, "kv usage capped at 1")

	cancel()
	cancel2()
	wantOutcome(t, e, 0, 2, 0)
	if got := e.kvCacheUsage(); got != 0 {
		t.Errorf("kv usage when idle = %v", got)
	}
}

// series returns the metric of family name whose labels include model_name=modelName and
// the extra label pairs.
func series(t *testing.T, mfs map[string]*dto.MetricFamily, name, modelName string, extra ...string) *dto.Metric {
	t.Helper()
	mf, ok := mfs[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	want := map[string]string{"model_name": modelName}
	for i := 0; i+1 < len(extra); i += 2 {
		want[extra[i]] = extra[i+1]
	}
	for _, m := range mf.GetMetric() {
		match := 0
		for _, lp := range m.GetLabel() {
			if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
				match++
			}
		}
		if match == len(want) {
			return m
		}
	}
	t.Fatalf("metric %s has no series with labels %v", name, want)
	return nil
}

func gaugeValue(t *testing.T, mfs map[string]*dto.MetricFamily, name, modelName string) float64 {
	t.Helper()
	return series(t, mfs, name, modelName).GetGauge().GetValue()
}

func counterValue(t *testing.T, mfs map[string]*dto.MetricFamily, name, modelName string, extra ...string) float64 {
	t.Helper()
	return series(t, mfs, name, modelName, extra...).GetCounter().GetValue()
}

func TestMetrics(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	for _, body := range []string{chatStreamBody, chatUnaryBody} {
		resp := mustSend(t, srv, "POST", "/v1/chat/completions", body, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	resp := mustSend(t, srv, "POST", "/v1/completions", `{"model":"m2","prompt":"x y"}`, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp = mustSend(t, srv, "POST", "/v1/embeddings", `{"model":"m2","input":["a b","c"]}`, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if resp, err := send(t, ctx, srv, "POST", "/v1/completions", `{"model":"m2","prompt":"x"}`, fault("stall-before-headers")); err == nil {
		_ = resp.Body.Close()
		t.Error("stalled request got a response")
	}
	resp = mustSend(t, srv, "POST", "/v1/completions", `{"model":"m2","prompt":"x"}`, fault("status=500"))
	_, _ = io.Copy(io.Discard, resp.Body)
	waitIdle(t, e, 0)

	mfs := testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")
	wantTypes := map[string]dto.MetricType{
		MetricNumRequestsRunning:  dto.MetricType_GAUGE,
		MetricNumRequestsWaiting:  dto.MetricType_GAUGE,
		MetricKVCacheUsagePerc:    dto.MetricType_GAUGE,
		MetricPrefixCacheQueries:  dto.MetricType_COUNTER,
		MetricPrefixCacheHits:     dto.MetricType_COUNTER,
		MetricRequestSuccess:      dto.MetricType_COUNTER,
		MetricPromptTokens:        dto.MetricType_COUNTER,
		MetricGenerationTokens:    dto.MetricType_COUNTER,
		MetricTimeToFirstToken:    dto.MetricType_HISTOGRAM,
		MetricAbortedRequests:     dto.MetricType_COUNTER,
		MetricFaultedRequests:     dto.MetricType_COUNTER,
		MetricEngineSleepState:    dto.MetricType_GAUGE,
		MetricNixlFailedTransfers: dto.MetricType_COUNTER,
		MetricNixlExpiredReqs:     dto.MetricType_COUNTER,
		MetricCacheConfigInfo:     dto.MetricType_GAUGE,
	}
	for name, typ := range wantTypes {
		mf, ok := mfs[name]
		if !ok {
			t.Errorf("metric %s missing", name)
			continue
		}
		if mf.GetType() != typ {
			t.Errorf("%s type %v, want %v", name, mf.GetType(), typ)
		}
	}
	if len(mfs) != len(wantTypes) {
		t.Errorf("got %d metric families, want %d (no global collectors)", len(mfs), len(wantTypes))
	}

	checks := []struct {
		name, model string
		extra       []string
		want        float64
	}{
		{MetricPromptTokens, "m1", nil, 6},     // 2 x "a b c"
		{MetricPromptTokens, "m2", nil, 2 + 3}, // completion, embeddings; the aborted and faulted ones never reached prefill
		{MetricGenerationTokens, "m1", nil, 8}, // 2 x max_tokens 4
		{MetricGenerationTokens, "m2", nil, DefaultOutputTokens},
		{MetricRequestSuccess, "m1", []string{"finished_reason", "length"}, 2},
		{MetricRequestSuccess, "m2", []string{"finished_reason", "stop"}, 2},
		{MetricRequestSuccess, "m2", []string{"finished_reason", "length"}, 0},
		{MetricPrefixCacheQueries, "m1", nil, 6},
		{MetricAbortedRequests, "m2", nil, 1},
		{MetricFaultedRequests, "m2", nil, 1},
		{MetricAbortedRequests, "m1", nil, 0},
	}
	for _, c := range checks {
		if got := counterValue(t, mfs, c.name, c.model, c.extra...); got != c.want {
			t.Errorf("%s{model_name=%s %v} = %v, want %v", c.name, c.model, c.extra, got, c.want)
		}
	}
	h := series(t, mfs, MetricTimeToFirstToken, "m1").GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 0.004 || h.GetSampleSum() > 5 {
		t.Errorf("TTFT histogram m1: count %d sum %v", h.GetSampleCount(), h.GetSampleSum())
	}
	if n := len(mfs[MetricKVCacheUsagePerc].GetMetric()); n != 1 {
		t.Errorf("%s has %d series, want 1", MetricKVCacheUsagePerc, n)
	}
	for _, m := range []string{"m1", "m2"} {
		if v := gaugeValue(t, mfs, MetricNumRequestsRunning, m); v != 0 {
			t.Errorf("running{%s} = %v", m, v)
		}
	}
}

func TestEngineConcurrentSafe(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 3
	cfg.KVCacheBlocks = 8
	cfg.BlockSize = 2
	e, srv := startEngine(t, cfg)
	specs := []string{"", "", "close-after=2", "status=500", "stall-after=1", "keepalive,trickle=0s", "reasoning=1,tool-call", "close-before-headers"}
	var wg sync.WaitGroup
	var answered atomic.Int64 // requests that got response headers
	for i := range 24 {
		wg.Go(func() {
			spec := specs[i%len(specs)]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond+time.Duration(i)*time.Millisecond)
			defer cancel()
			body := chatStreamBody
			if i%3 == 0 {
				body = chatUnaryBody
			}
			if i%5 == 0 {
				_ = e.SetFault(spec)
			}
			resp, err := send(t, ctx, srv, "POST", "/v1/chat/completions", body, fault(spec))
			if err != nil {
				return
			}
			answered.Add(1)
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			_ = e.Stats()
		})
	}
	wg.Wait()
	s := waitIdle(t, e, 0)
	// A client whose short deadline expires while it is still dialing
	// never reaches the engine (on a loaded machine that happens), so
	// Received is between the answered requests and 24; each received
	// request ended exactly one way.
	if s.Received < answered.Load() || s.Received > 24 || s.Received != s.Completed+s.Aborted+s.Faulted {
		t.Errorf("stats %+v, %d answered", s, answered.Load())
	}
	if math.IsNaN(e.kvCacheUsage()) || e.kvCacheUsage() != 0 {
		t.Errorf("kv usage %v", e.kvCacheUsage())
	}
}
