package enginesim

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The values of ProviderConfig.Kind.
const (
	// ProviderOpenAI is OpenAI's API (api.openai.com): Bearer keys, OpenAI's error bodies
	// and x-ratelimit-* headers.
	ProviderOpenAI = "openai"
	// ProviderAzure is Azure OpenAI: api-key keys, deployment paths with api-version,
	// Azure's error bodies and OpenAI's x-ratelimit-* headers.
	ProviderAzure = "azure"
	// ProviderAnthropic is Anthropic's API (api.anthropic.com): /v1/messages with x-api-key
	// and anthropic-version, the OpenAI-compatible endpoints with a Bearer key, Anthropic's
	// error bodies and anthropic-ratelimit-* headers.
	ProviderAnthropic = "anthropic"
)

// ProviderConfig turns an engine into a hosted provider as a gateway sees one (see Hosted
// providers in the package documentation). The zero value is off.
type ProviderConfig struct {
	// Kind is [ProviderOpenAI], [ProviderAzure], [ProviderAnthropic] or "" (off: the engine
	// is a plain vLLM engine and the other fields must be zero).
	Kind string
	// Key is the API key every request must carry (required with a Kind). It never
	// appears in a response.
	Key string
	// Models maps a provider model name (OpenAI's and Anthropic's model field, Azure's
	// deployment name) to the served model (one of Config.Models) it runs on. Requests
	// name the provider's model and the response echoes it; with a non-empty map no other
	// name (served model or adapter) is accepted. Default none: requests name served models.
	Models map[string]string
	// RequestsPerMinute is the provider's request rate limit, in requests per fixed
	// one-minute window that starts at the window's first request (read on the engine's
	// clock). Every authenticated answer carries the provider's rate-limit headers; a
	// request over the limit gets the provider's 429 with Retry-After. Default 0: none,
	// and no headers.
	RequestsPerMinute int
}

// validate checks p against the served models (Config.Models, or the default model).
func (p ProviderConfig) validate(served map[string]bool) []error {
	var errs []error
	switch p.Kind {
	case "":
		if p.Key != "" || len(p.Models) > 0 || p.RequestsPerMinute != 0 {
			errs = append(errs, fmt.Errorf("enginesim: provider key, models and requests per minute need a provider kind"))
		}
		return errs
	case ProviderOpenAI, ProviderAzure, ProviderAnthropic:
	default:
		return append(errs, fmt.Errorf("enginesim: provider kind must be %q, %q, %q or empty, got %q",
			ProviderOpenAI, ProviderAzure, ProviderAnthropic, p.Kind))
	}
	if p.Key == "" {
		errs = append(errs, fmt.Errorf("enginesim: provider %s needs a key", p.Kind))
	}
	if p.RequestsPerMinute < 0 {
		errs = append(errs, fmt.Errorf("enginesim: provider requests per minute must not be negative, got %d", p.RequestsPerMinute))
	}
	for name, m := range p.Models {
		if name == "" || strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("enginesim: provider model name %q is empty or has a slash", name))
		}
		if !served[m] {
			errs = append(errs, fmt.Errorf("enginesim: provider model %q: %q is not one of the served models (add it to Config.Models, enginesim --model)", name, m))
		}
	}
	return errs
}

// provider is the middleware of provider mode, in front of the engine's routes.
type provider struct {
	cfg  ProviderConfig
	now  func() time.Time
	next http.Handler

	mu    sync.Mutex
	start time.Time // the rate window's start; zero before the first request
	used  int       // requests admitted in the window
}

// rateWindow is the length of the rate-limit window.
const rateWindow = time.Minute

// Error texts of provider mode. OpenAI: https://platform.openai.com/docs/guides/error-codes
// (401 "Invalid Authentication" / "Incorrect API key provided", 429 "Rate limit reached for
// requests") and https://platform.openai.com/docs/guides/rate-limits (the x-ratelimit-*
// headers). Azure OpenAI:
// https://learn.microsoft.com/en-us/azure/ai-services/openai/reference (the deployment
// paths, the required api-version query parameter and the api-key header; Azure's errors
// are {"error":{"code":"...","message":"..."}}). Anthropic:
// https://docs.anthropic.com/en/api/errors (the error envelope and types),
// https://docs.anthropic.com/en/api/versioning (anthropic-version is required),
// https://docs.anthropic.com/en/api/rate-limits (the anthropic-ratelimit-* headers, reset
// in RFC 3339) and https://docs.anthropic.com/en/api/openai-sdk (the OpenAI-compatible
// endpoints, keyed with a Bearer key).
const (
	// The OpenAI message leaves out the masked key OpenAI puts after "provided", so that no
	// part of a key ever appears in a body.
	openAIBadKey      = "Incorrect API key provided. You can find your API key at https://platform.openai.com/account/api-keys."
	azureBadKey       = "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."
	anthropicBadKey   = "invalid x-api-key"
	anthropicNoVer    = "anthropic-version: header is required"
	azureNotFound     = "Resource not found"
	azureNoDeployment = "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again."
)

// newProvider returns the provider middleware for cfg around next, or next when
// provider mode is off.
func newProvider(cfg ProviderConfig, now func() time.Time, next http.Handler) http.Handler {
	if cfg.Kind == "" {
		return next
	}
	return &provider{cfg: cfg, now: now, next: next}
}

// azureOps are the Azure deployment operations and the engine routes they run on.
var azureOps = map[string]string{
	"chat/completions": "/v1/chat/completions",
	"completions":      "/v1/completions",
	"embeddings":       "/v1/embeddings",
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if path == "/health" || path == "/metrics" {
		// The simulator's own probes: not part of a provider's API, never keyed.
		p.next.ServeHTTP(w, r)
		return
	}
	messages := p.cfg.Kind == ProviderAnthropic && (path == "/v1/messages" || path == "/v1/messages/count_tokens")
	if !p.authorized(r, messages) {
		p.writeError(w, messages, http.StatusUnauthorized, "")
		return
	}
	if messages && r.Header.Get("anthropic-version") == "" {
		p.writeError(w, true, http.StatusBadRequest, anthropicNoVer)
		return
	}
	if p.cfg.Kind == ProviderAzure {
		var ok bool
		if r, ok = p.azureRequest(w, r); !ok {
			return
		}
	}
	if p.cfg.RequestsPerMinute > 0 && !p.admit(w, messages) {
		return
	}
	p.next.ServeHTTP(w, r)
}

// authorized reports whether r carries the key where the provider wants it.
func (p *provider) authorized(r *http.Request, messages bool) bool {
	var got string
	switch {
	case p.cfg.Kind == ProviderAzure:
		got = r.Header.Get("api-key")
	case messages:
		got = r.Header.Get("x-api-key")
	default:
		bearer, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch {
		case ok:
			got = bearer
		case p.cfg.Kind == ProviderAnthropic:
			got = r.Header.Get("x-api-key") // Anthropic's compatible endpoints take either
		}
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(p.cfg.Key)) == 1
}

// azureRequest maps an Azure deployment request onto the engine's route: it answers 404
// (Azure's "Resource not found") for another path or a missing api-version, Azure's
// DeploymentNotFound for an unknown deployment, and otherwise returns r on the engine's
// route with the deployment name as the body's model field.
func (p *provider) azureRequest(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/openai/deployments/")
	deployment, op, _ := strings.Cut(rest, "/")
	route := azureOps[op]
	if !ok || deployment == "" || route == "" || r.URL.Query().Get("api-version") == "" {
		p.writeError(w, false, http.StatusNotFound, azureNotFound)
		return nil, false
	}
	if _, ok := p.cfg.Models[deployment]; !ok && len(p.cfg.Models) > 0 {
		writeAzureError(w, http.StatusNotFound, "DeploymentNotFound", azureNoDeployment)
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeAzureError(w, http.StatusRequestEntityTooLarge, "413", err.Error())
		return nil, false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) == nil && fields != nil {
		// An invalid body goes on unchanged, for the engine's own 400.
		fields["model"], _ = json.Marshal(deployment)
		body, _ = json.Marshal(fields)
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = route, ""
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return r2, true
}

// admit counts r in the rate window and sets the rate-limit headers; over the limit it
// writes the provider's 429 and returns false.
func (p *provider) admit(w http.ResponseWriter, messages bool) bool {
	now := p.now()
	limit := p.cfg.RequestsPerMinute
	p.mu.Lock()
	if p.start.IsZero() || now.Sub(p.start) >= rateWindow || now.Before(p.start) {
		p.start, p.used = now, 0
	}
	ok := p.used < limit
	if ok {
		p.used++
	}
	remaining, reset := limit-p.used, p.start.Add(rateWindow).Sub(now)
	p.mu.Unlock()

	h := w.Header()
	if p.cfg.Kind == ProviderAnthropic {
		h.Set("anthropic-ratelimit-requests-limit", strconv.Itoa(limit))
		h.Set("anthropic-ratelimit-requests-remaining", strconv.Itoa(remaining))
		h.Set("anthropic-ratelimit-requests-reset", now.Add(reset).UTC().Format(time.RFC3339))
	} else {
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(limit))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(remaining))
		h.Set("x-ratelimit-reset-requests", reset.Round(time.Millisecond).String())
	}
	if ok {
		return true
	}
	secs := int((reset + time.Second - 1) / time.Second) // rounded up: retrying then succeeds
	h.Set("Retry-After", strconv.Itoa(secs))
	var msg string
	switch {
	case p.cfg.Kind == ProviderAzure:
		msg = fmt.Sprintf("Requests to the Azure OpenAI API have exceeded the call rate limit of %d requests per minute. Please retry after %d seconds.", limit, secs)
	case messages:
		msg = fmt.Sprintf("This request would exceed your organization's rate limit of %d requests per minute. Please retry after %d seconds.", limit, secs)
	default:
		msg = fmt.Sprintf("Rate limit reached for requests on requests per min (RPM): Limit %d, Used %d, Requested 1. Please try again in %ds.", limit, limit, secs)
	}
	p.writeError(w, messages, http.StatusTooManyRequests, msg)
	return false
}

// writeError writes the provider's error for status (401 and 429 in the provider's own
// words; msg "" for the 401's). messages selects Anthropic's envelope on Anthropic's
// /v1/messages routes; Anthropic's OpenAI-compatible routes answer in OpenAI's.
func (p *provider) writeError(w http.ResponseWriter, messages bool, status int, msg string) {
	switch {
	case p.cfg.Kind == ProviderAzure:
		if status == http.StatusUnauthorized {
			msg = azureBadKey
		}
		writeAzureError(w, status, strconv.Itoa(status), msg)
	case messages:
		typ := anthropicErrorType(status)
		if status == http.StatusUnauthorized {
			msg = anthropicBadKey
		}
		writeProviderJSON(w, status, anthropicError{Type: "error", Error: anthropicErrorInfo{Type: typ, Message: msg}})
	default:
		typ, code := "requests", "rate_limit_exceeded"
		if status == http.StatusUnauthorized {
			typ, code, msg = "invalid_request_error", "invalid_api_key", openAIBadKey
		}
		writeProviderJSON(w, status, openAIProviderError{Error: openAIProviderErrorInfo{Message: msg, Type: typ, Code: code}})
	}
}

// openAIProviderError is OpenAI's error envelope, whose code is a string:
// {"error":{"message":"...","type":"...","param":null,"code":"..."}}.
type openAIProviderError struct {
	Error openAIProviderErrorInfo `json:"error"`
}

type openAIProviderErrorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// azureError is Azure OpenAI's error envelope: {"error":{"code":"...","message":"..."}}.
type azureError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeAzureError(w http.ResponseWriter, status int, code, msg string) {
	var b azureError
	b.Error.Code, b.Error.Message = code, msg
	writeProviderJSON(w, status, b)
}

// writeProviderJSON writes v as a complete JSON response with status.
func writeProviderJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v) // plain structs of strings: no error
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// NewTestTLS returns a TLS certificate for 127.0.0.1, ::1 and localhost, valid for 24
// hours from now, and the PEM of the self-signed CA that signed it, for serving the
// simulator (or any test server) over HTTPS: put cert in a tls.Config's Certificates
// (with NextProtos "h2" for HTTP/2) and caPEM in the client's RootCAs. Both keys are ECDSA
// P-256, new on every call; cert's chain is the leaf then the CA. It returns an error only
// when the system's random source fails.
func NewTestTLS() (cert tls.Certificate, caPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	notBefore := time.Now().Add(-time.Minute) // tolerate a little clock skew
	notAfter := notBefore.Add(24 * time.Hour)
	serial := func() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) }
	caSerial, err := serial()
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: "enginesim test CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leafSerial, err := serial()
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: leafSerial,
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert = tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: leafKey, Leaf: leaf}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}
