package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
)

// consoleGet does one GET on the admin handler's server admin.
func consoleGet(t *testing.T, admin *httptest.Server, path string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, admin.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := admin.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestConsoleHeaders checks that every console response carries the
// Content-Security-Policy and the other security headers, the page is
// never cached, the assets have their content types, and the page itself
// holds nothing the policy would block (inline scripts or styles, eval).
func TestConsoleHeaders(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)

	cases := []struct {
		path, status, ctype, cache string
	}{
		{"/console", "301", "", "no-store"},
		{"/console/", "200", "text/html; charset=utf-8", "no-store"},
		{"/console/assets/console.js", "200", "text/javascript; charset=utf-8", "no-cache"},
		{"/console/assets/console.css", "200", "text/css; charset=utf-8", "no-cache"},
		{"/console/assets/nope.js", "404", "application/json", ""},
		{"/admin/console/engines", "200", "application/json", "no-cache"},
		{"/admin/console/models", "200", "application/json", "no-store"},
		{"/admin/console/routing", "200", "application/json", "no-store"},
		{"/admin/console/requests", "200", "application/json", "no-store"},
		{"/admin/console/requests?limit=0", "400", "application/json", ""},
		{"/admin/console/config", "200", "application/json", "no-store"},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			resp, body := consoleGet(t, admin, c.path)
			if got := fmt.Sprint(resp.StatusCode); got != c.status {
				t.Fatalf("status %s, want %s: %s", got, c.status, body)
			}
			hd := resp.Header
			if got := hd.Get("Content-Security-Policy"); got != consoleCSP {
				t.Errorf("CSP %q", got)
			}
			if hd.Get("X-Content-Type-Options") != "nosniff" || hd.Get("Referrer-Policy") != "no-referrer" {
				t.Errorf("nosniff %q, referrer %q", hd.Get("X-Content-Type-Options"), hd.Get("Referrer-Policy"))
			}
			if c.ctype != "" && !strings.HasPrefix(hd.Get("Content-Type"), c.ctype) {
				t.Errorf("content type %q, want %q", hd.Get("Content-Type"), c.ctype)
			}
			if c.cache != "" && hd.Get("Cache-Control") != c.cache {
				t.Errorf("cache-control %q, want %q", hd.Get("Cache-Control"), c.cache)
			}
			if c.path == "/console" && hd.Get("Location") != "/console/" {
				t.Errorf("redirect to %q", hd.Get("Location"))
			}
		})
	}
	// An unchanged asset revalidates to 304.
	resp, _ := consoleGet(t, admin, "/console/assets/console.js")
	if r2, b := consoleGet(t, admin, "/console/assets/console.js", "If-None-Match", resp.Header.Get("ETag")); r2.StatusCode != 304 || len(b) != 0 {
		t.Errorf("revalidation: %d, %d bytes", r2.StatusCode, len(b))
	}

	// The page: no inline script or style, nothing the CSP blocks.
	page := string(consoleAssets()["index.html"].body)
	for _, bad := range []string{"<script>", "style=", "<style", "onclick", "onload", "javascript:"} {
		if strings.Contains(page, bad) {
			t.Errorf("index.html contains %q", bad)
		}
	}
	js := string(consoleAssets()["assets/console.js"].body)
	for _, bad := range []string{"eval(", "new Function", "innerHTML", "insertAdjacentHTML", "window.confirm", "localStorage", "?token="} {
		if strings.Contains(js, bad) {
			t.Errorf("console.js contains %q", bad)
		}
	}
	// The DOM contract the browser test relies on.
	for _, id := range []string{`id="token-form"`, `id="token"`, `id="token-submit"`, `id="key-create"`, `id="key-secret"`,
		`id="filter-key"`, `id="filter-model"`, `id="status"`, `id="engines"`, `id="models"`, `id="routing"`,
		`id="keys"`, `id="requests"`, `id="config"`, `name="requests_per_minute"`, `name="tokens_per_minute"`,
		`name="concurrent"`, `name="max_spend_per_day"`, `name="models" value="*"`} {
		if !strings.Contains(page, id) {
			t.Errorf("index.html lacks %s", id)
		}
	}
}

// TestConsoleData sends real requests through the gateway and reads them
// back from the console's endpoints: the engine rows, the requests ring
// (filtered by key and model), the model series and the routing status.
func TestConsoleData(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m", "n"}, OutputTokens: 4})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m", "n"}, Tier: new(int)})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{
		{Name: "team-a", SHA256: sha("k-a"), Models: []string{"*"}},
		{Name: "team-b", SHA256: sha("k-b"), Models: []string{"m"}},
	}}
	h := newHarness(t, cfg)
	admin := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(admin.Close)

	send := func(key, model string, stream bool) {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
		if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", body, "Authorization", "Bearer "+key); st != 200 {
			t.Fatalf("chat %s %s: %d %s", key, model, st, b)
		}
	}
	send("k-a", "m", true)
	send("k-a", "n", false)
	send("k-b", "m", true)
	// Refused before an engine: counted in n's rate, not in its latencies.
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"n","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer k-b"); st/100 != 4 {
		t.Fatalf("team-b to n: %d %s", st, b)
	}
	if st, _, _ := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[]}`, "Authorization", "Bearer wrong"); st != 401 {
		t.Fatalf("wrong key: %d", st)
	}
	h.waitIdle()

	// Engines.
	resp, body := consoleGet(t, admin, "/admin/console/engines")
	var eng struct {
		Engines []struct {
			Name, State, Role string
			Tier              int
			Prefill, Decode   int64
			Queue, KV         *float64
			Ejections         int
		}
		RequestsInFlight int64 `json:"requests_in_flight"`
	}
	if err := json.Unmarshal(body, &eng); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if len(eng.Engines) != 1 || eng.Engines[0].Name != "e1" || eng.Engines[0].State != "ready" || eng.Engines[0].Role != "both" ||
		eng.Engines[0].Prefill != 0 || eng.Engines[0].Decode != 0 || eng.Engines[0].Queue != nil || eng.RequestsInFlight != 0 {
		t.Errorf("engines: %s", body)
	}
	if r2, b := consoleGet(t, admin, "/admin/console/engines", "If-None-Match", resp.Header.Get("ETag")); r2.StatusCode != 304 || len(b) != 0 {
		t.Errorf("unchanged engines: %d %s", r2.StatusCode, b)
	}
	if _, ok := h.gw.fleet.SetDrained("e1", true); !ok {
		t.Fatal("drain")
	}
	if r2, b := consoleGet(t, admin, "/admin/console/engines", "If-None-Match", resp.Header.Get("ETag")); r2.StatusCode != 200 ||
		!strings.Contains(string(b), `"state":"draining"`) || !strings.Contains(string(b), `"drained":true`) {
		t.Errorf("drained engine: %d %s", r2.StatusCode, b)
	}

	// Requests: newest first, filtered.
	type reqs struct {
		Requests []consoleRequest
	}
	get := func(q string) reqs {
		_, b := consoleGet(t, admin, "/admin/console/requests"+q)
		var r reqs
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return r
	}
	all := get("")
	if len(all.Requests) != 5 {
		t.Fatalf("%d requests, want 5: %+v", len(all.Requests), all.Requests)
	}
	if r := all.Requests[0]; r.Status != 401 || r.Outcome != "invalid_api_key" || r.Key != "" || len(r.Engines) != 0 {
		t.Errorf("newest: %+v", r)
	}
	if r := all.Requests[1]; r.Key != "team-b" || r.Model != "n" || r.Status/100 != 4 || len(r.Engines) != 0 {
		t.Errorf("team-b's refused request: %+v", r)
	}
	if r := all.Requests[2]; r.Key != "team-b" || r.Model != "m" || r.Status != 200 || r.Outcome != "ok" ||
		len(r.Engines) != 1 || r.Engines[0] != "e1" || r.Attempts != 1 || r.Retries != 0 || r.TTFTMS == nil || *r.TTFTMS <= 0 ||
		r.OutputTokens == nil || *r.OutputTokens != 4 || r.DurationMS < *r.TTFTMS || r.Operation != "chat" {
		t.Errorf("team-b's request: %+v", r)
	}
	if r := get("?key=team-a"); len(r.Requests) != 2 || r.Requests[0].Model != "n" || r.Requests[1].Model != "m" {
		t.Errorf("key filter: %+v", r.Requests)
	}
	if r := get("?key=team-a&model=m"); len(r.Requests) != 1 || r.Requests[0].Key != "team-a" || r.Requests[0].Model != "m" {
		t.Errorf("key and model filter: %+v", r.Requests)
	}
	if r := get("?limit=1"); len(r.Requests) != 1 || r.Requests[0].Status != 401 {
		t.Errorf("limit: %+v", r.Requests)
	}

	// Models: the period closed, m had 2 requests (one stream: ITL), n 1.
	h.gw.console.models.advance(time.Now().Add(modelPeriod))
	_, body = consoleGet(t, admin, "/admin/console/models")
	var mod struct {
		Period int `json:"period_seconds"`
		Models []struct {
			Model   string
			T       []int64
			Req     []*float64 `json:"requests_per_second"`
			Err     []*float64 `json:"errors_per_second"`
			TTFTP50 []*float64 `json:"ttft_p50"`
			ITLP50  []*float64 `json:"itl_p50"`
			E2EP50  []*float64 `json:"e2e_p50"`
			E2EP99  []*float64 `json:"e2e_p99"`
		}
	}
	if err := json.Unmarshal(body, &mod); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if mod.Period != 10 || len(mod.Models) != 2 || mod.Models[0].Model != "m" || mod.Models[1].Model != "n" {
		t.Fatalf("models: %s", body)
	}
	m := mod.Models[0]
	if len(m.T) != 1 || *m.Req[0] != 0.2 || *m.Err[0] != 0 || m.TTFTP50[0] == nil || *m.TTFTP50[0] <= 0 || m.ITLP50[0] == nil ||
		m.E2EP99[0] == nil || *m.E2EP99[0] < *m.TTFTP50[0] {
		t.Errorf("model m: %s", body)
	}
	if n := mod.Models[1]; *n.Req[0] != 0.2 || *n.Err[0] != 0 || n.TTFTP50[0] == nil || n.E2EP50[0] == nil || *n.E2EP50[0] < *n.TTFTP50[0] {
		t.Errorf("model n: %s", body)
	}

	// Routing.
	_, body = consoleGet(t, admin, "/admin/console/routing")
	var rt consoleRoutingStatus
	if err := json.Unmarshal(body, &rt); err != nil {
		t.Fatal(err)
	}
	if rt.Policy != routing.RoundRobinName || rt.PrefixIndex != nil || rt.PrefixCacheHitRatio != nil || len(rt.Tiers) != 1 {
		t.Errorf("routing: %s", body)
	}
}

// TestConsoleRoutingPrefix: a prefix-aware policy shows its index.
func TestConsoleRoutingPrefix(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	p, err := routing.NewPolicy(prefixAwareConfig())
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}), withPolicy(p))
	if st, _, b := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"`+strings.Repeat("hello ", 40)+`"}]}`); st != 200 {
		t.Fatalf("chat: %d %s", st, b)
	}
	rec := httptest.NewRecorder()
	h.gw.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/console/routing", nil))
	var rt consoleRoutingStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &rt); err != nil {
		t.Fatal(err)
	}
	if rt.Policy != routing.PrefixAwareName || rt.PrefixIndex == nil || rt.PrefixIndex.Entries == 0 || rt.PrefixIndex.Capacity < rt.PrefixIndex.Entries {
		t.Errorf("routing: %s", rec.Body)
	}
}

// TestConsoleRequestRing: the ring keeps the last requestRingSize
// requests, newest first, in a fixed buffer, and filters by key and model.
func TestConsoleRequestRing(t *testing.T) {
	var r requestRing
	for i := range 3 * requestRingSize {
		e := requestEntry{id: fmt.Sprint(i), key: []string{"a", "b"}[i%2], model: []string{"llama-8b", "qwen"}[i%3%2]}
		r.add(&e)
	}
	got := r.last(requestRingSize+10, "", "")
	if len(got) != requestRingSize || got[0].id != fmt.Sprint(3*requestRingSize-1) || got[len(got)-1].id != fmt.Sprint(2*requestRingSize) {
		t.Fatalf("%d entries, first %s, last %s", len(got), got[0].id, got[len(got)-1].id)
	}
	for _, e := range r.last(requestRingSize, "a", "llama") {
		if e.key != "a" || e.model != "llama-8b" {
			t.Fatalf("filtered: %+v", e)
		}
	}
	if n := len(r.last(requestRingSize, "a", "llama")); n == 0 || n >= requestRingSize/2 {
		t.Errorf("%d entries of key a and model llama", n)
	}
	if got := r.last(3, "b", ""); len(got) != 3 || got[0].id != fmt.Sprint(3*requestRingSize-1) {
		t.Errorf("limit: %+v", got)
	}
	// A client's long model name is kept cut.
	st := &reqState{model: strings.Repeat("x", 10_000), start: time.Now(), inTok: -1}
	s := &Server{}
	s.recordRequest(st, "/v1/chat/completions", 400, time.Now())
	if e := s.console.requests.last(1, "", ""); len(e) != 1 || len(e[0].model) != maxLoggedModel {
		t.Errorf("long model kept at %d bytes", len(e[0].model))
	}
}

// TestConsoleModelQuantiles records known latencies on an injected clock
// and checks the points' rates and quantiles, empty periods, and that the
// rows are bounded.
func TestConsoleModelQuantiles(t *testing.T) {
	var tb modelTable
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tb.advance(t0) // starts the period ending at t0+10s
	m := tb.row("m")
	for i := 1; i <= 100; i++ { // 1..100 ms
		tb.maybeAdvance(t0.Add(time.Second))
		m.e2e.observe(float64(i) / 1000)
		m.ttft.observe(0.2)
		m.requests.Add(1)
	}
	m.errors.Add(5)
	m.itl.observe(0.03)
	s := tb.series(t0.Add(modelPeriod))
	if len(s) != 1 || s[0].name != "m" || len(s[0].points) != 1 {
		t.Fatalf("series %+v", s)
	}
	p := s[0].points[0]
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want)/want > 0.1 { // a bucket is 9% wide
			t.Errorf("%s = %g, want %g ±10%%", name, got, want)
		}
	}
	near("e2e p50", p.e2e50, 0.050)
	near("e2e p99", p.e2e99, 0.099)
	near("ttft p50", p.ttft50, 0.2)
	near("ttft p99", p.ttft99, 0.2)
	near("itl p50", p.itl50, 0.03)
	if p.reqRate != 10 || p.errRate != 0.5 || p.at != t0.Add(modelPeriod).UnixMilli() {
		t.Errorf("rates %g %g at %d", p.reqRate, p.errRate, p.at)
	}
	// Three quiet periods: points with no sample.
	s = tb.series(t0.Add(4 * modelPeriod))
	if len(s[0].points) != 4 || !math.IsNaN(s[0].points[3].e2e50) || s[0].points[3].reqRate != 0 {
		t.Errorf("quiet periods: %+v", s[0].points)
	}
	// A long silence keeps 15 minutes of points, no more.
	s = tb.series(t0.Add(time.Hour))
	if len(s[0].points) != modelPeriods {
		t.Errorf("%d points after an hour, want %d", len(s[0].points), modelPeriods)
	}
	// Rows are bounded: models past maxConsoleModels share "other".
	for i := range 3 * maxConsoleModels {
		tb.row(fmt.Sprint("model-", i)).requests.Add(1)
	}
	s = tb.series(t0.Add(time.Hour + modelPeriod))
	if len(s) != maxConsoleModels+1 || s[len(s)-1].name != otherModel {
		t.Errorf("%d rows, last %q", len(s), s[len(s)-1].name)
	}
	if got := s[len(s)-1].points[len(s[len(s)-1].points)-1].reqRate; got != float64(2*maxConsoleModels+1)/10 {
		t.Errorf("other's rate %g", got)
	}
	// Quantiles: an empty delta is NaN; the overflow bucket the last bound.
	var a, b histCounts
	if !math.IsNaN(quantile(0.5, &a, &b)) {
		t.Error("quantile of nothing")
	}
	a[histBuckets] = 1
	if quantile(0.5, &a, &b) != histBounds[histBuckets-1] {
		t.Error("overflow quantile")
	}
}

// TestConsoleConfigRedaction: no secret of the configuration reaches the
// console: engine keys, URL user info, API key hashes, Redis's password
// (only its variable's name is shown).
func TestConsoleConfigRedaction(t *testing.T) {
	t.Setenv("CONSOLE_TEST_REDIS_PW", "redis-secret-value")
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://user:url-secret@127.0.0.1:1", Models: []string{"m"}, APIKey: "sk-provider-secret"})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-a", SHA256: sha("k-a"), Models: []string{"*"}, Limits: KeyLimits{TokensPerMinute: 1000}}}}
	cfg.Limits.Redis.Address, cfg.Limits.Redis.PasswordEnv = "127.0.0.1:1", "CONSOLE_TEST_REDIS_PW"
	b, err := json.Marshal(redactConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, secret := range []string{"sk-provider-secret", "url-secret", sha("k-a"), "redis-secret-value"} {
		if strings.Contains(out, secret) {
			t.Errorf("the config shows %q: %s", secret, out)
		}
	}
	for _, shown := range []string{`"api_key":"[redacted]"`, `"sha256":"[redacted]"`, `"password_env":"CONSOLE_TEST_REDIS_PW"`,
		`"tokens_per_minute":1000`, `"name":"team-a"`, `127.0.0.1:1`, `"max_body_bytes":`} {
		if !strings.Contains(out, shown) {
			t.Errorf("the config lacks %s: %s", shown, out)
		}
	}
	for _, c := range []struct {
		name string
		want bool
	}{{"api_key", true}, {"sha256", true}, {"password", true}, {"admin_token", true}, {"api_key_env", false},
		{"password_env", false}, {"tokens_file", false}, {"tokens_per_minute", false}, {"max_tokens", false}, {"key_prefix", false},
		{"bytes_per_token", false}, {"access_token", true}} {
		if got := secretField(c.name); got != c.want {
			t.Errorf("secretField(%q) = %v", c.name, got)
		}
	}
	// Names that only end like a secret's word stay.
	if got := redactString("https://h/?keyword=a&monkey=b"); got != "https://h/?keyword=a&monkey=b" {
		t.Errorf("redactString over-redacts: %q", got)
	}
	// A duration whose name ends in _token is not a secret; a URL's
	// secret query parameters and user info are, wherever they appear.
	if !strings.Contains(out, `"first_token":"5m0s"`) {
		t.Errorf("timeouts.first_token redacted: %s", out)
	}
	for _, c := range []struct{ in, secret, keep string }{
		{"https://generativelanguage.googleapis.com/v1?key=AIzaSecret123&alt=sse", "AIzaSecret123", "alt=sse"},
		{`Post "https://acct.blob.core.windows.net/c?sv=2024&sig=SASsecret%3D&se=x": dial tcp: timeout`, "SASsecret", "sv=2024"},
		{`limits.redis.address "redis://default:hunter2@redis:6379": too many colons in address`, "hunter2", "redis:6379"},
		{"wss://h/ws?access_token=tok-secret", "tok-secret", "wss://h/ws"},
		{"redis://default:p@ss@redis:6379", "p@ss", "redis:6379"},
		{"redis://default:pa/ss#x@redis:6379/0", "pa/ss", "redis:6379"},
		{"https://b.s3.amazonaws.com/o?X-Amz-Credential=AKIAcred&X-Amz-Signature=abcsig&X-Amz-Security-Token=sectok&x=1", "AKIAcred", "x=1"},
		{"https://b.s3.amazonaws.com/o?X-Amz-Signature=abcsig&x=1", "abcsig", "x=1"},
		{"https://b.s3.amazonaws.com/o?X-Amz-Security-Token=sectok", "sectok", "b.s3"},
		{"https://idp/cb#access_token=frag-secret&state=s", "frag-secret", "state=s"},
		{"https://idp/t?refresh_token=rt-secret", "rt-secret", "idp/t"},
	} {
		if got := redactString(c.in); strings.Contains(got, c.secret) || !strings.Contains(got, c.keep) || !strings.Contains(got, redacted) {
			t.Errorf("redactString(%q) = %q", c.in, got)
		}
	}
}

// TestConsoleReloads: the config endpoint lists the reloads, applied and
// rejected, newest first, with what changed.
func TestConsoleReloads(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}, APIKey: "sk-provider-secret"})
	h := newHarness(t, cfg)
	next := cfg
	next.MaxAttempts = cfg.MaxAttempts + 1
	if _, err := h.gw.Reload(next, routing.NewRoundRobin()); err != nil {
		t.Fatal(err)
	}
	bad := next
	bad.MaxAttempts = -1
	if _, err := h.gw.Reload(bad, routing.NewRoundRobin()); err == nil {
		t.Fatal("a bad config was applied")
	}
	h.gw.NoteRejectedReload(errors.New("configs/gateway.yaml: yaml: line 3: did not find expected key"))
	h.gw.NoteRejectedReload(errors.New(`limits.redis.address "redis://default:hunter2@redis:6379": too many colons`))
	h.gw.NoteRejectedReload(nil) // nothing to note
	rec := httptest.NewRecorder()
	h.gw.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/console/config", nil))
	var out struct {
		Config  map[string]any
		Reloads []consoleReload
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Reloads) != 4 || out.Reloads[0].Outcome != "rejected" || !strings.Contains(out.Reloads[0].Error, "redis:6379") ||
		strings.Contains(rec.Body.String(), "hunter2") || !strings.Contains(out.Reloads[1].Error, "yaml: line 3") ||
		out.Reloads[2].Outcome != "rejected" || out.Reloads[2].Error == "" ||
		out.Reloads[3].Outcome != "ok" || !strings.Contains(strings.Join(out.Reloads[3].Changed, ","), "server.max_attempts") {
		t.Errorf("reloads: %s", rec.Body)
	}
	if out.Config["max_attempts"] != float64(next.MaxAttempts) {
		t.Errorf("effective max_attempts %v, want %d", out.Config["max_attempts"], next.MaxAttempts)
	}
	if strings.Contains(rec.Body.String(), "sk-provider-secret") {
		t.Error("the engine's key reached the console")
	}
	// A whole file's configuration set in its place, redacted too.
	type telemetrySection struct {
		Headers map[string]string `koanf:"headers"`
	}
	type file struct {
		Gateway   Config           `koanf:"server"`
		Telemetry telemetrySection `koanf:"telemetry"`
	}
	h.gw.SetConsoleConfig(file{Gateway: next, Telemetry: telemetrySection{Headers: map[string]string{"authorization": "Bearer otlp-secret"}}})
	rec = httptest.NewRecorder()
	h.gw.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/console/config", nil))
	if body := rec.Body.String(); strings.Contains(body, "otlp-secret") || strings.Contains(body, "sk-provider-secret") ||
		!strings.Contains(body, `"authorization":"[redacted]"`) || !strings.Contains(body, `"server":{`) {
		t.Errorf("the file's config: %s", body)
	}
	h.gw.SetConsoleConfig(nil)

	// Bounded: the history keeps the last reloadHistorySize.
	for range 2 * reloadHistorySize {
		h.gw.console.reloads.note(time.Now(), ReloadReport{}, nil)
	}
	if n := len(h.gw.console.reloads.list()); n != reloadHistorySize {
		t.Errorf("%d reloads kept", n)
	}
}

// BenchmarkConsoleEngines measures one poll of the console's engines
// table over 1,000 engines, GET /admin/console/engines (allocs/op: the
// fleet's status, then one buffer from a pool), against GET
// /admin/engines on the same fleet, the full status the console's poll
// replaces (the baseline).
func BenchmarkConsoleEngines(b *testing.B) {
	engines := make([]fleet.EngineConfig, 1000)
	for i := range engines {
		engines[i] = fleet.EngineConfig{Name: fmt.Sprintf("engine-%04d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 20000+i), Models: []string{"m"}}
	}
	h := newHarness(b, testConfig(engines...), withoutStart())
	admin := h.gw.AdminHandler(nil)
	for _, c := range []struct{ name, path string }{{"console", "/admin/console/engines"}, {"admin-engines", "/admin/engines"}} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, c.path, nil)
			rec := httptest.NewRecorder()
			admin.ServeHTTP(rec, req)
			if rec.Code != 200 || strings.Count(rec.Body.String(), `"name":`) < 1000 {
				b.Fatalf("%d %d bytes", rec.Code, rec.Body.Len())
			}
			b.SetBytes(int64(rec.Body.Len()))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				rec.Body.Reset()
				admin.ServeHTTP(rec, req)
			}
		})
	}
}

// prefixAwareConfig is the default routing config with the prefix-aware
// policy.
func prefixAwareConfig() routing.Config {
	c := routing.DefaultConfig()
	c.Policy = routing.PrefixAwareName
	return c
}

// BenchmarkConsoleRecord measures what the console adds to each request
// on the request path (recordRequest: the ring's copy, the model's
// counters and histograms), one goroutine and many; it allocates nothing.
func BenchmarkConsoleRecord(b *testing.B) {
	s := &Server{}
	row := s.console.models.row("m")
	key := &apiKey{name: "team-a"}
	op := opNamed(b, "chat")
	mk := func() *reqState {
		return &reqState{id: "0123456789abcdef0123456789abcdef", model: "m", key: key, op: op, start: time.Now(), attempts: 1,
			tried: [maxLoggedEngines]string{"e1"}, ttft: 150 * time.Millisecond, inTok: 10, outTok: 16, console: row}
	}
	b.Run("serial", func(b *testing.B) {
		st := mk()
		b.ReportAllocs()
		for b.Loop() {
			s.recordRequest(st, "/v1/chat/completions", 200, time.Now())
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			st := mk()
			for pb.Next() {
				s.recordRequest(st, "/v1/chat/completions", 200, time.Now())
			}
		})
	})
	b.Run("itl", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.console.models.maybeAdvance(time.Now())
			row.itl.observe(0.03)
		}
	})
}

// TestConsoleConcurrentSafe records requests and inter-token gaps from
// several goroutines while others read the ring and the series and
// create rows (run with -race).
func TestConsoleConcurrentSafe(t *testing.T) {
	s := &Server{}
	done := make(chan struct{})
	var writers, reader sync.WaitGroup
	reader.Add(1)
	go func() {
		defer reader.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			_ = s.console.models.series(time.Now())
			_ = s.console.requests.last(50, "", "m1")
			s.console.reloads.note(time.Now(), ReloadReport{}, nil)
			_ = s.console.reloads.list()
		}
	}()
	for g := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 2000 {
				row := s.console.models.row(fmt.Sprint("m", (g+i)%40))
				st := &reqState{id: "x", model: row.name, start: time.Now(), inTok: -1, console: row, ttft: time.Millisecond}
				now := time.Now().Add(time.Duration(i) * time.Second)
				s.console.models.maybeAdvance(now)
				row.itl.observe(0.01)
				s.recordRequest(st, "/v1/chat/completions", 200, now)
			}
		}()
	}
	writers.Wait()
	close(done)
	reader.Wait()
	if n := len(s.console.requests.last(requestRingSize, "", "")); n != requestRingSize {
		t.Errorf("%d requests kept", n)
	}
	if n := len(s.console.models.series(time.Now().Add(3 * time.Hour))); n != maxConsoleModels+1 {
		t.Errorf("%d model rows", n)
	}
}

// TestConsoleRingKeepsNoClientHeaders: 500 requests, each with a 256 KB
// X-Request-Id, leave the console's ring holding
// their ids cut to MaxRequestIDLen, not the headers they were cut from
// (125 MB): memory is bounded by what the ring keeps.
func TestConsoleRingKeepsNoClientHeaders(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range 500 {
		id := strconv.Itoa(i) + strings.Repeat("x", 256<<10)
		if st, _, _ := h.do(http.MethodGet, "/v1/models", "", "X-Request-Id", id); st != http.StatusOK {
			t.Fatalf("request %d: %d, want 200", i, st)
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grown > 32<<20 {
		t.Errorf("the heap grew %d MB after 500 requests with 256 KB ids, want the ring's few hundred KB", grown>>20)
	}
	_, _, body := adminDo(h, http.MethodGet, "/admin/console/requests?limit=1", "")
	if !strings.Contains(body, `"id":"499`+strings.Repeat("x", MaxRequestIDLen-3)+`"`) {
		t.Errorf("the newest entry's id is not the cut id: %.300s", body)
	}
}
