package enginesim

import (
	"encoding/json"
	"net/http"
)

// messagesRequest holds the fields the simulator reads from an Anthropic Messages request
// (POST /v1/messages and /v1/messages/count_tokens). Other fields are accepted and ignored.
type messagesRequest struct {
	Model     string             `json:"model"`
	Messages  []anthropicMessage `json:"messages"`
	System    json.RawMessage    `json:"system"`
	MaxTokens *int               `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	Metadata  json.RawMessage    `json:"metadata"`
}

// anthropicMessage is one message; content is a string or an array of content blocks.
type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthropicBlock is one content block. The text of text blocks and of tool_result contents
// counts; other blocks (images, tool_use, thinking) are ignored.
type anthropicBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Content json.RawMessage `json:"content"`
}

// messagesResponse is the non-stream Messages response.
type messagesResponse struct {
	ID           string             `json:"id"`
	Type         string             `json:"type"`
	Role         string             `json:"role"`
	Model        string             `json:"model"`
	Content      []anthropicContent `json:"content"`
	StopReason   *string            `json:"stop_reason"`
	StopSequence *string            `json:"stop_sequence"`
	Usage        anthropicUsage     `json:"usage"`
}

// anthropicContent is one response content block: {"type":"text","text"} or
// {"type":"thinking","thinking","signature"}.
type anthropicContent struct {
	Type      string  `json:"type"`
	Text      *string `json:"text,omitempty"`
	Thinking  *string `json:"thinking,omitempty"`
	Signature *string `json:"signature,omitempty"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// Stream events.

type messageStartEvent struct {
	Type    string           `json:"type"`
	Message messagesResponse `json:"message"`
}

type blockStartEvent struct {
	Type         string           `json:"type"`
	Index        int              `json:"index"`
	ContentBlock anthropicContent `json:"content_block"`
}

// blockDeltaEvent's delta has the shape of a content block, with the
// delta types (text_delta, thinking_delta, signature_delta).
type blockDeltaEvent struct {
	Type  string           `json:"type"`
	Index int              `json:"index"`
	Delta anthropicContent `json:"delta"`
}

type indexEvent struct {
	Type  string `json:"type"`
	Index int    `json:"index"`
}

type typeEvent struct {
	Type string `json:"type"`
}

type messageDeltaEvent struct {
	Type  string            `json:"type"`
	Delta messageDelta      `json:"delta"`
	Usage messageDeltaUsage `json:"usage"`
}

type messageDelta struct {
	StopReason   string  `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

type messageDeltaUsage struct {
	OutputTokens int `json:"output_tokens"`
}

// stopReason returns Anthropic's stop_reason for a finish reason.
func stopReason(finish string) string {
	if finish == finishLength {
		return "max_tokens"
	}
	return "end_turn"
}

// messagesPrompt returns the prompt words of a Messages request: the system prompt (a string
// or text blocks), then every message's content.
func messagesPrompt(req *messagesRequest) ([]string, error) {
	if len(req.Messages) == 0 {
		return nil, badRequestf("messages must be a non-empty array")
	}
	words, err := anthropicContentWords(req.System)
	if err != nil {
		return nil, badRequestf("system %v", err)
	}
	for i, m := range req.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, badRequestf("messages[%d].role must be user or assistant, got %q", i, m.Role)
		}
		w, err := anthropicContentWords(m.Content)
		if err != nil {
			return nil, badRequestf("messages[%d].content %v", i, err)
		}
		words = append(words, w...)
	}
	return words, nil
}

// anthropicContentWords returns the words of a string or of an array of content blocks.
func anthropicContentWords(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return wordList(s), nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, badRequestf("must be a string or an array of content blocks")
	}
	var words []string
	for _, b := range blocks {
		switch b.Type {
		case "text":
			words = append(words, wordList(b.Text)...)
		case "tool_result":
			w, err := anthropicContentWords(b.Content)
			if err != nil {
				return nil, err
			}
			words = append(words, w...)
		}
	}
	return words, nil
}

// serveMessages serves POST /v1/messages, answering errors in Anthropic's envelope.
func (e *Engine) serveMessages(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	f, t, ok := admit(e, apiAnthropic, w, r, &req, func(q *messagesRequest) string { return q.Model })
	if !ok {
		return
	}
	if req.Model == "" {
		apiAnthropic.writeError(w, http.StatusBadRequest, "model: Field required")
		return
	}
	if req.MaxTokens == nil {
		apiAnthropic.writeError(w, http.StatusBadRequest, "max_tokens: Field required")
		return
	}
	words, err := messagesPrompt(&req)
	if err != nil {
		apiAnthropic.writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// vLLM's Messages API serves the request as a chat completion with its max_tokens, so
	// chat's context length check applies (in Anthropic's envelope).
	if err := e.checkContextLength(promptTokens(words), req.MaxTokens); err != nil {
		apiAnthropic.writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	n, finish, err := e.naturalLength(req.MaxTokens, "max_tokens")
	if err != nil {
		apiAnthropic.writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if f.noContent {
		n, finish = 0, finishStop
	}
	ms := &messenger{
		seq: &seq{
			call:  e.newCall(w, r, f, apiAnthropic, t, req.Stream),
			words: words, promptTokens: promptTokens(words), cacheable: true, n: n, finish: finish,
		},
		id:        newID("msg_"),
		reasoning: min(f.reasoning, n),
		signature: newID(""),
	}
	defer ms.end(&err)
	if req.Stream {
		err = ms.serveStream(ms)
		return
	}
	err = ms.serveUnary("application/json", func() ([]byte, error) { return json.Marshal(ms.body()) })
}

// messenger renders an Anthropic Messages response. Its stream is message_start at once;
// at the first token of each content block its content_block_start (then, once, ping); one
// content_block_delta per token (text_delta, or thinking_delta under the reasoning fault,
// whose block ends with a signature_delta); content_block_stop; message_delta with the stop
// reason and output tokens; message_stop last. Every event is "event: <type>" with the same
// "type" in its data.
type messenger struct {
	*seq
	id        string
	reasoning int
	signature string
	pinged    bool
}

var _ streamer = (*messenger)(nil)

// body is the non-stream response.
func (ms *messenger) body() messagesResponse {
	text, thinking := outputContent(ms.n, ms.reasoning)
	content := []anthropicContent{}
	if ms.reasoning > 0 {
		content = append(content, anthropicContent{Type: "thinking", Thinking: &thinking, Signature: &ms.signature})
	}
	if ms.n > ms.reasoning {
		content = append(content, anthropicContent{Type: "text", Text: &text})
	}
	reason := stopReason(ms.finish)
	return messagesResponse{
		ID: ms.id, Type: "message", Role: "assistant", Model: ms.model, Content: content,
		StopReason: &reason, Usage: anthropicUsage{InputTokens: ms.promptTokens, OutputTokens: ms.n},
	}
}

// open implements streamer: message_start, with output_tokens 1 as Anthropic sends it.
func (ms *messenger) open() error {
	msg := messagesResponse{
		ID: ms.id, Type: "message", Role: "assistant", Model: ms.model, Content: []anthropicContent{},
		Usage: anthropicUsage{InputTokens: ms.promptTokens, OutputTokens: 1},
	}
	return ms.namedEvent("message_start", messageStartEvent{Type: "message_start", Message: msg})
}

// lead implements streamer.
func (ms *messenger) lead() (bool, error) { return false, nil }

// startBlock writes content_block_start for block index (and the ping after the first).
func (ms *messenger) startBlock(index int, block anthropicContent) error {
	if err := ms.namedEvent("content_block_start", blockStartEvent{Type: "content_block_start", Index: index, ContentBlock: block}); err != nil {
		return err
	}
	return ms.ping()
}

// ping writes the ping event, once.
func (ms *messenger) ping() error {
	if ms.pinged {
		return nil
	}
	ms.pinged = true
	return ms.namedEvent("ping", typeEvent{Type: "ping"})
}

// stopThinking ends the thinking block (index 0) with its signature.
func (ms *messenger) stopThinking() error {
	d := anthropicContent{Type: "signature_delta", Signature: &ms.signature}
	if err := ms.namedEvent("content_block_delta", blockDeltaEvent{Type: "content_block_delta", Delta: d}); err != nil {
		return err
	}
	return ms.namedEvent("content_block_stop", indexEvent{Type: "content_block_stop"})
}

// textIndex is the index of the text block: after the thinking block, if any.
func (ms *messenger) textIndex() int {
	if ms.reasoning > 0 {
		return 1
	}
	return 0
}

// token implements streamer.
func (ms *messenger) token(i int) error {
	if i < ms.reasoning {
		if i == 0 {
			empty := ""
			if err := ms.startBlock(0, anthropicContent{Type: "thinking", Thinking: &empty}); err != nil {
				return err
			}
		}
		t := ReasoningToken(i)
		d := anthropicContent{Type: "thinking_delta", Thinking: &t}
		return ms.namedEvent("content_block_delta", blockDeltaEvent{Type: "content_block_delta", Delta: d})
	}
	j, idx := i-ms.reasoning, ms.textIndex()
	if j == 0 {
		if ms.reasoning > 0 {
			if err := ms.stopThinking(); err != nil {
				return err
			}
		}
		empty := ""
		if err := ms.startBlock(idx, anthropicContent{Type: "text", Text: &empty}); err != nil {
			return err
		}
	}
	t := ContentToken(j)
	d := anthropicContent{Type: "text_delta", Text: &t}
	return ms.namedEvent("content_block_delta", blockDeltaEvent{Type: "content_block_delta", Index: idx, Delta: d})
}

// close implements streamer: the last block's stop and message_delta.
func (ms *messenger) close() error {
	switch {
	case ms.n == 0:
		if err := ms.ping(); err != nil {
			return err
		}
	case ms.n == ms.reasoning:
		if err := ms.stopThinking(); err != nil {
			return err
		}
	default:
		if err := ms.namedEvent("content_block_stop", indexEvent{Type: "content_block_stop", Index: ms.textIndex()}); err != nil {
			return err
		}
	}
	return ms.namedEvent("message_delta", messageDeltaEvent{
		Type:  "message_delta",
		Delta: messageDelta{StopReason: stopReason(ms.finish)},
		Usage: messageDeltaUsage{OutputTokens: ms.n},
	})
}

// terminator implements streamer: message_stop.
func (ms *messenger) terminator() ([]byte, error) {
	return eventBytes("message_stop", typeEvent{Type: "message_stop"})
}

// malformed implements streamer.
func (ms *messenger) malformed() string { return "event: content_block_delta\n" + malformedEvent }

// midError implements streamer: Anthropic's mid-stream error event, "event: error" with
// the error envelope (api_error for vLLM's 500), which ends the stream.
func (ms *messenger) midError() ([]byte, error) {
	return eventBytes("error", anthropicError{Type: "error", Error: anthropicErrorInfo{
		Type: anthropicErrorType(midErrorStatus), Message: midErrorMessage,
	}})
}

// serveCountTokens serves POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt
// tokens /v1/messages would count, at once (no running slot; served while asleep).
func (e *Engine) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiAnthropic, w, r)
	if !ok {
		return
	}
	var req messagesRequest
	if !decodeBody(apiAnthropic, w, r, &req) {
		return
	}
	if _, ok := e.resolve(apiAnthropic, w, req.Model); !ok {
		return
	}
	words, err := messagesPrompt(&req)
	if err != nil {
		apiAnthropic.writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	c := e.newLightCall(w, r, f, apiAnthropic)
	_ = c.light("application/json", func() ([]byte, error) {
		return json.Marshal(struct {
			InputTokens int `json:"input_tokens"`
		}{promptTokens(words)})
	})
}
