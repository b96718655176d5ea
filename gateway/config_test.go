package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

func TestConfigValidate(t *testing.T) {
	ok := fleet.EngineConfig{Name: "e", URL: "http://127.0.0.1:1"}
	tests := []struct {
		name string
		mut  func(*Config)
		ok   bool
	}{
		{"defaults with one engine", func(*Config) {}, true},
		{"no engines", func(c *Config) { c.Engines = nil }, false},
		{"duplicate names", func(c *Config) { c.Engines = []fleet.EngineConfig{ok, ok} }, false},
		{"bad scheme", func(c *Config) { c.Engines = []fleet.EngineConfig{{Name: "e", URL: "ftp://h"}} }, false},
		{"no host", func(c *Config) { c.Engines = []fleet.EngineConfig{{Name: "e", URL: "http://"}} }, false},
		{"empty name", func(c *Config) { c.Engines = []fleet.EngineConfig{{URL: "http://h"}} }, false},
		{"empty model", func(c *Config) { c.Engines = []fleet.EngineConfig{{Name: "e", URL: "http://h", Models: []string{" "}}} }, false},
		{"zero body limit", func(c *Config) { c.MaxBodyBytes = 0 }, false},
		{"zero attempts", func(c *Config) { c.MaxAttempts = 0 }, false},
		{"negative timeout", func(c *Config) { c.Timeouts.Idle = -1 }, false},
		{"zero health interval", func(c *Config) { c.Health.Interval = 0 }, false},
		// Combinations that cannot work (hardening class 6).
		{"buffered budget below body limit", func(c *Config) { c.MaxBufferedBytes = c.MaxBodyBytes - 1 }, false},
		{"no buffered budget", func(c *Config) { c.MaxBufferedBytes = 0 }, true},
		{"response buffer above budget", func(c *Config) { c.MaxResponseBufferBytes = c.MaxBufferedBytes + 1 }, false},
		{"first token longer than request", func(c *Config) { c.Timeouts.Request = time.Minute }, true}, // the shorter fires first
		{"request lowered with inner timeouts", func(c *Config) {
			c.Timeouts.Request, c.Timeouts.FirstToken, c.Timeouts.Attempt, c.Timeouts.ResponseHeader = time.Minute, 30*time.Second, time.Minute, 10*time.Second
		}, true},
		{"header timeout longer than first token", func(c *Config) { c.Timeouts.ResponseHeader = c.Timeouts.FirstToken + 1 }, true},
		{"stalled stream unbounded before the first token", func(c *Config) { c.Timeouts.Request, c.Timeouts.FirstToken = 0, 0 }, false},
		{"stalled stream unbounded", func(c *Config) { c.Timeouts.Request, c.Timeouts.Idle = 0, 0 }, false},
		{"stalled non-stream unbounded", func(c *Config) { c.Timeouts.Request, c.Timeouts.Attempt = 0, 0 }, false},
		{"stalled client unbounded", func(c *Config) { c.Timeouts.Request, c.Timeouts.ClientWrite = 0, 0 }, false},
		{"idle off, client write on", func(c *Config) { c.Timeouts.Idle = 0 }, true},
		{"negative body read timeout", func(c *Config) { c.BodyReadTimeout = -1 }, false},
		{"bad trusted proxy", func(c *Config) { c.TrustedProxies = []string{"10.0.0.0/33"} }, false},
		{"trusted proxies", func(c *Config) { c.TrustedProxies = []string{"10.0.0.0/8", "192.0.2.7", "::1"} }, true},
		{"bad strip header", func(c *Config) { c.StripRequestHeaders = []string{"X Bad"} }, false},
		{"bracketed strip header", func(c *Config) { c.StripRequestHeaders = []string{"[X-Foo"} }, false},
		{"password with a slash, not encoded", func(c *Config) { c.Engines = []fleet.EngineConfig{{Name: "e", URL: "http://admin:12/34@h:1"}} }, false},
		{"zero form limit", func(c *Config) { c.MaxFormBytes = 0 }, false},
		{"buffered budget below form limit", func(c *Config) { c.MaxBufferedBytes = c.MaxFormBytes - 1 }, false},
		{"alias with a newline", func(c *Config) { c.Models.Aliases = map[string]string{"a": "b\r\nX"} }, false},
		{"alias", func(c *Config) { c.Models.Aliases = map[string]string{"gpt-4o": "llama"} }, true},
		{"alias to itself", func(c *Config) { c.Models.Aliases = map[string]string{"a": "a"} }, false},
		{"alias to an alias", func(c *Config) { c.Models.Aliases = map[string]string{"a": "b", "b": "c"} }, false},
		{"alias with no target", func(c *Config) { c.Models.Aliases = map[string]string{"a": ""} }, false},
		{"password percent-encoded", func(c *Config) { c.Engines = []fleet.EngineConfig{{Name: "e", URL: "http://admin:12%2F34@h:1"}} }, true},
		{"disaggregation threshold negative", func(c *Config) { c.Disaggregation.MinUncachedTokens = -1 }, false},
		{"disaggregation threshold zero", func(c *Config) { c.Disaggregation.MinUncachedTokens = 0 }, true},
		{"disaggregation bytes per token zero", func(c *Config) { c.Disaggregation.BytesPerToken = 0 }, false},
		{"disaggregation bytes per token huge", func(c *Config) { c.Disaggregation.BytesPerToken = 65 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Engines = []fleet.EngineConfig{ok}
			tt.mut(&c)
			err := c.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			if err != nil && strings.Contains(err.Error(), "time.Duration") {
				t.Errorf("error %v names a Go type", err)
			}
			if err != nil && (strings.Contains(err.Error(), "12/34") || strings.Contains(err.Error(), "admin")) {
				t.Errorf("error %v shows the engine URL's credentials", err)
			}
		})
	}
}
