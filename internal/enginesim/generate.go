package enginesim

import (
	"encoding/json"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// kind selects the OpenAI API flavour of a generation request.
type kind int

const (
	kindChat kind = iota
	kindCompletion
)

// generation is one chat or completions request being served.
type generation struct {
	*seq
	kind         kind
	id           string
	created      int64
	reasoning    int  // leading tokens sent as reasoning_content (chat only)
	toolCall     bool // emit a tool call first (chat only)
	includeUsage bool
	logprobs     bool   // the request asked for logprobs
	topLogprobs  int    // chat's top_logprobs, completions' logprobs
	lpSeed       uint64 // the logprobs' hash seed, from the model name
	textOffset   int    // completions stream: characters of text sent so far
	// start is the index of the first content token generated: k when the prompt ends with
	// the ids of content tokens 0..k-1 (a continuation), else 0.
	start int
	// returnTokenIDs is the request's return_token_ids: the prompt's and the generated
	// tokens' ids are returned, in vLLM's places.
	returnTokenIDs bool
	promptIDs      []int // the prompt's token ids, one per prompt token
	promptIDsSent  bool  // completions stream: a chunk carried prompt_token_ids
	// kvPrefill: the request is a prefill leg (kv_transfer_params with do_remote_decode);
	// its non-stream answer carries kvOut, the params of the blocks it holds, pulled from
	// kvHost:kvPort.
	kvPrefill bool
	kvOut     *kvParamsOut
	kvHost    string
	kvPort    int
}

var _ streamer = (*generation)(nil)

// serveGenerate serves POST /v1/chat/completions (k == kindChat) and /v1/completions.
func (e *Engine) serveGenerate(w http.ResponseWriter, r *http.Request, k kind) {
	var req genRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *genRequest) string { return q.Model })
	if !ok {
		return
	}
	var (
		words []string
		err   error
	)
	if k == kindChat {
		words, err = chatPromptWords(req.Messages)
	} else {
		var items [][]string
		items, _, err = inputItems(req.Prompt, "prompt")
		for _, it := range items {
			words = append(words, it...)
		}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	promptIDs := promptTokenIDs(words)
	if err := e.checkContextLength(len(promptIDs), req.contextMaxTokens(k)); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	start := resumeIndex(promptIDs)
	n, finish, err := e.outputTokens(&req, start, len(promptIDs))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	lp, top, err := req.logprobs(k)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var kvp *kvTransferParams
	if !isNull(req.KVTransferParams) {
		kvp = new(kvTransferParams)
		if json.Unmarshal(req.KVTransferParams, kvp) != nil {
			// vLLM's request models type the field dict[str, Any].
			writeError(w, http.StatusBadRequest, "kv_transfer_params must be an object")
			return
		}
	}

	g := &generation{
		seq: &seq{
			call:  e.newCall(w, r, f, apiOpenAI, t, req.Stream),
			words: words, promptTokens: promptTokens(words), cacheable: true,
			n: n, finish: finish, abortable: true,
		},
		kind:         k,
		created:      time.Now().Unix(),
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		logprobs:     lp,
		topLogprobs:  top,
		start:        start,
		promptIDs:    promptIDs,

		returnTokenIDs: req.ReturnTokenIDs,
	}
	g.lpSeed = logprobSeed(g.call.model)
	switch {
	case kvp != nil && kvp.DoRemotePrefill && e.cfg.KVRole != KVRoleProducer:
		g.kv = kvp
	case kvp != nil && kvp.DoRemoteDecode && !req.Stream && e.cfg.KVRole != KVRoleConsumer:
		g.kvPrefill = true
		g.kvHost, g.kvPort = e.sideChannel(r)
	}
	if f.noContent {
		g.n, g.finish = 0, finishStop
	}
	base := baseRequestID(r, req.RequestID)
	if k == kindChat {
		g.id = "chatcmpl-" + base
		if start == 0 { // a continuation resumes the content; its reasoning is done
			g.reasoning = min(f.reasoning, g.n)
		}
		g.toolCall = f.toolCall
	} else {
		g.id = "cmpl-" + base
	}
	// The absolute-index faults count from the answer's first content token: a
	// continuation resumes at start, after no reasoning.
	g.call.f = f.resolveAt(start, g.reasoning)
	defer g.end(&err)
	if g.stream {
		err = g.serveStream(g)
		return
	}
	err = g.serveUnary("application/json", func() ([]byte, error) {
		if g.kvPrefill {
			g.kvOut = e.holdKV(g)
		}
		return json.Marshal(g.unaryBody())
	})
}

// baseRequestID is vLLM's _base_request_id: the request's X-Request-Id header, else its
// request_id field, else 32 random hex digits (vLLM's random_uuid). The response id is
// "chatcmpl-" or "cmpl-" followed by it, so a client that sends the same X-Request-Id gets
// the same id streaming or not.
func baseRequestID(r *http.Request, field string) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	if field != "" {
		return field
	}
	return newID("")
}

// echoRequestID copies the request's X-Request-Id to the response, as vLLM does with
// --enable-request-id-headers.
func echoRequestID(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
}

// open implements streamer: chat's role chunk.
func (g *generation) open() error {
	if g.kind != kindChat {
		return nil
	}
	empty := ""
	c := g.chatChunk(chatDelta{Role: "assistant", Content: &empty}, nil, nil)
	// vLLM's serving_chat.py returns prompt_token_ids "at the first chunk ever", the role
	// chunk, on the chunk itself (ChatCompletionStreamResponse), and sets no token_ids on
	// its choice.
	if g.returnTokenIDs {
		c.PromptTokenIDs = g.promptIDs
	}
	return g.event(c)
}

// lead implements streamer: the tool-call delta of the tool-call fault (id, type and name;
// its arguments follow in the finish chunk).
func (g *generation) lead() (bool, error) {
	if !g.toolCall {
		return false, nil
	}
	tc := deltaToolCall{ID: simToolCallID, Type: "function", Function: deltaFunction{Name: simToolCallName}}
	c := g.chatChunk(chatDelta{ToolCalls: []deltaToolCall{tc}}, g.noChatLogprobs(), nil)
	c.Choices[0].TokenIDs = g.tokenIDs(0, 0)
	return true, g.event(c)
}

// token implements streamer.
func (g *generation) token(i int) error { return g.event(g.tokenChunk(i)) }

// close implements streamer: the finish chunk and the usage chunk when asked for.
func (g *generation) close() error {
	if err := g.event(g.finishChunk()); err != nil {
		return err
	}
	if g.includeUsage {
		return g.event(g.usageChunk())
	}
	return nil
}

// terminator implements streamer.
func (g *generation) terminator() ([]byte, error) { return []byte(doneEvent), nil }

// malformed implements streamer.
func (g *generation) malformed() string { return malformedEvent }

// midError implements streamer: vLLM's streaming error event, then [DONE].
func (g *generation) midError() ([]byte, error) { return openAIStreamError() }

// doneEvent ends the OpenAI-style streams.
const doneEvent = "data: [DONE]\n\n"

func (g *generation) usage() usage {
	u := usage{PromptTokens: g.promptTokens, TotalTokens: g.promptTokens + g.n, CompletionTokens: g.n}
	if (g.kv != nil || g.e.cfg.PromptTokensDetails) && g.cached > 0 {
		// vLLM reports prompt_tokens_details only with --enable-prompt-tokens-details
		// (Config.PromptTokensDetails; a P/D decode leg reports them always here) and a
		// non-zero cached count (vllm/entrypoints/openai/serving_chat.py: "if
		// self.enable_prompt_tokens_details and num_cached_tokens"); a decode leg that
		// pulled its KV has the whole prompt cached.
		u.PromptTokensDetails = &promptTokensDetails{CachedTokens: g.cached}
	}
	return u
}

func (g *generation) usageInfo() usageInfo {
	u := g.usage()
	return usageInfo{PromptTokens: u.PromptTokens, TotalTokens: u.TotalTokens, CompletionTokens: u.CompletionTokens, PromptTokensDetails: u.PromptTokensDetails}
}

func (g *generation) chatChunk(d chatDelta, lp *chatLogprobs, finish *string) chatChunk {
	c := chatChunkChoice{Delta: d, Logprobs: lp, FinishReason: finish}
	if finish != nil {
		c.StopReason = jsonNull
	}
	return chatChunk{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.call.model,
		Choices: []chatChunkChoice{c},
	}
}

// completionChunk is a completions chunk carrying generated tokens from..to-1. Under
// return_token_ids its choice carries their ids, and the prompt's ids on the first chunk
// (null on the others), as vLLM's serving_completion.py sends prompt_token_ids once per
// choice, on its first chunk.
func (g *generation) completionChunk(text string, lp *completionLogprobs, finish *string, from, to int) completionChunk {
	c := completionChunkChoice{Text: text, Logprobs: lp, FinishReason: finish}
	if g.returnTokenIDs {
		c.TokenIDs = g.tokenIDs(from, to)
		c.PromptTokenIDs = jsonNull
		if !g.promptIDsSent {
			g.promptIDsSent = true
			c.PromptTokenIDs, _ = json.Marshal(g.promptIDs)
		}
	}
	return completionChunk{
		ID: g.id, Object: "text_completion", Created: g.created, Model: g.call.model,
		Choices: []completionChunkChoice{c},
	}
}

// tokenText returns the text of generated token i: a reasoning token or a content token
// (numbered from g.start in a continuation).
func (g *generation) tokenText(i int) string {
	if i < g.reasoning {
		return ReasoningToken(i)
	}
	return ContentToken(g.start + i - g.reasoning)
}

// tokenIDOf returns the token id of generated token i (see [contentTokenID]).
func (g *generation) tokenIDOf(i int) int {
	if i < g.reasoning {
		return reasoningTokenID(i)
	}
	return contentTokenID(g.start + i - g.reasoning)
}

// tokenIDs returns the ids of generated tokens from..to-1 (a non-nil empty list when there
// are none) under return_token_ids, else nil (the field is left out).
func (g *generation) tokenIDs(from, to int) *[]int {
	if !g.returnTokenIDs {
		return nil
	}
	ids := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		ids = append(ids, g.tokenIDOf(i))
	}
	return &ids
}

// tokenChunk is the stream event for generated token i.
func (g *generation) tokenChunk(i int) any {
	text := g.tokenText(i)
	if g.kind == kindCompletion {
		var lp *completionLogprobs
		if g.logprobs {
			lp = g.completionLogprobs(i, i+1, g.textOffset)
		}
		g.textOffset += utf8.RuneCountInString(text)
		return g.completionChunk(text, lp, nil, i, i+1)
	}
	var lp *chatLogprobs
	if g.logprobs {
		lp = g.chatLogprobs(i, i+1)
	}
	var c chatChunk
	if i < g.reasoning {
		c = g.chatChunk(chatDelta{ReasoningContent: text}, lp, nil)
	} else {
		c = g.chatChunk(chatDelta{Content: &text}, lp, nil)
	}
	c.Choices[0].TokenIDs = g.tokenIDs(i, i+1)
	return c
}

// finishChunk ends the choice: no token (an empty delta or text, empty logprobs), the
// finish_reason and a null stop_reason; under the tool-call fault its delta carries the
// call's arguments, as vLLM's finish chunk carries the arguments its tool parser had not
// streamed yet.
func (g *generation) finishChunk() any {
	reason := g.finish
	if g.kind == kindCompletion {
		var lp *completionLogprobs
		if g.logprobs {
			lp = g.completionLogprobs(0, 0, 0)
		}
		return g.completionChunk("", lp, &reason, 0, 0)
	}
	var d chatDelta
	if g.toolCall {
		d.ToolCalls = []deltaToolCall{{Function: deltaFunction{Arguments: simToolCallArgs}}}
	}
	c := g.chatChunk(d, g.noChatLogprobs(), &reason)
	c.Choices[0].TokenIDs = g.tokenIDs(0, 0)
	return c
}

// noChatLogprobs is the logprobs of a chat chunk that carries no token: null, or
// {"content":[]} when the request asked for logprobs (vLLM builds them from the chunk's
// tokens).
func (g *generation) noChatLogprobs() *chatLogprobs {
	if !g.logprobs {
		return nil
	}
	return g.chatLogprobs(0, 0)
}

func (g *generation) usageChunk() any {
	u := g.usage()
	if g.kind == kindCompletion {
		return completionChunk{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.call.model,
			Choices: []completionChunkChoice{}, Usage: &u,
		}
	}
	return chatChunk{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.call.model,
		Choices: []chatChunkChoice{}, Usage: &u,
	}
}

// unaryBody is the complete non-stream response.
func (g *generation) unaryBody() any {
	var reasoning, content strings.Builder
	for i := range g.n {
		if i < g.reasoning {
			reasoning.WriteString(g.tokenText(i))
		} else {
			content.WriteString(g.tokenText(i))
		}
	}
	var promptIDs *[]int
	if g.returnTokenIDs {
		promptIDs = &g.promptIDs
	}
	if g.kind == kindCompletion {
		var lp *completionLogprobs
		if g.logprobs {
			lp = g.completionLogprobs(0, g.n, 0)
		}
		return completion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.call.model,
			Choices: []completionChoice{{
				Text: content.String(), Logprobs: lp, FinishReason: g.finish,
				TokenIDs: g.tokenIDs(0, g.n), PromptTokenIDs: promptIDs,
			}},
			Usage:            g.usageInfo(),
			KVTransferParams: g.kvOut,
		}
	}
	msg := chatMessageOut{Role: "assistant", ToolCalls: []toolCall{}}
	// vLLM's reasoning and tool parsers return no content (null) when the output is all
	// reasoning or tool calls; without them the content is the text, "" when empty.
	if c := content.String(); c != "" || (g.reasoning == 0 && !g.toolCall) {
		msg.Content = &c
	}
	if g.reasoning > 0 {
		r := reasoning.String()
		msg.ReasoningContent = &r
	}
	if g.toolCall {
		msg.ToolCalls = append(msg.ToolCalls, toolCall{
			ID: simToolCallID, Type: "function", Function: toolFunction{Name: simToolCallName, Arguments: simToolCallArgs},
		})
	}
	var lp *chatLogprobs
	if g.logprobs {
		lp = g.chatLogprobs(0, g.n)
	}
	return chatCompletion{
		ID: g.id, Object: "chat.completion", Created: g.created, Model: g.call.model,
		Choices:          []chatChoice{{Message: msg, Logprobs: lp, FinishReason: g.finish, TokenIDs: g.tokenIDs(0, g.n)}},
		Usage:            g.usageInfo(),
		PromptTokenIDs:   promptIDs,
		KVTransferParams: g.kvOut,
	}
}

// Logprobs: token i's logprobs are a function of the model name and i alone, so a stream and a
// non-stream generation of the same request carry the same values. The sampled token is the
// most likely one (rank 1, as greedy sampling picks it); the alternatives at rank r+1 are
// the tokens "alt<r> ". Logprobs are multiples of 0.0001: the sampled token's in
// [-0.4999, -0.0001], each next rank lower by 0.0001 to 2.0.

// logprobSeed is the logprobs' hash seed for model: its FNV-1a hash.
func logprobSeed(model string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(model))
	return h.Sum64()
}

// rankedLogprobs returns the logprobs of the n most likely tokens at generated position pos,
// best first.
func (g *generation) rankedLogprobs(pos, n int) []pyFloat {
	out := make([]pyFloat, n)
	units := 0
	for r := range n {
		h := mix64(g.lpSeed + uint64(g.start+pos)*0x9e3779b97f4a7c15 + uint64(r)*0xd1b54a32d192ed03)
		if r == 0 {
			units = 1 + int(h%4999)
		} else {
			units += 1 + int(h%20000)
		}
		out[r] = pyFloat(-float64(units) / 10000)
	}
	return out
}

// mix64 is SplitMix64's finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// rankedToken is the token at rank r (0 based) of position pos: the sampled token at 0.
func (g *generation) rankedToken(pos, r int) string {
	if r == 0 {
		return g.tokenText(pos)
	}
	return "alt" + strconv.Itoa(r) + " "
}

// utf8Bytes is s's UTF-8 bytes as the JSON array of integers vLLM writes.
func utf8Bytes(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

// chatLogprobs returns chat's logprobs of generated tokens from..to-1 ({"content":[]} when
// there are none).
func (g *generation) chatLogprobs(from, to int) *chatLogprobs {
	out := &chatLogprobs{Content: make([]chatLogprob, 0, to-from)}
	for pos := from; pos < to; pos++ {
		lps := g.rankedLogprobs(pos, max(1, g.topLogprobs))
		tok := g.rankedToken(pos, 0)
		e := chatLogprob{Token: tok, Logprob: lps[0], Bytes: utf8Bytes(tok), TopLogprobs: make([]chatTopLogprob, 0, g.topLogprobs)}
		for r := range g.topLogprobs {
			t := g.rankedToken(pos, r)
			e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: t, Logprob: lps[r], Bytes: utf8Bytes(t)})
		}
		out.Content = append(out.Content, e)
	}
	return out
}

// completionLogprobs returns completions' logprobs of generated tokens from..to-1, the first
// at character offset offset of the whole text (empty arrays when there are none).
func (g *generation) completionLogprobs(from, to, offset int) *completionLogprobs {
	n := to - from
	out := &completionLogprobs{
		TextOffset: make([]int, 0, n), TokenLogprobs: make([]pyFloat, 0, n),
		Tokens: make([]string, 0, n), TopLogprobs: make([]topLogprobMap, 0, n),
	}
	for pos := from; pos < to; pos++ {
		k := max(1, g.topLogprobs)
		lps := g.rankedLogprobs(pos, k)
		tok := g.rankedToken(pos, 0)
		top := make(topLogprobMap, k)
		for r := range k {
			top[r] = tokenLogprob{token: g.rankedToken(pos, r), logprob: lps[r]}
		}
		out.TextOffset = append(out.TextOffset, offset)
		out.TokenLogprobs = append(out.TokenLogprobs, lps[0])
		out.Tokens = append(out.Tokens, tok)
		out.TopLogprobs = append(out.TopLogprobs, top)
		offset += utf8.RuneCountInString(tok) // Python counts characters
	}
	return out
}
