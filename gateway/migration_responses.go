package gateway

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

// Continuation of Responses API streams.
//
// vLLM's /v1/responses takes no return_token_ids and its events carry no
// token ids (vllm/entrypoints/openai/responses/protocol.py), so, as for
// a Messages stream, a Responses stream keeps the text the client got,
// and a continuation asks the new engine's /tokenize for the ids of the
// prompt (the instructions and the input as chat messages: vLLM renders
// /v1/responses through its chat template, ResponsesRequest.
// build_chat_params) and of the text. The continuation's /v1/completions
// chunks become response.output_text.delta events of the same output item
// (its id, output_index 0, content_index 0, the sequence numbers going
// on from the first leg's), and at its end the gateway sends what the
// engine would have: response.output_text.done, response.content_part.
// done and response.output_item.done with the whole text, then
// response.completed (its status incomplete with incomplete_details
// max_output_tokens when the length ran out, as vLLM sends it) carrying the first leg's
// response object with its status, output and the whole answer's usage.
//
// A response stored on the engine that broke (previous_response_id,
// store true, background; or, with migration.responses_store, any
// request that does not set store false) is not continued (exclusion
// stored_state): the engine that finishes the answer does not store it,
// so a later previous_response_id or GET would not find the whole
// answer.

// exclStored: the request reads or writes a response stored on an engine
// (previous_response_id, store true, background): a continuation's answer
// is stored nowhere.
const exclStored = "stored_state"

// responsesParams are the Responses request members vLLM's
// ResponsesRequest.to_sampling_params passes on to sampling
// (vllm/entrypoints/openai/responses/protocol.py) that its
// CompletionRequest takes under the same name: a continuation carries
// these only (max_output_tokens becomes max_tokens, reduced).
var responsesParams = []string{
	"temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty",
	"ignore_eos", "skip_special_tokens", "include_stop_str_in_output", "logit_bias", "priority", "user",
	"vllm_xargs", "cache_salt",
}

// responsesFields are the Responses request members excludedBy reads
// besides the ones all routes share (its one decode of the body).
type responsesFields struct {
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	PreviousInput      json.RawMessage `json:"previous_input_messages"`
	Store              *bool           `json:"store"`
	Background         json.RawMessage `json:"background"`
	Include            []string        `json:"include"`
	Reasoning          json.RawMessage `json:"reasoning"`
	Text               *struct {
		Format *struct{ Type string } `json:"format"`
	} `json:"text"`
	Input json.RawMessage `json:"input"`
}

// excluded returns why a Responses request cannot be continued ("" when
// it can), before the checks all routes share; prompt and tools are the
// body's members of those names, which excludedBy decodes for every route:
// stored state (previous_response_id, stored input, a prompt template,
// store true, background; with stored, the engines' ResponsesStore
// default, any request without store false), reasoning, tools (even with
// tool_choice "none": vLLM renders them into the prompt, which the
// continuation's /tokenize of chat messages would not) and tool items,
// output formats, media in the input, logprobs.
func (f *responsesFields) excluded(stored bool, prompt, tools json.RawMessage) string {
	given := func(v json.RawMessage) bool { return isSet(v) && string(v) != "{}" }
	switch {
	case given(f.PreviousResponseID) || given(f.PreviousInput) || given(prompt) || given(f.Background),
		f.Store != nil && *f.Store, f.Store == nil && stored:
		return exclStored
	case given(f.Reasoning):
		return exclReasoning
	case given(tools):
		return exclTools
	case f.Text != nil && f.Text.Format != nil && f.Text.Format.Type != "" && f.Text.Format.Type != "text":
		return exclStructured
	}
	for _, inc := range f.Include {
		if inc == "message.output_text.logprobs" {
			return exclLogprobs
		}
	}
	if len(f.Input) > 0 && f.Input[0] == '[' {
		var items []struct {
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(f.Input, &items) != nil {
			return exclStructured
		}
		for _, it := range items {
			switch {
			case it.Type != "" && it.Type != "message":
				return exclTools // function calls and their outputs, reasoning items
			case len(it.Content) > 0 && it.Content[0] == '[' && hasMedia(it.Content):
				return exclMultimodal
			}
		}
	}
	return ""
}

// background reports whether a Responses body asks for a background
// response (background true).
func background(body []byte) bool {
	if !bytes.Contains(body, []byte(`"background"`)) {
		return false
	}
	var b struct {
		Background bool `json:"background"`
	}
	return json.Unmarshal(body, &b) == nil && b.Background
}

// responsesMessages returns the chat messages vLLM renders a Responses
// request's prompt from (the instructions as the system message, then the
// input: a string as one user message, or its message items with their
// text parts), and whether the last is an assistant message vLLM
// continues (continue_final_message) instead of adding the generation
// prompt. excludedResponses has refused any other input.
func responsesMessages(body []byte) (msgs []chatMessage, continueFinal bool, kwargs json.RawMessage) {
	var req struct {
		Instructions string          `json:"instructions"`
		Input        json.RawMessage `json:"input"`
		Kwargs       json.RawMessage `json:"chat_template_kwargs"`
	}
	_ = json.Unmarshal(body, &req) // excludedResponses read it
	if req.Instructions != "" {
		msgs = append(msgs, chatMessage{"system", req.Instructions})
	}
	var s string
	if json.Unmarshal(req.Input, &s) == nil {
		return append(msgs, chatMessage{"user", s}), false, req.Kwargs
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(req.Input, &items)
	for _, it := range items {
		msgs = append(msgs, chatMessage{it.Role, textContent(it.Content)})
	}
	if n := len(items); n > 0 && items[n-1].Role == "assistant" {
		continueFinal = true
	}
	return msgs, continueFinal, req.Kwargs
}

// textContent returns a message content value as chat content: a string as
// it is, several text parts (input_text, output_text, text) as text parts,
// one as its string.
func textContent(raw json.RawMessage) any {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type, Text string
	}
	_ = json.Unmarshal(raw, &parts)
	var texts []string
	for _, p := range parts {
		if p.Text != "" {
			texts = append(texts, p.Text)
		}
	}
	if len(texts) == 1 {
		return texts[0]
	}
	out := make([]map[string]string, len(texts))
	for i, t := range texts {
		out[i] = map[string]string{"type": "text", "text": t}
	}
	return out
}

// takeResponses reads one event of a Responses stream's first leg (e, as
// inspected from data): the response object of response.created (kept for
// the response.completed a continuation sends), the sequence numbers, the
// message item's id, the text of its output_text deltas (bounded by
// migration.max_tokens x 16 bytes), and what excludes a continuation (an
// output item other than one message: reasoning, a tool call; a part
// other than output_text).
func (c *carry) takeResponses(data []byte, e *oai.Event) {
	if c.excluded != "" {
		return
	}
	if n, ok := sequenceNumber(data); ok {
		c.seq = n + 1
	}
	switch string(e.Type) {
	case "response.created":
		var ev struct {
			Response json.RawMessage `json:"response"`
		}
		if json.Unmarshal(data, &ev) != nil || len(ev.Response) == 0 || ev.Response[0] != '{' {
			c.exclude(exclNoTokenIDs)
			return
		}
		c.resp = append(c.resp[:0], ev.Response...)
		c.id = []byte{} // the answer has started
	case "response.output_item.added":
		var ev struct {
			OutputIndex int `json:"output_index"`
			Item        struct {
				ID   json.RawMessage `json:"id"`
				Type string          `json:"type"`
			} `json:"item"`
		}
		switch {
		case json.Unmarshal(data, &ev) != nil || len(ev.Item.ID) < 2 || ev.Item.ID[0] != '"':
			c.exclude(exclNoTokenIDs)
		case ev.Item.Type == "reasoning":
			c.exclude(exclReasoning)
		case ev.Item.Type != "message" || ev.OutputIndex != 0 || c.itemID != nil:
			c.exclude(exclTools)
		default:
			c.itemID = append(c.itemID[:0], ev.Item.ID...)
		}
	case "response.content_part.added":
		var ev struct {
			ContentIndex int `json:"content_index"`
			Part         struct {
				Type string `json:"type"`
			} `json:"part"`
		}
		if json.Unmarshal(data, &ev) != nil || ev.Part.Type != "output_text" || ev.ContentIndex != 0 {
			c.exclude(exclTools)
		} else {
			c.blockStarted = true
		}
	case "response.output_text.delta":
		var ev struct {
			Delta string `json:"delta"`
		}
		switch {
		case json.Unmarshal(data, &ev) != nil:
			c.exclude(exclNoTokenIDs)
		case len(c.text)+len(ev.Delta) > 16*c.cfg.MaxTokens:
			c.exclude(exclMaxTokens)
		default:
			c.text = append(c.text, ev.Delta...)
		}
	default:
		if e.Content {
			// Output of another kind (a refusal, tool arguments).
			c.exclude(exclTools)
		}
	}
}

// sequenceNumber reads a Responses event's top-level "sequence_number"
// (a byte search: the events that nest objects put it after them or the
// nested objects have none).
func sequenceNumber(data []byte) (int64, bool) {
	at := bytes.LastIndex(data, []byte(`"sequence_number":`))
	if at < 0 {
		return 0, false
	}
	v := at + len(`"sequence_number":`)
	for v < len(data) && data[v] == ' ' {
		v++
	}
	end := v
	for end < len(data) && data[end] >= '0' && data[end] <= '9' {
		end++
	}
	n, err := strconv.ParseInt(string(data[v:end]), 10, 64)
	return n, err == nil
}

// appendResponsesEvent appends one Responses event: its event line, then
// the data {"type":typ,"sequence_number":n, then body (the other members,
// starting with a comma, or nothing) and the closing brace.
func (c *carry) appendResponsesEvent(b []byte, typ string, body ...[]byte) []byte {
	b = append(append(append(b, "event: "...), typ...), "\ndata: {\"type\":\""...)
	b = append(append(b, typ...), `","sequence_number":`...)
	b = strconv.AppendInt(b, c.seq, 10)
	c.seq++
	for _, p := range body {
		b = append(b, p...)
	}
	return append(b, "}\n\n"...)
}

// reshapeResponses turns one chunk of a Responses continuation (an
// engine's /v1/completions chunk) into the client's events: a
// response.output_text.delta per text; at the usage chunk (or endFramed)
// the done events with the whole text and response.completed with the whole answer's usage. drop is set when
// nothing is to be sent.
func (c *carry) reshapeResponses(b []byte, cc *contChunk) (out []byte, drop bool) {
	if cc.Usage != nil && len(cc.Choices) == 0 {
		if c.ended {
			return b, true
		}
		c.ended = true
		return c.endResponse(b, int64(c.legGen)+cc.Usage.CompletionTokens), false
	}
	text, ok := c.choiceText(cc)
	if !ok {
		return b, true
	}
	if !c.blockStarted {
		// The break came before the text part opened.
		c.blockStarted = true
		b = c.appendResponsesEvent(b, "response.content_part.added", c.itemHead(),
			[]byte(`,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}`))
	}
	return c.appendResponsesEvent(b, "response.output_text.delta", c.itemHead(), []byte(`,"delta":`), text, []byte(`,"logprobs":[]`)), false
}

// itemHead is the members naming the message item's text part:
// ,"item_id":..,"output_index":0,"content_index":0.
func (c *carry) itemHead() []byte {
	b := make([]byte, 0, len(c.itemID)+48)
	b = append(append(append(b, `,"item_id":`...), c.itemID...), `,"output_index":0,"content_index":0`...)
	return b
}

// endResponse appends the end of a continued Responses stream: the done
// events of the text, its part and its item, and the terminal event with
// the first leg's response object completed: its status (completed, or
// incomplete with incomplete_details max_output_tokens when the length
// ran out; vLLM ends with response.completed either way), the output item with the whole text, and
// the usage of the whole answer (gen output tokens).
func (c *carry) endResponse(b []byte, gen int64) []byte {
	if !c.blockStarted {
		// The text part never opened (no text came): it is opened
		// before it is done, as vLLM's stream does.
		c.blockStarted = true
		b = c.appendResponsesEvent(b, "response.content_part.added", c.itemHead(),
			[]byte(`,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}`))
	}
	text, _ := json.Marshal(string(c.text))
	part := append(append([]byte(`{"type":"output_text","text":`), text...), `,"annotations":[],"logprobs":null}`...)
	item := append(append(append(append([]byte(`{"id":`), c.itemID...), `,"type":"message","status":"completed","role":"assistant","content":[`...), part...), "]}"...)
	b = c.appendResponsesEvent(b, "response.output_text.done", c.itemHead(), []byte(`,"text":`), text, []byte(`,"logprobs":[]`))
	b = c.appendResponsesEvent(b, "response.content_part.done", c.itemHead(), []byte(`,"part":`), part)
	b = c.appendResponsesEvent(b, "response.output_item.done", []byte(`,"output_index":0,"item":`), item)
	var resp map[string]json.RawMessage
	if json.Unmarshal(c.resp, &resp) != nil || resp == nil {
		resp = map[string]json.RawMessage{}
	}
	status := "completed"
	resp["incomplete_details"] = json.RawMessage("null")
	if c.finish == "length" {
		status = "incomplete"
		resp["incomplete_details"] = json.RawMessage(`{"reason":"max_output_tokens"}`)
	}
	resp["status"], _ = json.Marshal(status)
	if c.model != nil {
		resp["model"] = c.model // a fallback model finished the answer (cross)
	}
	resp["output"] = append(append([]byte{'['}, item...), ']')
	gen = max(gen, 0)
	in := int64(c.promptLen)
	u := []byte(`{"input_tokens":`)
	u = strconv.AppendInt(u, in, 10)
	u = append(u, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
	u = strconv.AppendInt(u, gen, 10)
	u = append(u, `,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0},"total_tokens":`...)
	u = strconv.AppendInt(u, in+gen, 10)
	resp["usage"] = append(u, '}')
	raw, _ := json.Marshal(resp)
	return c.appendResponsesEvent(b, "response.completed", []byte(`,"response":`), raw)
}
