package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/gateway/k8s"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// envPrefix starts every environment override. A double underscore
// separates levels: SWITCHBOARD_SERVER__LISTEN sets server.listen,
// SWITCHBOARD_ROUTING__POLICY sets routing.policy.
const envPrefix = "SWITCHBOARD_"

// Config is the whole gateway configuration; configs/gateway.yaml documents
// every key. Precedence: defaults < YAML file (--config) < SWITCHBOARD_*
// environment < flags.
type Config struct {
	Server         ServerConfig                 `koanf:"server"`
	Admin          AdminConfig                  `koanf:"admin"`
	Engines        []fleet.EngineConfig         `koanf:"engines"`
	Models         gateway.ModelsConfig         `koanf:"models"`
	Auth           AuthConfig                   `koanf:"auth"`
	Limits         gateway.LimitsConfig         `koanf:"limits"`
	Migration      gateway.MigrationConfig      `koanf:"migration"`
	Disaggregation gateway.DisaggregationConfig `koanf:"disaggregation"`
	KVEvents       gateway.KVEventsConfig       `koanf:"kv_events"`
	Pricing        []gateway.PriceConfig        `koanf:"pricing"`
	Routing        routing.Config               `koanf:"routing"`
	Telemetry      telemetry.Config             `koanf:"telemetry"`
	Log            LogConfig                    `koanf:"log"`
	Simulate       SimulateConfig               `koanf:"simulate"`
	Reload         ReloadConfig                 `koanf:"reload"`
	Discovery      DiscoveryConfig              `koanf:"discovery"`
}

// DiscoveryConfig holds the engine discovery sources besides the static
// engines list (combined with it).
type DiscoveryConfig struct {
	// Kubernetes discovers engines from EndpointSlices.
	Kubernetes k8s.Config `koanf:"kubernetes"`
}

// ServerConfig is the public listener plus the gateway's request handling.
type ServerConfig struct {
	// Listen is the public address, host:port.
	Listen string `koanf:"listen"`
	// ShutdownTimeout bounds the drain of in-flight requests (streams
	// included) on SIGINT/SIGTERM.
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout"`
	// DrainDelay is how long, after SIGINT/SIGTERM, the gateway keeps
	// accepting requests while /ready answers 503, so a load balancer
	// polling readiness stops sending traffic before the listener closes
	// (a Kubernetes rollout wants a few seconds). Default 0.
	DrainDelay time.Duration `koanf:"drain_delay"`
	// ReadHeaderTimeout bounds reading a client's request headers.
	ReadHeaderTimeout time.Duration `koanf:"read_header_timeout"`
	// IdleTimeout closes a keep-alive client connection that has been idle
	// this long between requests. Default 120 s (longer than the 60 s idle
	// timeout of common load balancers, so they close first); 0 means idle
	// connections are never closed.
	IdleTimeout    time.Duration `koanf:"idle_timeout"`
	gateway.Config `koanf:",squash"`
}

// AdminConfig is the private admin listener (/metrics, /admin/engines,
// /debug/pprof).
type AdminConfig struct {
	Listen string `koanf:"listen"` // "" disables the admin listener
	// Auth is the admin listener's tokens: write actions need one, reads
	// when auth.reads is "token" (gateway.AdminAuthConfig).
	Auth gateway.AdminAuthConfig `koanf:"auth"`
}

// LogConfig selects the log level and format, and the access log.
type LogConfig struct {
	Level  string `koanf:"level"`  // debug, info, warn, error
	Format string `koanf:"format"` // text or json
	Access bool   `koanf:"access"` // one line per request at info level; default true
	// BufferBytes batches log lines in memory, written out when full, every
	// FlushInterval, at once after a warning or an error, and on exit
	// (internal/logbuf); 0 writes each line at once. Default 64 KiB.
	BufferBytes   int           `koanf:"buffer_bytes"`
	FlushInterval time.Duration `koanf:"flush_interval"` // default 100ms
}

// SimulateConfig starts in-process simulated engines (demo and tests); they
// are added to the engine list with their models discovered over HTTP.
type SimulateConfig struct {
	Engines      int           `koanf:"engines"`       // how many; 0 = none
	Models       []string      `koanf:"models"`        // served by every simulated engine
	TTFT         time.Duration `koanf:"ttft"`          // base time to first token
	ITL          time.Duration `koanf:"itl"`           // inter-token latency
	OutputTokens int           `koanf:"output_tokens"` // tokens when max_tokens is absent
	MaxNumSeqs   int           `koanf:"max_num_seqs"`  // concurrent sequences per engine
	// PrefillEngines makes the first PrefillEngines simulated engines
	// prefill engines (role prefill) and the others decode engines (role
	// decode), for trying prefill/decode disaggregation (the
	// disaggregation section); 0 (the default): every engine does both.
	PrefillEngines int `koanf:"prefill_engines"`
	// KVEvents makes the simulated engines publish vLLM's KV-cache events
	// (ZMQ PUB on a free loopback port, with a replay socket) and
	// configures their kv_events endpoints, for trying routing.policy
	// precise-prefix (docs/kv-events.md). Default false.
	KVEvents bool `koanf:"kv_events"`
}

// maxLogBuffer caps log.buffer_bytes (the buffer is allocated whole at
// start): 16 MiB is minutes of access log at thousands of requests a
// second, far past any flush interval.
const maxLogBuffer = 16 << 20

func defaults() Config {
	return Config{
		Server: ServerConfig{
			Listen:            "127.0.0.1:8080",
			ShutdownTimeout:   30 * time.Second,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       120 * time.Second,
			Config:            gateway.DefaultConfig(),
		},
		Admin:          AdminConfig{Listen: "127.0.0.1:9464", Auth: gateway.AdminAuthConfig{Reads: gateway.AdminReadsOpen}},
		Models:         gateway.ModelsConfig{Aliases: map[string]string{}, Fallbacks: map[string][]string{}, ContextFallbacks: map[string][]string{}},
		Limits:         gateway.DefaultLimitsConfig(),
		Migration:      gateway.DefaultMigrationConfig(),
		Disaggregation: gateway.DefaultDisaggregationConfig(),
		KVEvents:       gateway.DefaultKVEventsConfig(),
		Routing:        routing.DefaultConfig(),
		Telemetry:      telemetry.DefaultConfig(),
		Log:            LogConfig{Level: "info", Format: "text", Access: true, BufferBytes: 64 << 10, FlushInterval: 100 * time.Millisecond},
		Simulate:       SimulateConfig{TTFT: 150 * time.Millisecond, ITL: 40 * time.Millisecond, OutputTokens: 24, MaxNumSeqs: 64},
		Reload:         ReloadConfig{Watch: true, Debounce: 200 * time.Millisecond},
		Discovery:      DiscoveryConfig{Kubernetes: k8s.DefaultConfig()},
	}
}

// Validate reports every problem outside the gateway section (which
// gateway.New validates once the simulated engines are added).
func (c Config) Validate() error {
	var errs []error
	if c.Server.Listen == "" {
		errs = append(errs, errors.New("server.listen must not be empty"))
	}
	if c.Server.DrainDelay < 0 {
		errs = append(errs, fmt.Errorf("server.drain_delay must be >= 0, got %s", c.Server.DrainDelay))
	}
	if c.Server.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("server.idle_timeout must be >= 0, got %s", c.Server.IdleTimeout))
	}
	if c.Server.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("server.shutdown_timeout must be > 0, got %s", c.Server.ShutdownTimeout))
	}
	if c.Reload.Debounce < 0 {
		errs = append(errs, fmt.Errorf("reload.debounce must be >= 0, got %s", c.Reload.Debounce))
	}
	if c.Simulate.Engines < 0 {
		errs = append(errs, fmt.Errorf("simulate.engines must be >= 0, got %d", c.Simulate.Engines))
	}
	if c.Simulate.PrefillEngines < 0 || (c.Simulate.PrefillEngines > 0 && c.Simulate.PrefillEngines >= c.Simulate.Engines) {
		errs = append(errs, fmt.Errorf("simulate.prefill_engines must be 0, or at least 1 and fewer than simulate.engines (%d), got %d", c.Simulate.Engines, c.Simulate.PrefillEngines))
	}
	if c.Simulate.Engines > 0 && len(c.Simulate.Models) == 0 {
		errs = append(errs, errors.New("simulate.models must name at least one model"))
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		errs = append(errs, err)
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format must be text or json, got %q", c.Log.Format))
	}
	if c.Log.BufferBytes < 0 || c.Log.BufferBytes > maxLogBuffer {
		errs = append(errs, fmt.Errorf("log.buffer_bytes must be between 0 and %d, got %d", maxLogBuffer, c.Log.BufferBytes))
	}
	if c.Log.BufferBytes > 0 && c.Log.FlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("log.flush_interval must be > 0 when log.buffer_bytes is set, got %s", c.Log.FlushInterval))
	}
	if len(c.Engines) == 0 && c.Simulate.Engines == 0 && !c.Discovery.Kubernetes.Enabled {
		errs = append(errs, errors.New("no engines: configure `engines`, `discovery.kubernetes` or `simulate.engines`"))
	}
	errs = append(errs, c.Discovery.Kubernetes.Validate())
	// The gateway's own settings and the configured engines are checked now,
	// before simulated engines start, so every problem is reported at once;
	// gateway.New checks the whole again with the simulated engines added.
	errs = append(errs, c.Routing.Validate(), c.Telemetry.Validate(), c.Server.Config.ValidateSettings(), c.Models.Validate(), c.Auth.Validate(), c.Limits.Validate())
	for i, e := range c.Engines {
		if err := e.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("engines[%d]: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log.level must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// flags maps each command-line flag to its config key.
var flagKeys = map[string]string{
	"listen":       "server.listen",
	"admin-listen": "admin.listen",
	"policy":       "routing.policy",
	"log-level":    "log.level",
}

func newFlagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("switchboard", pflag.ContinueOnError)
	fs.String("config", "", "YAML config file (see configs/gateway.yaml)")
	fs.String("listen", "", "public listen address (server.listen)")
	fs.String("admin-listen", "", "admin listen address (admin.listen); /metrics lives here")
	fs.String("policy", "", "routing policy: "+strings.Join(routing.Names(), ", "))
	fs.String("log-level", "", "log level: debug, info, warn, error")
	fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() { _, _ = io.WriteString(fs.Output(), usage(fs)) }
	return fs
}

// usage is the --help text: the command lines, the keys subcommand
// included, then the flags of fs.
func usage(fs *pflag.FlagSet) string {
	return `Usage:
  switchboard [flags]                   run the gateway
  switchboard keys hash < key.txt       print the sha256 of an API key read from stdin (for auth.keys)
  switchboard keys hash --generate      make a new API key; print it and its sha256

Flags:
` + fs.FlagUsages() + `
Every config key can also be set by an environment variable: ` + envPrefix + `ROUTING__POLICY
sets routing.policy. Precedence: defaults < --config file < environment < flags.
`
}

// flagError is err, a parse error of fs, with a hint when it is an unknown
// flag: the flag of a config key given as one (--routing.policy is
// --policy), else the nearest flag, with two dashes also when it was
// written with one:
//
//	unknown flag: --lisen (did you mean --listen?)
//	unknown shorthand flag: 'v' in -version (did you mean --version?)
func flagError(fs *pflag.FlagSet, err error) error {
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) {
		return err
	}
	name := ne.GetSpecifiedName()
	if short := ne.GetSpecifiedShortnames(); short != "" {
		name, _, _ = strings.Cut(short, "=")
	}
	for flag, key := range flagKeys {
		if key == name {
			return fmt.Errorf("%w (did you mean --%s?)", err, flag)
		}
	}
	names := []string{"help"}
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	slices.Sort(names)
	if best := nearest(name, names); best != "" {
		return fmt.Errorf("%w (did you mean --%s?)", err, best)
	}
	return err
}

// argsError reports the arguments left after the flags: the gateway takes
// none, and a misspelled subcommand ("key hash") must not start it.
func argsError(args []string) error {
	hint := ""
	if nearest(args[0], []string{"keys"}) != "" {
		hint = " (did you mean the keys subcommand: switchboard keys hash?)"
	}
	return fmt.Errorf("unexpected argument %q: the gateway takes flags only, see --help%s", args[0], hint)
}

// loadConfig layers defaults, the YAML file, the environment and the flags.
// It returns pflag.ErrHelp for --help and errVersion for --version.
//
// The file and the environment are first checked on their own (see
// configkeys.go), so every unknown key and bad value is reported at once,
// named as the operator wrote it: "config file my.yaml: server.listn: ..."
// or "environment SWITCHBOARD_SERVER__LISTN: ...".
func loadConfig(args []string, environ func() []string) (Config, error) {
	cfg, _, _, err := loadConfigSum(args, environ)
	return cfg, err
}

// summed is a koanf provider that keeps the contentSum of the bytes it
// read.
type summed struct {
	koanf.Provider
	sum [32]byte
}

func (s *summed) ReadBytes() ([]byte, error) {
	b, err := s.Provider.ReadBytes()
	s.sum = contentSum(b, err)
	return b, err
}

// loadedFrom identifies the file content a configuration was loaded
// from, valid or not: what the file watch compares the files with, so an
// edit made after this read is a change even when it comes before the
// watch is set up. The zero value is no file at all.
type loadedFrom struct {
	// config is the contentSum of the --config file's bytes (or of their
	// read error); zero without --config.
	config [32]byte
	// keysFile is auth.keys_file as loaded, "" when none or when the load
	// failed before it was known (the keys file is then not looked at
	// until the config loads again).
	keysFile string
	// keys is the contentSum of the keys file's bytes (or of their read
	// error); zero without one.
	keys [32]byte
	// tokensFile and readTokensFile are admin.auth.tokens_file and
	// read_tokens_file as loaded ("" when none), tokens and readTokens the
	// contentSum of their bytes: a rotated Secret reloads the tokens.
	tokensFile, readTokensFile string
	tokens, readTokens         [32]byte
}

// files are the files of from other than the config file: the keys file
// and the admin token files, "" for those not set.
func (from loadedFrom) files() []string {
	return []string{from.keysFile, from.tokensFile, from.readTokensFile}
}

// shadowed maps each key that the config file sets and an environment
// variable or a flag sets too, and so wins, to the file's value and that
// variable or flag. A reload compares it with the running one's, to say
// which changes of the file are not applied.
type shadowed map[string]shadowedKey

// shadowedKey is the file's value of a key in shadowed, and what wins
// over it.
type shadowedKey struct {
	file any    // as the YAML parser gave it
	by   string // SWITCHBOARD_ROUTING__POLICY, or --policy
}

// loadConfigSum is loadConfig that also returns what it loaded the
// configuration from (loadedFrom), whether or not it is valid, and the
// file's keys that the environment or the flags override (shadowed; nil
// on error).
func loadConfigSum(args []string, environ func() []string) (Config, loadedFrom, shadowed, error) {
	var from loadedFrom
	fs := newFlagSet()
	if err := fs.Parse(args); err != nil {
		return Config{}, from, nil, flagError(fs, err)
	}
	if v, _ := fs.GetBool("version"); v {
		return Config{}, from, nil, errVersion
	}
	if fs.NArg() > 0 {
		return Config{}, from, nil, argsError(fs.Args())
	}
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(map[string]any{}, "."), nil); err != nil {
		return Config{}, from, nil, err
	}
	var problems []error
	shadow := shadowed{}
	if path, _ := fs.GetString("config"); path != "" {
		fk := koanf.New(".")
		src := &summed{Provider: file.Provider(path)}
		err := fk.Load(src, yaml.Parser())
		from.config = src.sum
		if err != nil {
			return Config{}, from, nil, fmt.Errorf("config file %s: %w", path, err)
		}
		problems = append(problems, fileErrors(path, fk.Raw())...)
		if err := k.Merge(fk); err != nil {
			return Config{}, from, nil, fmt.Errorf("config file %s: %w", path, err)
		}
		over := overrides(fs, environ)
		for key, v := range fk.All() {
			if by, ok := over[key]; ok {
				shadow[key] = shadowedKey{file: v, by: by}
			}
		}
	}
	problems = append(problems, envErrors(environ())...)
	if len(problems) > 0 {
		return Config{}, from, nil, errors.Join(problems...)
	}
	if err := k.Load(env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: environ,
		TransformFunc: func(key, v string) (string, any) {
			return envKey(key), v
		},
	}), nil); err != nil {
		return Config{}, from, nil, fmt.Errorf("environment: %w", err)
	}
	if err := k.Load(posflag.ProviderWithFlag(fs, ".", nil, func(f *pflag.Flag) (string, any) {
		key, ok := flagKeys[f.Name]
		if !ok || !f.Changed {
			return "", nil
		}
		return key, posflag.FlagVal(fs, f)
	}), nil); err != nil {
		return Config{}, from, nil, fmt.Errorf("flags: %w", err)
	}
	// Defaults hold no slices: decoding into a non-empty slice would merge
	// element by element instead of replacing it.
	cfg := defaults()
	// Unknown keys are errors, not silently ignored: a misspelled YAML key
	// or SWITCHBOARD_* variable must not leave a default in place. The
	// checks above have reported them already; ErrorUnused is a backstop.
	dc := decoderConfig()
	dc.ErrorUnused = true
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: dc}); err != nil {
		return Config{}, from, nil, fmt.Errorf("config: %w", err)
	}
	// The admin tokens are read by the gateway (and again on each reload);
	// their files are summed here for the watch.
	if from.tokensFile = cfg.Admin.Auth.TokensFile; from.tokensFile != "" {
		from.tokens = fileSum(from.tokensFile)
	}
	if from.readTokensFile = cfg.Admin.Auth.ReadTokensFile; from.readTokensFile != "" {
		from.readTokens = fileSum(from.readTokensFile)
	}
	if path := cfg.Auth.KeysFile; path != "" {
		keys, ksum, err := loadKeysFile(path)
		from.keysFile, from.keys = path, ksum
		if err != nil {
			return Config{}, from, nil, err
		}
		cfg.Auth.Keys = append(cfg.Auth.Keys, keys...)
		cfg.Auth.fromFile = len(keys)
	}
	if cfg.Simulate.Engines > 0 && len(cfg.Simulate.Models) == 0 {
		cfg.Simulate.Models = []string{"demo-model"}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, from, nil, withSources(err, k, fs, environ)
	}
	return cfg, from, shadow, nil
}

// overrides maps each key that a SWITCHBOARD_ variable or a flag sets to
// the one that wins (a flag over a variable): "routing.policy" to
// "--policy" or "SWITCHBOARD_ROUTING__POLICY".
func overrides(fs *pflag.FlagSet, environ func() []string) map[string]string {
	by := map[string]string{}
	for _, kv := range environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, envPrefix) {
			if key := envKey(name); key != "" {
				by[key] = name
			}
		}
	}
	fs.Visit(func(f *pflag.Flag) {
		if key, ok := flagKeys[f.Name]; ok {
			by[key] = "--" + f.Name
		}
	})
	return by
}

// withSources adds to each line of a validation error that names a key
// where the operator set it: the SWITCHBOARD_ variable, the flag or the
// config file, e.g. "server.timeouts.idle must be >= 0, got -1s (set by
// SWITCHBOARD_SERVER__TIMEOUTS__IDLE)". The last source wins, as in the
// layering: flags, then the environment, then the file.
func withSources(err error, k *koanf.Koanf, fs *pflag.FlagSet, environ func() []string) error {
	from := map[string]string{}
	if path, _ := fs.GetString("config"); path != "" {
		for _, key := range k.Keys() {
			from[key] = "in config file " + path
		}
	}
	for key, by := range overrides(fs, environ) {
		from[key] = "set by " + by
	}
	return annotate(err, func(msg string) string {
		src, best := "", 0
		for key, where := range from {
			// The longest key named: server.timeouts.idle, not
			// server.timeouts.
			if len(key) > best && strings.Contains(msg, key) {
				src, best = where, len(key)
			}
		}
		return src
	})
}

// annotate appends " (source)" to each error of the errors.Join tree err
// for which source returns one, keeping every error's chain (errors.Is
// still finds the sentinels).
func annotate(err error, source func(msg string) string) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, annotate(e, source))
		}
		return errors.Join(out...)
	}
	if src := source(err.Error()); src != "" {
		return fmt.Errorf("%w (%s)", err, src)
	}
	return err
}
