package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Limits on what one stream may open: a choice or tool call is found by a
// search of a sorted slice and inserted in place, so a hostile engine could
// make that quadratic; with these caps it is at most 128² steps per choice.
// vLLM's n and its tool calls per message are far below.
const (
	maxReassembleChoices   = 128
	maxReassembleToolCalls = 128
)

// ErrMalformedChunk is wrapped by the error [Reassembler.Add] returns for an
// event whose data is not a JSON object, or whose known fields have the
// wrong JSON types.
var ErrMalformedChunk = errors.New("malformed stream chunk")

// StreamError is an engine's in-band stream error, as [Reassembler.Add]
// returns it: an event whose data is an error object, which vLLM sends
// (followed by [DONE]) when generation fails after it answered 200, as
// {"error":{"message","type","param","code"}} (vLLM before 0.10 sent the
// flat {"object":"error","message",...}). A gateway answers the
// non-streaming client with an error carrying Message, and Code as the
// status when it is one.
type StreamError struct {
	// Body is the error as a JSON object {"error":{...}}: a copy of the
	// event's data, or a flat legacy error wrapped under "error".
	Body []byte
	// Message is error.message (decoded), "" when it is not a string; for
	// {"error":"text"}, the text.
	Message string
	// Code is error.code when it is an HTTP status (an integer in
	// 100..599), else 0.
	Code int
}

// Error implements error: "engine stream error: " and the message.
func (e *StreamError) Error() string {
	if e.Message == "" {
		return "engine stream error"
	}
	return "engine stream error: " + e.Message
}

// Reassembler merges the data of a chat or completions stream's events, in
// order, into the non-streaming body of the same generation: the chunks
// streamed with "stream":true and "stream_options":{"include_usage":true}
// become the JSON body vLLM would have answered without "stream", so a
// gateway can stream a non-streaming request from the engine (and see its
// first token and its progress) and still answer the client as the engine
// would have.
//
// The body is vLLM's (0.10.1's vllm/entrypoints/openai/protocol.py, and the
// later releases whose reasoning field is still reasoning_content), as its
// OpenAI server writes a non-stream response: pydantic's model_dump of
// ChatCompletionResponse or CompletionResponse, compact, every field
// present in the models' order, null where unset, choices by index:
//
//	chat:        {"id","object":"chat.completion","created","model",
//	             "choices":[{"index","message":{"role","content","refusal",
//	             "annotations","audio","function_call","tool_calls",
//	             "reasoning_content"},"logprobs","finish_reason",
//	             "stop_reason"}],"service_tier","system_fingerprint",
//	             "usage","prompt_logprobs","kv_transfer_params"}
//	completions: {"id","object":"text_completion","created","model",
//	             "choices":[{"index","text","logprobs","finish_reason",
//	             "stop_reason","prompt_logprobs"}],"service_tier",
//	             "system_fingerprint","usage","kv_transfer_params"}
//
// Fields that exist in both the stream and the body follow what the stream
// carried: later releases' "token_ids" (per choice) and "prompt_token_ids"
// (top level for chat, per choice for completions) appear when the chunks
// carried them, even as null, and a newer vLLM's "reasoning" delta becomes
// the message's "reasoning" (before "reasoning_content"). Values are copied
// from the chunks byte for byte (strings keep the engine's escapes, numbers
// their spelling); text is the concatenation of the deltas' escaped
// contents, so a string split anywhere, even inside a surrogate pair, is
// rebuilt whole. id, created and model come from the first chunk carrying
// each, system_fingerprint, service_tier and usage from the last non-null.
//
// What a stream cannot carry is vLLM's default: prompt_logprobs and
// kv_transfer_params are null, refusal null unless refusal deltas came,
// annotations, audio and function_call null. A message's content is null
// when no content delta came, or when the content is empty and the output
// had reasoning or tool calls (vLLM's reasoning and tool parsers return no
// content then; its role chunk's "" does not count).
//
// Memory grows with what arrives: a Reassembler keeps the merged text,
// tool calls, logprobs and token ids of each choice (copies of the events'
// escaped bytes), the first id, created and model, and the last usage; an
// event that adds nothing adds nothing. At most 128 choices and 128 tool
// calls per choice are accepted.
//
// The zero value is ready for a chat stream; [Reassembler.Reset] or
// [NewReassembler] choose the kind. A Reassembler is not safe for
// concurrent use; use one per stream.
type Reassembler struct {
	completions bool
	err         error // the first error Add returned; Add returns it again

	id, created, model []byte // raw JSON values, from the first chunk carrying each
	fingerprint        []byte // system_fingerprint, the last non-null
	serviceTier        []byte // service_tier, the last non-null
	usage              []byte // the last non-null usage object
	promptTokenIDs     rawField
	choices            []choiceAcc // sorted by index
	last               int         // position in choices of the choice merged last
}

// rawField is a field copied whole: its first non-null value, and whether
// any chunk carried the key (even as null).
type rawField struct {
	raw  []byte
	seen bool
}

// textAcc accumulates a string field's deltas: b is the concatenation of
// their escaped contents (between the quotes); set is whether any non-null
// delta came.
type textAcc struct {
	b   []byte
	set bool
}

// arrayAcc accumulates arrays: b holds their elements joined by commas
// (without brackets); set is whether any non-null array came; seen whether
// any chunk carried the key.
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

// Held returns the bytes of event data the Reassembler keeps (the merged
// texts, arrays and raw values; not its fixed-size bookkeeping): about
// what the body rebuilt from them will take, whatever the events' own
// framing cost (a chat chunk carries ~200 bytes around each token's few).
func (r *Reassembler) Held() int {
	n := len(r.id) + len(r.created) + len(r.model) + len(r.fingerprint) + len(r.serviceTier) + len(r.usage) + len(r.promptTokenIDs.raw)
	for i := range r.choices {
		c := &r.choices[i]
		n += len(c.role) + len(c.content.b) + len(c.reasoningContent.b) + len(c.reasoning.b) + len(c.ref.b) +
			len(c.lpContent.b) + len(c.text.b) + len(c.lpOffset.b) + len(c.lpTokenLogprobs.b) + len(c.lpTokens.b) +
			len(c.lpTopMap.b) + len(c.promptTokenIDs.raw) + len(c.finish) + len(c.stop) + len(c.tokenIDs.b)
		for j := range c.tools {
			t := &c.tools[j]
			n += len(t.id) + len(t.typ) + len(t.name.b) + len(t.args.b)
		}
	}
	return n
}

// SetModel sets the "model" of the body (raw, a JSON string) whatever the
// chunks say: the model that finished the answer, when another one began
// it.
func (r *Reassembler) SetModel(raw []byte) { r.model = clone(raw) }

// NewReassembler returns a Reassembler for a chat stream, or a completions
// stream when completions is true.
func NewReassembler(completions bool) *Reassembler {
	return &Reassembler{completions: completions}
}

// Reset empties r for a new stream, a completions stream when completions
// is true and a chat stream otherwise, and clears the error Add keeps; it
// keeps the capacity of the choices' slice, not what they held.
func (r *Reassembler) Reset(completions bool) {
	clear(r.choices) // drop the old choices' buffers
	*r = Reassembler{completions: completions, choices: r.choices[:0]}
}

// Add merges one event's data: the payload of a data event without the
// "data: " prefix (multi-line data joined with "\n"), which is only read
// during the call. Empty data and "[DONE]" (surrounding white space
// ignored) are ignored.
//
// Errors: an error object (a non-null top-level "error", or
// "object":"error") is reported as a *[StreamError]; data that is not a
// JSON object, or whose known fields have the wrong types (choices not an
// array, a choice index that is not an integer in 0..2³¹-1, a delta's
// content not a string, ...), or that opens more than 128 choices or tool
// calls, as an error wrapping [ErrMalformedChunk]. Data that is not valid
// JSON or not an object merges nothing and leaves r as it was, so a caller
// may count it and go on (the event's content is lost, though); after any
// other error r keeps what it had merged (possibly part of the failing
// chunk), and Add returns the same error again until Reset.
//
// Keys match exactly, after decoding escapes, and the last of duplicate
// keys wins, as in the rest of this package.
func (r *Reassembler) Add(data []byte) error {
	if r.err != nil {
		return r.err
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || string(data) == "[DONE]" {
		return nil
	}
	var f struct {
		id, object, created, model, choices, usage, fingerprint, serviceTier, promptTokenIDs, errObj []byte
		hasPromptTokenIDs                                                                            bool
	}
	// One validating pass over the whole event before anything is merged,
	// so these two errors leave r usable.
	d, err := openObject(data)
	if err != nil {
		return err
	}
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "id":
			f.id = d.value()
		case "object":
			f.object = d.value()
		case "created":
			f.created = d.value()
		case "model":
			f.model = d.value()
		case "choices":
			f.choices = d.value()
		case "usage":
			f.usage = d.value()
		case "system_fingerprint":
			f.fingerprint = d.value()
		case "service_tier":
			f.serviceTier = d.value()
		case "prompt_token_ids":
			f.promptTokenIDs, f.hasPromptTokenIDs = d.value(), true
		case "error":
			f.errObj = d.value()
		default:
			d.skip()
		}
	}
	d.end()
	if d.bad {
		return malformedf("not valid JSON")
	}
	if !isNull(f.errObj) {
		return r.fail(newStreamError(data, f.errObj, false))
	}
	if string(f.object) == `"error"` {
		return r.fail(newStreamError(data, data, true))
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
	d = decoder{b: f.choices}
	d.open('[')
	for n := 0; d.more(']', &n); {
		if err := r.addChoice(d.value()); err != nil {
			return r.fail(err)
		}
	}
	return nil
}

// addChoice merges one element of a chunk's choices (valid JSON).
func (r *Reassembler) addChoice(v []byte) error {
	if v[0] != '{' {
		return malformedf("a choice is not an object")
	}
	var f struct {
		index, delta, text, logprobs, finish, stop, tokenIDs, promptTokenIDs []byte
		hasTokenIDs, hasPromptTokenIDs                                       bool
	}
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "index":
			f.index = d.value()
		case "delta":
			f.delta = d.value()
		case "text":
			f.text = d.value()
		case "logprobs":
			f.logprobs = d.value()
		case "finish_reason":
			f.finish = d.value()
		case "stop_reason":
			f.stop = d.value()
		case "token_ids":
			f.tokenIDs, f.hasTokenIDs = d.value(), true
		case "prompt_token_ids":
			f.promptTokenIDs, f.hasPromptTokenIDs = d.value(), true
		default:
			d.skip()
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
	} else if !isNull(f.delta) {
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

// choice returns the choice of the given index, added (in index order) if
// it is new.
func (r *Reassembler) choice(index int) (*choiceAcc, error) {
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

// addDelta merges a chat delta object (valid JSON).
func (ch *choiceAcc) addDelta(v []byte) error {
	var f struct{ role, content, reasoningContent, reasoning, refusal, tools []byte }
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "role":
			f.role = d.value()
		case "content":
			f.content = d.value()
		case "reasoning_content":
			f.reasoningContent = d.value()
		case "reasoning":
			f.reasoning = d.value()
		case "refusal":
			f.refusal = d.value()
		case "tool_calls":
			f.tools = d.value()
		default:
			d.skip()
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
	d = decoder{b: f.tools}
	d.open('[')
	for n := 0; d.more(']', &n); {
		if err := ch.addToolCall(d.value()); err != nil {
			return err
		}
	}
	return nil
}

// addToolCall merges one tool call delta (valid JSON): its id and type are
// the first non-null ones, its name and arguments the concatenation of
// every delta's (the name normally comes whole in the first delta, the
// arguments in fragments), by the delta's index (0 when it has none).
func (ch *choiceAcc) addToolCall(v []byte) error {
	if v[0] != '{' {
		return malformedf("a tool call is not an object")
	}
	var f struct{ index, id, typ, function, name, args []byte }
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "index":
			f.index = d.value()
		case "id":
			f.id = d.value()
		case "type":
			f.typ = d.value()
		case "function":
			f.function = d.value()
		default:
			d.skip()
		}
	}
	if !isKind(f.id, '"') || !isKind(f.typ, '"') || !isKind(f.function, '{') {
		return malformedf("a tool call field of the wrong type")
	}
	index, ok := parseIndex(f.index)
	if !ok {
		return malformedf("a tool call index is not a non-negative integer")
	}
	if !isNull(f.function) {
		d = decoder{b: f.function}
		d.open('{')
		for n := 0; d.more('}', &n); {
			switch string(d.key()) {
			case "name":
				f.name = d.value()
			case "arguments":
				f.args = d.value()
			default:
				d.skip()
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

// addLogprobs merges a non-null logprobs value (valid JSON): chat's
// {"content":[...]} or completions' {"text_offset","token_logprobs",
// "tokens","top_logprobs"}, whose arrays are concatenated (vLLM's streamed
// text_offset is already relative to the whole text).
func (ch *choiceAcc) addLogprobs(v []byte, completions bool) error {
	if v[0] != '{' {
		return malformedf("logprobs is not an object")
	}
	ch.logprobs = true
	var f struct{ content, offset, tokenLogprobs, tokens, top []byte }
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "content":
			f.content = d.value()
		case "text_offset":
			f.offset = d.value()
		case "token_logprobs":
			f.tokenLogprobs = d.value()
		case "tokens":
			f.tokens = d.value()
		case "top_logprobs":
			f.top = d.value()
		default:
			d.skip()
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

// Finished reports whether at least one choice arrived and every choice has
// its finish_reason: a stream cut short (the engine died, or closed the
// connection early) leaves one without.
func (r *Reassembler) Finished() bool {
	for i := range r.choices {
		if r.choices[i].finish == nil {
			return false
		}
	}
	return len(r.choices) > 0
}

// Body returns the non-streaming JSON body of what was merged so far, as
// vLLM would have written it for the same generation (see [Reassembler]
// for the shape). Without a usage chunk usage is null; without choices
// "choices" is empty. It may be called at any time, also after Add failed
// (the body is then valid JSON of what was merged), and returns a new
// slice each call.
func (r *Reassembler) Body() []byte {
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

// size is an upper bound of the bytes ch adds to a body, beyond the fixed
// keys.
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

// appendChat appends the chat choice, vLLM's ChatCompletionResponseChoice.
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

// appendCompletion appends the completions choice, vLLM's
// CompletionResponseChoice.
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

// usageKeys are the members of vLLM's UsageInfo in its order, and
// usageDefaults their values when the stream's usage lacks them (the usage
// chunk drops null fields).
var (
	usageKeys     = [...]string{"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
	usageDefaults = [...]string{"0", "0", "0", "null"}
)

// appendUsage appends vLLM's UsageInfo from the stream's usage object u
// (valid JSON; nil: null): its prompt_tokens, total_tokens,
// completion_tokens and prompt_tokens_details in that order (the last of
// duplicates), then every other member as written, in the order it came (a
// newer vLLM's completion_tokens_details).
func appendUsage(b []byte, u []byte) []byte {
	if u == nil {
		return append(b, "null"...)
	}
	var vals [len(usageKeys)][]byte
	d := decoder{b: u}
	d.open('{')
	for n := 0; d.more('}', &n); {
		if i := usageKey(d.key()); i >= 0 {
			vals[i] = d.value()
		} else {
			d.skip()
		}
	}
	b = append(b, '{')
	for i, name := range usageKeys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
		b = appendOr(b, vals[i], usageDefaults[i])
	}
	d = decoder{b: u}
	d.open('{')
	for n := 0; d.more('}', &n); {
		d.peek()
		start := d.i // the key's opening quote
		name := d.key()
		if usageKey(name) >= 0 {
			d.skip()
			continue
		}
		end := d.i - 1 // the ':', after the key's closing quote and any white space
		for d.b[end-1] != '"' {
			end--
		}
		b = append(b, ',')
		b = append(b, d.b[start:end]...)
		b = append(b, ':')
		b = append(b, d.value()...)
	}
	return append(b, '}')
}

// usageKey returns the position of name in usageKeys, or -1.
func usageKey(name []byte) int {
	for i, k := range usageKeys {
		if string(name) == k {
			return i
		}
	}
	return -1
}

// merge adds a string delta (raw JSON, nil when absent): its escaped
// contents, if it is a string.
func (t *textAcc) merge(raw []byte) {
	if len(raw) < 2 || raw[0] != '"' {
		return
	}
	t.b = append(t.b, raw[1:len(raw)-1]...)
	t.set = true
}

func (t *textAcc) appendString(b []byte) []byte { return wrapped(b, '"', t.b, '"') }

func (t *textAcc) appendStringOrNull(b []byte) []byte { return orNull(b, t.set, '"', t.b, '"') }

// wrapped appends body between open and close (a JSON string's escaped
// contents, or an array's elements).
func wrapped(b []byte, open byte, body []byte, close byte) []byte {
	b = append(b, open)
	b = append(b, body...)
	return append(b, close)
}

// orNull appends wrapped(open, body, close) when set, null otherwise.
func orNull(b []byte, set bool, open byte, body []byte, close byte) []byte {
	if !set {
		return append(b, "null"...)
	}
	return wrapped(b, open, body, close)
}

// merge adds an array (raw JSON, nil when absent): its elements, if it is
// an array; a present key (even null) marks the field seen.
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

func (a *arrayAcc) appendArray(b []byte) []byte { return wrapped(b, '[', a.b, ']') }

func (a *arrayAcc) appendArrayOrNull(b []byte) []byte { return orNull(b, a.set, '[', a.b, ']') }

// merge records a present key (raw JSON): seen, and its first non-null
// value.
func (f *rawField) merge(raw []byte) {
	f.seen = true
	if f.raw == nil && !isNull(raw) {
		f.raw = clone(raw)
	}
}

func (r *Reassembler) fail(err error) error {
	r.err = err
	return err
}

func malformedf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformedChunk}, args...)...)
}

// newStreamError builds the error of an error event: data is the whole
// event, errObj the error value (valid JSON; the event itself when flat is
// true, vLLM's old shape).
func newStreamError(data, errObj []byte, flat bool) *StreamError {
	e := &StreamError{}
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
		d := decoder{b: errObj}
		d.open('{')
		for n := 0; d.more('}', &n); {
			switch string(d.key()) {
			case "message":
				if v := d.value(); v[0] == '"' {
					_ = json.Unmarshal(v, &e.Message)
				}
			case "code":
				if code, ok := parseIndex(d.value()); ok && code >= 100 && code <= 599 {
					e.Code = code
				}
			default:
				d.skip()
			}
		}
	}
	return e
}

// searchIndex finds index among n items sorted by their index at(i): its
// position and whether it is there, or where to insert it.
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

// parseIndex parses the raw text of a JSON value that is a non-negative
// integer up to MaxInt32 (an index or a status code); nil (absent) is 0.
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

// isNull reports whether the raw JSON value is absent (nil) or null.
func isNull(raw []byte) bool { return raw == nil || raw[0] == 'n' }

// isKind reports whether the raw JSON value is absent, null, or starts with
// open ('"', '[' or '{').
func isKind(raw []byte, open byte) bool { return isNull(raw) || raw[0] == open }

// isNumber reports whether the raw JSON value (not nil) is a number.
func isNumber(raw []byte) bool { return raw[0] == '-' || isDigit(raw[0]) }

func isNumberOrNull(raw []byte) bool { return isNull(raw) || isNumber(raw) }
