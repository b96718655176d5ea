package enginesim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// words returns a prompt of n distinct words (n uncached tokens on a fresh engine).
func words(prefix string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return strings.Join(w, " ")
}

// interfConfig is an engine with prefill interference (when on) and a step budget of 33
// tokens: beside one decoding stream a prompt is prefilled 32 tokens a step.
func interfConfig(on bool) Config {
	cfg := fastConfig()
	cfg.TTFT = 2 * time.Millisecond
	cfg.ITL = time.Millisecond
	cfg.TTFTPerPromptToken = 10 * time.Microsecond
	cfg.MaxNumSeqs = 4
	cfg.MaxNumBatchedTokens = 33
	cfg.PrefillInterference = on
	return cfg
}

// decodingStream starts a stream of 8 tokens (7 inter-token waits) on srv whose first
// inter-token wait blocks in log's hook until the returned release function runs; it
// returns once that wait is blocked (so the stream decodes) and, from release, the
// stream's data events.
func decodingStream(t *testing.T, srv *httptest.Server, log *delayLog) (release func() []string) {
	t.Helper()
	log.mu.Lock()
	log.gate, log.gated, log.release = true, make(chan struct{}), make(chan struct{})
	log.mu.Unlock()
	done := make(chan []string, 1)
	go func() {
		resp, err := send(t, nil, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"a","max_tokens":8,"stream":true}`, nil)
		if err != nil {
			t.Error(err)
			done <- nil
			return
		}
		defer func() { _ = resp.Body.Close() }()
		evs, err := readEvents(resp.Body)
		if err != nil {
			t.Error(err)
		}
		done <- dataEvents(evs)
	}()
	select {
	case <-log.gated:
	case <-time.After(5 * time.Second):
		t.Fatal("the decoding stream never reached its first inter-token wait")
	}
	return func() []string {
		close(log.release)
		return <-done
	}
}

// runBeside runs a decoding stream on srv, sends second (a request that computes one
// wait of kind first: its prefill or KV pull) once the stream decodes, lets the stream go
// on once that wait is computed and returns every wait the engine computed, with the
// second request's response body.
func runBeside(t *testing.T, srv *httptest.Server, log *delayLog, path, second string, first delayKind) ([]delayRec, string) {
	t.Helper()
	release := decodingStream(t, srv, log)
	count := func() int {
		log.mu.Lock()
		defer log.mu.Unlock()
		n := 0
		for _, r := range log.recs {
			if r.kind == first {
				n++
			}
		}
		return n
	}
	before := count() // the stream's own prefill is a delayTTFT too
	body := make(chan string, 1)
	go func() {
		resp, err := send(t, nil, srv, "POST", path, second, nil)
		if err != nil {
			t.Error(err)
			body <- ""
			return
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		body <- string(b)
	}()
	testutil.Eventually(t, 5*time.Second, func() bool { return count() > before }, "second request's first wait computed")
	if evs := release(); len(evs) != 10 { // 8 tokens, finish, [DONE]
		t.Errorf("decoding stream: %q", evs)
	}
	return log.take(), <-body
}

// TestPrefillInterference: a long prompt's prefill beside a decoding stream stretches the
// stream's decode steps by the compute of each chunk, for exactly ceil(P/left) steps; with
// the model off the same scenario leaves the stream's ITL alone.
func TestPrefillInterference(t *testing.T) {
	ms, us := time.Millisecond, time.Microsecond
	const p = 100 // uncached prompt tokens; chunks of 33-1 = 32: 32, 32, 32, 4
	long := `{"model":"m2","prompt":"` + words("w", p) + `","max_tokens":1,"stream":true}`
	for _, tc := range []struct {
		on   bool
		itls []time.Duration // the stream's 6 waits after its gated first one
	}{
		{true, []time.Duration{ms + 320*us, ms + 320*us, ms + 320*us, ms + 40*us, ms, ms}},
		{false, []time.Duration{ms, ms, ms, ms, ms, ms}},
	} {
		t.Run(fmt.Sprintf("on=%v", tc.on), func(t *testing.T) {
			log := &delayLog{}
			e, srv := startEngineWith(t, interfConfig(tc.on), func(e *Engine) { e.onDelay = log.hook })
			got, _ := runBeside(t, srv, log, "/v1/completions", long, delayTTFT)
			// The stream's prefill, its first ITL (computed before the long prompt came), the
			// long prompt's prefill (unchanged: TTFT + P x 10us), then the stream's ITLs.
			want := []delayRec{{delayTTFT, 2*ms + 10*us}, {delayITL, ms}, {delayTTFT, 2*ms + p*10*us}}
			for _, d := range tc.itls {
				want = append(want, delayRec{delayITL, d})
			}
			if !slices.Equal(got, want) {
				t.Errorf("waits\n got %v\nwant %v", got, want)
			}
			waitIdle(t, e, 0)
			if e.interf != nil && (len(e.interf.jobs) != 0 || len(e.interf.decoders) != 0) {
				t.Errorf("interference state left: %d jobs, %d decoders", len(e.interf.jobs), len(e.interf.decoders))
			}
		})
	}
}

// TestPrefillInterferenceDecodeLeg: a decode leg of prefill/decode pulls its prompt's KV
// and computes nothing, so it stretches no stream decoding beside it.
func TestPrefillInterferenceDecodeLeg(t *testing.T) {
	pp := startPD(t, func(c *Config) {
		on := interfConfig(true)
		c.TTFT, c.ITL, c.TTFTPerPromptToken = on.TTFT, on.ITL, on.TTFTPerPromptToken
		c.MaxNumSeqs, c.MaxNumBatchedTokens, c.PrefillInterference = on.MaxNumSeqs, on.MaxNumBatchedTokens, true
	})
	cmpl := `{"model":"m2","prompt":"` + pdPrompt + `","max_tokens":1`
	_, kv := prefill(t, pp.psrv, "/v1/completions", cmpl, nil)
	got, body := runBeside(t, pp.dsrv, pp.dlog, "/v1/completions", decodeLeg(cmpl, kv), delayKVTransfer)
	ms := time.Millisecond
	want := []delayRec{{delayTTFT, 2*ms + 10*time.Microsecond}, {delayITL, ms}, {delayKVTransfer, pdPromptTokens * time.Microsecond}}
	for range 6 {
		want = append(want, delayRec{delayITL, ms})
	}
	if !slices.Equal(got, want) {
		t.Errorf("waits\n got %v\nwant %v", got, want)
	}
	if !strings.Contains(body, `"cached_tokens":20`) {
		t.Errorf("decode leg body %s", body)
	}
	if s := pp.d.Stats(); s.KVPulled != 1 || s.KVRecomputed != 0 {
		t.Errorf("decode engine stats %+v", s)
	}
	waitIdle(t, pp.d, 0)
}

// TestPrefillInterferenceAlone: with nothing else running, the model changes no wait of a
// long prompt: its prefill is TTFT + P x TTFTPerPromptToken and its ITLs are ITL.
func TestPrefillInterferenceAlone(t *testing.T) {
	ms, us := time.Millisecond, time.Microsecond
	body := `{"model":"m1","prompt":"` + words("x", 100) + `","max_tokens":3,"stream":true}`
	want := []delayRec{{delayTTFT, 2*ms + 100*10*us}, {delayITL, ms}, {delayITL, ms}}
	for _, on := range []bool{true, false} {
		log := &delayLog{}
		e, srv := startEngineWith(t, interfConfig(on), func(e *Engine) { e.onDelay = log.hook })
		resp := mustSend(t, srv, "POST", "/v1/completions", body, nil)
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		if got := log.take(); !slices.Equal(got, want) {
			t.Errorf("on=%v: waits %v, want %v", on, got, want)
		}
		waitIdle(t, e, 0)
	}
}

// TestInterferenceModel drives the model directly: the budget left after the decoders,
// one chunk per decode step for every decoder, late joiners at the job's step, a cut
// prefill ending the job, overlapping prefills adding up.
func TestInterferenceModel(t *testing.T) {
	us := time.Microsecond
	cfg := Config{PrefillInterference: true, MaxNumBatchedTokens: 10, TTFTPerPromptToken: us}
	in := newInterference(&cfg)
	steps := func(d *decoder, n int) []time.Duration {
		var out []time.Duration
		for range n {
			out = append(out, in.stretch(d))
		}
		return out
	}
	a, b := in.startDecode(), in.startDecode()
	j := in.startPrefill(25) // left 8: 8, 8, 8, 1
	if got, want := steps(a, 2), []time.Duration{8 * us, 8 * us}; !slices.Equal(got, want) {
		t.Errorf("a: %v, want %v", got, want)
	}
	c := in.startDecode() // joins at step 2
	if got, want := steps(c, 3), []time.Duration{8 * us, us, 0}; !slices.Equal(got, want) {
		t.Errorf("late joiner c: %v, want %v", got, want)
	}
	in.endPrefill(j, false) // finished: a and b go on through their chunks
	if got, want := steps(b, 5), []time.Duration{8 * us, 8 * us, 8 * us, us, 0}; !slices.Equal(got, want) {
		t.Errorf("b: %v, want %v", got, want)
	}
	if got, want := steps(a, 3), []time.Duration{8 * us, us, 0}; !slices.Equal(got, want) {
		t.Errorf("a after the prefill: %v, want %v", got, want)
	}
	if len(in.jobs) != 0 {
		t.Errorf("%d jobs left", len(in.jobs))
	}

	// Two prefills at once take turns: a step carries the first one's chunk (it fills the
	// step's room of 7), the second one's waits; a cut one stops at once, and the second
	// one's chunk follows.
	j1, j2 := in.startPrefill(14), in.startPrefill(3) // left 7: 7, 7 and 3
	if got, want := steps(a, 1), []time.Duration{7 * us}; !slices.Equal(got, want) {
		t.Errorf("two prefills: %v, want %v", got, want)
	}
	in.endPrefill(j1, true)
	if got, want := steps(a, 2), []time.Duration{3 * us, 0}; !slices.Equal(got, want) {
		t.Errorf("after the cut: %v, want %v", got, want)
	}
	in.endPrefill(j2, false)
	for _, d := range []*decoder{a, b, c} {
		in.endDecode(d)
	}
	if len(in.jobs) != 0 || len(in.decoders) != 0 {
		t.Errorf("left: %d jobs, %d decoders", len(in.jobs), len(in.decoders))
	}
	// Nothing computed, or the model off: no job, no decoder, no stretch.
	if in.startPrefill(0) != nil {
		t.Error("a prefill of 0 tokens made a job")
	}
	var off *interference
	if off.startPrefill(5) != nil || off.startDecode() != nil || off.stretch(nil) != 0 {
		t.Error("the nil model did something")
	}
}

func TestConfigValidateBatchedTokens(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxNumBatchedTokens: -1}, "max num batched tokens must not be negative"},
		{Config{PrefillInterference: true, MaxNumBatchedTokens: 8, MaxNumSeqs: 9}, "max num batched tokens (8) must be greater than or equal to max num seqs (9)"},
		{Config{PrefillInterference: true, MaxNumSeqs: 4096}, "max num batched tokens (2048) must be greater than or equal to max num seqs (4096)"},
		{Config{MaxNumBatchedTokens: 8, MaxNumSeqs: 9}, ""}, // off: not checked
		{Config{PrefillInterference: true}, ""},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestPrefillInterferenceStalledStream: a stream stalled by stall-after decodes no more,
// so it leaves the model: a prefill that runs after it holds no job once done (a stalled
// stream that stayed registered would keep every later prefill's job, and its cursors,
// until its client left).
func TestPrefillInterferenceStalledStream(t *testing.T) {
	e, srv := startEngineWith(t, interfConfig(true), func(*Engine) {})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := send(t, ctx, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"a","max_tokens":8,"stream":true}`,
		map[string]string{FaultHeader: "stall-after=1"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	// The first content event: the stream decoded, then stalls.
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"text":"tok0 "`) {
			break
		}
	}
	jobs := func() (int, int) {
		e.interf.mu.Lock()
		defer e.interf.mu.Unlock()
		return len(e.interf.jobs), len(e.interf.decoders)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { _, d := jobs(); return d == 0 }, "the stalled stream left the model")
	long := mustSend(t, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"`+words("x", 100)+`","max_tokens":2}`, nil)
	if b, _ := io.ReadAll(long.Body); long.StatusCode != 200 {
		t.Fatalf("long prompt: %d %s", long.StatusCode, b)
	}
	if j, d := jobs(); j != 0 || d != 0 {
		t.Errorf("after the long prefill: %d jobs and %d decoders held, want none", j, d)
	}
	cancel()
	waitIdle(t, e, 0)
}

// TestQueuePrefill checks that prompts share an engine's compute in arrival order: a
// prefill waits for the prompt tokens reserved before it to be computed, none once they are
// done, and the model off (nil) never waits.
func TestQueuePrefill(t *testing.T) {
	in := &interference{perToken: time.Millisecond}
	t0 := time.Unix(1000, 0)
	for _, step := range []struct {
		uncached int
		at       time.Duration
		want     time.Duration
	}{
		{100, 0, 0}, // alone: computed 0..100 ms
		{50, 10 * time.Millisecond, 90 * time.Millisecond}, // after the first: 100..150 ms
		{20, 120 * time.Millisecond, 30 * time.Millisecond},
		{10, 300 * time.Millisecond, 0}, // the engine is idle again
		{0, 300 * time.Millisecond, 0},  // nothing to compute: no turn
	} {
		if got := in.queuePrefill(step.uncached, t0.Add(step.at)); got != step.want {
			t.Errorf("%d tokens at %v: wait %v, want %v", step.uncached, step.at, got, step.want)
		}
	}
	var off *interference
	if got := off.queuePrefill(100, t0); got != 0 {
		t.Errorf("model off: wait %v", got)
	}
}
