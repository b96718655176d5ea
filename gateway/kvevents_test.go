package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// The gateway-level tests of routing on vLLM KV-cache events: real
// simulated engines publishing on ZMQ PUB sockets on 127.0.0.1, the
// gateway's fleet subscribed to them, the precise-prefix policy routing on
// the index they feed.

// kvWait bounds every wait for an event batch to cross a loopback socket
// and be applied.
const kvWait = 5 * time.Second

// kvSimEngine is a simulated engine that publishes KV-cache events.
type kvSimEngine struct {
	name string
	e    *enginesim.Engine
	srv  *httptest.Server
}

// config is the engine's entry in the gateway's config.
func (s *kvSimEngine) config() fleet.EngineConfig {
	return fleet.EngineConfig{Name: s.name, URL: s.srv.URL, Models: []string{"m"}, KVEvents: s.e.KVEventsAddr(), KVEventsReplay: s.e.KVReplayAddr()}
}

// kvSim starts a simulated engine publishing KV-cache events on a free
// loopback port (with a replay socket when replay), reporting its cached
// prompt tokens; wrap, when not nil, wraps its HTTP handler. Its publisher
// is closed when the test ends, after its HTTP server.
func kvSim(t *testing.T, name string, replay bool, cfg enginesim.Config, wrap func(http.Handler) http.Handler) *kvSimEngine {
	t.Helper()
	if cfg.Models == nil {
		cfg.Models = []string{"m"}
	}
	cfg.KVEvents = "tcp://127.0.0.1:0"
	cfg.PromptTokensDetails = true
	if cfg.OutputTokens == 0 {
		cfg.OutputTokens = 4
	}
	if replay {
		cfg.KVEventsReplay = "tcp://127.0.0.1:0"
	}
	e, err := enginesim.New(enginetest.Fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("engine %s: close: %v", name, err)
		}
	})
	var h http.Handler = e.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	return &kvSimEngine{name: name, e: e, srv: enginetest.Serve(t, h)}
}

// kvGateway is a gateway routing with policy (precise-prefix or
// prefix-aware) on a KV index fed by the engines' events, and the index.
type kvGateway struct {
	*harness
	kv   *routing.KVIndex
	logs *testutil.LockedBuffer
}

// newKVGateway starts a gateway over the engines with kv_events.stale_after
// 300ms and a tokenization wait of 500ms (so that a first request is routed
// on its tokens), then edit's changes to the config.
func newKVGateway(t *testing.T, policy string, edit func(*Config), engines ...*kvSimEngine) *kvGateway {
	t.Helper()
	var ecfg []fleet.EngineConfig
	for _, e := range engines {
		ecfg = append(ecfg, e.config())
	}
	cfg := testConfig(ecfg...)
	cfg.EngineHeader = true
	cfg.KVEvents.StaleAfter = 300 * time.Millisecond
	cfg.KVEvents.Tokenize.MaxWait = 500 * time.Millisecond
	if edit != nil {
		edit(&cfg)
	}
	kv := routing.NewKVIndex(cfg.KVEvents.IndexConfig())
	rc := routing.DefaultConfig()
	rc.Policy = policy
	pol, err := routing.NewPolicy(rc, routing.WithKVIndex(kv, cfg.KVEvents.BlockSize))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.LockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := newHarnessWith(t, cfg, []Option{WithKVIndex(kv), WithLogger(log)}, withPolicy(pol))
	return &kvGateway{harness: h, kv: kv, logs: logs}
}

// kvAdmin is the part of GET /admin/engines these tests read.
type kvAdmin struct {
	Engines []struct {
		Name     string                `json:"name"`
		KVEvents *fleet.EngineKVStatus `json:"kv_events"`
	} `json:"engines"`
	KVIndex *kvIndexStatus `json:"kv_index"`
}

// admin reads GET /admin/engines from the gateway's admin handler.
func (g *kvGateway) admin() kvAdmin {
	g.t.Helper()
	rec := httptest.NewRecorder()
	g.gw.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/admin/engines", nil))
	var a kvAdmin
	if rec.Code != http.StatusOK {
		g.t.Fatalf("GET /admin/engines: %d %s", rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		g.t.Fatalf("GET /admin/engines: %v", err)
	}
	return a
}

// status is engine name's kv_events on /admin/engines.
func (g *kvGateway) status(name string) fleet.EngineKVStatus {
	g.t.Helper()
	for _, e := range g.admin().Engines {
		if e.Name == name {
			if e.KVEvents == nil {
				g.t.Fatalf("engine %s has no kv_events on /admin/engines", name)
			}
			return *e.KVEvents
		}
	}
	g.t.Fatalf("no engine %s on /admin/engines", name)
	return fleet.EngineKVStatus{}
}

// match is how many leading keys engine name holds in the index now.
func (g *kvGateway) match(name string, keys []uint64) int {
	g.t.Helper()
	e := g.gw.Fleet().Engine(name)
	if e == nil {
		g.t.Fatalf("no engine %s", name)
	}
	return g.kv.Match(keys, e.Endpoint(), time.Now())
}

// fresh reports routing.KVIndex.Fresh for engine name now.
func (g *kvGateway) fresh(name string) bool {
	g.t.Helper()
	return g.kv.Fresh(g.gw.Fleet().Engine(name).Endpoint(), time.Now())
}

// gaugeValue is the Int64 gauge name's one data point (0 when absent).
func (g *kvGateway) gaugeValue(name string) int64 {
	g.t.Helper()
	m, ok := findMetric(g.collect(), name)
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		n += dp.Value
	}
	return n
}

// histExtrema returns the count, min and max of the Float64 histogram name
// over its data points.
func (g *kvGateway) histExtrema(name string) (count uint64, lo, hi float64) {
	g.t.Helper()
	m, ok := findMetric(g.collect(), name)
	if !ok {
		return 0, 0, 0
	}
	first := true
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		mn, okMin := dp.Min.Value()
		mx, okMax := dp.Max.Value()
		if !okMin || !okMax {
			g.t.Fatalf("%s records no extrema", name)
		}
		if first || mn < lo {
			lo = mn
		}
		if first || mx > hi {
			hi = mx
		}
		first = false
		count += dp.Count
	}
	return count, lo, hi
}

// kvPrompt is n words unique to tag: n/16 full blocks of the simulator's
// tokens, sharing nothing with another tag's prompt. The prompts the tests
// route are not a whole number of blocks (40, 70 words): for one that is,
// vLLM reports a block less cached than it holds (it recomputes the last
// prompt token: max_cache_hit_length = num_tokens - 1 in
// vllm/v1/core/kv_cache_manager.py), which the simulator does not.
func kvPrompt(tag string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s-%d", tag, i)
	}
	return strings.Join(w, " ")
}

// kvChatBody is a chat request for prompt.
func kvChatBody(prompt string, stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, stream, maxTokens, prompt)
}

// kvReply is what a chat answer said: its status, the engine that served
// it (X-Switchboard-Engine) and the cached prompt tokens its usage
// reported.
type kvReply struct {
	status int
	engine string
	cached int
	body   string
}

// parseReply reads a non-streaming chat answer.
func parseReply(t testing.TB, resp *http.Response) kvReply {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	var out struct {
		Usage struct {
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	r := kvReply{status: resp.StatusCode, engine: resp.Header.Get("X-Switchboard-Engine"), body: string(b)}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("answer %q: %v", b, err)
		}
		if out.Usage.Details != nil {
			r.cached = out.Usage.Details.Cached
		}
	}
	return r
}

// chat sends prompt through the gateway.
func (g *kvGateway) chat(prompt string) kvReply {
	g.t.Helper()
	return parseReply(g.t, g.post("/v1/chat/completions", kvChatBody(prompt, false, 4)))
}

// direct sends prompt straight to the engine, not through the gateway,
// and fails the test unless it succeeds.
func (s *kvSimEngine) direct(t testing.TB, prompt string) kvReply {
	t.Helper()
	resp, err := s.srv.Client().Post(s.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(kvChatBody(prompt, false, 4)))
	if err != nil {
		t.Fatal(err)
	}
	r := parseReply(t, resp)
	if r.status != http.StatusOK {
		t.Fatalf("engine %s: %d %s", s.name, r.status, r.body)
	}
	return r
}

// keys are prompt's token keys as the gateway computes them: the engine's
// own /tokenize ids cut into 16-token blocks.
func (s *kvSimEngine) keys(t testing.TB, prompt string) []uint64 {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": prompt}}})
	resp, err := s.srv.Client().Post(s.srv.URL+"/tokenize", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/tokenize: %d %v", resp.StatusCode, err)
	}
	return stablehash.TokenBlocks(nil, out.Tokens, 16, 0)
}

// warm makes sure the gateway receives the engine's events: ZMQ drops what
// a PUB socket sends before the subscription reaches it, so warm-up
// prompts are sent straight to the engine until a batch arrives.
func (g *kvGateway) warm(s *kvSimEngine) {
	g.t.Helper()
	deadline := time.Now().Add(kvWait)
	for i := 0; ; i++ {
		s.direct(g.t, kvPrompt(fmt.Sprintf("warm-%s-%d", s.name, i), 16))
		if testutil.Poll(200*time.Millisecond, func() bool { return g.status(s.name).Batches > 0 }) {
			break
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("engine %s: no KV-event batch reached the gateway within %v", s.name, kvWait)
		}
	}
	testutil.Eventually(g.t, kvWait, func() bool { return g.fresh(s.name) }, "engine %s fresh", s.name)
}

// TestKVEventsRoutesOnReportedBlocks: prompts an engine cached without the
// gateway ever seeing them (sent straight to it) are routed to it, every
// time, by precise-prefix, because its events reported the blocks; the
// engine then reports the prompt cached, exactly as predicted.
// Engine b publishes vLLM's older encoding (positional arrays), a the
// current one (maps).
func TestKVEventsRoutesOnReportedBlocks(t *testing.T) {
	a := kvSim(t, "a", false, enginesim.Config{}, nil)
	b := kvSim(t, "b", false, enginesim.Config{KVEventsEncoding: enginesim.KVEventsEncodingArray}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, nil, a, b)
	g.warm(a)
	g.warm(b)

	// Prompts seeded on alternating engines, 4 blocks each.
	const n = 6
	for i := range n {
		seeded := []*kvSimEngine{a, b}[i%2]
		prompt := kvPrompt(fmt.Sprintf("doc%d", i), 70)
		before := g.status(seeded.name).Blocks
		if r := seeded.direct(t, prompt); r.cached != 0 {
			t.Fatalf("seeding %s: %d tokens already cached", seeded.name, r.cached)
		}
		keys := seeded.keys(t, prompt)
		if len(keys) != 4 {
			t.Fatalf("prompt has %d token blocks, want 4", len(keys))
		}
		testutil.Eventually(t, kvWait, func() bool { return g.match(seeded.name, keys) == 4 },
			"the index to hold the 4 blocks of prompt %d on %s", i, seeded.name)
		if got := g.status(seeded.name).Blocks; got != before+4 {
			t.Errorf("prompt %d: %s holds %d blocks on /admin/engines, want %d", i, seeded.name, got, before+4)
		}
		exact := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionExact))
		for j := range 3 {
			r := g.chat(prompt)
			if r.status != http.StatusOK || r.engine != seeded.name {
				t.Fatalf("prompt %d, request %d: %d on %q, want 200 on %s (%s)", i, j, r.status, r.engine, seeded.name, r.body)
			}
			if r.cached != 64 {
				t.Errorf("prompt %d, request %d: %d cached tokens reported, want 64", i, j, r.cached)
			}
		}
		if got := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionExact)); got != exact+3 {
			t.Errorf("prompt %d: %s{outcome=exact} went from %d to %d, want +3", i, telemetry.KVPredictionsName, exact, got)
		}
	}
	if n := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionOver)) +
		g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionUnder)); n != 0 {
		t.Errorf("%d predictions over or under, want 0", n)
	}
	ix := g.admin().KVIndex
	if ix == nil || ix.Engines != 2 || ix.Stale != 0 || ix.TokenCache.Prompts != n {
		t.Errorf("kv_index on /admin/engines %+v, want 2 engines, none stale, %d prompts in the token cache", ix, n)
	}
	g.waitIdle()
}

// TestKVEventsPrefixAwareContrast: the same seeding with prefix-aware,
// which never saw the prompts: where their first requests go is its load
// choice, not the seeded engine (logged, not asserted: it is not
// reliably either engine).
func TestKVEventsPrefixAwareContrast(t *testing.T) {
	a := kvSim(t, "a", false, enginesim.Config{}, nil)
	b := kvSim(t, "b", false, enginesim.Config{}, nil)
	g := newKVGateway(t, routing.PrefixAwareName, nil, a, b)
	g.warm(a)
	g.warm(b)
	on := 0
	const n = 6
	for i := range n {
		seeded := []*kvSimEngine{a, b}[i%2]
		prompt := kvPrompt(fmt.Sprintf("doc%d", i), 70)
		seeded.direct(t, prompt)
		keys := seeded.keys(t, prompt)
		testutil.Eventually(t, kvWait, func() bool { return g.match(seeded.name, keys) == 4 }, "prompt %d in the index", i)
		r := g.chat(prompt)
		if r.status != http.StatusOK {
			t.Fatalf("prompt %d: %d %s", i, r.status, r.body)
		}
		if r.engine == seeded.name {
			on++
		}
	}
	if n := g.counter(telemetry.KVPredictionsName); n != 0 {
		t.Errorf("prefix-aware counted %d predictions, want 0 (it predicts nothing)", n)
	}
	t.Logf("prefix-aware: %d of %d first requests on the seeded engine (precise-prefix: all)", on, n)
	g.waitIdle()
}

// TestKVEventsGapReplayed: batches the engine did not send on PUB are
// replayed from its replay socket: one gap, one more replay, the index
// holds the dropped batches' blocks and the engine stays fresh.
func TestKVEventsGapReplayed(t *testing.T) {
	s := kvSim(t, "e1", true, enginesim.Config{}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, nil, s)
	g.warm(s)
	st0 := g.status(s.name)
	if st0.Replay == "" || !st0.Connected {
		t.Fatalf("kv_events %+v: want a replay endpoint, connected", st0)
	}
	next := uint64(s.e.KVEventsStats().Batches) // the next batch's seq
	if err := s.e.SetKVEventsDrop(fmt.Sprintf("%d-%d", next, next+1)); err != nil {
		t.Fatal(err)
	}
	p1, p2, p3 := kvPrompt("gap-one", 40), kvPrompt("gap-two", 40), kvPrompt("gap-three", 40)
	s.direct(t, p1)
	s.direct(t, p2)
	testutil.Eventually(t, kvWait, func() bool { return s.e.KVEventsStats().Withheld == 2 }, "2 batches withheld")
	if st := g.status(s.name); st.Blocks != st0.Blocks || st.LastSeq != next-1 {
		t.Fatalf("withheld batches reached the index: %+v", st)
	}
	s.direct(t, p3)
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).LastSeq == next+2 }, "the batch after the gap")
	st := g.status(s.name)
	if st.Gaps != st0.Gaps+1 || st.Replays != st0.Replays+1 || st.Restarts != 0 || st.DecodeErrors != 0 {
		t.Errorf("after the gap: gaps %d->%d, replays %d->%d, restarts %d, decode errors %d; want +1, +1, 0, 0",
			st0.Gaps, st.Gaps, st0.Replays, st.Replays, st.Restarts, st.DecodeErrors)
	}
	if st.Blocks != st0.Blocks+6 || st.Batches != st0.Batches+3 || !st.Fresh {
		t.Errorf("after the gap: %d blocks from %d batches, fresh %v; want %d from %d, fresh", st.Blocks, st.Batches, st.Fresh, st0.Blocks+6, st0.Batches+3)
	}
	for _, p := range []string{p1, p2, p3} {
		if m := g.match(s.name, s.keys(t, p)); m != 2 {
			t.Errorf("the index holds %d of the 2 blocks of %q, want 2", m, p[:12])
		}
	}
	// Routed on them: the replayed prompt is predicted cached, exactly.
	if r := g.chat(p1); r.status != http.StatusOK || r.cached != 32 {
		t.Errorf("replayed prompt: %d with %d cached tokens, want 200 with 32", r.status, r.cached)
	}
	if n := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionExact)); n != 1 {
		t.Errorf("%s{outcome=exact} = %d, want 1", telemetry.KVPredictionsName, n)
	}
	if n := g.counter(telemetry.KVGapsName); n != int64(st.Gaps) {
		t.Errorf("%s = %d, want %d as on /admin/engines", telemetry.KVGapsName, n, st.Gaps)
	}
	g.waitIdle()
}

// TestKVEventsGapWithoutReplay: without a replay socket a gap drops what
// the index held for the engine (the blocks before it are unknown): only
// the blocks of the batch after the gap are held; the engine is routed on
// the approximate index for stale_after while its events rebuild its
// blocks, then on them again (a prompt it holds but the index lost is then
// predicted uncached: under); requests succeed.
func TestKVEventsGapWithoutReplay(t *testing.T) {
	s := kvSim(t, "e1", false, enginesim.Config{}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, nil, s)
	g.warm(s)
	p0, p1, p2 := kvPrompt("kept", 40), kvPrompt("lost", 40), kvPrompt("after", 40)
	s.direct(t, p0)
	k0 := s.keys(t, p0)
	testutil.Eventually(t, kvWait, func() bool { return g.match(s.name, k0) == 2 }, "the first prompt's blocks")
	st0 := g.status(s.name)
	if st0.Replay != "" {
		t.Fatalf("replay endpoint %q, want none", st0.Replay)
	}
	if err := s.e.SetKVEventsDrop(fmt.Sprint(s.e.KVEventsStats().Batches)); err != nil {
		t.Fatal(err)
	}
	s.direct(t, p1)
	testutil.Eventually(t, kvWait, func() bool { return s.e.KVEventsStats().Withheld == 1 }, "1 batch withheld")
	s.direct(t, p2)
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Gaps == st0.Gaps+1 }, "the gap")
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Batches == st0.Batches+1 }, "the batch after the gap")
	st := g.status(s.name)
	if st.Blocks != 2 || st.Replays != 0 || st.Fresh {
		t.Errorf("after the gap: %d blocks, %d replays, fresh %v; want only the 2 blocks of the batch after it, 0, not fresh (rebuilding)", st.Blocks, st.Replays, st.Fresh)
	}
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Fresh }, "fresh again stale_after after the loss")
	if m0, m1, m2 := g.match(s.name, k0), g.match(s.name, s.keys(t, p1)), g.match(s.name, s.keys(t, p2)); m0 != 0 || m1 != 0 || m2 != 2 {
		t.Errorf("index holds %d, %d, %d blocks of the prompts before, in and after the gap; want 0, 0, 2", m0, m1, m2)
	}
	// The engine still holds the lost prompt: it answers, and reports
	// more cached than the index predicted.
	if r := g.chat(p1); r.status != http.StatusOK || r.engine != s.name || r.cached != 32 {
		t.Errorf("lost prompt: %d on %q with %d cached; want 200 on %s with 32 (%s)", r.status, r.engine, r.cached, s.name, r.body)
	}
	if n := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionUnder)); n != 1 {
		t.Errorf("%s{outcome=under} = %d, want 1", telemetry.KVPredictionsName, n)
	}
	g.waitIdle()
}

// TestKVEventsClearAndRestart: reset_prefix_cache on the engine
// (AllBlocksCleared) empties its index; a publisher restart (seq back to
// 0) is seen, and what the index held before it is dropped; new requests
// rebuild it.
//
// Speculative entries are off here: Drop keeps them by design ("its
// speculation and staleness go on"), so a prompt routed to the engine
// within speculative_ttl before its restart would still match through
// them, and the test reads what the events left in the index.
func TestKVEventsClearAndRestart(t *testing.T) {
	s := kvSim(t, "e1", false, enginesim.Config{}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, func(c *Config) { c.KVEvents.Index.SpeculativeTTL = 0 }, s)
	g.warm(s)
	p1 := kvPrompt("before-reset", 40)
	s.direct(t, p1)
	testutil.Eventually(t, kvWait, func() bool { return g.match(s.name, s.keys(t, p1)) == 2 }, "the prompt's blocks")
	if g.status(s.name).Blocks < 3 {
		t.Fatalf("blocks %d, want the warm-up's and the prompt's", g.status(s.name).Blocks)
	}

	resp, err := s.srv.Client().Post(s.srv.URL+"/reset_prefix_cache", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %d", resp.StatusCode)
	}
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Blocks == 0 }, "the index emptied by AllBlocksCleared")
	if !g.status(s.name).Fresh {
		t.Error("engine not fresh after AllBlocksCleared")
	}
	if n := g.counter(telemetry.KVEventsName, telemetry.AttrKVEventType.String(telemetry.KVEventCleared)); n != 1 {
		t.Errorf("%s{type=cleared} = %d, want 1", telemetry.KVEventsName, n)
	}

	// Through the gateway: the engine's events rebuild the index.
	p2 := kvPrompt("after-reset", 40)
	if r := g.chat(p2); r.status != http.StatusOK || r.cached != 0 {
		t.Fatalf("after the reset: %d with %d cached, want 200 with 0", r.status, r.cached)
	}
	k2 := s.keys(t, p2)
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Blocks == 2 }, "the new prompt's blocks")
	before := g.status(s.name)

	if err := s.e.RestartKVEvents(); err != nil {
		t.Fatal(err)
	}
	p3 := kvPrompt("after-restart", 40)
	s.direct(t, p3)
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Restarts == 1 }, "the restart")
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).LastSeq == 0 }, "the batch after the restart")
	st := g.status(s.name)
	if st.Blocks != 2 || !st.Fresh || st.Batches != before.Batches+1 {
		t.Errorf("after the restart: %d blocks, fresh %v, %d batches; want only the new batch's 2 blocks, fresh, %d", st.Blocks, st.Fresh, st.Batches, before.Batches+1)
	}
	if m2, m3 := g.match(s.name, k2), g.match(s.name, s.keys(t, p3)); m2 != 0 || m3 != 2 {
		t.Errorf("index holds %d of the blocks before the restart and %d after, want 0 and 2", m2, m3)
	}
	if n := g.counter(telemetry.KVRestartsName); n != 1 {
		t.Errorf("%s = %d, want 1", telemetry.KVRestartsName, n)
	}
	// The restarted engine lost p2 (a restart empties its cache): routed
	// again, it is stored again.
	if r := g.chat(p2); r.status != http.StatusOK || r.cached != 0 {
		t.Errorf("p2 after the restart: %d with %d cached, want 200 with 0", r.status, r.cached)
	}
	testutil.Eventually(t, kvWait, func() bool { return g.match(s.name, k2) == 2 && g.status(s.name).Blocks == 4 }, "the index rebuilt")
	g.waitIdle()
}

// TestKVEventsStaleFallbackAndReturn: an engine whose events stop while
// it is sent new prompts turns stale after stale_after (routed on the
// approximate index meanwhile, requests succeeding), which the fleet's
// check logs and counts; its events resuming make it fresh again.
func TestKVEventsStaleFallbackAndReturn(t *testing.T) {
	s := kvSim(t, "e1", false, enginesim.Config{}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, nil, s)
	g.warm(s)
	// The check (every second) has seen it fresh.
	testutil.Eventually(t, 3*time.Second, func() bool { return strings.Contains(g.logs.String(), "events are flowing") }, "the flowing log line")

	if err := s.e.SetKVEventsStopped(true); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	if r := g.chat(kvPrompt("stale-one", 40)); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if !g.fresh(s.name) && time.Since(stoppedAt) < 300*time.Millisecond {
		t.Error("stale before stale_after")
	}
	testutil.Eventually(t, 2*time.Second, func() bool { return !g.fresh(s.name) }, "the engine stale")
	if d := time.Since(stoppedAt); d < 300*time.Millisecond {
		t.Errorf("stale %v after the events stopped, before stale_after (300ms)", d)
	}
	if a := g.admin(); a.KVIndex == nil || a.KVIndex.Stale != 1 || g.status(s.name).Fresh {
		t.Errorf("/admin/engines: kv_index %+v, fresh %v; want 1 stale, not fresh", a.KVIndex, g.status(s.name).Fresh)
	}
	// Routed on the approximate index meanwhile.
	for i := range 3 {
		if r := g.chat(kvPrompt(fmt.Sprintf("while-stale-%d", i), 40)); r.status != http.StatusOK || r.engine != s.name {
			t.Fatalf("while stale: %d on %q (%s)", r.status, r.engine, r.body)
		}
	}
	if n := g.counter(telemetry.KVPredictionsName); n != 0 {
		t.Errorf("%d predictions while stale, want 0 (routed on the approximate index)", n)
	}
	testutil.Eventually(t, 3*time.Second, func() bool { return g.counter(telemetry.KVIndexFallbacksName) == 1 }, "the fallback counted")
	if n := g.gaugeValue(telemetry.KVIndexStaleName); n != 1 {
		t.Errorf("%s = %d, want 1", telemetry.KVIndexStaleName, n)
	}
	if !strings.Contains(g.logs.String(), "events are stale") {
		t.Errorf("no stale log line:\n%s", g.logs.String())
	}

	if err := s.e.SetKVEventsStopped(false); err != nil {
		t.Fatal(err)
	}
	back := kvPrompt("resumed", 40)
	if r := g.chat(back); r.status != http.StatusOK {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The batches withheld while stopped are a gap: what the index held
	// is dropped, and the resumed batch's blocks are all it holds.
	testutil.Eventually(t, kvWait, func() bool { st := g.status(s.name); return st.Gaps == 1 && st.Fresh }, "the engine fresh again")
	if !g.fresh(s.name) {
		t.Error("KVIndex.Fresh false after the resume")
	}
	if st := g.status(s.name); st.Blocks != 2 {
		t.Errorf("after the resume: %+v; want the resumed prompt's 2 blocks only", st)
	}
	testutil.Eventually(t, 3*time.Second, func() bool { return strings.Contains(g.logs.String(), "events resumed") }, "the resumed log line")
	if n := g.gaugeValue(telemetry.KVIndexStaleName); n != 0 {
		t.Errorf("%s = %d after the resume, want 0", telemetry.KVIndexStaleName, n)
	}
	if n := g.counter(telemetry.KVIndexFallbacksName); n != 1 {
		t.Errorf("%s = %d, want 1", telemetry.KVIndexFallbacksName, n)
	}
	g.waitIdle()
}

// TestKVEventsFaults: a few of the fault matrix's faults with
// precise-prefix and KV events on (runFaultCase takes no policy): the
// client gets the fault's answer, the duration its error.type, the engine
// its abort, and every gauge is back to 0 with no attempt live; the
// engine's events stay fresh.
func TestKVEventsFaults(t *testing.T) {
	for _, fc := range []struct {
		name    string
		fault   string
		stream  bool
		cancel  bool // the client leaves after the first content event
		status  int
		errType string
		aborted bool
	}{
		{name: "engine 500", fault: "status=500", status: 500, errType: "500"},
		{name: "engine 500 stream", fault: "status=500", stream: true, status: 500, errType: "500"},
		{name: "close mid-stream", fault: "close-after=3", stream: true, status: 200, errType: ErrTypeEngineDisconnect},
		{name: "close mid-body", fault: "close-after=3", status: 502, errType: ErrTypeEngineDisconnect},
		{name: "client gone mid-stream", stream: true, cancel: true, status: 200, errType: ErrTypeClientCancelled, aborted: true},
	} {
		t.Run(fc.name, func(t *testing.T) {
			s := kvSim(t, "e1", false, enginesim.Config{TTFT: 30 * time.Millisecond, ITL: 15 * time.Millisecond, OutputTokens: 8}, nil)
			g := newKVGateway(t, routing.PrecisePrefixName, func(c *Config) {
				c.Timeouts.ResponseHeader = 300 * time.Millisecond
				c.Timeouts.Idle = 300 * time.Millisecond
				c.Timeouts.Request = 5 * time.Second
				c.MaxAttempts = 1
				c.Migration.Limit = 0
			}, s)
			g.warm(s)
			prompt := kvPrompt("fault", 40)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			maxTokens := 6
			if fc.cancel {
				maxTokens = 400
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.srv.URL+"/v1/chat/completions", strings.NewReader(kvChatBody(prompt, fc.stream, maxTokens)))
			req.Header.Set("Content-Type", "application/json")
			if fc.fault != "" {
				req.Header.Set(enginesim.FaultHeader, fc.fault)
			}
			resp, err := g.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != fc.status {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, fc.status, b)
			}
			var got strings.Builder
			if fc.cancel {
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					if strings.Contains(sc.Text(), `"content":"tok`) {
						break
					}
				}
				cancel()
			} else {
				_, _ = io.Copy(&got, resp.Body)
			}
			resp.Body.Close()
			if fc.stream && !fc.cancel && fc.status == 200 && (!strings.Contains(got.String(), `data: {"error":`) || strings.Contains(got.String(), "[DONE]")) {
				t.Errorf("stream %q: want a final error event, no [DONE]", tail(got.String()))
			}
			if fc.aborted {
				waitAborted(t, s.e, 1)
			}
			g.waitIdle()
			if et := g.errorTypes(); len(et) != 1 || et[fc.errType] != 1 {
				t.Errorf("request.duration by error.type %v, want exactly 1 %q", et, fc.errType)
			}
			// The request went the precise way: its prompt was looked up
			// in the token cache.
			if n := g.counter(telemetry.TokenizeCacheName); n != 1 {
				t.Errorf("%s = %d, want 1", telemetry.TokenizeCacheName, n)
			}
			if !g.fresh(s.name) {
				t.Error("engine stale after the fault")
			}
			if r := g.chat(kvPrompt("after-fault", 40)); r.status != http.StatusOK {
				t.Errorf("after the fault: %d %s", r.status, r.body)
			}
			g.waitIdle()
		})
	}
}

// TestKVEventsTokenizerUnavailable: an engine whose /tokenize stalls, then
// fails: requests are routed all the same (on the approximate index) and
// succeed, each failed tokenization is counted, and no request waited for
// its tokens longer than max_wait (the switchboard.tokenize.wait
// histogram's max, not wall time).
func TestKVEventsTokenizerUnavailable(t *testing.T) {
	const stall = 500 * time.Millisecond
	const maxWait = 20 * time.Millisecond
	failing := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/tokenize" {
				next.ServeHTTP(w, r)
				return
			}
			select {
			case <-time.After(stall):
			case <-r.Context().Done():
				return
			}
			http.Error(w, `{"error":"tokenizer down"}`, http.StatusInternalServerError)
		})
	}
	a := kvSim(t, "a", false, enginesim.Config{}, failing)
	b := kvSim(t, "b", false, enginesim.Config{}, failing)
	g := newKVGateway(t, routing.PrecisePrefixName, func(c *Config) { c.KVEvents.Tokenize.MaxWait = maxWait }, a, b)
	g.warm(a)
	g.warm(b)
	const n = 5
	engines := map[string]int{}
	for i := range n {
		r := g.chat(kvPrompt(fmt.Sprintf("untokenized-%d", i), 40))
		if r.status != http.StatusOK || (r.engine != "a" && r.engine != "b") {
			t.Fatalf("request %d: %d on %q (%s)", i, r.status, r.engine, r.body)
		}
		engines[r.engine]++
	}
	testutil.Eventually(t, 3*stall+time.Second, func() bool {
		return g.histCount(telemetry.TokenizeDurationName, telemetry.AttrTokenizeOutcome.String("error")) == n
	}, "%d failed tokenizations", n)
	if c := g.histCount(telemetry.TokenizeDurationName, telemetry.AttrTokenizeOutcome.String("ok")); c != 0 {
		t.Errorf("%d tokenizations ok, want 0", c)
	}
	if c := g.counter(telemetry.TokenizeCacheName, telemetry.AttrTokenizeCache.String(telemetry.TokenizeMiss)); c != n {
		t.Errorf("%s{result=miss} = %d, want %d", telemetry.TokenizeCacheName, c, n)
	}
	count, lo, hi := g.histExtrema(telemetry.TokenizeWaitName)
	if count != n {
		t.Errorf("%s count %d, want %d", telemetry.TokenizeWaitName, count, n)
	}
	// Each waited max_wait (the tokenizer never answered in time), and not
	// more: the timer's latency aside (50 ms of slack), far from the
	// tokenizer's 500 ms.
	if lo < maxWait.Seconds() || hi > (maxWait+50*time.Millisecond).Seconds() {
		t.Errorf("%s from %.4fs to %.4fs, want within [%v, %v]", telemetry.TokenizeWaitName, lo, hi, maxWait, maxWait+50*time.Millisecond)
	}
	if n := g.counter(telemetry.KVPredictionsName); n != 0 {
		t.Errorf("%d predictions without tokens, want 0", n)
	}
	if ix := g.admin().KVIndex; ix == nil || ix.TokenCache.Prompts != 0 {
		t.Errorf("kv_index %+v, want an empty token cache", ix)
	}
	t.Logf("routed without tokens: %v", engines)
	g.waitIdle()
}

// TestKVEventsLoRAAdapter: a LoRA adapter's blocks are its own (the
// engine's events carry its lora_name, the gateway seeds the adapter's
// token keys with its name): a prompt seeded on one engine under the
// adapter is routed there for the adapter, exactly predicted, and the
// same prompt for the base model is not predicted cached anywhere.
func TestKVEventsLoRAAdapter(t *testing.T) {
	lora := enginesim.Config{LoRAs: []enginesim.LoRA{{Name: "sql", Path: "/adapters/sql"}}}
	a := kvSim(t, "a", false, lora, nil)
	b := kvSim(t, "b", false, lora, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, func(c *Config) {
		for i := range c.Engines {
			c.Engines[i].Models = nil // discovered: m and its adapter sql
		}
	}, a, b)
	g.gw.Fleet().ProbeNow(context.Background())
	if c, ok := g.gw.Fleet().Snapshot().Cards()["sql"]; !ok || c.Parent == nil || *c.Parent != "m" {
		t.Fatalf("model card of sql %+v (found %v), want an adapter of m", c, ok)
	}
	g.warm(a)
	g.warm(b)
	prompt := kvPrompt("adapter-doc", 70)
	body := func(model string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	}
	base := g.status(b.name).Blocks
	resp, err := b.srv.Client().Post(b.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body("sql")))
	if err != nil {
		t.Fatal(err)
	}
	if r := parseReply(t, resp); r.status != http.StatusOK {
		t.Fatalf("seeding b: %d %s", r.status, r.body)
	}
	if !testutil.Poll(kvWait, func() bool { return g.status(b.name).Blocks == base+4 }) {
		t.Fatalf("the index holds %d blocks for b, want %d: %+v; engine %+v; %d invalid events\n%s", g.status(b.name).Blocks, base+4, g.status(b.name), b.e.KVEventsStats(),
			g.counter(telemetry.KVEventsName, telemetry.AttrKVEventType.String(telemetry.KVEventInvalid)), g.logs.String())
	}
	for j := range 3 {
		r := parseReply(t, g.post("/v1/chat/completions", body("sql")))
		if r.status != http.StatusOK || r.engine != b.name || r.cached != 64 {
			t.Fatalf("adapter request %d: %d on %q with %d cached, want 200 on b with 64 (%s)", j, r.status, r.engine, r.cached, r.body)
		}
	}
	if n := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionExact)); n != 3 {
		t.Errorf("%s{outcome=exact} = %d, want 3", telemetry.KVPredictionsName, n)
	}
	// The base model's blocks of the same text are not the adapter's:
	// wherever it goes, it is predicted and found uncached.
	r := parseReply(t, g.post("/v1/chat/completions", body("m")))
	if r.status != http.StatusOK || r.cached != 0 {
		t.Errorf("base model request: %d with %d cached, want 200 with 0 (%s)", r.status, r.cached, r.body)
	}
	// Checked only on b: a's usage never carried cached tokens through the
	// gateway, and vLLM leaves them out when none are cached, so the
	// gateway cannot tell a's "0" from "not reported".
	want := int64(3)
	if r.engine == b.name {
		want = 4
	}
	if n := g.counter(telemetry.KVPredictionsName, telemetry.AttrKVPrediction.String(telemetry.KVPredictionExact)); n != want {
		t.Errorf("%s{outcome=exact} = %d after the base model's request on %s, want %d", telemetry.KVPredictionsName, n, r.engine, want)
	}
	if n := g.counter(telemetry.KVPredictionsName); n != want {
		t.Errorf("%s = %d, want %d, all exact", telemetry.KVPredictionsName, n, want)
	}
	g.waitIdle()
}

// TestKVEventsReplayFailed: a gap the engine's replay buffer no longer
// covers (kv_events buffer_steps of 1) is a failed replay: what the index
// held is dropped, and only the batch after the gap is held.
func TestKVEventsReplayFailed(t *testing.T) {
	s := kvSim(t, "e1", true, enginesim.Config{KVEventsBuffer: 1}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, nil, s)
	g.warm(s)
	st0 := g.status(s.name)
	failed := func() int64 {
		return g.counter(telemetry.KVReplaysName, telemetry.AttrKVReplayOutcome.String("failed"))
	}
	f0 := failed()
	next := s.e.KVEventsStats().Batches
	if err := s.e.SetKVEventsDrop(fmt.Sprintf("%d-%d", next, next+1)); err != nil {
		t.Fatal(err)
	}
	p1, p2, p3 := kvPrompt("gone-one", 40), kvPrompt("gone-two", 40), kvPrompt("after-hole", 40)
	s.direct(t, p1)
	s.direct(t, p2)
	testutil.Eventually(t, kvWait, func() bool { return s.e.KVEventsStats().Withheld == 2 }, "2 batches withheld")
	s.direct(t, p3)
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).LastSeq == uint64(next)+2 }, "the batch after the gap")
	st := g.status(s.name)
	if st.Gaps != st0.Gaps+1 || st.Replays != st0.Replays || failed() != f0+1 {
		t.Errorf("gaps %d->%d, replays ok %d->%d, failed %d->%d; want +1, +0, +1", st0.Gaps, st.Gaps, st0.Replays, st.Replays, f0, failed())
	}
	if st.Blocks != 2 || st.Fresh {
		t.Errorf("after the failed replay: %d blocks, fresh %v; want only the 2 of the batch after the gap, not fresh (rebuilding for stale_after)", st.Blocks, st.Fresh)
	}
	testutil.Eventually(t, kvWait, func() bool { return g.status(s.name).Fresh }, "fresh again stale_after after the loss")
	if m1, m2, m3 := g.match(s.name, s.keys(t, p1)), g.match(s.name, s.keys(t, p2)), g.match(s.name, s.keys(t, p3)); m1 != 0 || m2 != 0 || m3 != 2 {
		t.Errorf("index holds %d, %d, %d blocks of the prompts in and after the gap; want 0, 0, 2", m1, m2, m3)
	}
	g.waitIdle()
}

// TestKVEventsEngineRemovedAndBack: an engine removed by a reload leaves
// the index (its subscription ends); added back, it is subscribed anew, and
// its replay socket gives the new subscription the blocks it stored
// before, so a prompt seeded on it is routed to it again.
func TestKVEventsEngineRemovedAndBack(t *testing.T) {
	a := kvSim(t, "a", true, enginesim.Config{}, nil)
	b := kvSim(t, "b", true, enginesim.Config{}, nil)
	g := newKVGateway(t, routing.PrecisePrefixName, nil, a, b)
	g.warm(a)
	g.warm(b)
	prompt := kvPrompt("kept-on-b", 70)
	b.direct(t, prompt)
	keys := b.keys(t, prompt)
	testutil.Eventually(t, kvWait, func() bool { return g.match(b.name, keys) == 4 }, "the prompt on b")
	if ix := g.admin().KVIndex; ix == nil || ix.Engines != 2 {
		t.Fatalf("kv_index %+v, want 2 engines", ix)
	}

	both := g.gw.cfg
	only := both
	only.Engines = []fleet.EngineConfig{a.config()}
	g.reload(only, g.policy())
	testutil.Eventually(t, kvWait, func() bool { ix := g.admin().KVIndex; return ix != nil && ix.Engines == 1 }, "b forgotten by the index")
	if len(g.admin().Engines) != 1 {
		t.Errorf("/admin/engines lists %d engines, want 1", len(g.admin().Engines))
	}
	if r := g.chat(kvPrompt("while-b-gone", 40)); r.status != http.StatusOK || r.engine != a.name {
		t.Errorf("without b: %d on %q, want 200 on a (%s)", r.status, r.engine, r.body)
	}

	g.reload(both, g.policy())
	testutil.Eventually(t, kvWait, func() bool {
		for _, e := range g.admin().Engines {
			if e.Name == b.name {
				return true
			}
		}
		return false
	}, "b back")
	// b's next batch starts the new subscription, which catches up from
	// b's replay buffer: the prompt's blocks are known again.
	g.warm(b)
	testutil.Eventually(t, kvWait, func() bool { return g.match(b.name, keys) == 4 && g.fresh(b.name) }, "b's earlier blocks replayed")
	if r := g.chat(prompt); r.status != http.StatusOK || r.engine != b.name || r.cached != 64 {
		t.Errorf("b back: %d on %q with %d cached, want 200 on b with 64 (%s)", r.status, r.engine, r.cached, r.body)
	}
	if ix := g.admin().KVIndex; ix == nil || ix.Engines != 2 || ix.Stale != 0 {
		t.Errorf("kv_index %+v, want 2 engines, none stale", ix)
	}
	g.waitIdle()
}
