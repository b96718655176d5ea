package gateway

import (
	"bytes"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
	"go.opentelemetry.io/otel/attribute"
)

// adminDo sends method path to the gateway's admin handler with token
// ("" for none).
func adminDo(h *harness, method, path, token string) (int, http.Header, string) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	h.gw.AdminHandler(nil).ServeHTTP(rec, req)
	return rec.Code, rec.Header(), rec.Body.String()
}

// TestAdminAuth: with admin tokens, a write action needs one of them (401
// without, or with another; the tokens from the file and the variable
// both work), reads are open unless reads: token; a reload reads the
// file again (a rotated token works at once, the old one no longer);
// failures are counted and no token is ever logged.
func TestAdminAuth(t *testing.T) {
	const a, b, c = "adm-token-one-4f1e-0a9b8c7d", "adm-token-two-9c2d-1e2f3a4b", "adm-token-three-77aa-5c6d"
	dir := t.TempDir()
	file := filepath.Join(dir, "admin-tokens")
	if err := os.WriteFile(file, []byte("# admin\n"+a+"\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SB_TEST_ADMIN_TOKENS", b)
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.AdminAuth = AdminAuthConfig{TokensFile: file, TokensEnv: "SB_TEST_ADMIN_TOKENS", Reads: AdminReadsOpen}
	var logs bytes.Buffer
	var mu sync.Mutex
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug})))})

	if st, _, _ := adminDo(h, http.MethodGet, "/admin/engines", ""); st != http.StatusOK {
		t.Errorf("read without a token: %d, want 200 (reads: open)", st)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/debug/pprof/", ""); st != http.StatusUnauthorized {
		t.Errorf("pprof without a token, tokens configured: %d, want 401", st)
	}
	if st, hdr, body := adminDo(h, http.MethodPost, "/admin/engines/e1/drain", ""); st != http.StatusUnauthorized || !strings.Contains(body, "missing_admin_token") || hdr.Get("WWW-Authenticate") == "" {
		t.Errorf("drain without a token: %d %s, want 401 missing_admin_token with WWW-Authenticate", st, body)
	}
	if st, _, body := adminDo(h, http.MethodPost, "/admin/engines/e1/drain", c); st != http.StatusUnauthorized || !strings.Contains(body, "invalid_admin_token") {
		t.Errorf("drain with another token: %d %s, want 401 invalid_admin_token", st, body)
	}
	if h.engineStates()["e1"] != "ready" {
		t.Fatalf("a refused drain drained: %v", h.engineStates())
	}
	for _, tok := range []string{a, b} {
		if st, _, body := adminDo(h, http.MethodPost, "/admin/engines/e1/drain", tok); st != http.StatusOK {
			t.Errorf("drain with an admin token: %d %s", st, body)
		}
		if st, _, body := adminDo(h, http.MethodPost, "/admin/engines/e1/undrain", tok); st != http.StatusOK {
			t.Errorf("undrain with an admin token: %d %s", st, body)
		}
	}
	if n := h.counter(telemetry.AdminAuthFailuresName, attribute.String("reason", "missing")); n != 2 { // the drain and the profile
		t.Errorf("missing-token failures %d, want 2", n)
	}
	if n := h.counter(telemetry.AdminAuthFailuresName, attribute.String("reason", "invalid")); n != 1 {
		t.Errorf("invalid-token failures %d, want 1", n)
	}

	// Rotated in the file, then a reload: c works, a no longer.
	if err := os.WriteFile(file, []byte(c+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg2 := cfg
	cfg2.AdminAuth.Reads = AdminReadsToken
	h.reload(cfg2, routing.NewRoundRobin())
	if st, _, _ := adminDo(h, http.MethodPost, "/admin/engines/e1/undrain", a); st != http.StatusUnauthorized {
		t.Errorf("the rotated-out token after the reload: %d, want 401", st)
	}
	if st, _, _ := adminDo(h, http.MethodPost, "/admin/engines/e1/undrain", c); st != http.StatusOK {
		t.Errorf("the new token after the reload: %d, want 200", st)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/engines", ""); st != http.StatusUnauthorized {
		t.Errorf("a read without a token with reads: token: %d, want 401", st)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/engines", c); st != http.StatusOK {
		t.Errorf("a read with a token: %d, want 200", st)
	}
	// The scheme is case-insensitive.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/admin/engines/e1/undrain", nil)
	req.Header.Set("Authorization", "bearer "+c)
	h.gw.AdminHandler(nil).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("a lower-case bearer scheme: %d, want 200", rec.Code)
	}
	// A reload whose tokens cannot be read is rejected: the tokens and
	// settings in force stay.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if _, err := h.gw.Reload(cfg2, routing.NewRoundRobin()); err == nil || !strings.Contains(err.Error(), "tokens_file") {
		t.Errorf("a reload with an unreadable tokens file: %v, want it rejected", err)
	}
	if st, _, _ := adminDo(h, http.MethodPost, "/admin/engines/e1/undrain", c); st != http.StatusOK {
		t.Errorf("the token in force after a rejected reload: %d, want 200", st)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tok := range []string{a, b, c} {
		if strings.Contains(logs.String(), tok) {
			t.Errorf("token %q logged", tok)
		}
	}
}

// TestAdminAuthNoTokens: without admin tokens a write action is refused
// (403 admin_token_required) unless admin.auth.open_writes; reads are
// open.
func TestAdminAuthNoTokens(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.AdminAuth = AdminAuthConfig{}
	h := newHarness(t, cfg)
	if st, _, body := adminDo(h, http.MethodPost, "/admin/engines/e1/drain", ""); st != http.StatusForbidden || !strings.Contains(body, "admin_token_required") {
		t.Errorf("drain without tokens configured: %d %s, want 403 admin_token_required", st, body)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/engines", ""); st != http.StatusOK {
		t.Errorf("read: %d, want 200", st)
	}
	// A reload that changes only admin.auth, with the same policy (as the
	// binary reloads an unchanged routing section), applies it.
	pol := routing.NewRoundRobin()
	h.reload(cfg, pol)
	cfg.AdminAuth.OpenWrites = true
	cfg.AdminAuth.AllowedHosts = []string{"example.com"} // httptest.NewRequest's Host
	if rep := h.reload(cfg, pol); !slices.Contains(rep.Settings, "admin.auth") {
		t.Errorf("reload report %+v, want admin.auth among the settings changed", rep)
	}
	if st, _, body := adminDo(h, http.MethodPost, "/admin/engines/e1/drain", ""); st != http.StatusOK {
		t.Errorf("drain with open_writes: %d %s, want 200", st, body)
	}
	cfg.AdminAuth.OpenWrites = false
	h.reload(cfg, pol)
	if st, _, _ := adminDo(h, http.MethodPost, "/admin/engines/e1/undrain", ""); st != http.StatusForbidden {
		t.Errorf("undrain after open_writes was turned off by a reload: %d, want 403", st)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/debug/pprof/", ""); st != http.StatusOK {
		t.Errorf("pprof without tokens configured: %d, want 200 (reads open)", st)
	}
	m, _ := telemetry.NewMetrics(nil)
	bad := cfg
	bad.AdminAuth = AdminAuthConfig{Reads: AdminReadsToken}
	if _, err := New(bad, routing.NewRoundRobin(), m); err == nil || !strings.Contains(err.Error(), "needs admin tokens") {
		t.Errorf("reads: token without tokens: %v", err)
	}
	bad.AdminAuth = AdminAuthConfig{TokensEnv: "SB_TEST_UNSET_ADMIN"}
	t.Setenv("SB_TEST_UNSET_ADMIN", "")
	if _, err := New(bad, routing.NewRoundRobin(), m); err == nil || !strings.Contains(err.Error(), "SB_TEST_UNSET_ADMIN") {
		t.Errorf("an empty tokens variable: %v, want an error naming it", err)
	}
	t.Setenv("SB_TEST_UNSET_ADMIN", "short-token")
	if _, err := New(bad, routing.NewRoundRobin(), m); err == nil || !strings.Contains(err.Error(), "shorter than") || strings.Contains(err.Error(), "short-token") {
		t.Errorf("a short token: %v, want it refused without showing it", err)
	}
}

// TestAdminGateLimitsFailures: past maxAdminFailures failures in a second
// from one address, every attempt from it, a valid one too, is refused
// unchecked until the next second; another address is not locked out
// until every address together has failed 10 times as often.
func TestAdminGateLimitsFailures(t *testing.T) {
	var g adminGate
	g.set(adminTokens{write: [][32]byte{sha256.Sum256([]byte("good"))}})
	now := time.Unix(1_800_000_000, 0)
	for i := range maxAdminFailures {
		if kind, limited := g.check("bad", "10.0.0.1", now); kind != adminNone || limited {
			t.Fatalf("failure %d: kind %d limited %v", i, kind, limited)
		}
	}
	if kind, limited := g.check("good", "10.0.0.1", now.Add(500*time.Millisecond)); kind != adminNone || !limited {
		t.Errorf("past the limit in the same second: kind %d limited %v, want refused unchecked", kind, limited)
	}
	if kind, limited := g.check("good", "10.0.0.2", now.Add(500*time.Millisecond)); kind != adminWrite || limited {
		t.Errorf("another address: kind %d limited %v, want accepted", kind, limited)
	}
	if kind, limited := g.check("good", "10.0.0.1", now.Add(time.Second)); kind != adminWrite || limited {
		t.Errorf("the next second: kind %d limited %v, want accepted", kind, limited)
	}
	// Many addresses together: 10 x maxAdminFailures, then everyone waits.
	later := now.Add(2 * time.Second)
	for i := range 10 * maxAdminFailures {
		if _, limited := g.check("bad", "10.1.0."+strconv.Itoa(i%maxAdminFailures*10+i/maxAdminFailures), later); limited {
			t.Fatalf("failure %d limited before the global count", i)
		}
	}
	if kind, limited := g.check("good", "10.9.9.9", later); kind != adminNone || !limited {
		t.Errorf("past the global count: kind %d limited %v, want refused", kind, limited)
	}
}

// adminSend sends method path with the headers hdr (name, value, ...) and
// body to the gateway's admin handler.
func adminSend(h *harness, method, path, body string, hdr ...string) (int, string) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	h.gw.AdminHandler(nil).ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestAdminAuthReadOnlyToken: a read-only token opens reads (under reads:
// token, the console's data, pprof) and is refused 403 on every write;
// the console's data needs a token even while reads are open.
func TestAdminAuthReadOnlyToken(t *testing.T) {
	const w, r = "adm-write-token-5e6f-7a8b9c0d", "adm-read-token-1a2b-3c4d5e6f"
	t.Setenv("SB_TEST_ADMIN_W", w)
	t.Setenv("SB_TEST_ADMIN_R", r)
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.AdminAuth = AdminAuthConfig{TokensEnv: "SB_TEST_ADMIN_W", ReadTokensEnv: "SB_TEST_ADMIN_R", Reads: AdminReadsOpen, OpenWrites: true, AllowedHosts: []string{"example.com"}}
	h := newHarness(t, cfg)
	for _, path := range []string{"/admin/engines/e1/drain", "/admin/engines/e1/sleep?level=1", "/admin/engines/e1/wake_up"} {
		if st, _, body := adminDo(h, http.MethodPost, path, r); st != http.StatusForbidden || !strings.Contains(body, "admin_token_read_only") {
			t.Errorf("POST %s with a read-only token: %d %s, want 403 admin_token_read_only", path, st, body)
		}
	}
	if h.engineStates()["e1"] != "ready" {
		t.Fatalf("a read-only token drained: %v", h.engineStates())
	}
	if n := h.counter(telemetry.AdminAuthFailuresName, attribute.String("reason", "read_only")); n != 3 {
		t.Errorf("read_only failures %d, want 3", n)
	}
	if st, _, _ := adminDo(h, http.MethodPost, "/admin/engines/e1/drain", w); st != http.StatusOK {
		t.Errorf("drain with the write token: %d, want 200", st)
	}
	// The console's data: a token of either kind, even with reads open
	// (and with open_writes, which matters only without tokens).
	for _, path := range []string{"/admin/console/engines", "/admin/keys", "/admin/keys/team-a"} {
		if st, _, _ := adminDo(h, http.MethodGet, path, ""); st != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, st)
		}
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/keys", r); st != http.StatusOK {
		t.Errorf("GET /admin/keys with a read-only token: %d, want 200", st)
	}
	for _, tok := range []string{r, w} {
		if st, _, _ := adminDo(h, http.MethodGet, "/admin/console/engines", tok); st == http.StatusUnauthorized || st == http.StatusForbidden {
			t.Errorf("console data with a token: %d, want it through", st)
		}
		if st, _, _ := adminDo(h, http.MethodGet, "/debug/pprof/", tok); st != http.StatusOK {
			t.Errorf("pprof with a token: %d, want 200", st)
		}
	}
	cfg.AdminAuth.Reads = AdminReadsToken
	h.reload(cfg, routing.NewRoundRobin())
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/engines", r); st != http.StatusOK {
		t.Errorf("a read with the read-only token under reads: token: %d, want 200", st)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/engines", ""); st != http.StatusUnauthorized {
		t.Errorf("a read without a token under reads: token: %d, want 401", st)
	}
	// Without tokens the console's data follows open_writes.
	cfg.AdminAuth = AdminAuthConfig{}
	h.reload(cfg, routing.NewRoundRobin())
	if st, _, body := adminDo(h, http.MethodGet, "/admin/console/engines", ""); st != http.StatusForbidden || !strings.Contains(body, "admin_token_required") {
		t.Errorf("console data without tokens or open_writes: %d %s, want 403 admin_token_required", st, body)
	}
}

// TestAdminAuthCrossOrigin: a write a browser sends from a page of another
// origin (a CSRF form post) is refused 403 cross_origin_request before
// the token is looked at, even on a listener with open writes; the same
// form post from the admin listener's own origin still needs the bearer
// token a form cannot carry; a same-origin fetch with the token works.
func TestAdminAuthCrossOrigin(t *testing.T) {
	const w = "adm-write-token-0f1e-2d3c4b5a"
	t.Setenv("SB_TEST_ADMIN_W", w)
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.AdminAuth = AdminAuthConfig{Reads: AdminReadsOpen, OpenWrites: true, AllowedHosts: []string{"example.com"}} // no tokens: writes open
	h := newHarness(t, cfg)
	form := "application/x-www-form-urlencoded"
	cases := []struct {
		name string
		hdr  []string
	}{
		{"Sec-Fetch-Site cross-site", []string{"Content-Type", form, "Sec-Fetch-Site", "cross-site", "Origin", "https://evil.example"}},
		{"Sec-Fetch-Site same-site", []string{"Content-Type", form, "Sec-Fetch-Site", "same-site", "Origin", "http://other.example.com"}},
		{"Origin only", []string{"Content-Type", form, "Origin", "https://evil.example"}},
	}
	for _, c := range cases {
		if st, body := adminSend(h, http.MethodPost, "/admin/engines/e1/drain", "x=1", c.hdr...); st != http.StatusForbidden || !strings.Contains(body, "cross_origin_request") {
			t.Errorf("%s: %d %s, want 403 cross_origin_request", c.name, st, body)
		}
	}
	if h.engineStates()["e1"] != "ready" {
		t.Fatalf("a cross-origin form post drained: %v", h.engineStates())
	}
	if n := h.counter(telemetry.AdminAuthFailuresName, attribute.String("reason", "cross_origin")); n != int64(len(cases)) {
		t.Errorf("cross_origin failures %d, want %d", n, len(cases))
	}
	// A cross-origin read is harmless and allowed (the browser keeps the
	// answer from the other page).
	if st, _ := adminSend(h, http.MethodGet, "/admin/engines", "", "Sec-Fetch-Site", "cross-site"); st != http.StatusOK {
		t.Errorf("cross-site GET: %d, want 200", st)
	}
	// With a token configured, a same-origin form post (no bearer) is 401.
	cfg.AdminAuth = AdminAuthConfig{TokensEnv: "SB_TEST_ADMIN_W", Reads: AdminReadsOpen}
	h.reload(cfg, routing.NewRoundRobin())
	if st, body := adminSend(h, http.MethodPost, "/admin/engines/e1/drain", "x=1", "Content-Type", form, "Sec-Fetch-Site", "same-origin"); st != http.StatusUnauthorized {
		t.Errorf("same-origin form post without a token: %d %s, want 401", st, body)
	}
	if st, body := adminSend(h, http.MethodPost, "/admin/engines/e1/drain", "", "Sec-Fetch-Site", "same-origin", "Authorization", "Bearer "+w); st != http.StatusOK {
		t.Errorf("same-origin fetch with the token: %d %s, want 200", st, body)
	}
}

// TestAdminWriteRoutesNeedWriteToken walks every route of the admin
// handler: each write method of each route (engine admin, drain, the
// keys API, reload, whatever is added later) is refused without a token
// (401), with a read-only token (403 admin_token_read_only) and from
// another origin (403 cross_origin_request), and nothing changes.
func TestAdminWriteRoutesNeedWriteToken(t *testing.T) {
	const w, r = "adm-walk-write-token-8d7c6b5a", "adm-walk-read-token-4e3f2a1b0c"
	t.Setenv("SB_TEST_ADMIN_W", w)
	t.Setenv("SB_TEST_ADMIN_R", r)
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.AdminAuth = AdminAuthConfig{TokensEnv: "SB_TEST_ADMIN_W", ReadTokensEnv: "SB_TEST_ADMIN_R", Reads: AdminReadsOpen}
	h := newHarness(t, cfg)
	routes, ok := h.gw.AdminHandler(nil).(chi.Routes)
	if !ok {
		t.Fatal("the admin handler is not a chi router")
	}
	type call struct{ method, path string }
	var calls []call
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		path := strings.NewReplacer("{name}", "e1", "{action}", "sleep", "/*", "/x").Replace(route)
		if method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions || method == http.MethodTrace || method == http.MethodConnect {
			return nil
		}
		calls = append(calls, call{method, path})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range calls {
		seen[c.path] = true
		if st, body := adminSend(h, c.method, c.path, "{}"); st != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d %s, want 401", c.method, c.path, st, body)
		}
		if st, body := adminSend(h, c.method, c.path, "{}", "Authorization", "Bearer "+r); st != http.StatusForbidden || !strings.Contains(body, "admin_token_read_only") {
			t.Errorf("%s %s with a read-only token: %d %s, want 403 admin_token_read_only", c.method, c.path, st, body)
		}
		if st, body := adminSend(h, c.method, c.path, "{}", "Authorization", "Bearer "+w, "Sec-Fetch-Site", "cross-site"); st != http.StatusForbidden || !strings.Contains(body, "cross_origin_request") {
			t.Errorf("%s %s cross-site with the write token: %d %s, want 403 cross_origin_request", c.method, c.path, st, body)
		}
	}
	for _, want := range []string{"/admin/engines/e1/drain", "/admin/keys", "/admin/reload", "/admin/models/sleep"} {
		if !seen[want] {
			t.Errorf("the walk found no write route %s (routes: %v)", want, calls)
		}
	}
	if h.engineStates()["e1"] != "ready" {
		t.Errorf("a refused call changed e1: %v", h.engineStates())
	}
}

// TestAdminOpenWritesHosts: under open writes (no token) the listener
// answers only requests to an address, localhost or an allowed name, so
// a page rebinding its own name to the listener (DNS rebinding) is
// refused even though the browser sees it as same-origin; with a token
// configured the Host does not matter.
func TestAdminOpenWritesHosts(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.AdminAuth = AdminAuthConfig{Reads: AdminReadsOpen, OpenWrites: true, AllowedHosts: []string{"gw-admin.internal"}}
	h := newHarness(t, cfg)
	send := func(method, host, path string, hdr ...string) (int, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, path, nil)
		req.Host = host
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		h.gw.AdminHandler(nil).ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	rebound := "rebind.evil.example:9464"
	if st, body := send(http.MethodPost, rebound, "/admin/engines/e1/drain", "Origin", "http://"+rebound, "Sec-Fetch-Site", "same-origin"); st != http.StatusForbidden || !strings.Contains(body, "admin_host_not_allowed") {
		t.Errorf("a rebound name's same-origin drain: %d %s, want 403 admin_host_not_allowed", st, body)
	}
	if st, _ := send(http.MethodGet, rebound, "/admin/keys"); st != http.StatusForbidden {
		t.Errorf("a rebound name's read: %d, want 403", st)
	}
	if h.engineStates()["e1"] != "ready" {
		t.Fatalf("a rebound page drained e1: %v", h.engineStates())
	}
	if n := h.counter(telemetry.AdminAuthFailuresName, attribute.String("reason", "host_not_allowed")); n != 2 {
		t.Errorf("host_not_allowed failures %d, want 2", n)
	}
	for _, host := range []string{"127.0.0.1:9464", "[::1]:9464", "localhost:9464", "LOCALHOST", "10.1.2.3", "GW-ADMIN.internal:9464"} {
		if st, _ := send(http.MethodGet, host, "/admin/engines"); st != http.StatusOK {
			t.Errorf("host %s: %d, want 200", host, st)
		}
	}
	// With a token the Host is not looked at: the token is the check.
	t.Setenv("SB_TEST_ADMIN_W", "adm-host-write-token-1f2e3d4c5b")
	cfg.AdminAuth = AdminAuthConfig{TokensEnv: "SB_TEST_ADMIN_W", Reads: AdminReadsOpen}
	h.reload(cfg, routing.NewRoundRobin())
	if st, _ := send(http.MethodGet, "switchboard-admin.ns.svc:9464", "/admin/engines"); st != http.StatusOK {
		t.Errorf("a service name's read with tokens configured: %d, want 200", st)
	}
	// The console's page loads without a token (it holds no data), even
	// under reads: token.
	cfg.AdminAuth.Reads = AdminReadsToken
	h.reload(cfg, routing.NewRoundRobin())
	if st, _ := send(http.MethodGet, "127.0.0.1", "/console/"); st != http.StatusOK {
		t.Errorf("the console page under reads: token: %d, want 200", st)
	}
	if st, _ := send(http.MethodGet, "127.0.0.1", "/admin/console/engines"); st != http.StatusUnauthorized {
		t.Errorf("the console's data without a token: %d, want 401", st)
	}
}
