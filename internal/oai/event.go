package oai

import "bytes"

// Event is what the gateway learns from one stream event's data in the
// Responses or Anthropic framing, where every event is a JSON object with a
// "type" (the SSE "event:" line repeats it; only the data is read).
type Event struct {
	// Type is the "type" string's raw bytes (without quotes, escape
	// sequences undecoded), aliasing data; nil if absent or not a string.
	Type []byte
	// Content says the event carries generated output: the first Content
	// event of a stream is its first token (TTFT).
	Content bool
	// Terminal says the event is the framing's end event.
	Terminal bool
	// Error says the event is an error event.
	Error bool
	// ID is the response's or message's id when this event carries one
	// (raw bytes, aliasing data); nil otherwise.
	ID []byte
	// Model is the response's or message's "model" when this event
	// carries one (raw bytes, aliasing data); nil otherwise.
	Model []byte
	// FinishReason is an Anthropic message_delta's delta.stop_reason (raw
	// bytes, aliasing data); nil otherwise.
	FinishReason []byte
	// InputTokens and OutputTokens are the usage this event reports, in
	// tokens; each is -1 when the event reports none (absent, null, not a
	// number or negative). Fractions are truncated and values too large
	// saturate, as for [Usage].
	InputTokens, OutputTokens int64
	// CachedTokens is the cached part of the prompt the event's usage
	// reports: a Responses usage's input_tokens_details.cached_tokens
	// (part of its input_tokens), or Anthropic's cache_read_input_tokens
	// (not part of its input_tokens). CacheWriteTokens is Anthropic's
	// cache_creation_input_tokens (not part of its input_tokens either).
	// -1 when absent, as for InputTokens.
	CachedTokens, CacheWriteTokens int64
}

// noEvent is the Event returned with an error.
var noEvent = Event{InputTokens: -1, OutputTokens: -1, CachedTokens: -1, CacheWriteTokens: -1}

// tokenCounts are the counts of one usage object, each -1 when absent.
type tokenCounts struct {
	in, out, cached, write int64
}

var noCounts = tokenCounts{-1, -1, -1, -1}

// InspectResponsesEvent parses the data of one event of an OpenAI
// Responses API stream (POST /v1/responses with "stream": true, as vLLM
// emits it); it returns an error for data that is not a JSON object (the
// caller counts it and forwards the event anyway), with an Event that
// reports nothing.
//
//   - Content: the type ends in ".delta" (response.output_text.delta,
//     response.reasoning_text.delta, response.reasoning_summary_text.delta,
//     response.refusal.delta, response.function_call_arguments.delta,
//     response.audio.delta, response.audio.transcript.delta, ...) and
//     "delta" is a non-empty string.
//   - Terminal: response.completed, response.failed or response.incomplete.
//   - Error: type "error" or response.failed, or a non-null top-level
//     "error" member (vLLM's generic in-stream error object).
//   - ID and usage: from the "response" object (response.created,
//     response.in_progress, response.queued and the terminal events carry
//     it): its "id" string and its "usage" object's input_tokens and
//     output_tokens.
//
// The type is compared after decoding escapes, like keys. It validates
// data completely in a single pass and does not allocate for a valid event
// (unless its type has escape sequences, which no engine writes). Keys
// match exactly and, for duplicates, the last one wins. Safe for
// concurrent use; never panics.
func InspectResponsesEvent(data []byte) (Event, error) {
	e := noEvent
	var typ []byte
	var delta, errorKey bool
	d := decoder{b: data}
	if !d.open('{') {
		return noEvent, chunkError(data)
	}
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "type":
			e.Type, typ = d.eventType()
		case "delta":
			delta = d.nonEmptyString()
		case "response":
			var u tokenCounts
			e.ID, e.Model, u = d.idAndUsage()
			e.InputTokens, e.OutputTokens, e.CachedTokens = u.in, u.out, u.cached
		case "error":
			errorKey = !d.isNull()
			if errorKey {
				d.skip()
			}
		default:
			d.skip()
		}
	}
	d.end()
	if d.bad {
		return noEvent, chunkError(data)
	}
	switch string(typ) {
	case "response.completed", "response.incomplete":
		e.Terminal = true
	case "response.failed":
		e.Terminal, e.Error = true, true
	case "error":
		e.Error = true
	}
	e.Error = e.Error || errorKey
	e.Content = delta && bytes.HasSuffix(typ, []byte(".delta"))
	return e, nil
}

// InspectAnthropicEvent parses the data of one event of an Anthropic
// Messages API stream (POST /v1/messages with "stream": true); it returns
// an error for data that is not a JSON object, with an Event that reports
// nothing.
//
//   - Content: content_block_delta whose "delta" has a non-empty "text"
//     (text_delta), "thinking" (thinking_delta) or "partial_json"
//     (input_json_delta). A signature_delta is not output.
//   - Terminal: message_stop.
//   - Error: type "error", or a non-null top-level "error" member.
//   - ID: message_start's message.id.
//   - Usage: message_start's message.usage, and message_delta's top-level
//     "usage" (output_tokens, and input_tokens when present); when one
//     event has both, the top-level usage wins per field. input_tokens is
//     Anthropic's: it excludes cache_read_input_tokens (CachedTokens) and
//     cache_creation_input_tokens (CacheWriteTokens), read apart.
//
// Like [InspectResponsesEvent] it validates data in one pass, does not
// allocate for a valid event, and is safe for concurrent use.
func InspectAnthropicEvent(data []byte) (Event, error) {
	e := noEvent
	var typ []byte
	var delta, errorKey bool
	top := noCounts
	d := decoder{b: data}
	if !d.open('{') {
		return noEvent, chunkError(data)
	}
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "type":
			e.Type, typ = d.eventType()
		case "delta":
			delta, e.FinishReason = d.anthropicDelta()
		case "message":
			var u tokenCounts
			e.ID, e.Model, u = d.idAndUsage()
			e.InputTokens, e.OutputTokens, e.CachedTokens, e.CacheWriteTokens = u.in, u.out, u.cached, u.write
		case "usage":
			top = d.tokenUsage()
		case "error":
			errorKey = !d.isNull()
			if errorKey {
				d.skip()
			}
		default:
			d.skip()
		}
	}
	d.end()
	if d.bad {
		return noEvent, chunkError(data)
	}
	for _, f := range [...]struct {
		dst *int64
		v   int64
	}{{&e.InputTokens, top.in}, {&e.OutputTokens, top.out},
		{&e.CachedTokens, top.cached}, {&e.CacheWriteTokens, top.write}} {
		if f.v >= 0 {
			*f.dst = f.v
		}
	}
	switch string(typ) {
	case "content_block_delta":
		e.Content = delta
	case "message_stop":
		e.Terminal = true
	case "error":
		e.Error = true
	}
	e.Error = e.Error || errorKey
	return e, nil
}

// eventType reads a "type" value: raw is the string's bytes as written (nil
// for a non-string), typ the same decoded, for comparison.
func (d *decoder) eventType() (raw, typ []byte) {
	if d.peek() != '"' {
		d.skip()
		return nil, nil
	}
	start := d.i
	raw, esc := d.str()
	if esc && !d.bad {
		return raw, []byte(unescape(d.b[start:d.i]))
	}
	return raw, raw
}

// idAndUsage reads a response or message object and returns its "id" and
// "model" strings' raw bytes and its "usage" object's input and output
// tokens; nil and -1 for what is absent.
func (d *decoder) idAndUsage() (id, model []byte, u tokenCounts) {
	u = noCounts
	if d.peek() != '{' {
		d.skip()
		return nil, nil, noCounts
	}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "id":
			id = nil
			if d.peek() == '"' {
				id, _ = d.str()
			} else {
				d.skip()
			}
		case "usage":
			u = d.tokenUsage()
		case "model":
			model = d.rawString()
		default:
			d.skip()
		}
	}
	return id, model, u
}

// tokenUsage reads a usage value and returns its input_tokens,
// output_tokens, cached prompt tokens (input_tokens_details.cached_tokens
// or Anthropic's cache_read_input_tokens) and Anthropic's
// cache_creation_input_tokens, each -1 when absent or not a non-negative
// number (and all when the value is not an object).
func (d *decoder) tokenUsage() tokenCounts {
	u := noCounts
	if d.peek() != '{' {
		d.skip()
		return noCounts
	}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "input_tokens":
			u.in = d.count()
		case "output_tokens":
			u.out = d.count()
		case "cache_read_input_tokens":
			u.cached = d.count()
		case "cache_creation_input_tokens":
			u.write = d.count()
		case "input_tokens_details":
			if d.peek() != '{' {
				d.skip()
				continue
			}
			d.open('{')
			for m := 0; d.more('}', &m); {
				if string(d.key()) == "cached_tokens" {
					u.cached = d.count()
				} else {
					d.skip()
				}
			}
		default:
			d.skip()
		}
	}
	return u
}

// count reads any value and returns it as a token count: -1 unless it is a
// non-negative number.
func (d *decoder) count() int64 {
	v, ok := d.int()
	if !ok || v < 0 {
		return -1
	}
	return v
}

// anthropicDelta reads a delta: a content_block_delta's, reporting
// whether it carries output, or a message_delta's, returning its
// stop_reason string's raw bytes.
func (d *decoder) anthropicDelta() (output bool, stop []byte) {
	if d.peek() != '{' {
		d.skip()
		return false, nil
	}
	var text, thinking, partial bool
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "text":
			text = d.nonEmptyString()
		case "thinking":
			thinking = d.nonEmptyString()
		case "partial_json":
			partial = d.nonEmptyString()
		case "stop_reason":
			stop = d.rawString()
		default:
			d.skip()
		}
	}
	return text || thinking || partial, stop
}
