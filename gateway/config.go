package gateway

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Config is the gateway's operator configuration (the `server` and
// `engines` sections of the YAML file). Build it from defaults with
// [DefaultConfig], then override; [New] validates it.
type Config struct {
	// MaxBodyBytes caps a request body, in bytes. Larger bodies get 413.
	// Default 16 MiB.
	MaxBodyBytes int64 `koanf:"max_body_bytes"`
	// MaxAttempts is how many engines a request may be tried on when the
	// connection to an engine fails before anything was sent (1 = no
	// retry). Default 2. Requests are never retried after an engine has
	// received them, nor after the first byte reached the client.
	MaxAttempts int `koanf:"max_attempts"`
	// Timeouts bound each phase of an engine attempt.
	Timeouts Timeouts `koanf:"timeouts"`
	// Health configures active health checks and model discovery.
	Health HealthConfig `koanf:"health"`
	// EngineHeader, when true (the default), names the engine that served a
	// request in the X-Switchboard-Engine response header.
	EngineHeader bool `koanf:"engine_header"`
	// InjectUsage, when true (the default), asks the engine for the usage
	// chunk (stream_options.include_usage) on streamed requests whose
	// client did not, so token usage and TPOT are recorded for every
	// stream; the extra chunk is not forwarded to that client.
	InjectUsage bool `koanf:"inject_usage"`
	// Engines is the static engine list (the top-level `engines` section;
	// the loader fills it in).
	Engines []EngineConfig `koanf:"-"`
}

// Timeouts bound an engine attempt. Zero disables a timeout.
type Timeouts struct {
	// Connect bounds the TCP (and TLS) connection to an engine. Default 5 s.
	Connect time.Duration `koanf:"connect"`
	// ResponseHeader bounds the wait for an engine's response headers on
	// streaming requests (vLLM sends them at once). Non-streaming
	// responses only start when generation ends, so they are bounded by
	// Request alone. Default 60 s.
	ResponseHeader time.Duration `koanf:"response_header"`
	// Idle bounds the silence between two reads of a streaming response
	// body (keep-alive comments count as activity). Default 60 s.
	Idle time.Duration `koanf:"idle"`
	// Request bounds a whole request, all attempts included. Default 10 min.
	Request time.Duration `koanf:"request"`
}

// HealthConfig configures active health checks (GET /health) and model
// discovery (GET /v1/models).
type HealthConfig struct {
	// Interval between health probes of each engine. Default 5 s.
	Interval time.Duration `koanf:"interval"`
	// Timeout of one probe. Default 2 s.
	Timeout time.Duration `koanf:"timeout"`
	// UnhealthyAfter is the number of consecutive failed probes that mark
	// an engine unhealthy. Default 2.
	UnhealthyAfter int `koanf:"unhealthy_after"`
	// DiscoveryInterval is how often engines configured without models
	// are asked for their models again. Default 30 s.
	DiscoveryInterval time.Duration `koanf:"discovery_interval"`
}

// EngineConfig is one engine (a vLLM-compatible OpenAI server).
type EngineConfig struct {
	// Name is the engine's unique name; it is the `engine` attribute on
	// every metric, so keep it short and stable.
	Name string `koanf:"name"`
	// URL is the engine's base URL, e.g. http://10.0.0.5:8000 (the
	// /v1/... paths are appended).
	URL string `koanf:"url"`
	// Models the engine serves. When empty they are learned from the
	// engine's GET /v1/models and refreshed every DiscoveryInterval.
	Models []string `koanf:"models"`
	// APIKey, when set, is sent to the engine as `Authorization: Bearer`.
	// Prefer APIKeyEnv, which keeps the secret out of the file.
	// The client's own Authorization header is never forwarded.
	APIKey string `koanf:"api_key"`
	// APIKeyEnv names an environment variable holding the engine's key.
	// The engine then needs a key: if the variable is unset or empty the
	// gateway refuses to start rather than send requests without it (fail
	// closed, shared/cases L19).
	APIKeyEnv string `koanf:"api_key_env"`
}

// DefaultConfig returns the gateway defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes: 16 << 20,
		MaxAttempts:  2,
		EngineHeader: true,
		InjectUsage:  true,
		Timeouts: Timeouts{
			Connect:        5 * time.Second,
			ResponseHeader: 60 * time.Second,
			Idle:           60 * time.Second,
			Request:        10 * time.Minute,
		},
		Health: HealthConfig{
			Interval:          5 * time.Second,
			Timeout:           2 * time.Second,
			UnhealthyAfter:    2,
			DiscoveryInterval: 30 * time.Second,
		},
	}
}

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("invalid gateway config")

// Validate reports every problem with c, each wrapping [ErrInvalidConfig],
// joined with errors.Join.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.MaxBodyBytes <= 0 {
		bad("server.max_body_bytes must be > 0, got %d", c.MaxBodyBytes)
	}
	if c.MaxAttempts < 1 {
		bad("server.max_attempts must be >= 1, got %d", c.MaxAttempts)
	}
	for name, d := range map[string]time.Duration{
		"connect": c.Timeouts.Connect, "response_header": c.Timeouts.ResponseHeader,
		"idle": c.Timeouts.Idle, "request": c.Timeouts.Request,
	} {
		if d < 0 {
			bad("server.timeouts.%s must be >= 0, got %s", name, d)
		}
	}
	if c.Health.Interval <= 0 {
		bad("server.health.interval must be > 0, got %s", c.Health.Interval)
	}
	if c.Health.Timeout <= 0 {
		bad("server.health.timeout must be > 0, got %s", c.Health.Timeout)
	}
	if c.Health.UnhealthyAfter < 1 {
		bad("server.health.unhealthy_after must be >= 1, got %d", c.Health.UnhealthyAfter)
	}
	if c.Health.DiscoveryInterval <= 0 {
		bad("server.health.discovery_interval must be > 0, got %s", c.Health.DiscoveryInterval)
	}
	if len(c.Engines) == 0 {
		bad("no engines configured")
	}
	seen := map[string]bool{}
	for i, e := range c.Engines {
		if err := e.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("engines[%d]: %w", i, err))
		}
		if seen[e.Name] {
			bad("engines[%d]: duplicate engine name %q", i, e.Name)
		}
		seen[e.Name] = true
	}
	return errors.Join(errs...)
}

// Validate reports every problem with one engine's configuration.
func (e EngineConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if e.Name == "" {
		bad("engine name must not be empty")
	}
	u, err := url.Parse(e.URL)
	switch {
	case e.URL == "":
		bad("engine %q: url must not be empty", e.Name)
	case err != nil:
		bad("engine %q: url: %v", e.Name, err)
	case u.Scheme != "http" && u.Scheme != "https":
		bad("engine %q: url scheme must be http or https, got %q", e.Name, u.Scheme)
	case u.Host == "":
		bad("engine %q: url has no host", e.Name)
	}
	if e.APIKey != "" && e.APIKeyEnv != "" {
		bad("engine %q: set api_key or api_key_env, not both", e.Name)
	}
	for _, m := range e.Models {
		if strings.TrimSpace(m) == "" {
			bad("engine %q: empty model name", e.Name)
		}
	}
	return errors.Join(errs...)
}
