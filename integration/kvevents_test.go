//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// The model of the KV-event tests' engine simulator processes.
const kvModel = "it-kv-model"

// kvSim is an engine simulator process publishing vLLM's KV-cache events
// on a PUB socket and replaying them on a ROUTER socket, both on ports it
// picked itself (tcp://127.0.0.1:0), read back from its start log line.
type kvSim struct {
	name, url  string
	kv, replay string // tcp://127.0.0.1:PORT
	proc       *proc
}

// kvLogAddr matches a "key=value" field of a start log line (slog's text
// handler) whose value is a tcp:// endpoint.
func kvLogAddr(key string) *regexp.Regexp {
	return regexp.MustCompile(`(?:^|\s)` + regexp.QuoteMeta(key) + `=(tcp://[^\s"]+)`)
}

// startKVSim starts an engine simulator process with KV-cache events and
// prompt_tokens_details on, and returns once it answers /health and has
// logged its KV-event endpoints. start stops it by PID at the test's end.
func startKVSim(t *testing.T, bin, name string) *kvSim {
	t.Helper()
	addr := freePort(t)
	s := &kvSim{name: name, url: "http://" + addr}
	s.proc = start(t, nil, bin, "--listen", addr, "--name", name, "--model", kvModel, "--ttft", "5ms", "--itl", "2ms",
		"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
		"--enable-prompt-tokens-details")
	kvRe, replayRe := kvLogAddr("kv_events"), kvLogAddr("kv_events_replay")
	if !testutil.Poll(20*time.Second, func() bool {
		out := s.proc.output()
		m, r := kvRe.FindStringSubmatch(out), replayRe.FindStringSubmatch(out)
		if m == nil || r == nil {
			return false
		}
		s.kv, s.replay = m[1], r[1]
		return true
	}) {
		t.Fatalf("enginesim %s logged no kv_events and kv_events_replay endpoints:\n%s", name, s.proc.output())
	}
	if strings.HasSuffix(s.kv, ":0") || strings.HasSuffix(s.replay, ":0") {
		t.Fatalf("enginesim %s logged unbound endpoints %s and %s", name, s.kv, s.replay)
	}
	waitHTTP(t, s.url+"/health", 200)
	return s
}

// kvGateway is a gateway process whose listeners took free ports
// (127.0.0.1:0), read back from its log.
type kvGateway struct {
	name          string
	proc          *proc
	public, admin string // host:port
}

// startKVGateway starts a gateway process with policy over sims (each with
// its kv_events and kv_events_replay endpoints), X-Switchboard-Engine on,
// and a tokenization wait long enough that a prompt's first request is
// routed on its tokens, not on the approximate index. It returns once the
// gateway is ready with every engine routable.
func startKVGateway(t *testing.T, bin, name, policy string, sims []*kvSim) *kvGateway {
	t.Helper()
	var engines strings.Builder
	for _, s := range sims {
		fmt.Fprintf(&engines, "  - name: %s\n    url: %s\n    models: [%s]\n    kv_events: %s\n    kv_events_replay: %s\n",
			s.name, s.url, kvModel, s.kv, s.replay)
	}
	cfg := fmt.Sprintf(`server:
  listen: "127.0.0.1:0"
  engine_header: true
  health:
    interval: 1s
admin:
  listen: "127.0.0.1:0"
routing:
  policy: %s
log:
  access: false
kv_events:
  tokenize:
    max_wait: 1s
engines:
%s`, policy, engines.String())
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g := &kvGateway{name: name}
	g.proc = start(t, []string{"OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_EXPORTER=none"}, bin, "--config", path)
	publicRe := regexp.MustCompile(`msg="switchboard listening" addr=(\S+)`)
	adminRe := regexp.MustCompile(`msg="admin listening" addr=(\S+)`)
	if !testutil.Poll(20*time.Second, func() bool {
		out := g.proc.output()
		p, a := publicRe.FindStringSubmatch(out), adminRe.FindStringSubmatch(out)
		if p == nil || a == nil {
			return false
		}
		g.public, g.admin = p[1], a[1]
		return true
	}) {
		t.Fatalf("gateway %s logged no listening addresses:\n%s", name, g.proc.output())
	}
	waitHTTP(t, "http://"+g.public+"/ready", 200)
	var st kvAdmin
	if !testutil.Poll(10*time.Second, func() bool {
		st = kvAdminEngines(t, g.admin)
		n := 0
		for _, e := range st.Engines {
			if e.Routable {
				n++
			}
		}
		return n == len(sims)
	}) {
		t.Fatalf("gateway %s: engines not all routable: %+v", name, st)
	}
	return g
}

// kvAdmin is the KV-event part of GET /admin/engines.
type kvAdmin struct {
	Engines []struct {
		Name     string `json:"name"`
		Routable bool   `json:"routable"`
		Retired  bool   `json:"retired"`
		KVEvents *struct {
			Endpoint     string `json:"endpoint"`
			Replay       string `json:"replay"`
			Connected    bool   `json:"connected"`
			Fresh        bool   `json:"fresh"`
			Blocks       int    `json:"blocks"`
			Batches      uint64 `json:"batches"`
			LastSeq      uint64 `json:"last_seq"`
			Gaps         uint64 `json:"gaps"`
			Replays      uint64 `json:"replays"`
			Restarts     uint64 `json:"restarts"`
			DecodeErrors uint64 `json:"decode_errors"`
		} `json:"kv_events"`
	} `json:"engines"`
	KVIndex *struct {
		Engines     int `json:"engines"`
		Stale       int `json:"stale"`
		Blocks      int `json:"blocks"`
		Speculative int `json:"speculative"`
	} `json:"kv_index"`
}

// kvAdminEngines is GET /admin/engines of the gateway whose admin listener
// is admin (host:port).
func kvAdminEngines(t *testing.T, admin string) kvAdmin {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/admin/engines")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a kvAdmin
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("GET /admin/engines: %v", err)
	}
	return a
}

// blocks returns the KV-event blocks the index holds per engine (the
// engines without a subscription left out), retired incarnations left out.
func (a kvAdmin) blocks() map[string]int {
	out := map[string]int{}
	for _, e := range a.Engines {
		if !e.Retired && e.KVEvents != nil {
			out[e.Name] = e.KVEvents.Blocks
		}
	}
	return out
}

// connected reports whether every listed engine has a connected KV-event
// subscription.
func (a kvAdmin) connected() bool {
	for _, e := range a.Engines {
		if !e.Retired && (e.KVEvents == nil || !e.KVEvents.Connected) {
			return false
		}
	}
	return len(a.Engines) > 0
}

// kvReply is what a chat completion through the gateway says about its
// routing and the engine's prefix cache.
type kvReply struct {
	engine       string // X-Switchboard-Engine
	promptTokens int    // usage.prompt_tokens
	cachedTokens int    // usage.prompt_tokens_details.cached_tokens; 0 when null
}

// kvChat sends a non-streaming chat completion of one user message,
// content, for model to the gateway at public (host:port) and fails the
// test on anything but a 200 with usage and the engine header. The
// engines run with --enable-prompt-tokens-details, so usage has
// prompt_tokens_details whenever some prompt tokens were cached.
func kvChat(t *testing.T, public, model, content string) kvReply {
	t.Helper()
	r := kvPost(t, public, model, content)
	if r.engine == "" {
		t.Fatalf("chat via %s: no X-Switchboard-Engine header", public)
	}
	return r
}

// kvPost is kvChat to any OpenAI server at addr (host:port), an engine
// too: engine is "" without the gateway's header.
func kvPost(t *testing.T, public, model, content string) kvReply {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"model": model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": content}},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+public+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("chat via %s: status %d, %v: %s", public, resp.StatusCode, err, b)
	}
	var out struct {
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.Usage == nil {
		t.Fatalf("chat via %s: no usage (%v): %s", public, err, b)
	}
	r := kvReply{engine: resp.Header.Get("X-Switchboard-Engine"), promptTokens: out.Usage.PromptTokens}
	if out.Usage.Details != nil { // null with nothing cached, as vLLM's
		r.cachedTokens = out.Usage.Details.CachedTokens
	}
	return r
}

// kvDocument is a long prompt prefix of words (the simulator's tokens are
// words) that starts with its own tag, so no two documents share a token
// block or a text block: a system prompt, a RAG context or a long
// conversation's earlier turns.
func kvDocument(tag string, words int) string {
	var b strings.Builder
	b.WriteString(tag)
	x := uint32(len(tag)) * 2654435761
	for _, c := range tag {
		x = x*31 + uint32(c)
	}
	for i := range words - 1 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		fmt.Fprintf(&b, " w%d-%d", x%5000, i%7)
	}
	return b.String()
}

// kvDocWords is the words of each document: 20 blocks of 16 tokens.
const kvDocWords = 320

// waitLearned polls replica g's /admin/engines until engine's KV-event
// blocks are above before: the batch of a request it never saw has
// arrived from the engine. It returns the new count.
func waitLearned(t *testing.T, g *kvGateway, engine string, before int) int {
	t.Helper()
	var got map[string]int
	if !testutil.Poll(10*time.Second, func() bool {
		got = kvAdminEngines(t, g.admin).blocks()
		return got[engine] > before
	}) {
		t.Fatalf("replica %s: %s's KV-event blocks %v, want above %d: the engine's events did not arrive", g.name, engine, got, before)
	}
	return got[engine]
}

// TestKVEventsTwoReplicas runs two gateway replicas with precise-prefix
// in front of two engine simulator processes publishing vLLM's KV-cache
// events. A long prompt sent to replica 1 only is learned by replica 2
// from the engine's events (its /admin/engines shows the blocks), and the
// prompts that extend it then go to that engine through either replica:
// replica 2's first one too, which it never saw the prefix of. The engine
// reports the prefix as cached for each of them. As a contrast, two
// prefix-aware replicas over the same engines agree on a new prefix's
// engine only by chance (each decides by load, ties at random, without
// the other's knowledge), while the precise-prefix replicas always do.
func TestKVEventsTwoReplicas(t *testing.T) {
	dir := t.TempDir()
	gwBin := build(t, dir, "./cmd/gateway")
	simBin := build(t, dir, "./cmd/enginesim")
	sims := []*kvSim{startKVSim(t, simBin, "sim-a"), startKVSim(t, simBin, "sim-b")}
	r1 := startKVGateway(t, gwBin, "precise-1", "precise-prefix", sims)
	r2 := startKVGateway(t, gwBin, "precise-2", "precise-prefix", sims)
	for _, g := range []*kvGateway{r1, r2} {
		var st kvAdmin
		if !testutil.Poll(10*time.Second, func() bool { st = kvAdminEngines(t, g.admin); return st.connected() }) {
			t.Fatalf("replica %s: KV-event subscriptions not all connected: %+v", g.name, st)
		}
		for _, e := range st.Engines {
			var want *kvSim
			for _, s := range sims {
				if s.name == e.Name {
					want = s
				}
			}
			if want == nil || e.KVEvents.Endpoint != want.kv || e.KVEvents.Replay != want.replay {
				t.Errorf("replica %s: engine %s subscribes to %s (replay %s), want the simulator's logged endpoints", g.name, e.Name, e.KVEvents.Endpoint, e.KVEvents.Replay)
			}
		}
		if b := st.blocks(); b["sim-a"] != 0 || b["sim-b"] != 0 {
			t.Fatalf("replica %s holds blocks %v before any request", g.name, b)
		}
	}

	// The prefix, through replica 1 only.
	doc := kvDocument("shared-system-prompt", kvDocWords)
	first := kvChat(t, r1.public, kvModel, doc+" question zero: what does it say?")
	chosen := first.engine
	if first.cachedTokens != 0 {
		t.Errorf("the first request for the prefix had %d cached tokens on %s, want 0", first.cachedTokens, chosen)
	}
	learned := waitLearned(t, r2, chosen, 0)
	// One block of 16 tokens per 16 words, less what the chat template
	// shifts into the last, partial one.
	if minBlocks := kvDocWords/16 - 1; learned < minBlocks {
		t.Errorf("replica 2 learned %d blocks of %s, want at least %d for a %d-word prompt", learned, chosen, minBlocks, kvDocWords)
	}
	if other := kvAdminEngines(t, r2.admin).blocks(); len(other) != 2 || other[otherSim(sims, chosen)] != 0 {
		t.Errorf("replica 2's blocks %v: the engine that served nothing holds some", other)
	}

	// Prompts extending it, replica 2 first, then alternately: all to the
	// chosen engine, which has the prefix cached each time.
	for i := range 8 {
		g := []*kvGateway{r2, r1}[i%2]
		r := kvChat(t, g.public, kvModel, fmt.Sprintf("%s question %d: and what about part %d?", doc, i+1, i+1))
		if r.engine != chosen {
			t.Errorf("extension %d via replica %s went to %s, want %s (where the prefix is cached)", i+1, g.name, r.engine, chosen)
		}
		if want := (kvDocWords/16 - 2) * 16; r.cachedTokens < want || r.cachedTokens%16 != 0 {
			t.Errorf("extension %d via replica %s: %d of %d prompt tokens cached on %s, want whole blocks, at least %d", i+1, g.name, r.cachedTokens, r.promptTokens, r.engine, want)
		}
	}

	// The contrast, with numbers: for each of n new prefixes, replica 1
	// decides without knowledge (a load tie, at random) and replica 2's
	// first request for it follows. Two prefix-aware replicas agree only
	// when their two random draws do (probability 1/2 each time).
	pa1 := startKVGateway(t, gwBin, "prefix-aware-1", "prefix-aware", sims)
	pa2 := startKVGateway(t, gwBin, "prefix-aware-2", "prefix-aware", sims)
	const n = 16
	var preciseAgree, awareAgree int
	firstPicks := map[string]int{}
	for i := range n {
		before := kvAdminEngines(t, r2.admin).blocks()
		doc := kvDocument(fmt.Sprintf("precise-document-%d", i), kvDocWords)
		a := kvChat(t, r1.public, kvModel, doc+" first question")
		firstPicks[a.engine]++
		waitLearned(t, r2, a.engine, before[a.engine])
		b := kvChat(t, r2.public, kvModel, doc+" second question")
		if b.engine == a.engine {
			preciseAgree++
		} else {
			t.Errorf("precise-prefix document %d: replica 1 sent it to %s, replica 2's first request for it went to %s", i, a.engine, b.engine)
		}
		if b.cachedTokens == 0 {
			t.Errorf("precise-prefix document %d: replica 2's first request for it found nothing cached on %s", i, b.engine)
		}

		doc = kvDocument(fmt.Sprintf("aware-document-%d", i), kvDocWords)
		if kvChat(t, pa1.public, kvModel, doc+" first question").engine == kvChat(t, pa2.public, kvModel, doc+" second question").engine {
			awareAgree++
		}
	}
	t.Logf("replica 2's first request for a prefix replica 1 placed: precise-prefix %d/%d on the same engine, prefix-aware %d/%d; replica 1's picks %v",
		preciseAgree, n, awareAgree, n, firstPicks)
	// Replica 1's picks spread over both engines (else agreeing proves
	// nothing), and prefix-aware disagrees at least once: each fails by
	// chance with probability 2^-15 and 2^-16.
	if len(firstPicks) != 2 {
		t.Errorf("replica 1 placed all %d new prefixes on one engine %v: the load ties are not broken at random", n, firstPicks)
	}
	if awareAgree == n {
		t.Errorf("the prefix-aware replicas agreed on all %d new prefixes without sharing knowledge", n)
	}
}

// otherSim is the name of the simulator in sims (two) that is not name.
func otherSim(sims []*kvSim, name string) string {
	for _, s := range sims {
		if s.name != name {
			return s.name
		}
	}
	return ""
}

// endpointPort is the port of a tcp://host:port endpoint.
func endpointPort(t *testing.T, endpoint string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatalf("endpoint %q: %v", endpoint, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatalf("endpoint %q: %v", endpoint, err)
	}
	return int32(p)
}
