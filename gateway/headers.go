package gateway

import (
	"net/http"
	"strings"
)

// hopByHop are the headers RFC 9110 section 7.6.1 says a proxy must not
// forward, plus the Proxy-* family (shared/cases L19).
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

// notToEngine are end-to-end headers the gateway replaces rather than
// forwards: the client's credentials and cookies (an engine gets its own
// configured key or none), framing the transport recomputes, the encoding
// (streams must reach the gateway uncompressed to be parsed) and the trace
// context and request id, which the gateway sets itself.
var notToEngine = map[string]bool{
	"Authorization":   true,
	"Cookie":          true,
	"Content-Length":  true,
	"Accept-Encoding": true,
	"Host":            true,
	"Traceparent":     true,
	"Tracestate":      true,
	"Baggage":         true,
	"X-Request-Id":    true,
	"Expect":          true, // the body is already read; no 100-continue round trip
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

// copyRequestHeaders copies the client's headers that may reach an engine.
// Value slices are shared, not copied: neither side mutates them.
func copyRequestHeaders(dst, src http.Header) {
	for k, vv := range src {
		if notToEngine[k] || skipHeader(src, k) {
			continue
		}
		dst[k] = vv
	}
}

// copyResponseHeaders copies an engine's response headers that may reach
// the client. Content-Length is dropped too when the body is re-framed.
func copyResponseHeaders(dst, src http.Header, dropLength bool) {
	for k, vv := range src {
		if skipHeader(src, k) || (dropLength && k == "Content-Length") || k == "X-Request-Id" {
			continue
		}
		dst[k] = vv
	}
}
