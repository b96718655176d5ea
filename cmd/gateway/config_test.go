package main

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
)

// fullYAML sets a value different from the default for every layered key
// the precedence cases look at, plus an engine list.
const fullYAML = `
server:
  listen: "10.0.0.1:1000"
  shutdown_timeout: 45s
  max_body_bytes: 1024
  engine_header: false
  timeouts:
    idle: 90s
    request: 3m
  health:
    unhealthy_after: 4
admin:
  listen: "10.0.0.1:2000"
engines:
  - name: gpu-a
    url: http://10.0.0.5:8000
    models: [meta-llama/Llama-3.1-8B-Instruct, qwen]
  - name: gpu-b
    url: https://10.0.0.6:8443
    api_key: engine-secret
routing:
  policy: least-loaded
  prefill_weight: 3
telemetry:
  service_name: sb-test
log:
  level: debug
  format: json
`

// withFullYAML returns defaults() changed the way fullYAML changes them.
func withFullYAML() Config {
	c := defaults()
	c.Server.Listen = "10.0.0.1:1000"
	c.Server.ShutdownTimeout = 45 * time.Second
	c.Server.MaxBodyBytes = 1024
	c.Server.EngineHeader = false
	c.Server.Timeouts.Idle = 90 * time.Second
	c.Server.Timeouts.Request = 3 * time.Minute
	c.Server.Health.UnhealthyAfter = 4
	c.Admin.Listen = "10.0.0.1:2000"
	c.Engines = []fleet.EngineConfig{
		{Name: "gpu-a", URL: "http://10.0.0.5:8000", Models: []string{"meta-llama/Llama-3.1-8B-Instruct", "qwen"}},
		{Name: "gpu-b", URL: "https://10.0.0.6:8443", APIKey: "engine-secret"},
	}
	c.Routing.Policy, c.Routing.PrefillWeight = routing.LeastLoadedName, 3
	c.Telemetry.ServiceName = "sb-test"
	c.Log.Level, c.Log.Format = "debug", "json"
	return c
}

// writeConfig writes body to a temporary YAML file and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "switchboard.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func environ(kv ...string) func() []string { return func() []string { return kv } }

func TestLoadConfigPrecedence(t *testing.T) {
	tests := []struct {
		name string
		yaml string // "" = no --config
		env  []string
		args []string
		want func() Config
	}{
		{
			name: "defaults",
			env:  []string{"SWITCHBOARD_SIMULATE__ENGINES=2"},
			want: func() Config {
				c := defaults()
				c.Simulate.Engines = 2
				c.Simulate.Models = []string{"demo-model"} // filled in when simulating
				return c
			},
		},
		{
			name: "yaml over defaults",
			yaml: fullYAML,
			want: withFullYAML,
		},
		{
			name: "env over yaml",
			yaml: fullYAML,
			env: []string{
				"SWITCHBOARD_SERVER__LISTEN=10.0.0.2:1001",
				"SWITCHBOARD_SERVER__TIMEOUTS__IDLE=2m",
				"SWITCHBOARD_SERVER__READ_HEADER_TIMEOUT=3s",
				"SWITCHBOARD_SERVER__MAX_BODY_BYTES=2048",
				"SWITCHBOARD_SERVER__ENGINE_HEADER=true",
				"SWITCHBOARD_ADMIN__LISTEN=10.0.0.2:2001",
				"SWITCHBOARD_ROUTING__POLICY=round-robin",
				"SWITCHBOARD_LOG__LEVEL=warn",
				// Ignored: no prefix, wrong case, a prefix lookalike.
				"SERVER__LISTEN=nope:1",
				"switchboard_log__level=error",
				"SWITCHBOARDX_LOG__LEVEL=error",
			},
			want: func() Config {
				c := withFullYAML()
				c.Server.Listen = "10.0.0.2:1001"
				c.Server.Timeouts.Idle = 2 * time.Minute
				c.Server.ReadHeaderTimeout = 3 * time.Second
				c.Server.MaxBodyBytes = 2048
				c.Server.EngineHeader = true
				c.Admin.Listen = "10.0.0.2:2001"
				c.Routing.Policy = routing.RoundRobinName
				c.Log.Level = "warn"
				return c
			},
		},
		{
			name: "flags over env",
			yaml: fullYAML,
			env: []string{
				"SWITCHBOARD_SERVER__LISTEN=10.0.0.2:1001",
				"SWITCHBOARD_ADMIN__LISTEN=10.0.0.2:2001",
				"SWITCHBOARD_ROUTING__POLICY=round-robin",
				"SWITCHBOARD_LOG__LEVEL=warn",
				"SWITCHBOARD_SERVER__TIMEOUTS__IDLE=2m",
			},
			args: []string{"--listen", "10.0.0.3:1002", "--admin-listen=10.0.0.3:2002", "--policy", "least-loaded", "--log-level", "error"},
			want: func() Config {
				c := withFullYAML()
				c.Server.Listen = "10.0.0.3:1002"
				c.Admin.Listen = "10.0.0.3:2002"
				c.Routing.Policy = routing.LeastLoadedName
				c.Log.Level = "error"
				c.Server.Timeouts.Idle = 2 * time.Minute // no flag for it: env stays
				return c
			},
		},
		{
			name: "flags over yaml",
			yaml: fullYAML,
			args: []string{"--policy=round-robin", "--listen", "127.0.0.1:0"},
			want: func() Config {
				c := withFullYAML()
				c.Routing.Policy = routing.RoundRobinName
				c.Server.Listen = "127.0.0.1:0"
				return c
			},
		},
		{
			name: "unset flags do not reset lower layers",
			yaml: fullYAML,
			env:  []string{"SWITCHBOARD_LOG__LEVEL=warn"},
			args: []string{"--listen", "10.0.0.3:1002"},
			want: func() Config {
				c := withFullYAML()
				c.Server.Listen = "10.0.0.3:1002"
				c.Log.Level = "warn"
				return c
			},
		},
		{
			name: "empty admin-listen flag disables the admin listener",
			yaml: fullYAML,
			env:  []string{"SWITCHBOARD_ADMIN__LISTEN=10.0.0.2:2001"},
			args: []string{"--admin-listen="},
			want: func() Config {
				c := withFullYAML()
				c.Admin.Listen = ""
				return c
			},
		},
		{
			name: "simulate from env with explicit models and durations",
			env: []string{
				"SWITCHBOARD_SIMULATE__ENGINES=3",
				"SWITCHBOARD_SIMULATE__MODELS=m1",
				"SWITCHBOARD_SIMULATE__TTFT=5ms",
				"SWITCHBOARD_SIMULATE__ITL=1500us",
				"SWITCHBOARD_SERVER__HEALTH__INTERVAL=250ms",
			},
			want: func() Config {
				c := defaults()
				c.Simulate.Engines = 3
				c.Simulate.Models = []string{"m1"}
				c.Simulate.TTFT = 5 * time.Millisecond
				c.Simulate.ITL = 1500 * time.Microsecond
				c.Server.Health.Interval = 250 * time.Millisecond
				return c
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.yaml != "" {
				args = append([]string{"--config", writeConfig(t, tc.yaml)}, args...)
			}
			got, err := loadConfig(args, environ(tc.env...))
			if err != nil {
				t.Fatalf("loadConfig: %v", err)
			}
			if want := tc.want(); !reflect.DeepEqual(got, want) {
				t.Errorf("config mismatch\n got: %+v\nwant: %+v", got, want)
			}
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		env  []string
		args []string
		// want are substrings that must all appear in the error, not
		// substrings that must not.
		want, not []string
		is        error
	}{
		{
			name: "problems reported together",
			env:  []string{"SWITCHBOARD_ROUTING__POLICY=fastest", "SWITCHBOARD_LOG__LEVEL=loud"},
			want: []string{`"fastest"`, "no engines", "log.level", "loud"},
			is:   routing.ErrUnknownPolicy,
		},
		{
			name: "flag value validated too",
			env:  []string{"SWITCHBOARD_SIMULATE__ENGINES=1"},
			args: []string{"--policy", "random", "--log-level", "verbose"},
			want: []string{`"random"`, "known: least-loaded, power-of-two, precise-prefix, prefix-aware, round-robin, scorer, session-affinity", "verbose"},
			is:   routing.ErrUnknownPolicy,
		},
		{
			name: "every section validated",
			yaml: "server:\n  shutdown_timeout: 0s\nlog:\n  format: xml\nsimulate:\n  engines: -1\ntelemetry:\n  service_name: \"\"\nrouting:\n  prefill_weight: 0\n",
			want: []string{"server.shutdown_timeout", "log.format", "simulate.engines must be >= 0", "telemetry.service_name", "routing.prefill_weight"},
		},
		{
			name: "engine role and discovery role label",
			yaml: "engines:\n  - name: p\n    url: http://10.0.0.1:8000\n    role: prefil\n    group: \" r1\"\ndiscovery:\n  kubernetes:\n    service: vllm\n    enabled: true\n    role_label: \"llm-d.ai/role/x\"\n",
			want: []string{`engine "p": role`, `"prefil"`, "prefill, decode, both or prefill-decode", `group " r1"`, "discovery.kubernetes.role_label"},
			is:   fleet.ErrInvalidConfig,
		},
		{
			name: "simulated prefill engines",
			yaml: "simulate:\n  engines: 2\n  prefill_engines: 2\n",
			want: []string{"simulate.prefill_engines must be 0, or at least 1 and fewer than simulate.engines (2), got 2"},
		},
		{
			name: "bad duration",
			yaml: "simulate:\n  engines: 1\n  ttft: soon\n",
			want: []string{"config file", "simulate.ttft", `"soon" is not a duration`},
		},
		{
			name: "bad duration from env",
			env:  []string{"SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_SERVER__TIMEOUTS__IDLE=forever"},
			want: []string{"SWITCHBOARD_SERVER__TIMEOUTS__IDLE", "server.timeouts.idle", `"forever" is not a duration`},
		},
		{
			name: "malformed yaml",
			yaml: "server: [unclosed\n",
			want: []string{"config file"},
		},
		{
			name: "missing file",
			args: []string{"--config", filepath.Join(os.TempDir(), "switchboard-does-not-exist.yaml")},
			want: []string{"config file", "switchboard-does-not-exist.yaml"},
		},
		{
			name: "misspelled yaml key",
			yaml: "simulate:\n  engines: 1\nroutng:\n  policy: least-loaded\n",
			want: []string{"config file", "routng: unknown key (did you mean routing?)"},
		},
		{
			name: "misspelled env variable",
			env:  []string{"SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_ROUTING_POLICY=least-loaded"},
			want: []string{"SWITCHBOARD_ROUTING_POLICY", "routing_policy", "did you mean SWITCHBOARD_ROUTING__POLICY?"},
		},
		{
			name: "unknown flag",
			args: []string{"--nope"},
			want: []string{"unknown flag", "--nope"},
			not:  []string{"did you mean"},
		},
		{
			name: "misspelled flag",
			args: []string{"--lisen", "127.0.0.1:0"},
			want: []string{"unknown flag: --lisen (did you mean --listen?)"},
		},
		{
			name: "misspelled flag with a value",
			args: []string{"--polcy=round-robin"},
			want: []string{"unknown flag: --polcy (did you mean --policy?)"},
		},
		{
			name: "long flag with one dash",
			args: []string{"-version"},
			want: []string{"-version (did you mean --version?)"},
		},
		{
			name: "config key as a flag",
			args: []string{"--routing.policy", "least-loaded"},
			want: []string{"unknown flag: --routing.policy (did you mean --policy?)"},
		},
		{
			name: "misspelled subcommand",
			args: []string{"key", "hash"},
			want: []string{`unexpected argument "key"`, "did you mean the keys subcommand: switchboard keys hash?"},
		},
		{
			name: "engine url without a scheme",
			yaml: "engines:\n  - {name: e1, url: \"127.0.0.1:8001\"}\n  - {name: e2, url: \"localhost:8002\"}\n  - {name: e3, url: engine-3}\n",
			want: []string{`engine "e1": url needs http:// or https:// before the host`,
				`engine "e2": url needs http:// or https:// before the host`,
				`engine "e3": url needs http:// or https:// before the host`, "engines[0]", "engines[1]", "engines[2]"},
			// The scheme-less URL is not repeated: it may hold a password.
			not: []string{"8001", "8002", "engine-3"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.yaml != "" {
				args = append([]string{"--config", writeConfig(t, tc.yaml)}, args...)
			}
			_, err := loadConfig(args, environ(tc.env...))
			if err == nil {
				t.Fatal("loadConfig: nil error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error %q mentions %q", err, w)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %q is not %v", err, tc.is)
			}
		})
	}
}

// TestShippedConfigs loads the YAML files in configs/ through the real
// loader and validates them the way run does.
func TestShippedConfigs(t *testing.T) {
	t.Run("demo.yaml", func(t *testing.T) {
		cfg, err := loadConfig([]string{"--config", "../../configs/demo.yaml"}, environ())
		if err != nil {
			t.Fatal(err)
		}
		want := defaults()
		want.Routing.Policy = routing.LeastLoadedName
		want.Simulate = SimulateConfig{Engines: 2, Models: []string{"demo-model"}, TTFT: 150 * time.Millisecond,
			ITL: 40 * time.Millisecond, OutputTokens: 24, MaxNumSeqs: 64}
		want.Admin.Auth.OpenWrites = true // loopback only
		if !reflect.DeepEqual(cfg, want) {
			t.Errorf("demo.yaml\n got: %+v\nwant: %+v", cfg, want)
		}
		if _, err := routing.NewPolicy(cfg.Routing); err != nil {
			t.Error(err)
		}
	})
	t.Run("gateway.yaml", func(t *testing.T) {
		cfg, err := loadConfig([]string{"--config", "../../configs/gateway.yaml"}, environ())
		if err != nil {
			t.Fatal(err)
		}
		// The reference file claims to show every key with its default:
		// apart from the example engine it must equal the built-in defaults.
		want := defaults()
		want.Engines = []fleet.EngineConfig{{Name: "e1", URL: "http://127.0.0.1:8001", Models: []string{"my-model"}, ModelMap: map[string]string{}}}
		want.Simulate.Models = []string{"demo-model"}
		// The example key (whose key nobody knows: auth on, fail closed).
		want.Auth.Keys = []gateway.KeyConfig{{Name: "team-a", SHA256: "6b06e61934c28cc6e80eee09615352bf253539a7727e044324fdbff75f7542b5", Models: []string{"*"}}}
		// The example price (an internal GPU-hour price for e1's model).
		zero := 0.0
		want.Pricing = []gateway.PriceConfig{{Model: "my-model", Engine: "e1", CachedInput: &zero,
			GPUHour: &gateway.GPUHourPrice{USD: 2.5, GPUs: 1, InputTokensPerSecond: 20000, OutputTokensPerSecond: 2500}}}
		// The file writes the empty lists as [] (the default is nil).
		want.Server.StripRequestHeaders, want.Server.TrustedProxies = []string{}, []string{}
		want.Admin.Auth.AllowedHosts = []string{}
		if !reflect.DeepEqual(cfg, want) {
			t.Errorf("gateway.yaml drifted from the defaults\n got: %+v\nwant: %+v", cfg, want)
		}
		gcfg := cfg.Server.Config
		gcfg.Engines = cfg.Engines
		if err := gcfg.Validate(); err != nil {
			t.Errorf("gateway section: %v", err)
		}
		if _, err := routing.NewPolicy(cfg.Routing); err != nil {
			t.Error(err)
		}
	})
}

// goNames are words of Go and of the decoder that must never reach an
// operator in a configuration error.
var goNames = []string{"int64", "int'", "time.Duration", "strconv", "mapstructure", "expected type", "[]string",
	"[]interface", "map[string]", "reflect", "main.", "gateway.", "unconvertible"}

// TestLoadConfigKeyErrors checks the exact messages for unknown keys and
// bad values, from the file and from the environment: the key named as
// written, a suggestion, no Go type names, every problem at once. FILE in
// want stands for the temporary config file's path.
func TestLoadConfigKeyErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string // "" = no --config
		env  []string
		want []string // the error's lines, in order
	}{
		// Unknown keys in the file, at every depth.
		{
			name: "top-level key",
			yaml: "routng:\n  policy: least-loaded\n",
			want: []string{"config file FILE: routng: unknown key (did you mean routing?)"},
		},
		{
			name: "second-level key",
			yaml: "server:\n  listn: 0.0.0.0:80\n",
			want: []string{"config file FILE: server.listn: unknown key (did you mean server.listen?)"},
		},
		{
			name: "third-level key, swapped letters",
			yaml: "server:\n  timeouts:\n    idel: 5s\n",
			want: []string{"config file FILE: server.timeouts.idel: unknown key (did you mean server.timeouts.idle?)"},
		},
		{
			name: "key of the squashed gateway section",
			yaml: "server:\n  max_body_byte: 10\n",
			want: []string{"config file FILE: server.max_body_byte: unknown key (did you mean server.max_body_bytes?)"},
		},
		{
			name: "two edits away",
			yaml: "serverr:\n  listen: x\nsimulate:\n  output_tokns: 3\n",
			want: []string{
				"config file FILE: serverr: unknown key (did you mean server?)",
				"config file FILE: simulate.output_tokns: unknown key (did you mean simulate.output_tokens?)",
			},
		},
		{
			name: "case mismatch",
			yaml: "Server:\n  listen: x\nlog:\n  LEVEL: debug\n",
			want: []string{
				"config file FILE: Server: unknown key (did you mean server?)",
				"config file FILE: log.LEVEL: unknown key (did you mean log.level?)",
			},
		},
		{
			name: "key of another section",
			yaml: "server:\n  policy: least-loaded\n",
			want: []string{"config file FILE: server.policy: unknown key (did you mean routing.policy?)"},
		},
		{
			name: "key of several other sections",
			yaml: "listen: 0.0.0.0:80\n",
			want: []string{"config file FILE: listen: unknown key (did you mean admin.listen or server.listen?)"},
		},
		{
			name: "levels joined by an underscore",
			yaml: "server:\n  timeouts_idle: 5s\n",
			want: []string{"config file FILE: server.timeouts_idle: unknown key (did you mean server.timeouts.idle?)"},
		},
		{
			name: "engine item",
			yaml: "engines:\n  - name: a\n    url: http://a\n  - name: b\n    urll: http://b\n    modles: [m]\n",
			want: []string{
				"config file FILE: engines[1].modles: unknown key (did you mean engines[1].models?)",
				"config file FILE: engines[1].urll: unknown key (did you mean engines[1].url?)",
			},
		},
		{
			name: "an engine key is not suggested from another section",
			yaml: "engines:\n  - name: a\n    url: http://a\n    interval: 5s\n",
			want: []string{"config file FILE: engines[0].interval: unknown key"},
		},
		{
			name: "a koanf:\"-\" field is no key",
			yaml: "server:\n  engines: []\n",
			want: []string{"config file FILE: server.engines: unknown key (did you mean engines or simulate.engines?)"},
		},
		{
			name: "nothing close",
			yaml: "server:\n  zzz: 1\n",
			want: []string{"config file FILE: server.zzz: unknown key"},
		},
		{
			name: "dotted key name",
			yaml: "\"server.listen\": x\n",
			want: []string{"config file FILE: server.listen: unknown key: a key name cannot contain a dot, nest the levels instead"},
		},

		// Unknown keys in the environment.
		{
			name: "env third level",
			env:  []string{"SWITCHBOARD_SERVER__TIMEOUTS__IDEL=5s"},
			want: []string{"environment SWITCHBOARD_SERVER__TIMEOUTS__IDEL: unknown key server.timeouts.idel (did you mean SWITCHBOARD_SERVER__TIMEOUTS__IDLE?)"},
		},
		{
			name: "env single underscore between levels",
			env:  []string{"SWITCHBOARD_ROUTING_POLICY=least-loaded"},
			want: []string{"environment SWITCHBOARD_ROUTING_POLICY: unknown key routing_policy (did you mean SWITCHBOARD_ROUTING__POLICY?)"},
		},
		{
			name: "env misspelled section keeps the rest",
			env:  []string{"SWITCHBOARD_SERVR__TIMEOUTS__IDLE=5s"},
			want: []string{"environment SWITCHBOARD_SERVR__TIMEOUTS__IDLE: unknown key servr.timeouts.idle (did you mean SWITCHBOARD_SERVER__TIMEOUTS__IDLE?)"},
		},
		{
			name: "env key of another section",
			env:  []string{"SWITCHBOARD_SERVER__POLICY=least-loaded"},
			want: []string{"environment SWITCHBOARD_SERVER__POLICY: unknown key server.policy (did you mean SWITCHBOARD_ROUTING__POLICY?)"},
		},
		{
			name: "env nothing close",
			env:  []string{"SWITCHBOARD_FOO_BAR=1", "SWITCHBOARD_ZZZ=1"},
			want: []string{
				"environment SWITCHBOARD_FOO_BAR: unknown key foo_bar (levels are joined by a double underscore: SWITCHBOARD_ROUTING__POLICY sets routing.policy)",
				"environment SWITCHBOARD_ZZZ: unknown key zzz",
			},
		},

		// Bad values, from the file and from the environment.
		{
			// YAML's bare 30 would decode as 30 ns: stream idle timeouts
			// after every token, a drain that waits for nothing.
			name: "duration without its unit",
			yaml: "server:\n  shutdown_timeout: 30\n  timeouts:\n    idle: 2.5\n",
			want: []string{
				"config file FILE: server.shutdown_timeout: 30 is not a duration: give its unit, such as 30s or 30ms",
				"config file FILE: server.timeouts.idle: 2.5 is not a duration: give its unit, such as 2.5s or 2.5ms",
			},
		},
		{
			name: "fraction for a whole number",
			yaml: "server:\n  max_attempts: 2.7\n",
			want: []string{"config file FILE: server.max_attempts: 2.7 is not a whole number"},
		},
		{
			name: "whole number",
			yaml: "server:\n  max_body_bytes: abc\n  health:\n    unhealthy_after: 2.5x\n",
			env:  []string{"SWITCHBOARD_SERVER__MAX_ATTEMPTS=two"},
			want: []string{
				`config file FILE: server.health.unhealthy_after: "2.5x" is not a whole number`,
				`config file FILE: server.max_body_bytes: "abc" is not a whole number`,
				`environment SWITCHBOARD_SERVER__MAX_ATTEMPTS (server.max_attempts): "two" is not a whole number`,
			},
		},
		{
			name: "bool",
			yaml: "server:\n  engine_header: maybe\n",
			env:  []string{"SWITCHBOARD_SERVER__INJECT_USAGE=yes"},
			want: []string{
				`config file FILE: server.engine_header: "maybe" is not true or false`,
				`environment SWITCHBOARD_SERVER__INJECT_USAGE (server.inject_usage): "yes" is not true or false`,
			},
		},
		{
			name: "duration",
			yaml: "server:\n  timeouts:\n    idle: 5 minutes\n",
			env:  []string{"SWITCHBOARD_SIMULATE__TTFT=", "SWITCHBOARD_SERVER__TIMEOUTS__REQUEST=10"},
			want: []string{
				`config file FILE: server.timeouts.idle: "5 minutes" is not a duration (use Go syntax such as 500ms, 30s, 10m)`,
				`environment SWITCHBOARD_SERVER__TIMEOUTS__REQUEST (server.timeouts.request): "10" is not a duration: give its unit, such as 10s or 10ms`,
				`environment SWITCHBOARD_SIMULATE__TTFT (simulate.ttft): "" is not a duration (use Go syntax such as 500ms, 30s, 10m)`,
			},
		},
		{
			name: "list of values",
			yaml: "simulate:\n  models: {a: b}\nengines:\n  - name: a\n    url: http://a\n    models: [m1, [m2]]\n",
			env:  []string{"SWITCHBOARD_SIMULATE__MODELS__X=m"},
			want: []string{
				"config file FILE: engines[0].models[1]: expected a single value, got a list",
				"config file FILE: simulate.models: expected a list of values, got a section",
				"environment SWITCHBOARD_SIMULATE__MODELS__X (simulate.models): expected a list of values, got a section",
			},
		},
		{
			name: "list of engines",
			yaml: "engines: gpu-a\n",
			env:  []string{"SWITCHBOARD_ENGINES=http://a"},
			want: []string{
				`config file FILE: engines: expected a list of engines, got "gpu-a"`,
				`environment SWITCHBOARD_ENGINES (engines): expected a list of engines, got "http://a"; a list of sections can only be set in the config file`,
			},
		},
		{
			name: "engine given as one section instead of a list",
			yaml: "engines:\n  name: a\n  url: http://a\n",
			want: []string{"config file FILE: engines: expected a list of engines, got a section"},
		},
		{
			name: "engine item not a section",
			yaml: "engines:\n  - http://a\n",
			want: []string{`config file FILE: engines[0]: expected a section (key: value pairs), got "http://a"`},
		},
		{
			name: "section given a value",
			yaml: "server:\n  timeouts: 5s\nadmin: 127.0.0.1:9464\n",
			env:  []string{"SWITCHBOARD_SERVER__HEALTH=on"},
			want: []string{
				`config file FILE: admin: expected a section (key: value pairs), got "127.0.0.1:9464"`,
				`config file FILE: server.timeouts: expected a section (key: value pairs), got "5s"`,
				`environment SWITCHBOARD_SERVER__HEALTH (server.health): expected a section (key: value pairs), got "on"`,
			},
		},
		{
			name: "value given a section",
			yaml: "server:\n  listen:\n    host: 0.0.0.0\n",
			env:  []string{"SWITCHBOARD_LOG__LEVEL__X=debug"},
			want: []string{
				"config file FILE: server.listen: expected a single value, got a section",
				"environment SWITCHBOARD_LOG__LEVEL__X (log.level): expected a single value, got a section",
			},
		},
		{
			name: "every problem of both sources at once",
			yaml: "server:\n  listn: x\n  max_body_bytes: big\nroutng: {}\n",
			env:  []string{"SWITCHBOARD_SERVER__ENGINE_HEADER=maybe", "SWITCHBOARD_LOG__LEVL=debug"},
			want: []string{
				"config file FILE: routng: unknown key (did you mean routing?)",
				"config file FILE: server.listn: unknown key (did you mean server.listen?)",
				`config file FILE: server.max_body_bytes: "big" is not a whole number`,
				"environment SWITCHBOARD_LOG__LEVL: unknown key log.levl (did you mean SWITCHBOARD_LOG__LEVEL?)",
				`environment SWITCHBOARD_SERVER__ENGINE_HEADER (server.engine_header): "maybe" is not true or false`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			path := ""
			if tc.yaml != "" {
				path = writeConfig(t, tc.yaml)
				args = []string{"--config", path}
			}
			// A valid setting alongside: the problems alone are reported.
			env := append([]string{"SWITCHBOARD_SIMULATE__ENGINES=1"}, tc.env...)
			_, err := loadConfig(args, environ(env...))
			if err == nil {
				t.Fatal("loadConfig: nil error")
			}
			want := strings.ReplaceAll(strings.Join(tc.want, "\n"), "FILE", path)
			if err.Error() != want {
				t.Errorf("error:\n%s\nwant:\n%s", err, want)
			}
			for _, w := range goNames {
				if strings.Contains(err.Error(), w) {
					t.Errorf("error mentions %q:\n%s", w, err)
				}
			}
		})
	}
}

// TestValueProblem covers value types the configuration does not use yet,
// so a key added with one of them gets a plain message too.
func TestValueProblem(t *testing.T) {
	tests := []struct {
		v    any
		typ  reflect.Type
		want string
	}{
		{"x", reflect.TypeFor[float64](), `"x" is not a number`},
		{"-1", reflect.TypeFor[uint](), `"-1" is not a whole number of 0 or more`},
		{"10.0.0.0", reflect.TypeFor[netip.Prefix](), `"10.0.0.0" is not valid: no '/'`},
		{"1,x", reflect.TypeFor[[]int](), `"1,x" is not a whole number`},
		{map[string]any{"a": 1}, reflect.TypeFor[int](), "expected a single value, got a section"},
		{[]any{1}, reflect.TypeFor[*bool](), "expected a single value, got a list"},
		{"5 minutes", reflect.TypeFor[*time.Duration](), `"5 minutes" is not a duration (use Go syntax such as 500ms, 30s, 10m)`},
		// Accepted, as the decoder accepts them: weak typing.
		{"0x10", reflect.TypeFor[int](), ""},
		{"", reflect.TypeFor[int](), ""},
		{"1", reflect.TypeFor[bool](), ""},
		{"", reflect.TypeFor[bool](), ""},
		{7, reflect.TypeFor[string](), ""},
		{"1.5", reflect.TypeFor[float64](), ""},
		{"1500us", reflect.TypeFor[time.Duration](), ""},
		{true, reflect.TypeFor[time.Duration](), ""}, // 1ns, as before
		{"a,b", reflect.TypeFor[[]string](), ""},
		{"10.0.0.0/8", reflect.TypeFor[netip.Prefix](), ""},
	}
	for _, tc := range tests {
		if got := valueProblem(tc.v, tc.typ); got != tc.want {
			t.Errorf("valueProblem(%#v, %v) = %q, want %q", tc.v, tc.typ, got, tc.want)
		}
	}
}

// TestCheckerStructShapes walks a struct with every shape the reflection
// handles: a squashed struct (pointer too), a `koanf:"-"` field, an
// untagged field, a list of sections, maps of values and of sections.
func TestCheckerStructShapes(t *testing.T) {
	type item struct {
		URL string `koanf:"url"`
	}
	type inner struct {
		Depth int `koanf:"depth"`
	}
	type squashed struct {
		Flat bool `koanf:"flat"`
	}
	type shapes struct {
		squashed  `koanf:",squash"`
		Ptr       *struct{ Far int } `koanf:",squash"`
		Skipped   string             `koanf:"-"`
		Untagged  int
		Items     []item           `koanf:"items"`
		Weights   map[string]int   `koanf:"weights"`
		Sections  map[string]inner `koanf:"sections"`
		Nested    *inner           `koanf:"nested"`
		Prefixes  []netip.Prefix   `koanf:"prefixes"`
		unexposed int              // unexported fields are no keys
	}
	typ := reflect.TypeFor[shapes]()
	wantKeys := []string{"far", "flat", "items", "nested", "prefixes", "sections", "untagged", "weights"}
	if got := slices.Sorted(maps.Keys(sectionKeys(typ))); !slices.Equal(got, wantKeys) {
		t.Errorf("sectionKeys = %v, want %v", got, wantKeys)
	}
	data := map[string]any{
		"flat":     "maybe",
		"far":      1,
		"untagged": "x",
		"skipped":  "y",
		"items":    []any{map[string]any{"url": "a"}, map[string]any{"ulr": "b"}},
		"weights":  map[string]any{"a": 1, "b": "heavy"},
		"sections": map[string]any{"one": map[string]any{"depth": 1}, "two": map[string]any{"dept": 2}, "three": 3},
		"nested":   map[string]any{"depth": "deep"},
		"prefixes": []any{"10.0.0.0/8", "::1"},
	}
	c := checker{root: typ}
	c.section("", data, typ, false)
	var got []string
	for _, p := range c.problems {
		got = append(got, p.key+": "+p.msg+" "+strings.Join(p.suggest, "|"))
	}
	want := []string{
		`flat: "maybe" is not true or false `,
		`items[1].ulr: unknown key items[1].url`,
		`nested.depth: "deep" is not a whole number `,
		`prefixes[1]: "::1" is not valid: no '/' `,
		`sections.three: expected a section (key: value pairs), got 3 `,
		`sections.two.dept: unknown key sections.two.depth`,
		`skipped: unknown key `,
		`untagged: "x" is not a whole number `,
		`weights.b: "heavy" is not a whole number `,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"idle", "idle", 0},
		{"idel", "idle", 1}, // swap
		{"urll", "url", 1},  // deletion
		{"listn", "listen", 1},
		{"serverr", "server", 1},
		{"kitten", "sitting", 3},
		{"ca", "abc", 3}, // optimal string alignment: no edit of a swapped pair
		{"", "abc", 3},
	}
	for _, tc := range tests {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := editDistance(tc.b, tc.a); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.b, tc.a, got, tc.want)
		}
	}
}

// legacyLoad is loadConfig's file and environment layering and decode as
// they were before the per-source checks, kept here as the reference that
// valid input must still decode to.
func legacyLoad(t *testing.T, path string, vars []string) Config {
	t.Helper()
	k := koanf.New(".")
	if path != "" {
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Load(env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: environ(vars...),
		TransformFunc: func(key, v string) (string, any) {
			key = strings.ToLower(strings.TrimPrefix(key, envPrefix))
			return strings.ReplaceAll(key, "__", "."), v
		},
	}), nil); err != nil {
		t.Fatal(err)
	}
	cfg := defaults()
	dc := &mapstructure.DecoderConfig{
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
			mapstructure.TextUnmarshallerHookFunc()),
		WeaklyTypedInput: true,
		ErrorUnused:      true,
	}
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{Tag: "koanf", DecoderConfig: dc}); err != nil {
		t.Fatal(err)
	}
	if cfg.Simulate.Engines > 0 && len(cfg.Simulate.Models) == 0 {
		cfg.Simulate.Models = []string{"demo-model"}
	}
	return cfg
}

// TestLoadConfigMatchesLegacyDecode checks that the checks reject nothing
// valid and change no value: the shipped configs, the full test config and
// weakly typed input decode exactly as they did before.
func TestLoadConfigMatchesLegacyDecode(t *testing.T) {
	tests := []struct {
		name string
		path string // a config file, or
		yaml string // its body
		env  []string
	}{
		{name: "gateway.yaml", path: "../../configs/gateway.yaml"},
		{name: "demo.yaml", path: "../../configs/demo.yaml"},
		{name: "full", yaml: fullYAML},
		{
			name: "full with environment",
			yaml: fullYAML,
			env: []string{"SWITCHBOARD_SERVER__TIMEOUTS__IDLE=2m", "SWITCHBOARD_SERVER__MAX_BODY_BYTES=0x800",
				"SWITCHBOARD_SERVER__ENGINE_HEADER=1", "SWITCHBOARD_SIMULATE__MODELS=a,b", "SWITCHBOARD_SIMULATE__ENGINES=",
				"SWITCHBOARD_SERVER__HEALTH__UNHEALTHY_AFTER=3", "SWITCHBOARD_SERVER__INJECT_USAGE=", // an empty unhealthy_after (0) is now refused by loadConfig itself
				"SWITCHBOARD_Log__Level=warn", "SWITCHBOARD_=ignored"},
		},
		{
			name: "weakly typed file values and empty sections",
			yaml: "server:\n  max_body_bytes: \"2048\"\n  engine_header: \"false\"\n  max_attempts: 3.0\n" +
				"  timeouts:\n  health:\n    unhealthy_after: true\nsimulate:\n  engines: \"2\"\n  models: m1\n" +
				"  ttft: 5ms\n  itl: ~\nadmin:\nrouting:\n  prefill_weight: \"4\"\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if tc.yaml != "" {
				path = writeConfig(t, tc.yaml)
			}
			got, err := loadConfig([]string{"--config", path}, environ(tc.env...))
			if err != nil {
				t.Fatal(err)
			}
			if want := legacyLoad(t, path, tc.env); !reflect.DeepEqual(got, want) {
				t.Errorf("config mismatch\n got: %+v\nwant: %+v", got, want)
			}
		})
	}
}

// TestLoadConfigLenientForms: forms an operator writes that must work: a
// zero duration without a unit, a whole float for an integer, and lists
// from the environment with spaces or brackets.
func TestLoadConfigLenientForms(t *testing.T) {
	path := writeConfig(t, "server:\n  drain_delay: 0\n  max_attempts: 3.0\nsimulate:\n  engines: 1\n")
	cfg, err := loadConfig([]string{"--config", path}, environ(
		"SWITCHBOARD_SERVER__STRIP_REQUEST_HEADERS=[X-A, X-B ]",
		"SWITCHBOARD_SERVER__TRUSTED_PROXIES= 10.0.0.0/8 ,192.0.2.7",
	))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.DrainDelay != 0 || cfg.Server.MaxAttempts != 3 {
		t.Errorf("drain_delay %s, max_attempts %d", cfg.Server.DrainDelay, cfg.Server.MaxAttempts)
	}
	if got := cfg.Server.StripRequestHeaders; !slices.Equal(got, []string{"X-A", "X-B"}) {
		t.Errorf("strip_request_headers %q", got)
	}
	if got := cfg.Server.TrustedProxies; !slices.Equal(got, []string{"10.0.0.0/8", "192.0.2.7"}) {
		t.Errorf("trusted_proxies %q", got)
	}
}

// TestLoadConfigNamedValueErrors: the errors Validate produces for a bad
// policy or log level name the key and the valid values, with no library
// wording.
func TestLoadConfigNamedValueErrors(t *testing.T) {
	_, err := loadConfig(nil, environ("SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_ROUTING__POLICY=LeastLoaded", "SWITCHBOARD_LOG__LEVEL=verbose"))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		`routing.policy: unknown routing policy "LeastLoaded" (known: least-loaded, power-of-two, precise-prefix, prefix-aware, round-robin, scorer, session-affinity); did you mean least-loaded? (set by SWITCHBOARD_ROUTING__POLICY)`,
		`log.level must be debug, info, warn or error, got "verbose" (set by SWITCHBOARD_LOG__LEVEL)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "slog") {
		t.Errorf("error names the library: %v", err)
	}
	if !errors.Is(err, routing.ErrUnknownPolicy) {
		t.Errorf("the annotated error lost its chain: %v", err)
	}

	// Gateway settings are checked before any engine starts, and say where
	// they were set: the file, the environment or a flag.
	path := writeConfig(t, "server:\n  timeouts:\n    attempt: -1s\n")
	_, err = loadConfig([]string{"--config", path}, environ("SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_SERVER__TIMEOUTS__REQUEST=0", "SWITCHBOARD_SERVER__TIMEOUTS__IDLE=0"))
	for _, want := range []string{
		"server.timeouts.attempt must be >= 0, got -1s (in config file " + path + ")",
		"server.timeouts.request and server.timeouts.idle are both 0: a stream whose engine stalls after its first token would hold its engine slot forever; set one of them (set by SWITCHBOARD_SERVER__TIMEOUTS__",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
	if !errors.Is(err, gateway.ErrInvalidConfig) {
		t.Errorf("not an ErrInvalidConfig: %v", err)
	}
}

// TestLoadFallbacks: models.fallbacks and models.context_fallbacks load
// from the file into the gateway's ModelsConfig, and a model listed as its
// own fallback is refused by name.
func TestLoadFallbacks(t *testing.T) {
	path := writeConfig(t, "engines:\n  - {name: e1, url: \"http://127.0.0.1:1\", models: [a]}\n"+
		"models:\n  fallbacks: {a: [b, c]}\n  context_fallbacks: {a: [a-long]}\n")
	cfg, err := loadConfig([]string{"--config", path}, environ())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Models.Fallbacks, map[string][]string{"a": {"b", "c"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("fallbacks = %v, want %v", got, want)
	}
	if got, want := cfg.Models.ContextFallbacks, map[string][]string{"a": {"a-long"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("context_fallbacks = %v, want %v", got, want)
	}
	path = writeConfig(t, "engines:\n  - {name: e1, url: \"http://127.0.0.1:1\", models: [a]}\nmodels:\n  context_fallbacks: {a: [a]}\n")
	if _, err := loadConfig([]string{"--config", path}, environ()); err == nil || !strings.Contains(err.Error(), `models.context_fallbacks: "a" lists itself`) {
		t.Errorf("self-reference: %v, want models.context_fallbacks: \"a\" lists itself", err)
	}
}
