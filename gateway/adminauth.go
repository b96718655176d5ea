package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-gw/switchboard/telemetry"
)

// The values of AdminAuthConfig.Reads.
const (
	// AdminReadsOpen: the admin listener's reads (GET and HEAD: /metrics,
	// /admin/engines) need no token; /admin/keys, the console's data and
	// /debug/pprof need one whenever tokens are configured.
	AdminReadsOpen = "open"
	// AdminReadsToken: they need an admin token too.
	AdminReadsToken = "token"
)

// AdminAuthConfig is the admin listener's authentication (`admin.auth`).
// Every write action (any method but GET and HEAD: drain, undrain, sleep,
// wake_up, LoRA loading, prefix cache reset, the keys API) needs an admin
// token, sent as `Authorization: Bearer <token>`; a read-only token
// (ReadTokensEnv, ReadTokensFile) is refused there with 403. Reads need a
// token, of either kind, when Reads is AdminReadsToken; the console's data
// (/admin/console/...) and the profiles under /debug/pprof need one
// whenever tokens are configured. Tokens are compared in constant time on
// their SHA-256, never logged; failed attempts are counted
// (telemetry.AdminAuthFailuresName) and limited to maxAdminFailures a
// second from one client address (10 times that from all together), past
// which that address's attempts are answered 429 until the next second.
// Non-safe requests a browser sends from another origin are refused with
// 403 cross_origin_request (http.CrossOriginProtection: Sec-Fetch-Site,
// else Origin against Host), so no page elsewhere can drive the admin
// API through an operator's browser, even on a listener with open writes.
// A reload reads the tokens again (one that cannot read them is
// rejected).
type AdminAuthConfig struct {
	// TokensEnv names an environment variable holding the admin tokens,
	// separated by commas, spaces or new lines, each at least
	// minAdminToken characters. Set, it must hold one.
	TokensEnv string `koanf:"tokens_env"`
	// TokensFile names a file holding the admin tokens, one a line (blank
	// lines and lines starting with # ignored), such as a mounted
	// Kubernetes Secret. Set, it must be readable and hold one.
	TokensFile string `koanf:"tokens_file"`
	// ReadTokensEnv and ReadTokensFile hold read-only admin tokens, in the
	// same forms: they open what a token opens for reading (reads under
	// AdminReadsToken, the console's data, pprof) and never a write
	// action, which answers them 403 admin_token_read_only. For
	// dashboards, scrapers and on-call viewers.
	ReadTokensEnv  string `koanf:"read_tokens_env"`
	ReadTokensFile string `koanf:"read_tokens_file"`
	// Reads is AdminReadsOpen (the default: a Prometheus scrape needs no
	// token) or AdminReadsToken.
	Reads string `koanf:"reads"`
	// OpenWrites lets write actions through without a token while no
	// token is configured: the admin listener as it was before admin
	// tokens, for one only trusted hosts reach (the demo's loopback).
	// Default false: without tokens, write actions are refused (403).
	OpenWrites bool `koanf:"open_writes"`
	// AllowedHosts are the host names (the request's Host, its port
	// ignored, case-insensitive) the listener answers under open writes
	// (OpenWrites with no token), besides IP addresses and localhost:
	// anything else is refused 403 admin_host_not_allowed, so a web page
	// that rebinds its own name to the listener's address (DNS
	// rebinding) cannot drive it through an operator's browser.
	AllowedHosts []string `koanf:"allowed_hosts"`
}

// allowedAdminHost reports whether host (a request's Host, with or
// without a port) is an IP address, localhost or one of allowed.
func allowedAdminHost(host string, allowed []string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(host, a) {
			return true
		}
	}
	return false
}

// minAdminToken is the shortest admin token accepted, in characters: a
// random one of that length cannot be guessed at maxAdminFailures a
// second, whatever number of replicas answer.
const minAdminToken = 24

// maxAdminFailures is how many failed admin authentications a second the
// gateway answers; past it every attempt gets 429 until the next second,
// so a token cannot be guessed faster.
const maxAdminFailures = 10

// validate checks c's fields, not its tokens (adminTokens reads them).
func (c AdminAuthConfig) validate() error {
	switch c.Reads {
	case "", AdminReadsOpen, AdminReadsToken:
	default:
		return fmt.Errorf("%w: admin.auth.reads must be %q or %q, got %q", ErrInvalidConfig, AdminReadsOpen, AdminReadsToken, c.Reads)
	}
	if c.Reads == AdminReadsToken && c.TokensEnv == "" && c.TokensFile == "" && c.ReadTokensEnv == "" && c.ReadTokensFile == "" {
		return fmt.Errorf("%w: admin.auth.reads %q needs admin tokens (admin.auth.tokens_env, tokens_file, read_tokens_env or read_tokens_file)", ErrInvalidConfig, AdminReadsToken)
	}
	return nil
}

// adminTokens are the SHA-256 digests of the admin tokens in use.
type adminTokens struct {
	write [][32]byte // every action
	read  [][32]byte // reads only
}

// count is how many tokens there are, of both kinds.
func (t adminTokens) count() int { return len(t.write) + len(t.read) }

// adminTokens reads c's tokens and returns their digests; none when c
// configures no source. Errors (wrapping ErrInvalidConfig) name the
// setting, the variable or the file, never a token.
func (c AdminAuthConfig) adminTokens() (adminTokens, error) {
	var t adminTokens
	var err error
	if t.write, err = readAdminTokens("tokens", c.TokensEnv, c.TokensFile); err != nil {
		return adminTokens{}, err
	}
	if t.read, err = readAdminTokens("read_tokens", c.ReadTokensEnv, c.ReadTokensFile); err != nil {
		return adminTokens{}, err
	}
	return t, nil
}

// readAdminTokens reads the tokens of admin.auth.<kind>_env (the variable
// env) and <kind>_file (file) and returns their digests.
func readAdminTokens(kind, env, file string) ([][32]byte, error) {
	var raw []string
	nEnv := 0
	if env != "" {
		toks := strings.FieldsFunc(os.Getenv(env), func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' })
		if len(toks) == 0 {
			return nil, fmt.Errorf("%w: admin.auth.%s_env: %s is unset or holds no token", ErrInvalidConfig, kind, env)
		}
		raw = append(raw, toks...)
		nEnv = len(toks)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("%w: admin.auth.%s_file %s cannot be read", ErrInvalidConfig, kind, file)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				raw = append(raw, line)
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%w: admin.auth.%s_file %s holds no token", ErrInvalidConfig, kind, file)
		}
	}
	out := make([][32]byte, len(raw))
	for i, t := range raw {
		if len(t) < minAdminToken {
			where := fmt.Sprintf("token %d of admin.auth.%s_env (%s)", i+1, kind, env)
			if i >= nEnv {
				where = fmt.Sprintf("token %d of admin.auth.%s_file (%s)", i+1-nEnv, kind, file)
			}
			return nil, fmt.Errorf("%w: admin %s is %d characters long, shorter than %d: make a random one (openssl rand -hex 24)",
				ErrInvalidConfig, where, len(t), minAdminToken)
		}
		out[i] = sha256.Sum256([]byte(t))
	}
	return out, nil
}

// adminGate is the admin listener's token check: the digests of the
// tokens in use (swapped by a reload) and the failure limiter.
type adminGate struct {
	mu     sync.Mutex
	tokens adminTokens
	second int64          // the Unix second failures are counted in
	fails  int            // this second's failures, from every client
	byPeer map[string]int // this second's failures by client address (at most maxAdminPeers)
}

// maxAdminPeers bounds adminGate's per-address counts in one second: past
// it new addresses share the global count alone.
const maxAdminPeers = 4096

// swap installs tokens and reports whether they differ from those in
// force (a rotation).
func (g *adminGate) swap(tokens adminTokens) (changed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	changed = !slices.Equal(g.tokens.write, tokens.write) || !slices.Equal(g.tokens.read, tokens.read)
	g.tokens = tokens
	return changed
}

// set installs tokens.
func (g *adminGate) set(tokens adminTokens) {
	g.mu.Lock()
	g.tokens = tokens
	g.mu.Unlock()
}

// The kinds of admin token adminGate.check finds.
const (
	adminNone  = iota // no token of either kind
	adminRead         // a read-only token
	adminWrite        // a token for every action
)

// check reports which kind of token presented, sent from the client
// address peer, is (adminNone, adminRead, adminWrite), comparing its
// digest with every token in constant time. limited is set, and nothing
// compared, when peer has spent its maxAdminFailures failures this second,
// or every client together maxAdminFailures x 10: a flood from one
// address does not lock out an admin calling from another, and no number
// of addresses guesses faster than the global count allows. A failure is
// counted here.
func (g *adminGate) check(presented, peer string, now time.Time) (kind int, limited bool) {
	d := sha256.Sum256([]byte(presented))
	g.mu.Lock()
	defer g.mu.Unlock()
	sec := now.Unix()
	if sec != g.second || g.byPeer == nil {
		g.second, g.fails = sec, 0
		clear(g.byPeer)
		if g.byPeer == nil {
			g.byPeer = make(map[string]int)
		}
	}
	if g.byPeer[peer] >= maxAdminFailures || g.fails >= 10*maxAdminFailures {
		return adminNone, true
	}
	write, read := 0, 0
	for i := range g.tokens.write {
		write |= subtle.ConstantTimeCompare(d[:], g.tokens.write[i][:])
	}
	for i := range g.tokens.read {
		read |= subtle.ConstantTimeCompare(d[:], g.tokens.read[i][:])
	}
	switch {
	case write == 1:
		return adminWrite, false
	case read == 1:
		return adminRead, false
	}
	g.fails++
	if _, seen := g.byPeer[peer]; seen || len(g.byPeer) < maxAdminPeers {
		g.byPeer[peer]++
	}
	return adminNone, false
}

// configured reports whether any token, of either kind, is installed.
func (g *adminGate) configured() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tokens.count() > 0
}

// consolePath reports whether path is the console's data, which needs a
// token (reads too) whenever tokens are configured, and with none is open
// only under open writes: recent requests and the configuration are more
// than a scrape needs.
func consolePath(path string) bool {
	return strings.HasPrefix(path, "/admin/console/")
}

// keysPath reports whether path is the API keys' list or one key, which
// need a token (reads too) whenever tokens are configured, as pprof does.
func keysPath(path string) bool {
	return path == "/admin/keys" || strings.HasPrefix(path, "/admin/keys/")
}

// adminAuth is the admin listener's middleware (AdminAuthConfig): the
// cross-origin check, then the token check.
func (s *Server) adminAuth(next http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.metrics.RecordAdminAuthFailure(r.Context(), telemetry.AdminAuthCrossOrigin)
		writeError(w, r, &APIError{Status: http.StatusForbidden, Type: TypeInvalidRequest, Code: "cross_origin_request",
			Message: "admin write actions are refused from a page of another origin"})
	}))
	return cop.Handler(s.adminTokenCheck(next))
}

// adminTokenCheck is the token check of adminAuth.
func (s *Server) adminTokenCheck(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cfg := s.set.Load().cfg.AdminAuth
		write := r.Method != http.MethodGet && r.Method != http.MethodHead
		// The profiles (CPU and execution traces cost, goroutine dumps
		// tell) and the API keys need a token whenever tokens are
		// configured; the console's data (recent requests, the
		// configuration) always does, or open writes when none is.
		console := consolePath(r.URL.Path)
		pprof := strings.HasPrefix(r.URL.Path, "/debug/pprof") || keysPath(r.URL.Path)
		open := !s.admin.configured() && cfg.OpenWrites
		if open && !allowedAdminHost(r.Host, cfg.AllowedHosts) {
			// Nothing on this listener asks who calls: a page that
			// rebinds its own name to the listener's address would be
			// same-origin to it. Only names the operator listed, and
			// addresses, are served.
			s.metrics.RecordAdminAuthFailure(r.Context(), telemetry.AdminAuthHost)
			writeError(w, r, &APIError{Status: http.StatusForbidden, Type: TypeInvalidRequest, Code: "admin_host_not_allowed",
				Message: "with open admin writes this listener answers only requests to an IP address, localhost or a name in admin.auth.allowed_hosts"})
			return
		}
		// The console's page and its scripts hold no data: a browser must
		// load them before it can send a token.
		static := !write && (r.URL.Path == "/console" || strings.HasPrefix(r.URL.Path, "/console/"))
		if static || !write && !console && cfg.Reads != AdminReadsToken && !(pprof && s.admin.configured()) {
			next.ServeHTTP(w, r)
			return
		}
		if !s.admin.configured() {
			if open {
				next.ServeHTTP(w, r)
				return
			}
			what := "admin write actions need"
			if !write {
				what = "the console needs"
			}
			writeError(w, r, &APIError{Status: http.StatusForbidden, Type: TypeInvalidRequest, Code: "admin_token_required",
				Message: what + " an admin token, and none is configured: set admin.auth.tokens_env or admin.auth.tokens_file"})
			return
		}
		scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		tok = strings.TrimSpace(tok)
		if !strings.EqualFold(scheme, "Bearer") || tok == "" { // the scheme is case-insensitive (RFC 9110 11.1)
			s.metrics.RecordAdminAuthFailure(r.Context(), telemetry.AdminAuthMissing)
			w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard-admin"`)
			writeError(w, r, &APIError{Status: http.StatusUnauthorized, Type: TypeInvalidRequest, Code: "missing_admin_token",
				Message: "this admin call needs an admin token: Authorization: Bearer <token>"})
			return
		}
		peer, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			peer = r.RemoteAddr
		}
		kind, limited := s.admin.check(tok, peer, time.Now())
		switch {
		case kind == adminWrite || kind == adminRead && !write:
			next.ServeHTTP(w, r)
		case kind == adminRead:
			s.metrics.RecordAdminAuthFailure(r.Context(), telemetry.AdminAuthReadOnly)
			writeError(w, r, &APIError{Status: http.StatusForbidden, Type: TypeInvalidRequest, Code: "admin_token_read_only",
				Message: "this admin token may only read; " + r.Method + " " + r.URL.Path + " needs a token of admin.auth.tokens_env or tokens_file"})
		case limited:
			s.metrics.RecordAdminAuthFailure(r.Context(), telemetry.AdminAuthLimited)
			w.Header().Set("Retry-After", strconv.Itoa(1))
			writeError(w, r, &APIError{Status: http.StatusTooManyRequests, Type: "requests", Code: "admin_auth_rate_limited",
				Message: "too many failed admin authentications this second; retry in 1s"})
		default:
			s.metrics.RecordAdminAuthFailure(r.Context(), telemetry.AdminAuthInvalid)
			w.Header().Set("WWW-Authenticate", `Bearer realm="switchboard-admin", error="invalid_token"`)
			writeError(w, r, &APIError{Status: http.StatusUnauthorized, Type: TypeInvalidRequest, Code: "invalid_admin_token",
				Message: "the admin token is not valid"})
		}
	})
}
