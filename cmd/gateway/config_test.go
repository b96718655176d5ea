package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway"
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
	c.Engines = []gateway.EngineConfig{
		{Name: "gpu-a", URL: "http://10.0.0.5:8000", Models: []string{"meta-llama/Llama-3.1-8B-Instruct", "qwen"}},
		{Name: "gpu-b", URL: "https://10.0.0.6:8443", APIKey: "engine-secret"},
	}
	c.Routing = routing.Config{Policy: routing.LeastLoadedName, PrefillWeight: 3}
	c.Telemetry.ServiceName = "sb-test"
	c.Log = LogConfig{Level: "debug", Format: "json"}
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
		// want are substrings that must all appear in the error.
		want []string
		is   error
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
			want: []string{`"random"`, "known: least-loaded, round-robin", "verbose"},
			is:   routing.ErrUnknownPolicy,
		},
		{
			name: "every section validated",
			yaml: "server:\n  shutdown_timeout: 0s\nlog:\n  format: xml\nsimulate:\n  engines: -1\ntelemetry:\n  service_name: \"\"\nrouting:\n  prefill_weight: 0\n",
			want: []string{"server.shutdown_timeout", "log.format", "simulate.engines must be >= 0", "telemetry.service_name", "routing.prefill_weight"},
		},
		{
			name: "bad duration",
			yaml: "simulate:\n  engines: 1\n  ttft: soon\n",
			want: []string{"config:", "simulate.ttft", "invalid duration"},
		},
		{
			name: "bad duration from env",
			env:  []string{"SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_SERVER__TIMEOUTS__IDLE=forever"},
			want: []string{"server.timeouts.idle", "invalid duration"},
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
			want: []string{"config:", "routng"},
		},
		{
			name: "misspelled env variable",
			env:  []string{"SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_ROUTING_POLICY=least-loaded"},
			want: []string{"config:", "routing_policy"},
		},
		{
			name: "unknown flag",
			args: []string{"--nope"},
			want: []string{"unknown flag", "--nope"},
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
		want.Engines = []gateway.EngineConfig{{Name: "e1", URL: "http://127.0.0.1:8001", Models: []string{"my-model"}}}
		want.Simulate.Models = []string{"demo-model"}
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
