package gateway

import (
	"bytes"
	"embed"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"io/fs"
	"math"
	"net/http"
	"path"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/switchboard-gw/switchboard/routing"
)

// The operator console (docs/console.md): one page on the admin listener,
// embedded in the binary, that reads the JSON endpoints below with the
// admin token and acts through the admin API (engines' drain, undrain,
// sleep and wake_up; keys' create and revoke).
//
//	GET /console                     redirect to /console/
//	GET /console/                    the page (index.html)
//	GET /console/assets/{file}       its script and style sheet
//	GET /admin/console/engines       one compact row per engine (ETag)
//	GET /admin/console/models        each model's 15-minute series
//	GET /admin/console/routing       the policy, prefix index, hit rate, tiers
//	GET /admin/console/requests      the last requests (?key= &model= &limit=)
//	GET /admin/console/config        the effective config, redacted, and reloads
//
// Every console response carries consoleCSP and the headers of
// setConsoleHeaders; the page loads nothing but its own assets, runs no
// inline script or style, and sends the token in the Authorization
// header, never in a URL.

//go:embed console
var consoleFiles embed.FS

// consoleCSP is the page's Content-Security-Policy: its own scripts,
// styles and fetches only, no framing, no forms posting anywhere, no
// <base>.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// setConsoleHeaders sets the security headers every console response
// carries.
func setConsoleHeaders(h http.Header) {
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// consoleAsset is one embedded file, with its content type and ETag.
type consoleAsset struct {
	body  []byte
	ctype string
	etag  string
}

// consoleAssets are the embedded files by name ("index.html",
// "console.js", ...), read once.
var consoleAssets = sync.OnceValue(func() map[string]consoleAsset {
	out := map[string]consoleAsset{}
	_ = fs.WalkDir(consoleFiles, "console", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := consoleFiles.ReadFile(p)
		if err != nil {
			return nil
		}
		h := fnv.New64a()
		_, _ = h.Write(b)
		out[strings.TrimPrefix(p, "console/")] = consoleAsset{body: b, ctype: assetType(p), etag: `"` + hex.EncodeToString(h.Sum(nil)) + `"`}
		return nil
	})
	return out
})

// assetType returns the content type of an embedded file by its extension.
func assetType(name string) string {
	switch path.Ext(name) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	}
	return "text/plain; charset=utf-8"
}

// serveAsset writes the embedded file name, or 404.
func serveAsset(w http.ResponseWriter, r *http.Request, name string, cache string) {
	setConsoleHeaders(w.Header())
	a, ok := consoleAssets()[name]
	if !ok || strings.Contains(name, "..") {
		writeError(w, r, &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found", Message: "no console file " + r.URL.Path})
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("Cache-Control", cache)
	h.Set("ETag", a.etag)
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(a.body)
}

// mountConsole adds the console's page, assets and data endpoints to the
// admin router r.
func (s *Server) mountConsole(r chi.Router) {
	r.Get("/console", func(w http.ResponseWriter, r *http.Request) {
		setConsoleHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	r.Get("/console/", func(w http.ResponseWriter, r *http.Request) {
		serveAsset(w, r, "index.html", "no-store")
	})
	r.Get("/console/assets/{file}", func(w http.ResponseWriter, r *http.Request) {
		// The page names its assets without a version: revalidated on
		// each load (ETag), so a new binary's page never runs an old
		// script.
		serveAsset(w, r, "assets/"+chi.URLParam(r, "file"), "no-cache")
	})
	r.Get("/admin/console/engines", s.consoleEngines)
	r.Get("/admin/console/models", s.consoleModels)
	r.Get("/admin/console/routing", s.consoleRouting)
	r.Get("/admin/console/requests", door(s.consoleRequests))
	r.Get("/admin/console/config", s.consoleConfig)
}

// writeConsoleJSON writes v as the JSON answer of a console endpoint.
func writeConsoleJSON(w http.ResponseWriter, v any) {
	h := w.Header()
	setConsoleHeaders(h)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}

// consoleBufs are the engines endpoint's answer buffers.
var consoleBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// consoleEngines answers GET /admin/console/engines: one compact row per
// engine, written in one pass without encoding/json, and an ETag (the
// answer's hash) so a poll that finds nothing changed gets 304 with no
// body. A row:
//
//	{"name","state","role","tier","prefill","decode","queue","running",
//	 "kv","fresh","ejections","ejected_until","healthy","drained",
//	 "sleeping","provider","last_error"}
//
// state is ready, unhealthy, sleeping, draining or ejected; queue and
// running are the scraped vllm:num_requests_waiting and _running, kv the
// scraped KV-cache usage (0..1), each null without scraped stats (fresh
// says whether they are younger than engine_stats.max_age); ejected_until
// is RFC 3339, null unless ejected.
func (s *Server) consoleEngines(w http.ResponseWriter, r *http.Request) {
	bp := consoleBufs.Get().(*[]byte)
	b := s.appendEngines((*bp)[:0])
	h := fnv.New64a()
	_, _ = h.Write(b)
	var sum [8]byte
	etag := `"` + hex.EncodeToString(h.Sum(sum[:0])) + `"`
	hd := w.Header()
	setConsoleHeaders(hd)
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		w.WriteHeader(http.StatusNotModified)
	} else {
		hd.Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}
	if cap(b) <= 4<<20 { // a pool keeps no giant buffer
		*bp = b
		consoleBufs.Put(bp)
	}
}

// appendEngines appends the engines endpoint's JSON to b.
func (s *Server) appendEngines(b []byte) []byte {
	b = append(b, `{"live_attempts":`...)
	b = strconv.AppendInt(b, s.live.Load(), 10)
	b = append(b, `,"requests_in_flight":`...)
	b = strconv.AppendInt(b, s.inflight.Load(), 10)
	b = append(b, `,"engines":[`...)
	for i, e := range s.fleet.Status() {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendJSONString(b, e.Name)
		b = append(b, `,"state":`...)
		b = appendJSONString(b, e.State)
		b = append(b, `,"role":`...)
		b = appendJSONString(b, e.Role)
		b = append(b, `,"tier":`...)
		b = strconv.AppendInt(b, int64(e.Tier), 10)
		b = append(b, `,"prefill":`...)
		b = strconv.AppendInt(b, e.Prefill, 10)
		b = append(b, `,"decode":`...)
		b = strconv.AppendInt(b, e.Decode, 10)
		if st := e.Stats; st != nil {
			b = append(b, `,"queue":`...)
			b = strconv.AppendInt(b, st.Waiting, 10)
			b = append(b, `,"running":`...)
			b = strconv.AppendInt(b, st.Running, 10)
			b = append(b, `,"kv":`...)
			if st.KVCacheUsage != nil {
				b = strconv.AppendFloat(b, *st.KVCacheUsage, 'f', 4, 64)
			} else {
				b = append(b, "null"...)
			}
			b = append(b, `,"fresh":`...)
			b = strconv.AppendBool(b, st.Fresh)
		} else {
			b = append(b, `,"queue":null,"running":null,"kv":null,"fresh":false`...)
		}
		b = append(b, `,"ejections":`...)
		b = strconv.AppendInt(b, int64(e.Ejections), 10)
		b = append(b, `,"ejected_until":`...)
		if e.EjectedUntil != nil {
			b = append(b, '"')
			b = e.EjectedUntil.UTC().AppendFormat(b, time.RFC3339)
			b = append(b, '"')
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"healthy":`...)
		b = strconv.AppendBool(b, e.Healthy)
		b = append(b, `,"drained":`...)
		b = strconv.AppendBool(b, e.Drained)
		b = append(b, `,"sleeping":`...)
		b = strconv.AppendBool(b, e.Sleeping)
		b = append(b, `,"provider":`...)
		b = appendJSONString(b, e.Provider)
		b = append(b, `,"last_error":`...)
		le := redactString(e.LastError) // a transport error quotes the URL it called
		if len(le) > 200 {
			le = le[:200]
		}
		b = appendJSONString(b, le)
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

// appendJSONString appends s as a JSON string: quotes, backslashes,
// control characters and <, >, & escaped, invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// jsonFloat is a float64 that encodes NaN as null (a period without a
// sample).
type jsonFloat float64

// MarshalJSON encodes f, NaN or an infinity as null.
func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', 6, 64), nil
}

// consoleModelSeries is one model's series as GET /admin/console/models
// answers it: parallel arrays, one element per period, oldest first.
type consoleModelSeries struct {
	Model string `json:"model"`
	// T are the periods' ends, Unix milliseconds.
	T []int64 `json:"t"`
	// RequestRate and ErrorRate are per second over the period (errors:
	// 5xx answers and streams cut by other than their client).
	RequestRate []jsonFloat `json:"requests_per_second"`
	ErrorRate   []jsonFloat `json:"errors_per_second"`
	// The latency quantiles of the period, in seconds; null when it had
	// no sample. TTFT and end-to-end are per request (the client's),
	// ITL per gap between two content events of a stream.
	TTFTP50 []jsonFloat `json:"ttft_p50"`
	TTFTP99 []jsonFloat `json:"ttft_p99"`
	ITLP50  []jsonFloat `json:"itl_p50"`
	ITLP99  []jsonFloat `json:"itl_p99"`
	E2EP50  []jsonFloat `json:"e2e_p50"`
	E2EP99  []jsonFloat `json:"e2e_p99"`
}

// consoleModels answers GET /admin/console/models:
// {"period_seconds":10,"models":[consoleModelSeries...]}, the models in the
// order they were first served, "other" (the models past the first 32)
// last.
func (s *Server) consoleModels(w http.ResponseWriter, _ *http.Request) {
	out := []consoleModelSeries{}
	for _, ms := range s.console.models.series(time.Now()) {
		n := len(ms.points)
		cs := consoleModelSeries{Model: ms.name, T: make([]int64, n), RequestRate: make([]jsonFloat, n), ErrorRate: make([]jsonFloat, n),
			TTFTP50: make([]jsonFloat, n), TTFTP99: make([]jsonFloat, n), ITLP50: make([]jsonFloat, n), ITLP99: make([]jsonFloat, n),
			E2EP50: make([]jsonFloat, n), E2EP99: make([]jsonFloat, n)}
		for i, p := range ms.points {
			cs.T[i], cs.RequestRate[i], cs.ErrorRate[i] = p.at, jsonFloat(p.reqRate), jsonFloat(p.errRate)
			cs.TTFTP50[i], cs.TTFTP99[i] = jsonFloat(p.ttft50), jsonFloat(p.ttft99)
			cs.ITLP50[i], cs.ITLP99[i] = jsonFloat(p.itl50), jsonFloat(p.itl99)
			cs.E2EP50[i], cs.E2EP99[i] = jsonFloat(p.e2e50), jsonFloat(p.e2e99)
		}
		out = append(out, cs)
	}
	writeConsoleJSON(w, struct {
		Period int                  `json:"period_seconds"`
		Models []consoleModelSeries `json:"models"`
	}{int(modelPeriod / time.Second), out})
}

// consolePrefixIndex is the prefix index of a prefix-aware or scorer
// policy.
type consolePrefixIndex struct {
	Entries  int `json:"entries"`  // in use now
	Capacity int `json:"capacity"` // fixed at start
	Bytes    int `json:"bytes"`    // memory of the table (fixed)
}

// consoleRoutingStatus is GET /admin/console/routing's answer.
type consoleRoutingStatus struct {
	// Policy is the routing policy's config name (routing.*Name).
	Policy string `json:"policy"`
	// PrefixIndex is the policy's index of recently routed prompt
	// blocks; null when the policy keeps none.
	PrefixIndex *consolePrefixIndex `json:"prefix_index"`
	// KVIndex is the index fed by the engines' KV-cache events; null
	// without one.
	KVIndex *kvIndexStatus `json:"kv_index"`
	// PrefixCacheHitRatio is the mean of the engines' own prefix-cache
	// hit ratios (scraped, fresh ones only), 0..1; null when no engine
	// reports one. EnginesReporting is how many do.
	PrefixCacheHitRatio *float64 `json:"prefix_cache_hit_ratio"`
	EnginesReporting    int      `json:"engines_reporting"`
	// Tiers are the tiers' engines and shares of the legs.
	Tiers []TierStatus `json:"tiers"`
}

// policyName returns the config name of policy p, "custom" for a policy
// of another package.
func policyName(p routing.Policy, kvBlocks int) string {
	switch p.(type) {
	case *routing.RoundRobin:
		return routing.RoundRobinName
	case *routing.LeastLoaded:
		return routing.LeastLoadedName
	case *routing.PowerOfTwo:
		return routing.PowerOfTwoName
	case *routing.PrefixAware:
		if kvBlocks > 0 {
			return routing.PrecisePrefixName
		}
		return routing.PrefixAwareName
	case *routing.Scorer:
		return routing.ScorerName
	case *routing.SessionAffinity:
		return routing.SessionAffinityName
	}
	return "custom"
}

// consoleRouting answers GET /admin/console/routing (consoleRoutingStatus).
func (s *Server) consoleRouting(w http.ResponseWriter, _ *http.Request) {
	set := s.set.Load()
	out := consoleRoutingStatus{Policy: policyName(set.policy, set.kvBlocks), KVIndex: s.kvIndexStatus(), Tiers: s.Tiers()}
	if ix, ok := set.policy.(interface{ Index() *routing.PrefixIndex }); ok && ix.Index() != nil {
		x := ix.Index()
		out.PrefixIndex = &consolePrefixIndex{Entries: x.Len(), Capacity: x.Capacity(), Bytes: x.Bytes()}
	}
	var sum float64
	for _, e := range s.fleet.Status() {
		if e.Stats != nil && e.Stats.Fresh && e.Stats.PrefixCacheHitRatio != nil {
			sum += *e.Stats.PrefixCacheHitRatio
			out.EnginesReporting++
		}
	}
	if out.EnginesReporting > 0 {
		v := sum / float64(out.EnginesReporting)
		out.PrefixCacheHitRatio = &v
	}
	writeConsoleJSON(w, out)
}

// consoleRequest is one request as GET /admin/console/requests lists it.
type consoleRequest struct {
	Time      time.Time `json:"time"` // when it ended, UTC
	ID        string    `json:"id"`
	Route     string    `json:"route"`
	Operation string    `json:"operation,omitempty"`
	Key       string    `json:"key,omitempty"`
	Model     string    `json:"model,omitempty"`
	Fallback  string    `json:"fallback,omitempty"`
	Status    int       `json:"status"`
	// Outcome is "ok", else the error.type (or the status code).
	Outcome string `json:"outcome"`
	// Engines are the engines tried, in order (the first 4);
	// Attempts how many attempts were made, Retries how many of them
	// were retries (not continuation legs), Continued the legs that
	// continued a broken generation.
	Engines   []string `json:"engines"`
	Attempts  int      `json:"attempts"`
	Retries   int      `json:"retries"`
	Continued int      `json:"continued"`
	// DurationMS and TTFTMS are milliseconds; TTFTMS null without a
	// first token.
	DurationMS float64  `json:"duration_ms"`
	TTFTMS     *float64 `json:"ttft_ms"`
	// InputTokens and OutputTokens are null when unknown.
	InputTokens  *int64  `json:"input_tokens"`
	OutputTokens *int64  `json:"output_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

// consoleRequests answers GET /admin/console/requests?key=&model=&limit=:
// {"capacity":500,"requests":[consoleRequest...]}, newest first. key
// keeps the requests of that key name, model those whose model contains
// it; limit (1..500, default 200) caps the answer.
func (s *Server) consoleRequests(w http.ResponseWriter, r *http.Request) error {
	setConsoleHeaders(w.Header()) // on an error too
	q := r.URL.Query()
	limit := 200
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > requestRingSize {
			return errBadRequest("limit", "limit must be an integer from 1 to "+strconv.Itoa(requestRingSize))
		}
		limit = n
	}
	entries := s.console.requests.last(limit, q.Get("key"), q.Get("model"))
	out := make([]consoleRequest, len(entries))
	for i := range entries {
		e := &entries[i]
		c := consoleRequest{Time: time.Unix(0, e.at).UTC(), ID: e.id, Route: e.route, Operation: e.operation, Key: e.key, Model: e.model,
			Fallback: e.fallback, Status: int(e.status), Attempts: int(e.attempts), Continued: int(e.continued),
			DurationMS: float64(e.dur.Microseconds()) / 1000, CostUSD: float64(e.costNano) / 1e9,
			Engines: append([]string{}, e.engines[:min(int(e.attempts), maxLoggedEngines)]...)}
		c.Retries = max(c.Attempts-1-c.Continued, 0)
		switch {
		case e.errType != "":
			c.Outcome = e.errType
		case e.status >= 400:
			c.Outcome = strconv.Itoa(int(e.status))
		default:
			c.Outcome = "ok"
		}
		if e.ttft > 0 {
			v := float64(e.ttft.Microseconds()) / 1000
			c.TTFTMS = &v
		}
		if e.inTok >= 0 && e.attempts > 0 {
			in, outTok := e.inTok, e.outTok
			c.InputTokens, c.OutputTokens = &in, &outTok
		}
		out[i] = c
	}
	writeConsoleJSON(w, struct {
		Capacity int              `json:"capacity"`
		Requests []consoleRequest `json:"requests"`
	}{requestRingSize, out})
	return nil
}

// consoleReload is one reload as GET /admin/console/config lists it.
type consoleReload struct {
	Time time.Time `json:"time"`
	// Outcome is "ok" (applied, or nothing to apply) or "rejected".
	Outcome string `json:"outcome"`
	// Changed are the engines added, removed and changed, "routing
	// policy", and the keys of the settings changed; Restart the keys
	// changed that need a restart.
	Changed []string `json:"changed"`
	Restart []string `json:"restart"`
	Error   string   `json:"error,omitempty"`
}

// consoleConfig answers GET /admin/console/config:
// {"config":{...},"reloads":[consoleReload...]}: the configuration in force
// (the last reload's, with the settings that need a restart at their
// running values), every secret-like value replaced by "[redacted]" (see
// redactConfig), and the last 32 reloads, newest first.
func (s *Server) consoleConfig(w http.ResponseWriter, _ *http.Request) {
	reloads := []consoleReload{}
	for _, e := range s.console.reloads.list() {
		c := consoleReload{Time: e.at, Outcome: "ok", Changed: e.changed, Restart: e.restart, Error: redactString(e.errorMsg)}
		if !e.ok {
			c.Outcome = "rejected"
		}
		if c.Changed == nil {
			c.Changed = []string{}
		}
		if c.Restart == nil {
			c.Restart = []string{}
		}
		reloads = append(reloads, c)
	}
	var cfg any = s.set.Load().cfg
	if p := s.console.config.Load(); p != nil {
		cfg = *p
	}
	writeConsoleJSON(w, struct {
		Config  any             `json:"config"`
		Reloads []consoleReload `json:"reloads"`
	}{redactValue(reflect.ValueOf(cfg), "", 0), reloads})
}

// SetConsoleConfig sets the configuration the console's Config panel
// shows in place of the gateway's own section (the Config given to New or
// the last Reload): typically the whole file as loaded, a struct with
// koanf tags, set again after each applied reload. It is redacted as the
// gateway's section is (redactConfig) each time it is served; nil shows
// the gateway's section again. Safe for concurrent use.
func (s *Server) SetConsoleConfig(cfg any) {
	if cfg == nil {
		s.console.config.Store(nil)
		return
	}
	s.console.config.Store(&cfg)
}

// redacted replaces a secret's value.
const redacted = "[redacted]"

// redactConfig returns cfg as a tree of maps, slices and values keyed as
// the YAML file keys them (koanf tags; a field without one by its name in
// snake case), with every secret-like value replaced by "[redacted]": a
// field named api_key, sha256, password, secret or token (or ending so),
// the user info of any URL, and every value of a map whose field names
// headers. The names of environment variables and files holding secrets
// (api_key_env, password_env, tokens_file...) are shown: they are not
// secrets, and say where the secret comes from.
func redactConfig(cfg Config) any {
	return redactValue(reflect.ValueOf(cfg), "", 0)
}

// secretField reports whether a field named name (snake case) holds a
// secret.
func secretField(name string) bool {
	if strings.HasSuffix(name, "_env") || strings.HasSuffix(name, "_file") {
		return false
	}
	for _, s := range []string{"api_key", "apikey", "sha256", "password", "secret", "token", "credential", "private_key"} {
		if name == s || strings.HasSuffix(name, "_"+s) && !strings.HasSuffix(name, "per_"+s) { // not bytes_per_token
			return true
		}
	}
	return name == "tokens" || name == "authorization"
}

// secretKind reports whether a value of type t can hold a secret: text,
// a list or map of texts (timeouts.first_token, a duration, cannot).
func secretKind(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	return t.Kind() == reflect.String || t.Kind() == reflect.Interface || t.Kind() == reflect.Struct || t.Kind() == reflect.Uint8 // []byte
}

// redactValue converts v (under field name, depth levels down) for
// redactConfig.
func redactValue(v reflect.Value, name string, depth int) any {
	if depth > 16 {
		return nil
	}
	if name != "" && secretField(name) && secretKind(v.Type()) {
		if v.IsZero() {
			return ""
		}
		return redacted
	}
	if v.Type() == reflect.TypeFor[time.Duration]() {
		return time.Duration(v.Int()).String()
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return redactValue(v.Elem(), name, depth+1)
	case reflect.Struct:
		out := map[string]any{}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			key, squash := fieldKey(f)
			val := redactValue(v.Field(i), key, depth+1)
			if m, ok := val.(map[string]any); ok && squash {
				for k, x := range m {
					out[k] = x
				}
				continue
			}
			out[key] = val
		}
		return out
	case reflect.Map:
		out := map[string]any{}
		header := strings.Contains(name, "header")
		iter := v.MapRange()
		for iter.Next() {
			k := redactString(toString(iter.Key()))
			if header {
				out[k] = redacted
				continue
			}
			out[k] = redactValue(iter.Value(), "", depth+1)
		}
		return out
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return []any{}
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = redactValue(v.Index(i), "", depth+1)
		}
		return out
	case reflect.String:
		return redactString(v.String())
	case reflect.Bool:
		return v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return v.Uint()
	case reflect.Float32, reflect.Float64:
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil
		}
		return f
	}
	return nil // functions, channels: not configuration
}

// fieldKey returns the key of struct field f as the YAML file spells it,
// and whether its fields belong to the parent (an embedded struct, or a
// ",squash" tag).
func fieldKey(f reflect.StructField) (string, bool) {
	tag := f.Tag.Get("koanf")
	name, opts, _ := strings.Cut(tag, ",")
	squash := f.Anonymous || strings.Contains(opts, "squash")
	if name == "" || name == "-" {
		name = snake(f.Name)
	}
	return name, squash
}

// snake converts a Go field name to snake case ("MaxBodyBytes" ->
// "max_body_bytes", "APIKey" -> "api_key").
func snake(s string) string {
	var b strings.Builder
	rs := []rune(s)
	for i, r := range rs {
		upper := r >= 'A' && r <= 'Z'
		if upper && i > 0 && (!(rs[i-1] >= 'A' && rs[i-1] <= 'Z') || i+1 < len(rs) && rs[i+1] >= 'a' && rs[i+1] <= 'z') {
			b.WriteByte('_')
		}
		if upper {
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// toString returns a map key as a string.
func toString(v reflect.Value) string {
	switch v.Kind() {
	case reflect.String:
		return v.String()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	}
	b, _ := json.Marshal(v.Interface())
	return string(bytes.Trim(b, `"`))
}

// redactString returns s with the user info of a URL in it replaced.
func redactString(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	s = urlUserinfo.ReplaceAllString(s, "${1}"+redacted+"@")
	return secretQuery.ReplaceAllString(s, "${1}"+redacted)
}

// urlUserinfo finds the user information of a URL anywhere in a text
// (scheme://user:password@host), to the last "@" of the URL so that a
// password holding "@", "/" or "#" is covered whole (a path with an "@"
// loses its host too, which a console can spare); secretQuery a query or
// fragment parameter whose name ends in one that carries a secret
// (Google's ?key=, SAS and AWS signatures, X-Amz-Security-Token,
// #access_token=, refresh_token).
var (
	urlUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)[^\s"']+@`)
	secretQuery = regexp.MustCompile(`(?i)([?&#;](?:[a-z0-9_.-]*[-_.])?(?:key|api[-_]?key|apikey|token|auth|sig|signature|password|passwd|pwd|secret|credential|code)=)[^&#\s"']+`)
)
