package main

// This file reloads the configuration while the gateway runs: on SIGHUP,
// POST /admin/reload, and when the config file, auth.keys_file or an
// admin tokens file changes (reload.watch). Each
// reload runs the whole load of start-up again (defaults < file <
// environment < flags, then the keys file), validates it, builds the
// routing policy when its section changed and hands the gateway section to
// gateway.Server.Reload. A rejected config is logged on one line and
// counted; the running one stays in force. A change of the file to a key
// that a SWITCHBOARD_ variable or a flag sets too is not applied (they
// win, as at start-up), and is logged once per key.

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
	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/cfgdiff"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// ReloadConfig is the `reload` section: how configuration changes reach the
// running gateway (SIGHUP always reloads).
type ReloadConfig struct {
	// Watch, when true (the default), reloads when the --config file, the
	// auth.keys_file or an admin tokens file (admin.auth.tokens_file,
	// read_tokens_file) changes: their directories are watched, so an
	// editor's rename into place and a Kubernetes ConfigMap's or Secret's
	// symlink swap are seen, not only writes.
	Watch bool `koanf:"watch"`
	// Debounce is how long the file must stay quiet after a change before
	// it is read, so a burst of writes becomes one reload. Default 200 ms.
	Debounce time.Duration `koanf:"debounce"`
}

// gatewayConfig is the gateway section of cfg with the engine list (cfg's
// engines, then extra: the simulated ones), the model aliases, the API
// keys and the access-log switch filled in.
func gatewayConfig(cfg Config, extra []fleet.EngineConfig) gateway.Config {
	g := cfg.Server.Config
	g.Engines = append(slices.Clone(cfg.Engines), extra...)
	g.Models = cfg.Models
	g.Auth = cfg.Auth.AuthConfig
	g.Auth.KeysFilePath = cfg.Auth.KeysFile // where the keys API writes without Redis
	g.Limits = cfg.Limits
	g.Migration = cfg.Migration
	g.Disaggregation = cfg.Disaggregation
	g.KVEvents = cfg.KVEvents
	g.Pricing = cfg.Pricing
	g.AdminAuth = cfg.Admin.Auth
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
	sims    []fleet.EngineConfig // appended to every engine list
	kv      *routing.KVIndex     // the precise prefix index: every policy built gets it

	mu      sync.Mutex
	started Config         // the configuration the process started with
	routing routing.Config // the routing section of the policy in force
	policy  routing.Policy
	auth    AuthConfig // the auth section in force (startReloads sets it)
	// shadowed is the file's keys that the environment or the flags
	// override, in the configuration in force.
	shadowed shadowed
}

// reload loads the configuration again and applies it, logging and
// counting the result. trigger says what asked for it ("SIGHUP", "file",
// "admin").
// It returns what it loaded the configuration from, applied or rejected:
// the content the watch compares the files with next.
func (r *reloader) reload(trigger string) (loaded loadedFrom) {
	_, loaded, _ = r.reloadResult(trigger)
	return loaded
}

// adminReload is reload for POST /admin/reload (gateway.ReloadFunc): the
// result's name, or why the configuration was rejected.
func (r *reloader) adminReload(trigger string) (string, error) {
	res, _, err := r.reloadResult(trigger)
	return res.String(), err
}

// reloadResult is reload returning the result and the rejection too.
func (r *reloader) reloadResult(trigger string) (telemetry.ReloadResult, loadedFrom, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The keys file is read and applied under the keys API's lock, so a
	// key it writes meanwhile is never undone by keys read before.
	unlock := r.gw.LockKeysFile()
	res, loaded, err := r.apply(trigger)
	unlock()
	if err != nil {
		// One line, however many problems the config has.
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		r.log.Error("config reload rejected; the running config is kept", "trigger", trigger, "error", msg)
	}
	r.metrics.RecordReload(context.Background(), res)
	return res, loaded, err
}

// apply is reload's work: the result, what was loaded, and why the config
// was rejected.
func (r *reloader) apply(trigger string) (telemetry.ReloadResult, loadedFrom, error) {
	cfg, loaded, shadow, err := loadConfigSum(r.args, r.environ)
	if err != nil {
		r.gw.NoteRejectedReload(err) // the console's reload history (Reload notes its own)
		return telemetry.ReloadRejected, loaded, err
	}
	policy := r.policy
	if !reflect.DeepEqual(cfg.Routing, r.routing) {
		// A new policy starts with empty state (its round-robin position,
		// session ring, prefix index), so it is built only when its
		// section changed.
		if policy, err = routing.NewPolicy(cfg.Routing, routing.WithKVIndex(r.kv, r.started.KVEvents.BlockSize)); err != nil {
			r.gw.NoteRejectedReload(err)
			return telemetry.ReloadRejected, loaded, err
		}
	}
	rep, err := r.gw.Reload(gatewayConfig(cfg, r.sims), policy)
	if err != nil {
		return telemetry.ReloadRejected, loaded, err
	}
	r.gw.SetConsoleConfig(cfg) // the console shows the whole file, redacted
	r.policy, r.routing = policy, cfg.Routing
	prevAuth := r.auth
	r.auth = cfg.Auth
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
	// Which keys, by name (never a hash): of both sources together.
	added, removed, changed := keyChanges(prevAuth.Keys, cfg.Auth.Keys)
	add("keys_added", added)
	add("keys_removed", removed)
	add("keys_changed", changed)
	if cfg.Auth.KeysFile != prevAuth.KeysFile {
		attrs = append(attrs, "keys_file", cfg.Auth.KeysFile)
	}
	r.log.Info("config reloaded", attrs...)
	for _, key := range shadowChanges(r.shadowed, shadow) {
		by := shadow[key].by
		if by == "" { // the file no longer sets it
			by = r.shadowed[key].by
		}
		r.logShadowed(key, by)
	}
	r.shadowed = shadow
	if len(restart) > 0 {
		r.log.Warn("config changes that need a restart to apply; the running values stay in force", "keys", strings.Join(restart, ", "))
	}
	return res, loaded, nil
}

// shadowChanges returns, sorted, the keys of the config file whose value
// differs between running and next (set, changed or removed) and that an
// environment variable or a flag sets, so the change is not applied.
func shadowChanges(running, next shadowed) []string {
	var keys []string
	for key, n := range next {
		if r, ok := running[key]; !ok || !reflect.DeepEqual(r.file, n.file) {
			keys = append(keys, key)
		}
	}
	for key := range running {
		if _, ok := next[key]; !ok {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	return keys
}

// logShadowed says that the config file's change of key is not applied:
// by, the SWITCHBOARD_ variable or the flag (--policy) that sets it too,
// wins. The values are not logged: they may be secrets.
func (r *reloader) logShadowed(key, by string) {
	if strings.HasPrefix(by, "--") {
		r.log.Warn("config file change not applied: the flag wins over the file", "key", key, "flag", by)
		return
	}
	r.log.Warn("config file change not applied: the environment variable wins over the file", "key", key, "env", by)
}

// restartKeys returns the keys outside the gateway section whose values
// differ between the running configuration and next and that only a
// restart applies: the listeners and their timeouts, admin, telemetry,
// log level and format, simulate, reload. The engines, models, auth,
// routing, migration and disaggregation sections apply at once, and the gateway section's own keys (and
// auth's) are reported by gateway.Server.Reload.
func restartKeys(running, next Config) []string {
	var keys []string
	// The gateway section (squashed into server) is Reload's to report;
	// engines, models, auth (auth.keys_file too: the watch follows it) and
	// routing apply at once.
	cfgdiff.Diff("", reflect.ValueOf(running), reflect.ValueOf(next), func(key, opts string) bool {
		return opts == "squash" || key == "engines" || key == "models" || key == "auth" || key == "routing" || key == "log.access" ||
			key == "limits.default_max_tokens" || key == "limits.fail_mode" || // applied at once; limits.redis needs a restart
			key == "migration" || key == "disaggregation" || key == "pricing" || // the settings snapshot: applied at once
			key == "admin.auth" // its tokens are read again, its switches in the snapshot
	}, &keys)
	return keys
}

// keyChanges returns the names of the keys of next that running lacks,
// those of running that next lacks, and those in both whose hash, models
// or limits differ; names are unique in a valid list.
func keyChanges(running, next []gateway.KeyConfig) (added, removed, changed []string) {
	old := make(map[string]gateway.KeyConfig, len(running))
	for _, k := range running {
		old[k.Name] = k
	}
	seen := make(map[string]bool, len(next))
	for _, k := range next {
		seen[k.Name] = true
		switch o, ok := old[k.Name]; {
		case !ok:
			added = append(added, k.Name)
		case !reflect.DeepEqual(o, k):
			changed = append(changed, k.Name)
		}
	}
	for _, k := range running {
		if !seen[k.Name] {
			removed = append(removed, k.Name)
		}
	}
	return added, removed, changed
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
// there) and, when watch is set, when the config file at path ("" = none)
// or the keys file (auth.keys_file) changes (debounced by debounce), until
// ctx ends (the shutdown starts) or stop is called. loaded is what the
// running configuration was loaded from: a file that differs from it once
// the watch is set up (edited while the gateway started) is reloaded after
// debounce. stop waits for a reload in progress. A watch that cannot be
// set up is logged; SIGHUP still works.
func (r *reloader) startReloads(ctx context.Context, hup <-chan os.Signal, path string, loaded loadedFrom, watch bool, debounce time.Duration) (stop func()) {
	r.mu.Lock()
	r.auth = r.started.Auth
	r.mu.Unlock()
	var w *fsnotify.Watcher
	if watch && (path != "" || slices.ContainsFunc(loaded.files(), func(f string) bool { return f != "" })) {
		var attrs []any
		if path != "" {
			attrs = append(attrs, "path", path)
		}
		if loaded.keysFile != "" {
			attrs = append(attrs, "keys_file", loaded.keysFile)
		}
		if loaded.tokensFile != "" {
			attrs = append(attrs, "admin_tokens_file", loaded.tokensFile)
		}
		if loaded.readTokensFile != "" {
			attrs = append(attrs, "admin_read_tokens_file", loaded.readTokensFile)
		}
		var err error
		if w, err = newFileWatch(append([]string{path}, loaded.files()...)...); err != nil {
			r.log.Warn("config files not watched; reload with SIGHUP", append(attrs, "error", err)...)
			w = nil
		} else {
			r.log.Info("watching the config files for changes", append(attrs, "debounce", debounce)...)
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

// newFileWatch watches the directory of each path ("" skipped), and that
// of the file it resolves to when it is a symlink elsewhere: a file
// replaced by a rename, or a ConfigMap's ..data symlink swapped, is seen
// only there.
func newFileWatch(paths ...string) (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	for _, path := range paths {
		if path == "" {
			continue
		}
		if dir := filepath.Dir(path); !slices.Contains(w.WatchList(), dir) {
			if err := w.Add(dir); err != nil {
				_ = w.Close()
				return nil, err
			}
		}
		addRealDir(w, path)
	}
	return w, nil
}

// watchDirs adds to w the directories of each path ("" skipped) and of
// the file it resolves to that are not watched yet (errors ignored: a
// directory may be missing for now), and reports whether it added one.
func watchDirs(w *fsnotify.Watcher, paths ...string) bool {
	added := false
	for _, path := range paths {
		if path == "" {
			continue
		}
		added = watchDir(w, filepath.Dir(path)) || added
		added = addRealDir(w, path) || added
	}
	return added
}

// watchDir adds dir to w if it is not watched yet, and reports whether it
// added it.
func watchDir(w *fsnotify.Watcher, dir string) bool {
	return !slices.Contains(w.WatchList(), dir) && w.Add(dir) == nil
}

// addRealDir adds the directory of the file path resolves to, if it is
// not watched yet (errors ignored: the file may be gone for a moment), and
// reports whether it added it.
func addRealDir(w *fsnotify.Watcher, path string) bool {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	return watchDir(w, filepath.Dir(real))
}

// concerns reports whether a watch event on name may have changed the
// file at path ("" = none: false): it is the file itself (written, or
// renamed into place), the file path resolves to, or one of the
// ..-prefixed entries of Kubernetes' atomic writer (the ..data symlink,
// the ..<timestamp> directories) that a ConfigMap or Secret update swaps.
func concerns(name, path string) bool {
	if path == "" {
		return false
	}
	name = filepath.Clean(name)
	if name == filepath.Clean(path) || strings.HasPrefix(filepath.Base(name), "..") {
		return true
	}
	real, err := filepath.EvalSymlinks(path)
	return err == nil && name == filepath.Clean(real)
}

// filesNow is what a load would read now: the config file at path (""
// = none) and the other files names has (the keys file, the admin token
// files; "" = none), as loadedFrom.
func filesNow(path string, names loadedFrom) loadedFrom {
	now := loadedFrom{keysFile: names.keysFile, tokensFile: names.tokensFile, readTokensFile: names.readTokensFile}
	if path != "" {
		now.config = fileSum(path)
	}
	if now.keysFile != "" {
		now.keys = fileSum(now.keysFile)
	}
	if now.tokensFile != "" {
		now.tokens = fileSum(now.tokensFile)
	}
	if now.readTokensFile != "" {
		now.readTokens = fileSum(now.readTokensFile)
	}
	return now
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
// calling reload with "SIGHUP" or "file"; reload returns what it loaded
// the configuration from, and last is what the running configuration was
// loaded from. The files watched are the config file at path and the keys
// file last names, so a reload that names another keys file moves the
// watch there (the new directory is added, then looked at once: a change
// made before it was watched has no event). An event that concerns either
// file (concerns: its name, what it resolves to, or a ConfigMap's ..data
// swap) (re)starts the debounce timer; other files in the directories are
// ignored, so a log written next to the config cannot keep putting a
// reload off. When the timer fires the files are read again and reloaded
// only if the content of either changed, so chmods and rewrites of the
// same bytes do not count. With a watch the timer also runs once at the
// start: a change made before the watch was set up has no event.
func watchLoop(ctx context.Context, w *fsnotify.Watcher, path string, last loadedFrom, debounce time.Duration, hup <-chan os.Signal, log *slog.Logger, reload func(trigger string) loadedFrom) {
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
	// follow watches the directories of the files last names; one added
	// is looked at after debounce.
	follow := func() {
		if w != nil && watchDirs(w, append([]string{path}, last.files()...)...) {
			timer.Reset(debounce)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			last = reload("SIGHUP")
			follow()
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if concerns(ev.Name, path) || slices.ContainsFunc(last.files(), func(f string) bool { return concerns(ev.Name, f) }) {
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
			timer.Reset(debounce) // events were lost: look at the files
		case <-timer.C:
			follow()
			if filesNow(path, last) != last {
				last = reload("file")
				follow()
			}
		}
	}
}
