package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/telemetry"
)

// The values of EngineConfig.Provider other than a self-hosted engine's
// ("" or ProviderVLLM).
const (
	// ProviderVLLM is a self-hosted vLLM-compatible server, the default.
	ProviderVLLM = "vllm"
	// ProviderOpenAI is OpenAI's API: Bearer keys, URL
	// https://api.openai.com/v1 by default.
	ProviderOpenAI = "openai"
	// ProviderAzure is Azure OpenAI: the api-key header, deployment paths
	// (/openai/deployments/{deployment}/chat/completions) with an
	// api-version query parameter; URL is the resource endpoint,
	// https://NAME.openai.azure.com.
	ProviderAzure = "azure"
	// ProviderAnthropic is Anthropic's API: /v1/messages with x-api-key
	// and anthropic-version, chat completions through its OpenAI SDK
	// compatibility endpoint (a Bearer key); URL
	// https://api.anthropic.com/v1 by default.
	ProviderAnthropic = "anthropic"
	// ProviderOpenAICompatible is any server that speaks OpenAI's API
	// with a Bearer key (Groq, Together, Fireworks, Gemini's OpenAI
	// endpoint, a vLLM in another cluster); URL is its base URL, such as
	// https://api.groq.com/openai/v1.
	ProviderOpenAICompatible = "openai-compatible"
)

// DefaultAzureAPIVersion is the api-version sent to Azure OpenAI when the
// engine configures none: the newest GA data-plane version
// (learn.microsoft.com, "Azure OpenAI in Azure AI Foundry Models REST API
// reference", 2024-10-21).
const DefaultAzureAPIVersion = "2024-10-21"

// DefaultAnthropicVersion is the anthropic-version header sent on
// /v1/messages when neither the client nor the engine's configuration
// names one (docs.anthropic.com, "Versions": the current one).
const DefaultAnthropicVersion = "2023-06-01"

// defaultProviderURL is the base URL of the providers that have one.
var defaultProviderURL = map[string]string{
	ProviderOpenAI:    "https://api.openai.com/v1",
	ProviderAnthropic: "https://api.anthropic.com/v1",
}

// wellKnownHosts are gen_ai.provider.name values of the GenAI conventions
// (semantic-conventions v1.41.1, gen-ai registry) for the hosts of
// OpenAI-compatible endpoints.
var wellKnownHosts = map[string]string{
	"api.openai.com":                    "openai",
	"api.anthropic.com":                 "anthropic",
	"api.groq.com":                      "groq",
	"api.deepseek.com":                  "deepseek",
	"api.mistral.ai":                    "mistral_ai",
	"api.x.ai":                          "x_ai",
	"api.perplexity.ai":                 "perplexity",
	"generativelanguage.googleapis.com": "gcp.gemini",
	"api.cohere.com":                    "cohere",
}

// providerOps are the operations (gateway operation names) each hosted
// provider's API serves; every other route skips its engines.
var providerOps = map[string]map[string]bool{
	ProviderOpenAI: set("chat", "completions", "responses", "responses.retrieve", "responses.cancel", "embeddings",
		"audio.transcriptions", "audio.translations", "audio.speech", "images.generations"),
	ProviderAzure:            set("chat", "completions", "embeddings", "audio.transcriptions", "audio.translations", "audio.speech", "images.generations"),
	ProviderAnthropic:        set("messages", "messages.count_tokens", "chat"),
	ProviderOpenAICompatible: set("chat", "completions", "embeddings", "audio.transcriptions", "audio.translations", "audio.speech"),
}

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// IsProvider reports whether kind (an EngineConfig.Provider) is a hosted
// provider's API rather than a self-hosted engine.
func IsProvider(kind string) bool { return kind != "" && kind != ProviderVLLM }

// validateProvider adds e's provider errors to bad.
func (e EngineConfig) validateProvider(bad func(string, ...any)) {
	switch e.Provider {
	case "", ProviderVLLM:
		if e.APIVersion != "" || e.AnthropicVersion != "" {
			bad("engine %q: api_version and anthropic_version are for provider azure and anthropic", e.Name)
		}
		if len(e.ModelMap) > 0 {
			bad("engine %q: model_map is for provider engines (a self-hosted engine serves its models by their names; models.aliases renames for every engine)", e.Name)
		}
		return
	case ProviderOpenAI, ProviderAzure, ProviderAnthropic, ProviderOpenAICompatible:
	default:
		bad("engine %q: provider must be empty (self-hosted), %s, %s, %s, %s or %s, got %q (gen_ai.provider.name is provider_name)",
			e.Name, ProviderVLLM, ProviderOpenAI, ProviderAzure, ProviderAnthropic, ProviderOpenAICompatible, e.Provider)
		return
	}
	if len(e.Models) == 0 && len(e.ModelMap) == 0 {
		bad("engine %q: a provider engine needs models or model_map (its models are not discovered)", e.Name)
	}
	if u, err := url.Parse(e.URL); err == nil && u.Scheme == "http" && e.Provider != ProviderOpenAICompatible {
		bad("engine %q: provider %s needs an https url: its key would cross the network in clear", e.Name, e.Provider)
	}
	if e.Role != "" && e.role() != RoleBoth {
		bad("engine %q: a provider engine takes no prefill/decode role", e.Name)
	}
	if e.KVEvents != "" || e.Group != "" {
		bad("engine %q: a provider engine publishes no KV-cache events and pairs with no engine (kv_events, group)", e.Name)
	}
	if e.APIVersion != "" && e.Provider != ProviderAzure {
		bad("engine %q: api_version is Azure's", e.Name)
	}
	if e.AnthropicVersion != "" && e.Provider != ProviderAnthropic {
		bad("engine %q: anthropic_version is Anthropic's", e.Name)
	}
	if e.MaxQueueDepth > 0 {
		bad("engine %q: max_queue_depth needs the engine's stats, which a provider engine does not publish", e.Name)
	}
}

// baseURL returns the URL the engine is reached at: URL, or the
// provider's default; for openai and anthropic, a URL without a path gets
// /v1 (Anthropic's SDK takes https://api.anthropic.com, OpenAI's
// https://api.openai.com/v1: both mean the same API).
func (e EngineConfig) baseURL() string {
	raw := e.URL
	if raw == "" {
		return defaultProviderURL[e.Provider]
	}
	if e.Provider == ProviderOpenAI || e.Provider == ProviderAnthropic {
		if u, err := url.Parse(raw); err == nil && (u.Path == "" || u.Path == "/") {
			u.Path = "/v1"
			return u.String()
		}
	}
	return raw
}

// tier returns the engine's tier: Tier, or 0 for a self-hosted engine and
// 1 for a provider.
func (e EngineConfig) tier() int {
	switch {
	case e.Tier != nil:
		return *e.Tier
	case IsProvider(e.Provider):
		return 1
	}
	return 0
}

// providerName returns the engine's gen_ai.provider.name.
func (e EngineConfig) providerName(host string) string {
	if e.ProviderName != "" {
		return e.ProviderName
	}
	switch e.Provider {
	case ProviderOpenAI:
		return "openai"
	case ProviderAzure:
		return "azure.ai.openai"
	case ProviderAnthropic:
		return "anthropic"
	case ProviderOpenAICompatible:
		if n, ok := wellKnownHosts[host]; ok {
			return n
		}
		return host
	}
	return telemetry.DefaultProvider
}

// ServesOperation reports whether the engine's API has the gateway
// operation op (its name in the operation table): every one for a
// self-hosted engine, its API's for a provider.
func (e *Engine) ServesOperation(op string) bool {
	if e.prov == nil {
		return true
	}
	return e.prov.ops[op]
}

// provider is a provider engine's fixed request shape.
type provider struct {
	kind             string
	ops              map[string]bool
	apiVersion       string
	anthropicVersion []string
	// rt is the engine's own transport: TLS with its CA, HTTP/2 when
	// offered.
	rt http.RoundTripper
	// until is the end of the back-off a provider's 429 or exhausted
	// rate-limit headers asked for, in Unix nanoseconds; 0 for none.
	until atomic.Int64
	// backoffs counts the back-offs that started while none was on
	// (an extension is not counted), for /admin/engines.
	backoffs atomic.Int64
}

// Provider returns the engine's provider kind (EngineConfig.Provider), ""
// for a self-hosted engine.
func (e *Engine) Provider() string {
	if e.prov == nil {
		return ""
	}
	return e.prov.kind
}

// IsProvider reports whether the engine is a hosted provider's API.
func (e *Engine) IsProvider() bool { return e.prov != nil }

// Tier returns the engine's tier (EngineConfig.Tier, defaulted); a reload
// may change it.
func (e *Engine) Tier() int { return int(e.tier.Load()) }

// closeIdle closes the idle connections of the engine's own transport
// (a provider's, or one with a CAFile), when it leaves the fleet drained
// or the fleet closes: its HTTP/2 connections would otherwise linger for
// their idle timeout.
func (e *Engine) closeIdle() {
	if c, ok := e.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// MaxQueueDepth returns the engine's overflow threshold on its reported
// queue depth (EngineConfig.MaxQueueDepth; 0 for none). A reload may
// change it.
func (e *Engine) MaxQueueDepth() int64 { return e.maxQueue.Load() }

// Transport returns the engine's own round tripper (a provider's, or an
// engine with a CAFile), nil for the gateway's shared one.
func (e *Engine) Transport() http.RoundTripper { return e.rt }

// RequestURL returns the URL of a request to the engine for the client's
// path (a /v1/... route) and query, model being the model the body names
// (after the engine's ModelMap; an Azure deployment). A self-hosted
// engine gets its base URL with path and query appended; a provider its
// API's path for the route (its base URL includes the version: /v1 is
// dropped from path) with the client's query (a stored response's
// stream or include[] parameters); Azure its deployment path, the
// client's query with the engine's api-version in place of any of the
// client's.
func (e *Engine) RequestURL(path, rawQuery, model string) string {
	if e.prov == nil {
		u, ok := e.urls[path]
		if !ok {
			u = e.base + path
		}
		if rawQuery != "" {
			u += "?" + rawQuery
		}
		return u
	}
	rest, ok := strings.CutPrefix(path, "/v1")
	if !ok {
		rest = path
	}
	if e.prov.kind == ProviderAzure {
		q := "api-version=" + url.QueryEscape(e.prov.apiVersion)
		if rawQuery != "" {
			if v, err := url.ParseQuery(rawQuery); err == nil {
				v.Del("api-version")
				if rest := v.Encode(); rest != "" {
					q += "&" + rest
				}
			}
		}
		return e.base + "/openai/deployments/" + url.PathEscape(model) + rest + "?" + q
	}
	if rawQuery != "" {
		return e.base + rest + "?" + rawQuery
	}
	return e.base + rest
}

// SetAuth sets the engine's credentials on an outgoing request's header h
// for the route at path: Authorization (a Bearer key, or Basic credentials
// from its URL) for a self-hosted or OpenAI-style engine, api-key for
// Azure, x-api-key and (unless the client sent one) anthropic-version for
// Anthropic's /v1/messages routes. Any header of the same names the
// client sent is replaced or removed first, so a client's credential
// never reaches a provider and never overrides the gateway's.
func (e *Engine) SetAuth(h http.Header, path string) {
	auth := e.Auth()
	if e.prov == nil {
		if auth != nil {
			h["Authorization"] = auth
		}
		return
	}
	delete(h, "Authorization")
	delete(h, "Api-Key")
	delete(h, "X-Api-Key")
	key := e.key.Load()
	if key == nil {
		if auth != nil {
			h["Authorization"] = auth // Basic credentials from its URL
		}
		return
	}
	switch {
	case e.prov.kind == ProviderAzure:
		h["Api-Key"] = []string{*key}
	case e.prov.kind == ProviderAnthropic && strings.HasPrefix(path, "/v1/messages"):
		h["X-Api-Key"] = []string{*key}
		if len(h["Anthropic-Version"]) == 0 {
			h["Anthropic-Version"] = e.prov.anthropicVersion
		}
	default:
		h["Authorization"] = auth
	}
}

// BackOff keeps the provider engine out of routing until until (a 429's
// Retry-After, or the reset of an exhausted rate limit): its other
// engines, and the next tier, take its requests meanwhile. A later
// deadline than the one set wins. No-op for a self-hosted engine, whose
// 429s are its queue's and left to outlier detection.
func (e *Engine) BackOff(until time.Time) {
	if e.prov == nil {
		return
	}
	n := until.UnixNano()
	for {
		cur := e.prov.until.Load()
		if n <= cur {
			return
		}
		if e.prov.until.CompareAndSwap(cur, n) {
			if cur < time.Now().UnixNano() {
				e.prov.backoffs.Add(1) // a new back-off, not one extended
			}
			return
		}
	}
}

// BackingOff reports whether the engine is in a provider back-off at now
// (BackOff).
func (e *Engine) BackingOff(now time.Time) bool {
	return e.prov != nil && e.prov.until.Load() > now.UnixNano()
}

// maxBackOff caps one provider back-off, whatever a header asked for: a
// provider that wrote an hour's Retry-After is tried again after it
// (outlier detection and its next 429 decide then).
const maxBackOff = 5 * time.Minute

// RateLimitBackOff returns how long a provider's answer asks the gateway
// to wait before sending it more, from its headers: on a 429, Retry-After
// (seconds or an HTTP date, RFC 9110 10.2.3), OpenAI's and Azure's
// retry-after-ms, else the reset of the exhausted limit, else 1 s; on
// another status, the reset of a limit its headers say is exhausted
// (x-ratelimit-remaining-requests or -tokens 0, with OpenAI's
// x-ratelimit-reset-* durations such as "6m0s" or "20ms"; Anthropic's
// anthropic-ratelimit-*-remaining 0 with an RFC 3339 -reset), else 0. The
// result is capped at 5 minutes.
func RateLimitBackOff(status int, h http.Header, now time.Time) time.Duration {
	d := exhaustedReset(h, now)
	if status == http.StatusTooManyRequests {
		if v := h.Get("Retry-After-Ms"); v != "" {
			if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
				d = time.Duration(ms * float64(time.Millisecond))
			}
		} else if v := h.Get("Retry-After"); v != "" {
			if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
				d = time.Duration(s) * time.Second
			} else if t, err := http.ParseTime(v); err == nil {
				d = t.Sub(now)
			}
		}
		if d <= 0 {
			d = time.Second
		}
	}
	return min(max(d, 0), maxBackOff)
}

// exhaustedReset returns the time to the reset of the longest-waiting
// rate limit whose remaining count h says is 0; 0 when none is.
func exhaustedReset(h http.Header, now time.Time) time.Duration {
	var d time.Duration
	for _, kind := range [...]string{"requests", "tokens"} {
		if h.Get("X-Ratelimit-Remaining-"+kind) == "0" {
			if v, err := time.ParseDuration(h.Get("X-Ratelimit-Reset-" + kind)); err == nil {
				d = max(d, v)
			}
		}
		for _, scope := range [...]string{kind, "input-tokens", "output-tokens"} {
			if kind == "requests" && scope != "requests" {
				continue
			}
			if h.Get("Anthropic-Ratelimit-"+scope+"-Remaining") == "0" {
				if t, err := time.Parse(time.RFC3339, h.Get("Anthropic-Ratelimit-"+scope+"-Reset")); err == nil {
					d = max(d, t.Sub(now))
				}
			}
		}
	}
	return d
}

// newProvider builds the request shape of a provider engine, and the
// transport of any engine that needs its own (a provider, a CAFile).
func newProvider(ec EngineConfig, connectTimeout time.Duration) (*provider, http.RoundTripper, error) {
	var rt http.RoundTripper
	if IsProvider(ec.Provider) || ec.CAFile != "" {
		tr, err := engineTransport(ec, connectTimeout)
		if err != nil {
			return nil, nil, err
		}
		rt = tr
	}
	if !IsProvider(ec.Provider) {
		return nil, rt, nil
	}
	p := &provider{kind: ec.Provider, ops: providerOps[ec.Provider], apiVersion: ec.APIVersion, rt: rt,
		anthropicVersion: []string{ec.AnthropicVersion}}
	if p.apiVersion == "" {
		p.apiVersion = DefaultAzureAPIVersion
	}
	if ec.AnthropicVersion == "" {
		p.anthropicVersion = []string{DefaultAnthropicVersion}
	}
	return p, rt, nil
}

// engineTransport returns an engine's own transport: TLS verified against
// its CAFile (or the system's roots), HTTP/2 when the server offers it
// (ALPN), no compression (streams pass through byte for byte), no proxy
// from the environment unless it is a provider (a hosted API is often
// reached through the egress proxy HTTPS_PROXY names).
func engineTransport(ec EngineConfig, connectTimeout time.Duration) (*http.Transport, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ec.CAFile != "" {
		pem, err := os.ReadFile(ec.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: engine %q: ca_file cannot be read: %v", ErrInvalidConfig, ec.Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: engine %q: ca_file %s holds no PEM certificate", ErrInvalidConfig, ec.Name, ec.CAFile)
		}
		tc.RootCAs = pool
	}
	if connectTimeout <= 0 {
		connectTimeout = 5 * time.Second
	}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   connectTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	if IsProvider(ec.Provider) {
		tr.Proxy = http.ProxyFromEnvironment
	}
	return tr, nil
}
