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
	*seq
	kind         kind
	id           string
	created      int64
	reasoning    int  // leading tokens sent as reasoning_content (chat only)
	toolCall     bool // emit a tool call first (chat only)
	includeUsage bool
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
	n, finish, err := e.outputTokens(&req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}

	g := &generation{
		seq: &seq{
			call:  e.newCall(w, r, f, apiOpenAI, t, req.Stream),
			words: words, promptTokens: promptTokens(words), cacheable: true,
			n: n, finish: finish,
		},
		kind:         k,
		created:      time.Now().Unix(),
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
	if g.stream {
		err = g.serveStream(g)
		return
	}
	err = g.serveUnary("application/json", func() ([]byte, error) { return json.Marshal(g.unaryBody()) })
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
	return g.event(g.chatChunk(chatDelta{Role: "assistant", Content: &empty}, nil))
}

// lead implements streamer: the tool-call delta of the tool-call fault.
func (g *generation) lead() (bool, error) {
	if !g.toolCall {
		return false, nil
	}
	tc := simToolCall(true, "")
	return true, g.event(g.chatChunk(chatDelta{ToolCalls: []toolCall{tc}}, nil))
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

// doneEvent ends the OpenAI-style streams.
const doneEvent = "data: [DONE]\n\n"

func (g *generation) usage() usage {
	return usage{PromptTokens: g.promptTokens, CompletionTokens: g.n, TotalTokens: g.promptTokens + g.n}
}

func (g *generation) chatChunk(d chatDelta, finish *string) chatChunk {
	return chatChunk{
		ID: g.id, Object: "chat.completion.chunk", Created: g.created, Model: g.call.model,
		Choices: []chatChunkChoice{{Delta: d, FinishReason: finish}},
	}
}

func (g *generation) completionChunk(text string, finish *string) completion {
	return completion{
		ID: g.id, Object: "text_completion", Created: g.created, Model: g.call.model,
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
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.call.model,
			Choices: []completionChoice{}, Usage: &u,
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
			reasoning.WriteString(ReasoningToken(i))
		} else {
			content.WriteString(ContentToken(i - g.reasoning))
		}
	}
	u := g.usage()
	if g.kind == kindCompletion {
		reason := g.finish
		return completion{
			ID: g.id, Object: "text_completion", Created: g.created, Model: g.call.model,
			Choices: []completionChoice{{Text: content.String(), FinishReason: &reason}},
			Usage:   &u,
		}
	}
	msg := chatMessageOut{Role: "assistant", Content: content.String(), ReasoningContent: reasoning.String()}
	if g.toolCall {
		msg.ToolCalls = []toolCall{simToolCall(false, "{}")}
	}
	return chatCompletion{
		ID: g.id, Object: "chat.completion", Created: g.created, Model: g.call.model,
		Choices: []chatChoice{{Message: msg, FinishReason: g.finish}},
		Usage:   u,
	}
}
