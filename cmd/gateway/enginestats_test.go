package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// TestLoadConfigEngineStats: the server.engine_stats keys are accepted from
// the file and the environment, and bad values are refused with the key,
// the reason and where the value was set.
func TestLoadConfigEngineStats(t *testing.T) {
	t.Run("accepted", func(t *testing.T) {
		path := writeConfig(t, "server:\n  engine_stats:\n    enabled: false\n    interval: 2s\n    timeout: 250ms\n    path: /engine/metrics\n")
		cfg, err := loadConfig([]string{"--config", path},
			environ("SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_SERVER__ENGINE_STATS__MAX_AGE=10s"))
		if err != nil {
			t.Fatal(err)
		}
		want := fleet.EngineStatsConfig{Enabled: false, Interval: 2 * time.Second, Timeout: 250 * time.Millisecond,
			MaxAge: 10 * time.Second, Path: "/engine/metrics"}
		if cfg.Server.EngineStats != want {
			t.Errorf("engine_stats = %+v, want %+v", cfg.Server.EngineStats, want)
		}
	})
	tests := []struct {
		name string
		yaml string
		env  []string
		want []string
	}{
		{
			name: "interval zero from the environment",
			env:  []string{"SWITCHBOARD_SERVER__ENGINE_STATS__INTERVAL=0s"},
			want: []string{"server.engine_stats.interval must be > 0, got 0s (set by SWITCHBOARD_SERVER__ENGINE_STATS__INTERVAL)"},
		},
		{
			name: "max_age not above interval",
			yaml: "server:\n  engine_stats:\n    interval: 5s\n    max_age: 5s\n",
			want: []string{"server.engine_stats.max_age (5s) must be longer than server.engine_stats.interval (5s)", "(in config file "},
		},
		{
			name: "negative timeout",
			yaml: "server:\n  engine_stats:\n    timeout: -1s\n",
			want: []string{"server.engine_stats.timeout must be > 0, got -1s"},
		},
		{
			name: "path without a slash",
			env:  []string{"SWITCHBOARD_SERVER__ENGINE_STATS__PATH=metrics"},
			want: []string{`server.engine_stats.path must be a path starting with /, such as /metrics, got "metrics"`},
		},
		{
			name: "duration without a unit",
			yaml: "server:\n  engine_stats:\n    interval: 5\n",
			want: []string{"server.engine_stats.interval: 5 is not a duration: give its unit, such as 5s or 5ms"},
		},
		{
			name: "not a bool",
			env:  []string{"SWITCHBOARD_SERVER__ENGINE_STATS__ENABLED=maybe"},
			want: []string{`SWITCHBOARD_SERVER__ENGINE_STATS__ENABLED (server.engine_stats.enabled): "maybe" is not true or false`},
		},
		{
			name: "misspelled key",
			yaml: "server:\n  engine_stats:\n    max_agee: 5s\n",
			want: []string{"server.engine_stats.max_agee: unknown key (did you mean server.engine_stats.max_age?)"},
		},
		{
			name: "section misspelled",
			yaml: "server:\n  engine_stat:\n    interval: 1s\n",
			want: []string{"server.engine_stat: unknown key (did you mean server.engine_stats?)"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.yaml != "" {
				args = []string{"--config", writeConfig(t, tc.yaml)}
			}
			_, err := loadConfig(args, environ(append([]string{"SWITCHBOARD_SIMULATE__ENGINES=1"}, tc.env...)...))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "time.Duration") {
				t.Errorf("error names a Go type: %v", err)
			}
			if strings.Contains(tc.want[0], "must") && !errors.Is(err, gateway.ErrInvalidConfig) {
				t.Errorf("not an ErrInvalidConfig: %v", err)
			}
		})
	}
}
