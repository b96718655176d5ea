package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// trustedProxies is the parsed server.trusted_proxies list.
type trustedProxies []netip.Prefix

// parseTrustedProxies parses CIDRs ("10.0.0.0/8", "fd00::/8") and single
// addresses ("192.0.2.7", taken as /32 or /128). Errors name the bad entry.
func parseTrustedProxies(list []string) (trustedProxies, error) {
	out := make(trustedProxies, 0, len(list))
	for _, s := range list {
		s = strings.TrimSpace(s)
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("%q is not an IP address or CIDR", s)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address or CIDR", s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// trusts reports whether addr is one of the trusted proxies (an IPv6 zone
// is ignored).
func (t trustedProxies) trusts(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	for _, p := range t {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// The X-Forwarded-* request headers the gateway sets.
const (
	hdrXFF = "X-Forwarded-For"
	hdrXFP = "X-Forwarded-Proto"
	hdrXFH = "X-Forwarded-Host"
)

// trustedOnlyHeaders are other headers that claim a client's origin or the
// path it came by; they reach an engine only from a trusted proxy.
var trustedOnlyHeaders = []string{
	"Forwarded", "X-Real-Ip", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server",
	"X-Original-Forwarded-For", "X-Client-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip",
}

// setForwarded sets the X-Forwarded-For, X-Forwarded-Proto and
// X-Forwarded-Host headers of an engine request dst for the client request
// r, the way Caddy and Envoy (use_remote_address) do: when the peer is a
// trusted proxy, its X-Forwarded-For is extended with the peer address and
// its X-Forwarded-Proto and X-Forwarded-Host and the trustedOnlyHeaders
// are kept; otherwise every one of them is dropped and X-Forwarded-For is
// the peer address alone, so a client cannot forge its origin through them. dst must not already hold r's forwarding
// headers (copyRequestHeaders leaves them out).
func (t trustedProxies) setForwarded(dst http.Header, r *http.Request) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	fwdHost := r.Host
	if len(t) > 0 {
		if peer, perr := netip.ParseAddr(host); perr == nil && t.trusts(peer) {
			for _, k := range trustedOnlyHeaders {
				if v, ok := r.Header[k]; ok {
					dst[k] = v
				}
			}
			if prior := r.Header.Values(hdrXFF); len(prior) > 0 {
				host = strings.Join(prior, ", ") + ", " + host
			}
			if v := r.Header.Get(hdrXFP); v != "" {
				proto = v
			}
			if v := r.Header.Get(hdrXFH); v != "" {
				fwdHost = v
			}
		}
	}
	// One backing array for the three values: one allocation, not three.
	vals := [...]string{host, proto, fwdHost}
	vs := make([]string, 3)
	copy(vs, vals[:])
	if host != "" {
		dst[hdrXFF] = vs[0:1:1]
	}
	dst[hdrXFP] = vs[1:2:2]
	if fwdHost != "" {
		dst[hdrXFH] = vs[2:3:3]
	}
}
