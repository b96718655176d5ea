package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/switchboard-gw/switchboard/internal/sse"
)

// This file rebuilds the non-streaming body of a chat or completions request from the
// chunks of the same generation streamed with "stream":true and
// "stream_options":{"include_usage":true}, so the gateway can stream a non-streaming
// request from the engine (and see its first token and its progress) and still answer the
// client with the JSON body vLLM would have sent.
//
// The body is vLLM's (0.10.1's vllm/entrypoints/openai/protocol.py, and the later releases
// whose reasoning field is still reasoning_content), as its OpenAI server writes a
// non-stream response: pydantic's model_dump of ChatCompletionResponse or
// CompletionResponse, every field present in the models' order, null where unset:
//
//	chat:        {"id","object":"chat.completion","created","model","choices":[{"index",
//	             "message":{"role","content","refusal","annotations","audio","function_call",
//	             "tool_calls","reasoning_content"},"logprobs","finish_reason","stop_reason"}],
//	             "service_tier","system_fingerprint","usage","prompt_logprobs",
//	             "kv_transfer_params"}
//	completions: {"id","object":"text_completion","created","model","choices":[{"index",
//	             "text","logprobs","finish_reason","stop_reason","prompt_logprobs"}],
//	             "service_tier","system_fingerprint","usage","kv_transfer_params"}
//
// Fields that exist in both the stream and the body follow what the stream carried: later
// releases' "token_ids" (per choice) and "prompt_token_ids" (top level for chat, per choice
// for completions) appear when the chunks carried them, even as null, and a newer vLLM's
// "reasoning" delta becomes the message's "reasoning" (before "reasoning_content"). Values are copied
// from the chunks byte for byte (strings keep the engine's escapes, numbers its spelling);
// text is the concatenation of the deltas' escaped contents, so a string split anywhere,
// even inside a surrogate pair, is rebuilt whole.
//
// What a stream cannot carry is vLLM's default: prompt_logprobs and kv_transfer_params are
// null, refusal null unless refusal deltas came, annotations, audio and function_call
// null. A message's content is null when no content delta came, or when the content is
// empty and the output had reasoning or tool calls (vLLM's reasoning and tool parsers
// return no content then; its role chunk's "" does not count).

// Limits on what one stream may open: a choice or tool call is found by a search of a
// sorted slice and inserted in place, so a hostile engine could make that quadratic; with
// these caps it is at most 128² steps per choice. vLLM's n and its tool calls per message
// are far below.
const (
	maxReassembleChoices   = 128
	maxReassembleToolCalls = 128
)

// errMalformedChunk is wrapped by the error add returns for an event whose data is not a
// JSON object or whose known fields have the wrong JSON types.
var errMalformedChunk = errors.New("malformed stream chunk")

// engineStreamError is an engine's in-band stream error: an event whose data is an error
// object, which vLLM sends (followed by [DONE]) when generation fails after it answered
// 200, as {"error":{"message","type","param","code"}} (vLLM before 0.10 sent the flat
// {"object":"error","message",...}). The caller answers the non-streaming client with 502
// and Body.
type engineStreamError struct {
	// Body is the error as a JSON object {"error":{...}}: the event's data, or a flat
	// legacy error wrapped under "error".
	Body []byte
	// Message is error.message, "" when it is not a string.
	Message string
	// Code is error.code when it is an HTTP status (100..599), else 0.
	Code int
}

// Error implements error.
func (e *engineStreamError) Error() string {
	if e.Message == "" {
		return "engine stream error"
	}
	return "engine stream error: " + e.Message
}

// reassembler merges the data of a stream's events, in order, into the non-streaming body
// of the same generation (see this file's comment for the shape). Memory grows with what
// arrives: it keeps the merged text, tool calls, logprobs and token ids of each choice
// (copies of the events' escaped bytes), the first chunk's id, created and model, and the
// last usage; an event that adds nothing adds nothing. A reassembler is not safe for
// concurrent use; use one per stream.
type reassembler struct {
	completions bool
	err         error // the first error add returned; add returns it again

	id, created, model []byte // raw JSON values, from the first chunk carrying each
	fingerprint        []byte // system_fingerprint, the last non-null
	serviceTier        []byte // service_tier, the last non-null
	usage              []byte // the last non-null usage object
	promptTokenIDs     rawField
	choices            []choiceAcc // sorted by index
	last               int         // position in choices of the choice merged last
}

// rawField is a field copied whole: its first non-null value, and whether any chunk carried
// the key (even as null).
type rawField struct {
	raw  []byte
	seen bool
}

// textAcc accumulates a string field's deltas: b is the concatenation of their escaped
// contents (between the quotes); set is whether any non-null delta came.
type textAcc struct {
	b   []byte
	set bool
}

// arrayAcc accumulates arrays: b holds their elements joined by commas (without brackets);
// set is whether any non-null array came; seen whether any chunk carried the key.
type arrayAcc struct {
	b         []byte
	set, seen bool
}

// choiceAcc is one choice being reassembled.
type choiceAcc struct {
	index int
	// chat
	role                                      []byte // raw string, the first non-null
	content, reasoningContent, reasoning, ref textAcc
	tools                                     []toolAcc // sorted by index
	lpContent                                 arrayAcc
	// completions
	text                                          textAcc
	lpOffset, lpTokenLogprobs, lpTokens, lpTopMap arrayAcc
	promptTokenIDs                                rawField
	// both
	logprobs     bool   // a chunk carried a non-null logprobs object
	finish, stop []byte // raw, the last non-null
	tokenIDs     arrayAcc
}

// toolAcc is one tool call of a choice being reassembled.
type toolAcc struct {
	index      int
	id, typ    []byte // raw strings, the first non-null
	name, args textAcc
}

// newReassembler returns a reassembler for a chat stream, or a completions stream when
// completions is true.
func newReassembler(completions bool) *reassembler {
	return &reassembler{completions: completions}
}

// reset empties r for a new stream of the given kind, keeping its buffers' capacity where
// it can.
func (r *reassembler) reset(completions bool) {
	clear(r.choices) // drop the old choices' buffers
	*r = reassembler{completions: completions, choices: r.choices[:0]}
}

// add merges one event's data: the payload of a data event without the "data: " prefix
// (multi-line data joined with "\n"), which is only read during the call. Empty data and
// "[DONE]" are ignored. An error object is reported as an *engineStreamError; data that is
// not a JSON object, or whose known fields have the wrong types, as an error wrapping
// errMalformedChunk. Data that is not valid JSON or not an object merges nothing and leaves
// r as it was, so a caller may count it and go on (the event's content is lost, though);
// after any other error r keeps what it had merged (possibly part of the failing chunk),
// and add returns the same error again.
func (r *reassembler) add(data []byte) error {
	if r.err != nil {
		return r.err
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || sse.IsDone(data) {
		return nil
	}
	// Nothing is merged from data that is not a JSON object, so these errors leave r usable.
	if !json.Valid(data) {
		return malformedf("not valid JSON")
	}
	if data[0] != '{' {
		return malformedf("not a JSON object")
	}
	var f struct {
		id, object, created, model, choices, usage, fingerprint, serviceTier, promptTokenIDs, errObj []byte
		hasPromptTokenIDs                                                                            bool
	}
	c := cursor{b: data, i: 1}
	for c.next('}') {
		k, v := c.member()
		switch {
		case keyIs(k, "id"):
			f.id = v
		case keyIs(k, "object"):
			f.object = v
		case keyIs(k, "created"):
			f.created = v
		case keyIs(k, "model"):
			f.model = v
		case keyIs(k, "choices"):
			f.choices = v
		case keyIs(k, "usage"):
			f.usage = v
		case keyIs(k, "system_fingerprint"):
			f.fingerprint = v
		case keyIs(k, "service_tier"):
			f.serviceTier = v
		case keyIs(k, "prompt_token_ids"):
			f.promptTokenIDs, f.hasPromptTokenIDs = v, true
		case keyIs(k, "error"):
			f.errObj = v
		}
	}
	if f.errObj != nil && !isNull(f.errObj) {
		return r.fail(newEngineStreamError(data, f.errObj, false))
	}
	if bytes.Equal(f.object, []byte(`"error"`)) {
		return r.fail(newEngineStreamError(data, data, true))
	}
	switch {
	case !isKind(f.id, '"'), !isKind(f.model, '"'), !isNumberOrNull(f.created):
		return r.fail(malformedf("id, model or created of the wrong type"))
	case !isKind(f.choices, '['), !isKind(f.usage, '{'):
		return r.fail(malformedf("choices or usage of the wrong type"))
	case !isKind(f.fingerprint, '"'), !isKind(f.serviceTier, '"'), !isKind(f.promptTokenIDs, '['):
		return r.fail(malformedf("system_fingerprint, service_tier or prompt_token_ids of the wrong type"))
	}
	if r.id == nil && !isNull(f.id) {
		r.id = clone(f.id)
	}
	if r.model == nil && !isNull(f.model) {
		r.model = clone(f.model)
	}
	if r.created == nil && !isNull(f.created) {
		r.created = clone(f.created)
	}
	if !isNull(f.fingerprint) {
		r.fingerprint = append(r.fingerprint[:0], f.fingerprint...)
	}
	if !isNull(f.serviceTier) {
		r.serviceTier = append(r.serviceTier[:0], f.serviceTier...)
	}
	if !isNull(f.usage) {
		r.usage = append(r.usage[:0], f.usage...)
	}
	if f.hasPromptTokenIDs && !r.completions {
		r.promptTokenIDs.merge(f.promptTokenIDs)
	}
	if isNull(f.choices) {
		return nil
	}
	c = cursor{b: f.choices, i: 1}
	for c.next(']') {
		if err := r.addChoice(c.value()); err != nil {
			return r.fail(err)
		}
	}
	return nil
}

// addChoice merges one element of a chunk's choices.
func (r *reassembler) addChoice(v []byte) error {
	if v[0] != '{' {
		return malformedf("a choice is not an object")
	}
	var f struct {
		index, delta, text, logprobs, finish, stop, tokenIDs, promptTokenIDs []byte
		hasTokenIDs, hasPromptTokenIDs                                       bool
	}
	c := cursor{b: v, i: 1}
	for c.next('}') {
		k, v := c.member()
		switch {
		case keyIs(k, "index"):
			f.index = v
		case keyIs(k, "delta"):
			f.delta = v
		case keyIs(k, "text"):
			f.text = v
		case keyIs(k, "logprobs"):
			f.logprobs = v
		case keyIs(k, "finish_reason"):
			f.finish = v
		case keyIs(k, "stop_reason"):
			f.stop = v
		case keyIs(k, "token_ids"):
			f.tokenIDs, f.hasTokenIDs = v, true
		case keyIs(k, "prompt_token_ids"):
			f.promptTokenIDs, f.hasPromptTokenIDs = v, true
		}
	}
	index, ok := parseIndex(f.index)
	switch {
	case !ok:
		return malformedf("a choice index is not a non-negative integer")
	case !isKind(f.logprobs, '{'), !isKind(f.finish, '"'), !isKind(f.tokenIDs, '['):
		return malformedf("logprobs, finish_reason or token_ids of the wrong type")
	case !isNull(f.stop) && f.stop[0] != '"' && !isNumber(f.stop):
		return malformedf("stop_reason of the wrong type")
	}
	ch, err := r.choice(index)
	if err != nil {
		return err
	}
	if r.completions {
		if !isKind(f.text, '"') || !isKind(f.promptTokenIDs, '[') {
			return malformedf("text or prompt_token_ids of the wrong type")
		}
		ch.text.merge(f.text)
		if f.hasPromptTokenIDs {
			ch.promptTokenIDs.merge(f.promptTokenIDs)
		}
	} else if f.delta != nil && !isNull(f.delta) {
		if f.delta[0] != '{' {
			return malformedf("delta is not an object")
		}
		if err := ch.addDelta(f.delta); err != nil {
			return err
		}
	}
	if !isNull(f.logprobs) {
		if err := ch.addLogprobs(f.logprobs, r.completions); err != nil {
			return err
		}
	}
	if !isNull(f.finish) {
		ch.finish = append(ch.finish[:0], f.finish...)
	}
	if !isNull(f.stop) {
		ch.stop = append(ch.stop[:0], f.stop...)
	}
	if f.hasTokenIDs {
		ch.tokenIDs.merge(f.tokenIDs)
	}
	return nil
}

// choice returns the choice of the given index, added (in index order) if it is new.
func (r *reassembler) choice(index int) (*choiceAcc, error) {
	if r.last < len(r.choices) && r.choices[r.last].index == index {
		return &r.choices[r.last], nil
	}
	i, found := searchIndex(len(r.choices), index, func(i int) int { return r.choices[i].index })
	if !found {
		if len(r.choices) >= maxReassembleChoices {
			return nil, malformedf("more than %d choices", maxReassembleChoices)
		}
		r.choices = append(r.choices, choiceAcc{})
		copy(r.choices[i+1:], r.choices[i:])
		r.choices[i] = choiceAcc{index: index}
	}
	r.last = i
	return &r.choices[i], nil
}

// addDelta merges a chat delta object.
func (ch *choiceAcc) addDelta(v []byte) error {
	var f struct{ role, content, reasoningContent, reasoning, refusal, tools []byte }
	c := cursor{b: v, i: 1}
	for c.next('}') {
		k, v := c.member()
		switch {
		case keyIs(k, "role"):
			f.role = v
		case keyIs(k, "content"):
			f.content = v
		case keyIs(k, "reasoning_content"):
			f.reasoningContent = v
		case keyIs(k, "reasoning"):
			f.reasoning = v
		case keyIs(k, "refusal"):
			f.refusal = v
		case keyIs(k, "tool_calls"):
			f.tools = v
		}
	}
	if !isKind(f.role, '"') || !isKind(f.content, '"') || !isKind(f.reasoningContent, '"') ||
		!isKind(f.reasoning, '"') || !isKind(f.refusal, '"') || !isKind(f.tools, '[') {
		return malformedf("a delta field of the wrong type")
	}
	if ch.role == nil && !isNull(f.role) {
		ch.role = clone(f.role)
	}
	ch.content.merge(f.content)
	ch.reasoningContent.merge(f.reasoningContent)
	ch.reasoning.merge(f.reasoning)
	ch.ref.merge(f.refusal)
	if isNull(f.tools) {
		return nil
	}
	c = cursor{b: f.tools, i: 1}
	for c.next(']') {
		if err := ch.addToolCall(c.value()); err != nil {
			return err
		}
	}
	return nil
}

// addToolCall merges one tool call delta: its id and type are the first non-null ones,
// its name and arguments the concatenation of every delta's (the name normally comes
// whole in the first delta, the arguments in fragments), by the delta's index (0 when it
// has none).
func (ch *choiceAcc) addToolCall(v []byte) error {
	if v[0] != '{' {
		return malformedf("a tool call is not an object")
	}
	var f struct{ index, id, typ, function, name, args []byte }
	c := cursor{b: v, i: 1}
	for c.next('}') {
		k, v := c.member()
		switch {
		case keyIs(k, "index"):
			f.index = v
		case keyIs(k, "id"):
			f.id = v
		case keyIs(k, "type"):
			f.typ = v
		case keyIs(k, "function"):
			f.function = v
		}
	}
	if !isKind(f.id, '"') || !isKind(f.typ, '"') || !isKind(f.function, '{') {
		return malformedf("a tool call field of the wrong type")
	}
	index := 0
	if f.index != nil {
		var ok bool
		if index, ok = parseIndex(f.index); !ok {
			return malformedf("a tool call index is not a non-negative integer")
		}
	}
	if !isNull(f.function) {
		c = cursor{b: f.function, i: 1}
		for c.next('}') {
			k, v := c.member()
			switch {
			case keyIs(k, "name"):
				f.name = v
			case keyIs(k, "arguments"):
				f.args = v
			}
		}
		if !isKind(f.name, '"') || !isKind(f.args, '"') {
			return malformedf("a tool call function field of the wrong type")
		}
	}
	i, found := searchIndex(len(ch.tools), index, func(i int) int { return ch.tools[i].index })
	if !found {
		if len(ch.tools) >= maxReassembleToolCalls {
			return malformedf("more than %d tool calls", maxReassembleToolCalls)
		}
		ch.tools = append(ch.tools, toolAcc{})
		copy(ch.tools[i+1:], ch.tools[i:])
		ch.tools[i] = toolAcc{index: index}
	}
	t := &ch.tools[i]
	if t.id == nil && !isNull(f.id) {
		t.id = clone(f.id)
	}
	if t.typ == nil && !isNull(f.typ) {
		t.typ = clone(f.typ)
	}
	t.name.merge(f.name)
	t.args.merge(f.args)
	return nil
}

// addLogprobs merges a non-null logprobs object: chat's {"content":[...]} or completions'
// {"text_offset","token_logprobs","tokens","top_logprobs"}, whose arrays are concatenated
// (vLLM's streamed text_offset is already relative to the whole text).
func (ch *choiceAcc) addLogprobs(v []byte, completions bool) error {
	if v[0] != '{' {
		return malformedf("logprobs is not an object")
	}
	ch.logprobs = true
	var f struct{ content, offset, tokenLogprobs, tokens, top []byte }
	c := cursor{b: v, i: 1}
	for c.next('}') {
		k, v := c.member()
		switch {
		case keyIs(k, "content"):
			f.content = v
		case keyIs(k, "text_offset"):
			f.offset = v
		case keyIs(k, "token_logprobs"):
			f.tokenLogprobs = v
		case keyIs(k, "tokens"):
			f.tokens = v
		case keyIs(k, "top_logprobs"):
			f.top = v
		}
	}
	if !completions {
		if !isKind(f.content, '[') {
			return malformedf("logprobs.content is not an array")
		}
		ch.lpContent.merge(f.content)
		return nil
	}
	if !isKind(f.offset, '[') || !isKind(f.tokenLogprobs, '[') || !isKind(f.tokens, '[') || !isKind(f.top, '[') {
		return malformedf("a logprobs field is not an array")
	}
	ch.lpOffset.merge(f.offset)
	ch.lpTokenLogprobs.merge(f.tokenLogprobs)
	ch.lpTokens.merge(f.tokens)
	ch.lpTopMap.merge(f.top)
	return nil
}

// finished reports whether at least one choice arrived and every choice has its
// finish_reason: a stream cut short (the engine died, close-after) leaves one without.
func (r *reassembler) finished() bool {
	for i := range r.choices {
		if r.choices[i].finish == nil {
			return false
		}
	}
	return len(r.choices) > 0
}

// body returns the non-streaming JSON body of what was merged so far, as vLLM would have
// written it for the same generation (see this file's comment): compact, in the models'
// field order, choices by index. Without a usage chunk usage is null. It may be called at
// any time and returns a new slice each call.
func (r *reassembler) body() []byte {
	n := 320 + len(r.id) + len(r.model) + len(r.usage) + len(r.fingerprint) + len(r.promptTokenIDs.raw)
	for i := range r.choices {
		n += r.choices[i].size()
	}
	b := make([]byte, 0, n)
	b = append(b, `{"id":`...)
	b = appendOr(b, r.id, `""`)
	if r.completions {
		b = append(b, `,"object":"text_completion","created":`...)
	} else {
		b = append(b, `,"object":"chat.completion","created":`...)
	}
	b = appendOr(b, r.created, "0")
	b = append(b, `,"model":`...)
	b = appendOr(b, r.model, `""`)
	b = append(b, `,"choices":[`...)
	for i := range r.choices {
		if i > 0 {
			b = append(b, ',')
		}
		if r.completions {
			b = r.choices[i].appendCompletion(b)
		} else {
			b = r.choices[i].appendChat(b)
		}
	}
	b = append(b, `],"service_tier":`...)
	b = appendOr(b, r.serviceTier, "null")
	b = append(b, `,"system_fingerprint":`...)
	b = appendOr(b, r.fingerprint, "null")
	b = append(b, `,"usage":`...)
	b = appendUsage(b, r.usage)
	if !r.completions {
		b = append(b, `,"prompt_logprobs":null`...)
		if r.promptTokenIDs.seen {
			b = append(b, `,"prompt_token_ids":`...)
			b = appendOr(b, r.promptTokenIDs.raw, "null")
		}
	}
	return append(b, `,"kv_transfer_params":null}`...)
}

// size is an upper bound of the bytes ch adds to a body, beyond the fixed keys.
func (ch *choiceAcc) size() int {
	n := 512 + len(ch.role) + len(ch.content.b) + len(ch.reasoningContent.b) + len(ch.reasoning.b) +
		len(ch.ref.b) + len(ch.lpContent.b) + len(ch.text.b) + len(ch.lpOffset.b) + len(ch.lpTokenLogprobs.b) +
		len(ch.lpTokens.b) + len(ch.lpTopMap.b) + len(ch.promptTokenIDs.raw) + len(ch.finish) + len(ch.stop) +
		len(ch.tokenIDs.b)
	for i := range ch.tools {
		t := &ch.tools[i]
		n += 64 + len(t.id) + len(t.typ) + len(t.name.b) + len(t.args.b)
	}
	return n
}

// appendChat appends the chat choice ChatCompletionResponseChoice.
func (ch *choiceAcc) appendChat(b []byte) []byte {
	b = append(b, `{"index":`...)
	b = appendInt(b, ch.index)
	b = append(b, `,"message":{"role":`...)
	b = appendOr(b, ch.role, `"assistant"`)
	b = append(b, `,"content":`...)
	noContent := len(ch.content.b) == 0 && (ch.reasoningContent.set || ch.reasoning.set || len(ch.tools) > 0)
	if ch.content.set && !noContent {
		b = ch.content.appendString(b)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"refusal":`...)
	b = ch.ref.appendStringOrNull(b)
	b = append(b, `,"annotations":null,"audio":null,"function_call":null,"tool_calls":[`...)
	for i := range ch.tools {
		t := &ch.tools[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendOr(b, t.id, `""`)
		b = append(b, `,"type":`...)
		b = appendOr(b, t.typ, `"function"`)
		b = append(b, `,"function":{"name":`...)
		b = t.name.appendString(b)
		b = append(b, `,"arguments":`...)
		b = t.args.appendString(b)
		b = append(b, "}}"...)
	}
	b = append(b, ']')
	if ch.reasoning.set {
		b = append(b, `,"reasoning":`...)
		b = ch.reasoning.appendString(b)
	}
	b = append(b, `,"reasoning_content":`...)
	b = ch.reasoningContent.appendStringOrNull(b)
	b = append(b, `},"logprobs":`...)
	if ch.logprobs {
		b = append(b, `{"content":`...)
		b = ch.lpContent.appendArray(b)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = ch.appendFinish(b)
	if ch.tokenIDs.seen {
		b = append(b, `,"token_ids":`...)
		b = ch.tokenIDs.appendArrayOrNull(b)
	}
	return append(b, '}')
}

// appendCompletion appends the completions choice CompletionResponseChoice.
func (ch *choiceAcc) appendCompletion(b []byte) []byte {
	b = append(b, `{"index":`...)
	b = appendInt(b, ch.index)
	b = append(b, `,"text":`...)
	b = ch.text.appendString(b)
	b = append(b, `,"logprobs":`...)
	if ch.logprobs {
		b = append(b, `{"text_offset":`...)
		b = ch.lpOffset.appendArray(b)
		b = append(b, `,"token_logprobs":`...)
		b = ch.lpTokenLogprobs.appendArray(b)
		b = append(b, `,"tokens":`...)
		b = ch.lpTokens.appendArray(b)
		b = append(b, `,"top_logprobs":`...)
		b = ch.lpTopMap.appendArray(b)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = ch.appendFinish(b)
	if ch.tokenIDs.seen {
		b = append(b, `,"token_ids":`...)
		b = ch.tokenIDs.appendArrayOrNull(b)
	}
	b = append(b, `,"prompt_logprobs":null`...)
	if ch.promptTokenIDs.seen {
		b = append(b, `,"prompt_token_ids":`...)
		b = appendOr(b, ch.promptTokenIDs.raw, "null")
	}
	return append(b, '}')
}

func (ch *choiceAcc) appendFinish(b []byte) []byte {
	b = append(b, `,"finish_reason":`...)
	b = appendOr(b, ch.finish, "null")
	b = append(b, `,"stop_reason":`...)
	return appendOr(b, ch.stop, "null")
}

// appendUsage appends vLLM's UsageInfo from the stream's usage object u (nil: null): its
// prompt_tokens, total_tokens, completion_tokens and prompt_tokens_details in that order
// (0, 0, 0 and null when absent, as the usage chunk drops null fields), then any other
// member in the order it came (a newer vLLM's completion_tokens_details).
func appendUsage(b []byte, u []byte) []byte {
	if u == nil {
		return append(b, "null"...)
	}
	known := [...]string{"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
	defaults := [...]string{"0", "0", "0", "null"}
	var vals [len(known)][]byte
	c := cursor{b: u, i: 1}
	for c.next('}') {
		k, v := c.member()
		for i, name := range known {
			if keyIs(k, name) {
				vals[i] = v
			}
		}
	}
	b = append(b, '{')
	for i, name := range known {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
		b = appendOr(b, vals[i], defaults[i])
	}
	c = cursor{b: u, i: 1}
outer:
	for c.next('}') {
		k, v := c.member()
		for _, name := range known {
			if keyIs(k, name) {
				continue outer
			}
		}
		b = append(b, ',')
		b = append(b, k...)
		b = append(b, ':')
		b = append(b, v...)
	}
	return append(b, '}')
}

// merge adds a string delta (raw JSON, nil when absent): its escaped contents, if it is a
// string.
func (t *textAcc) merge(raw []byte) {
	if len(raw) < 2 || raw[0] != '"' {
		return
	}
	t.b = append(t.b, raw[1:len(raw)-1]...)
	t.set = true
}

func (t *textAcc) appendString(b []byte) []byte {
	b = append(b, '"')
	b = append(b, t.b...)
	return append(b, '"')
}

func (t *textAcc) appendStringOrNull(b []byte) []byte {
	if !t.set {
		return append(b, "null"...)
	}
	return t.appendString(b)
}

// merge adds an array (raw JSON, nil when absent): its elements, if it is an array; a
// present key (even null) marks the field seen.
func (a *arrayAcc) merge(raw []byte) {
	if raw == nil {
		return
	}
	a.seen = true
	if raw[0] != '[' {
		return
	}
	a.set = true
	elems := bytes.TrimSpace(raw[1 : len(raw)-1])
	if len(elems) == 0 {
		return
	}
	if len(a.b) > 0 {
		a.b = append(a.b, ',')
	}
	a.b = append(a.b, elems...)
}

func (a *arrayAcc) appendArray(b []byte) []byte {
	b = append(b, '[')
	b = append(b, a.b...)
	return append(b, ']')
}

func (a *arrayAcc) appendArrayOrNull(b []byte) []byte {
	if !a.set {
		return append(b, "null"...)
	}
	return a.appendArray(b)
}

// merge records a present key (raw JSON): seen, and its first non-null value.
func (f *rawField) merge(raw []byte) {
	f.seen = true
	if f.raw == nil && !isNull(raw) {
		f.raw = clone(raw)
	}
}

func (r *reassembler) fail(err error) error {
	r.err = err
	return err
}

func malformedf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errMalformedChunk}, args...)...)
}

// newEngineStreamError builds the error of an error event: data is the whole event, errObj
// the error object (the event itself when flat is true, vLLM's old shape).
func newEngineStreamError(data, errObj []byte, flat bool) *engineStreamError {
	e := &engineStreamError{}
	if flat {
		e.Body = make([]byte, 0, len(data)+10)
		e.Body = append(e.Body, `{"error":`...)
		e.Body = append(append(e.Body, data...), '}')
	} else {
		e.Body = clone(data)
	}
	switch errObj[0] {
	case '"':
		_ = json.Unmarshal(errObj, &e.Message)
	case '{':
		c := cursor{b: errObj, i: 1}
		for c.next('}') {
			k, v := c.member()
			switch {
			case keyIs(k, "message") && v[0] == '"':
				_ = json.Unmarshal(v, &e.Message)
			case keyIs(k, "code"):
				if code, ok := parseIndex(v); ok && code >= 100 && code <= 599 {
					e.Code = code
				}
			}
		}
	}
	return e
}

// searchIndex finds index among n items sorted by their index at(i): its position and
// whether it is there, or where to insert it.
func searchIndex(n, index int, at func(int) int) (int, bool) {
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if at(m) < index {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo, lo < n && at(lo) == index
}

// parseIndex parses a JSON number that is a non-negative integer up to MaxInt32 (an index
// or a status code); nil (absent) is 0.
func parseIndex(raw []byte) (int, bool) {
	if raw == nil {
		return 0, true
	}
	if len(raw) == 0 || len(raw) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > math.MaxInt32 || (len(raw) > 1 && raw[0] == '0') {
		return 0, false
	}
	return n, true
}

func appendInt(b []byte, n int) []byte {
	var d [20]byte
	i := len(d)
	for {
		i--
		d[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return append(b, d[i:]...)
}

// appendOr appends raw, or def when raw is nil.
func appendOr(b, raw []byte, def string) []byte {
	if raw == nil {
		return append(b, def...)
	}
	return append(b, raw...)
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// isNull reports whether raw is absent (nil) or JSON null.
func isNull(raw []byte) bool { return raw == nil || raw[0] == 'n' }

// isKind reports whether raw is absent, null, or a JSON value starting with open ('"', '['
// or '{').
func isKind(raw []byte, open byte) bool { return isNull(raw) || raw[0] == open }

func isNumber(raw []byte) bool { return raw[0] == '-' || ('0' <= raw[0] && raw[0] <= '9') }

func isNumberOrNull(raw []byte) bool { return isNull(raw) || isNumber(raw) }

// keyIs reports whether the quoted object key k is name, after decoding escapes, as Python's
// json reads keys (exactly, unlike encoding/json's case-insensitive matching).
func keyIs(k []byte, name string) bool {
	in := k[1 : len(k)-1]
	if bytes.IndexByte(in, '\\') < 0 {
		return string(in) == name
	}
	var s string
	return json.Unmarshal(k, &s) == nil && s == name
}

// cursor walks JSON that json.Valid accepted: it never checks syntax, and every index it
// reaches is inside b.
type cursor struct {
	b []byte
	i int
}

func (c *cursor) ws() {
	for c.i < len(c.b) {
		switch c.b[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// next moves to the next member of the object or array whose opening byte is behind c.i,
// past the comma before it, and reports whether there is one; at the closing byte close it
// moves past it and returns false.
func (c *cursor) next(close byte) bool {
	c.ws()
	if c.b[c.i] == ',' {
		c.i++
		c.ws()
	}
	if c.b[c.i] == close {
		c.i++
		return false
	}
	return true
}

// member reads an object member: its quoted key and its raw value.
func (c *cursor) member() (key, value []byte) {
	start := c.i
	c.skipString()
	key = c.b[start:c.i]
	c.ws()
	c.i++ // ':'
	return key, c.value()
}

// value reads one value and returns its bytes.
func (c *cursor) value() []byte {
	c.ws()
	start := c.i
	switch c.b[c.i] {
	case '"':
		c.skipString()
	case '{', '[':
		c.skipNested()
	default: // a number or a literal
		for c.i < len(c.b) {
			switch c.b[c.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return c.b[start:c.i]
			}
			c.i++
		}
	}
	return c.b[start:c.i]
}

// skipString moves past the string whose opening quote is at c.i: to the first quote not
// escaped, that is not preceded by an odd run of backslashes.
func (c *cursor) skipString() {
	c.i++
	for {
		c.i += bytes.IndexByte(c.b[c.i:], '"')
		k := c.i
		for c.b[k-1] == '\\' {
			k--
		}
		c.i++
		if (c.i-1-k)%2 == 0 {
			return
		}
	}
}

// skipNested moves past the object or array whose opening byte is at c.i.
func (c *cursor) skipNested() {
	depth := 0
	for {
		for !structural[c.b[c.i]] {
			c.i++
		}
		switch c.b[c.i] {
		case '"':
			c.skipString()
			continue
		case '{', '[':
			depth++
		default: // '}', ']'
			depth--
			if depth == 0 {
				c.i++
				return
			}
		}
		c.i++
	}
}

// structural marks the bytes skipNested stops at: quotes and brackets.
var structural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}
