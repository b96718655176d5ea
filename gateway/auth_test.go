package gateway

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func sha(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// authConfig: keys "k-all" (team-all, every model), "k-m" (team-m, model
// m only) on an engine serving m and other.
func authConfig(url string, hide bool) Config {
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: url, Models: []string{"m", "other"}})
	cfg.Auth = AuthConfig{Keys: []KeyConfig{
		{Name: "team-all", SHA256: sha("k-all"), Models: []string{"*"}},
		{Name: "team-m", SHA256: sha("k-m"), Models: []string{"m"}},
	}, HideUnauthorizedModels: hide}
	return cfg
}

func okEngine(t *testing.T, rec *recorder) string {
	return fakeEngine(t, []string{"m", "other"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[]}`))
	}).URL
}

const chatM = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
const chatOther = `{"model":"other","messages":[{"role":"user","content":"hi"}]}`
const msgM = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`

// TestAuth401: a missing, malformed or unknown key is 401 in the route's
// envelope, before the engine is contacted.
func TestAuth401(t *testing.T) {
	var rec recorder
	h := newHarness(t, authConfig(okEngine(t, &rec), false))
	for _, tc := range []struct {
		name, path, body string
		hdr              []string
		code             string
	}{
		{"openai missing", "/v1/chat/completions", chatM, nil, "missing_api_key"},
		{"openai unknown bearer", "/v1/chat/completions", chatM, []string{"Authorization", "Bearer nope"}, "invalid_api_key"},
		{"openai unknown x-api-key", "/v1/chat/completions", chatM, []string{"X-Api-Key", "nope"}, "invalid_api_key"},
		{"openai basic", "/v1/chat/completions", chatM, []string{"Authorization", "Basic azphbGw="}, "invalid_api_key"},
		{"openai empty bearer", "/v1/chat/completions", chatM, []string{"Authorization", "Bearer "}, "invalid_api_key"},
		{"openai bearer no space", "/v1/chat/completions", chatM, []string{"Authorization", "Bearerk-all"}, "invalid_api_key"},
		{"anthropic missing", "/v1/messages", msgM, nil, "authentication_error"},
		{"anthropic unknown", "/v1/messages", msgM, []string{"X-Api-Key", "nope"}, "authentication_error"},
		{"anthropic malformed", "/v1/messages", msgM, []string{"Authorization", "Token k-all"}, "authentication_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(tc.path, tc.body, tc.hdr...)
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
			if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate %q", resp.Header.Get("WWW-Authenticate"))
			}
			if strings.HasPrefix(tc.path, "/v1/messages") {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var e anthropicError
				if err := json.Unmarshal(b, &e); err != nil || e.Type != "error" || e.Error.Type != tc.code || e.Error.Message == "" {
					t.Errorf("body %s, want an Anthropic %s", b, tc.code)
				}
				return
			}
			if e := decodeErr(t, resp); e.Error.Type != TypeInvalidRequest || e.code() != tc.code {
				t.Errorf("error %+v (code %q), want %s", e.Error, e.code(), tc.code)
			}
		})
	}
	for _, path := range []string{"/v1/models", "/v1/models/m"} {
		resp, err := h.client.Get(h.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		if e := decodeErr(t, resp); resp.StatusCode != http.StatusUnauthorized || e.code() != "missing_api_key" {
			t.Errorf("GET %s: %d %+v, want 401", path, resp.StatusCode, e.Error)
		}
	}
	for _, path := range []string{"/health", "/ready"} {
		resp, err := h.client.Get(h.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s without a key: %d, want 200", path, resp.StatusCode)
		}
	}
	if len(rec.reqs) != 0 {
		t.Errorf("the engine got %d requests, want none", len(rec.reqs))
	}
	h.assertIdle()
}

// TestAuthModels: a key uses only its models: 403 permission_denied (or
// the unknown model's 404 with hide_unauthorized_models), before an engine
// slot is taken; GET /v1/models lists only its models.
func TestAuthModels(t *testing.T) {
	for _, hide := range []bool{false, true} {
		var rec recorder
		h := newHarness(t, authConfig(okEngine(t, &rec), hide))
		for _, tc := range []struct {
			name, key, body string
			status          int
			code            string
		}{
			{"all key, m", "k-all", chatM, 200, ""},
			{"all key, other", "k-all", chatOther, 200, ""},
			{"m key, m", "k-m", chatM, 200, ""},
			{"m key, other", "k-m", chatOther, 403, "permission_denied"},
			{"m key, unknown", "k-m", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 403, "permission_denied"},
		} {
			if hide && tc.status == 403 {
				tc.status, tc.code = 404, "model_not_found"
			}
			resp := h.post("/v1/chat/completions", tc.body, "Authorization", "Bearer "+tc.key)
			if resp.StatusCode != tc.status {
				t.Errorf("hide=%v %s: status %d, want %d", hide, tc.name, resp.StatusCode, tc.status)
			}
			if tc.status == 200 {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				continue
			}
			if e := decodeErr(t, resp); e.code() != tc.code || e.Error.Param == nil || *e.Error.Param != "model" {
				t.Errorf("hide=%v %s: %+v, want code %s", hide, tc.name, e.Error, tc.code)
			}
		}
		// Hidden, the 404 is byte for byte an unknown model's (of another
		// key that may use every model).
		if hide {
			a := h.post("/v1/chat/completions", `{"model":"zzz","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer k-m")
			b := h.post("/v1/chat/completions", `{"model":"zzz","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer k-all")
			ab, _ := io.ReadAll(a.Body)
			bb, _ := io.ReadAll(b.Body)
			a.Body.Close()
			b.Body.Close()
			if a.StatusCode != b.StatusCode || string(ab) != string(bb) {
				t.Errorf("hidden %d %s, unknown %d %s", a.StatusCode, ab, b.StatusCode, bb)
			}
		}
		// Anthropic envelope for a 403.
		if !hide {
			resp := h.post("/v1/messages", `{"model":"other","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "X-Api-Key", "k-m")
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 403 || !strings.Contains(string(b), `"type":"permission_error"`) {
				t.Errorf("messages 403: %d %s", resp.StatusCode, b)
			}
		}
		if got := h.histCount(telemetry.RequestDurationName); got != 3 {
			t.Errorf("hide=%v: %d engine attempts, want 3 (none for a refused model)", hide, got)
		}
		for _, tc := range []struct {
			key  string
			want []string
		}{{"k-all", []string{"m", "other"}}, {"k-m", []string{"m"}}} {
			if got := h.listModels(tc.key); !slices.Equal(got, tc.want) {
				t.Errorf("GET /v1/models with %s: %v, want %v", tc.key, got, tc.want)
			}
		}
		for _, tc := range []struct {
			key, model string
			status     int
		}{{"k-m", "m", 200}, {"k-m", "other", 404}, {"k-all", "other", 200}} {
			req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/models/"+tc.model, nil)
			req.Header.Set("Authorization", "Bearer "+tc.key)
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("GET /v1/models/%s with %s: %d, want %d", tc.model, tc.key, resp.StatusCode, tc.status)
			}
		}
		h.assertIdle()
	}
}

func (h *harness) listModels(key string) []string {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/models", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 || list.Object != "list" {
		h.t.Fatalf("GET /v1/models: %d %v", resp.StatusCode, err)
	}
	ids := []string{}
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// TestMatchKey: every position finds its own key, and an unknown hash
// none, comparing against every configured hash.
func TestMatchKey(t *testing.T) {
	keys := compileKeys(AuthConfig{Keys: []KeyConfig{
		{Name: "a", SHA256: sha("ka"), Models: []string{"*"}},
		{Name: "b", SHA256: strings.ToUpper(sha("kb")), Models: []string{"*"}},
		{Name: "c", SHA256: sha("kc"), Models: []string{"*"}},
	}})
	for _, tc := range []struct {
		key  string
		want int
	}{{"ka", 0}, {"kb", 1}, {"kc", 2}, {"kd", -1}, {"", -1}} {
		if got := matchKey(keys, sha256.Sum256([]byte(tc.key))); got != tc.want {
			t.Errorf("matchKey(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
	if got := matchKey(nil, sha256.Sum256([]byte("ka"))); got != -1 {
		t.Errorf("no keys: %d", got)
	}
}

// TestAuthOffAndReload: with no key every request is served without one; a
// reload that adds a key turns auth on for the next request.
func TestAuthOffAndReload(t *testing.T) {
	var rec recorder
	cfg := authConfig(okEngine(t, &rec), false)
	cfg.Auth = AuthConfig{}
	h := newHarness(t, cfg)
	resp := h.post("/v1/chat/completions", chatM)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("auth off: %d", resp.StatusCode)
	}
	if got := h.listModels(""); !slices.Equal(got, []string{"m", "other"}) {
		t.Errorf("auth off: models %v", got)
	}
	next := authConfig(cfg.Engines[0].URL, false)
	rep := h.reload(next, h.policy())
	if !slices.Equal(rep.Settings, []string{"auth.keys"}) {
		t.Errorf("report settings %v, want [auth.keys]", rep.Settings)
	}
	resp = h.post("/v1/chat/completions", chatM)
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("after the reload without a key: %d, want 401", resp.StatusCode)
	}
	resp = h.post("/v1/chat/completions", chatM, "Authorization", "Bearer k-m")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after the reload with a key: %d, want 200", resp.StatusCode)
	}
	h.assertIdle()
}

// TestAuthKeyNotForwarded: neither header carrying the client's key
// reaches the engine; the key's name is on the access log and the server
// span, the key nowhere.
func TestAuthKeyNotForwarded(t *testing.T) {
	var rec recorder
	var buf testutil.LockedBuffer
	cfg := authConfig(okEngine(t, &rec), false)
	cfg.AccessLog = true
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	for _, hdr := range [][]string{{"Authorization", "Bearer k-m"}, {"X-Api-Key", "k-m"}} {
		resp := h.post("/v1/chat/completions", chatM, hdr...)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", hdr[0], resp.StatusCode)
		}
		got := rec.last().Header
		if v := got.Get("Authorization"); v != "" {
			t.Errorf("%s: engine saw Authorization %q", hdr[0], v)
		}
		if v := got.Get("X-Api-Key"); v != "" {
			t.Errorf("%s: engine saw X-Api-Key %q", hdr[0], v)
		}
		for k, vs := range got {
			for _, v := range vs {
				if strings.Contains(v, "k-m") {
					t.Errorf("engine header %s carries the key: %q", k, v)
				}
			}
		}
	}
	h.waitIdle()
	if strings.Contains(buf.String(), "k-m") {
		t.Errorf("the key is in the log:\n%s", buf.String())
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "request" {
			n++
			if m["key"] != "team-m" {
				t.Errorf("access-log line %v, want key team-m", m)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d access-log lines, want 2:\n%s", n, buf.String())
	}
	servers := 0
	for _, s := range h.spans.Ended() {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.Emit(), "k-m") {
				t.Errorf("span %q attribute %s carries the key", s.Name(), a.Key)
			}
			if a.Key == telemetry.AttrKey {
				servers++
				if a.Value.AsString() != "team-m" {
					t.Errorf("span %q: %s = %q", s.Name(), a.Key, a.Value.AsString())
				}
			}
		}
	}
	if servers != 2 {
		t.Errorf("%d spans with %s, want 2 (the server spans)", servers, telemetry.AttrKey)
	}
}

// TestAuthConfigValidate: names, hashes and globs are checked at load.
func TestAuthConfigValidate(t *testing.T) {
	good := KeyConfig{Name: "a", SHA256: sha("a"), Models: []string{"*", "meta-llama/*"}}
	for _, tc := range []struct {
		name string
		keys []KeyConfig
		want string
	}{
		{"ok", []KeyConfig{good, {Name: "b", SHA256: sha("b"), Models: []string{"m"}}}, ""},
		{"empty name", []KeyConfig{{SHA256: sha("a"), Models: []string{"*"}}}, "auth.keys[0].name must not be empty"},
		{"long name", []KeyConfig{{Name: strings.Repeat("n", 65), SHA256: sha("a"), Models: []string{"*"}}}, "longer than 64"},
		{"control", []KeyConfig{{Name: "a\nb", SHA256: sha("a"), Models: []string{"*"}}}, "control character"},
		{"duplicate name", []KeyConfig{good, {Name: "a", SHA256: sha("b"), Models: []string{"*"}}}, `duplicate key name "a"`},
		{"short hash", []KeyConfig{{Name: "a", SHA256: "abc", Models: []string{"*"}}}, "64 hex digits"},
		{"not hex", []KeyConfig{{Name: "a", SHA256: strings.Repeat("z", 64), Models: []string{"*"}}}, "64 hex digits"},
		{"same hash", []KeyConfig{good, {Name: "b", SHA256: strings.ToUpper(sha("a")), Models: []string{"*"}}}, "the same key as another"},
		{"no models", []KeyConfig{{Name: "a", SHA256: sha("a")}}, "at least one model glob"},
		{"bad glob", []KeyConfig{{Name: "a", SHA256: sha("a"), Models: []string{"[m"}}}, `"[m" is not a path.Match glob`},
		{"empty glob", []KeyConfig{{Name: "a", SHA256: sha("a"), Models: []string{""}}}, "is not a path.Match glob"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1"})
			cfg.Auth.Keys = tc.keys
			err := cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}
