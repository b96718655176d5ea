package fleet

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
)

// ErrInvalidConfig wraps every configuration error of the fleet: an
// engine's, the health checks' or the stats scraper's. It is the gateway's
// own (gateway.ErrInvalidConfig is this error), so one errors.Is finds a
// configuration error wherever it was found.
var ErrInvalidConfig = errors.New("invalid gateway config")

// Config is what [New] builds a fleet from; the gateway fills it in from
// its own configuration, validated.
type Config struct {
	// Engines are the engines to start with, in configuration order.
	Engines []EngineConfig
	// Health configures the active health checks and model discovery.
	Health HealthConfig
	// Stats configures the engine stats scraper.
	Stats EngineStatsConfig
	// Outlier configures outlier detection (routing.OutlierConfig).
	Outlier routing.OutlierConfig
	// Aliases map a public model name to the engine model it stands for
	// (the gateway's models.aliases, validated: no alias points at another).
	Aliases map[string]string
	// ConnectTimeout is the connect and TLS handshake timeout of the
	// engines that have their own transport (a provider, a ca_file);
	// default 5 s.
	ConnectTimeout time.Duration
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

// EngineStatsConfig configures the engine stats scraper: every Interval the
// gateway reads each engine's Prometheus text exposition at Path (the vLLM
// metric names), stores what it found on the engine's routing.Endpoint for
// the routing policies, exports it as the switchboard.engine.* stats gauges
// and keeps an engine that reports itself sleeping or unhealthy out of
// routing while those stats are fresh.
type EngineStatsConfig struct {
	// Enabled turns scraping on. Default true. Off, no engine has stats:
	// policies use the gateway's own counters and the stats gauges are not
	// reported.
	Enabled bool `koanf:"enabled"`
	// Interval between two scrapes of each engine. Default 1 s.
	Interval time.Duration `koanf:"interval"`
	// Timeout of one scrape, connection and body included. Default 500 ms.
	Timeout time.Duration `koanf:"timeout"`
	// MaxAge is how long the stats of a successful scrape are trusted;
	// after it (the engine stopped answering /metrics) they are ignored
	// and the stats gauges stop reporting the engine. Default 5 s; must be
	// longer than Interval.
	MaxAge time.Duration `koanf:"max_age"`
	// Path is the metrics path on the engine's base URL. Default /metrics.
	Path string `koanf:"path"`
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
	// closed, docs/cases.md L19).
	APIKeyEnv string `koanf:"api_key_env"`
	// APIKeyFile names a file holding the engine's key (white space
	// around it ignored), such as a mounted Kubernetes Secret. As with
	// APIKeyEnv the engine then needs a key: an unreadable or empty file
	// keeps the gateway from starting. A reload (SIGHUP, a changed config
	// file) reads it again, so a rotated key is used from the next
	// request; a file that cannot be read then keeps the key in use, and
	// is logged.
	APIKeyFile string `koanf:"api_key_file"`
	// Provider is what the engine is: "" or "vllm" (the default), a
	// self-hosted vLLM-compatible server; or a hosted provider's API,
	// ProviderOpenAI, ProviderAzure, ProviderAnthropic or
	// ProviderOpenAICompatible (Groq, Together, Fireworks, Gemini's or
	// Anthropic's OpenAI-compatible endpoint, a vLLM in another cluster).
	// A provider engine is reached at URL, its base URL as the provider's
	// SDKs take it (https://api.openai.com/v1; Azure's resource endpoint),
	// over TLS with HTTP/2 when the provider offers it; it needs its
	// models configured (Models or ModelMap), is neither probed nor
	// scraped nor discovered (its health comes from its traffic: outlier
	// detection), takes no part in prefix or KV-cache routing,
	// continuation or disaggregation, and serves only the routes its API
	// has ([ServesOperation]). See docs/providers.md.
	Provider string `koanf:"provider"`
	// ProviderName is the engine's gen_ai.provider.name on GenAI spans and
	// metrics (OpenTelemetry GenAI conventions). Default: the provider's
	// well-known value ("openai", "azure.ai.openai", "anthropic"; for
	// openai-compatible the one of its URL's host when the conventions
	// list it, such as "groq", else the host), and
	// telemetry.DefaultProvider ("vllm") for a self-hosted engine, which
	// the conventions allow as a custom value.
	ProviderName string `koanf:"provider_name"`
	// ModelMap maps the model a client names (after models.aliases) to
	// the name the provider knows it by (an Azure deployment name), e.g.
	// {fast: gpt-4o-mini}; the body sent carries the provider's name. Its
	// keys are served models too. Provider engines only (a self-hosted
	// engine serves its models under vLLM's --served-model-name, and
	// models.aliases renames for every engine).
	ModelMap map[string]string `koanf:"model_map"`
	// APIVersion is Azure OpenAI's api-version query parameter (azure
	// only). Default DefaultAzureAPIVersion.
	APIVersion string `koanf:"api_version"`
	// AnthropicVersion is the anthropic-version header sent on
	// /v1/messages when the client sent none (anthropic only). Default
	// DefaultAnthropicVersion.
	AnthropicVersion string `koanf:"anthropic_version"`
	// CAFile names a PEM file of the certificate authorities that sign
	// the engine's TLS certificate (an https URL), instead of the
	// system's. Read when the incarnation is made.
	CAFile string `koanf:"ca_file"`
	// Tier orders engines for overflow and fallback: a request goes to
	// the lowest tier of its model with an engine that can take it (not
	// at MaxInFlight or MaxQueueDepth, not backing off a provider's
	// 429), spills to the next when every engine of that tier is full
	// (counted: switchboard.tier.overflows), and a retry after a failure
	// before content goes to the next tier once the tier's engines were
	// tried. Default: 0 for a self-hosted engine, 1 for a provider
	// (self-hosted first). nil is the default.
	Tier *int `koanf:"tier"`
	// MaxQueueDepth is the engine's overflow threshold on the queue depth
	// its fresh stats report (vllm:num_requests_waiting): at or above it
	// the engine counts as full, and its requests go to another engine of
	// its tier or to the next tier; when no tier has room they still go
	// to it (its queue is not a refusal). 0 (the default): none.
	MaxQueueDepth int `koanf:"max_queue_depth"`
	// MaxInFlight is the engine's circuit breaker: the most requests the
	// gateway has on it at once (prefill + decode, the counters the
	// in-flight gauges report). A request finding it full goes to another
	// engine, or is answered 503 with Retry-After at once when every
	// engine of its model is full. Concurrent admissions in the same
	// instant may pass it by a few (Envoy's circuit breakers are
	// approximate the same way). 0 (the default) = no limit.
	MaxInFlight int `koanf:"max_in_flight"`
	// Role is the engine's part in prefill/decode disaggregation (vLLM's
	// NixlConnector P/D, as llm-d deploys it): "prefill", "decode" or
	// "both" ("prefill-decode", llm-d's label value, and "" are both; the
	// default). A prefill engine takes no whole generation while its
	// model has an engine of another role ([Route.Decode]); disaggregated
	// requests pair a prefill engine with a decode one ([Route.Prefill],
	// [Route.Disaggregable]). See [ParseRole].
	Role string `koanf:"role"`
	// KVEvents is the engine's KV-cache events publisher, vLLM's
	// --kv-events-config endpoint as the gateway reaches it:
	// "tcp://host:port" (vLLM's default port is 5557; the engine binds
	// tcp://*:5557 and every gateway replica connects). Set, the gateway
	// subscribes and keeps the engine's blocks in its precise prefix
	// index (kv_events; routing.policy precise-prefix). Default "": none.
	KVEvents string `koanf:"kv_events"`
	// KVEventsReplay is the engine's replay socket (vLLM's
	// replay_endpoint), "tcp://host:port", asked for the batches a
	// sequence gap lost. Default "": a gap drops the engine's blocks from
	// the index until new events rebuild them.
	KVEventsReplay string `koanf:"kv_events_replay"`
	// Group, when set, restricts pairing: a prefill engine with a group
	// is paired only with decode engines of the same group (the engines
	// that can reach each other's KV cache, a rack or a NIXL domain).
	// Empty (the default): the engine pairs with every engine of its
	// model. A label-like name, compared as is.
	Group string `koanf:"group"`
}

// btoi is 1 for true.
func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkZMQEndpoint checks a ZMQ endpoint the gateway connects to: ""
// (none) or tcp://host:port with a port 1..65535.
func checkZMQEndpoint(s string) error {
	if s == "" {
		return nil
	}
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return fmt.Errorf("%q must be tcp://host:port", s)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" || host == "*" {
		return fmt.Errorf("%q must be tcp://host:port with the engine's host (the gateway connects to it)", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port must be 1..65535", s)
	}
	return nil
}

// role returns the engine's Role; a Role that does not parse (Validate
// refuses it) is RoleBoth.
func (e EngineConfig) role() Role {
	r, _ := ParseRole(e.Role)
	return r
}

// DefaultHealthConfig returns the health check defaults documented on
// each field.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{
		Interval:          5 * time.Second,
		Timeout:           2 * time.Second,
		UnhealthyAfter:    2,
		DiscoveryInterval: 30 * time.Second,
	}
}

// DefaultEngineStatsConfig returns the scraper defaults documented on each
// field.
func DefaultEngineStatsConfig() EngineStatsConfig {
	return EngineStatsConfig{
		Enabled:  true,
		Interval: time.Second,
		Timeout:  500 * time.Millisecond,
		MaxAge:   5 * time.Second,
		Path:     "/metrics",
	}
}

// badf returns a function that appends an error wrapping ErrInvalidConfig
// to *errs.
func badf(errs *[]error) func(format string, a ...any) {
	return func(format string, a ...any) {
		*errs = append(*errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
}

// Validate reports every problem with the health check settings, each
// wrapping [ErrInvalidConfig], joined with errors.Join.
func (h HealthConfig) Validate() error {
	var errs []error
	bad := badf(&errs)
	if h.Interval <= 0 {
		bad("server.health.interval must be > 0, got %s", h.Interval)
	}
	if h.Timeout <= 0 {
		bad("server.health.timeout must be > 0, got %s", h.Timeout)
	}
	if h.UnhealthyAfter < 1 {
		bad("server.health.unhealthy_after must be >= 1, got %d", h.UnhealthyAfter)
	}
	if h.DiscoveryInterval <= 0 {
		bad("server.health.discovery_interval must be > 0, got %s", h.DiscoveryInterval)
	}
	return errors.Join(errs...)
}

// Validate reports every problem with the scraper settings, each wrapping
// [ErrInvalidConfig], joined with errors.Join. They are checked even when
// scraping is off, so turning it on later cannot reveal an old mistake.
func (s EngineStatsConfig) Validate() error {
	var errs []error
	bad := badf(&errs)
	if s.Interval <= 0 {
		bad("server.engine_stats.interval must be > 0, got %s", s.Interval)
	}
	if s.Timeout <= 0 {
		bad("server.engine_stats.timeout must be > 0, got %s", s.Timeout)
	} else if s.Interval > 0 && s.Timeout > s.Interval {
		bad("server.engine_stats.timeout (%s) must not be longer than server.engine_stats.interval (%s): a hung engine would delay every engine's next scrape", s.Timeout, s.Interval)
	}
	if s.MaxAge <= 0 {
		bad("server.engine_stats.max_age must be > 0, got %s", s.MaxAge)
	} else if s.Interval > 0 && s.MaxAge <= s.Interval {
		bad("server.engine_stats.max_age (%s) must be longer than server.engine_stats.interval (%s): stats would expire before the next scrape could renew them", s.MaxAge, s.Interval)
	}
	if u, err := url.Parse(s.Path); s.Path == "" || err != nil || !strings.HasPrefix(s.Path, "/") || u.Host != "" || u.RawQuery != "" || u.Fragment != "" {
		bad("server.engine_stats.path must be a path starting with /, such as /metrics, got %q", s.Path)
	}
	return errors.Join(errs...)
}

// Validate reports every problem with one engine's configuration, each
// wrapping [ErrInvalidConfig], joined with errors.Join. No message shows
// the URL's credentials.
func (e EngineConfig) Validate() error {
	var errs []error
	bad := badf(&errs)
	if e.Name == "" {
		bad("engine name must not be empty")
	}
	if e.MaxInFlight < 0 {
		bad("engine %q: max_in_flight must be >= 0, got %d", e.Name, e.MaxInFlight)
	}
	u, err := url.Parse(e.URL)
	switch {
	case e.URL == "" && defaultProviderURL[e.Provider] != "":
		// A provider with a well-known URL: its default applies.
	case e.URL == "":
		bad("engine %q: url must not be empty", e.Name)
	case !strings.Contains(e.URL, "://"):
		// 127.0.0.1:8001 fails to parse and localhost:8001 parses with
		// the scheme "localhost": say what is missing. Not the URL
		// itself: it may hold a password.
		bad("engine %q: url needs http:// or https:// before the host", e.Name)
	case err != nil:
		// Not err itself: it quotes the URL, or part of it, credentials
		// included.
		bad("engine %q: url is not a valid URL (a user name or password in it must be percent-encoded)", e.Name)
	case strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") || strings.Contains(u.Opaque, "@"):
		// http://user:pa/ss@host parses with host "user:pa" and the
		// password in the path: refuse rather than show it anywhere.
		bad("engine %q: url has an @ after its host (a user name or password in it must be percent-encoded)", e.Name)
	case u.Scheme != "http" && u.Scheme != "https":
		bad("engine %q: url scheme must be http or https, got %q", e.Name, u.Scheme)
	case u.Host == "":
		bad("engine %q: url has no host", e.Name)
	}
	if n := btoi(e.APIKey != "") + btoi(e.APIKeyEnv != "") + btoi(e.APIKeyFile != ""); n > 1 {
		bad("engine %q: set one of api_key, api_key_env and api_key_file", e.Name)
	}
	for _, m := range e.Models {
		if strings.TrimSpace(m) == "" {
			bad("engine %q: empty model name", e.Name)
		}
	}
	if _, err := ParseRole(e.Role); err != nil {
		bad("engine %q: role: %v", e.Name, err)
	}
	if e.Group != strings.TrimSpace(e.Group) {
		bad("engine %q: group %q has leading or trailing spaces", e.Name, e.Group)
	}
	if err := checkZMQEndpoint(e.KVEvents); err != nil {
		bad("engine %q: kv_events: %v", e.Name, err)
	}
	if err := checkZMQEndpoint(e.KVEventsReplay); err != nil {
		bad("engine %q: kv_events_replay: %v", e.Name, err)
	}
	if e.KVEventsReplay != "" && e.KVEvents == "" {
		bad("engine %q: kv_events_replay needs kv_events", e.Name)
	}
	if e.Tier != nil && *e.Tier < 0 {
		bad("engine %q: tier must be >= 0, got %d", e.Name, *e.Tier)
	}
	if e.MaxQueueDepth < 0 {
		bad("engine %q: max_queue_depth must be >= 0, got %d", e.Name, e.MaxQueueDepth)
	}
	for from, to := range e.ModelMap {
		if strings.TrimSpace(from) == "" || strings.TrimSpace(to) == "" {
			bad("engine %q: model_map has an empty model name", e.Name)
		}
	}
	e.validateProvider(bad)
	return errors.Join(errs...)
}
