package oai

import (
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// tokenBytes is what PromptBytes counts for one token id of a pre-tokenized
// prompt: roughly the bytes of text per token of common BPE vocabularies.
const tokenBytes = 4

// Request holds the fields of a request body that the gateway routes and
// accounts on.
type Request struct {
	// Model is the "model" field; never empty when the Schema has
	// ModelRequired, "" when an optional model is absent or null.
	Model string
	// ModelStart and ModelEnd are the byte offsets in the body of the
	// (last) "model" value, the JSON string including its quotes, so that
	// body[ModelStart:ModelEnd] can be replaced (a model alias) without
	// re-encoding the body; both 0 when the model is absent or null.
	ModelStart, ModelEnd int
	// Stream is the "stream" field; always false for a Schema that is not
	// Generative.
	Stream bool
	// StreamStart and StreamEnd are the byte offsets in the body of the
	// (last) "stream" value, so it can be replaced; both 0 when absent or
	// the Schema is not Generative.
	StreamStart, StreamEnd int
	// Streamable is false when the body sets prompt_logprobs or
	// kv_transfer_params (not null): vLLM refuses the first on a stream,
	// and a stream cannot carry the second back. Always false for a
	// Schema that is not Generative.
	Streamable bool
	// KVTransfer is true when the body sets kv_transfer_params (not
	// null): vLLM's KV connector parameters, which a gateway that
	// disaggregates prefill and decode sets itself. Always false for a
	// Schema that is not Generative.
	KVTransfer bool
	// PromptBatch is true when the prompt is an array of prompts (of
	// strings, or of arrays of token ids: a completions batch), not one
	// prompt. Always false for a Schema that is not Generative.
	PromptBatch bool
	// EchoLogprobs is true when the body sets "echo": true and a
	// non-null "logprobs" (completions): vLLM then returns the prompt's
	// logprobs too (vllm/entrypoints/openai/serving_completion.py). Always
	// false for a Schema that is not Generative.
	EchoLogprobs bool
	// Sampling holds the raw values of the sampling parameters (aliasing
	// the body), for the GenAI span attributes ([ParseSampling] decodes
	// them); all nil when the Schema is not Generative.
	Sampling SamplingRaw
	// IncludeUsage is stream_options.include_usage.
	IncludeUsage bool
	// ContinuousUsage is vLLM's stream_options.continuous_usage_stats
	// (usage in every chunk); a value that is not true counts as false.
	ContinuousUsage bool
	// HasStreamOptions is true when stream_options is present and not null.
	HasStreamOptions bool
	// StreamOptionsEnd is the offset in the body of the closing '}' of the
	// stream_options object (the last one, when the key repeats), so a key
	// can be added to it without re-encoding the body; 0 when
	// HasStreamOptions is false. StreamOptionsEmpty is true when that
	// object has no members.
	StreamOptionsEnd   int
	StreamOptionsEmpty bool
	// User is a session-affinity key candidate: the top-level "user"
	// string when it is non-empty, else Anthropic's metadata.user_id
	// string, else "".
	User string
	// MaxTokens is max_completion_tokens when it is set and non-zero,
	// otherwise max_tokens when it is set and non-zero (the precedence
	// vLLM applies), otherwise the Responses API's max_output_tokens; 0 if
	// none is set or the Schema is not Generative.
	MaxTokens int64
	// MaxTokensParam names the field MaxTokens was read from
	// ("max_completion_tokens", "max_tokens" or "max_output_tokens"; a
	// constant, so parsing does not allocate for it), for an error about
	// it; "" when MaxTokens is 0.
	MaxTokensParam string
	// PromptBytes is the total bytes of prompt text (messages[].content
	// strings and text parts, or prompt, or input strings, plus the
	// Schema's Preamble when it is a string or an array of text parts) for
	// prefix-aware routing and load estimates. It is approximate: strings
	// are counted as written in the body, escape sequences included, and a
	// token id of a pre-tokenized prompt or input counts as 4 bytes. 0 for
	// PromptNone.
	PromptBytes int
	// PrefixHashes are the chained hashes of the leading full blocks of
	// the prompt's canonical byte stream, computed by [Parser.Parse] when
	// its BlockBytes is set: PrefixHashes[i] stands for the model, the
	// preamble and the whole stream up to the end of block i, so two
	// requests for the same model and preamble share their first k hashes
	// when their streams share their first k blocks. At most MaxBlocks
	// long; nil when hashing is off (as for [ParseRequest]), for
	// PromptNone and PromptInput, and when the stream is shorter than one
	// block. Parser describes the stream and the hash.
	PrefixHashes []uint64
}

// RequestError says why a body was rejected: the HTTP status, the OpenAI
// error "param" (may be "") and a lower-case message. The gateway answers
// it with Status (400 when 0) and an invalid_request_error.
type RequestError struct {
	// Status is the HTTP status to answer with; 0 means 400. Only
	// [ParseForm] sets another (415 for a body that is not a form).
	Status         int
	Param, Message string
}

// Error returns the message.
func (e *RequestError) Error() string { return e.Message }

// HTTPStatus returns Status, or 400 when it is 0.
func (e *RequestError) HTTPStatus() int {
	if e.Status == 0 {
		return 400
	}
	return e.Status
}

func reqErr(param, msg string) error { return &RequestError{Param: param, Message: msg} }

// ParseRequest decodes the routing fields of body as schema s says. Errors
// (always *RequestError, with Status 0, meaning 400): empty body ("request
// body is empty"), invalid JSON (message names the JSON error, param ""),
// body not a JSON object, then, in this order: "model" not a string (or,
// with s.ModelRequired, missing or empty; param "model"); s.Prompt missing
// or null when s.PromptRequired ("<name> is required"), or not a non-empty
// array when s.PromptNonEmpty ("<name> must be a non-empty array"); a field
// of s.Require missing or null ("<f> is required"); for a Generative
// schema, "stream" not a bool (param "stream"), stream_options not an
// object, max_tokens, max_completion_tokens or max_output_tokens not an
// integer >= 0; "user" not a string; metadata.user_id not a string (param
// "metadata.user_id"). A nil s is rejected with the message "unsupported
// operation". Never panics on any input.
//
// Every field the gateway reads must have its OpenAI type, so "user" must be
// a string and stream_options.include_usage a bool (param
// "stream_options.include_usage"). A metadata value that is not an object
// is not read (OpenAI's chat metadata and Anthropic's are objects). A null
// field is treated as absent. Other fields are not validated: the engine
// does that.
//
// Keys match exactly, after decoding escapes, and the last of duplicate keys
// wins, as in the engine's own JSON parser, so the gateway routes on the
// same model the engine will see: {"model":"a","Model":"b"} is model "a".
//
// ParseRequest reads body in one pass and does not retain it; Model and
// User are copies. It is Parser{}.Parse(s, body): PrefixHashes is nil.
func ParseRequest(s *Schema, body []byte) (Request, error) {
	return Parser{}.Parse(s, body)
}

// Parser parses request bodies like [ParseRequest] and can also compute
// [Request.PrefixHashes] for prefix-cache-aware routing. The zero value
// computes no hashes. A Parser is a value: it is safe for concurrent use.
//
// The idea is the Gateway API Inference Extension's prefix-cache scorer
// (used by llm-d), which hashes fixed-size 64-character blocks of the
// prompt, each hash chained to the previous one and the chain seeded by the
// model name, and remembers which engine it sent each hash to; SGLang's
// sgl-router cache-aware policy gets the same effect by matching prompt
// text against an approximate radix tree per worker. A request whose
// leading hashes an engine has seen is likely to find that prefix in the
// engine's KV cache (vLLM's automatic prefix caching likewise hashes only
// full blocks, each chained to its parent).
//
// # Canonical stream
//
// The hashed bytes are a canonical stream built from the Schema's Prompt
// field, not the body, so that fields around the prompt (sampling
// parameters, tools, stream options, key order at the top level) do not
// change the hashes:
//
//   - PromptMessages (chat, Anthropic messages, Responses input): for each
//     object element of the array, in order: the "role" string's bytes,
//     0x00, the "content", then 0x01. A content string contributes its
//     bytes between the quotes, escape sequences as written; an array of
//     content parts contributes its raw JSON bytes, white space included
//     (so images, audio and Anthropic's tool_use and tool_result blocks
//     count too, and the parts need no second scan); null, absent or any
//     other value contributes nothing. If the message has a "tool_calls"
//     array, 0x00 and its raw JSON bytes come before the 0x01, so agent
//     turns that differ only in their tool calls hash apart. The order of
//     a message's keys does not matter, the last of duplicate keys counts,
//     and other keys (name, tool_call_id, type, ...) and non-object
//     elements are not part of the stream; so a Responses item without
//     role or content (function_call, function_call_output) contributes
//     only its separators. A string value (a Responses "input" string)
//     contributes its bytes between the quotes.
//   - PromptText (completions): a "prompt" string's bytes between the
//     quotes. For an array: each string element's bytes followed by 0x00,
//     each token id's decimal text as written followed by 0x02, and each
//     array of token ids as its token ids followed by 0x01; other elements
//     contribute nothing.
//   - PromptInput and PromptNone: none; pooling requests are not
//     prefix-cached.
//
// JSON strings cannot contain raw control bytes, so the separators cannot
// be confused with prompt text. Escapes are not decoded: "\u00e9" and "é"
// are different bytes, which only matters if clients mix the spellings.
//
// # Hash
//
// The stream is cut into BlockBytes-sized blocks; a trailing partial block
// is not hashed. Block i's chain value is c_i = XXH64(block i's bytes,
// seed c_{i-1}), with c_{-1} = 0 (xxHash, github.com/cespare/xxhash/v2),
// and PrefixHashes[i] = stablehash.Mix64(c_i XOR stablehash.String(the
// decoded model name) XOR P), Mix64 being MurmurHash3's finalizer. P is 0
// when the Schema has no Preamble or the preamble field is absent or null,
// and otherwise XXH64 (seed 0) of the preamble's bytes: a string's bytes
// between the quotes as written, any other value's raw JSON bytes (an
// Anthropic "system" array of text blocks, cache_control included). So a
// schema without a preamble, such as chat, hashes exactly as if P did not
// exist. The model and the preamble are mixed in at the end because they
// may follow the prompt in the body, which keeps the parse to one pass; for
// a given chain the mix is a bijection, so the same prompt under two models
// or two system prompts never has the same hash at the same position.
//
// The hash is fast (about 0.5 ns per byte of stream, 32 bytes per round),
// allocates nothing and has no random seed, unlike hash/maphash: every
// gateway replica, restart and version computes the same values for the
// same request, so what one learns about which engine holds which hashes
// holds for all. TestPrefixHashesGolden pins the values; changing the
// stream or the hash invalidates what every replica has learned, so do it
// deliberately.
type Parser struct {
	// BlockBytes is the size of a block of the canonical stream, in bytes.
	// 0 (the default) or less turns hashing off. The Inference
	// Extension's default of 64 is vLLM's 16-token KV-cache block at about
	// 4 bytes per token.
	BlockBytes int
	// MaxBlocks is the most blocks hashed, and so the longest PrefixHashes
	// can be; the stream after them is ignored. 0 (the default) or less
	// means no cap other than the body's length. The Inference Extension
	// caps at 256 blocks.
	MaxBlocks int
}

// maxRequireBits is how many of Schema.Require the single pass tracks; the
// rest (no route has that many) are looked up after it.
const maxRequireBits = 64

// Parse decodes the routing fields of body as s says, exactly as
// [ParseRequest] does, with the same results and errors, and, when
// p.BlockBytes > 0 and s.PromptKind is PromptMessages or PromptText, also
// sets PrefixHashes (see [Parser]).
//
// Parse reads body in one pass, hashing the prompt's bytes in place, and
// does not retain it. It allocates the Model and User strings; with
// hashing on it makes at most one allocation more: the PrefixHashes slice,
// with capacity min(len(body)/BlockBytes, MaxBlocks), and only when at
// least one block is full.
func (p Parser) Parse(s *Schema, body []byte) (Request, error) {
	if s == nil {
		return Request{}, reqErr("", "unsupported operation")
	}
	d := decoder{b: body}
	switch d.peek() {
	case 0:
		if d.i == len(body) {
			return Request{}, reqErr("", "request body is empty")
		}
		return Request{}, invalidJSON(body)
	case '{':
	default:
		d.skip()
		d.end()
		if d.bad {
			return Request{}, invalidJSON(body)
		}
		return Request{}, reqErr("", "request body must be a json object")
	}

	// Raw values of the fields, nil when absent; the last duplicate wins.
	var model, stream, streamOpts, user, metadata, maxTokens, maxCompletion, maxOutput, prompt, preamble []byte
	var promptLogprobs, kvTransfer, echo, logprobs []byte
	var sampling SamplingRaw
	modelAt, streamOptsAt, streamAt := 0, 0, 0
	var present uint64 // bit i: the last s.Require[i] is present and not null
	promptBytes, preambleBytes := 0, 0
	walk := s.Prompt != "" && s.PromptKind != PromptNone
	hashing := p.BlockBytes > 0 && (s.PromptKind == PromptMessages || s.PromptKind == PromptText)
	var h prefixHasher
	d.open('{')
	for n := 0; d.more('}', &n); {
		k := d.key()
		d.peek()
		start := d.i
		switch {
		case walk && string(k) == s.Prompt:
			var hp *prefixHasher
			if hashing {
				// The last duplicate wins, for the hashes too.
				h = newPrefixHasher(p, len(body))
				hp = &h
			}
			promptBytes = d.prompt(s.PromptKind, hp)
		case s.Preamble != "" && string(k) == s.Preamble:
			preambleBytes = d.contentBytes()
		default:
			d.skip()
		}
		raw := d.b[start:d.i] // meaningless once d.bad, and then unused
		switch string(k) {
		case "model":
			model, modelAt = raw, start
		case "user":
			user = raw
		case "metadata":
			metadata = raw
		case "stream":
			stream, streamAt = raw, start
		case "prompt_logprobs":
			promptLogprobs = raw
		case "temperature":
			sampling.Temperature = raw
		case "top_p":
			sampling.TopP = raw
		case "top_k":
			sampling.TopK = raw
		case "frequency_penalty":
			sampling.FrequencyPenalty = raw
		case "presence_penalty":
			sampling.PresencePenalty = raw
		case "seed":
			sampling.Seed = raw
		case "n":
			sampling.N = raw
		case "stop":
			sampling.Stop = raw
		case "stop_sequences":
			sampling.StopSequences = raw
		case "response_format":
			sampling.ResponseFormat = raw
		case "kv_transfer_params":
			kvTransfer = raw
		case "echo":
			echo = raw
		case "logprobs":
			logprobs = raw
		case "stream_options":
			streamOpts, streamOptsAt = raw, start
		case "max_tokens":
			maxTokens = raw
		case "max_completion_tokens":
			maxCompletion = raw
		case "max_output_tokens":
			maxOutput = raw
		}
		if s.Prompt != "" && string(k) == s.Prompt {
			prompt = raw
		}
		if s.Preamble != "" && string(k) == s.Preamble {
			preamble = raw
		}
		for i, f := range s.Require {
			if i < maxRequireBits && string(k) == f {
				if nullOrAbsent(raw) {
					present &^= 1 << i
				} else {
					present |= 1 << i
				}
			}
		}
	}
	d.end()
	if d.bad {
		return Request{}, invalidJSON(body)
	}

	var r Request
	var err error
	if r.Model, err = stringField("model", model, s.ModelRequired); err != nil {
		return Request{}, err
	}
	if !nullOrAbsent(model) {
		r.ModelStart, r.ModelEnd = modelAt, modelAt+len(model)
	}
	if err := checkPrompt(s, prompt); err != nil {
		return Request{}, err
	}
	for i, f := range s.Require {
		ok := present&(1<<i) != 0
		if i >= maxRequireBits {
			ok = !nullOrAbsent(topLevel(body, f))
		}
		if !ok {
			return Request{}, reqErr(f, f+" is required")
		}
	}
	r.PromptBytes = promptBytes + preambleBytes
	if s.Generative {
		if r.Stream, err = boolField("stream", stream); err != nil {
			return Request{}, err
		}
		if r.IncludeUsage, r.ContinuousUsage, err = streamOptions(streamOpts); err != nil {
			return Request{}, err
		}
		if stream != nil {
			r.StreamStart, r.StreamEnd = streamAt, streamAt+len(stream)
		}
		r.Streamable = nullOrAbsent(promptLogprobs) && nullOrAbsent(kvTransfer)
		r.KVTransfer = !nullOrAbsent(kvTransfer)
		r.PromptBatch = isBatch(prompt)
		r.EchoLogprobs = string(echo) == "true" && !nullOrAbsent(logprobs)
		r.Sampling = sampling
		r.HasStreamOptions = !nullOrAbsent(streamOpts)
		if r.HasStreamOptions {
			r.StreamOptionsEnd = streamOptsAt + len(streamOpts) - 1
			r.StreamOptionsEmpty = isEmptyObject(streamOpts)
		}
		if r.MaxTokens, r.MaxTokensParam, err = maxTokensField(maxTokens, maxCompletion, maxOutput); err != nil {
			return Request{}, err
		}
	}
	if r.User, err = stringField("user", user, false); err != nil {
		return Request{}, err
	}
	uid, err := metadataUserID(metadata)
	if err != nil {
		return Request{}, err
	}
	if r.User == "" && uid != nil {
		r.User, _ = stringField("metadata.user_id", uid, false)
	}
	if hashing {
		r.PrefixHashes = h.finish(r.Model, preambleSeed(preamble))
	}
	return r, nil
}

// nullOrAbsent reports whether the raw value of a field is absent (nil) or null.
func nullOrAbsent(raw []byte) bool { return len(raw) == 0 || raw[0] == 'n' }

// checkPrompt checks s's prompt field, whose raw value is raw.
func checkPrompt(s *Schema, raw []byte) error {
	name := s.Prompt
	if name == "" {
		return nil
	}
	if nullOrAbsent(raw) {
		if s.PromptRequired {
			return reqErr(name, name+" is required")
		}
		return nil
	}
	if s.PromptNonEmpty && (raw[0] != '[' || isEmptyArray(raw)) {
		return reqErr(name, name+" must be a non-empty array")
	}
	return nil
}

// maxTokensField checks max_tokens, max_completion_tokens and
// max_output_tokens, in that order, from their raw values, and returns the
// first non-zero of max_completion_tokens, max_tokens and
// max_output_tokens.
func maxTokensField(maxTokens, maxCompletion, maxOutput []byte) (n int64, param string, err error) {
	mt, err := intField("max_tokens", maxTokens)
	if err != nil {
		return 0, "", err
	}
	mct, err := intField("max_completion_tokens", maxCompletion)
	if err != nil {
		return 0, "", err
	}
	mot, err := intField("max_output_tokens", maxOutput)
	if err != nil {
		return 0, "", err
	}
	switch {
	case mct != 0:
		return mct, "max_completion_tokens", nil
	case mt != 0:
		return mt, "max_tokens", nil
	case mot != 0:
		return mot, "max_output_tokens", nil
	}
	return 0, "", nil
}

// metadataUserID returns the raw value of metadata.user_id (nil when
// metadata is not an object, or user_id is absent or null) from the raw
// value of metadata, and an error when user_id is not a string.
func metadataUserID(raw []byte) ([]byte, error) {
	if len(raw) == 0 || raw[0] != '{' {
		return nil, nil
	}
	var uid []byte
	d := decoder{b: raw}
	d.open('{')
	for n := 0; d.more('}', &n); {
		if string(d.key()) == "user_id" {
			uid = d.value()
		} else {
			d.skip()
		}
	}
	if nullOrAbsent(uid) {
		return nil, nil
	}
	if uid[0] != '"' {
		return nil, reqErr("metadata.user_id", "metadata.user_id must be a string")
	}
	return uid, nil
}

// topLevel returns the raw value of the last top-level member key of the
// valid JSON object body, nil if there is none.
func topLevel(body []byte, key string) []byte {
	var v []byte
	d := decoder{b: body}
	d.open('{')
	for n := 0; d.more('}', &n); {
		if string(d.key()) == key {
			v = d.value()
		} else {
			d.skip()
		}
	}
	return v
}

// invalidJSON returns the error for a body that is not valid JSON, with
// encoding/json's description of the problem.
func invalidJSON(body []byte) error {
	var v json.RawMessage
	if err := json.Unmarshal(body, &v); err != nil {
		return reqErr("", "invalid json: "+err.Error())
	}
	return reqErr("", "invalid json") // unreachable: decoder agrees with json.Valid
}

// isEmptyObject reports whether the valid JSON object raw has no members.
func isEmptyObject(raw []byte) bool {
	d := decoder{b: raw[1:]}
	return d.peek() == '}'
}

// isEmptyArray reports whether the valid JSON array raw has no elements.
func isEmptyArray(raw []byte) bool {
	d := decoder{b: raw[1:]}
	return d.peek() == ']'
}

// messages reads a chat messages array and returns the bytes of its text:
// string contents and the "text" of content parts.
func (d *decoder) messages() int { return d.sumLastKey("content", true) }

// contentParts reads an array of content parts and returns the bytes of
// their "text" strings.
func (d *decoder) contentParts() int { return d.sumLastKey("text", false) }

// contentBytes reads a message's content: a string, an array of parts, or
// anything else (0 bytes).
func (d *decoder) contentBytes() int {
	if d.peek() == '[' {
		return d.contentParts()
	}
	return d.stringBytes()
}

// stringBytes reads a value and returns its length if it is a string, 0
// otherwise.
func (d *decoder) stringBytes() int {
	if d.peek() != '"' {
		d.skip()
		return 0
	}
	s, _ := d.str()
	return len(s)
}

// sumLastKey reads an array and returns the sum, over its object elements,
// of the bytes of key's value (the last one, when the key repeats, as the
// engine's parser sees it): contentBytes when content is set, else
// stringBytes. Other elements count 0. (A bool, not a func value: passing
// d to an indirect call would move the decoder to the heap.)
func (d *decoder) sumLastKey(key string, content bool) int {
	n := 0
	d.open('[')
	for i := 0; d.more(']', &i); {
		if d.peek() != '{' {
			d.skip()
			continue
		}
		last := 0
		d.open('{')
		for j := 0; d.more('}', &j); {
			if string(d.key()) != key {
				d.skip()
				continue
			}
			if content {
				last = d.contentBytes()
			} else {
				last = d.stringBytes()
			}
		}
		n += last
	}
	return n
}

// stringField decodes the string field name from its raw value.
func stringField(name string, raw []byte, required bool) (string, error) {
	if len(raw) == 0 || raw[0] == 'n' {
		if required {
			return "", reqErr(name, name+" is required")
		}
		return "", nil
	}
	if raw[0] != '"' {
		return "", reqErr(name, name+" must be a string")
	}
	d := decoder{b: raw}
	v, esc := d.str()
	s := string(v)
	if esc || !utf8.Valid(v) {
		s = unescape(raw) // also replaces invalid UTF-8 with U+FFFD, as encoding/json does
	}
	if s == "" && required {
		return "", reqErr(name, name+" must not be empty")
	}
	return s, nil
}

// unescape decodes the valid JSON string raw, quotes included. Escapes and
// invalid UTF-8 are rare in the fields read here, so encoding/json does it.
func unescape(raw []byte) string {
	var s string
	_ = json.Unmarshal(raw, &s) // cannot fail: raw is a valid string
	return s
}

// boolField decodes the bool field name from its raw value.
func boolField(name string, raw []byte) (bool, error) {
	switch string(raw) {
	case "", "null", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, reqErr(name, name+" must be a boolean")
}

// streamOptions decodes stream_options.include_usage and
// continuous_usage_stats from the raw value of stream_options.
func streamOptions(raw []byte) (include, continuous bool, err error) {
	if len(raw) == 0 || raw[0] == 'n' {
		return false, false, nil
	}
	if raw[0] != '{' {
		return false, false, reqErr("stream_options", "stream_options must be an object")
	}
	var inc, cont []byte
	d := decoder{b: raw}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "include_usage":
			inc = d.value()
		case "continuous_usage_stats":
			cont = d.value()
		default:
			d.skip()
		}
	}
	v, err := boolField("include_usage", inc)
	if err != nil {
		return false, false, reqErr("stream_options.include_usage", "stream_options.include_usage must be a boolean")
	}
	return v, string(cont) == "true", nil
}

// intField decodes the non-negative integer field name from its raw value.
// A number with a zero fraction, such as 100.0 or 1e3, is an integer; one too
// large for int64 saturates.
func intField(name string, raw []byte) (int64, error) {
	if len(raw) == 0 || raw[0] == 'n' {
		return 0, nil
	}
	if raw[0] != '-' && !isDigit(raw[0]) {
		return 0, reqErr(name, name+" must be a non-negative integer")
	}
	d := decoder{b: raw}
	text, integer := d.num()
	if d.bad {
		return 0, reqErr(name, name+" must be a non-negative integer")
	}
	if !integer {
		f, err := strconv.ParseFloat(string(text), 64)
		if err != nil && f < math.MaxInt64 || f != math.Trunc(f) {
			return 0, reqErr(name, name+" must be a non-negative integer")
		}
	}
	v := parseInt(text, integer)
	if v < 0 || v == 0 && text[0] == '-' && !isZero(text) {
		return 0, reqErr(name, name+" must be a non-negative integer")
	}
	return v, nil
}

// isZero reports whether the JSON number text is zero ("-0", "0.0e5").
func isZero(text []byte) bool {
	for _, c := range text {
		if '1' <= c && c <= '9' {
			return false
		}
		if c == 'e' || c == 'E' {
			break
		}
	}
	return true
}

// isBatch reports whether a raw prompt value is an array whose first
// element is a string or an array: a batch of prompts.
func isBatch(raw []byte) bool {
	d := decoder{b: raw}
	if d.peek() != '[' {
		return false
	}
	d.i++
	c := d.peek()
	return c == '"' || c == '['
}
