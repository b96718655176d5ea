package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/stablehash"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// tokenizerFor returns a tokenizer with cfg's settings over a client, and
// its cleanup.
func tokenizerFor(t *testing.T, cfg KVEventsConfig) *tokenizer {
	t.Helper()
	m, err := telemetry.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tk := newTokenizer(cfg, &http.Client{}, m, slog.New(slog.DiscardHandler), ctx)
	t.Cleanup(func() { cancel(); tk.close() })
	return tk
}

// lookup is lookupTokens without the token count.
func (t *tokenizer) lookup(p tokPrompt) (keys []uint64, total int, result string) {
	keys, total, _, result = t.lookupTokens(p)
	return keys, total, result
}

// tp is the tokPrompt of text hashes text and size n: 64-byte blocks,
// not capped, no template members.
func tp(text []uint64, n int) tokPrompt { return tokPrompt{text: text, bytes: n, blockBytes: 64} }

// seq returns n ids from start.
func seq(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// TestTokenCacheLookup: the same prompt is a hit with its keys; a prompt
// extending a cached one finds the cached blocks of the shared text (its
// share, less one block) and estimates its own block count; a prompt
// sharing nothing misses; an evicted prompt misses.
func TestTokenCacheLookup(t *testing.T) {
	cfg := DefaultKVEventsConfig()
	tk := tokenizerFor(t, cfg)
	// A prompt of 10 text blocks whose tokens make 20 token blocks.
	text := []uint64{11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	keys := stablehash.TokenBlocks(nil, seq(0, 320), 16, 0)
	tk.mu.Lock()
	tk.insertLocked(tp(text, 640), keys, 320)
	tk.mu.Unlock()

	got, total, res := tk.lookup(tp(text, 640))
	if res != tokHit || total != 20 || !slices.Equal(got, keys) {
		t.Fatalf("same prompt: %s, %d of %d keys; want hit with all 20", res, len(got), total)
	}
	// Same blocks, another size: the tail differs.
	if _, _, res := tk.lookup(tp(text, 650)); res != tokPartial {
		t.Errorf("same blocks, other tail: %s, want partial", res)
	}
	// The next turn: the 10 blocks, then 10 new ones.
	next := append(slices.Clone(text), 21, 22, 23, 24, 25, 26, 27, 28, 29, 30)
	got, total, res = tk.lookup(tp(next, 1300))
	if res != tokPartial || len(got) != 19 || total != 40 || !slices.Equal(got, keys[:19]) {
		t.Errorf("next turn: %s, %d keys of %d; want partial, the first 19 keys of 40", res, len(got), total)
	}
	// Another question on the first half of the document.
	half := append(slices.Clone(text[:5]), 31, 32)
	got, total, res = tk.lookup(tp(half, 450))
	if res != tokPartial || len(got) != 9 || total != 14 || !slices.Equal(got, keys[:9]) {
		t.Errorf("shared half: %s, %d keys of %d; want partial, the first 9 keys (10 less one) of 14", res, len(got), total)
	}
	if _, _, res := tk.lookup(tp([]uint64{99, 98}, 128)); res != tokMiss {
		t.Errorf("unrelated prompt: %s, want miss", res)
	}
	if _, _, res := tk.lookup(tp(nil, 10)); res != tokMiss {
		t.Errorf("no text blocks: %s, want miss", res)
	}
}

// TestTokenCacheCappedAndTemplate: a prompt whose text hashes stop before
// its end (routing.prefix.max_blocks) is never a hit, and its share of a
// cached capped prompt is taken by bytes; a request with other template
// members (tools, ...) does not see another's tokens.
func TestTokenCacheCappedAndTemplate(t *testing.T) {
	tk := tokenizerFor(t, DefaultKVEventsConfig())
	text := []uint64{1, 2, 3, 4}
	long := tokPrompt{text: text, bytes: 4 * 64 * 10, capped: true, blockBytes: 64} // 2,560 bytes, hashed 256
	keys := stablehash.TokenBlocks(nil, seq(0, 640), 16, 0)                         // 40 blocks
	tk.mu.Lock()
	tk.insertLocked(long, keys, 640)
	tk.mu.Unlock()
	got, _, res := tk.lookup(long)
	if res != tokPartial || len(got) != 3 {
		t.Errorf("the same capped prompt: %s with %d keys; want partial with 3 (256 of 2,560 bytes of 40 blocks, less one)", res, len(got))
	}
	withTools := tp(text, 4*64*10)
	withTools.variant = 7
	if _, _, res := tk.lookup(withTools); res != tokMiss {
		t.Errorf("the same text with other template members: %s, want miss", res)
	}
	tk.mu.Lock()
	tk.insertLocked(withTools, keys[:10], 160)
	tk.mu.Unlock()
	if got, _, res := tk.lookup(withTools); res != tokHit || len(got) != 10 {
		t.Errorf("with its own template members: %s with %d keys, want hit with 10", res, len(got))
	}
	if got, _, _ := tk.lookup(long); len(got) != 3 {
		t.Errorf("the plain prompt after the variant's insert: %d keys, want still 3", len(got))
	}
}

// TestTokenCacheBounded: the cache holds at most cache_blocks blocks,
// forgetting the least recently used prompts, whatever arrives.
func TestTokenCacheBounded(t *testing.T) {
	cfg := DefaultKVEventsConfig()
	cfg.Tokenize.CacheBlocks = 1024
	tk := tokenizerFor(t, cfg)
	for i := range 1000 {
		text := []uint64{uint64(i)<<32 | 1, uint64(i)<<32 | 2, uint64(i)<<32 | 3}
		tk.mu.Lock()
		tk.insertLocked(tp(text, 192), stablehash.TokenBlocks(nil, seq(i, 16*6), 16, 0), 96)
		tk.mu.Unlock()
		if i == 0 {
			// Used again now and then, the first prompt stays.
			defer func() {
				if _, _, res := tk.lookup(tp(text, 192)); res != tokHit {
					t.Errorf("the prompt used all along: %s, want hit", res)
				}
			}()
		}
		if i%50 == 0 {
			tk.lookup(tp([]uint64{1, 2, 3}, 192))
		}
	}
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.held > 1024 || tk.held != tk.lru.Len()*9 {
		t.Errorf("held %d blocks for %d prompts of 9; want at most 1024, 9 each", tk.held, tk.lru.Len())
	}
	if len(tk.byText) != tk.lru.Len()*3 {
		t.Errorf("%d text registrations for %d prompts of 3 blocks", len(tk.byText), tk.lru.Len())
	}
}

// tokenizeServer is a fake engine's /tokenize: the request's messages'
// or prompt's bytes as token ids, after delay; it counts calls.
type tokenizeServer struct {
	calls  atomic.Int64
	delay  time.Duration
	status int
	last   atomic.Pointer[map[string]json.RawMessage]
}

func (ts *tokenizeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ts.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	var in map[string]json.RawMessage
	_ = json.Unmarshal(body, &in)
	ts.last.Store(&in)
	if ts.delay > 0 {
		select {
		case <-time.After(ts.delay):
		case <-r.Context().Done():
			return
		}
	}
	if ts.status != 0 {
		w.WriteHeader(ts.status)
		return
	}
	src := in["messages"]
	if src == nil {
		src = in["prompt"]
	}
	toks := make([]int, len(src))
	for i, b := range src {
		toks[i] = int(b)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(toks), "tokens": toks, "max_model_len": 4096})
}

// TestTokenizeCall: a chat request is tokenized with its messages and its
// template options, a completion with its prompt, and a prompt of token
// ids is its own tokens; the keys are the token blocks of the reply.
func TestTokenizeCall(t *testing.T) {
	ts := &tokenizeServer{}
	srv := httptest.NewServer(ts)
	defer srv.Close()
	tk := tokenizerFor(t, DefaultKVEventsConfig())

	msgs := `[{"role":"user","content":"` + string(make([]byte, 0)) + `hello there, this is a long enough prompt to make two blocks of sixteen tokens"}]`
	keys, _, err := tk.call(&tokenizeReq{body: []byte(`{"model":"m","messages":` + msgs + `,"add_generation_prompt":false,"tools":null}`),
		model: "served", chat: true, url: srv.URL + "/tokenize"})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, len(msgs))
	for i := range msgs {
		want[i] = uint32(msgs[i])
	}
	if wk := stablehash.TokenBlocks(nil, want, 16, 0); !slices.Equal(keys, wk) || len(keys) == 0 {
		t.Errorf("chat keys %v, want %v", keys, wk)
	}
	last := *ts.last.Load()
	if string(last["model"]) != `"served"` || string(last["add_generation_prompt"]) != "false" || last["tools"] != nil || last["prompt"] != nil {
		t.Errorf("chat /tokenize body %v: want model served, messages, add_generation_prompt false, no tools", last)
	}

	keys, _, err = tk.call(&tokenizeReq{body: []byte(`{"model":"m","prompt":"` + string(slices.Repeat([]byte("a"), 40)) + `"}`), model: "m", url: srv.URL + "/tokenize", seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	pw := slices.Repeat([]uint32{'a'}, 40)
	pw = append([]uint32{'"'}, append(pw, '"')...)
	if wk := stablehash.TokenBlocks(nil, pw, 16, 7); !slices.Equal(keys, wk) {
		t.Errorf("completion keys %v, want %v (seeded)", keys, wk)
	}

	calls := ts.calls.Load()
	keys, _, err = tk.call(&tokenizeReq{body: []byte(`{"model":"m","prompt":[` + "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17" + `]}`), model: "m", url: srv.URL + "/tokenize"})
	if err != nil || ts.calls.Load() != calls {
		t.Fatalf("token-id prompt: %v, %d calls; want its own tokens, no call", err, ts.calls.Load()-calls)
	}
	if wk := stablehash.TokenBlocks(nil, seq(1, 16), 16, 0); !slices.Equal(keys, wk) {
		t.Errorf("token-id keys %v, want %v", keys, wk)
	}

	ts.status = http.StatusBadRequest
	if _, _, err := tk.call(&tokenizeReq{body: []byte(`{"prompt":"x"}`), url: srv.URL + "/tokenize"}); err == nil {
		t.Error("a 400 from /tokenize: no error")
	}
}

// TestTokenizeStartSingleFlightAndBusy: concurrent starts of one prompt
// share a call; with every call slot busy a new prompt is not tokenized;
// a finished call fills the cache.
func TestTokenizeStartSingleFlightAndBusy(t *testing.T) {
	release := make(chan struct{})
	ts := &tokenizeServer{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		ts.ServeHTTP(w, r)
	}))
	defer srv.Close()
	cfg := DefaultKVEventsConfig()
	cfg.Tokenize.Concurrency = 1
	tk := tokenizerFor(t, cfg)
	builds := 0
	start := func(last uint64) *tokCall {
		key := tokKey{last: last, n: 1, bytes: 70}
		return tk.start(key, func() *tokenizeReq {
			builds++
			return &tokenizeReq{key: key, tokPrompt: tp([]uint64{last}, 70),
				body: []byte(`{"prompt":"` + string(slices.Repeat([]byte("b"), 70)) + `"}`), url: srv.URL}
		})
	}
	a, b := start(1), start(1)
	if a == nil || a != b {
		t.Fatalf("two starts of one prompt: %p, %p; want one call", a, b)
	}
	if c := start(2); c != nil {
		t.Errorf("another prompt with the only slot busy: a call, want none")
	}
	if builds != 1 {
		t.Errorf("the request was copied %d times, want once (for the call that started)", builds)
	}
	close(release)
	<-a.done
	if !a.ok || len(a.keys) != 4 {
		t.Fatalf("call: ok %v, %d keys; want 4 (72 tokens)", a.ok, len(a.keys))
	}
	if _, total, res := tk.lookup(tp([]uint64{1}, 70)); res != tokHit || total != 4 {
		t.Errorf("after the call: %s with %d blocks, want a hit with 4", res, total)
	}
	if ts.calls.Load() != 1 {
		t.Errorf("%d /tokenize calls, want 1", ts.calls.Load())
	}
}

// BenchmarkTokenCacheLookup: a conversation's next turn (partial hit) and
// the same prompt again (hit) in a cache of 1,000 prompts of 440 text
// blocks (28 KiB, ~7,000 tokens each).
func BenchmarkTokenCacheLookup(b *testing.B) {
	cfg := DefaultKVEventsConfig()
	m, _ := telemetry.NewMetrics(nil)
	tk := newTokenizer(cfg, &http.Client{}, m, slog.New(slog.DiscardHandler), context.Background())
	var last []uint64
	for p := range 1000 {
		text := make([]uint64, 440)
		for i := range text {
			text[i] = stablehash.Mix64(uint64(p)<<32 | uint64(i))
		}
		tk.mu.Lock()
		tk.insertLocked(tp(text, 440*64), stablehash.TokenBlocks(nil, seq(p, 7000), 16, 0), 7000)
		tk.mu.Unlock()
		last = text
	}
	next := append(slices.Clone(last), 1, 2, 3, 4, 5, 6, 7, 8)
	b.Run("partial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, res := tk.lookup(tp(next, 448*64)); res != tokPartial {
				b.Fatal(res)
			}
		}
	})
	b.Run("hit", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, res := tk.lookup(tp(last, 440*64)); res != tokHit {
				b.Fatal(res)
			}
		}
	})
}
