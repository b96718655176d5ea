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
	"slices"
	"sync"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/oai"
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
	byText  map[uint64]*tokEntry // text-prefix hash (mixed with the template's) -> the latest prompt registered under it
	lru     list.List            // of *tokEntry, most recently used first
	held    int                  // blocks held: len(keys)+len(text) over the entries
	pending map[tokKey]*tokCall
	closed  bool // close ran: no call starts
}

// tokPrompt is a prompt as the cache knows it: its text-prefix hashes
// (routing.Request.PrefixHashes), its size (PromptBytes), the hash of the
// request's members that change its rendering (oai.TemplateHash: tools,
// chat_template_kwargs, ...; 0 for none), and whether its hashes stop
// before its end (routing.prefix.max_blocks reached).
type tokPrompt struct {
	text       []uint64
	bytes      int
	variant    uint64
	capped     bool
	blockBytes int // the text blocks' size (routing.prefix.block_bytes)
}

// regKey is the key text hash h of a prompt of template hash variant is
// registered under: h itself for none.
func regKey(h, variant uint64) uint64 {
	if variant == 0 {
		return h
	}
	return stablehash.Mix64(h ^ variant)
}

// tokEntry is one tokenized prompt.
type tokEntry struct {
	tokPrompt          // its text-prefix hashes are registered in byText (unless overwritten)
	keys      []uint64 // the token keys of all its full token blocks; never modified
	tokens    int      // its number of tokens
	el        *list.Element
}

// tokKey identifies a prompt: its last text-prefix hash, their number, its
// size and its template hash.
type tokKey struct {
	last     uint64
	n, bytes int
	variant  uint64
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

// lookupTokens returns what the cache knows of prompt p: its token keys
// and its number of full token blocks (exact on a hit; estimated on a
// partial match), its number of tokens on a hit (0 otherwise), and the
// result. keys is shared: read it only.
//
// A hit is the same prompt: the same text hashes, size and template hash,
// and hashes that cover it to its end (a prompt longer than
// routing.prefix.max_blocks blocks is never a hit: two such prompts may
// differ after their hashes). A partial match is a cached prompt that
// shares the longest leading text blocks with p: its keys are taken for
// the shared share of its text, less one block.
func (t *tokenizer) lookupTokens(p tokPrompt) (keys []uint64, total, tokens int, result string) {
	n := len(p.text)
	if n == 0 {
		return nil, 0, 0, tokMiss
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	j := n - 1
	e := t.byText[regKey(p.text[j], p.variant)]
	if e == nil {
		// Every prompt registers all of its text prefixes, so the present
		// ones are mostly closed under prefixes and bisection finds the
		// longest (an eviction can leave a hole, which costs a shorter
		// match, never a wrong one).
		lo, hi := 0, n-1 // text[:lo] present or lo == 0; text[hi] absent
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if t.byText[regKey(p.text[mid], p.variant)] != nil {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if lo == 0 {
			return nil, 0, 0, tokMiss
		}
		j = lo - 1
		if e = t.byText[regKey(p.text[j], p.variant)]; e == nil {
			return nil, 0, 0, tokMiss
		}
	}
	t.lru.MoveToFront(e.el)
	if !p.capped && !e.capped && j == n-1 && len(e.text) == n && e.bytes == p.bytes {
		return e.keys, len(e.keys), e.tokens, tokHit
	}
	// The shared share of e's prompt: by text blocks when e's hashes cover
	// it whole, else by bytes (its keys go on past its hashes).
	usable := len(e.keys) * (j + 1) / len(e.text)
	if e.capped {
		usable = len(e.keys) * min((j+1)*e.blockBytes, e.bytes) / max(e.bytes, 1)
	}
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
	tokPrompt // text is a copy
	key       tokKey
	body      []byte // the client's body (a copy)
	model     string // the engines' model name
	chat      bool   // chat completions: tokenize its messages
	seed      uint64 // the token keys' seed: 0, or the LoRA adapter's name hashed
	url       string // the engine's /tokenize
	auth      []string
}

// start starts the tokenization of the prompt of key, built by build (only
// once a call slot is free: it copies the request), or joins the one in
// flight for the same prompt; nil when every call slot is busy or the
// tokenizer is closed.
func (t *tokenizer) start(key tokKey, build func() *tokenizeReq) *tokCall {
	t.mu.Lock()
	if c := t.pending[key]; c != nil {
		t.mu.Unlock()
		return c
	}
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	select {
	case t.sem <- struct{}{}:
	default:
		t.mu.Unlock()
		return nil
	}
	c := &tokCall{done: make(chan struct{})}
	t.pending[key] = c
	t.wg.Add(1)
	t.mu.Unlock()
	r := build()
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
			t.insertLocked(r.tokPrompt, keys, tokens)
		}
		delete(t.pending, key)
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
		ChatTemplate         json.RawMessage `json:"chat_template"`
		Documents            json.RawMessage `json:"documents"`
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
			"add_generation_prompt": in.AddGenerationPrompt, "continue_final_message": in.ContinueFinalMessage,
			"chat_template": in.ChatTemplate, "documents": in.Documents} {
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

// insertLocked caches keys and tokens as those of prompt p, evicting the
// least recently used prompts beyond the cap. Under t.mu.
func (t *tokenizer) insertLocked(p tokPrompt, keys []uint64, tokens int) {
	if len(p.text) == 0 {
		return
	}
	if cur := t.byText[regKey(p.text[len(p.text)-1], p.variant)]; cur != nil && len(cur.text) == len(p.text) && cur.bytes == p.bytes {
		t.removeLocked(cur) // the same prompt tokenized again: the newer wins
	}
	e := &tokEntry{tokPrompt: p, keys: keys, tokens: tokens}
	e.el = t.lru.PushFront(e)
	for _, h := range p.text {
		t.byText[regKey(h, p.variant)] = e
	}
	t.held += len(keys) + len(p.text)
	for t.held > t.cfg.CacheBlocks && t.lru.Len() > 1 {
		t.removeLocked(t.lru.Back().Value.(*tokEntry))
	}
}

// removeLocked drops e and its registrations (those not taken over by a
// later prompt). Under t.mu.
func (t *tokenizer) removeLocked(e *tokEntry) {
	t.lru.Remove(e.el)
	for _, h := range e.text {
		if k := regKey(h, e.variant); t.byText[k] == e {
			delete(t.byText, k)
		}
	}
	t.held -= len(e.keys) + len(e.text)
}

// close waits for the tokenizations in flight (the server's base context
// is cancelled first, which ends them); none starts after it.
func (t *tokenizer) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

// tokenKeys sets rreq's token keys for a policy that routes on KV-cache
// events (set.kvBlocks > 0), from the cache or, on a miss, from a
// tokenization it waits for at most MaxWait; it starts the prompt's
// tokenization unless the cache had it whole. Only chat and completions
// prompts are tokenized, and only when their keys can be used: some
// candidate's events are fresh, and the request is not routed by its
// session key. It never fails: without keys the policy routes on the
// approximate index.
func (s *Server) tokenKeys(ctx context.Context, op *operation, in *inbound, rt *fleet.Route, rreq *routing.Request) {
	t := s.tok
	set := in.set
	if t == nil || len(rreq.PrefixHashes) == 0 || (op.name != "chat" && op.name != "completions") || in.req.PromptBatch {
		return
	}
	if rreq.SessionKey != "" && set.sessionHeader != "" {
		return // session affinity: the key decides, the fallback never sees the request
	}
	if !anyFresh(s.fleet.KVIndex(), rt) {
		return
	}
	t0 := time.Now()
	p := tokPrompt{text: rreq.PrefixHashes, bytes: rreq.PromptBytes, blockBytes: set.parser.BlockBytes,
		capped: set.parser.MaxBlocks > 0 && len(rreq.PrefixHashes) >= set.parser.MaxBlocks}
	if op.name == "chat" {
		p.variant = oai.TemplateHash(in.body)
	}
	keys, total, tokens, result := t.lookupTokens(p)
	if result == tokHit {
		rreq.TokenKeys, rreq.TokenBlocks, in.kvPromptTokens = keys, total, tokens
		s.metrics.RecordTokenizeLookup(ctx, tokHit, 0)
		return
	}
	var call *tokCall
	if eng := tokenizingEngine(rt); eng != nil {
		if url, ok := eng.PathURL("/tokenize"); ok {
			key := tokKey{last: p.text[len(p.text)-1], n: len(p.text), bytes: p.bytes, variant: p.variant}
			call = t.start(key, func() *tokenizeReq {
				seed := uint64(0)
				if c, ok := s.fleet.Snapshot().Cards()[in.target]; ok && c.Parent != nil {
					seed = stablehash.String(in.target) // a LoRA adapter's blocks are its own
				}
				r := &tokenizeReq{tokPrompt: p, key: key, body: bytes.Clone(in.body), model: in.target,
					chat: op.name == "chat", seed: seed, url: url, auth: eng.Auth()}
				r.text = slices.Clone(p.text)
				return r
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

// anyFresh reports whether some engine of rt is routed on its KV-cache
// events (routing.KVIndex.Fresh): without one, token keys would not be
// used.
func anyFresh(x *routing.KVIndex, rt *fleet.Route) bool {
	if x == nil {
		return false
	}
	now := time.Now()
	for _, ep := range rt.Endpoints() {
		if x.Fresh(ep, now) {
			return true
		}
	}
	return false
}

// tokenizingEngine returns the engine of rt to ask for tokens: the routable
// one with the fewest requests in flight (a tokenization is light, but a
// loaded engine answers it later), never a provider (it has no
// /tokenize); nil when none is.
func tokenizingEngine(rt *fleet.Route) *fleet.Engine {
	var best *fleet.Engine
	var bestLoad int64
	for _, e := range rt.Engines() {
		if e.IsProvider() {
			continue
		}
		pf, dc := e.Endpoint().InFlight()
		if best == nil || pf+dc < bestLoad {
			best, bestLoad = e, pf+dc
		}
	}
	return best
}
