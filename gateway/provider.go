package gateway

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// providerAnswer reads what a provider engine's answer says about the
// provider rather than the request, before the planner sees it:
//
//   - a 429, or rate-limit headers that say a limit is exhausted, back the
//     engine off for the time they give (fleet.RateLimitBackOff), so its
//     model's other engines and the next tier take its requests meanwhile,
//     and the provider is not asked again before it said;
//   - a 401 or 403 is the gateway's credentials refused, not the client's
//     fault: its body (which may quote part of the key: OpenAI's "Incorrect
//     API key provided: sk-...abcd") is dropped, and the leg ends with a
//     502 naming the engine, which the planner treats as a 502 (another
//     engine may hold good credentials); logged at most once a second;
//   - the provider's account headers (cookies, organization and project
//     ids, its rate-limit counts, which describe the gateway's account, not
//     the client's) are removed from the answer the client gets.
//
// done is set when o replaces the answer; backedOff is the back-off the
// answer started (0 for none), which a retry on the same engine waits
// out like a Retry-After (plan.retry).
func (s *Server) providerAnswer(c *call, r *http.Request, resp *http.Response) (o outcome, done bool, backedOff time.Duration) {
	now := time.Now()
	if d := fleet.RateLimitBackOff(resp.StatusCode, resp.Header, now); d > 0 {
		c.eng.BackOff(now.Add(d))
		backedOff = d
	}
	for k := range resp.Header {
		if providerAccountHeader(k) {
			delete(resp.Header, k)
		}
	}
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		return outcome{}, false, backedOff
	}
	c.a.fail(strconv.Itoa(resp.StatusCode)) // the provider's status, as for any engine's non-2xx
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	resp.Body.Close()
	if suppressed, ok := s.providerAuthLog.Allow(now); ok {
		s.log.Error("a provider refused the gateway's credentials (401) or their permissions (403) for an engine; check its key (api_key_env, api_key_file) and what the key may use",
			"engine", c.eng.Name(), "provider", c.eng.Provider(), "status", resp.StatusCode, "suppressed", suppressed)
	}
	return outcome{authFailed: true, err: &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: "provider_auth_failed",
		Message: "the upstream provider of engine " + strconv.Quote(c.eng.Name()) + " refused the gateway's credentials or their permissions"}}, true, backedOff
}

// providerAccountHeader reports whether a provider response header (in
// canonical form) describes the gateway's account at the provider.
func providerAccountHeader(k string) bool {
	switch k {
	case "Set-Cookie", "Openai-Organization", "Openai-Project", "Anthropic-Organization-Id":
		return true
	}
	return strings.HasPrefix(k, "X-Ratelimit-") || strings.HasPrefix(k, "Anthropic-Ratelimit-")
}

// providerDropped are the client request headers never sent to a hosted
// provider: where the client is (the gateway's X-Forwarded-* and
// Forwarded, and any the client sent), and the OpenAI organization or
// project it named, which with the gateway's key would be refused or
// billed elsewhere.
var providerDropped = []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded", "X-Real-Ip",
	"Openai-Organization", "Openai-Project"}

// providerLimited is the client's answer to a provider's 429 that no
// other engine took over: the gateway's own 429 (type "requests", code
// provider_rate_limited) with the provider's Retry-After, else the
// back-off the gateway took from its other headers (backedOff, rounded up
// to whole seconds), in place of the provider's body, which names the
// gateway's account ("... in organization org-...") and whose codes
// (OpenAI's insufficient_quota for an account out of credit) would read
// as the client's own limits.
func providerLimited(w http.ResponseWriter, resp *http.Response, eng *fleet.Engine, backedOff time.Duration) *APIError {
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		w.Header().Set("Retry-After", ra)
	} else if backedOff > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((backedOff+time.Second-1)/time.Second), 10))
	}
	return &APIError{Status: http.StatusTooManyRequests, Type: "requests", Code: "provider_rate_limited",
		Message: "the upstream provider of engine " + strconv.Quote(eng.Name()) + " is rate limiting the gateway; retry later"}
}
