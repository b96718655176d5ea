package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

const retryChat = `{"model":"m","stream":%t,"max_tokens":4,"messages":[{"role":"user","content":"a b c"}]}`

// retryHarness has two engines serving m, e1 answering with fault1 and e2
// with fault2 ("" = healthy), round-robin from e1, and the gateway's
// release reports collected per engine.
type retryHarness struct {
	*harness
	e1, e2 *enginesim.Engine
	mu     sync.Mutex
	rel    map[string][]routing.Phase
}

func newRetryHarness(t *testing.T, fault1, fault2 string, tune func(*Config)) *retryHarness {
	t.Helper()
	e1, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: fault1})
	e2, s2 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: fault2})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
	cfg.Retry.Backoff = time.Millisecond
	if tune != nil {
		tune(&cfg)
	}
	rh := &retryHarness{harness: newHarness(t, cfg), e1: e1, e2: e2, rel: map[string][]routing.Phase{}}
	rh.gw.onRelease = func(engine string, p routing.Phase) {
		rh.mu.Lock()
		rh.rel[engine] = append(rh.rel[engine], p)
		rh.mu.Unlock()
	}
	return rh
}

// checkHandOver checks the slots of an answer begun on engine from and
// finished on engine to by a continuation: one release on each, the
// second from decode (the continuation produced tokens there).
func (rh *retryHarness) checkHandOver(t *testing.T, from, to string) {
	t.Helper()
	if rel := rh.releases(); len(rel[from]) != 1 || len(rel[to]) != 1 || rel[to][0] != routing.PhaseDecode {
		t.Errorf("releases %v, want one on %s and one from decode on %s", rel, from, to)
	}
}

func (rh *retryHarness) releases() map[string][]routing.Phase {
	rh.mu.Lock()
	defer rh.mu.Unlock()
	out := map[string][]routing.Phase{}
	for k, v := range rh.rel {
		out[k] = append([]routing.Phase(nil), v...)
	}
	return out
}

// attemptSpans returns the engine attempt spans' engine names in start order.
func (rh *retryHarness) attemptSpans() []string {
	var out []string
	for _, s := range rh.spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "switchboard.engine" {
				out = append(out, kv.Value.AsString())
			}
		}
	}
	return out
}

func readBodyT(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// TestRetry503ThenSuccessOnAnotherEngine: e1 answers 503, the request goes
// to e2 and succeeds: the client gets one 200 (and, streaming, one whole
// stream), there are two attempt spans, each engine released one slot, and
// the retries counter says 1 for reason 503.
func TestRetry503ThenSuccessOnAnotherEngine(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			rh := newRetryHarness(t, "status=503", "", nil)
			resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, stream))
			body := readBodyT(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200: %s", resp.StatusCode, body)
			}
			if got := resp.Header.Get("X-Switchboard-Engine"); got != "e2" {
				t.Errorf("served by %q, want e2", got)
			}
			if stream && (strings.Count(body, "data: [DONE]") != 1 || strings.Contains(body, `"error"`)) {
				t.Errorf("stream is not one clean stream: %q", body)
			}
			rh.waitIdle()
			rel := rh.releases()
			if len(rel["e1"]) != 1 || len(rel["e2"]) != 1 || rel["e1"][0] != routing.PhasePrefill {
				t.Errorf("releases %v, want one on each engine (e1 from prefill)", rel)
			}
			if spans := rh.attemptSpans(); strings.Join(spans, ",") != "e1,e2" {
				t.Errorf("attempt spans on %v, want e1 then e2", spans)
			}
			if n := rh.counter(telemetry.RetriesName); n != 1 {
				t.Errorf("retries = %d, want 1", n)
			}
			if et := rh.errorTypes(); et["503"] != 1 || et[""] != 1 || len(et) != 2 {
				t.Errorf("attempt outcomes %v, want one 503 and one success", et)
			}
			if g := rh.e1.Stats().Received + rh.e2.Stats().Received; g != 2 {
				t.Errorf("engines received %d requests, want 2", g)
			}
		})
	}
}

// TestRetry429HonoursRetryAfter: the only engine answers 429 with
// Retry-After: 1; the gateway waits it out (the cap is 2 s) and asks again,
// and succeeds when the engine has recovered; a Retry-After over the cap
// is passed to the client at once, without a retry.
func TestRetry429HonoursRetryAfter(t *testing.T) {
	e1, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}})
	cfg.Retry.RetryAfterCap = 2 * time.Second
	h := newHarness(t, cfg)

	// 429 with Retry-After: 1, then recovered: the retry waits the second
	// out and gets the 200.
	if err := e1.SetFault("status=429,retry-after=1"); err != nil {
		t.Fatal(err)
	}
	before := e1.Stats().Received
	recovered := make(chan struct{})
	go func() {
		defer close(recovered)
		testutil.Poll(2*time.Second, func() bool { return e1.Stats().Received != before })
		_ = e1.SetFault("")
	}()
	start := time.Now()
	resp := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
	body := readBodyT(t, resp)
	took := time.Since(start)
	<-recovered
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200 after one 429: %s", resp.StatusCode, body)
	}
	if took < time.Second {
		t.Errorf("answered after %v: the engine's Retry-After (1 s) was not waited out", took)
	}
	if n := e1.Stats().Received - before; n != 2 {
		t.Errorf("engine received %d, want 2", n)
	}
	if n := h.counter(telemetry.RetriesName); n != 1 {
		t.Errorf("retries = %d, want 1", n)
	}
	h.waitIdle()

	// Over the cap: no wait, no retry, the engine's 429 and Retry-After
	// passed through.
	before = e1.Stats().Received
	start = time.Now()
	resp = h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false), enginesim.FaultHeader, "status=429,retry-after=30")
	_ = readBodyT(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" {
		t.Errorf("status %d Retry-After %q, want 429 and 30", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if n := e1.Stats().Received - before; n != 1 {
		t.Errorf("engine received %d, want 1 (a Retry-After over the cap is not waited)", n)
	}
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("took %v, want an answer at once", d)
	}
	h.waitIdle()
}

// TestRetryEveryAttemptFails: both engines answer 503: the client gets the
// last engine's 503 in an OpenAI error object (never a 200), after exactly
// max_attempts attempts, each released once.
func TestRetryEveryAttemptFails(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			rh := newRetryHarness(t, "status=503", "status=503", func(c *Config) { c.MaxAttempts = 3 })
			resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, stream))
			body := readBodyT(t, resp)
			if resp.StatusCode != 503 {
				t.Fatalf("status %d, want 503: %s", resp.StatusCode, body)
			}
			var e apiErr
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
				t.Errorf("body %q is not an OpenAI error object", body)
			}
			rh.waitIdle()
			rel := rh.releases()
			if n := len(rel["e1"]) + len(rel["e2"]); n != 3 {
				t.Errorf("releases %v, want 3 (max_attempts)", rel)
			}
			if et := rh.errorTypes(); et["503"] != 3 {
				t.Errorf("attempt outcomes %v, want three 503", et)
			}
			// Two engines, three attempts: e1, e2, then e2 again (the only
			// one left) after a back-off.
			if spans := rh.attemptSpans(); strings.Join(spans, ",") != "e1,e2,e2" {
				t.Errorf("attempt spans on %v, want e1,e2,e2", spans)
			}
		})
	}
}

// TestNoRetryAfterContent: e1 dies after its first tokens reached the
// client: the client gets those tokens once and a final error event, and
// no other engine is asked.
func TestNoRetryAfterContent(t *testing.T) {
	rh := newRetryHarness(t, "close-after=2", "", func(c *Config) {
		c.MaxAttempts = 3
		c.Retry.On = []string{"connect-failure", "reset", "header-timeout", "429", "500", "502", "503", "504"}
		c.Timeouts.ResponseHeader = time.Second
		c.Migration.Limit = 0 // a retry, not a continuation (TestContinuationCompletesAnswer)
	})
	resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, true))
	body := readBodyT(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if !strings.Contains(body, `data: {"error":`) || strings.Contains(body, "[DONE]") {
		t.Errorf("want a final error event and no [DONE]: %q", body)
	}
	if n := strings.Count(body, `"content":"tok`); n == 0 || n > 2 {
		t.Errorf("%d content events, want the 1-2 sent before the engine died, once", n)
	}
	rh.waitIdle()
	if n := rh.e2.Stats().Received; n != 0 {
		t.Errorf("e2 received %d requests, want 0 (no retry after content)", n)
	}
	if n := rh.counter(telemetry.RetriesName); n != 0 {
		t.Errorf("retries = %d, want 0", n)
	}
}

// TestRetryBudgetStopsStorm: every engine fails, and the budget lets one
// request retry at a time (budget_min 1, ratio 0). Of 8 concurrent
// requests allowed 4 attempts each, only those that find the share free
// retry; the others stop after their first attempt and are counted as
// refused by the budget, so the engines see far fewer than 8 x 4 attempts.
func TestRetryBudgetStopsStorm(t *testing.T) {
	rh := newRetryHarness(t, "stall-before-headers=50ms,status=503", "stall-before-headers=50ms,status=503", func(c *Config) {
		c.MaxAttempts = 4
		c.Retry.BudgetMin = 1
		c.Retry.BudgetRatio = 0
		c.Outlier.Enabled = false // the budget alone, not ejections, stops the storm here
	})
	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
			_ = readBodyT(t, resp)
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	rh.waitIdle()
	for i, s := range statuses {
		if s != 503 {
			t.Errorf("request %d: status %d, want 503", i, s)
		}
	}
	attempts := rh.e1.Stats().Received + rh.e2.Stats().Received
	retries := rh.counter(telemetry.RetriesName)
	refused := rh.counter(telemetry.RetryBudgetExhaustedName)
	if attempts != n+retries {
		t.Errorf("attempts %d, want requests + retries = %d", attempts, n+retries)
	}
	// Without a budget: n x 4 attempts. With it, every request but those
	// holding the one share stops after its first attempt.
	if attempts >= n*2 {
		t.Errorf("attempts %d: the budget did not stop the storm (no budget: %d)", attempts, n*4)
	}
	if refused == 0 {
		t.Errorf("no retry was refused by the budget")
	}
	if got := rh.gw.retries.retrying.Load(); got != 0 {
		t.Errorf("retry budget held by %d requests after all ended, want 0", got)
	}
}

// TestRetryTimeBudget: no attempt starts after server.retry.within: with a
// 100 ms budget and engines that take 150 ms to answer 503, there is no
// second attempt.
func TestRetryTimeBudget(t *testing.T) {
	rh := newRetryHarness(t, "stall-before-headers=150ms,status=503", "", func(c *Config) { c.Retry.Within = 100 * time.Millisecond })
	resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
	_ = readBodyT(t, resp)
	if resp.StatusCode != 503 {
		t.Errorf("status %d, want e1's 503 (no time left to retry)", resp.StatusCode)
	}
	rh.waitIdle()
	if n := rh.e2.Stats().Received; n != 0 {
		t.Errorf("e2 received %d, want 0", n)
	}
}

// TestCircuitBreakerMaxInFlight: e1 allows one request in flight; while one
// is generating there, the next goes to e2 even though round-robin would
// pick e1; with both full, 503 with Retry-After at once, and no slot taken.
func TestCircuitBreakerMaxInFlight(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 300 * time.Millisecond})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 300 * time.Millisecond})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}, MaxInFlight: 1},
		fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}, MaxInFlight: 1})
	h := newHarness(t, cfg, withPolicy(routing.NewLeastLoaded(1)))
	var wg sync.WaitGroup
	served := make([]string, 2)
	for i := range 2 {
		wg.Go(func() {
			resp := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
			_ = readBodyT(t, resp)
			served[i] = resp.Header.Get("X-Switchboard-Engine")
		})
		// Wait until the request holds its slot.
		testutil.Poll(2*time.Second, func() bool {
			g := h.gauges()
			return g["e1/prefill"]+g["e2/prefill"]+g["e1/decode"]+g["e2/decode"] == int64(i+1)
		})
	}
	start := time.Now()
	resp := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
	body := readBodyT(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("with both engines full: status %d Retry-After %q, want 503 with Retry-After: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("the 503 took %v, want it at once", d)
	}
	wg.Wait()
	if served[0] == served[1] || served[0] == "" {
		t.Errorf("served by %v, want one request on each engine", served)
	}
	h.waitIdle()
}

// TestMaxPendingPerModel: with a pending limit of 1 per model, a second
// request for m while a non-streaming one is in flight (it shows no first
// token) is answered 503 at once, while a request for m2 on the same engine
// is not; a stream that has had its first token no longer counts; and the
// counters are back to 0 at the end.
func TestMaxPendingPerModel(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m", "m2"}, TTFT: 300 * time.Millisecond, ITL: 50 * time.Millisecond})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m", "m2"}})
	cfg.MaxPendingPerModel = 1
	h := newHarness(t, cfg)
	waitGauge := func(key string, want int64) {
		t.Helper()
		testutil.Poll(3*time.Second, func() bool { return h.gauges()[key] == want })
		if got := h.gauges()[key]; got != want {
			t.Fatalf("%s = %d, want %d", key, got, want)
		}
	}
	done := make(chan int, 1)
	go func() {
		resp := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
		_ = readBodyT(t, resp)
		done <- resp.StatusCode
	}()
	waitGauge("e1/prefill", 1)
	resp := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
	_ = readBodyT(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second request for m: status %d Retry-After %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	resp = h.post("/v1/chat/completions", strings.Replace(fmt.Sprintf(retryChat, false), `"model":"m"`, `"model":"m2"`, 1))
	_ = readBodyT(t, resp)
	if resp.StatusCode != 200 {
		t.Errorf("request for m2 meanwhile: status %d, want 200 (pending is counted per model)", resp.StatusCode)
	}
	if s := <-done; s != 200 {
		t.Errorf("first request: status %d, want 200", s)
	}
	h.waitIdle()

	// A stream past its first token: m has nothing pending.
	resp = h.post("/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":30,"messages":[{"role":"user","content":"x"}]}`)
	waitGauge("e1/decode", 1)
	second := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, false))
	_ = readBodyT(t, second)
	if second.StatusCode != 200 {
		t.Errorf("request for m while a stream decodes: status %d, want 200", second.StatusCode)
	}
	_ = readBodyT(t, resp)
	h.waitIdle()
	for _, m := range []string{"m", "m2"} {
		if n := h.gw.pendingFor(m).Load(); n != 0 {
			t.Errorf("pending[%s] = %d after every request ended, want 0", m, n)
		}
	}
}

// TestRetryAfterParse covers the two forms of Retry-After.
func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false}, {"3", 3 * time.Second, true}, {"0", 0, true}, {"-1", 0, false}, {"soon", 0, false},
		{now.Add(5 * time.Second).Format(http.TimeFormat), 5 * time.Second, true},
		{now.Add(-5 * time.Second).Format(http.TimeFormat), 0, true},
	} {
		h := http.Header{}
		if tc.v != "" {
			h.Set("Retry-After", tc.v)
		}
		got, ok := retryAfter(h, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// TestRetryConfigValidate rejects unknown conditions and out-of-range budgets.
func TestRetryConfigValidate(t *testing.T) {
	good := DefaultRetryConfig()
	if errs := good.validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	for _, tc := range []func(*RetryConfig){
		func(c *RetryConfig) { c.On = []string{"5xx"} },
		func(c *RetryConfig) { c.BudgetRatio = 1.5 },
		func(c *RetryConfig) { c.BudgetMin = -1 },
		func(c *RetryConfig) { c.Within = -time.Second },
		func(c *RetryConfig) { c.Backoff = -time.Millisecond },
		func(c *RetryConfig) { c.RetryAfterCap = -time.Second },
	} {
		c := DefaultRetryConfig()
		tc(&c)
		if errs := c.validate(); len(errs) != 1 {
			t.Errorf("%+v: %d errors, want 1", c, len(errs))
		}
	}
}

// TestRetryFirstTokenTimeout: with first-token-timeout in retry.on, e1 sends
// its headers and role chunk and then nothing; the client has received
// nothing when the first-token deadline passes, so the request goes to e2:
// the client gets one clean stream (one role chunk, e2's tokens, [DONE]),
// e1 saw its request aborted, and each engine released one slot from
// prefill (e1) and decode (e2). Without that condition the same fault ends
// in an error event (the fault matrix's first-token case).
func TestRetryFirstTokenTimeout(t *testing.T) {
	rh := newRetryHarness(t, "stall-after=0", "", func(c *Config) {
		c.Retry.On = append(c.Retry.On, "first-token-timeout")
		c.Timeouts.FirstToken = 300 * time.Millisecond
	})
	resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, true))
	body := readBodyT(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
		t.Fatalf("status %d from %q, want 200 from e2: %s", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), body)
	}
	if n := strings.Count(body, `"role":"assistant"`); n != 1 {
		t.Errorf("%d role chunks, want 1 (e1's was held back): %q", n, body)
	}
	if strings.Contains(body, `"error"`) || strings.Count(body, "data: [DONE]") != 1 {
		t.Errorf("want one clean stream: %q", body)
	}
	rh.waitIdle()
	rel := rh.releases()
	if len(rel["e1"]) != 1 || rel["e1"][0] != routing.PhasePrefill || len(rel["e2"]) != 1 || rel["e2"][0] != routing.PhaseDecode {
		t.Errorf("releases %v, want e1 from prefill and e2 from decode, once each", rel)
	}
	testutil.Poll(2*time.Second, func() bool { return rh.e1.Stats().Aborted == 1 })
	if n := rh.e1.Stats().Aborted; n != 1 {
		t.Errorf("e1 aborted %d requests, want 1 (cancelled before the retry)", n)
	}
	if et := rh.errorTypes(); et[ErrTypeFirstToken] != 1 || et[""] != 1 {
		t.Errorf("attempt outcomes %v, want one first_token_timeout and one success", et)
	}

	// Both engines stall: the client gets a real 504 (nothing was sent),
	// not a 200 with an error event.
	if err := rh.e2.SetFault("stall-after=0"); err != nil {
		t.Fatal(err)
	}
	resp = rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, true))
	body = readBodyT(t, resp)
	if resp.StatusCode != 504 {
		t.Errorf("status %d, want 504: %s", resp.StatusCode, body)
	}
	var e apiErr
	if err := json.Unmarshal([]byte(body), &e); err != nil || fmt.Sprint(e.Error.Code) != ErrTypeFirstToken {
		t.Errorf("body %q, want an OpenAI error with code %s", body, ErrTypeFirstToken)
	}
	rh.waitIdle()
}

// TestRetryTimeoutConditionNeedsBudget: a timeout condition whose timeout
// is not shorter than the time budget could never be retried; the config
// says so instead of accepting it.
func TestRetryTimeoutConditionNeedsBudget(t *testing.T) {
	for _, tc := range []struct {
		cond    string
		timeout func(*Config, time.Duration)
	}{
		{"header-timeout", func(c *Config, d time.Duration) { c.Timeouts.ResponseHeader = d }},
		{"first-token-timeout", func(c *Config, d time.Duration) { c.Timeouts.FirstToken = d }},
	} {
		cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
		cfg.Retry.On = append(cfg.Retry.On, tc.cond)
		cfg.Retry.Within = 10 * time.Second
		tc.timeout(&cfg, 10*time.Second)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.cond) {
			t.Errorf("%s with a %s timeout and within %s: err %v, want one naming it", tc.cond, 10*time.Second, cfg.Retry.Within, err)
		}
		tc.timeout(&cfg, 2*time.Second)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s with a 2s timeout and within 10s: %v, want valid", tc.cond, err)
		}
	}
}

// TestRetryHeldStreamResetBeforeContent: with first-token-timeout on (so
// streams are held until their first content), an engine that sends its
// role chunk and then drops the connection has sent the client nothing: the
// request goes to e2 (reason reset) and the client gets one clean stream.
func TestRetryHeldStreamResetBeforeContent(t *testing.T) {
	rh := newRetryHarness(t, "close-after=0", "", func(c *Config) {
		c.Retry.On = append(c.Retry.On, "reset", "first-token-timeout")
		c.Timeouts.FirstToken = 2 * time.Second
	})
	resp := rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, true))
	body := readBodyT(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
		t.Fatalf("status %d from %q, want 200 from e2: %s", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), body)
	}
	if strings.Contains(body, `"error"`) || strings.Count(body, `"role":"assistant"`) != 1 || strings.Count(body, "data: [DONE]") != 1 {
		t.Errorf("want one clean stream with one role chunk: %q", body)
	}
	rh.waitIdle()
	if et := rh.errorTypes(); et[ErrTypeEngineDisconnect] != 1 || et[""] != 1 {
		t.Errorf("attempt outcomes %v, want one engine_disconnect and one success", et)
	}
}

// TestRetryUsesCurrentRoutingView: e1 answers 503 after 200 ms; while it
// does, e2 is drained. The retry must not go to e2 (it picks from the
// routing view of the moment, not of the request's arrival): with no engine
// left the client gets 503, and e2 receives nothing.
func TestRetryUsesCurrentRoutingView(t *testing.T) {
	rh := newRetryHarness(t, "stall-before-headers=200ms,status=503", "", func(c *Config) { c.Outlier.Enabled = false })
	done := make(chan *http.Response, 1)
	go func() { done <- rh.post("/v1/chat/completions", fmt.Sprintf(retryChat, false)) }()
	testutil.Poll(2*time.Second, func() bool { return rh.e1.Stats().Received != 0 })
	if _, ok := rh.gw.fleet.SetDrained("e2", true); !ok {
		t.Fatal("no e2")
	}
	resp := <-done
	body := readBodyT(t, resp)
	if resp.StatusCode != 503 {
		t.Errorf("status %d, want 503: %s", resp.StatusCode, body)
	}
	if n := rh.e2.Stats().Received; n != 0 {
		t.Errorf("drained e2 received %d requests, want 0", n)
	}
	rh.waitIdle()
}

// cancelCheckTransport records, when each engine request starts, whether
// every earlier engine request's context was already cancelled.
type cancelCheckTransport struct {
	next     http.RoundTripper
	mu       sync.Mutex
	prev     []*http.Request
	overlaps int // requests started while an earlier one was still live
}

func (c *cancelCheckTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost {
		c.mu.Lock()
		for _, p := range c.prev {
			if p.Context().Err() == nil {
				c.overlaps++
			}
		}
		c.prev = append(c.prev, r)
		c.mu.Unlock()
	}
	return c.next.RoundTrip(r)
}

// TestRetryCancelsPreviousAttemptFirst: when the retry's engine request
// starts, the previous attempt's request is already cancelled (its
// connection closed, so the engine aborts it): the gateway never has two
// engines working on one request, for a 503 (non-streaming), a header
// timeout and a first-token timeout (streaming).
func TestRetryCancelsPreviousAttemptFirst(t *testing.T) {
	for _, tc := range []struct {
		name, fault string
		stream      bool
	}{
		{"503", "status=503", false},
		{"header timeout", "stall-before-headers", true},
		{"first-token timeout", "stall-after=0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: tc.fault})
			_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
			cfg.Retry.On = append(cfg.Retry.On, "header-timeout", "first-token-timeout")
			cfg.Timeouts.ResponseHeader = 200 * time.Millisecond
			cfg.Timeouts.FirstToken = 300 * time.Millisecond
			tr := NewTransport(time.Second)
			t.Cleanup(tr.CloseIdleConnections)
			cc := &cancelCheckTransport{next: tr}
			h := newHarnessWith(t, cfg, []Option{WithTransport(cc)})
			resp := h.post("/v1/chat/completions", fmt.Sprintf(retryChat, tc.stream))
			body := readBodyT(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
				t.Fatalf("status %d from %q, want 200 from e2: %s", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), body)
			}
			cc.mu.Lock()
			defer cc.mu.Unlock()
			if len(cc.prev) != 2 || cc.overlaps != 0 {
				t.Errorf("%d engine requests, %d started while an earlier one was live; want 2 and 0", len(cc.prev), cc.overlaps)
			}
			h.waitIdle()
		})
	}
}
