package gateway

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/quota"
)

// adminCall sends method path with body to h's admin handler and returns
// the status and body.
func adminCall(t *testing.T, h *harness, method, path, body string) (int, []byte) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.gw.AdminHandler(nil).ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// adminErr decodes an admin error body.
func adminErr(t *testing.T, b []byte) (code, param, msg string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("not an error body: %s", b)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return code, param, e.Error.Message
}

// createKey creates a key through the API and returns its answer.
func createKey(t *testing.T, h *harness, body string) createdKey {
	t.Helper()
	st, b := adminCall(t, h, http.MethodPost, "/admin/keys", body)
	if st != http.StatusCreated {
		t.Fatalf("POST /admin/keys %s: %d %s", body, st, b)
	}
	var k createdKey
	if err := json.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	return k
}

// listKeys returns GET /admin/keys by name, and its raw body.
func listKeys(t *testing.T, h *harness) (map[string]KeyStatus, string) {
	t.Helper()
	st, b := adminCall(t, h, http.MethodGet, "/admin/keys", "")
	if st != http.StatusOK {
		t.Fatalf("GET /admin/keys: %d %s", st, b)
	}
	var list struct {
		Keys []KeyStatus `json:"keys"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]KeyStatus{}
	for _, k := range list.Keys {
		out[k.Name] = k
	}
	return out, string(b)
}

// chatWith sends chatM with key ("" none) and returns the status.
func chatWith(h *harness, key, body string) int {
	var hdr []string
	if key != "" {
		hdr = []string{"Authorization", "Bearer " + key}
	}
	st, _, _ := h.do(http.MethodPost, "/v1/chat/completions", body, hdr...)
	return st
}

// fileKeysConfig: a config key (team-cfg, "k-cfg") and a keys file at a
// temporary path holding file-a ("k-file").
func fileKeysConfig(t *testing.T, url string) (Config, string) {
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: url, Models: []string{"m", "other"}})
	path := filepath.Join(t.TempDir(), "keys.yaml")
	fileKey := KeyConfig{Name: "file-a", SHA256: sha("k-file"), Models: []string{"*"}, Source: KeySourceKeysFile}
	if err := os.WriteFile(path, KeysFileYAML([]KeyConfig{fileKey}), 0o640); err != nil {
		t.Fatal(err)
	}
	cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-cfg", SHA256: sha("k-cfg"), Models: []string{"*"}}, fileKey}, KeysFilePath: path}
	return cfg, path
}

// TestKeysAPIFile: without Redis the keys API keeps its keys in the keys
// file: a key created is served at once and written (its hash, never its
// secret), listed without secret or hash, changed (limits, models) with
// effect on the next request, revoked (401, gone from the file); keys of
// the config file refuse changes.
func TestKeysAPIFile(t *testing.T) {
	var rec recorder
	cfg, path := fileKeysConfig(t, okEngine(t, &rec))
	h := newHarness(t, cfg)

	k := createKey(t, h, `{"name":"team-a","models":["m"],"limits":{"tokens_per_minute":100000}}`)
	if !strings.HasPrefix(k.Key, KeyPrefix) || len(k.Key) != len(KeyPrefix)+43 {
		t.Fatalf("key %q, want sk-sb- and 43 base64url characters", k.Key)
	}
	if k.Name != "team-a" || k.Source != KeySourceKeysFile || k.CreatedAt.IsZero() || k.Limits.TokensPerMinute != 100000 || len(k.Models) != 1 || k.Models[0] != "m" {
		t.Errorf("created %+v", k)
	}
	if st := chatWith(h, k.Key, chatM); st != http.StatusOK {
		t.Fatalf("the new key: %d, want 200", st)
	}
	if st := chatWith(h, "k-cfg", chatM); st != http.StatusOK {
		t.Fatalf("the config key: %d, want 200", st)
	}
	hash := sha(k.Key)
	file, _ := os.ReadFile(path)
	if !strings.Contains(string(file), `name: "team-a"`) || !strings.Contains(string(file), hash) || strings.Contains(string(file), k.Key) {
		t.Errorf("keys file:\n%s\nwant team-a with its hash, never its secret", file)
	}
	if !strings.Contains(string(file), `name: "file-a"`) {
		t.Errorf("keys file lost file-a:\n%s", file)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("keys file mode %v, want the old 0640", fi.Mode().Perm())
	}
	keys, raw := listKeys(t, h)
	if strings.Contains(raw, k.Key) || strings.Contains(raw, hash) || strings.Contains(raw, sha("k-cfg")) {
		t.Errorf("GET /admin/keys shows a secret or a hash: %s", raw)
	}
	if got := keys["team-a"]; got.Source != KeySourceKeysFile || got.CreatedAt == nil || !got.CreatedAt.Equal(k.CreatedAt) || got.Admitted != 1 {
		t.Errorf("team-a listed as %+v", got)
	}
	if got := keys["team-cfg"]; got.Source != KeySourceConfig || got.CreatedAt != nil {
		t.Errorf("team-cfg listed as %+v", got)
	}
	if got := keys["file-a"]; got.Source != KeySourceKeysFile || got.CreatedAt != nil {
		t.Errorf("file-a listed as %+v", got)
	}

	// Limits replace the whole object and apply to the next request.
	st, b := adminCall(t, h, http.MethodPatch, "/admin/keys/team-a", `{"limits":{"requests_per_minute":1}}`)
	var entry KeyStatus
	if st != http.StatusOK || json.Unmarshal(b, &entry) != nil || entry.Limits != (KeyLimits{RequestsPerMinute: 1}) || entry.Name != "team-a" {
		t.Fatalf("PATCH limits: %d %s", st, b)
	}
	if first, second := chatWith(h, k.Key, chatM), chatWith(h, k.Key, chatM); first != http.StatusOK || second != http.StatusTooManyRequests {
		t.Errorf("requests_per_minute 1: %d then %d, want 200 then 429", first, second)
	}
	if st, b := adminCall(t, h, http.MethodPatch, "/admin/keys/team-a", `{"models":["other"],"limits":{}}`); st != http.StatusOK {
		t.Fatalf("PATCH models: %d %s", st, b)
	}
	if st := chatWith(h, k.Key, chatM); st != http.StatusForbidden {
		t.Errorf("model m after models [other]: %d, want 403", st)
	}
	if st := chatWith(h, k.Key, chatOther); st != http.StatusOK {
		t.Errorf("model other: %d, want 200", st)
	}
	if file, _ := os.ReadFile(path); !strings.Contains(string(file), `models: ["other"]`) || strings.Contains(string(file), "requests_per_minute") {
		t.Errorf("keys file after the PATCHes:\n%s", file)
	}

	for _, m := range []string{http.MethodPatch, http.MethodDelete} {
		st, b := adminCall(t, h, m, "/admin/keys/team-cfg", `{"models":["m"]}`)
		if code, _, _ := adminErr(t, b); st != http.StatusConflict || code != "key_managed_in_config" {
			t.Errorf("%s a config key: %d %s, want 409 key_managed_in_config", m, st, b)
		}
	}
	for _, name := range []string{"team-cfg", "file-a", "team-a"} {
		st, b := adminCall(t, h, http.MethodPost, "/admin/keys", `{"name":"`+name+`","models":["*"]}`)
		if code, _, _ := adminErr(t, b); st != http.StatusConflict || code != "key_exists" {
			t.Errorf("create %s again: %d %s, want 409 key_exists", name, st, b)
		}
	}

	st, b = adminCall(t, h, http.MethodDelete, "/admin/keys/team-a", "")
	if st != http.StatusOK || strings.TrimSpace(string(b)) != `{"name":"team-a","revoked":true}` {
		t.Fatalf("DELETE: %d %s", st, b)
	}
	if st := chatWith(h, k.Key, chatOther); st != http.StatusUnauthorized {
		t.Errorf("a revoked key: %d, want 401", st)
	}
	if file, _ := os.ReadFile(path); strings.Contains(string(file), "team-a") || !strings.Contains(string(file), "file-a") {
		t.Errorf("keys file after the revocation:\n%s", file)
	}
	for _, m := range []string{http.MethodDelete, http.MethodPatch, http.MethodGet} {
		st, b := adminCall(t, h, m, "/admin/keys/team-a", `{"models":["m"]}`)
		if code, _, _ := adminErr(t, b); st != http.StatusNotFound || code != "key_not_found" {
			t.Errorf("%s a revoked key: %d %s, want 404", m, st, b)
		}
	}
	// A keys file key is the API's to revoke too.
	if st, b := adminCall(t, h, http.MethodDelete, "/admin/keys/file-a", ""); st != http.StatusOK {
		t.Errorf("DELETE file-a: %d %s", st, b)
	}
	if file, _ := os.ReadFile(path); string(file) != string(KeysFileYAML(nil)) {
		t.Errorf("keys file with no key:\n%s", file)
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*tmp")); len(matches) != 0 {
		t.Errorf("temporary files left: %v", matches)
	}
}

// TestKeysAPILastKey: revoking the last key would turn auth off (every
// request served): refused with 409 last_key.
func TestKeysAPILastKey(t *testing.T) {
	var rec recorder
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: okEngine(t, &rec), Models: []string{"m"}})
	path := filepath.Join(t.TempDir(), "keys.yaml")
	only := KeyConfig{Name: "only", SHA256: sha("k-only"), Models: []string{"*"}, Source: KeySourceKeysFile}
	if err := os.WriteFile(path, KeysFileYAML([]KeyConfig{only}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Auth = AuthConfig{Keys: []KeyConfig{only}, KeysFilePath: path}
	h := newHarness(t, cfg)
	st, b := adminCall(t, h, http.MethodDelete, "/admin/keys/only", "")
	if code, _, _ := adminErr(t, b); st != http.StatusConflict || code != "last_key" {
		t.Errorf("DELETE the last key: %d %s, want 409 last_key", st, b)
	}
	if st := chatWith(h, "", chatM); st != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", st)
	}
}

// TestKeysAPIUnavailable: with neither Redis nor a keys file the writes
// answer 409 keys_api_unavailable naming both settings; GET still lists.
func TestKeysAPIUnavailable(t *testing.T) {
	var rec recorder
	h := newHarness(t, authConfig(okEngine(t, &rec), false))
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/admin/keys", `{"name":"x","models":["*"]}`},
		{http.MethodPatch, "/admin/keys/x", `{"models":["*"]}`},
		{http.MethodDelete, "/admin/keys/x", ""},
	} {
		st, b := adminCall(t, h, c.method, c.path, c.body)
		code, _, msg := adminErr(t, b)
		if st != http.StatusConflict || code != "keys_api_unavailable" || !strings.Contains(msg, "limits.redis.address") || !strings.Contains(msg, "auth.keys_file") {
			t.Errorf("%s %s: %d %s", c.method, c.path, st, b)
		}
	}
	keys, _ := listKeys(t, h)
	if len(keys) != 2 || keys["team-m"].Source != KeySourceConfig {
		t.Errorf("listed %+v", keys)
	}
}

// TestKeysAPIBadBodies: a bad body is 400 with the field named, and
// changes nothing.
func TestKeysAPIBadBodies(t *testing.T) {
	var rec recorder
	cfg, path := fileKeysConfig(t, okEngine(t, &rec))
	h := newHarness(t, cfg)
	before, _ := os.ReadFile(path)
	big := `{"name":"` + strings.Repeat("a", maxAdminBody) + `","models":["*"]}`
	for _, c := range []struct {
		name, method, path, body string
		code, param              string
	}{
		{"unknown field", http.MethodPost, "/admin/keys", `{"name":"a","models":["*"],"secret":"x"}`, "unknown_field", "secret"},
		{"unknown limit", http.MethodPost, "/admin/keys", `{"name":"a","models":["*"],"limits":{"rpm":1}}`, "unknown_field", "rpm"},
		{"bad glob", http.MethodPost, "/admin/keys", `{"name":"a","models":["["]}`, "invalid_key", "models"},
		{"no models", http.MethodPost, "/admin/keys", `{"name":"a"}`, "invalid_key", "models"},
		{"negative limit", http.MethodPost, "/admin/keys", `{"name":"a","models":["*"],"limits":{"concurrent":-1}}`, "invalid_key", "limits"},
		{"spend too high", http.MethodPost, "/admin/keys", `{"name":"a","models":["*"],"limits":{"max_spend_per_day":1e12}}`, "invalid_key", "limits"},
		{"no name", http.MethodPost, "/admin/keys", `{"models":["*"]}`, "invalid_key", "name"},
		{"long name", http.MethodPost, "/admin/keys", `{"name":"` + strings.Repeat("n", MaxKeyNameLen+1) + `","models":["*"]}`, "invalid_key", "name"},
		{"control in name", http.MethodPost, "/admin/keys", `{"name":"a\u0001","models":["*"]}`, "invalid_key", "name"},
		{"wrong type", http.MethodPost, "/admin/keys", `{"name":"a","models":["*"],"limits":{"concurrent":1.5}}`, "invalid_json", "limits.concurrent"},
		{"oversized", http.MethodPost, "/admin/keys", big, "body_too_large", ""},
		{"empty", http.MethodPost, "/admin/keys", ``, "invalid_json", ""},
		{"trailing", http.MethodPost, "/admin/keys", `{"name":"a","models":["*"]} {}`, "invalid_json", ""},
		{"not json", http.MethodPost, "/admin/keys", `name=a`, "invalid_json", ""},
		{"patch nothing", http.MethodPatch, "/admin/keys/file-a", `{}`, "", ""},
		{"patch unknown", http.MethodPatch, "/admin/keys/file-a", `{"name":"b"}`, "unknown_field", "name"},
		{"patch bad glob", http.MethodPatch, "/admin/keys/file-a", `{"models":["a[b"]}`, "invalid_key", "models"},
		{"patch negative", http.MethodPatch, "/admin/keys/file-a", `{"limits":{"tokens_per_minute":-5}}`, "invalid_key", "limits"},
	} {
		st, b := adminCall(t, h, c.method, c.path, c.body)
		code, param, msg := adminErr(t, b)
		want := http.StatusBadRequest
		if c.code == "body_too_large" {
			want = http.StatusRequestEntityTooLarge
		}
		if st != want || code != c.code || param != c.param || msg == "" {
			t.Errorf("%s: %d code %q param %q (%s), want %d %q %q", c.name, st, code, param, msg, want, c.code, c.param)
		}
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Errorf("the keys file changed:\n%s", after)
	}
	if keys, _ := listKeys(t, h); len(keys) != 2 {
		t.Errorf("keys %v, want the two configured", keys)
	}
}

// TestKeysAPIConcurrentCreatesConcurrentSafe: creates at once all land in
// the keys file and in force.
func TestKeysAPIConcurrentCreatesConcurrentSafe(t *testing.T) {
	var rec recorder
	cfg, path := fileKeysConfig(t, okEngine(t, &rec))
	h := newHarness(t, cfg)
	const n = 16
	secrets := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest(http.MethodPost, "/admin/keys", strings.NewReader(fmt.Sprintf(`{"name":"c-%d","models":["*"]}`, i)))
			w := httptest.NewRecorder()
			h.gw.AdminHandler(nil).ServeHTTP(w, req)
			var k createdKey
			if w.Code == http.StatusCreated && json.Unmarshal(w.Body.Bytes(), &k) == nil {
				secrets[i] = k.Key
			}
		}()
	}
	wg.Wait()
	file, _ := os.ReadFile(path)
	for i, s := range secrets {
		if s == "" {
			t.Fatalf("create c-%d failed", i)
		}
		if !strings.Contains(string(file), fmt.Sprintf(`name: "c-%d"`, i)) || !strings.Contains(string(file), sha(s)) {
			t.Errorf("c-%d is not in the keys file", i)
		}
		if st := chatWith(h, s, chatM); st != http.StatusOK {
			t.Errorf("c-%d: %d, want 200", i, st)
		}
	}
	if keys, _ := listKeys(t, h); len(keys) != n+2 {
		t.Errorf("%d keys listed, want %d", len(keys), n+2)
	}
}

// redisKeysConfig: an engine serving m and other, limits in Redis at
// addr, no configured key, auth.required (the keys API keeps its keys in
// Redis only then; no key refuses every request).
func redisKeysConfig(url, addr string) (Config, quota.RedisConfig) {
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: url, Models: []string{"m", "other"}})
	cfg.Auth.Required = true
	rc := quota.DefaultRedisConfig()
	rc.Address = addr
	rc.Timeout = 5 * time.Second // -race on a slow machine
	cfg.Limits.Redis = rc
	return cfg, rc
}

// redisReplica is a harness using the Redis at addr for limits and keys.
func redisReplica(t *testing.T, url, addr string) *harness {
	t.Helper()
	cfg, rc := redisKeysConfig(url, addr)
	st, err := quota.NewRedis(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return newHarnessWith(t, cfg, []Option{WithQuotaStore(st)})
}

// TestKeysAPIRedisReplicas: two replicas sharing one Redis, under
// auth.required. A key created on A serves on B after B's poll; a change
// on A reaches B; a revocation on A gets 401 on B; the last key may go
// (no key refuses every request). With Redis down the keys read last stay
// in force for keysMaxStale, then the keys API's keys get 503; a Redis
// back without its keys (no persistence) refuses them all: it never turns
// auth off.
func TestKeysAPIRedisReplicas(t *testing.T) {
	var rec recorder
	url := okEngine(t, &rec)
	rds := redistest.Start(t)
	a, b := redisReplica(t, url, rds.Addr()), redisReplica(t, url, rds.Addr())
	if st := chatWith(b, "", chatM); st != http.StatusUnauthorized {
		t.Fatalf("no key at all under auth.required: %d, want 401", st)
	}

	ka := createKey(t, a, `{"name":"team-a","models":["*"],"limits":{"requests_per_minute":1000}}`)
	if ka.Source != KeySourceAPI {
		t.Errorf("source %q, want api", ka.Source)
	}
	// In force on A before the answer; on B after its next poll.
	if st := chatWith(a, ka.Key, chatM); st != http.StatusOK {
		t.Fatalf("A, the new key: %d, want 200", st)
	}
	start := time.Now()
	if !testutil.Poll(5*time.Second, func() bool { return chatWith(b, ka.Key, chatM) == http.StatusOK }) {
		t.Fatal("B never served the key created on A")
	}
	t.Logf("B served the key created on A %v after its creation", time.Since(start).Round(time.Millisecond))
	// (Polled: a replica whose check is late answers 503 a moment.)
	if !testutil.Poll(5*time.Second, func() bool { return chatWith(b, "sk-sb-nope", chatM) == http.StatusUnauthorized }) {
		t.Errorf("B, an unknown key: %d, want 401", chatWith(b, "sk-sb-nope", chatM))
	}
	kb := createKey(t, b, `{"name":"team-b","models":["m"]}`)
	if st, body := adminCall(t, a, http.MethodPost, "/admin/keys", `{"name":"team-b","models":["*"]}`); st != http.StatusConflict {
		t.Errorf("team-b again on A: %d %s, want 409", st, body)
	}

	keys, raw := listKeys(t, b)
	if strings.Contains(raw, ka.Key) || strings.Contains(raw, sha(ka.Key)) || strings.Contains(raw, hex.EncodeToString([]byte(ka.Key))) {
		t.Errorf("GET /admin/keys shows a secret or a hash: %s", raw)
	}
	if got := keys["team-a"]; got.Source != KeySourceAPI || got.CreatedAt == nil || !got.Shared || got.Limits.RequestsPerMinute != 1000 {
		t.Errorf("team-a on B: %+v", got)
	}

	// A change on A applies on B.
	if st, body := adminCall(t, a, http.MethodPatch, "/admin/keys/team-a", `{"models":["other"]}`); st != http.StatusOK {
		t.Fatalf("PATCH on A: %d %s", st, body)
	}
	if st := chatWith(a, ka.Key, chatM); st != http.StatusForbidden {
		t.Errorf("A, model m after models [other]: %d, want 403", st)
	}
	if !testutil.Poll(5*time.Second, func() bool { return chatWith(b, ka.Key, chatM) == http.StatusForbidden }) {
		t.Error("B never applied the change made on A")
	}

	// A revocation on A: 401 on A at once, on B after its next poll.
	start = time.Now()
	if st, body := adminCall(t, a, http.MethodDelete, "/admin/keys/team-a", ""); st != http.StatusOK {
		t.Fatalf("DELETE on A: %d %s", st, body)
	}
	if st := chatWith(a, ka.Key, chatOther); st != http.StatusUnauthorized {
		t.Errorf("A, the revoked key: %d, want 401", st)
	}
	if !testutil.Poll(5*time.Second, func() bool { return chatWith(b, ka.Key, chatOther) == http.StatusUnauthorized }) {
		t.Fatal("B still serves the key revoked on A")
	}
	t.Logf("B refused the revoked key %v after the revocation", time.Since(start).Round(time.Millisecond))

	// Redis down: the keys read last stay in force until keysMaxStale,
	// then the keys API's keys get 503 (a revocation may have been
	// missed); writes answer 503.
	rds.Stop()
	st, body := adminCall(t, a, http.MethodPost, "/admin/keys", `{"name":"team-c","models":["*"]}`)
	if code, _, _ := adminErr(t, body); st != http.StatusServiceUnavailable || code != "keys_store_unavailable" {
		t.Errorf("create with Redis down: %d %s, want 503 keys_store_unavailable", st, body)
	}
	if !testutil.Poll(10*time.Second, func() bool { return chatWith(b, kb.Key, chatM) == http.StatusServiceUnavailable }) {
		t.Errorf("Redis down: B still serves team-b past keysMaxStale")
	}
	// Back without its keys (no persistence): every key is gone, and with
	// auth.required nothing is served.
	rds.Restart()
	if !testutil.Poll(10*time.Second, func() bool { return chatWith(b, kb.Key, chatM) == http.StatusUnauthorized }) {
		t.Errorf("Redis back empty: team-b on B is not 401")
	}
	if !testutil.Poll(10*time.Second, func() bool { return chatWith(a, "", chatM) == http.StatusUnauthorized }) {
		t.Errorf("Redis back empty, no key: %d, want 401 (auth stays on)", chatWith(a, "", chatM))
	}
}

// TestKeysAPIRedisNotRequired: with limits.redis but no auth.required the
// keys in Redis are not used: a gateway with no key serves every request
// even with Redis down at start (Redis for the limits alone), and the
// keys API names auth.required.
func TestKeysAPIRedisNotRequired(t *testing.T) {
	var rec recorder
	url := okEngine(t, &rec)
	rds := redistest.Start(t)
	rds.Stop()
	cfg, _ := redisKeysConfig(url, rds.Addr())
	cfg.Auth.Required = false
	h := newHarness(t, cfg)
	if st := chatWith(h, "", chatM); st != http.StatusOK {
		t.Errorf("no key, Redis down, auth.required off: %d, want 200", st)
	}
	if st, _, body := h.do(http.MethodGet, "/ready", ""); st != http.StatusOK {
		t.Errorf("/ready: %d %s, want 200", st, body)
	}
	st, body := adminCall(t, h, http.MethodPost, "/admin/keys", `{"name":"team-a","models":["*"]}`)
	if code, _, msg := adminErr(t, body); st != http.StatusConflict || code != "keys_api_unavailable" || !strings.Contains(msg, "auth.required") {
		t.Errorf("create without auth.required: %d %s, want 409 keys_api_unavailable naming auth.required", st, body)
	}
}

// TestKeysAPIRedisDownAtStart: under auth.required with no configured
// key, until the keys in Redis are read once a request is 503
// keys_unavailable and /ready waits; once Redis answers, the keys apply
// (none: every request is 401).
func TestKeysAPIRedisDownAtStart(t *testing.T) {
	var rec recorder
	url := okEngine(t, &rec)
	rds := redistest.Start(t)
	rds.Stop()
	cfg, _ := redisKeysConfig(url, rds.Addr())
	h := newHarness(t, cfg)
	st, _, body := h.do(http.MethodPost, "/v1/chat/completions", chatM)
	if code, _, _ := adminErr(t, body); st != http.StatusServiceUnavailable || code != "keys_unavailable" {
		t.Errorf("a request before the keys were read: %d %s, want 503 keys_unavailable", st, body)
	}
	if st, _, body := h.do(http.MethodGet, "/ready", ""); st != http.StatusServiceUnavailable || !strings.Contains(string(body), "api keys") {
		t.Errorf("/ready before the keys were read: %d %s", st, body)
	}
	rds.Restart()
	if !testutil.Poll(10*time.Second, func() bool { return chatWith(h, "", chatM) == http.StatusUnauthorized }) {
		t.Error("no key in Redis: requests not refused 401 once Redis answered")
	}
	if st, _, body := h.do(http.MethodGet, "/ready", ""); st != http.StatusOK {
		t.Errorf("/ready once the keys were read: %d %s", st, body)
	}
}

// TestKeysAPIRedisDownAtStartConfigKeys: with keys configured, a Redis
// down at start leaves the gateway ready and the configured keys served;
// only a key it does not know is 503 (it may be one kept in Redis).
func TestKeysAPIRedisDownAtStartConfigKeys(t *testing.T) {
	var rec recorder
	url := okEngine(t, &rec)
	rds := redistest.Start(t)
	rds.Stop()
	cfg, _ := redisKeysConfig(url, rds.Addr())
	cfg.Auth = AuthConfig{Required: true, Keys: []KeyConfig{{Name: "team-cfg", SHA256: sha("k-cfg"), Models: []string{"*"}}}}
	h := newHarness(t, cfg)
	if st := chatWith(h, "k-cfg", chatM); st != http.StatusOK {
		t.Errorf("a configured key: %d, want 200", st)
	}
	if st := chatWith(h, "", chatM); st != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", st)
	}
	st, _, body := h.do(http.MethodPost, "/v1/chat/completions", chatM, "Authorization", "Bearer sk-sb-unknown")
	if code, _, _ := adminErr(t, body); st != http.StatusServiceUnavailable || code != "keys_unavailable" {
		t.Errorf("an unknown key before the keys were read: %d %s, want 503 keys_unavailable", st, body)
	}
	if st, _, body := h.do(http.MethodGet, "/ready", ""); st != http.StatusOK {
		t.Errorf("/ready: %d %s, want 200", st, body)
	}
}

// TestKeysAPIRevokedUsageDropped: a revoked key's usage is dropped, so
// names made and revoked at run time do not pile up, and a key made again
// under a revoked name starts from zero; a hand edit of the keys file
// made while the API writes is never overwritten.
func TestKeysAPIRevokedUsageDropped(t *testing.T) {
	var rec recorder
	cfg, path := fileKeysConfig(t, okEngine(t, &rec))
	h := newHarness(t, cfg)
	k := createKey(t, h, `{"name":"churn","models":["*"]}`)
	for range 3 {
		if st := chatWith(h, k.Key, chatM); st != http.StatusOK {
			t.Fatalf("the new key: %d", st)
		}
	}
	if keys, _ := listKeys(t, h); keys["churn"].Admitted != 3 {
		t.Fatalf("admitted %d, want 3", keys["churn"].Admitted)
	}
	if st, body := adminCall(t, h, http.MethodDelete, "/admin/keys/churn", ""); st != http.StatusOK {
		t.Fatalf("revoke: %d %s", st, body)
	}
	if _, ok := h.gw.limits.usage.Load("churn"); ok {
		t.Error("the revoked key's usage is still held")
	}
	k = createKey(t, h, `{"name":"churn","models":["*"]}`)
	if keys, _ := listKeys(t, h); keys["churn"].Admitted != 0 {
		t.Errorf("the key made again: admitted %d, want 0 (a fresh start)", keys["churn"].Admitted)
	}

	// A hand edit between the API's read and its write: 409, the edit kept.
	h.gw.keys.readFile = func(p string) ([]KeyConfig, error) {
		var keys []KeyConfig
		for _, k := range h.gw.set.Load().cfg.Auth.Keys {
			if k.Source == KeySourceKeysFile {
				keys = append(keys, k)
			}
		}
		b, _ := os.ReadFile(p)
		return keys, os.WriteFile(p, append(b, []byte("# edited by hand\n")...), 0o600)
	}
	st, body := adminCall(t, h, http.MethodPost, "/admin/keys", `{"name":"late","models":["*"]}`)
	if code, _, _ := adminErr(t, body); st != http.StatusConflict || code != "keys_file_changed" {
		t.Errorf("a create racing a hand edit: %d %s, want 409 keys_file_changed", st, body)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), "# edited by hand") || strings.Contains(string(b), `"late"`) {
		t.Errorf("the keys file after the refused write:\n%s", b)
	}
}

// TestKeysAPIRedisUnusedKeysWarned: a replica without auth.required on a
// Redis holding the keys API's keys (made by a replica with it) does not
// use or list them, serves without a key, and says so in a warning.
func TestKeysAPIRedisUnusedKeysWarned(t *testing.T) {
	var rec recorder
	url := okEngine(t, &rec)
	rds := redistest.Start(t)
	a := redisReplica(t, url, rds.Addr())
	k := createKey(t, a, `{"name":"team-a","models":["*"]}`)
	cfg, _ := redisKeysConfig(url, rds.Addr())
	cfg.Auth.Required = false
	var logs bytes.Buffer
	var mu sync.Mutex
	b := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))})
	if !testutil.Poll(5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "api keys in redis are not in force") && strings.Contains(logs.String(), "keys=1")
	}) {
		mu.Lock()
		t.Errorf("no warning about the unused keys:\n%s", logs.String())
		mu.Unlock()
	}
	if st := chatWith(b, "", chatM); st != http.StatusOK {
		t.Errorf("no key, auth.required off, no configured key: %d, want 200", st)
	}
	if keys, _ := listKeys(t, b); len(keys) != 0 {
		t.Errorf("keys listed while not in force: %v", keys)
	}
	if !testutil.Poll(5*time.Second, func() bool { return chatWith(a, k.Key, chatM) == http.StatusOK }) {
		t.Errorf("the key on the replica with auth.required: %d, want 200", chatWith(a, k.Key, chatM))
	}
}

// TestKeysAPIRedisWritesTakeNoFileLock: with the keys in Redis, a write
// does not wait for the keys file's lock (which a reload holds while it
// loads and applies the configuration), so a slow Redis never holds up a
// reload, and a reload never holds up a revocation.
func TestKeysAPIRedisWritesTakeNoFileLock(t *testing.T) {
	var rec recorder
	url := okEngine(t, &rec)
	rds := redistest.Start(t)
	h := redisReplica(t, url, rds.Addr())
	unlock := h.gw.LockKeysFile() // as a reload in progress holds it
	done := make(chan int, 1)
	go func() {
		st, _ := adminCall(t, h, http.MethodPost, "/admin/keys", `{"name":"team-a","models":["*"]}`)
		done <- st
	}()
	select {
	case st := <-done:
		if st != http.StatusCreated {
			t.Errorf("create while the keys file's lock is held: %d, want 201", st)
		}
	case <-time.After(10 * time.Second):
		unlock()
		t.Fatal("a Redis create waited for the keys file's lock")
	}
	unlock()
}

// TestAuthRequiredNeedsAKeyOrAStore: auth.required with no key, no Redis
// and no keys file would refuse every request for good (no key could
// ever be made): the configuration is refused, naming the settings.
func TestAuthRequiredNeedsAKeyOrAStore(t *testing.T) {
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
	cfg.Auth.Required = true
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "limits.redis.address or auth.keys_file") {
		t.Errorf("auth.required alone: %v, want refused naming the key stores", err)
	}
	cfg.Auth.KeysFilePath = "/etc/switchboard/keys.yaml"
	if err := cfg.Validate(); err != nil {
		t.Errorf("auth.required with a keys file: %v", err)
	}
}
