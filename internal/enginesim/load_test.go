package enginesim

import (
	"bufio"
	"context"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestLatencyFor(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name              string
		cfg               Config
		uncached, running int
		wantTTFT, wantITL time.Duration
	}{
		{"off, idle", Config{TTFT: 20 * ms, ITL: 10 * ms}, 0, 1, 20 * ms, 10 * ms},
		{"off, loaded", Config{TTFT: 20 * ms, ITL: 10 * ms}, 0, 50, 20 * ms, 10 * ms},
		{"defaults, loaded", Config{}, 0, 50, DefaultTTFT, DefaultITL},
		{"alone", Config{TTFT: 20 * ms, ITL: 10 * ms, TTFTPerRunning: 5 * ms, ITLPerRunning: 2 * ms}, 0, 1, 20 * ms, 10 * ms},
		{"no one running", Config{TTFT: 20 * ms, ITL: 10 * ms, TTFTPerRunning: 5 * ms, ITLPerRunning: 2 * ms}, 0, 0, 20 * ms, 10 * ms},
		{"three others", Config{TTFT: 20 * ms, ITL: 10 * ms, TTFTPerRunning: 5 * ms, ITLPerRunning: 2 * ms}, 0, 4, 35 * ms, 16 * ms},
		{"with uncached prompt", Config{TTFT: 20 * ms, TTFTPerPromptToken: ms, TTFTPerRunning: 5 * ms, ITLPerRunning: 2 * ms}, 7, 3, 37 * ms, DefaultITL + 4*ms},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.ttftFor(tc.uncached, tc.running); got != tc.wantTTFT {
				t.Errorf("ttftFor(%d, %d) = %v, want %v", tc.uncached, tc.running, got, tc.wantTTFT)
			}
			if got := e.itlFor(tc.running); got != tc.wantITL {
				t.Errorf("itlFor(%d) = %v, want %v", tc.running, got, tc.wantITL)
			}
		})
	}
}

func TestConfigValidatePerRunning(t *testing.T) {
	err := Config{TTFTPerRunning: -1, ITLPerRunning: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "ttft per running must not be negative") ||
		!strings.Contains(err.Error(), "itl per running must not be negative") {
		t.Errorf("Validate() = %v, want both per-running errors", err)
	}
}

// delayRec is one wait computed by the engine, as seen by the onDelay hook.
type delayRec struct {
	kind delayKind
	d    time.Duration
}

// delayLog records the engine's computed waits. When gate is set, the first ITL recorded
// after it was set closes gated and blocks that request until release is closed.
type delayLog struct {
	mu      sync.Mutex
	recs    []delayRec
	gate    bool
	gated   chan struct{}
	release chan struct{}
}

func (l *delayLog) hook(k delayKind, d time.Duration) {
	l.mu.Lock()
	l.recs = append(l.recs, delayRec{k, d})
	block := l.gate && k == delayITL
	if block {
		l.gate = false
	}
	l.mu.Unlock()
	if block {
		close(l.gated)
		<-l.release
	}
}

// take returns the records so far and clears them.
func (l *delayLog) take() []delayRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.recs
	l.recs = nil
	return r
}

func (l *delayLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.recs)
}

// TestLoadDependentLatency checks over HTTP that the prefill wait grows with the sequences
// running (all models) when prefill starts and that the ITL is recomputed at each token. It
// asserts the waits the engine computes (the onDelay hook), not wall-clock durations, except
// for one lower bound, which timers guarantee.
func TestLoadDependentLatency(t *testing.T) {
	ms := time.Millisecond
	cfg := fastConfig()
	cfg.TTFT = 2 * ms
	cfg.ITL = ms
	cfg.TTFTPerRunning = 50 * ms
	cfg.ITLPerRunning = 20 * ms
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	log := &delayLog{}
	e.onDelay = log.hook
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)

	const probe = `{"model":"m2","prompt":"p q r","max_tokens":4,"stream":true}`
	// runProbe streams probe to the end and returns the time to its first token event.
	runProbe := func() time.Duration {
		t.Helper()
		start := time.Now()
		resp := mustSend(t, srv, "POST", "/v1/completions", probe, nil)
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatalf("first event: %v", err)
		}
		first := time.Since(start)
		evs, err := readEvents(br)
		if err != nil || len(dataEvents(evs)) != 5 { // 3 more tokens, finish, [DONE]
			t.Fatalf("probe stream: %v, %q", err, dataEvents(evs))
		}
		return first
	}
	want := func(what string, got []delayRec, ttft time.Duration, itls ...time.Duration) {
		t.Helper()
		exp := []delayRec{{delayTTFT, ttft}}
		for _, d := range itls {
			exp = append(exp, delayRec{delayITL, d})
		}
		if !slices.Equal(got, exp) {
			t.Errorf("%s: waits %v, want %v", what, got, exp)
		}
	}

	// Alone: the base latencies.
	runProbe()
	want("alone", log.take(), 2*ms, ms, ms, ms)

	// Two holders on the other model run (stalled after prefill) for the rest of the test.
	// Each is started once the previous one has computed its prefill wait, so the first saw
	// itself alone and the second saw one other.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		resp, err := send(t, ctx, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("stall-after=0"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		testutil.Eventually(t, 2*time.Second, func() bool { return log.len() == i+1 }, "holder %d prefill computed", i)
	}
	testutil.Eventually(t, 2*time.Second, func() bool { return e.Stats().Running == 2 }, "two running")
	if got, exp := log.take(), []delayRec{{delayTTFT, 2 * ms}, {delayTTFT, 52 * ms}}; !slices.Equal(got, exp) {
		t.Errorf("holders: waits %v, want %v", got, exp)
	}

	// Embeddings take the prefill term too.
	resp := mustSend(t, srv, "POST", "/v1/embeddings", `{"model":"m2","input":"x"}`, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	if got, exp := log.take(), []delayRec{{delayTTFT, 102 * ms}}; !slices.Equal(got, exp) {
		t.Errorf("embeddings with 2 others: waits %v, want %v", got, exp)
	}

	// With two others running, the probe's prefill and ITL grow. Its first ITL blocks in the
	// hook until the holders are gone, so the later ITLs see it alone again.
	log.mu.Lock()
	log.gate, log.gated, log.release = true, make(chan struct{}), make(chan struct{})
	log.mu.Unlock()
	go func() {
		<-log.gated
		cancel()
		if !testutil.Poll(2*time.Second, func() bool { return e.Stats().Running == 1 }) {
			t.Error("timed out waiting for the holders to go")
		}
		close(log.release)
	}()
	first := runProbe()
	want("loaded, then alone", log.take(), 102*ms, 41*ms, ms, ms)
	if first < 102*ms {
		t.Errorf("time to first token with 2 others = %v, want >= 102ms", first)
	}
	wantOutcome(t, e, 3, 2, 0)
}
