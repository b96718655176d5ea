package oai

import (
	"bytes"
	"encoding/json"
)

// maxMessagesBlocks caps the content blocks one Messages stream may open
// (a block is found by a search of a sorted slice and inserted in place,
// as [Reassembler]'s choices are). vLLM opens one thinking block, one text
// block and one block per tool call.
const maxMessagesBlocks = 128

// MessagesReassembler merges the data of an Anthropic Messages stream's
// events, in order, into the non-streaming body of the same generation:
// the events vLLM's /v1/messages sends with "stream": true become the body
// it answers without it, so a gateway can stream a non-streaming Messages
// request from the engine (and see its first token and its progress) and
// still answer the client as the engine would have.
//
// The body is vLLM's (vllm/entrypoints/anthropic/protocol.py
// AnthropicMessagesResponse, written by api_router.py create_messages as
// model_dump(exclude_none=True), compact): members in the model's order,
// and those that are null left out:
//
//	{"id","type":"message","role":"assistant","content":[...],"model",
//	 "stop_reason","stop_sequence","usage":{"input_tokens",
//	 "output_tokens","cache_creation_input_tokens",
//	 "cache_read_input_tokens"}}
//
// Its content blocks are AnthropicContentBlock's, also without nulls, in
// the order of their stream index (vLLM's serving.py
// messages_full_converter puts thinking, then text, then the tool calls,
// which is the order its message_stream_converter opens them in):
//
//	{"type":"thinking","thinking","signature"}
//	{"type":"redacted_thinking","data"}
//	{"type":"text","text"}
//	{"type":"tool_use","id","name","input"}
//
// Where the values come from:
//
//   - id and model: message_start's message (the first non-null; the
//     model SetModel names instead, when it is called);
//   - content: each content_block_start opens a block at its index with
//     its type (and, for tool_use, id, name and input); the
//     content_block_delta events of that index add to it: text_delta's
//     text, thinking_delta's thinking, signature_delta's signature,
//     input_json_delta's partial_json. A text or thinking block whose
//     text is empty is left out, as vLLM's non-streaming converter leaves
//     out empty content and reasoning. A tool_use block's input is its
//     partial_json fragments joined, which must make a JSON object (vLLM's
//     json.loads of the tool call's arguments; checked at its
//     content_block_stop), written compact (white space outside strings
//     removed; strings and numbers keep the engine's spelling, where
//     Python's json.dumps would re-encode them); without fragments, the
//     content_block_start's input ({} in vLLM's stream);
//   - stop_reason and stop_sequence: message_delta's delta (the last
//     non-null), else message_start's message; vLLM's stream and body map
//     the same finish reasons (stop: end_turn, length: max_tokens,
//     tool_calls: tool_use), so null (an abort, for one) is left out in
//     both;
//   - usage: input_tokens, output_tokens and the cache token counts from
//     the last event that carries each: message_start's message.usage,
//     then message_delta's usage (vLLM sends prompt and completion tokens
//     there; Anthropic's API only output_tokens). input_tokens and
//     output_tokens are 0 when no event carried them.
//
// Text values are copied byte for byte (strings keep the engine's escapes);
// a string split across deltas anywhere, even inside a surrogate pair, is
// rebuilt whole. ping and event types this reassembler does not know are
// ignored, as Anthropic asks of clients.
//
// Memory grows with what arrives: a MessagesReassembler keeps each block's
// text (copies of the events' escaped bytes), the id, model, stop reason
// and usage values; an event that adds nothing adds nothing. At most 128
// content blocks are accepted.
//
// The zero value is ready to use; [MessagesReassembler.Reset] empties it
// for another stream. A MessagesReassembler is not safe for concurrent
// use; use one per stream.
type MessagesReassembler struct {
	err error // the first error Add returned; Add returns it again

	started, delta, stopped bool // message_start, message_delta and message_stop seen

	id, model                []byte // raw JSON strings, the first non-null
	stopReason, stopSequence []byte // raw JSON strings, the last non-null
	// usage's values (raw JSON numbers), the last non-null of each.
	inTokens, outTokens, cacheCreation, cacheRead []byte
	blocks                                        []messagesBlock // sorted by index
	last                                          int             // position in blocks of the block merged last
}

// messagesBlock is one content block being reassembled.
type messagesBlock struct {
	index int
	typ   []byte // the raw type string, quotes included
	// text, thinking and signature (thinking blocks), data
	// (redacted_thinking) and partial (tool_use's partial_json): the
	// concatenation of their escaped contents.
	text, thinking, signature, data, partial textAcc
	id, name                                 []byte // tool_use: raw strings
	// input is tool_use's input: content_block_start's (a raw object), or,
	// once the block stopped, its partial_json joined and compacted.
	input []byte
}

// Held returns the bytes of event data the MessagesReassembler keeps (the
// blocks' texts and raw values, the message's members; not its
// fixed-size bookkeeping): about what the body rebuilt from them takes.
func (r *MessagesReassembler) Held() int {
	n := len(r.id) + len(r.model) + len(r.stopReason) + len(r.stopSequence) + len(r.inTokens) + len(r.outTokens) + len(r.cacheCreation) + len(r.cacheRead)
	for i := range r.blocks {
		b := &r.blocks[i]
		n += len(b.typ) + len(b.text.b) + len(b.thinking.b) + len(b.signature.b) + len(b.data.b) + len(b.partial.b) + len(b.id) + len(b.name) + len(b.input)
	}
	return n
}

// SetModel makes the body name raw (a JSON string) as its "model", whatever
// message_start said: the model that finished the answer, when another one
// began it (a gateway's continuation on a fallback model).
func (r *MessagesReassembler) SetModel(raw []byte) { r.model = append(r.model[:0], raw...) }

// Reset empties r for a new stream and clears the error Add keeps; it keeps
// the capacity of the blocks' slice, not what they held.
func (r *MessagesReassembler) Reset() {
	clear(r.blocks)
	*r = MessagesReassembler{blocks: r.blocks[:0]}
}

// Add merges one event's data: the payload of a data event without the
// "data: " prefix (multi-line data joined with "\n"), which is only read
// during the call. Empty data is ignored. The SSE "event:" line is not
// needed: the data's "type" names the event.
//
// Errors: an error event (type "error", or a non-null top-level "error"
// member, as vLLM's OpenAI-shaped in-stream error) is reported as a
// *[StreamError] whose Code is the HTTP status of its error: error.code
// when that is a status, else the status Anthropic's API documents for
// error.type (https://docs.anthropic.com/en/api/errors:
// invalid_request_error 400, authentication_error 401, billing_error 402,
// permission_error 403, not_found_error 404, request_too_large 413,
// rate_limit_error 429, api_error 500, timeout_error 504,
// overloaded_error 529) or for the type names vLLM's api_router.py
// translate_error_response passes on (BadRequestError 400,
// NotFoundError 404, InternalServerError and internal_error 500), else 0.
// Data that is not a JSON object, or whose known fields have the wrong
// JSON types (an index that is not an integer in 0..2³¹-1, a delta's text
// not a string, ...), a delta for a block that was not started, a
// tool_use input that is not a JSON object, or more than 128 blocks, is an
// error wrapping [ErrMalformedChunk]. Data that is not valid JSON or not
// an object merges nothing and leaves r as it was; after any other error r
// keeps what it had merged, and Add returns the same error again until
// Reset.
//
// Keys match exactly, after decoding escapes, and the last of duplicate
// keys wins, as in the rest of this package.
func (r *MessagesReassembler) Add(data []byte) error {
	if r.err != nil {
		return r.err
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil
	}
	var f struct{ typ, message, index, block, delta, usage, errObj []byte }
	d, err := openObject(data)
	if err != nil {
		return err
	}
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "type":
			f.typ = d.value()
		case "message":
			f.message = d.value()
		case "index":
			f.index = d.value()
		case "content_block":
			f.block = d.value()
		case "delta":
			f.delta = d.value()
		case "usage":
			f.usage = d.value()
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
	if !isKind(f.typ, '"') {
		return r.fail(malformedf("type is not a string"))
	}
	var typ []byte // the type's name, decoded
	if len(f.typ) > 0 && f.typ[0] == '"' {
		if typ = f.typ[1 : len(f.typ)-1]; bytes.IndexByte(typ, '\\') >= 0 {
			typ = []byte(unescape(f.typ)) // engines write plain names: no allocation for them
		}
	}
	if string(typ) == "error" || !isNull(f.errObj) {
		return r.fail(newMessagesError(data, f.errObj))
	}
	switch string(typ) {
	case "message_start":
		return r.fail(r.addMessage(f.message))
	case "content_block_start":
		return r.fail(r.addBlockStart(f.index, f.block))
	case "content_block_delta":
		return r.fail(r.addBlockDelta(f.index, f.delta))
	case "content_block_stop":
		return r.fail(r.addBlockStop(f.index))
	case "message_delta":
		return r.fail(r.addMessageDelta(f.delta, f.usage))
	case "message_stop":
		r.stopped = true
	}
	return nil
}

// addMessage merges message_start's message (valid JSON).
func (r *MessagesReassembler) addMessage(v []byte) error {
	if !isKind(v, '{') {
		return malformedf("message is not an object")
	}
	r.started = true
	if isNull(v) {
		return nil
	}
	var f struct{ id, model, stop, seq, usage []byte }
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "id":
			f.id = d.value()
		case "model":
			f.model = d.value()
		case "stop_reason":
			f.stop = d.value()
		case "stop_sequence":
			f.seq = d.value()
		case "usage":
			f.usage = d.value()
		default:
			d.skip()
		}
	}
	if !isKind(f.id, '"') || !isKind(f.model, '"') || !isKind(f.stop, '"') || !isKind(f.seq, '"') {
		return malformedf("a message field of the wrong type")
	}
	if r.id == nil && !isNull(f.id) {
		r.id = clone(f.id)
	}
	if r.model == nil && !isNull(f.model) {
		r.model = clone(f.model) // unless SetModel named one
	}
	r.setStop(f.stop, f.seq)
	return r.addUsage(f.usage)
}

// addMessageDelta merges message_delta's delta and usage (valid JSON).
func (r *MessagesReassembler) addMessageDelta(delta, usage []byte) error {
	if !isKind(delta, '{') {
		return malformedf("delta is not an object")
	}
	r.delta = true
	if !isNull(delta) {
		var stop, seq []byte
		d := decoder{b: delta}
		d.open('{')
		for n := 0; d.more('}', &n); {
			switch string(d.key()) {
			case "stop_reason":
				stop = d.value()
			case "stop_sequence":
				seq = d.value()
			default:
				d.skip()
			}
		}
		if !isKind(stop, '"') || !isKind(seq, '"') {
			return malformedf("stop_reason or stop_sequence is not a string")
		}
		r.setStop(stop, seq)
	}
	return r.addUsage(usage)
}

// setStop keeps a non-null stop reason and stop sequence (raw strings).
func (r *MessagesReassembler) setStop(stop, seq []byte) {
	if !isNull(stop) {
		r.stopReason = append(r.stopReason[:0], stop...)
	}
	if !isNull(seq) {
		r.stopSequence = append(r.stopSequence[:0], seq...)
	}
}

// addUsage merges a usage value (valid JSON, nil when absent): each count
// it carries replaces the one kept.
func (r *MessagesReassembler) addUsage(v []byte) error {
	if isNull(v) {
		return nil
	}
	if v[0] != '{' {
		return malformedf("usage is not an object")
	}
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		var dst *[]byte
		switch string(d.key()) {
		case "input_tokens":
			dst = &r.inTokens
		case "output_tokens":
			dst = &r.outTokens
		case "cache_creation_input_tokens":
			dst = &r.cacheCreation
		case "cache_read_input_tokens":
			dst = &r.cacheRead
		default:
			d.skip()
			continue
		}
		switch val := d.value(); {
		case isNull(val):
		case !isNumber(val):
			return malformedf("a usage count is not a number")
		default:
			*dst = append((*dst)[:0], val...)
		}
	}
	return nil
}

// addBlockStart opens the block of content_block_start (valid JSON).
func (r *MessagesReassembler) addBlockStart(index, v []byte) error {
	if len(v) == 0 || v[0] != '{' {
		return malformedf("content_block is not an object")
	}
	var f struct{ typ, text, thinking, signature, data, id, name, input []byte }
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "type":
			f.typ = d.value()
		case "text":
			f.text = d.value()
		case "thinking":
			f.thinking = d.value()
		case "signature":
			f.signature = d.value()
		case "data":
			f.data = d.value()
		case "id":
			f.id = d.value()
		case "name":
			f.name = d.value()
		case "input":
			f.input = d.value()
		default:
			d.skip()
		}
	}
	switch {
	case len(f.typ) == 0 || f.typ[0] != '"':
		return malformedf("a content block's type is not a string")
	case !isKind(f.text, '"'), !isKind(f.thinking, '"'), !isKind(f.signature, '"'), !isKind(f.data, '"'),
		!isKind(f.id, '"'), !isKind(f.name, '"'), !isKind(f.input, '{'):
		return malformedf("a content block field of the wrong type")
	}
	b, err := r.block(index, true)
	if err != nil {
		return err
	}
	if b.typ == nil {
		b.typ = clone(f.typ)
	}
	b.text.merge(f.text)
	b.thinking.merge(f.thinking)
	b.signature.merge(f.signature)
	b.data.merge(f.data)
	if b.id == nil && !isNull(f.id) {
		b.id = clone(f.id)
	}
	if b.name == nil && !isNull(f.name) {
		b.name = clone(f.name)
	}
	if b.input == nil && !isNull(f.input) {
		b.input = compactJSON(nil, f.input)
	}
	return nil
}

// addBlockDelta merges content_block_delta's delta (valid JSON) into its
// block.
func (r *MessagesReassembler) addBlockDelta(index, v []byte) error {
	if len(v) == 0 || v[0] != '{' {
		return malformedf("delta is not an object")
	}
	var f struct{ text, thinking, signature, partial []byte }
	d := decoder{b: v}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "text":
			f.text = d.value()
		case "thinking":
			f.thinking = d.value()
		case "signature":
			f.signature = d.value()
		case "partial_json":
			f.partial = d.value()
		default:
			d.skip()
		}
	}
	if !isKind(f.text, '"') || !isKind(f.thinking, '"') || !isKind(f.signature, '"') || !isKind(f.partial, '"') {
		return malformedf("a delta field of the wrong type")
	}
	b, err := r.block(index, false)
	if err != nil {
		return err
	}
	b.text.merge(f.text)
	b.thinking.merge(f.thinking)
	b.signature.merge(f.signature)
	b.partial.merge(f.partial)
	return nil
}

// addBlockStop ends a block: a tool_use block's partial_json fragments
// become its input.
func (r *MessagesReassembler) addBlockStop(index []byte) error {
	b, err := r.block(index, false)
	if err != nil {
		return err
	}
	if !b.partial.set || string(b.typ) != `"tool_use"` {
		return nil
	}
	// The fragments are a JSON string's escaped contents: decoded, they
	// are the input's JSON text.
	var s string
	if err := json.Unmarshal(wrapped(nil, '"', b.partial.b, '"'), &s); err != nil {
		return malformedf("partial_json is not a string")
	}
	in := []byte(s)
	d := decoder{b: in}
	if d.peek() != '{' {
		return malformedf("a tool_use input is not a JSON object")
	}
	d.skip()
	d.end()
	if d.bad {
		return malformedf("a tool_use input is not a JSON object")
	}
	b.input = compactJSON(b.input[:0], in)
	b.partial = textAcc{} // merged into input
	return nil
}

// block returns the block of the given raw index (nil: 0); start says
// whether it may be added (content_block_start), in index order.
func (r *MessagesReassembler) block(raw []byte, start bool) (*messagesBlock, error) {
	index, ok := parseIndex(raw)
	if !ok {
		return nil, malformedf("a content block index is not a non-negative integer")
	}
	if r.last < len(r.blocks) && r.blocks[r.last].index == index {
		return &r.blocks[r.last], nil
	}
	i, found := searchIndex(len(r.blocks), index, func(i int) int { return r.blocks[i].index })
	if !found {
		switch {
		case !start:
			return nil, malformedf("an event for content block %d, which was not started", index)
		case len(r.blocks) >= maxMessagesBlocks:
			return nil, malformedf("more than %d content blocks", maxMessagesBlocks)
		}
		r.blocks = append(r.blocks, messagesBlock{})
		copy(r.blocks[i+1:], r.blocks[i:])
		r.blocks[i] = messagesBlock{index: index}
	}
	r.last = i
	return &r.blocks[i], nil
}

// Finished reports whether the message is whole: message_start,
// message_delta and message_stop arrived. A stream cut short (the engine
// died, or closed the connection early) lacks one.
func (r *MessagesReassembler) Finished() bool { return r.started && r.delta && r.stopped }

// Body returns the non-streaming JSON body of what was merged so far, as
// vLLM would have written it for the same generation (see
// [MessagesReassembler] for the shape). It may be called at any time, also
// after Add failed (the body is then valid JSON of what was merged: a
// tool_use block not stopped has its start's input, or {}), and returns a
// new slice each call.
func (r *MessagesReassembler) Body() []byte {
	n := 192 + len(r.id) + len(r.model) + len(r.stopReason) + len(r.stopSequence) +
		len(r.inTokens) + len(r.outTokens) + len(r.cacheCreation) + len(r.cacheRead)
	for i := range r.blocks {
		bl := &r.blocks[i]
		n += 64 + len(bl.typ) + len(bl.text.b) + len(bl.thinking.b) + len(bl.signature.b) + len(bl.data.b) +
			len(bl.id) + len(bl.name) + len(bl.input)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"id":`...)
	b = appendOr(b, r.id, `""`)
	b = append(b, `,"type":"message","role":"assistant","content":[`...)
	first := true
	for i := range r.blocks {
		bl := &r.blocks[i]
		if bl.empty() {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = bl.append(b)
	}
	b = append(b, `],"model":`...)
	b = appendOr(b, r.model, `""`)
	if r.stopReason != nil {
		b = append(append(b, `,"stop_reason":`...), r.stopReason...)
	}
	if r.stopSequence != nil {
		b = append(append(b, `,"stop_sequence":`...), r.stopSequence...)
	}
	b = append(b, `,"usage":{"input_tokens":`...)
	b = appendOr(b, r.inTokens, "0")
	b = append(b, `,"output_tokens":`...)
	b = appendOr(b, r.outTokens, "0")
	if r.cacheCreation != nil {
		b = append(append(b, `,"cache_creation_input_tokens":`...), r.cacheCreation...)
	}
	if r.cacheRead != nil {
		b = append(append(b, `,"cache_read_input_tokens":`...), r.cacheRead...)
	}
	return append(b, "}}"...)
}

// empty reports whether a block is left out of the body: a text or
// thinking block without text (vLLM's non-streaming converter adds them
// only for non-empty content and reasoning).
func (bl *messagesBlock) empty() bool {
	switch string(bl.typ) {
	case `"text"`:
		return len(bl.text.b) == 0
	case `"thinking"`:
		return len(bl.thinking.b) == 0
	}
	return false
}

// append appends the block as AnthropicContentBlock's model_dump with
// exclude_none: the members of its type, in the model's order.
func (bl *messagesBlock) append(b []byte) []byte {
	b = append(append(b, `{"type":`...), bl.typ...)
	switch string(bl.typ) {
	case `"text"`:
		b = append(b, `,"text":`...)
		b = bl.text.appendString(b)
	case `"thinking"`:
		b = append(b, `,"thinking":`...)
		b = bl.thinking.appendString(b)
		if bl.signature.set {
			b = append(b, `,"signature":`...)
			b = bl.signature.appendString(b)
		}
	case `"redacted_thinking"`:
		b = append(b, `,"data":`...)
		b = bl.data.appendString(b)
	case `"tool_use"`:
		b = append(b, `,"id":`...)
		b = appendOr(b, bl.id, `""`)
		b = append(b, `,"name":`...)
		b = appendOr(b, bl.name, `""`)
		b = append(b, `,"input":`...)
		b = appendOr(b, bl.input, "{}")
	default:
		// A block type vLLM does not stream: what it carried.
		for _, m := range []struct {
			key string
			t   *textAcc
		}{{"text", &bl.text}, {"thinking", &bl.thinking}, {"signature", &bl.signature}, {"data", &bl.data}} {
			if m.t.set {
				b = append(append(append(b, `,"`...), m.key...), `":`...)
				b = m.t.appendString(b)
			}
		}
	}
	return append(b, '}')
}

func (r *MessagesReassembler) fail(err error) error {
	if err != nil {
		r.err = err
	}
	return err
}

// compactJSON appends the valid JSON text v without the white space
// outside its strings.
func compactJSON(b, v []byte) []byte {
	in, esc := false, false
	for _, c := range v {
		switch {
		case in:
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				in = false
			}
		case c == '"':
			in = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		b = append(b, c)
	}
	return b
}

// anthropicStatus maps an error type of an Anthropic error event to its
// HTTP status (see [MessagesReassembler.Add]); 0 when unknown.
var anthropicStatus = map[string]int{
	"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
	"permission_error": 403, "not_found_error": 404, "request_too_large": 413,
	"rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
	// vLLM's own type names (api_router.py translate_error_response,
	// serving.py message_stream_converter).
	"BadRequestError": 400, "NotFoundError": 404, "InternalServerError": 500, "internal_error": 500,
}

// newMessagesError builds the error of an error event: data is the whole
// event (valid JSON), errObj its "error" value (nil when absent).
func newMessagesError(data, errObj []byte) *StreamError {
	e := &StreamError{Body: clone(data)}
	if len(errObj) == 0 {
		return e
	}
	switch errObj[0] {
	case '"':
		_ = json.Unmarshal(errObj, &e.Message)
	case '{':
		var typ string
		d := decoder{b: errObj}
		d.open('{')
		for n := 0; d.more('}', &n); {
			switch string(d.key()) {
			case "message":
				if v := d.value(); v[0] == '"' {
					_ = json.Unmarshal(v, &e.Message)
				}
			case "type":
				if v := d.value(); v[0] == '"' {
					_ = json.Unmarshal(v, &typ)
				}
			case "code":
				if code, ok := parseIndex(d.value()); ok && code >= 100 && code <= 599 {
					e.Code = code
				}
			default:
				d.skip()
			}
		}
		if e.Code == 0 {
			e.Code = anthropicStatus[typ]
		}
	}
	return e
}
