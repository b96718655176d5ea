package gateway

import (
	"net/http"
	"strings"
)

// hopByHop are the headers RFC 9110 section 7.6.1 says a proxy must not
// forward, plus the Proxy-* family (docs/cases.md L19).
var hopByHop = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Proxy-Connection":    true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// StrippedRequestHeaders are the client headers that never reach an
// engine: the client's credentials for the gateway or for OpenAI (an engine
// gets its own configured key or none) and cookies. Config.
// StripRequestHeaders adds to them; hop-by-hop headers are dropped too.
var StrippedRequestHeaders = []string{
	"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key",
	"OpenAI-Organization", "OpenAI-Project",
}

// replacedRequestHeaders are end-to-end headers the gateway sets itself
// rather than forwards: framing the transport recomputes, the encoding
// (streams must reach the gateway uncompressed to be parsed), the trace
// context, the request id and the forwarding headers (setForwarded).
var replacedRequestHeaders = []string{
	"Content-Length", "Accept-Encoding", "Host", "Traceparent", "Tracestate", "Baggage",
	"X-Request-Id",
	"Expect", // the body is already read; no 100-continue round trip
	hdrXFF, hdrXFP, hdrXFH,
}

// hiddenResponseHeaders are engine response headers that identify the
// engine's software and never reach clients.
var hiddenResponseHeaders = map[string]bool{
	"Server":       true,
	"X-Powered-By": true,
	"X-Request-Id": true, // the gateway's own is already set
	// The gateway names the engine itself; an engine must not overwrite it.
	"X-Switchboard-Engine": true,
	FallbackHeader:         true, // nor claim a fallback
}

// notToEngine builds the set of request headers (canonical form) that are
// never copied to an engine: the built-in lists plus extra.
func notToEngine(extra []string) map[string]bool {
	m := make(map[string]bool, len(StrippedRequestHeaders)+len(replacedRequestHeaders)+len(extra))
	for _, list := range [][]string{StrippedRequestHeaders, replacedRequestHeaders, trustedOnlyHeaders, extra} {
		for _, k := range list {
			m[http.CanonicalHeaderKey(strings.TrimSpace(k))] = true
		}
	}
	return m
}

// connectionListed reports whether the Connection header values of h name
// key (case-insensitively).
func connectionListed(h http.Header, key string) bool {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), key) {
				return true
			}
		}
	}
	return false
}

// skipHeader reports whether key (canonical form) must not cross the proxy.
func skipHeader(h http.Header, key string) bool {
	if hopByHop[key] || strings.HasPrefix(key, "Proxy-") {
		return true
	}
	return len(h["Connection"]) > 0 && connectionListed(h, key)
}

// copyRequestHeaders copies the client's headers that may reach an engine:
// all but those in skip and the hop-by-hop ones. Value slices are shared,
// not copied: neither side mutates them.
func copyRequestHeaders(dst, src http.Header, skip map[string]bool) {
	for k, vv := range src {
		if skip[k] || skipHeader(src, k) {
			continue
		}
		dst[k] = vv
	}
}

// copyResponseHeaders copies an engine's response headers that may reach
// the client: all but hop-by-hop and engine-identifying ones
// (hiddenResponseHeaders). Content-Length is dropped too when the body is
// re-framed.
//
// When the request's key is limited (its x-ratelimit-* headers are set),
// the engine's own x-ratelimit-* headers (an OpenAI-compatible upstream, a
// gateway tier behind this one) are dropped: the client reads its key's.
func copyResponseHeaders(dst, src http.Header, dropLength bool) {
	_, limitedR := dst["X-Ratelimit-Limit-Requests"]
	_, limitedT := dst["X-Ratelimit-Limit-Tokens"]
	keyed := limitedR || limitedT
	for k, vv := range src {
		if skipHeader(src, k) || (dropLength && k == "Content-Length") || hiddenResponseHeaders[k] ||
			keyed && len(k) > 12 && k[:12] == "X-Ratelimit-" {
			continue
		}
		dst[k] = vv
	}
}
