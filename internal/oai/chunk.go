package oai

import (
	"encoding/json"
	"errors"
	"math"
)

// Usage is the OpenAI usage object in tokens.
type Usage struct {
	PromptTokens, CompletionTokens, TotalTokens int64
	// CachedTokens is prompt_tokens_details.cached_tokens, the prompt
	// tokens the engine found in its prefix cache (vLLM reports it with
	// --enable-prompt-tokens-details, and omits prompt_tokens_details
	// when it is 0); HasCached says it was a number.
	CachedTokens int64
	HasCached    bool
}

// Chunk is what the gateway needs from one streamed chunk (the data field of
// one SSE event).
type Chunk struct {
	// ID is the "id" string's raw bytes (without quotes, escape sequences
	// undecoded), aliasing the input; nil if absent or not a string.
	ID []byte
	// Content says the chunk carries generated output: some choice has a
	// non-empty delta.content, delta.reasoning_content, delta.reasoning,
	// non-empty delta.tool_calls, or (completions) a non-empty "text". The
	// first Content chunk of a stream is its first token (TTFT).
	//
	// The role-only prelude (delta {"role":"assistant","content":""}),
	// usage-only chunks ("choices":[]), and finish chunks with an empty
	// delta or "content":null are not Content.
	Content bool
	// Reasoning says some choice's delta has a non-empty reasoning_content
	// or reasoning string, ToolCalls a non-empty tool_calls array (both are
	// Content too).
	Reasoning, ToolCalls bool
	// Finish says some choice has a non-null finish_reason.
	Finish bool
	// FinishReason is the raw bytes of the last string finish_reason of
	// the chunk's choices (aliasing the input); nil when none is a string.
	FinishReason []byte
	// Model is the "model" string's raw bytes (aliasing the input); nil if
	// absent or not a string.
	Model []byte
	// Choices is the number of elements of the "choices" array (0 when it
	// is absent, empty or not an array). A usage-only chunk has HasUsage
	// and no choices.
	Choices int
	// HasUsage says a non-null "usage" object is present.
	HasUsage bool
	// Usage is the usage object when HasUsage; fields that are absent or not
	// numbers are 0, and fractions are truncated.
	Usage Usage
	// Error says the chunk is an error object: it has a non-null top-level
	// "error" (vLLM's and OpenAI's in-stream error event) or is a top-level
	// error response ("object":"error").
	Error bool
}

// errNotObject is the error of InspectChunk for valid JSON that is not an
// object.
var errNotObject = errors.New("oai: chunk is not a json object")

// InspectChunk parses one chunk; returns an error for invalid JSON (the
// caller counts it and forwards the event anyway).
//
// It validates data completely in a single pass and does not allocate for a
// valid chunk. Valid JSON that is not an object is also an error. Keys match
// exactly and, for duplicates, the last one wins. Safe for concurrent use.
func InspectChunk(data []byte) (Chunk, error) {
	var c Chunk
	var errorKey, errorObject bool
	d := decoder{b: data}
	if !d.open('{') {
		return Chunk{}, chunkError(data)
	}
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "id":
			c.ID = nil
			if d.peek() == '"' {
				c.ID, _ = d.str()
			} else {
				d.skip()
			}
		case "choices":
			var out output
			out, c.Finish, c.FinishReason, c.Choices = d.choices()
			c.Content, c.Reasoning, c.ToolCalls = out != 0, out&outReasoning != 0, out&outTools != 0
		case "model":
			c.Model = d.rawString()
		case "usage":
			c.Usage, c.HasUsage = d.usage(false)
		case "error":
			errorKey = !d.isNull()
			if errorKey {
				d.skip()
			}
		case "object":
			errorObject = false
			if d.peek() == '"' {
				s, _ := d.str()
				errorObject = string(s) == "error"
			} else {
				d.skip()
			}
		default:
			d.skip()
		}
	}
	c.Error = errorKey || errorObject
	d.end()
	if d.bad {
		return Chunk{}, chunkError(data)
	}
	return c, nil
}

// chunkError describes why data is not a JSON object. It runs only on the
// error path, so it may allocate.
func chunkError(data []byte) error {
	var v json.RawMessage
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	return errNotObject
}

// choices reads the "choices" array of a chunk. Within a choice, as within
// the chunk, the last of duplicate keys wins.
func (d *decoder) choices() (out output, finish bool, reason []byte, n int) {
	if d.peek() != '[' {
		d.skip()
		return 0, false, nil, 0
	}
	d.open('[')
	for i := 0; d.more(']', &i); {
		n++
		if d.peek() != '{' {
			d.skip()
			continue
		}
		var delta output
		var text, fin bool
		d.open('{')
		for j := 0; d.more('}', &j); {
			switch string(d.key()) {
			case "delta":
				delta = d.delta()
			case "text":
				text = d.nonEmptyString()
			case "finish_reason":
				fin = !d.isNull()
				if fin {
					if r := d.rawString(); r != nil {
						reason = r
					}
				}
			default:
				d.skip()
			}
		}
		out |= delta
		if text {
			out |= outText
		}
		finish = finish || fin
	}
	return out, finish, reason, n
}

// output is what a choice's delta (or completion text) carries: a set of
// outText, outReasoning, outTools.
type output uint8

const (
	outText output = 1 << iota
	outReasoning
	outTools
)

// delta reads a choice's delta and reports the output it carries.
func (d *decoder) delta() output {
	if d.peek() != '{' {
		d.skip()
		return 0
	}
	var content, reasoningContent, reasoning, toolCalls bool
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "content":
			content = d.nonEmptyString()
		case "reasoning_content":
			reasoningContent = d.nonEmptyString()
		case "reasoning":
			reasoning = d.nonEmptyString()
		case "tool_calls":
			toolCalls = d.nonEmptyArray()
		default:
			d.skip()
		}
	}
	var out output
	if content {
		out |= outText
	}
	if reasoningContent || reasoning {
		out |= outReasoning
	}
	if toolCalls {
		out |= outTools
	}
	return out
}

// usage reads a usage value; ok is false unless it is an object. With
// named set, input_tokens and output_tokens (the Responses API's and
// Anthropic's names) stand in for prompt_tokens and completion_tokens when
// those are absent or not numbers, the Responses API's
// input_tokens_details.cached_tokens for the cached tokens, and
// Anthropic's cache_read_input_tokens and cache_creation_input_tokens,
// which its input_tokens leaves out, are added to the prompt (those read
// are its cached tokens). (A bool, not a second method, so that
// InspectChunk's loop stays as it was.)
func (d *decoder) usage(named bool) (u Usage, ok bool) {
	if d.peek() != '{' {
		d.skip()
		return Usage{}, false
	}
	var in, out, read, write int64
	var hasPrompt, hasCompletion, hasIn, hasOut, hasRead bool
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "prompt_tokens":
			u.PromptTokens, hasPrompt = d.int()
		case "completion_tokens":
			u.CompletionTokens, hasCompletion = d.int()
		case "total_tokens":
			u.TotalTokens, _ = d.int()
		case "prompt_tokens_details":
			u.CachedTokens, _, _, u.HasCached = d.cachedTokens()
		case "input_tokens":
			in, hasIn = d.int()
		case "output_tokens":
			out, hasOut = d.int()
		case "input_tokens_details":
			if !named {
				d.skip()
				break
			}
			u.CachedTokens, _, _, u.HasCached = d.cachedTokens()
		case "cache_read_input_tokens":
			read, hasRead = d.int()
		case "cache_creation_input_tokens":
			write, _ = d.int()
		default:
			d.skip()
		}
	}
	if named && !hasPrompt && hasIn {
		// Anthropic's input_tokens leaves out the prompt read from and
		// written to its cache.
		u.PromptTokens = satAdd(satAdd(in, max(read, 0)), max(write, 0))
		if hasRead && read >= 0 {
			u.CachedTokens, u.HasCached = read, true
		}
	}
	if named && !hasCompletion && hasOut {
		u.CompletionTokens = out
	}
	return u, true
}

// ParseResponse extracts id and usage from a non-streaming response body
// (chat, completion, embeddings and the other OpenAI-style bodies, the
// Responses API's, Anthropic's messages); ok=false when the body is not a
// JSON object.
//
// An invalid JSON body is not an object either. id is "" when absent or not a
// string; usage is zero when absent, null or not an object. In usage,
// PromptTokens is prompt_tokens when it is a number, else input_tokens
// (Responses API, Anthropic); CompletionTokens is completion_tokens, else
// output_tokens; TotalTokens is total_tokens as reported (Anthropic reports
// none). Fields that are absent or not numbers are 0, fractions are
// truncated and values too large saturate.
func ParseResponse(body []byte) (id string, usage Usage, ok bool) {
	b, ok := ParseBody(body)
	return b.ID, b.Usage, ok
}

// Body is what [ParseBody] reads from a non-streaming response body.
type Body struct {
	// ID and Usage are as [ParseResponse] returns them.
	ID    string
	Usage Usage
	// Model is the top-level "model" string's raw bytes (aliasing the
	// body); nil when absent or not a string.
	Model []byte
	// FinishReason is the raw bytes of the last string finish_reason of
	// the "choices" (chat, completions) or of the top-level "stop_reason"
	// (Anthropic), aliasing the body; nil when there is none.
	FinishReason []byte
}

// ParseBody reads a non-streaming response body's id, usage, model and
// finish reason in one pass; ok=false when the body is not a JSON object
// (see [ParseResponse] for the rules on id and usage).
func ParseBody(body []byte) (b Body, ok bool) {
	d := decoder{b: body}
	if !d.open('{') {
		return Body{}, false
	}
	var rawID []byte
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "id":
			rawID = d.value()
		case "usage":
			b.Usage, _ = d.usage(true)
		case "model":
			b.Model = d.rawString()
		case "choices":
			_, _, b.FinishReason, _ = d.choices()
		case "stop_reason":
			b.FinishReason = d.rawString()
		default:
			d.skip()
		}
	}
	d.end()
	if d.bad {
		return Body{}, false
	}
	if len(rawID) > 0 && rawID[0] == '"' {
		b.ID, _ = stringField("id", rawID, false)
	}
	return b, true
}

// rawString reads a value and returns its raw bytes when it is a string
// (without quotes, escapes undecoded), else nil.
func (d *decoder) rawString() []byte {
	if d.peek() != '"' {
		d.skip()
		return nil
	}
	s, _ := d.str()
	return s
}

// satAdd returns a+b for non-negative counts, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
