package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/quota"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// limitsRig is a gateway with one key, "k-1" (team-1), with limits, in
// front of a simulated engine, on a frozen clock the test advances.
type limitsRig struct {
	*harness
	clk *testutil.Clock
	eng *enginesim.Engine
}

func newLimitsRig(t *testing.T, l KeyLimits, sc enginesim.Config, opts ...Option) *limitsRig {
	t.Helper()
	sc.Models = []string{"m"}
	eng, srv := sim(t, sc)
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}, Limits: l}}}
	r := &limitsRig{clk: testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), eng: eng}
	r.harness = newHarnessWith(t, cfg, append([]Option{withClock(r.clk.Now)}, opts...), withoutStart())
	return r
}

// chat sends a non-streaming chat request with key k-1 and returns the
// response with its body read.
func (r *limitsRig) chat(body string) (*http.Response, []byte) {
	r.t.Helper()
	resp := r.post("/v1/chat/completions", body, "Authorization", "Bearer k-1")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}

func chatBody(maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"hello there"}]}`, maxTokens)
}

func headerInt(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(h.Get(name), 10, 64)
	if err != nil {
		t.Fatalf("%s = %q: %v", name, h.Get(name), err)
	}
	return v
}

// TestKeyRequestsPerMinuteBoundary: a key with requests_per_minute 3 gets
// exactly 3 requests at one instant, each telling the remaining count;
// the 4th is 429 in the route's envelope with Retry-After 20 (a request
// comes back every 60/3 s) and reaches no engine; 20 s later exactly one
// more is admitted.
func TestKeyRequestsPerMinuteBoundary(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{RequestsPerMinute: 3}, enginesim.Config{OutputTokens: 2})
	for i := range 3 {
		resp, b := r.chat(chatBody(2))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, b)
		}
		if got := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Requests"); got != int64(2-i) {
			t.Errorf("request %d: remaining %d, want %d", i+1, got, 2-i)
		}
		if got := resp.Header.Get("X-Ratelimit-Limit-Requests"); got != "3" {
			t.Errorf("limit header %q, want 3", got)
		}
		if got, want := resp.Header.Get("X-Ratelimit-Reset-Requests"), (time.Duration(i+1) * 20 * time.Second).String(); got != want {
			t.Errorf("request %d: reset %q, want %q", i+1, got, want)
		}
		if resp.Header.Get("X-Ratelimit-Limit-Tokens") != "" {
			t.Errorf("a key without a token limit got token headers")
		}
	}
	resp, b := r.chat(chatBody(2))
	var e apiErr
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != http.StatusTooManyRequests || e.code() != "rate_limit_exceeded" || e.Error.Type != "requests" {
		t.Fatalf("4th request: %d %s, want 429 rate_limit_exceeded of type requests", resp.StatusCode, b)
	}
	if got := resp.Header.Get("Retry-After"); got != "20" {
		t.Errorf("Retry-After %q, want 20", got)
	}
	if got := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Requests"); got != 0 {
		t.Errorf("refused: remaining %d, want 0", got)
	}
	// Anthropic's envelope on the messages route.
	am := r.post("/v1/messages", msgM, "X-Api-Key", "k-1")
	ab, _ := io.ReadAll(am.Body)
	am.Body.Close()
	if am.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(ab), `"type":"error"`) || !strings.Contains(string(ab), `"rate_limit_error"`) {
		t.Errorf("messages: %d %s, want 429 rate_limit_error in Anthropic's envelope", am.StatusCode, ab)
	}
	if n := r.eng.Stats().Received; n != 3 {
		t.Errorf("the engine received %d requests, want 3", n)
	}
	r.clk.Advance(20*time.Second - time.Millisecond)
	if resp, _ := r.chat(chatBody(2)); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("1 ms before the next request is due: %d, want 429", resp.StatusCode)
	}
	r.clk.Advance(time.Millisecond)
	if resp, b := r.chat(chatBody(2)); resp.StatusCode != http.StatusOK {
		t.Errorf("20 s later: %d %s, want 200", resp.StatusCode, b)
	}
	if resp, _ := r.chat(chatBody(2)); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a second one 20 s later: %d, want 429", resp.StatusCode)
	}
	ks := r.gw.Keys()
	if len(ks) != 1 || ks[0].Admitted != 4 || ks[0].Refused != 4 || ks[0].InFlight != 0 {
		t.Errorf("admin keys %+v, want 4 admitted, 4 refused, none in flight", ks)
	}
	r.waitIdle()
}

// usageOf returns the usage object of a chat completion body.
func usageOf(t *testing.T, b []byte) (in, out int64) {
	t.Helper()
	var v struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return v.Usage.Prompt, v.Usage.Completion
}

// TestKeyTokensReserveAndSettle: admission reserves the prompt estimate
// plus max_tokens against tokens_per_minute; the end settles to the usage
// the engine reported, so a short answer gives back what it did not use
// (on a frozen clock nothing refills, so the counts are exact); a request
// whose reservation exceeds the limit is 429 with no Retry-After.
func TestKeyTokensReserveAndSettle(t *testing.T) {
	const limit = 1000
	r := newLimitsRig(t, KeyLimits{TokensPerMinute: limit}, enginesim.Config{OutputTokens: 3, MaxOutputTokens: 3})
	prompt := int64((len("hello there") + 3) / 4)
	resp, b := r.chat(chatBody(400))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got, want := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens"), limit-(prompt+400); got != want {
		t.Errorf("remaining after reserving: %d, want %d (limit - prompt estimate %d - max_tokens 400)", got, want, prompt)
	}
	in, out := usageOf(t, b)
	if out != 3 || in <= 0 {
		t.Fatalf("usage %d in, %d out", in, out)
	}
	// The first request's reservation was settled to its usage.
	resp, b = r.chat(chatBody(400))
	if got, want := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens"), limit-(in+out)-(prompt+400); resp.StatusCode != http.StatusOK || got != want {
		t.Errorf("second request: %d, remaining %d, want %d (the first settled to %d+%d)", resp.StatusCode, got, want, in, out)
	}
	in2, out2 := usageOf(t, b)
	used := in + out + in2 + out2
	// The largest reservation that still fits is admitted; one more token is not.
	fits := int(limit - used - prompt)
	if resp, b := r.chat(chatBody(fits + 1)); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a reservation one token over what is left: %d %s, want 429", resp.StatusCode, b)
	} else if ra := resp.Header.Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After %q, want 1 (the missing token refills in 60 ms)", ra)
	}
	resp, b = r.chat(chatBody(fits))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a reservation of exactly what is left: %d %s, want 200", resp.StatusCode, b)
	}
	in4, out4 := usageOf(t, b)
	r.clk.Advance(time.Minute)
	resp, b = r.chat(chatBody(limit))
	var e apiErr
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusTooManyRequests || e.Error.Type != "tokens" || resp.Header.Get("Retry-After") != "" || !strings.Contains(e.Error.Message, "too large") {
		t.Errorf("a reservation over the limit itself: %d %q Retry-After %q, want 429 tokens, too large, no Retry-After", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	ks := r.gw.Keys()
	if ks[0].TokensIn != in+in2+in4 || ks[0].TokensOut != out+out2+out4 || ks[0].Admitted != 3 || ks[0].Refused != 2 {
		t.Errorf("admin keys %+v, want input %d, output %d, 3 admitted, 2 refused", ks[0], in+in2+in4, out+out2+out4)
	}
	if got := r.counter(telemetry.KeyTokensName); got != ks[0].TokensIn+ks[0].TokensOut {
		t.Errorf("%s = %d, want %d", telemetry.KeyTokensName, got, ks[0].TokensIn+ks[0].TokensOut)
	}
	r.waitIdle()
}

// TestKeyTokensSettledOnEveryEnd: a stream that ends early, one the engine
// cuts, and one the client cancels each give back what they did not use:
// after each, the next request finds the bucket at the limit minus exactly
// what the ended ones used (their usage, else the prompt estimate plus one
// token per content event).
func TestKeyTokensSettledOnEveryEnd(t *testing.T) {
	const limit = 10000
	r := newLimitsRig(t, KeyLimits{TokensPerMinute: limit, Concurrent: 4}, enginesim.Config{OutputTokens: 40, MaxOutputTokens: 40, ITL: 5 * time.Millisecond})
	prompt := int64((len("hello there") + 3) / 4)
	// probe sends a 1-token request and returns the bucket as it was
	// before the probe's own reservation, and what the probe used.
	probe := func() (rem, used int64) {
		t.Helper()
		r.waitIdle()
		resp, b := r.chat(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hello there"}]}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("probe: %d %s", resp.StatusCode, b)
		}
		in, out := usageOf(t, b)
		r.waitIdle()
		return headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens") + prompt + 1, in + out
	}
	stream := func(maxTokens int, fault string, cancelAfter int) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hello there"}]}`, maxTokens)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer k-1")
		if fault != "" {
			req.Header.Set(enginesim.FaultHeader, fault)
		}
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		n := 0
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"content":"`) {
				if n++; cancelAfter > 0 && n == cancelAfter {
					cancel()
					break
				}
			}
		}
	}
	rem, probeUsed := probe()
	if rem != limit {
		t.Fatalf("the bucket before anything: %d, want %d", rem, limit)
	}
	promptTokens := probeUsed - 1 // the engine's count of the same prompt
	for _, tc := range []struct {
		name string
		run  func()
		// exact is the use when the engine reports usage; 0: estimated
		// (prompt estimate + content events), at most max.
		exact, max int64
	}{
		{"ends early (max_tokens 5 of a 400 reservation)", func() { stream(5, "", 0) }, promptTokens + 5, 0},
		{"engine cuts it mid-stream", func() { stream(400, "close-after=3", 0) }, 0, prompt + 40},
		{"client cancels after 3 tokens", func() { stream(400, "", 3) }, 0, prompt + 40},
	} {
		tc.run()
		next, nextUsed := probe()
		used := rem - probeUsed - next
		switch {
		case tc.exact > 0 && used != tc.exact:
			t.Errorf("%s: the bucket lost %d tokens, want its usage %d (its reservation was %d)", tc.name, used, tc.exact, prompt+400)
		case tc.exact == 0 && (used <= 0 || used > tc.max):
			t.Errorf("%s: the bucket lost %d tokens, want its estimated use, in (0, %d] (its reservation was %d)", tc.name, used, tc.max, prompt+400)
		}
		rem, probeUsed = next, nextUsed
	}
	if ks := r.gw.Keys(); ks[0].InFlight != 0 {
		t.Errorf("in flight %d after every stream ended", ks[0].InFlight)
	}
	d, err := r.gw.limits.store.Admit(context.Background(), quota.Ask{Key: "team-1", Limits: quota.Limits{Concurrent: 1}, Lease: "probe"})
	if err != nil || !d.Allowed {
		t.Errorf("a 1-concurrent admission after every stream ended: %+v %v; a lease leaked", d, err)
	}
	r.waitIdle()
}

// TestKeyConcurrentLimit: concurrent 1 admits one request at a time: a
// second while the first streams is 429 with Retry-After 1; when the
// first ends (whatever way), the next is admitted.
func TestKeyConcurrentLimit(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{Concurrent: 1}, enginesim.Config{OutputTokens: 200, ITL: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":200,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer k-1")
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	second, b := r.chat(chatBody(2))
	if second.StatusCode != http.StatusTooManyRequests || second.Header.Get("Retry-After") != "1" || !strings.Contains(string(b), "concurrent") {
		t.Errorf("second at once: %d %s Retry-After %q, want 429 concurrent, Retry-After 1", second.StatusCode, b, second.Header.Get("Retry-After"))
	}
	if ks := r.gw.Keys(); ks[0].InFlight != 1 {
		t.Errorf("in flight %d, want 1", ks[0].InFlight)
	}
	cancel()
	resp.Body.Close()
	r.waitIdle()
	testutil.Poll(3*time.Second, func() bool { return r.gw.Keys()[0].InFlight == 0 })
	if third, b := r.chat(chatBody(2)); third.StatusCode != http.StatusOK {
		t.Errorf("after the first was cancelled: %d %s, want 200", third.StatusCode, b)
	}
	r.waitIdle()
}

// failingStore is a quota.Store that cannot answer.
type failingStore struct {
	mu       sync.Mutex
	admits   int
	releases int
}

func (f *failingStore) Admit(context.Context, quota.Ask) (quota.Decision, error) {
	f.mu.Lock()
	f.admits++
	f.mu.Unlock()
	return quota.Decision{}, fmt.Errorf("%w: dial tcp 127.0.0.1:1: connection refused", quota.ErrUnavailable)
}

func (f *failingStore) Release(context.Context, quota.Release) error {
	f.mu.Lock()
	f.releases++
	f.mu.Unlock()
	return nil
}

func (f *failingStore) Close() error { return nil }

// TestKeyLimitsStoreUnavailable: when the store cannot answer, fail_mode
// open admits (counted in switchboard.quota.store_errors as admitted, no
// release owed) and closed answers 503 rate_limits_unavailable with
// Retry-After in the route's envelope, reaching no engine.
func TestKeyLimitsStoreUnavailable(t *testing.T) {
	for _, mode := range []string{FailOpen, FailClosed} {
		t.Run(mode, func(t *testing.T) {
			fs := &failingStore{}
			_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
			cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}, Limits: KeyLimits{RequestsPerMinute: 10}}}}
			cfg.Limits.FailMode = mode
			h := newHarnessWith(t, cfg, []Option{WithQuotaStore(fs)}, withoutStart())
			resp := h.post("/v1/chat/completions", chatBody(2), "Authorization", "Bearer k-1")
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			am := h.post("/v1/messages", msgM, "X-Api-Key", "k-1")
			ab, _ := io.ReadAll(am.Body)
			am.Body.Close()
			switch mode {
			case FailOpen:
				if resp.StatusCode != http.StatusOK || am.StatusCode != http.StatusOK {
					t.Errorf("fail open: %d %s / %d %s, want 200s", resp.StatusCode, b, am.StatusCode, ab)
				}
			case FailClosed:
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "rate_limits_unavailable") {
					t.Errorf("fail closed: %d %s, want 503 rate_limits_unavailable with Retry-After", resp.StatusCode, b)
				}
				if am.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(ab), `"overloaded_error"`) {
					t.Errorf("fail closed, messages: %d %s, want 503 in Anthropic's envelope", am.StatusCode, ab)
				}
			}
			if got := h.counter(telemetry.QuotaStoreErrorsName); got != 2 {
				t.Errorf("%s = %d, want 2", telemetry.QuotaStoreErrorsName, got)
			}
			fs.mu.Lock()
			if fs.releases != 0 {
				t.Errorf("%d releases for admissions the store never made", fs.releases)
			}
			fs.mu.Unlock()
			h.waitIdle()
		})
	}
}

// TestKeyLimitsUnkeyedUntouched: a key without limits, and auth off, ask
// the store nothing and get no rate-limit headers.
func TestKeyLimitsUnkeyedUntouched(t *testing.T) {
	fs := &failingStore{}
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}}}}
	h := newHarnessWith(t, cfg, []Option{WithQuotaStore(fs)}, withoutStart())
	resp := h.post("/v1/chat/completions", chatBody(2), "Authorization", "Bearer k-1")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ratelimit-Limit-Requests") != "" || fs.admits != 0 {
		t.Errorf("%d, headers %v, %d admissions; want 200, no rate-limit headers, the store not asked", resp.StatusCode, resp.Header, fs.admits)
	}
	h.waitIdle()
}

func TestLimitsConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*LimitsConfig)
		want string
	}{
		{"defaults", func(*LimitsConfig) {}, ""},
		{"negative default_max_tokens", func(c *LimitsConfig) { c.DefaultMaxTokens = -1 }, "default_max_tokens"},
		{"bad fail_mode", func(c *LimitsConfig) { c.FailMode = "maybe" }, "fail_mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultLimitsConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidConfig)) {
				t.Errorf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestAdminKeys: GET /admin/keys lists each key's name, models, limits
// and counts as JSON, never its hash.
func TestAdminKeys(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{RequestsPerMinute: 1, Concurrent: 2}, enginesim.Config{OutputTokens: 2})
	r.chat(chatBody(2))
	r.chat(chatBody(2))
	r.waitIdle()
	rec := httptest.NewRecorder()
	r.gw.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/keys", nil))
	b := rec.Body.String()
	if rec.Code != http.StatusOK || strings.Contains(b, sha("k-1")) {
		t.Fatalf("%d %s", rec.Code, b)
	}
	var got struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal([]byte(b), &got); err != nil || len(got.Keys) != 1 {
		t.Fatalf("%s: %v", b, err)
	}
	k := got.Keys[0]
	lim, _ := k["limits"].(map[string]any)
	if k["name"] != "team-1" || k["admitted"] != 1.0 || k["refused"] != 1.0 || k["in_flight"] != 0.0 || k["shared"] != false ||
		lim["requests_per_minute"] != 1.0 || lim["concurrent"] != 2.0 || lim["tokens_per_minute"] != 0.0 {
		t.Errorf("admin keys %s", b)
	}
}

// TestKeyTokensDefaultReservationCapped: a request without max_tokens
// reserves default_max_tokens, but never more than its key's whole
// tokens_per_minute, so a key with a small limit is not refused as "too
// large" for a default it did not choose; one that asks for more than the
// limit is.
func TestKeyTokensDefaultReservationCapped(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{TokensPerMinute: 1000}, enginesim.Config{OutputTokens: 3})
	resp, b := r.chat(`{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
	if resp.StatusCode != http.StatusOK || headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens") != 0 {
		t.Fatalf("no max_tokens, default 4096 over a 1000 limit: %d %s remaining %q, want 200 reserving the whole bucket", resp.StatusCode, b, resp.Header.Get("X-Ratelimit-Remaining-Tokens"))
	}
	in, out := usageOf(t, b)
	resp, b = r.chat(chatBody(100))
	if got, want := headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens"), 1000-(in+out)-(3+100); resp.StatusCode != http.StatusOK || got != want {
		t.Errorf("after it settled: %d %s remaining %d, want %d", resp.StatusCode, b, got, want)
	}
	if resp, _ := r.chat(chatBody(1000)); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("max_tokens 1000 on a 1000 limit (plus the prompt): %d, want 429", resp.StatusCode)
	}
	r.waitIdle()
}

// TestKeyTokensHugeMaxTokens: a max_tokens that would overflow the
// reservation is refused as too large (429, no Retry-After) and leaves the
// key's bucket untouched: the next ordinary request is admitted.
func TestKeyTokensHugeMaxTokens(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{TokensPerMinute: 1000}, enginesim.Config{OutputTokens: 3})
	for _, m := range []string{"9223372036854775807", "99999999999999999999", "9223372036854775806"} {
		resp, b := r.chat(`{"model":"m","max_tokens":` + m + `,"messages":[{"role":"user","content":"hello there"}]}`)
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Retry-After") != "" {
			t.Errorf("max_tokens %s: %d %s Retry-After %q, want 429 too large (or 400), no Retry-After", m, resp.StatusCode, b, resp.Header.Get("Retry-After"))
		}
	}
	if n := r.eng.Stats().Received; n != 0 {
		t.Errorf("the engine received %d requests, want 0", n)
	}
	resp, b := r.chat(chatBody(10))
	if resp.StatusCode != http.StatusOK || headerInt(t, resp.Header, "X-Ratelimit-Remaining-Tokens") != 1000-3-10 {
		t.Errorf("an ordinary request after: %d %s remaining %q, want 200 with %d", resp.StatusCode, b, resp.Header.Get("X-Ratelimit-Remaining-Tokens"), 1000-3-10)
	}
	r.waitIdle()
}

// TestKeyLimitsEngineHeadersDropped: an engine's own x-ratelimit-* headers
// (an OpenAI-compatible upstream) do not reach a limited key's client,
// whose headers are its key's; a whole answer with no usage is charged
// its reservation.
func TestKeyLimitsEngineHeadersDropped(t *testing.T) {
	url := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Remaining-Requests", "99999")
		w.Header().Set("X-Ratelimit-Limit-Tokens", "77777")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[]}`))
	}).URL
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: url, Models: []string{"m"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"}, Limits: KeyLimits{RequestsPerMinute: 5}}}}
	h := newHarnessWith(t, cfg, []Option{withClock(testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Now)}, withoutStart())
	resp := h.post("/v1/chat/completions", chatBody(50), "Authorization", "Bearer k-1")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Ratelimit-Remaining-Requests") != "4" || resp.Header.Get("X-Ratelimit-Limit-Tokens") != "" {
		t.Errorf("%d %v: want the key's remaining 4 and no engine token header", resp.StatusCode, resp.Header)
	}
	if ks := h.gw.Keys(); ks[0].TokensOut != 50 || ks[0].TokensIn != 3 {
		t.Errorf("an answer without usage charged %d in, %d out; want the prompt estimate 3 and the reserved 50", ks[0].TokensIn, ks[0].TokensOut)
	}
	h.waitIdle()
}

// TestKeyLimitsLightAndPromptOnly: a light route (tokenize) is not held
// to the tokens limit, so a key whose token bucket is empty can still
// use it; a request whose prompt alone exceeds the limit is refused as too
// large even without max_tokens.
func TestKeyLimitsLightAndPromptOnly(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{TokensPerMinute: 20}, enginesim.Config{OutputTokens: 3})
	if resp, b := r.chat(chatBody(17)); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, _ := r.chat(chatBody(17)); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the bucket should be empty now: %d", resp.StatusCode)
	}
	tok := r.post("/tokenize", `{"model":"m","prompt":"hello there"}`, "Authorization", "Bearer k-1")
	tb, _ := io.ReadAll(tok.Body)
	tok.Body.Close()
	if tok.StatusCode != http.StatusOK || tok.Header.Get("X-Ratelimit-Limit-Tokens") != "" {
		t.Errorf("tokenize with the token bucket empty: %d %s, want 200 without token headers", tok.StatusCode, tb)
	}
	r.clk.Advance(time.Minute)
	long := strings.Repeat("word ", 40) // 200 bytes: a 50-token estimate over a 20-token limit
	resp, b := r.chat(`{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), "too large") {
		t.Errorf("a prompt over the whole limit, no max_tokens: %d %s, want 429 too large", resp.StatusCode, b)
	}
	r.waitIdle()
}

// TestKeyWithoutLimitsCounted: a key without limits is counted (admin
// keys, switchboard.key.requests) without asking the store.
func TestKeyWithoutLimitsCounted(t *testing.T) {
	r := newLimitsRig(t, KeyLimits{}, enginesim.Config{OutputTokens: 3})
	for range 2 {
		r.chat(chatBody(3))
	}
	r.waitIdle()
	if ks := r.gw.Keys(); ks[0].Admitted != 2 || ks[0].TokensOut != 6 || ks[0].InFlight != 0 {
		t.Errorf("admin keys %+v, want 2 admitted, 6 output tokens", ks[0])
	}
	if n := r.counter(telemetry.KeyRequestsName); n != 2 {
		t.Errorf("%s = %d, want 2", telemetry.KeyRequestsName, n)
	}
}

// TestKeyRateLimitHeadersWhichAnswers: the x-ratelimit-* headers are on
// the answers to the requests a limited key's limits were consulted for
// (admitted, whatever the engine answered, and refused with 429), and on
// none of the gateway's own refusals before that (bad input 400, a model
// the key may not use 403, an unknown model 404), which count nothing
// against the limits (docs/keys-and-limits.md says exactly this).
func TestKeyRateLimitHeadersWhichAnswers(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m", "other"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m", "other"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"m", "nope"}, Limits: KeyLimits{RequestsPerMinute: 2}}}}
	h := newHarness(t, cfg)
	for _, tc := range []struct {
		name, body string
		fault      string
		status     int
		headers    bool
	}{
		{"admitted", chatBody(4), "", http.StatusOK, true},
		{"bad input", `{"model":"m","messages":`, "", http.StatusBadRequest, false},
		{"model not allowed", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`, "", http.StatusForbidden, false},
		{"unknown model", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, "", http.StatusNotFound, false},
		{"admitted, engine error", chatBody(4), "status=500", http.StatusInternalServerError, true},
		{"refused", chatBody(4), "", http.StatusTooManyRequests, true},
	} {
		hdr := []string{"Authorization", "Bearer k-1"}
		if tc.fault != "" {
			hdr = append(hdr, "X-Enginesim-Fault", tc.fault)
		}
		resp := h.post("/v1/chat/completions", tc.body, hdr...)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d", tc.name, resp.StatusCode, tc.status)
		}
		if got := resp.Header.Get("X-Ratelimit-Limit-Requests") != ""; got != tc.headers {
			t.Errorf("%s: x-ratelimit-* headers present %v, want %v", tc.name, got, tc.headers)
		}
	}
}

// TestKeyConcurrentSequentialRedis: a key with concurrent: 1 whose client
// sends each request as soon as it has read an answer's end (the end event
// of a stream, as the SDKs stop there, or its error event; a whole body)
// is never refused, with the limits in a real Redis shared by two
// replicas and the requests alternating between them: streamed, whole,
// an engine's error, the gateway's own error, Messages and Responses
// streams ended by the engine's error event, a chat stream broken and
// ended by the gateway's error event; and whole bodies too large to
// buffer (relayed as they come) (issue 28's first defect: the lease went
// back in the background, after the answer, and the next request could
// arrive first).
func TestKeyConcurrentSequentialRedis(t *testing.T) {
	type seqCase struct {
		path, body, fault string
		status            int
		until             string // a stream is read up to the line holding this, then dropped
		n                 int
	}
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	chatStream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for _, small := range []bool{false, true} {
		_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 3, ITL: time.Microsecond})
		rds := redistest.Start(t)
		var hs []*harness
		for range 2 {
			rc := quota.DefaultRedisConfig()
			rc.Address = rds.Addr()
			rc.Timeout = 5 * time.Second // -race on a slow machine: never fail open
			st, err := quota.NewRedis(rc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
			cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"m"}, Limits: KeyLimits{Concurrent: 1}}}}
			cfg.Limits.Redis = rc
			cfg.Limits.FailMode = FailClosed
			cfg.Migration.Limit = 0 // a broken stream ends with the gateway's error event
			if small {
				// Whole bodies relayed as they come, not reassembled.
				cfg.MaxResponseBufferBytes = 16
				cfg.Migration.NonStreaming = false
			}
			hs = append(hs, newHarnessWith(t, cfg, []Option{WithQuotaStore(st)}))
		}
		cases := []seqCase{
			{"/v1/chat/completions", chatStream, "", http.StatusOK, "[DONE]", 30},
			{"/v1/chat/completions", chat, "", http.StatusOK, "", 30},
			{"/v1/chat/completions", chat, "status=500", http.StatusInternalServerError, "", 20},
			{"/v1/chat/completions", chatStream, "status=500", http.StatusInternalServerError, "", 20},
			{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, "", http.StatusForbidden, "", 10},
			{"/v1/chat/completions", chatStream, "close-after=1", http.StatusOK, `"error"`, 40},
			{"/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "error-after=1", http.StatusOK, "event: error", 40},
			{"/v1/responses", `{"model":"m","stream":true,"store":false,"input":"hi"}`, "error-after=1", http.StatusOK, "event: error", 40},
		}
		if small {
			cases = append(cases, seqCase{"/v1/chat/completions", `{"model":"m","max_tokens":3000,"messages":[{"role":"user","content":"hi"}]}`, "", http.StatusOK, "", 4})
		}
		i := 0
		for _, c := range cases {
			for range c.n {
				hdr := []string{"Authorization", "Bearer k-1"}
				if c.fault != "" {
					hdr = append(hdr, "X-Enginesim-Fault", c.fault)
				}
				resp := hs[i%2].post(c.path, c.body, hdr...)
				i++
				if c.until != "" {
					br := bufio.NewReader(resp.Body)
					for {
						line, err := br.ReadString('\n')
						if strings.Contains(line, c.until) || err != nil {
							break
						}
					}
				} else {
					_, _ = io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
				if resp.StatusCode != c.status {
					t.Fatalf("small buffer %v, request %d (%s %s %s): status %d, want %d", small, i, c.path, c.body, c.fault, resp.StatusCode, c.status)
				}
			}
		}
		for _, h := range hs {
			h.waitIdle()
		}
	}
}
