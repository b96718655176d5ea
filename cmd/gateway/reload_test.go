package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// watched runs watchLoop on path and records each reload's trigger.
type watched struct {
	mu       sync.Mutex
	triggers []string
	hup      chan os.Signal
}

func watch(t *testing.T, path string, debounce time.Duration) *watched {
	t.Helper()
	return watchFrom(t, path, filesNow(path, loadedFrom{}), debounce)
}

// watchFrom is watch with loaded what the running configuration was
// loaded from (the keys file it names is watched too); each reload loads
// the files as they are.
func watchFrom(t *testing.T, path string, loaded loadedFrom, debounce time.Duration) *watched {
	t.Helper()
	w, err := newFileWatch(append([]string{path}, loaded.files()...)...)
	if err != nil {
		t.Fatal(err)
	}
	wd := &watched{hup: make(chan os.Signal, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchLoop(ctx, w, path, loaded, debounce, wd.hup, slog.New(slog.NewTextHandler(io.Discard, nil)), func(trigger string) loadedFrom {
			wd.mu.Lock()
			wd.triggers = append(wd.triggers, trigger)
			wd.mu.Unlock()
			return filesNow(path, loaded)
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = w.Close()
	})
	return wd
}

func (wd *watched) got() []string {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	return slices.Clone(wd.triggers)
}

// waitFor polls until n reloads were triggered, then checks that no more
// come within settle.
func (wd *watched) waitFor(t *testing.T, n int, settle time.Duration) {
	t.Helper()
	testutil.Poll(5*time.Second, func() bool { return len(wd.got()) >= n })
	time.Sleep(settle) // a debounced extra reload would come within this
	if got := wd.got(); len(got) != n {
		t.Fatalf("reloads triggered: %v, want %d", got, n)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestWatchConfigFile: the watch sees in-place writes, an editor's rename
// into place and a Kubernetes ConfigMap's symlink swap; a burst of writes
// is one reload; a rewrite with the same content, a chmod and another
// file in the directory are none; SIGHUP always reloads.
func TestWatchConfigFile(t *testing.T) {
	const debounce = 50 * time.Millisecond
	settle := 3 * debounce

	t.Run("write, rename, burst", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "gateway.yaml")
		writeFile(t, path, "a: 1\n")
		wd := watch(t, path, debounce)

		writeFile(t, path, "a: 2\n")
		wd.waitFor(t, 1, settle)

		tmp := filepath.Join(dir, ".gateway.yaml.swp")
		writeFile(t, tmp, "a: 3\n")
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		wd.waitFor(t, 2, settle)

		for i := range 5 {
			writeFile(t, path, "a: 4\n"+string(rune('a'+i))+": 0\n")
			time.Sleep(5 * time.Millisecond)
		}
		wd.waitFor(t, 3, settle)

		writeFile(t, path, "a: 4\ne: 0\n") // the same content again
		if err := os.Chmod(path, 0o600); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "other.txt"), "x")
		wd.waitFor(t, 3, settle)

		wd.hup <- syscall.SIGHUP
		wd.waitFor(t, 4, settle)
		if got := wd.got(); !slices.Equal(got, []string{"file", "file", "file", "SIGHUP"}) {
			t.Errorf("triggers %v", got)
		}
	})

	// A file written all the time next to the config (a log) does not
	// put the reload off: only events on the config file restart the
	// debounce.
	t.Run("busy directory", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "gateway.yaml")
		writeFile(t, path, "a: 1\n")
		wd := watch(t, path, debounce)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			f, err := os.OpenFile(filepath.Join(dir, "gateway.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return
			}
			defer f.Close()
			for {
				select {
				case <-stop:
					return
				case <-time.After(debounce / 5):
					_, _ = f.WriteString("line\n")
				}
			}
		}()
		defer func() { close(stop); <-done }()
		writeFile(t, path, "a: 2\n")
		wd.waitFor(t, 1, settle) // within 5 s, while the log keeps being written
	})

	// The file changed after the running config was loaded but before the
	// watch was set up (while the gateway started): no event will come,
	// and the first check finds the change.
	t.Run("changed before the watch", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, path, "a: 2\n")
		wd := watchFrom(t, path, loadedFrom{config: contentSum([]byte("a: 1\n"), nil)}, debounce)
		wd.waitFor(t, 1, settle)
		if got := wd.got(); !slices.Equal(got, []string{"file"}) {
			t.Errorf("triggers %v", got)
		}
	})

	t.Run("configmap symlink swap", func(t *testing.T) {
		// The kubelet's layout: gateway.yaml -> ..data/gateway.yaml,
		// ..data -> ..<timestamp>; an update writes a new timestamped
		// directory and renames a new ..data symlink over the old one.
		dir := t.TempDir()
		v1 := filepath.Join(dir, "..2026_01_01_v1")
		if err := os.Mkdir(v1, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(v1, "gateway.yaml"), "a: 1\n")
		if err := os.Symlink("..2026_01_01_v1", filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "gateway.yaml")
		if err := os.Symlink("..data/gateway.yaml", path); err != nil {
			t.Fatal(err)
		}
		wd := watch(t, path, debounce)

		swap := func(name, content string) {
			d := filepath.Join(dir, name)
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(d, "gateway.yaml"), content)
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(name, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
		swap("..2026_01_01_v2", "a: 2\n")
		wd.waitFor(t, 1, settle)
		if err := os.RemoveAll(v1); err != nil {
			t.Fatal(err)
		}
		swap("..2026_01_01_v3", "a: 3\n")
		wd.waitFor(t, 2, settle)
	})
}

func TestRestartKeys(t *testing.T) {
	run := defaults()
	next := defaults()
	next.Server.Listen = "0.0.0.0:1"
	next.Server.IdleTimeout = time.Minute
	next.Admin.Listen = ""
	next.Telemetry.CardinalityLimit = 10
	next.Log.Level = "debug"
	next.Log.Access = false                 // the gateway reports it
	next.Server.MaxAttempts = 7             // the gateway's own key
	next.Routing.Policy = "least-loaded"    // applied
	next.Engines = []fleet.EngineConfig{{}} // applied
	next.Models.Aliases = map[string]string{"a": "b"}
	next.Reload.Debounce = time.Second
	next.Auth.Keys = []gateway.KeyConfig{{Name: "a"}} // the gateway reports it
	next.Auth.HideUnauthorizedModels = true           // the gateway reports it
	next.Auth.KeysFile = "/etc/switchboard/keys.yaml" // read and watched at once
	next.Disaggregation.Enabled = true                // the gateway reports it
	next.Migration.Limit = 2                          // the gateway reports it
	want := []string{"server.listen", "server.idle_timeout", "admin.listen", "telemetry.cardinality_limit", "log.level", "reload.debounce"}
	if got := restartKeys(run, next); !slices.Equal(got, want) {
		t.Errorf("restartKeys = %v, want %v", got, want)
	}
	if got := restartKeys(run, defaults()); got != nil {
		t.Errorf("restartKeys of equal configs = %v", got)
	}
}

// TestLoadConfigShadowed: the keys the file sets that a variable or a flag
// sets too are reported with the file's value and the winner (the flag
// over the variable), and the winner's value is the one in force.
func TestLoadConfigShadowed(t *testing.T) {
	path := writeConfig(t, "simulate: {engines: 1}\nrouting: {policy: power-of-two}\nlog: {access: true, level: warn}\nserver: {listen: \"127.0.0.1:1\"}\n")
	cfg, _, got, err := loadConfigSum([]string{"--config", path, "--policy", "round-robin", "--admin-listen", "127.0.0.1:2"},
		environ("SWITCHBOARD_LOG__ACCESS=false", "SWITCHBOARD_ROUTING__POLICY=least-loaded", "SWITCHBOARD_SIMULATE__TTFT=1ms", "SWITCHBOARD_="))
	if err != nil {
		t.Fatal(err)
	}
	want := shadowed{
		"routing.policy": {file: "power-of-two", by: "--policy"},
		"log.access":     {file: true, by: "SWITCHBOARD_LOG__ACCESS"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("shadowed = %+v, want %+v", got, want)
	}
	if cfg.Routing.Policy != "round-robin" || cfg.Log.Access || cfg.Log.Level != "warn" || cfg.Server.Listen != "127.0.0.1:1" {
		t.Errorf("policy %q, access %t, level %q, listen %q: want round-robin (flag), false (env), warn and 127.0.0.1:1 (file)",
			cfg.Routing.Policy, cfg.Log.Access, cfg.Log.Level, cfg.Server.Listen)
	}
	if _, _, got, err := loadConfigSum(nil, environ("SWITCHBOARD_SIMULATE__ENGINES=1")); err != nil || len(got) != 0 {
		t.Errorf("without a file: shadowed %v, err %v; want none", got, err)
	}
}

func TestShadowChanges(t *testing.T) {
	policy := func(v string) shadowedKey { return shadowedKey{file: v, by: "--policy"} }
	models := func(v ...any) shadowedKey { return shadowedKey{file: v, by: "SWITCHBOARD_SIMULATE__MODELS"} }
	tests := []struct {
		name          string
		running, next shadowed
		want          []string
	}{
		{"none", nil, shadowed{}, nil},
		{"unchanged", shadowed{"routing.policy": policy("a"), "simulate.models": models("m")},
			shadowed{"routing.policy": policy("a"), "simulate.models": models("m")}, nil},
		{"changed", shadowed{"routing.policy": policy("a"), "simulate.models": models("m")},
			shadowed{"routing.policy": policy("b"), "simulate.models": models("m", "n")}, []string{"routing.policy", "simulate.models"}},
		{"set", nil, shadowed{"routing.policy": policy("a")}, []string{"routing.policy"}},
		{"removed", shadowed{"routing.policy": policy("a")}, shadowed{}, []string{"routing.policy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := shadowChanges(tc.running, tc.next); !slices.Equal(got, tc.want) {
				t.Errorf("shadowChanges = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRunReloadShadowedKeys: a reload that changes keys of the file that a
// flag or a variable sets too logs, once per key, that the flag or the
// variable wins; the values in force stay theirs, and a later reload that
// leaves those keys alone logs nothing about them.
func TestRunReloadShadowedKeys(t *testing.T) {
	testutil.UnsetOTEL(t)
	e1, e2 := startSim(t), startSim(t)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	config := func(policy string, access bool, engines ...simEngine) string {
		out := "reload: {debounce: 20ms}\nrouting: {policy: " + policy + "}\nlog: {access: " + strconv.FormatBool(access) + "}\nengines:\n"
		for _, e := range engines {
			name := map[simEngine]string{e1: "e1", e2: "e2"}[e]
			out += "  - {name: " + name + ", url: \"" + e.url + "\"}\n"
		}
		return out
	}
	writeFile(t, path, config("round-robin", false, e1))
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--policy", "round-robin"},
		[]string{"SWITCHBOARD_LOG__ACCESS=false"})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	replaceFile(t, path, config("least-loaded", true, e1, e2))
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	waitEngines(t, client, p, []string{"e1", "e2"})
	const (
		flagWins = `msg="config file change not applied: the flag wins over the file" key=routing.policy flag=--policy`
		envWins  = `msg="config file change not applied: the environment variable wins over the file" key=log.access env=SWITCHBOARD_LOG__ACCESS`
	)
	count := func(logs, s string) int { return strings.Count(logs, s) }
	logs := p.logs.String()
	if count(logs, flagWins) != 1 || count(logs, envWins) != 1 || count(logs, "config file change not applied") != 2 {
		t.Errorf("logs do not say once each that --policy and SWITCHBOARD_LOG__ACCESS win:\n%s", logs)
	}
	if strings.Contains(logs, "policy=least-loaded") {
		t.Errorf("the file's policy was applied over --policy:\n%s", logs)
	}

	// Only the engines change: nothing more is said about the two keys.
	replaceFile(t, path, config("least-loaded", true, e2))
	waitReloads(t, client, p, map[string]float64{"applied": 2})
	waitEngines(t, client, p, []string{"e2"})
	if logs := p.logs.String(); count(logs, "config file change not applied") != 2 {
		t.Errorf("a reload that left the shadowed keys alone logged about them:\n%s", logs)
	}
}

// simEngine is a simulated engine on a real loopback HTTP server.
type simEngine struct {
	e   *enginesim.Engine
	url string
}

func startSim(t *testing.T) simEngine {
	t.Helper()
	return startSimITL(t, 2*time.Millisecond)
}

// startSimITL is startSim with itl between tokens (a 12-token stream lasts
// about 12 × itl).
func startSimITL(t *testing.T, itl time.Duration) simEngine {
	t.Helper()
	e, srv := enginetest.Start(t, enginesim.Config{Models: []string{"demo-model"}, TTFT: 2 * time.Millisecond, ITL: itl})
	return simEngine{e: e, url: srv.URL}
}

// replaceFile writes content to path the way editors do: a temporary file
// renamed into place.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// reloads returns switchboard_config_reloads_total by result.
func reloads(t *testing.T, client *http.Client, admin string) map[string]float64 {
	t.Helper()
	return testutil.Samples(testutil.Scrape(t, client, admin+"/metrics"), "switchboard_config_reloads_total", "result")
}

// waitReloads polls the reloads counter until it reads want.
func waitReloads(t *testing.T, client *http.Client, p *gatewayProc, want map[string]float64) {
	t.Helper()
	pollFor(t, func() (bool, string) {
		got := reloads(t, client, p.admin)
		return mapsEqual(got, want), fmt.Sprintf("reloads = %v, want %v; logs:\n%s", got, want, p.logs)
	})
}

// pollFor polls check (testutil.Poll) until it reports done, for up to
// 10 s, and fails the test with check's last message if it never does.
func pollFor(t *testing.T, check func() (done bool, msg string)) {
	t.Helper()
	var msg string
	if !testutil.Poll(10*time.Second, func() bool {
		done, m := check()
		msg = m
		return done
	}) {
		t.Fatal(msg)
	}
}

// loadResult is one request of the load loop.
type loadResult struct {
	engine     string // X-Switchboard-Engine
	err        string // "" for a complete stream
	start, end time.Time
}

// load runs streaming chat requests on workers goroutines until stop is
// closed (or a minute passes), and reports each result.
type load struct {
	mu      sync.Mutex
	results []loadResult
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startLoad(t *testing.T, client *http.Client, base string, workers int) *load {
	l := &load{stop: make(chan struct{})}
	end := time.Now().Add(time.Minute)
	body := `{"model":"demo-model","stream":true,"max_tokens":12,"messages":[{"role":"user","content":"hello"}]}`
	for range workers {
		l.wg.Go(func() {
			for time.Now().Before(end) {
				select {
				case <-l.stop:
					return
				default:
				}
				r := loadResult{start: time.Now()}
				resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					r.err = err.Error()
				} else {
					r.engine = resp.Header.Get("X-Switchboard-Engine")
					evs, err := readSSE(resp.Body, nil)
					resp.Body.Close()
					switch {
					case resp.StatusCode != http.StatusOK:
						r.err = "status " + strconv.Itoa(resp.StatusCode)
					case err != nil:
						r.err = err.Error()
					case len(evs) == 0 || evs[len(evs)-1].data != "[DONE]":
						r.err = "stream without [DONE]"
					default:
						for _, ev := range evs {
							if strings.Contains(ev.data, `"error"`) {
								r.err = "error event: " + ev.data
							}
						}
					}
				}
				r.end = time.Now()
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}
		})
	}
	t.Cleanup(l.end)
	return l
}

func (l *load) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// served counts the complete requests per engine so far.
func (l *load) served() (map[string]int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, r := range l.results {
		if r.err == "" {
			out[r.engine]++
		}
	}
	return out, len(l.results)
}

// waitServed polls until cond holds of the per-engine counts.
func (l *load) waitServed(t *testing.T, what string, cond func(map[string]int) bool) {
	t.Helper()
	pollFor(t, func() (bool, string) {
		got, _ := l.served()
		return cond(got), fmt.Sprintf("%s: served %v", what, got)
	})
}

// TestRunReloadUnderLoad: while a load loop streams through the gateway
// (run in-process, simulated engines on real sockets), the config file is
// edited: an engine is added (and probed by the reload: the health
// interval is an hour), one is removed, the policy changes with a setting
// that needs a restart, and an invalid edit is rejected with the old
// config still serving. No request fails, not even one in flight on the
// removed engine (it stays healthy and drains), the removed engine gets
// nothing once drained, every gauge ends at exactly 0 and the reloads
// counter shows 3 applied and 1 rejected.
func TestRunReloadUnderLoad(t *testing.T) {
	testutil.UnsetOTEL(t)
	// e1 streams for about 360 ms, so it has streams in flight when it is
	// removed: they must drain on it and complete.
	e1, e2, e3 := startSimITL(t, 30*time.Millisecond), startSim(t), startSim(t)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	config := func(policy, idle string, engines ...string) string {
		return "server:\n  idle_timeout: " + idle + "\n  health: {interval: 1h}\n  engine_stats: {enabled: false}\n" +
			"log: {access: false}\nreload: {debounce: 50ms}\nrouting: {policy: " + policy + "}\nengines:\n" + strings.Join(engines, "")
	}
	eng := func(name string, s simEngine, models bool) string {
		out := "  - name: " + name + "\n    url: " + s.url + "\n"
		if models {
			out += "    models: [demo-model]\n"
		}
		return out
	}
	writeFile(t, path, config("round-robin", "2m", eng("e1", e1, true), eng("e2", e2, false)))
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	l := startLoad(t, client, p.public, 4)
	l.waitServed(t, "warm-up", func(m map[string]int) bool { return m["e1"] >= 5 && m["e2"] >= 5 })

	// 1. Add e3, models left to discovery.
	replaceFile(t, path, config("round-robin", "2m", eng("e1", e1, true), eng("e2", e2, false), eng("e3", e3, false)))
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	l.waitServed(t, "e3 added", func(m map[string]int) bool { return m["e3"] >= 5 })

	// 2. Remove e1 (written in place).
	writeFile(t, path, config("round-robin", "2m", eng("e2", e2, false), eng("e3", e3, false)))
	waitReloads(t, client, p, map[string]float64{"applied": 2})
	waitEngines(t, client, p, []string{"e2", "e3"}) // e1 drained
	e1Received := e1.e.Stats().Received
	_, total := l.served()
	l.waitServed(t, "after removing e1", func(m map[string]int) bool { return m["e2"]+m["e3"] >= total+20 })
	if n := e1.e.Stats().Received; n != e1Received {
		t.Errorf("e1 received %d requests after it was removed and drained", n-e1Received)
	}

	// 3. The policy changes, and a setting that needs a restart.
	writeFile(t, path, config("least-loaded", "3m", eng("e2", e2, false), eng("e3", e3, false)))
	waitReloads(t, client, p, map[string]float64{"applied": 3})

	// 4. An invalid edit: rejected whole, the old config still serving.
	replaceFile(t, path, config("least-loaded", "3m", eng("e2", e2, false), eng("e3", e3, false), "  - name: e4\n    url: ftp://nowhere\n"))
	waitReloads(t, client, p, map[string]float64{"applied": 3, "rejected": 1})
	_, total = l.served()
	l.waitServed(t, "after the rejected edit", func(m map[string]int) bool { return m["e2"]+m["e3"] >= total+20 })
	waitEngines(t, client, p, []string{"e2", "e3"})

	l.end()
	served, total := l.served()
	t.Logf("%d requests, complete per engine: %v", total, served)
	// e1 was removed but stayed healthy: the streams it had in flight
	// drain on it, so its removal fails none of them.
	removed := logTime(t, p.logsWith(t, "engines_removed=e1"), "engines_removed=e1")
	spanned := 0
	for _, r := range l.results {
		if r.err != "" {
			t.Errorf("request on %q failed: %s", r.engine, r.err)
		}
		if r.engine == "e1" && r.start.Before(removed) && r.end.After(removed) {
			spanned++
		}
	}
	if spanned == 0 {
		t.Error("no stream was in flight on e1 while it was removed: the drain went untested")
	}
	t.Logf("%d streams on e1 were in flight while it was removed", spanned)
	waitIdle(t, client, p)
	if got := reloads(t, client, p.admin); !mapsEqual(got, map[string]float64{"applied": 3, "rejected": 1}) {
		t.Errorf("reloads = %v", got)
	}

	logs := p.logs.String()
	if testing.Verbose() {
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "reload") || strings.Contains(line, "restart") {
				t.Log(line)
			}
		}
	}
	for _, want := range []string{"engines_added=e3", "engines_removed=e1", "policy=least-loaded",
		"need a restart to apply; the running values stay in force\" keys=server.idle_timeout", "config reload rejected"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "config reload rejected") && !strings.Contains(line, `engine \"e4\": url scheme must be http or https`) {
			t.Errorf("rejection line does not name the problem: %s", line)
		}
	}
}

// logTime returns the time of the first log line holding s (the text
// handler's time= field, to the millisecond).
func logTime(t *testing.T, logs, s string) time.Time {
	t.Helper()
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, s) {
			continue
		}
		f, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, f)
		if err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		return at
	}
	t.Fatalf("no log line holds %q:\n%s", s, logs)
	return time.Time{}
}

// waitEngines polls /admin/engines until the engines are exactly names
// (no retired incarnation left).
func waitEngines(t *testing.T, client *http.Client, p *gatewayProc, names []string) {
	t.Helper()
	pollFor(t, func() (bool, string) {
		var st struct {
			Engines []struct {
				Name string `json:"name"`
			} `json:"engines"`
		}
		getJSON(t, client, p.admin+"/admin/engines", &st)
		var got []string
		for _, e := range st.Engines {
			got = append(got, e.Name)
		}
		return slices.Equal(got, names), fmt.Sprintf("engines %v, want %v", got, names)
	})
}

// waitIdle polls until every in-flight gauge and every engine's counters
// read exactly 0 and no attempt is live.
func waitIdle(t *testing.T, client *http.Client, p *gatewayProc) {
	t.Helper()
	pollFor(t, func() (bool, string) {
		var st struct {
			Engines []struct {
				Name            string `json:"name"`
				Prefill, Decode int64
				Retired         bool `json:"retired"`
			} `json:"engines"`
			LiveAttempts int64 `json:"live_attempts"`
			Requests     int64 `json:"requests_in_flight"`
		}
		getJSON(t, client, p.admin+"/admin/engines", &st)
		idle := st.LiveAttempts == 0 && st.Requests == 0
		for _, e := range st.Engines {
			idle = idle && e.Prefill == 0 && e.Decode == 0 && !e.Retired
		}
		gauges := activeRequests(testutil.Scrape(t, client, p.admin+"/metrics"))
		for _, v := range gauges {
			idle = idle && v == 0
		}
		return idle, fmt.Sprintf("not idle: engines %+v, gauges %v", st, gauges)
	})
}

// TestRunReloadSIGHUP: with the watch off, SIGHUP reloads the file; a
// change that needs a restart alone is counted as unchanged and logged.
func TestRunReloadSIGHUP(t *testing.T) {
	testutil.UnsetOTEL(t)
	e1, e2 := startSim(t), startSim(t)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	base := "reload: {watch: false}\nlog: {access: false}\nengines:\n  - {name: e1, url: \"" + e1.url + "\"}\n"
	writeFile(t, path, base)
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	writeFile(t, path, base+"  - {name: e2, url: \""+e2.url+"\"}\n")
	time.Sleep(100 * time.Millisecond) // the watch is off: nothing may happen
	if got := reloads(t, client, p.admin); len(got) != 0 {
		t.Fatalf("reloads %v with the watch off and no SIGHUP", got)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	waitEngines(t, client, p, []string{"e1", "e2"})

	writeFile(t, path, strings.Replace(base, "log: {access: false}", "log: {access: true, level: debug}", 1)+"  - {name: e2, url: \""+e2.url+"\"}\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitReloads(t, client, p, map[string]float64{"applied": 1, "unchanged": 1})
	if logs := p.logs.String(); !strings.Contains(logs, "keys=\"log.level, log.access\"") {
		t.Errorf("logs do not name log.level and log.access as needing a restart:\n%s", logs)
	}
}

// startSimHook is startSim whose first /health request runs hook before
// it is answered: run's first probe round, inside gw.Start, after the
// config was loaded and before the reloader (and its watch) runs.
func startSimHook(t *testing.T, hook func()) simEngine {
	t.Helper()
	e, err := enginesim.New(enginesim.Config{Models: []string{"demo-model"}, TTFT: 2 * time.Millisecond, ITL: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	h := e.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			once.Do(hook)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return simEngine{e: e, url: srv.URL}
}

// startupConfig is a config for the start-up tests: the engines given,
// the health interval an hour (only the start's probe round comes).
func startupConfig(reload string, engines ...simEngine) string {
	out := "server:\n  health: {interval: 1h}\n  engine_stats: {enabled: false}\nlog: {access: false}\nreload: " + reload + "\nengines:\n"
	for i, e := range engines {
		out += "  - {name: e" + strconv.Itoa(i+1) + ", url: \"" + e.url + "\"}\n"
	}
	return out
}

// TestRunReloadEditDuringStart: the config file is edited while the
// gateway starts (during its first probe round, before the watch is set
// up, so no event ever reports it): the edit is applied all the same, as
// the file no longer holds what was loaded.
func TestRunReloadEditDuringStart(t *testing.T) {
	testutil.UnsetOTEL(t)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	const reload = "{debounce: 50ms}"
	e2 := startSim(t)
	var e1 simEngine
	e1 = startSimHook(t, func() {
		if err := os.WriteFile(path, []byte(startupConfig(reload, e1, e2)), 0o644); err != nil {
			t.Error(err)
		}
	})
	writeFile(t, path, startupConfig(reload, e1))
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	waitEngines(t, client, p, []string{"e1", "e2"})
	p.logsWith(t, "trigger=file")
}

// TestRunSIGHUPDuringStart: a SIGHUP sent while the gateway starts (during
// its first probe round, before the reloader runs) neither ends the
// process (SIGHUP's default action) nor is lost: the reload it asked for
// runs once the gateway is up. The signal goes to the whole process, so
// the gateway runs in a child process of this test: a gateway that does
// not catch it yet dies there, and this test fails.
func TestRunSIGHUPDuringStart(t *testing.T) {
	const child = "SWITCHBOARD_TEST_SIGHUP_CHILD"
	if os.Getenv(child) != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRunSIGHUPDuringStart$", "-test.count=1", "-test.v", "-test.timeout=60s")
		cmd.Env = append(os.Environ(), child+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestRunSIGHUPDuringStart") {
			t.Fatalf("the gateway's process: %v\n%s", err, out)
		}
		return
	}
	testutil.UnsetOTEL(t)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	const reload = "{watch: false}"
	e2 := startSim(t)
	var e1 simEngine
	e1 = startSimHook(t, func() {
		if err := os.WriteFile(path, []byte(startupConfig(reload, e1, e2)), 0o644); err != nil {
			t.Error(err)
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Error(err)
		}
	})
	writeFile(t, path, startupConfig(reload, e1))
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	waitReloads(t, client, p, map[string]float64{"applied": 1})
	waitEngines(t, client, p, []string{"e1", "e2"})
	p.logsWith(t, "trigger=SIGHUP")
}

// TestRunAdminReload: POST /admin/reload reloads the configuration as
// SIGHUP does, answering applied, unchanged, or 422 with the reasons of a
// rejection (the running configuration kept); it is a write action, so
// it needs the admin token, and a refused call reloads nothing.
func TestRunAdminReload(t *testing.T) {
	testutil.UnsetOTEL(t)
	const token = "admin-reload-token-3f9c2a7e51"
	e1, e2 := startSim(t), startSim(t)
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	base := "reload: {watch: false}\nlog: {access: false}\nadmin: {auth: {tokens_env: SB_TEST_RELOAD_TOKEN}}\nengines:\n  - {name: e1, url: \"" + e1.url + "\"}\n"
	writeFile(t, path, base)
	t.Setenv("SB_TEST_RELOAD_TOKEN", token) // read from the process's environment, as the gateway reads it
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	post := func(tok string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.admin+"/admin/reload", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	writeFile(t, path, base+"  - {name: e2, url: \""+e2.url+"\"}\n")
	if st, body := post(""); st != http.StatusUnauthorized {
		t.Errorf("reload without the token: %d %s, want 401", st, body)
	}
	if got := reloads(t, client, p.admin); len(got) != 0 {
		t.Fatalf("reloads %v after a refused call", got)
	}
	if st, body := post(token); st != http.StatusOK || !strings.Contains(body, `"result":"applied"`) {
		t.Errorf("reload: %d %s, want 200 applied", st, body)
	}
	waitEngines(t, client, p, []string{"e1", "e2"})
	if st, body := post(token); st != http.StatusOK || !strings.Contains(body, `"result":"unchanged"`) {
		t.Errorf("reload of the same file: %d %s, want 200 unchanged", st, body)
	}
	writeFile(t, path, base+"  - {name: e2, url: \"not a url\"}\n")
	if st, body := post(token); st != http.StatusUnprocessableEntity || !strings.Contains(body, "config_rejected") || !strings.Contains(body, "e2") {
		t.Errorf("reload of a bad file: %d %s, want 422 config_rejected naming e2", st, body)
	}
	waitReloads(t, client, p, map[string]float64{"applied": 1, "unchanged": 1, "rejected": 1})
	waitEngines(t, client, p, []string{"e1", "e2"})
}

// TestRunAdminTokensFileRotated: the admin tokens files are watched like
// the config file: a token rotated in admin.auth.tokens_file (a mounted
// Secret updated in place) works without a SIGHUP, the old one no longer;
// the read-only tokens file likewise.
func TestRunAdminTokensFileRotated(t *testing.T) {
	testutil.UnsetOTEL(t)
	const old, rotated = "admin-token-before-6b1d8e0f2a", "admin-token-after-93c47a5e1d"
	const readOld, readNew = "admin-read-before-0c2e4f6a8b", "admin-read-after-1d3f5a7b9c"
	e1 := startSim(t)
	dir := t.TempDir()
	tokens, readTokens := filepath.Join(dir, "admin-tokens"), filepath.Join(dir, "admin-read-tokens")
	writeFile(t, tokens, old+"\n")
	writeFile(t, readTokens, readOld+"\n")
	path := filepath.Join(dir, "gateway.yaml")
	writeFile(t, path, "reload: {debounce: 50ms}\nlog: {access: false}\nadmin: {auth: {reads: token, tokens_file: \""+tokens+
		"\", read_tokens_file: \""+readTokens+"\"}}\nengines:\n  - {name: e1, url: \""+e1.url+"\"}\n")
	p := startRun(t, []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	status := func(method, path, tok string) int {
		t.Helper()
		req, _ := http.NewRequest(method, p.admin+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := status(http.MethodPost, "/admin/engines/e1/undrain", old); st != http.StatusOK {
		t.Fatalf("the configured token: %d, want 200", st)
	}
	if st := status(http.MethodGet, "/admin/engines", readOld); st != http.StatusOK {
		t.Fatalf("the configured read-only token: %d, want 200", st)
	}
	replaceFile(t, tokens, rotated+"\n")
	replaceFile(t, readTokens, readNew+"\n")
	pollFor(t, func() (bool, string) {
		a, b := status(http.MethodPost, "/admin/engines/e1/undrain", rotated), status(http.MethodGet, "/admin/engines", readNew)
		return a == http.StatusOK && b == http.StatusOK, fmt.Sprintf("rotated tokens: %d and %d, want 200; logs:\n%s", a, b, p.logs)
	})
	// A rotation is a change applied, not "unchanged".
	if logs := p.logsWith(t, "trigger=file result=applied"); strings.Contains(logs, "result=unchanged") || strings.Contains(logs, "reload rejected") {
		t.Errorf("reloads after the rotation, want applied only:\n%s", logs)
	}
	if st := status(http.MethodPost, "/admin/engines/e1/undrain", old); st != http.StatusUnauthorized {
		t.Errorf("the rotated-out token: %d, want 401", st)
	}
	if st := status(http.MethodGet, "/admin/engines", readOld); st != http.StatusUnauthorized {
		t.Errorf("the rotated-out read-only token: %d, want 401", st)
	}
	if strings.Contains(p.logs.String(), rotated) || strings.Contains(p.logs.String(), old) {
		t.Error("an admin token is in the logs")
	}
}
