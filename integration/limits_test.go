//go:build integration

package integration

// Tests of the API keys' limits kept in a real Redis (internal/redistest,
// Debian's redis-server on PATH) and shared by two gateway processes: the
// fleet admits what one key's limit allows, not twice that; and a Redis
// that goes away mid-run, stopped or unresponsive, is handled as
// limits.fail_mode says, without a request waiting on it for more than
// limits.redis.timeout, until it is back and the limits apply again.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// The Redis settings of these tests (the shipped defaults): an admission
// waits at most limitsTimeout for Redis; after a failure Redis is asked
// again only after limitsDownFor.
const (
	limitsTimeout = 50 * time.Millisecond
	limitsDownFor = time.Second
	limitsModel   = "it-model"
)

// limitsKey is one configured API key: the secret the client sends and
// the limits configured for its name.
type limitsKey struct {
	name, secret string
	rpm, tpm     int64
}

func newLimitsKey(t *testing.T, name string, rpm, tpm int64) limitsKey {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return limitsKey{name: name, secret: "sk-it-" + name + "-" + hex.EncodeToString(b), rpm: rpm, tpm: tpm}
}

// limitsSetup is what a gateway of these tests is configured with.
type limitsSetup struct {
	engines  []string // engine base URLs
	redis    string   // limits.redis.address
	failMode string
	keys     []limitsKey
}

// yaml is the gateway's config for s, listening on public and admin: no
// access log (one line per request would bury the warnings the tests
// count), the Redis timeouts above.
func (s limitsSetup) yaml(public, admin string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server:\n  listen: %q\n  shutdown_timeout: 2s\nadmin:\n  listen: %q\n", public, admin)
	b.WriteString("routing:\n  policy: round-robin\nlog:\n  level: info\n  access: false\nauth:\n  keys:\n")
	for _, k := range s.keys {
		sum := sha256.Sum256([]byte(k.secret))
		fmt.Fprintf(&b, "    - name: %s\n      sha256: %s\n      models: [\"*\"]\n      limits:\n        requests_per_minute: %d\n        tokens_per_minute: %d\n",
			k.name, hex.EncodeToString(sum[:]), k.rpm, k.tpm)
	}
	fmt.Fprintf(&b, "limits:\n  fail_mode: %s\n  redis:\n    address: %q\n    timeout: %s\n    down_for: %s\n", s.failMode, s.redis, limitsTimeout, limitsDownFor)
	b.WriteString("engines:\n")
	for i, u := range s.engines {
		fmt.Fprintf(&b, "  - name: sim%d\n    url: %s\n    models: [%s]\n", i, u, limitsModel)
	}
	return b.String()
}

// limitsGateway is one gateway process (a replica).
type limitsGateway struct {
	public, admin string
	proc          *proc
}

// startLimitsEngine starts one fast engine simulator and returns its URL.
func startLimitsEngine(t *testing.T) string {
	t.Helper()
	addr := freePort(t)
	start(t, nil, build(t, t.TempDir(), "./cmd/enginesim"), "--listen", addr, "--name", "sim", "--model", limitsModel, "--ttft", "5ms", "--itl", "2ms")
	waitHTTP(t, "http://"+addr+"/health", 200)
	return "http://" + addr
}

// startLimitsGateways starts n gateway processes with the same config s
// and waits until each is ready.
func startLimitsGateways(t *testing.T, n int, s limitsSetup) []*limitsGateway {
	t.Helper()
	bin := build(t, t.TempDir(), "./cmd/gateway")
	gws := make([]*limitsGateway, n)
	for i := range gws {
		g := &limitsGateway{public: freePort(t), admin: freePort(t)}
		path := filepath.Join(t.TempDir(), "gateway.yaml")
		if err := os.WriteFile(path, []byte(s.yaml(g.public, g.admin)), 0o600); err != nil {
			t.Fatal(err)
		}
		g.proc = start(t, []string{"OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_EXPORTER=none"}, bin, "--config", path)
		gws[i] = g
	}
	for _, g := range gws {
		waitHTTP(t, "http://"+g.public+"/ready", 200)
	}
	return gws
}

// keyStatus is one key of GET /admin/keys.
type keyStatus struct {
	Name        string `json:"name"`
	Shared      bool   `json:"shared"`
	Admitted    int64  `json:"admitted"`
	Refused     int64  `json:"refused"`
	Unavailable int64  `json:"unavailable"`
	InFlight    int64  `json:"in_flight"`
	TokensIn    int64  `json:"input_tokens"`
	TokensOut   int64  `json:"output_tokens"`
}

// key returns this replica's GET /admin/keys entry for name.
func (g *limitsGateway) key(t *testing.T, name string) keyStatus {
	t.Helper()
	resp, err := http.Get("http://" + g.admin + "/admin/keys")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Keys []keyStatus `json:"keys"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("GET /admin/keys: %v", err)
	}
	for _, k := range v.Keys {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("GET /admin/keys has no key %q", name)
	return keyStatus{}
}

// metric sums the samples of the Prometheus counter name on this
// replica's admin /metrics whose labels contain label (`result="x"`).
func (g *limitsGateway) metric(t *testing.T, name, label string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + g.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("/metrics: %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// logLines counts the lines of this replica's output containing s.
func (g *limitsGateway) logLines(s string) int {
	return strings.Count(g.proc.output(), s)
}

// limitsResult is one request of a load, as the client saw it.
type limitsResult struct {
	replica    int
	stream     bool
	sent, done time.Time
	status     int
	header     http.Header
	body       []byte
	err        error
	tokens     int64 // the usage's prompt plus completion tokens (200s)
	bodyLen    int   // the request body's length
}

func (r limitsResult) latency() time.Duration { return r.done.Sub(r.sent) }

// limitsLoad is a closed-loop load on one key: workers per replica, each
// sending the next request when the last one ended, alternating
// non-streaming and streaming chat completions.
type limitsLoad struct {
	start time.Time
	stopc chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	res   []limitsResult
}

// limitsClient keeps enough idle connections for every worker: thousands
// of short requests would otherwise each take a new port.
var limitsClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func startLimitsLoad(t *testing.T, gws []*limitsGateway, k limitsKey, perReplica, maxTokens int) *limitsLoad {
	l := &limitsLoad{start: time.Now(), stopc: make(chan struct{})}
	for i, g := range gws {
		for w := range perReplica {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for n := w; ; n++ {
					select {
					case <-l.stopc:
						return
					default:
					}
					r := limitsChat(g, k, n%2 == 1, maxTokens)
					r.replica = i
					l.mu.Lock()
					l.res = append(l.res, r)
					l.mu.Unlock()
				}
			}()
		}
	}
	t.Cleanup(func() { l.stop() }) // a failed test's load ends too
	return l
}

// stop ends the load, waits for the requests in flight and returns every
// result and the load's duration. Calling it again returns the same.
func (l *limitsLoad) stop() ([]limitsResult, time.Duration) {
	l.mu.Lock()
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	l.mu.Unlock()
	l.wg.Wait()
	elapsed := time.Since(l.start)
	limitsClient.CloseIdleConnections()
	return l.results(), elapsed
}

func (l *limitsLoad) results() []limitsResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.res)
}

// limitsChat sends one chat completion with key k to g and reads it whole.
func limitsChat(g *limitsGateway, k limitsKey, stream bool, maxTokens int) limitsResult {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"say something short"}]}`, limitsModel, maxTokens)
	if stream {
		body = fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say something short"}]}`, limitsModel, maxTokens)
	}
	r := limitsResult{stream: stream, bodyLen: len(body), sent: time.Now()}
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.public+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+k.secret)
	resp, err := limitsClient.Do(req)
	if err == nil {
		r.body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		r.status, r.header = resp.StatusCode, resp.Header
	}
	r.done, r.err = time.Now(), err
	if err == nil && r.status == 200 {
		r.tokens, r.err = usageTokens(r.body, stream)
	}
	return r
}

// usageTokens is a 200's usage, prompt plus completion tokens: the
// body's, or a stream's last usage chunk (which must end with [DONE]).
func usageTokens(b []byte, stream bool) (int64, error) {
	type usage struct {
		Usage *struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	var u usage
	if !stream {
		if err := json.Unmarshal(b, &u); err != nil || u.Usage == nil {
			return 0, fmt.Errorf("no usage in %q (%v)", b, err)
		}
		return u.Usage.Prompt + u.Usage.Completion, nil
	}
	if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
		return 0, fmt.Errorf("stream without [DONE]: %q", b)
	}
	var last int64 = -1
	for line := range bytes.Lines(b) {
		data, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("data: {"))
		if !ok {
			continue
		}
		var c usage
		if err := json.Unmarshal(append([]byte("{"), data...), &c); err == nil && c.Usage != nil {
			last = c.Usage.Prompt + c.Usage.Completion
		}
	}
	if last < 0 {
		return 0, fmt.Errorf("stream without a usage chunk: %q", b)
	}
	return last, nil
}

// checkAPIError checks that b is OpenAI's error envelope, every field
// present (param may be null), with typ and code.
func checkAPIError(b []byte, typ, code string) error {
	var e struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	err := json.Unmarshal(b, &e)
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := e.Error[f]; !ok || err != nil {
			return fmt.Errorf("not OpenAI's error envelope {\"error\":{message,type,param,code}}: %s (%v)", b, err)
		}
	}
	var gotType, gotCode string
	_ = json.Unmarshal(e.Error["type"], &gotType)
	_ = json.Unmarshal(e.Error["code"], &gotCode)
	if gotType != typ || gotCode != code {
		return fmt.Errorf("error type %q code %q, want %q %q: %s", gotType, gotCode, typ, code, b)
	}
	return nil
}

// retryAfter is a response's Retry-After in whole seconds, or -1.
func retryAfter(h http.Header) int {
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil {
		return -1
	}
	return n
}

// limitedErrorf returns a t.Errorf that reports the first 5 errors of a
// load's thousands of results and counts the rest.
func limitedErrorf(t *testing.T) func(format string, args ...any) {
	n := 0
	return func(format string, args ...any) {
		t.Helper()
		if n++; n <= 5 {
			t.Errorf(format, args...)
		} else if n == 6 {
			t.Error("more errors not shown")
		}
	}
}

// refill is what a per-minute limit gives back over d, rounded up.
func refill(limit int64, d time.Duration) int64 {
	return int64(math.Ceil(float64(limit) * d.Seconds() / 60))
}

// TestLimitsSharedAcrossReplicas runs two gateway processes on one Redis
// with the same keys and drives 8 workers per replica at each key for 3
// s: the admissions of both together stay within the key's one limit
// (what the bucket holds, plus what refilled meanwhile, plus one request
// per replica of slack), every 200 reports what remains, and the load is
// big enough that the limit refused many requests with OpenAI's 429.
func TestLimitsSharedAcrossReplicas(t *testing.T) {
	const (
		rpm, tpm   = 60, 1000
		perReplica = 8
		maxTokens  = 8
		loadFor    = 3 * time.Second
	)
	rd := redistest.Start(t)
	reqKey := newLimitsKey(t, "rpm", rpm, 0)
	tokKey := newLimitsKey(t, "tpm", 0, tpm)
	// Fail closed: a Redis hiccup shows as a 503, never as an uncounted
	// admission that would blur the bound.
	gws := startLimitsGateways(t, 2, limitsSetup{engines: []string{startLimitsEngine(t)}, redis: rd.Addr(), failMode: "closed", keys: []limitsKey{reqKey, tokKey}})

	// drive runs the load on k for loadFor and returns its results and
	// duration once each replica has settled every request (in_flight 0).
	drive := func(t *testing.T, k limitsKey) ([]limitsResult, time.Duration, []keyStatus) {
		t.Helper()
		load := startLimitsLoad(t, gws, k, perReplica, maxTokens)
		<-time.After(loadFor)
		res, elapsed := load.stop()
		var st []keyStatus
		if !testutil.Poll(5*time.Second, func() bool {
			st = st[:0]
			for _, g := range gws {
				if st = append(st, g.key(t, k.name)); st[len(st)-1].InFlight != 0 {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("requests still in flight 5 s after the load ended: %+v", st)
		}
		return res, elapsed, st
	}

	t.Run("requests", func(t *testing.T) {
		res, elapsed, st := drive(t, reqKey)
		var ok, limited int
		errorf := limitedErrorf(t)
		perReplicaOK := make([]int, len(gws))
		for _, r := range res {
			switch {
			case r.err != nil:
				errorf("replica %d: %v", r.replica, r.err)
			case r.status == 200:
				ok++
				perReplicaOK[r.replica]++
				rem, err := strconv.ParseInt(r.header.Get("X-Ratelimit-Remaining-Requests"), 10, 64)
				if err != nil || rem < 0 || rem >= rpm || r.header.Get("X-Ratelimit-Limit-Requests") != strconv.Itoa(rpm) {
					errorf("a 200 with x-ratelimit-limit-requests %q, x-ratelimit-remaining-requests %q", r.header.Get("X-Ratelimit-Limit-Requests"), r.header.Get("X-Ratelimit-Remaining-Requests"))
				}
			case r.status == 429:
				limited++
				if retryAfter(r.header) < 1 || r.header.Get("X-Ratelimit-Remaining-Requests") != "0" {
					errorf("a 429 with Retry-After %q, x-ratelimit-remaining-requests %q", r.header.Get("Retry-After"), r.header.Get("X-Ratelimit-Remaining-Requests"))
				}
				if err := checkAPIError(r.body, "requests", "rate_limit_exceeded"); err != nil {
					errorf("%v", err)
				}
			default:
				errorf("replica %d: %d %s", r.replica, r.status, r.body)
			}
		}
		var admitted, refused int64
		for _, s := range st {
			admitted += s.Admitted
			refused += s.Refused
			if !s.Shared {
				t.Errorf("GET /admin/keys says %q is not shared", s.Name)
			}
		}
		bound := rpm + refill(rpm, elapsed) + int64(len(gws))
		t.Logf("%d requests in %v: %d admitted (per replica %v, the limit's bound %d), %d refused with 429 (admin: %d admitted, %d refused)",
			len(res), elapsed.Round(time.Millisecond), ok, perReplicaOK, bound, limited, admitted, refused)
		if admitted > bound {
			t.Errorf("the replicas admitted %d requests of a key limited to %d a minute in %v: more than %d", admitted, rpm, elapsed, bound)
		}
		if admitted < rpm {
			t.Errorf("the replicas admitted %d requests, fewer than the full bucket of %d", admitted, rpm)
		}
		if int64(ok) != admitted || int64(limited) != refused {
			t.Errorf("the clients saw %d 200s and %d 429s, GET /admin/keys counts %d admitted and %d refused", ok, limited, admitted, refused)
		}
		for i, n := range perReplicaOK {
			if n == 0 {
				t.Errorf("replica %d admitted nothing", i)
			}
		}
		if limited < 10*rpm {
			t.Errorf("only %d 429s: the load did not press on the limit", limited)
		}
	})

	t.Run("tokens", func(t *testing.T) {
		res, elapsed, st := drive(t, tokKey)
		var ok, limited int
		errorf := limitedErrorf(t)
		var bodyTokens int64
		maxBody := 0
		for _, r := range res {
			maxBody = max(maxBody, r.bodyLen)
			switch {
			case r.err != nil:
				errorf("replica %d: %v", r.replica, r.err)
			case r.status == 200:
				ok++
				bodyTokens += r.tokens
				rem, err := strconv.ParseInt(r.header.Get("X-Ratelimit-Remaining-Tokens"), 10, 64)
				if err != nil || rem < 0 || rem >= tpm || r.header.Get("X-Ratelimit-Limit-Tokens") != strconv.Itoa(tpm) {
					errorf("a 200 with x-ratelimit-limit-tokens %q, x-ratelimit-remaining-tokens %q", r.header.Get("X-Ratelimit-Limit-Tokens"), r.header.Get("X-Ratelimit-Remaining-Tokens"))
				}
				if r.header.Get("X-Ratelimit-Remaining-Requests") != "" {
					errorf("a 200 of a key without a requests limit has x-ratelimit-remaining-requests %q", r.header.Get("X-Ratelimit-Remaining-Requests"))
				}
			case r.status == 429:
				limited++
				if retryAfter(r.header) < 1 || r.header.Get("X-Ratelimit-Remaining-Tokens") == "" {
					errorf("a 429 with Retry-After %q, x-ratelimit-remaining-tokens %q", r.header.Get("Retry-After"), r.header.Get("X-Ratelimit-Remaining-Tokens"))
				}
				if err := checkAPIError(r.body, "tokens", "rate_limit_exceeded"); err != nil {
					errorf("%v", err)
				}
			default:
				errorf("replica %d: %d %s", r.replica, r.status, r.body)
			}
		}
		// What the replicas counted may lag the last responses by their
		// settlement (in_flight is 0, the token counts follow it).
		var used int64
		testutil.Poll(2*time.Second, func() bool {
			used = 0
			for _, g := range gws {
				s := g.key(t, tokKey.name)
				used += s.TokensIn + s.TokensOut
			}
			return used == bodyTokens
		})
		// A reservation is the prompt estimate (its bytes / 4, rounded up:
		// at most the body's) plus max_tokens; settlement gives back what
		// was not used, so what is used stays within the bucket plus its
		// refill. One reservation per replica is the slack.
		reservation := int64((maxBody+3)/4 + maxTokens)
		bound := tpm + refill(tpm, elapsed) + int64(len(gws))*reservation
		var admitted int64
		for _, s := range st {
			admitted += s.Admitted
		}
		t.Logf("%d requests in %v: %d admitted (admin %d), %d tokens used (admin %d, the limit's bound %d, one reservation at most %d), %d refused with 429",
			len(res), elapsed.Round(time.Millisecond), ok, admitted, bodyTokens, used, bound, reservation, limited)
		if used != bodyTokens {
			t.Errorf("GET /admin/keys counts %d tokens, the responses' usage sums to %d", used, bodyTokens)
		}
		if used > bound {
			t.Errorf("the replicas' requests used %d tokens of a key limited to %d a minute in %v: more than %d", used, tpm, elapsed, bound)
		}
		if used < tpm/2 {
			t.Errorf("the replicas' requests used %d tokens, under half the bucket of %d", used, tpm)
		}
		if limited < 100 {
			t.Errorf("only %d 429s: the load did not press on the limit", limited)
		}
	})
}

// blackhole listens where Redis did and accepts connections without ever
// answering: a Redis that hangs, so each round trip waits its timeout.
type blackhole struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func listenBlackhole(t *testing.T, addr string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen where redis was: %v", err)
	}
	b := &blackhole{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.conns = append(b.conns, c)
			b.mu.Unlock()
		}
	}()
	t.Cleanup(b.close)
	return b
}

// close stops listening and closes every connection accepted. It returns
// once nothing listens on the port. Calling it again does nothing.
func (b *blackhole) close() {
	_ = b.ln.Close()
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.conns = nil
}

// TestLimitsRedisOutage runs two gateway processes under load on one Redis,
// then makes Redis go away twice, as a stopped process (connections
// refused) and as an unresponsive one (connections accepted, nothing
// answered): with fail_mode open every request keeps succeeding,
// uncounted; with fail_mode closed every one gets OpenAI's 503
// rate_limits_unavailable with Retry-After. Either way no request waits on
// Redis for much longer than limits.redis.timeout, the outage is counted
// in switchboard.quota.store_errors and logged once, not per request, and
// once Redis is back the limits apply again, shared by the replicas.
func TestLimitsRedisOutage(t *testing.T) {
	engine := startLimitsEngine(t)
	for _, mode := range []string{"open", "closed"} {
		t.Run("fail_"+mode, func(t *testing.T) { testRedisOutage(t, engine, mode) })
	}
}

func testRedisOutage(t *testing.T, engine, mode string) {
	const (
		perReplica = 4
		maxTokens  = 4
		smallRPM   = 5
		outageFor  = limitsDownFor + 500*time.Millisecond // past one down_for: one more probe
		// maxWait bounds every request's latency during an outage: Redis
		// is waited for limits.redis.timeout at most, the engine answers
		// in tens of ms; a request that hung on Redis would take seconds.
		maxWait = time.Second
	)
	rd := redistest.Start(t)
	// The load's key has limits it never reaches, both kinds (so a
	// request's end settles its tokens with Redis too); each outage has a
	// small key of its own to show the limits apply again after it.
	loadKey := newLimitsKey(t, "load", 1_000_000, 100_000_000)
	outages := []string{"stopped", "unresponsive"}
	small := map[string]limitsKey{}
	keys := []limitsKey{loadKey}
	for _, o := range outages {
		small[o] = newLimitsKey(t, "small-"+o, smallRPM, 0)
		keys = append(keys, small[o])
	}
	gws := startLimitsGateways(t, 2, limitsSetup{engines: []string{engine}, redis: rd.Addr(), failMode: mode, keys: keys})

	load := startLimitsLoad(t, gws, loadKey, perReplica, maxTokens)
	// counted reports whether r was admitted by Redis: a 200 reporting
	// what remains of the limits.
	counted := func(r limitsResult) bool {
		return r.err == nil && r.status == 200 && r.header.Get("X-Ratelimit-Remaining-Requests") != ""
	}
	// countedSince returns, per replica, how many requests sent at since
	// or later Redis admitted, and when the first of them ended.
	countedSince := func(since time.Time) ([]int, []time.Time) {
		n, first := make([]int, len(gws)), make([]time.Time, len(gws))
		for _, r := range load.results() {
			if !r.sent.Before(since) && counted(r) {
				if n[r.replica]++; first[r.replica].IsZero() || r.done.Before(first[r.replica]) {
					first[r.replica] = r.done
				}
			}
		}
		return n, first
	}
	everyReplica := func(n []int, atLeast int) bool {
		return !slices.ContainsFunc(n, func(v int) bool { return v < atLeast })
	}
	if !testutil.Poll(10*time.Second, func() bool { n, _ := countedSince(load.start); return everyReplica(n, 10) }) {
		t.Fatal("not 10 requests per replica admitted through redis in 10 s")
	}

	for _, outage := range outages {
		// Requests sent from down (Redis gone) until up (its restart
		// begins) cannot have reached it.
		rd.Stop()
		var bh *blackhole
		if outage == "unresponsive" {
			bh = listenBlackhole(t, rd.Addr())
		}
		down := time.Now()
		<-time.After(outageFor)
		up := time.Now()
		if bh != nil {
			bh.close()
		}
		rd.Restart()
		restarted := time.Now()

		// Recovery: on every replica (each has its own down_for), a
		// request sent after the restart is admitted by Redis again.
		var first []time.Time
		if !testutil.Poll(10*time.Second, func() bool {
			var n []int
			n, first = countedSince(restarted)
			return everyReplica(n, 1)
		}) {
			t.Fatalf("%s: not every replica admitted a request through redis within 10 s of its restart (first admissions %v)", outage, first)
		}
		var recovered []time.Duration
		for _, f := range first {
			recovered = append(recovered, f.Sub(restarted).Round(time.Millisecond))
		}

		var during []limitsResult
		var lat []time.Duration
		for _, r := range load.results() {
			if !r.sent.Before(down) && r.sent.Before(up) {
				during = append(during, r)
				lat = append(lat, r.latency())
			}
		}
		if len(during) < 20 {
			t.Fatalf("%s: only %d requests sent during the outage", outage, len(during))
		}
		slices.Sort(lat)
		p99, worst := lat[len(lat)*99/100], lat[len(lat)-1]
		bad := 0
		for _, r := range during {
			switch {
			case r.err != nil:
				bad++
				t.Errorf("%s: replica %d: %v", outage, r.replica, r.err)
			case mode == "open" && (r.status != 200 || r.header.Get("X-Ratelimit-Remaining-Requests") != ""):
				bad++
				t.Errorf("%s, fail open: a request got %d with x-ratelimit-remaining-requests %q, want 200 without (uncounted): %s", outage, r.status, r.header.Get("X-Ratelimit-Remaining-Requests"), r.body)
			case mode == "closed" && (r.status != 503 || retryAfter(r.header) < 1):
				bad++
				t.Errorf("%s, fail closed: a request got %d with Retry-After %q, want 503 with Retry-After: %s", outage, r.status, r.header.Get("Retry-After"), r.body)
			case mode == "closed":
				if err := checkAPIError(r.body, "service_unavailable_error", "rate_limits_unavailable"); err != nil {
					bad++
					t.Errorf("%s: %v", outage, err)
				}
			}
			if bad > 5 {
				t.Fatalf("%s: more wrong answers not shown", outage)
			}
		}
		t.Logf("%s for %v: %d requests sent, all %s; latency p50 %v p99 %v max %v; admitted through redis again, per replica, %v after it answered PING",
			outage, up.Sub(down).Round(time.Millisecond), len(during), map[string]string{"open": "200 (uncounted)", "closed": "503 rate_limits_unavailable"}[mode],
			lat[len(lat)/2].Round(100*time.Microsecond), p99.Round(100*time.Microsecond), worst.Round(100*time.Microsecond),
			recovered)
		if worst > maxWait {
			t.Errorf("%s: a request took %v during the outage (p99 %v): it waited on redis far longer than its %v timeout", outage, worst, p99, limitsTimeout)
		}

		// The limits apply again, shared: the small key's smallRPM
		// requests, alternately on each replica, then a 429.
		k := small[outage]
		for i := range smallRPM + 1 {
			r := limitsChat(gws[i%len(gws)], k, false, maxTokens)
			want, rem := 200, strconv.Itoa(smallRPM-1-i)
			if i == smallRPM {
				want, rem = 429, "0"
			}
			if got := r.header.Get("X-Ratelimit-Remaining-Requests"); r.err != nil || r.status != want || got != rem {
				t.Fatalf("%s: request %d of %d on %q (limit %d a minute): %d with x-ratelimit-remaining-requests %q (%v), want %d with %q: %s",
					outage, i+1, smallRPM+1, k.name, smallRPM, r.status, got, r.err, want, rem, r.body)
			}
		}
	}
	res, _ := load.stop()

	// Counted: each replica's store errors under the fail mode's result,
	// and (fail closed) its requests unavailable, at least its requests
	// during the outages.
	result := map[string]string{"open": "admitted", "closed": "unavailable"}[mode]
	for i, g := range gws {
		errs := g.metric(t, "switchboard_quota_store_errors_total", `result="`+result+`"`)
		other := g.metric(t, "switchboard_quota_store_errors_total", `result="`+map[string]string{"open": "unavailable", "closed": "admitted"}[mode]+`"`)
		st := g.key(t, loadKey.name)
		n := 0
		for _, r := range res {
			if r.replica == i && !counted(r) {
				n++
			}
		}
		t.Logf("replica %d: switchboard_quota_store_errors_total{result=%q} %v; /admin/keys %q: %d admitted, %d unavailable; %d requests not counted by redis",
			i, result, errs, loadKey.name, st.Admitted, st.Unavailable, n)
		if errs < float64(n) || other != 0 {
			t.Errorf("replica %d: switchboard_quota_store_errors_total{result=%q} is %v (the other result %v), want at least the %d requests redis did not count", i, result, errs, other, n)
		}
		if mode == "closed" && st.Unavailable < int64(n) {
			t.Errorf("replica %d: GET /admin/keys counts %d unavailable, want at least %d", i, st.Unavailable, n)
		}
		// Logged, boundedly: each warning at most once a minute (both
		// outages are within one), not once per request.
		warn := g.logLines("the limits' store did not answer")
		release := g.logLines("the limits' store did not take a request's release")
		t.Logf("replica %d: %d fail_mode warnings, %d release warnings in its log", i, warn, release)
		if warn < 1 || warn > 2 || release > 2 {
			t.Errorf("replica %d logged %d warnings that the limits' store did not answer and %d that it did not take a release over %d requests it did not count; want 1 or 2 of the former, at most 2 of the latter:\n%s",
				i, warn, release, n, g.proc.output())
		}
	}
}
