package gateway

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// tokenizer gives requests their token keys (routing.Request.TokenKeys)
// for a policy that routes on the engines' KV-cache events. The tokens
// come from an engine's own /tokenize (vLLM's, with "messages" for chat so
// that the model's chat template applies, exactly as the engine will
// render the prompt), never from a tokenizer of the gateway's, which could
// disagree with the engine's template or version.
//
// The tokens are cached under the prompt's text-prefix hashes
// (routing.Request.PrefixHashes, the chained hashes of the prompt's
// 64-byte text blocks that the approximate index keys on), every one of
// them, so that:
//
//   - the same prompt again is a hit: its keys at once;
//   - a prompt that extends a cached one (a conversation's next turn; the
//     same system prompt or document with another question) finds the
//     longest cached text prefix and routes at once on the token blocks
//     of that shared prefix, without waiting for its own tokenization: the
//     shared prefix is the part an engine can hold, the rest is new;
//   - a miss waits at most TokenizeConfig.MaxWait for its tokenization,
//     then routes on the approximate index.
//
// Every prompt not a hit is tokenized whole, off the request path, for
// the requests that follow it. Why not only its new part: an engine's
// tokens for a conversation are not the cached turn's tokens followed by
// the new messages' tokens in general (chat templates add a default system
// prompt when none is given, as Llama 3's and Qwen 2.5's do, or drop the
// reasoning of earlier turns, as Qwen 3's does; BPE merges across the
// boundary), and vLLM's /tokenize gives no offsets to cut at. The cached
// prefix's blocks are taken up to the shared fraction of the text, less
// one block, which the template and merges can shift.
//
// A slow or failing engine never blocks a request beyond MaxWait, and at
// most Concurrency calls run at once (a prompt that finds them busy is not
// tokenized). The cache holds at most CacheBlocks blocks (keys plus text
// hashes), evicting the least recently used prompt.
type tokenizer struct {
	cfg       TokenizeConfig
	blockSize int
	client    *http.Client
	metrics   *telemetry.Metrics
	log       *slog.Logger
	base      context.Context // cancelled when the server closes
	sem       chan struct{}
	wg        sync.WaitGroup

	mu      sync.Mutex
	byText  map[uint64]*tokEntry // text-prefix hash -> the latest prompt registered under it
	lru     list.List            // of *tokEntry, most recently used first
	held    int                  // blocks held: len(keys)+len(text) over the entries
	pending map[tokKey]*tokCall
}

// tokEntry is one tokenized prompt.
type tokEntry struct {
	text   []uint64 // its text-prefix hashes, each registered in byText (unless overwritten)
	bytes  int      // its PromptBytes
	keys   []uint64 // the token keys of all its full token blocks; never modified
	tokens int      // its number of tokens
	el     *list.Element
}

// tokKey identifies a prompt: its last text-prefix hash, their number and
// its size.
type tokKey struct {
	last     uint64
	n, bytes int
}

// tokCall is one tokenization in flight; done is closed when keys is set
// (ok) or it failed.
type tokCall struct {
	done   chan struct{}
	keys   []uint64
	tokens int
	ok     bool
}

func newTokenizer(cfg KVEventsConfig, client *http.Client, m *telemetry.Metrics, log *slog.Logger, base context.Context) *tokenizer {
	t := &tokenizer{cfg: cfg.Tokenize, blockSize: cfg.BlockSize, client: client, metrics: m, log: log, base: base,
		sem: make(chan struct{}, cfg.Tokenize.Concurrency), byText: map[uint64]*tokEntry{}, pending: map[tokKey]*tokCall{}}
	t.lru.Init()
	return t
}

// The results of lookup.
const (
	tokHit     = telemetry.TokenizeHit
	tokPartial = telemetry.TokenizePartial
	tokMiss    = telemetry.TokenizeMiss
)

// lookup returns what the cache knows of the prompt with these text-prefix
// hashes and size: its token keys and its number of full token blocks
// (exact on a hit; estimated from the text on a partial match), and the
// result. keys is shared: read it only.
func (t *tokenizer) lookup(text []uint64, promptBytes int) (keys []uint64, total int, result string) {
	keys, total, _, result = t.lookupTokens(text, promptBytes)
	return keys, total, result
}

// lookupTokens is lookup, with the prompt's number of tokens on a hit (0
// otherwise).
func (t *tokenizer) lookupTokens(text []uint64, promptBytes int) (keys []uint64, total, tokens int, result string) {
	n := len(text)
	if n == 0 {
		return nil, 0, 0, tokMiss
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	j := n - 1
	e := t.byText[text[j]]
	if e == nil {
		// The registered text prefixes of the cache are closed under
		// prefixes (every prompt registers all of its), so the longest
		// present one is found by bisection.
		lo, hi := 0, n-1 // text[:lo] present or lo == 0; text[hi] absent
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if t.byText[text[mid]] != nil {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo == 0 {
			return nil, 0, 0, tokMiss
		}
		j = lo - 1
		if e = t.byText[text[j]]; e == nil {
			return nil, 0, 0, tokMiss
		}
	}
	t.lru.MoveToFront(e.el)
	if j == n-1 && len(e.text) == n && e.bytes == promptBytes {
		return e.keys, len(e.keys), e.tokens, tokHit
	}
	usable := len(e.keys) * (j + 1) / len(e.text)
	if usable > 0 {
		usable-- // the text boundary falls inside a token block, or the template shifts it
	}
	if usable == 0 {
		return nil, 0, 0, tokMiss
	}
	total = max(usable, (len(e.keys)*n+len(e.text)-1)/len(e.text))
	return e.keys[:usable], total, 0, tokPartial
}

// tokenizeReq is what a request's tokenization needs, taken from it before
// it may end.
type tokenizeReq struct {
	key   tokKey
	text  []uint64 // the prompt's text-prefix hashes (a copy)
	bytes int
	body  []byte // the client's body (a copy)
	model string // the engines' model name
	chat  bool   // chat completions: tokenize its messages
	seed  uint64 // the token keys' seed: 0, or the LoRA adapter's name hashed
	url   string // the engine's /tokenize
	auth  []string
}

// start starts the tokenization of r, or joins the one in flight for the
// same prompt; nil when every call slot is busy.
func (t *tokenizer) start(r *tokenizeReq) *tokCall {
	t.mu.Lock()
	if c := t.pending[r.key]; c != nil {
		t.mu.Unlock()
		return c
	}
	select {
	case t.sem <- struct{}{}:
	default:
		t.mu.Unlock()
		return nil
	}
	c := &tokCall{done: make(chan struct{})}
	t.pending[r.key] = c
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		t0 := time.Now()
		keys, tokens, err := t.call(r)
		t.metrics.RecordTokenize(context.Background(), time.Since(t0).Seconds(), err == nil)
		if err != nil && t.base.Err() == nil {
			t.log.Debug("tokenization for routing failed; the request is routed on the approximate index", "model", r.model, "error", err)
		}
		t.mu.Lock()
		if err == nil {
			c.keys, c.tokens, c.ok = keys, tokens, true
			t.insertLocked(r.text, r.bytes, keys, tokens)
		}
		delete(t.pending, r.key)
		t.mu.Unlock()
		close(c.done)
		<-t.sem
	}()
	return c
}

// maxTokenizeReply caps a /tokenize reply read: a token id is at most 11
// bytes of JSON, so 32 MiB holds a prompt of 3 M tokens.
const maxTokenizeReply = 32 << 20

// call asks the engine for r's tokens and returns their keys and number.
func (t *tokenizer) call(r *tokenizeReq) ([]uint64, int, error) {
	var in struct {
		Messages             json.RawMessage `json:"messages"`
		Prompt               json.RawMessage `json:"prompt"`
		Tools                json.RawMessage `json:"tools"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
		AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
		ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	}
	if err := json.Unmarshal(r.body, &in); err != nil {
		return nil, 0, err
	}
	out := map[string]json.RawMessage{}
	model, _ := json.Marshal(r.model)
	out["model"] = model
	if r.chat {
		out["messages"] = in.Messages
		for k, v := range map[string]json.RawMessage{"tools": in.Tools, "chat_template_kwargs": in.ChatTemplateKwargs,
			"add_generation_prompt": in.AddGenerationPrompt, "continue_final_message": in.ContinueFinalMessage} {
			if len(v) > 0 && string(v) != "null" {
				out[k] = v
			}
		}
	} else {
		var ids []uint32
		if json.Unmarshal(in.Prompt, &ids) == nil {
			// A prompt of token ids is its own tokenization.
			return stablehash.TokenBlocks(nil, ids, t.blockSize, r.seed), len(ids), nil
		}
		var s string
		if err := json.Unmarshal(in.Prompt, &s); err != nil {
			return nil, 0, errors.New("prompt is neither a string nor token ids")
		}
		out["prompt"] = in.Prompt
	}
	body, err := json.Marshal(out)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(t.base, t.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.auth != nil {
		req.Header["Authorization"] = r.auth
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, 0, fmt.Errorf("/tokenize answered %s", resp.Status)
	}
	var reply struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenizeReply)).Decode(&reply); err != nil {
		return nil, 0, fmt.Errorf("/tokenize reply: %w", err)
	}
	return stablehash.TokenBlocks(nil, reply.Tokens, t.blockSize, r.seed), len(reply.Tokens), nil
}

// insertLocked caches keys as the tokens of the prompt with these text
// hashes and size, evicting the least recently used prompts beyond the
// cap. Under t.mu.
func (t *tokenizer) insertLocked(text []uint64, promptBytes int, keys []uint64, tokens int) {
	if cur := t.byText[text[len(text)-1]]; cur != nil && len(cur.text) == len(text) && cur.bytes == promptBytes {
		t.removeLocked(cur) // the same prompt tokenized again: the newer wins
	}
	e := &tokEntry{text: text, bytes: promptBytes, keys: keys, tokens: tokens}
	e.el = t.lru.PushFront(e)
	for _, h := range text {
		t.byText[h] = e
	}
	t.held += len(keys) + len(text)
	for t.held > t.cfg.CacheBlocks && t.lru.Len() > 1 {
		t.removeLocked(t.lru.Back().Value.(*tokEntry))
	}
}

// removeLocked drops e and its registrations (those not taken over by a
// later prompt). Under t.mu.
func (t *tokenizer) removeLocked(e *tokEntry) {
	t.lru.Remove(e.el)
	for _, h := range e.text {
		if t.byText[h] == e {
			delete(t.byText, h)
		}
	}
	t.held -= len(e.keys) + len(e.text)
}

// close waits for the tokenizations in flight (the server's base context
// is cancelled first, which ends them).
func (t *tokenizer) close() { t.wg.Wait() }

// tokenKeys sets rreq's token keys for a policy that routes on KV-cache
// events (set.kvBlocks > 0), from the cache or, on a miss, from a
// tokenization it waits for at most MaxWait; it starts the prompt's
// tokenization unless the cache had it whole. Only chat and completions
// prompts are tokenized. It never fails: without keys the policy routes on
// the approximate index.
func (s *Server) tokenKeys(ctx context.Context, op *operation, in *inbound, rt *fleet.Route, rreq *routing.Request) {
	t := s.tok
	if t == nil || len(rreq.PrefixHashes) == 0 || (op.name != "chat" && op.name != "completions") || in.req.PromptBatch {
		return
	}
	t0 := time.Now()
	keys, total, tokens, result := t.lookupTokens(rreq.PrefixHashes, rreq.PromptBytes)
	if result == tokHit {
		rreq.TokenKeys, rreq.TokenBlocks, in.kvPromptTokens = keys, total, tokens
		s.metrics.RecordTokenizeLookup(ctx, tokHit, 0)
		return
	}
	var call *tokCall
	if eng := tokenizingEngine(rt); eng != nil {
		if url, ok := eng.PathURL("/tokenize"); ok {
			seed := uint64(0)
			if c, ok := s.fleet.Snapshot().Cards()[in.target]; ok && c.Parent != nil {
				seed = stablehash.String(in.target) // a LoRA adapter's blocks are its own
			}
			call = t.start(&tokenizeReq{
				key:  tokKey{last: rreq.PrefixHashes[len(rreq.PrefixHashes)-1], n: len(rreq.PrefixHashes), bytes: rreq.PromptBytes},
				text: append([]uint64(nil), rreq.PrefixHashes...), bytes: rreq.PromptBytes,
				body: bytes.Clone(in.body), model: in.target, chat: op.name == "chat", seed: seed,
				url: url, auth: eng.Auth(),
			})
		}
	}
	if result == tokPartial || call == nil || t.cfg.MaxWait <= 0 {
		rreq.TokenKeys, rreq.TokenBlocks = keys, total
		s.metrics.RecordTokenizeLookup(ctx, result, time.Since(t0).Seconds())
		return
	}
	timer := time.NewTimer(t.cfg.MaxWait)
	select {
	case <-call.done:
		if call.ok {
			rreq.TokenKeys, rreq.TokenBlocks, in.kvPromptTokens = call.keys, len(call.keys), call.tokens
		}
	case <-timer.C:
	case <-ctx.Done():
	}
	timer.Stop()
	s.metrics.RecordTokenizeLookup(ctx, tokMiss, time.Since(t0).Seconds())
}

// tokenizingEngine returns the engine of rt to ask for tokens: the routable
// one with the fewest requests in flight (a tokenization is light, but a
// loaded engine answers it later), nil when none is.
func tokenizingEngine(rt *fleet.Route) *fleet.Engine {
	var best *fleet.Engine
	var bestLoad int64
	for _, e := range rt.Engines() {
		pf, dc := e.Endpoint().InFlight()
		if best == nil || pf+dc < bestLoad {
			best, bestLoad = e, pf+dc
		}
	}
	return best
}
