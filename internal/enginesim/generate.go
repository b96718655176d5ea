package enginesim

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// kind selects the OpenAI API flavour of a generation request.
type kind int

const (
	kindChat kind = iota
	kindCompletion
)

// generation is one chat or completions request being served.
type generation struct {
	*call
	kind         kind
	model        string // as echoed in responses
	id           string
	created      int64
	words        []string
	promptTokens int
	n            int    // tokens to generate (0 under no-content)
	finish       string // finish reason
	reasoning    int    // leading tokens sent as reasoning_content (chat only)
	toolCall     bool   // emit a tool call first (chat only)
	includeUsage bool
}

// serveGenerate serves POST /v1/chat/completions (k == kindChat) and /v1/completions.
func (e *Engine) serveGenerate(w http.ResponseWriter, r *http.Request, k kind) {
	var req genRequest
	f, m, ok := admit(e, w, r, &req, func(q *genRequest) string { return q.Model })
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
	n, finish, err := e.outputTokens(&req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}

	g := &generation{
		call:         e.newCall(w, r, m, f, req.Stream),
		kind:         k,
		model:        m.name,
		created:      time.Now().Unix(),
		words:        words,
		promptTokens: promptTokens(words),
		n:            n,
		finish:       finish,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
	}
	if f.noContent {
		g.n, g.finish = 0, finishStop
	}
	if k == kindChat {
		g.id = newID("chatcmpl-")
		g.reasoning = min(f.reasoning, g.n)
		g.toolCall = f.toolCall
	} else {
		g.id = newID("cmpl-")
	}
	defer g.end(&err)
	err = g.run()
}

// echoRequestID copies the request's X-Request-Id to the response, as vLLM does with
// --enable-request-id-headers.
func echoRequestID(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		w.Header().Set("X-Request-Id", id)
	}
}

func (g *generation) run() error {
	if handled, err := g.preHeaders(); handled || err != nil {
		return err
	}
	if g.stream {
		return g.runStream()
	}
	return g.runUnary()
}

// prefill admits the sequence and waits for its time to first token: TTFT, plus
// TTFTPerPromptToken for each prompt token not in the prefix cache, plus TTFTPerRunning for
// each other sequence running once this one is admitted (see [Engine.ttftFor]).
func (g *generation) prefill() error {
	cached, err := g.admit(g.words, true)
	if err != nil {
		return err
	}
	if err := g.wait(g.prefillDelay(g.promptTokens-cached), nil, true); err != nil {
		return err
	}
	g.m.ttft.Observe(time.Since(g.start).Seconds())
	g.m.promptTokens.Add(float64(g.promptTokens))
	return nil
}

// decode accounts generated token i: one more generation token and its KV cache slot.
func (g *generation) decode(i int) {
	g.m.genTokens.Inc()
	g.setKVTokens(g.promptTokens + i + 1)
}

func (g *generation) runStream() error {
	h := g.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	g.w.WriteHeader(http.StatusOK)
	if err := g.flush(); err != nil {
		return err
	}
	if g.f.closeAfterHeaders {
		g.abortConn()
	}
	if g.kind == kindChat {
		empty := ""
		if err := g.event(g.chatChunk(chatDelta{Role: "assistant", Content: &empty}, nil)); err != nil {
			return err
		}
	}
	if g.f.malformed {
		if err := g.write([]byte(malformedEvent)); err != nil {
			return err
		}
	}
	if err := g.prefill(); err != nil {
		return err
	}
	if g.toolCall {
		tc := simToolCall(true, "")
		if err := g.event(g.chatChunk(chatDelta{ToolCalls: []toolCall{tc}}, nil)); err != nil {
			return err
		}
	}
	for i := 0; ; i++ {
		if g.f.closeAfter >= 0 && i == min(g.f.closeAfter, g.n) {
			g.abortConn()
		}
		if g.f.stallAfter >= 0 && i == min(g.f.stallAfter, g.n) {
			return g.sleep(-1)
		}
		if i == g.n {
			break
		}
		if i > 0 || g.toolCall {
			if err := g.wait(g.itlDelay(), nil, true); err != nil {
				return err
			}
		}
		g.decode(i)
		if err := g.event(g.tokenChunk(i)); err != nil {
			return err
		}
	}
	if err := g.event(g.finishChunk()); err != nil {
		return err
	}
	if g.includeUsage {
		if err := g.event(g.usageChunk()); err != nil {
			return err
		}
	}
	if g.f.truncate {
		// End the stream cleanly without its terminator. The client sees the end only when
		// net/http finishes the response after the handler returns, so this is still
		// before the last bytes.
		g.settle(outcomeFaulted, "")
		return nil
	}
	g.settle(outcomeCompleted, g.finish)
	_ = g.write([]byte("data: [DONE]\n\n")) // the request is complete; a client gone now is not an abort
	return nil
}

func (g *generation) runUnary() error {
	if g.f.closeAfterHeaders {
		g.w.Header().Set("Content-Type", "application/json")
		g.w.WriteHeader(http.StatusOK)
		g.abortConn()
	}
	if err := g.prefill(); err != nil {
		return err
	}
	for i := range g.n {
		if i > 0 {
			if err := g.wait(g.itlDelay(), nil, false); err != nil {
				return err
			}
		}
		g.decode(i)
	}
	b, err := json.Marshal(g.unaryBody())
	if err != nil {
		return err
	}
	return g.writeBody(b, g.finish)
}

func (g *generation) usage() usage {
	return usage{PromptTokens: g.promptTokens, CompletionTokens: g.n, TotalTokens: g.promptTokens + g.n}
}

func (g *generation) chatChunk(d chatDelta, finish *string) chatChunk {
	return chatChunk{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model,
		Choices: []chatChunkChoice{{Delta: d, FinishReason: finish}},
	}
}

func (g *generation) completionChunk(text string, finish *string) completion {
	return completion{
		ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
		Choices: []completionChoice{{Text: text, FinishReason: finish}},
	}
}

// tokenChunk is the stream event for generated token i.
func (g *generation) tokenChunk(i int) any {
	if g.kind == kindCompletion {
		return g.completionChunk(ContentToken(i), nil)
	}
	if i < g.reasoning {
		return g.chatChunk(chatDelta{ReasoningContent: ReasoningToken(i)}, nil)
	}
	s := ContentToken(i - g.reasoning)
	return g.chatChunk(chatDelta{Content: &s}, nil)
}

func (g *generation) finishChunk() any {
	reason := g.finish
	if g.kind == kindCompletion {
		return g.completionChunk("", &reason)
	}
	return g.chatChunk(chatDelta{}, &reason)
}

func (g *generation) usageChunk() any {
	u := g.usage()
	if g.kind == kindCompletion {
		return completion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
			Choices: []completionChoice{}, Usage: &u,
		}
	}
	return chatChunk{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.model,
		Choices: []chatChunkChoice{}, Usage: &u,
	}
}

// unaryBody is the complete non-stream response.
func (g *generation) unaryBody() any {
	var reasoning, content strings.Builder
	for i := range g.n {
		if i < g.reasoning {
			reasoning.WriteString(ReasoningToken(i))
		} else {
			content.WriteString(ContentToken(i - g.reasoning))
		}
	}
	u := g.usage()
	if g.kind == kindCompletion {
		reason := g.finish
		return completion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.model,
			Choices: []completionChoice{{Text: content.String(), FinishReason: &reason}},
			Usage:   &u,
		}
	}
	msg := chatMessageOut{Role: "assistant", Content: content.String(), ReasoningContent: reasoning.String()}
	if g.toolCall {
		msg.ToolCalls = []toolCall{simToolCall(false, "{}")}
	}
	return chatCompletion{
		ID: g.id, Object: "chat.completion", Created: g.created, Model: g.model,
		Choices: []chatChoice{{Message: msg, FinishReason: g.finish}},
		Usage:   u,
	}
}
