package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// testKey is the configured form of the key "sk-<name>", allowed every
// model.
func testKey(name string) gateway.KeyConfig {
	return gateway.KeyConfig{Name: name, SHA256: hashKey("sk-" + name), Models: []string{"*"}}
}

// keysYAML is a keys file (or an auth.keys list, indented by indent)
// holding testKey of each name.
func keysYAML(indent string, names ...string) string {
	out := indent + "keys:\n"
	for _, n := range names {
		out += fmt.Sprintf("%s  - {name: %s, sha256: %s, models: [\"*\"]}\n", indent, n, hashKey("sk-"+n))
	}
	return out
}

// writeKeysFile writes body to keys.yaml in a new temporary directory and
// returns its path.
func writeKeysFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.yaml")
	writeFile(t, path, body)
	return path
}

// TestLoadKeysFile: the file's keys come after auth.keys', in the file's
// order, with their limits; the path may come from the environment, with
// no config file at all.
func TestLoadKeysFile(t *testing.T) {
	keys := writeKeysFile(t, keysYAML("", "carol", "bob")+
		"  - name: dave\n    sha256: "+hashKey("sk-dave")+"\n    models: [demo-model]\n"+
		"    limits: {requests_per_minute: 60, tokens_per_minute: 1000, concurrent: 2}\n")
	want := []gateway.KeyConfig{testKey("alice"), testKey("carol"), testKey("bob"),
		{Name: "dave", SHA256: hashKey("sk-dave"), Models: []string{"demo-model"},
			Limits: gateway.KeyLimits{RequestsPerMinute: 60, TokensPerMinute: 1000, Concurrent: 2}}}
	for i := 1; i < len(want); i++ {
		want[i].Source = gateway.KeySourceKeysFile
	}

	cfgPath := writeConfig(t, "simulate: {engines: 1}\nauth:\n  keys_file: "+keys+"\n"+keysYAML("  ", "alice"))
	cfg, from, _, err := loadConfigSum([]string{"--config", cfgPath}, environ())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Auth.Keys, want) {
		t.Errorf("keys\n got: %+v\nwant: %+v", cfg.Auth.Keys, want)
	}
	if got := gatewayConfig(cfg, nil).Auth.Keys; !reflect.DeepEqual(got, want) {
		t.Errorf("the gateway's keys: %+v", got)
	}
	if now := filesNow(cfgPath, loadedFrom{keysFile: keys}); from != now {
		t.Errorf("loaded from %+v, want the files as they are (%+v)", from, now)
	}

	t.Run("environment", func(t *testing.T) {
		cfg, from, _, err := loadConfigSum(nil, environ("SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_AUTH__KEYS_FILE="+keys))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cfg.Auth.Keys, want[1:]) || cfg.Auth.KeysFile != keys {
			t.Errorf("auth = %+v, want the file's keys", cfg.Auth)
		}
		if from != filesNow("", loadedFrom{keysFile: keys}) {
			t.Errorf("loaded from %+v", from)
		}
	})

	t.Run("empty list with config keys", func(t *testing.T) {
		empty := writeKeysFile(t, "keys: []\n")
		cfg, err := loadConfig([]string{"--config", writeConfig(t, "simulate: {engines: 1}\nauth:\n  keys_file: "+empty+"\n"+keysYAML("  ", "alice"))}, environ())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cfg.Auth.Keys, want[:1]) {
			t.Errorf("keys %+v", cfg.Auth.Keys)
		}
	})
}

// TestLoadKeysFileErrors: a keys file that is missing, not YAML, has a
// key it should not, a bad value or no keys list refuses the config, and
// a problem with one of its keys names the file and the key's index in it
// (a duplicate of a config key too). %K% in want and env stands for the keys
// file's path.
func TestLoadKeysFileErrors(t *testing.T) {
	alice := keysYAML("  ", "alice")
	tests := []struct {
		name       string
		keys       string // the keys file; "" = none written (missing)
		configKeys string // auth.keys, indented
		env        []string
		want       []string // substrings of the error
		invalid    bool     // errors.Is gateway.ErrInvalidConfig
	}{
		{
			name: "missing file",
			want: []string{"keys_file %K%: open %K%: no such file or directory"},
		},
		{
			name: "not yaml",
			keys: "keys: [unclosed\n",
			want: []string{"keys_file %K%: "},
		},
		{
			name: "empty file",
			keys: "\n",
			want: []string{"keys_file %K%: no `keys:` list (write `keys: []` for a file with none)"},
		},
		{
			name: "misspelled limit",
			keys: keysYAML("", "bob") + "  - {name: carol, sha256: " + hashKey("sk-carol") + ", models: [\"*\"], limits: {requests_per_minut: 10}}\n",
			want: []string{"keys_file %K%: keys[1].limits.requests_per_minut: unknown key (did you mean keys[1].limits.requests_per_minute?)"},
		},
		{
			name: "unknown top-level key",
			keys: "key:\n  - {name: bob}\n",
			want: []string{"keys_file %K%: key: unknown key (did you mean keys?)", "keys_file %K%: no `keys:` list"},
		},
		{
			name: "a config key in the keys file",
			keys: keysYAML("", "bob") + "hide_unauthorized_models: true\n",
			want: []string{"keys_file %K%: hide_unauthorized_models: unknown key"},
		},
		{
			name: "bad value",
			keys: "keys:\n  - {name: bob, sha256: " + hashKey("sk-bob") + ", models: [\"*\"], limits: {concurrent: lots}}\n",
			want: []string{`keys_file %K%: keys[0].limits.concurrent: "lots" is not a whole number`},
		},
		{
			name:       "duplicate name across config and file",
			keys:       "keys:\n  - {name: bob, sha256: " + hashKey("sk-bob") + ", models: [\"*\"]}\n  - {name: alice, sha256: " + hashKey("sk-other") + ", models: [\"*\"]}\n",
			configKeys: alice,
			want:       []string{`keys_file %K%: keys[1].name: duplicate key name "alice"`},
			invalid:    true,
		},
		{
			name:       "duplicate hash across config and file",
			keys:       "keys:\n  - {name: bob, sha256: " + hashKey("sk-alice") + ", models: [\"*\"]}\n",
			configKeys: alice,
			want:       []string{`keys_file %K%: keys[0].sha256: the same key as another ("bob")`},
			invalid:    true,
		},
		{
			name:       "bad key in the file",
			keys:       "keys:\n  - {name: bob, sha256: abc, models: []}\n",
			configKeys: alice,
			want:       []string{"keys_file %K%: keys[0].sha256 must be 64 hex digits", "keys_file %K%: keys[0].models must name at least one model glob"},
			invalid:    true,
		},
		{
			// A problem of a config key is still the config's.
			name:       "bad key in the config",
			keys:       keysYAML("", "bob"),
			configKeys: "  keys:\n    - {name: alice, sha256: abc, models: [\"*\"]}\n",
			want:       []string{"invalid gateway config: auth.keys[0].sha256 must be 64 hex digits"},
			invalid:    true,
		},
		{
			// auth would be off: every request served.
			name: "no key anywhere",
			keys: "keys: []\n",
			want: []string{"keys_file %K%: no key in it nor in auth.keys: auth would be off (every request served)"},
		},
		{
			// Levels are joined by a double underscore:
			// SWITCHBOARD_AUTH__KEYS_FILE.
			name: "single underscore variable",
			keys: keysYAML("", "bob"),
			env:  []string{"SWITCHBOARD_AUTH_KEYS_FILE=%K%"},
			want: []string{"environment SWITCHBOARD_AUTH_KEYS_FILE: unknown key auth_keys_file (did you mean SWITCHBOARD_AUTH__KEYS_FILE?)"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keys := filepath.Join(t.TempDir(), "keys.yaml")
			if tc.keys != "" {
				writeFile(t, keys, tc.keys)
			}
			cfg := "simulate: {engines: 1}\nauth:\n  keys_file: " + keys + "\n" + tc.configKeys
			var env []string
			for _, kv := range tc.env {
				env = append(env, strings.ReplaceAll(kv, "%K%", keys))
			}
			_, err := loadConfig([]string{"--config", writeConfig(t, cfg)}, environ(env...))
			if err == nil {
				t.Fatal("loadConfig: nil error")
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "%K%", keys); !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not hold %q", err, w)
				}
			}
			if tc.invalid && !errors.Is(err, gateway.ErrInvalidConfig) {
				t.Errorf("error %q is not gateway.ErrInvalidConfig", err)
			}
		})
	}
}

// chatStatus sends a one-token chat request with the API key key and
// returns the status.
func chatStatus(t *testing.T, client *http.Client, base, key string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"demo-model","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// waitKeys polls until each key ("sk-<name>") gets its status (200
// served, 401 unknown).
func waitKeys(t *testing.T, client *http.Client, p *gatewayProc, want map[string]int) {
	t.Helper()
	pollFor(t, func() (bool, string) {
		got := map[string]int{}
		for name := range want {
			got[name] = chatStatus(t, client, p.public, "sk-"+name)
		}
		return reflect.DeepEqual(got, want), fmt.Sprintf("statuses %v, want %v; logs:\n%s", got, want, p.logs)
	})
}

// keysFileConfig is a config file serving e with auth.keys_file keys and
// the reload section reload.
func keysFileConfig(e simEngine, keys, reload string) string {
	return "server:\n  health: {interval: 1h}\n  engine_stats: {enabled: false}\nlog: {access: false}\nreload: " + reload + "\n" +
		"engines:\n  - {name: e1, url: \"" + e.url + "\", models: [demo-model]}\nauth:\n  keys_file: " + keys + "\n"
}

// TestRunKeysFileReload: with the gateway running, a key written into the
// keys file is served; a broken file is rejected with the running keys
// kept (and logged naming the file); a file renamed into place is seen;
// the config naming another keys file applies that file's keys, and the
// new file is watched from then on.
func TestRunKeysFileReload(t *testing.T) {
	testutil.UnsetOTEL(t)
	e := startSim(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	writeFile(t, keys, keysYAML("", "alice"))
	path := filepath.Join(dir, "gateway.yaml")
	writeFile(t, path, keysFileConfig(e, keys, "{debounce: 50ms}"))
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	waitKeys(t, client, p, map[string]int{"alice": 200, "bob": 401})

	// 1. A key added, written in place.
	writeFile(t, keys, keysYAML("", "alice", "bob"))
	waitKeys(t, client, p, map[string]int{"alice": 200, "bob": 200})
	waitReloads(t, client, p, map[string]float64{"applied": 1})

	// 2. A misspelled field: rejected, the running keys kept.
	writeFile(t, keys, keysYAML("", "alice")+"  - {name: carol, sha256: "+hashKey("sk-carol")+", models: [\"*\"], limits: {concurent: 1}}\n")
	waitReloads(t, client, p, map[string]float64{"applied": 1, "rejected": 1})
	waitKeys(t, client, p, map[string]int{"alice": 200, "bob": 200, "carol": 401})

	// 3. Renamed into place: bob revoked, carol added.
	replaceFile(t, keys, keysYAML("", "alice", "carol"))
	waitKeys(t, client, p, map[string]int{"alice": 200, "bob": 401, "carol": 200})
	waitReloads(t, client, p, map[string]float64{"applied": 2, "rejected": 1})

	// 4. The config names another keys file, in another directory: its
	// keys apply, and it is watched.
	other := filepath.Join(t.TempDir(), "more-keys.yaml")
	writeFile(t, other, keysYAML("", "dave"))
	replaceFile(t, path, keysFileConfig(e, other, "{debounce: 50ms}"))
	waitKeys(t, client, p, map[string]int{"alice": 401, "dave": 200})
	waitReloads(t, client, p, map[string]float64{"applied": 3, "rejected": 1})
	writeFile(t, other, keysYAML("", "dave", "erin"))
	waitKeys(t, client, p, map[string]int{"dave": 200, "erin": 200})
	waitReloads(t, client, p, map[string]float64{"applied": 4, "rejected": 1})

	logs := p.logsWith(t, "keys_added=erin")
	for _, want := range []string{
		"keys_added=bob", "settings=auth.keys",
		"keys_file " + keys + `: keys[1].limits.concurent: unknown key (did you mean keys[1].limits.concurrent?)`,
		"keys_added=carol keys_removed=bob",
		"keys_added=dave keys_removed=alice,carol keys_file=" + other,
		"keys_added=erin",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "need a restart") {
		t.Errorf("a keys change logged as needing a restart:\n%s", logs)
	}
}

// TestRunKeysFileSecretSwap: a keys file mounted from a Kubernetes Secret
// (keys.yaml -> ..data/keys.yaml, ..data -> ..<timestamp>) is reloaded
// when the kubelet swaps the ..data symlink; here the path comes from the
// environment and there is no config file, so the keys file is the only
// one watched.
func TestRunKeysFileSecretSwap(t *testing.T) {
	testutil.UnsetOTEL(t)
	dir := t.TempDir()
	version := func(name, content string) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "keys.yaml"), content)
	}
	version("..2026_01_01_v1", keysYAML("", "alice"))
	if err := os.Symlink("..2026_01_01_v1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(dir, "keys.yaml")
	if err := os.Symlink("..data/keys.yaml", keys); err != nil {
		t.Fatal(err)
	}
	p := startRun(t, []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, []string{
		"SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_SIMULATE__TTFT=1ms", "SWITCHBOARD_SIMULATE__ITL=1ms",
		"SWITCHBOARD_LOG__ACCESS=false", "SWITCHBOARD_RELOAD__DEBOUNCE=50ms", "SWITCHBOARD_AUTH__KEYS_FILE=" + keys,
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	waitKeys(t, client, p, map[string]int{"alice": 200, "bob": 401})

	// The kubelet's update: a new timestamped directory, a new ..data
	// symlink renamed over the old one, the old directory removed.
	swap := func(from, to, content string) {
		version(to, content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(to, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, from)); err != nil {
			t.Fatal(err)
		}
	}
	swap("..2026_01_01_v1", "..2026_01_01_v2", keysYAML("", "bob"))
	waitKeys(t, client, p, map[string]int{"alice": 401, "bob": 200})
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	// The first swap may have come before the watch's first look at the
	// file; this one comes after a reload, so only its events report it.
	swap("..2026_01_01_v2", "..2026_01_01_v3", keysYAML("", "carol"))
	waitKeys(t, client, p, map[string]int{"bob": 401, "carol": 200})
	waitReloads(t, client, p, map[string]float64{"applied": 2})
}

// TestRunKeysFileSIGHUP: with the watch off, SIGHUP reads the keys file
// again.
func TestRunKeysFileSIGHUP(t *testing.T) {
	testutil.UnsetOTEL(t)
	e := startSim(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	writeFile(t, keys, keysYAML("", "alice"))
	path := filepath.Join(dir, "gateway.yaml")
	writeFile(t, path, keysFileConfig(e, keys, "{watch: false}"))
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	waitKeys(t, client, p, map[string]int{"alice": 200, "bob": 401})

	writeFile(t, keys, keysYAML("", "bob"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	waitKeys(t, client, p, map[string]int{"alice": 401, "bob": 200})
}

// TestKeysFileWrittenLoads: the keys file as the keys API writes it
// (gateway.KeysFileYAML) loads through the loader to the same keys:
// names that need quoting, globs, every limit (the smallest and largest
// spend), created_at; a file with no key is `keys: []`. A created_at
// written by hand may be unquoted; a bad one names the file and the key.
func TestKeysFileWrittenLoads(t *testing.T) {
	created := time.Date(2026, 12, 5, 18, 0, 1, 0, time.UTC)
	keys := []gateway.KeyConfig{
		{Name: `team "a": #1 ünï`, SHA256: hashKey("sk-a"), Models: []string{"*", "meta-llama/*", "[ab]-m?"},
			Limits: gateway.KeyLimits{RequestsPerMinute: 60, TokensPerMinute: 1 << 40, Concurrent: 3, MaxSpendPerDay: 0.000001, MaxSpendPerMonth: 9e6},
			Source: gateway.KeySourceKeysFile, CreatedAt: created},
		{Name: "- yes", SHA256: hashKey("sk-b"), Models: []string{"m"}, Source: gateway.KeySourceKeysFile},
		{Name: "x", SHA256: hashKey("sk-x"), Models: []string{"*"}, Limits: gateway.KeyLimits{MaxSpendPerDay: 12.5}, Source: gateway.KeySourceKeysFile},
	}
	got, _, err := loadKeysFile(writeKeysFile(t, string(gateway.KeysFileYAML(keys))))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, keys) {
		t.Errorf("loaded\n%+v\nwant\n%+v\nfrom:\n%s", got, keys, gateway.KeysFileYAML(keys))
	}
	got, _, err = loadKeysFile(writeKeysFile(t, string(gateway.KeysFileYAML(nil))))
	if err != nil || len(got) != 0 {
		t.Errorf("no key: %v %v", got, err)
	}
	got, _, err = loadKeysFile(writeKeysFile(t, "keys:\n  - {name: a, sha256: "+hashKey("sk-a")+", models: [\"*\"], created_at: 2026-12-05T18:00:01Z}\n"))
	if err != nil || len(got) != 1 || !got[0].CreatedAt.Equal(created) {
		t.Errorf("unquoted created_at: %+v %v", got, err)
	}
	path := writeKeysFile(t, "keys:\n  - {name: a, sha256: "+hashKey("sk-a")+", models: [\"*\"], created_at: \"yesterday\"}\n")
	if _, _, err := loadKeysFile(path); err == nil || !strings.Contains(err.Error(), "keys_file "+path+": keys[0].created_at") {
		t.Errorf("a bad created_at: %v", err)
	}
}

// adminDo sends method path with body to the admin listener of p and
// returns the status and body.
func adminDo(t *testing.T, client *http.Client, p *gatewayProc, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, p.admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestRunKeysAPIKeysFile: the gateway run with auth.keys_file and no
// Redis: a key created through the admin API is served at once and
// written to the keys file, which loads through the loader (and its
// reload by the watch changes nothing); a revoked key is refused at once
// and gone from the file.
func TestRunKeysAPIKeysFile(t *testing.T) {
	testutil.UnsetOTEL(t)
	e := startSim(t)
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	writeFile(t, keys, keysYAML("", "alice"))
	path := filepath.Join(dir, "gateway.yaml")
	writeFile(t, path, keysFileConfig(e, keys, "{debounce: 50ms}")+"admin: {auth: {open_writes: true}}\n")
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	waitKeys(t, client, p, map[string]int{"alice": 200})

	st, b := adminDo(t, client, p, http.MethodPost, "/admin/keys", `{"name":"bob","models":["demo-model"],"limits":{"requests_per_minute":100}}`)
	var created struct {
		Name, Key, Source string
		CreatedAt         time.Time `json:"created_at"`
	}
	if st != http.StatusCreated || json.Unmarshal(b, &created) != nil || created.Source != gateway.KeySourceKeysFile {
		t.Fatalf("POST /admin/keys: %d %s", st, b)
	}
	if got := chatStatus(t, client, p.public, created.Key); got != http.StatusOK {
		t.Errorf("the created key at once: %d, want 200", got)
	}
	loaded, _, err := loadKeysFile(keys)
	if err != nil {
		t.Fatal(err)
	}
	want := []gateway.KeyConfig{testKey("alice"),
		{Name: "bob", SHA256: hashKey(created.Key), Models: []string{"demo-model"}, Limits: gateway.KeyLimits{RequestsPerMinute: 100}, CreatedAt: created.CreatedAt}}
	for i := range want {
		want[i].Source = gateway.KeySourceKeysFile
	}
	if !reflect.DeepEqual(loaded, want) {
		t.Errorf("keys file loads as\n%+v\nwant\n%+v", loaded, want)
	}
	st, b = adminDo(t, client, p, http.MethodDelete, "/admin/keys/bob", "")
	if st != http.StatusOK {
		t.Fatalf("DELETE: %d %s", st, b)
	}
	if got := chatStatus(t, client, p.public, created.Key); got != http.StatusUnauthorized {
		t.Errorf("the revoked key at once: %d, want 401", got)
	}
	if loaded, _, err := loadKeysFile(keys); err != nil || len(loaded) != 1 || loaded[0].Name != "alice" {
		t.Errorf("keys file after the revocation: %+v %v", loaded, err)
	}
	// The watch reloads the file the API wrote: accepted, the same keys.
	waitKeys(t, client, p, map[string]int{"alice": 200})
	if logs := p.logs.String(); strings.Contains(logs, "rejected") || strings.Contains(logs, created.Key) {
		t.Errorf("logs reject a reload or show the secret:\n%s", logs)
	}
	if logs := p.logsWith(t, "api key revoked"); !strings.Contains(logs, "api key created") {
		t.Errorf("logs lack the creation:\n%s", logs)
	}
}

// TestLoadKeysFileEmptyRequired: under auth.required an empty keys file
// loads (no key refuses every request, and the keys API fills the file);
// without it, it is refused (auth would be off).
func TestLoadKeysFileEmptyRequired(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys.yaml")
	writeFile(t, keys, "keys: []\n")
	for _, required := range []bool{true, false} {
		path := filepath.Join(dir, "gateway.yaml")
		writeFile(t, path, "auth: {required: "+strconv.FormatBool(required)+", keys_file: \""+keys+"\"}\nengines:\n  - {name: e1, url: \"http://127.0.0.1:1\", models: [m]}\n")
		cfg, err := loadConfig([]string{"--config", path}, environ())
		switch {
		case required && (err != nil || !cfg.Auth.Required || len(cfg.Auth.Keys) != 0):
			t.Errorf("required, empty keys file: %v, %+v", err, cfg.Auth)
		case !required && (err == nil || !strings.Contains(err.Error(), "auth would be off") || !strings.Contains(err.Error(), "auth.required")):
			t.Errorf("not required, empty keys file: %v, want refused naming auth.required", err)
		}
	}
}
