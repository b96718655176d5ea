package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/oai"
)

// Continuation of Anthropic Messages streams.
//
// vLLM's /v1/messages takes no return_token_ids and its events carry no
// token ids (vllm/entrypoints/anthropic/protocol.py), so a Messages
// stream keeps the text the client got instead. At a break the
// continuation asks the new engine's /tokenize for the prompt's ids (the
// system prompt and the messages as chat messages, with the generation
// prompt: vLLM serves /v1/messages through its chat template) and for the
// text's ids, and goes on from there as for chat. The text is tokenized
// again, so the continuation starts from the same text, not necessarily
// from the same token ids.

// takeAnthropic reads one event of a Messages stream's first leg (e, as
// inspected from data): the prompt's input tokens from message_start, the
// text of the text block's deltas (bounded by migration.max_tokens x 16
// bytes), and what excludes a continuation (a block other than text:
// thinking or a tool call).
func (c *carry) takeAnthropic(data []byte, e *oai.Event) {
	if c.excluded != "" {
		return
	}
	switch string(e.Type) {
	case "message_start":
		c.id = []byte{} // the answer has started
		if e.InputTokens >= 0 {
			c.promptLen = int(e.InputTokens)
		}
		if c.promptLen > c.cfg.MaxTokens {
			c.exclude(exclMaxTokens)
		}
	case "content_block_start":
		var ev struct {
			Index int `json:"index"`
			Block struct {
				Type string `json:"type"`
			} `json:"content_block"`
		}
		switch {
		case json.Unmarshal(data, &ev) != nil:
			c.exclude(exclNoTokenIDs)
		case ev.Block.Type == "thinking" || ev.Block.Type == "redacted_thinking":
			c.exclude(exclReasoning)
		case ev.Block.Type != "text" || ev.Index != 0:
			c.exclude(exclTools)
		default:
			c.blockStarted = true
		}
	case "content_block_delta":
		var ev struct {
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
		}
		switch {
		case json.Unmarshal(data, &ev) != nil:
			c.exclude(exclNoTokenIDs)
		case ev.Delta.Type == "thinking_delta" || ev.Delta.Type == "signature_delta":
			c.exclude(exclReasoning)
		case ev.Delta.Type != "text_delta":
			c.exclude(exclTools)
		case len(c.text)+len(ev.Delta.Text) > 16*c.cfg.MaxTokens:
			c.exclude(exclMaxTokens)
		default:
			c.text = append(c.text, ev.Delta.Text...)
		}
	}
}

// errTokenize is a continuation whose /tokenize calls failed: counted
// and ended as a continuation that failed before its first byte.
var errTokenize = errors.New("the engine could not tokenize the continuation")

// chatMessage is one message of a /tokenize chat request.
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

// anthropicMessages returns the chat messages vLLM renders a Messages
// request's prompt from: the system prompt, then the messages, each
// content as vLLM converts it (one text block is the content, several are
// text parts, which its chat preprocessing joins with "\n").
func anthropicMessages(body []byte) []chatMessage {
	var req struct {
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &req) // the parser and excludedBy read it
	var msgs []chatMessage
	if sys := strings.Join(anthropicTexts(req.System), ""); sys != "" {
		msgs = append(msgs, chatMessage{"system", sys})
	}
	for _, m := range req.Messages {
		texts := anthropicTexts(m.Content)
		var content any = strings.Join(texts, "")
		if len(texts) > 1 {
			parts := make([]map[string]string, len(texts))
			for i, t := range texts {
				parts[i] = map[string]string{"type": "text", "text": t}
			}
			content = parts
		}
		msgs = append(msgs, chatMessage{m.Role, content})
	}
	return msgs
}

// tokenizeContinuation fills the carry's prompt and generated ids for a
// continuation on eng of a route whose engine sends no token ids (Messages,
// Responses), or of a chat or completions answer crossing to a fallback
// model (carry.cross), whose tokenizer need not read the ids kept: POST
// /tokenize with the request's prompt as chat messages
// (with the generation prompt, or continuing a final assistant message),
// and with the text the client got (add_special_tokens false). Errors
// wrap errTokenize, or are errTooLong.
func (s *Server) tokenizeContinuation(ctx context.Context, eng *fleet.Engine, model string, c *carry) error {
	req := map[string]any{"model": model, "add_generation_prompt": true}
	switch c.kind {
	case migrateChat, migrateCompletion:
		// A crossing to a fallback model: the client's prompt as it
		// came, with the chat template options it set.
		var orig map[string]json.RawMessage
		if err := json.Unmarshal(c.body, &orig); err != nil {
			return fmt.Errorf("%w: %v", errTokenize, err)
		}
		if c.kind == migrateCompletion {
			p := orig["prompt"]
			if len(p) == 0 || p[0] != '"' {
				return fmt.Errorf("%w: the prompt is not text", errTokenize)
			}
			delete(req, "add_generation_prompt")
			req["prompt"] = p
			break
		}
		req["messages"] = orig["messages"]
		for _, k := range []string{"add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs", "documents", "tools"} {
			if v, ok := orig[k]; ok {
				req[k] = v
			}
		}
	case migrateResponses:
		msgs, continueFinal, kwargs := responsesMessages(c.body)
		req["messages"] = msgs
		if continueFinal {
			req["add_generation_prompt"], req["continue_final_message"] = false, true
		}
		if len(kwargs) > 0 && kwargs[0] == '{' {
			req["chat_template_kwargs"] = kwargs
		}
	default:
		req["messages"] = anthropicMessages(c.body)
	}
	if d := s.set.Load().cfg.Timeouts.ResponseHeader; d > 0 {
		// Two short answers: bounded as an engine's headers are.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	prompt, err := s.tokenize(ctx, eng, req)
	if err != nil {
		return err
	}
	gen, err := s.tokenize(ctx, eng, map[string]any{"model": model, "prompt": string(c.text), "add_special_tokens": false})
	if err != nil {
		return err
	}
	c.prompt, c.gen, c.sawPrompt = prompt, gen, true
	if c.promptLen == 0 {
		c.promptLen = len(prompt)
	}
	if c.held() > c.cfg.MaxTokens {
		c.exclude(exclMaxTokens)
		return fmt.Errorf("%w: over migration.max_tokens", errTooLong)
	}
	return nil
}

// errTooLong is a continuation (Messages, Responses) whose prompt and text passed
// migration.max_tokens once tokenized: not continued.
var errTooLong = errors.New("the prompt and answer are too long to continue")

// anthropicTexts returns the texts of an Anthropic content value: the
// string, or its non-empty text blocks (excludedBy has refused any other
// block).
func anthropicTexts(raw json.RawMessage) []string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}
	}
	var blocks []struct {
		Type, Text string
	}
	_ = json.Unmarshal(raw, &blocks)
	var out []string
	for _, bl := range blocks {
		if bl.Type == "text" && bl.Text != "" {
			out = append(out, bl.Text)
		}
	}
	return out
}

// endFramed appends the end of a Messages or Responses continuation whose
// engine sent no usage chunk before [DONE] (out is its output tokens as
// counted from its chunks); nothing when the end was sent.
func (c *carry) endFramed(b []byte, out int64) []byte {
	if c.ended {
		return b
	}
	b, _ = c.reshapeFramed(b, &contChunk{Usage: &struct {
		CompletionTokens int64 `json:"completion_tokens"`
	}{out}})
	return b
}

// choiceText reads the one choice of a framed continuation's chunk: it
// keeps its finish reason (until the usage chunk ends the answer) and
// returns its text, a JSON string; ok is false when there is no one
// choice or no text to send.
func (c *carry) choiceText(cc *contChunk) (text []byte, ok bool) {
	if len(cc.Choices) != 1 {
		return nil, false
	}
	ch := cc.Choices[0]
	if fr := ch.FinishReason; len(fr) > 2 && fr[0] == '"' {
		c.finish = string(fr[1 : len(fr)-1])
	}
	if len(ch.Text) < 3 || ch.Text[0] != '"' {
		return nil, false // no text, or not a string
	}
	return ch.Text, true
}

// reshapeFramed turns one chunk of a Messages or Responses continuation
// into the client's events (reshapeMessages, reshapeResponses).
func (c *carry) reshapeFramed(b []byte, cc *contChunk) ([]byte, bool) {
	if c.kind == migrateResponses {
		return c.reshapeResponses(b, cc)
	}
	return c.reshapeMessages(b, cc)
}

// maxTokenizeBody caps an engine's /tokenize answer (its ids as JSON).
const maxTokenizeBody = 4 << 20

// tokenize posts body to eng's /tokenize and returns the ids of its
// answer (vLLM's {"count", "max_model_len", "tokens": [...]}). Errors wrap
// errTokenize.
func (s *Server) tokenize(ctx context.Context, eng *fleet.Engine, body any) ([]int32, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, eng.Base()+"/tokenize", bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	req.Header["Content-Type"] = jsonContentType
	if auth := eng.Auth(); auth != nil {
		req.Header["Authorization"] = auth
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTokenizeBody))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: status %d", errTokenize, resp.StatusCode)
	}
	var out struct {
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%w: %v", errTokenize, err)
	}
	ids, ok := appendIDs(nil, out.Tokens)
	if !ok {
		return nil, fmt.Errorf("%w: tokens are not ids", errTokenize)
	}
	return ids, nil
}

// reshapeMessages turns one chunk of a Messages continuation (an engine's
// /v1/completions chunk) into the client's events: a content_block_delta
// per text; at the finish, content_block_stop and message_delta with the
// stop reason (stop: end_turn, length: max_tokens, as vLLM maps them) and
// the whole answer's usage once the usage chunk has come, then
// message_stop. drop is set when nothing is to be sent.
func (c *carry) reshapeMessages(b []byte, cc *contChunk) (out []byte, drop bool) {
	if cc.Usage != nil && len(cc.Choices) == 0 {
		if c.ended {
			return b, true
		}
		c.ended = true
		gen := int64(c.legGen) + cc.Usage.CompletionTokens
		reason := "end_turn"
		if c.finish == "length" {
			reason = "max_tokens"
		}
		if c.blockStarted {
			b = append(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
		}
		b = append(b, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\""...)
		b = append(b, reason...)
		b = append(b, `","stop_sequence":null},"usage":{"input_tokens":`...)
		b = strconv.AppendInt(b, int64(c.promptLen), 10)
		b = append(b, `,"output_tokens":`...)
		b = strconv.AppendInt(b, max(gen, 0), 10)
		b = append(b, "}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
		return b, false
	}
	text, ok := c.choiceText(cc)
	if !ok {
		return b, true
	}
	if !c.blockStarted {
		// The break came before the text block opened.
		c.blockStarted = true
		b = append(b, "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"...)
	}
	b = append(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"...)
	b = append(b, text...)
	return append(b, "}}\n\n"...), false
}
