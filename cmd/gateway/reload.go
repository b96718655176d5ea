package main

// This file reloads the configuration while the gateway runs: on SIGHUP,
// and when the config file changes (reload.watch). Each reload runs the
// whole load of start-up again (defaults < file < environment < flags),
// validates it, builds the routing policy when its section changed and
// hands the gateway section to gateway.Server.Reload. A rejected config is
// logged on one line and counted; the running one stays in force.

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/internal/cfgdiff"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// ReloadConfig is the `reload` section: how configuration changes reach the
// running gateway (SIGHUP always reloads).
type ReloadConfig struct {
	// Watch, when true (the default), reloads when the --config file
	// changes: its directory is watched, so an editor's rename into place
	// and a Kubernetes ConfigMap's symlink swap are seen, not only writes.
	Watch bool `koanf:"watch"`
	// Debounce is how long the file must stay quiet after a change before
	// it is read, so a burst of writes becomes one reload. Default 200 ms.
	Debounce time.Duration `koanf:"debounce"`
}

// gatewayConfig is the gateway section of cfg with the engine list (cfg's
// engines, then extra: the simulated ones), the model aliases, the API
// keys and the access-log switch filled in.
func gatewayConfig(cfg Config, extra []gateway.EngineConfig) gateway.Config {
	g := cfg.Server.Config
	g.Engines = append(slices.Clone(cfg.Engines), extra...)
	g.Models = cfg.Models
	g.Auth = cfg.Auth
	g.AccessLog = cfg.Log.Access
	return g
}

// reloader re-reads the configuration and applies it to the gateway. One
// reload runs at a time.
type reloader struct {
	args    []string
	environ func() []string
	log     *slog.Logger
	gw      *gateway.Server
	metrics *telemetry.Metrics
	sims    []gateway.EngineConfig // appended to every engine list

	mu      sync.Mutex
	started Config         // the configuration the process started with
	routing routing.Config // the routing section of the policy in force
	policy  routing.Policy
}

// reload loads the configuration again and applies it, logging and
// counting the result. trigger says what asked for it ("SIGHUP", "file").
// It returns the sum (contentSum) of the config file's bytes it loaded,
// applied or rejected: the content the watch compares the file with next.
func (r *reloader) reload(trigger string) (loaded [32]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, loaded, err := r.apply(trigger)
	if err != nil {
		// One line, however many problems the config has.
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		r.log.Error("config reload rejected; the running config is kept", "trigger", trigger, "error", msg)
	}
	r.metrics.RecordReload(context.Background(), res)
	return loaded
}

// apply is reload's work: the result, the sum of the bytes loaded, and
// why the config was rejected.
func (r *reloader) apply(trigger string) (telemetry.ReloadResult, [32]byte, error) {
	cfg, loaded, err := loadConfigSum(r.args, r.environ)
	if err != nil {
		return telemetry.ReloadRejected, loaded, err
	}
	policy := r.policy
	if !reflect.DeepEqual(cfg.Routing, r.routing) {
		// A new policy starts with empty state (its round-robin position,
		// session ring, prefix index), so it is built only when its
		// section changed.
		if policy, err = routing.NewPolicy(cfg.Routing); err != nil {
			return telemetry.ReloadRejected, loaded, err
		}
	}
	rep, err := r.gw.Reload(gatewayConfig(cfg, r.sims), policy)
	if err != nil {
		return telemetry.ReloadRejected, loaded, err
	}
	r.policy, r.routing = policy, cfg.Routing
	restart := append(restartKeys(r.started, cfg), rep.Restart...)
	res := telemetry.ReloadUnchanged
	if rep.Applied() {
		res = telemetry.ReloadApplied
	}
	attrs := []any{"trigger", trigger, "result", res.String()}
	add := func(key string, v []string) {
		if len(v) > 0 {
			attrs = append(attrs, key, strings.Join(v, ","))
		}
	}
	add("engines_added", rep.Added)
	add("engines_removed", rep.Removed)
	add("engines_changed", rep.Changed)
	if rep.PolicyChanged {
		attrs = append(attrs, "policy", cfg.Routing.Policy)
	}
	add("settings", rep.Settings)
	r.log.Info("config reloaded", attrs...)
	if len(restart) > 0 {
		r.log.Warn("config changes that need a restart to apply; the running values stay in force", "keys", strings.Join(restart, ", "))
	}
	return res, loaded, nil
}

// restartKeys returns the keys outside the gateway section whose values
// differ between the running configuration and next and that only a
// restart applies: the listeners and their timeouts, admin, telemetry,
// log level and format, simulate, reload. The engines, models, auth and
// routing sections apply at once, and the gateway section's own keys (and
// auth's) are reported by gateway.Server.Reload.
func restartKeys(running, next Config) []string {
	var keys []string
	// The gateway section (squashed into server) is Reload's to report;
	// engines, models, auth and routing apply at once.
	cfgdiff.Diff("", reflect.ValueOf(running), reflect.ValueOf(next), func(key, opts string) bool {
		return opts == "squash" || key == "engines" || key == "models" || key == "auth" || key == "routing" || key == "log.access"
	}, &keys)
	return keys
}

// configFile returns the --config path in args ("" when none).
func configFile(args []string) string {
	fs := newFlagSet()
	if fs.Parse(args) != nil {
		return ""
	}
	path, _ := fs.GetString("config")
	return path
}

// startReloads reloads on each signal from hup (SIGHUP, which run catches
// from its start, so a signal sent while the gateway started is waiting
// there) and, when watch is set and path is not empty, when the file at
// path changes (debounced by debounce), until ctx ends (the shutdown
// starts) or stop is called. loaded is the sum (contentSum) of the file's
// bytes the running configuration was loaded from: a file that differs
// from it once the watch is set up (edited while the gateway started) is
// reloaded after debounce. stop waits for a reload in progress. A watch
// that cannot be set up is logged; SIGHUP still works.
func (r *reloader) startReloads(ctx context.Context, hup <-chan os.Signal, path string, loaded [32]byte, watch bool, debounce time.Duration) (stop func()) {
	var w *fsnotify.Watcher
	if path != "" && watch {
		var err error
		if w, err = newFileWatch(path); err != nil {
			r.log.Warn("config file not watched; reload with SIGHUP", "path", path, "error", err)
			w = nil
		} else {
			r.log.Info("watching the config file for changes", "path", path, "debounce", debounce)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchLoop(ctx, w, path, loaded, debounce, hup, r.log, r.reload)
	}()
	return func() {
		cancel()
		<-done
		if w != nil {
			_ = w.Close()
		}
	}
}

// newFileWatch watches the directory of path, and that of the file it
// resolves to when it is a symlink elsewhere: a file replaced by a rename,
// or a ConfigMap's ..data symlink swapped, is seen only there.
func newFileWatch(path string) (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(filepath.Dir(path)); err != nil {
		_ = w.Close()
		return nil, err
	}
	addRealDir(w, path)
	return w, nil
}

// addRealDir adds the directory of the file path resolves to, if it is
// not watched yet (errors ignored: the file may be gone for a moment).
func addRealDir(w *fsnotify.Watcher, path string) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return
	}
	dir := filepath.Dir(real)
	if !slices.Contains(w.WatchList(), dir) {
		_ = w.Add(dir)
	}
}

// concerns reports whether a watch event on name may have changed the
// config file at path: it is the file itself (written, or renamed into
// place), the file path resolves to, or one of the ..-prefixed entries of
// Kubernetes' atomic writer (the ..data symlink, the ..<timestamp>
// directories) that a ConfigMap update swaps.
func concerns(name, path string) bool {
	name = filepath.Clean(name)
	if name == filepath.Clean(path) || strings.HasPrefix(filepath.Base(name), "..") {
		return true
	}
	real, err := filepath.EvalSymlinks(path)
	return err == nil && name == filepath.Clean(real)
}

// fileSum is the contentSum of the file at path as it is now.
func fileSum(path string) [32]byte {
	// Cleaned as koanf's file provider cleans it, so a read error is
	// worded (and summed) as the load words it.
	return contentSum(os.ReadFile(filepath.Clean(path)))
}

// contentSum is the SHA-256 of a config file's content b, or of its read
// error err: a change of either is a change.
func contentSum(b []byte, err error) [32]byte {
	if err != nil {
		return sha256.Sum256([]byte("error: " + err.Error()))
	}
	return sha256.Sum256(b)
}

// watchLoop serves SIGHUP and the events of w (nil: none) until ctx ends,
// calling reload with "SIGHUP" or "file"; reload returns the sum
// (contentSum) of the bytes it loaded, and last is that of the running
// configuration's. An event that concerns the file (concerns: its name,
// what it resolves to, or a ConfigMap's ..data swap) (re)starts the
// debounce timer; other files in the directory are ignored, so a log
// written next to the config cannot keep putting a reload off. When the
// timer fires the file is read again and reloaded only if its content
// changed, so chmods and rewrites of the same bytes do not count. With a
// watch the timer also runs once at the start: a change made before the
// watch was set up has no event.
func watchLoop(ctx context.Context, w *fsnotify.Watcher, path string, last [32]byte, debounce time.Duration, hup <-chan os.Signal, log *slog.Logger, reload func(trigger string) [32]byte) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w != nil {
		events, errs = w.Events, w.Errors
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	if w != nil {
		timer.Reset(debounce)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last = reload("SIGHUP")
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if concerns(ev.Name, path) {
				timer.Reset(debounce)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			if !errors.Is(err, fsnotify.ErrEventOverflow) {
				log.Warn("config file watch", "error", err)
				continue
			}
			timer.Reset(debounce) // events were lost: look at the file
		case <-timer.C:
			if w != nil {
				addRealDir(w, path)
			}
			if fileSum(path) != last {
				last = reload("file")
			}
		}
	}
}
