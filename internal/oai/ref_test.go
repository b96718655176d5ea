package oai

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// This file holds reference implementations built on encoding/json maps
// (exact, case-sensitive keys; last duplicate wins). The tests and fuzz
// targets compare the single-pass decoder against them.

func refObject(raw []byte) (map[string]json.RawMessage, bool) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil, false
	}
	return m, true
}

func refArray(raw []byte) ([]json.RawMessage, bool) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, false
	}
	var a []json.RawMessage
	if json.Unmarshal(raw, &a) != nil {
		return nil, false
	}
	return a, true
}

func refNonEmptyString(raw []byte) bool {
	var s string
	return len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil && s != ""
}

func refInt(raw []byte) int64 {
	if len(raw) == 0 || raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0
	}
	if v, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return v
	}
	f, _ := strconv.ParseFloat(string(raw), 64)
	switch {
	case f >= math.MaxInt64:
		return math.MaxInt64
	case f <= math.MinInt64:
		return math.MinInt64
	}
	return int64(f)
}

func refUsage(raw []byte) (Usage, bool) {
	m, ok := refObject(raw)
	if !ok {
		return Usage{}, false
	}
	u := Usage{
		PromptTokens:     refInt(m["prompt_tokens"]),
		CompletionTokens: refInt(m["completion_tokens"]),
		TotalTokens:      refInt(m["total_tokens"]),
	}
	if d, ok := refObject(m["prompt_tokens_details"]); ok && refIsNum(d["cached_tokens"]) {
		u.CachedTokens, u.HasCached = refInt(d["cached_tokens"]), true
	}
	return u, true
}

// refInspectChunk is InspectChunk written with encoding/json; ok is false
// where InspectChunk must return an error.
func refInspectChunk(data []byte) (c Chunk, ok bool) {
	if !json.Valid(data) {
		return Chunk{}, false
	}
	m, ok := refObject(data)
	if !ok {
		return Chunk{}, false
	}
	if id := m["id"]; len(id) > 0 && id[0] == '"' {
		c.ID = id[1 : len(id)-1]
	}
	choices, _ := refArray(m["choices"])
	c.Choices = len(choices)
	for _, ch := range choices {
		cm, ok := refObject(ch)
		if !ok {
			continue
		}
		if f := cm["finish_reason"]; f != nil && string(f) != "null" {
			c.Finish = true
		}
		if refNonEmptyString(cm["text"]) {
			c.Content = true
		}
		if dm, ok := refObject(cm["delta"]); ok {
			for _, k := range []string{"content", "reasoning_content", "reasoning"} {
				if refNonEmptyString(dm[k]) {
					c.Content = true
				}
			}
			if tc, ok := refArray(dm["tool_calls"]); ok && len(tc) > 0 {
				c.Content = true
			}
		}
	}
	c.Usage, c.HasUsage = refUsage(m["usage"])
	if e := m["error"]; e != nil && string(e) != "null" {
		c.Error = true
	}
	if string(m["object"]) == `"error"` {
		c.Error = true
	}
	return c, true
}

// refContentBytes counts the text bytes of a message content (or a
// preamble) like ParseRequest: a string's raw length, the "text" strings of
// an array's object elements, 0 for anything else.
func refContentBytes(c []byte) int {
	n := 0
	switch {
	case len(c) > 0 && c[0] == '"':
		n += len(c) - 2
	case len(c) > 0 && c[0] == '[':
		parts, _ := refArray(c)
		for _, p := range parts {
			if pm, ok := refObject(p); ok {
				if t := pm["text"]; len(t) > 0 && t[0] == '"' {
					n += len(t) - 2
				}
			}
		}
	}
	return n
}

// refPromptBytes counts prompt bytes like ParseRequest.
func refPromptBytes(kind PromptKind, raw []byte) int {
	if len(raw) == 0 || kind == PromptNone {
		return 0
	}
	if raw[0] == '"' {
		return len(raw) - 2
	}
	elems, ok := refArray(raw)
	if !ok {
		return 0
	}
	n := 0
	for _, e := range elems {
		if kind == PromptMessages {
			if m, ok := refObject(e); ok {
				n += refContentBytes(m["content"])
			}
			continue
		}
		switch {
		case e[0] == '"':
			n += len(e) - 2
		case e[0] == '[':
			a, _ := refArray(e)
			n += tokenBytes * len(a)
		case e[0] == '-' || e[0] >= '0' && e[0] <= '9':
			n += tokenBytes
		}
	}
	return n
}

// refNull reports whether a raw member value is absent or null.
func refNull(raw []byte) bool { return raw == nil || string(raw) == "null" }

// refParseRequest is ParseRequest with encoding/json doing the parsing. It
// shares the per-field rules (stringField, boolField, ...) so that it checks
// the decoder, while the table tests check the rules.
func refParseRequest(s *Schema, body []byte) (Request, error) {
	if s == nil {
		return Request{}, reqErr("", "unsupported operation")
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return Request{}, reqErr("", "request body is empty")
	}
	var v json.RawMessage
	if err := json.Unmarshal(body, &v); err != nil {
		return Request{}, reqErr("", "invalid json: "+err.Error())
	}
	m, ok := refObject(body)
	if !ok {
		return Request{}, reqErr("", "request body must be a json object")
	}
	var r Request
	var err error
	if r.Model, err = stringField("model", m["model"], s.ModelRequired); err != nil {
		return Request{}, err
	}
	if !refNull(m["model"]) {
		r.ModelStart, r.ModelEnd = refMemberSpan(body, "model")
	}
	if s.Prompt != "" {
		raw := m[s.Prompt]
		switch {
		case refNull(raw):
			if s.PromptRequired {
				return Request{}, reqErr(s.Prompt, s.Prompt+" is required")
			}
		case s.PromptNonEmpty:
			if a, ok := refArray(raw); !ok || len(a) == 0 {
				return Request{}, reqErr(s.Prompt, s.Prompt+" must be a non-empty array")
			}
		}
		r.PromptBytes = refPromptBytes(s.PromptKind, raw)
	}
	for _, f := range s.Require {
		if refNull(m[f]) {
			return Request{}, reqErr(f, f+" is required")
		}
	}
	if s.Preamble != "" && (s.Preamble != s.Prompt || s.PromptKind == PromptNone) {
		r.PromptBytes += refContentBytes(m[s.Preamble])
	}
	if s.Generative {
		if r.Stream, err = boolField("stream", m["stream"]); err != nil {
			return Request{}, err
		}
		if r.IncludeUsage, _, err = streamOptions(m["stream_options"]); err != nil {
			return Request{}, err
		}
		if obj, ok := refObject(m["stream_options"]); ok {
			r.ContinuousUsage = string(obj["continuous_usage_stats"]) == "true"
		}
		if _, ok := m["stream"]; ok {
			r.StreamStart, r.StreamEnd = refMemberSpan(body, "stream")
		}
		r.Streamable = refNull(m["prompt_logprobs"]) && refNull(m["kv_transfer_params"])
		r.KVTransfer = !refNull(m["kv_transfer_params"])
		var batch []json.RawMessage
		if json.Unmarshal(m[s.Prompt], &batch) == nil && len(batch) > 0 {
			f := bytes.TrimLeft(batch[0], " \t\r\n")
			r.PromptBatch = len(f) > 0 && (f[0] == '"' || f[0] == '[')
		}
		r.EchoLogprobs = string(m["echo"]) == "true" && !refNull(m["logprobs"])
		r.Sampling = SamplingRaw{Temperature: m["temperature"], TopP: m["top_p"], TopK: m["top_k"], FrequencyPenalty: m["frequency_penalty"],
			PresencePenalty: m["presence_penalty"], Seed: m["seed"], N: m["n"], Stop: m["stop"], StopSequences: m["stop_sequences"], ResponseFormat: m["response_format"]}
		so := m["stream_options"]
		r.HasStreamOptions = !refNull(so)
		if r.HasStreamOptions {
			r.StreamOptionsEnd = refStreamOptionsEnd(body)
			obj, _ := refObject(so)
			r.StreamOptionsEmpty = len(obj) == 0
		}
		var limits [3]int64
		for i, name := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens"} {
			if limits[i], err = intField(name, m[name]); err != nil {
				return Request{}, err
			}
		}
		switch mt, mct, mot := limits[0], limits[1], limits[2]; {
		case mct != 0:
			r.MaxTokens, r.MaxTokensParam = mct, "max_completion_tokens"
		case mt != 0:
			r.MaxTokens, r.MaxTokensParam = mt, "max_tokens"
		case mot != 0:
			r.MaxTokens, r.MaxTokensParam = mot, "max_output_tokens"
		}
	}
	if r.User, err = stringField("user", m["user"], false); err != nil {
		return Request{}, err
	}
	if md, ok := refObject(m["metadata"]); ok {
		if uid := md["user_id"]; !refNull(uid) {
			var id string
			if json.Unmarshal(uid, &id) != nil {
				return Request{}, reqErr("metadata.user_id", "metadata.user_id must be a string")
			}
			if r.User == "" {
				r.User = id
			}
		}
	}
	return r, nil
}

// refStreamOptionsEnd returns the offset of the last byte of the last
// top-level stream_options value in the valid JSON object body.
func refStreamOptionsEnd(body []byte) int {
	_, end := refMemberSpan(body, "stream_options")
	return end - 1
}

// refMemberSpan returns the offsets of the last top-level key value in the
// valid JSON object body, found with encoding/json's token stream; 0, 0
// if there is none.
func refMemberSpan(body []byte, key string) (start, end int) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return -1, -1
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return -1, -1
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return -1, -1
		}
		if tok == key {
			end = int(dec.InputOffset())
			start = end - len(raw)
		}
	}
	return start, end
}

// refParseResponse is ParseResponse written with encoding/json.
func refParseResponse(body []byte) (string, Usage, bool) {
	if !json.Valid(body) {
		return "", Usage{}, false
	}
	m, ok := refObject(body)
	if !ok {
		return "", Usage{}, false
	}
	var id string
	if raw := m["id"]; len(raw) > 0 && raw[0] == '"' {
		_ = json.Unmarshal(raw, &id)
	}
	u, _ := refUsage(m["usage"])
	if um, ok := refObject(m["usage"]); ok {
		if d, ok := refObject(um["input_tokens_details"]); ok && refIsNum(d["cached_tokens"]) {
			u.CachedTokens, u.HasCached = refInt(d["cached_tokens"]), true
		}
		if !refIsNum(um["prompt_tokens"]) && refIsNum(um["input_tokens"]) {
			u.PromptTokens = refInt(um["input_tokens"])
			for _, k := range []string{"cache_read_input_tokens", "cache_creation_input_tokens"} {
				if n := refInt(um[k]); refIsNum(um[k]) && n > 0 {
					u.PromptTokens = satAdd(u.PromptTokens, n)
				}
			}
			if n := refInt(um["cache_read_input_tokens"]); refIsNum(um["cache_read_input_tokens"]) && n >= 0 {
				u.CachedTokens, u.HasCached = n, true
			}
		}
		if !refIsNum(um["completion_tokens"]) && refIsNum(um["output_tokens"]) {
			u.CompletionTokens = refInt(um["output_tokens"])
		}
	}
	return id, u, true
}

func refIsNum(raw []byte) bool {
	return len(raw) > 0 && (raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9')
}

// refCount is Event's token count of a raw value: -1 unless a non-negative
// number.
func refCount(raw []byte) int64 {
	if !refIsNum(raw) {
		return -1
	}
	if v := refInt(raw); v >= 0 {
		return v
	}
	return -1
}

// refTokenUsage is the input and output tokens of a raw usage value.
func refTokenUsage(raw []byte) tokenCounts {
	m, ok := refObject(raw)
	if !ok {
		return noCounts
	}
	u := tokenCounts{in: refCount(m["input_tokens"]), out: refCount(m["output_tokens"]), cached: -1, write: refCount(m["cache_creation_input_tokens"])}
	if _, ok := m["cache_read_input_tokens"]; ok {
		u.cached = refCount(m["cache_read_input_tokens"])
	} else if d, ok := refObject(m["input_tokens_details"]); ok {
		u.cached = refCount(d["cached_tokens"])
	}
	return u
}

// refEventCommon reads what both framings share: the type (raw and
// decoded), the top-level error, and the id and usage of the object
// member obj ("response" or "message").
func refEventCommon(data []byte, obj string) (m map[string]json.RawMessage, e Event, typ string, ok bool) {
	if !json.Valid(data) {
		return nil, Event{}, "", false
	}
	m, ok = refObject(data)
	if !ok {
		return nil, Event{}, "", false
	}
	e = noEvent
	if t := m["type"]; len(t) > 0 && t[0] == '"' {
		e.Type = t[1 : len(t)-1]
		_ = json.Unmarshal(t, &typ)
	}
	if errv := m["error"]; errv != nil && string(errv) != "null" {
		e.Error = true
	}
	if om, ok := refObject(m[obj]); ok {
		if id := om["id"]; len(id) > 0 && id[0] == '"' {
			e.ID = id[1 : len(id)-1]
		}
		u := refTokenUsage(om["usage"])
		e.InputTokens, e.OutputTokens, e.CachedTokens = u.in, u.out, u.cached
		if obj == "message" {
			e.CacheWriteTokens = u.write
		}
	}
	return m, e, typ, true
}

// refInspectResponsesEvent is InspectResponsesEvent written with
// encoding/json; ok is false where it must return an error.
func refInspectResponsesEvent(data []byte) (Event, bool) {
	m, e, typ, ok := refEventCommon(data, "response")
	if !ok {
		return Event{}, false
	}
	e.Content = strings.HasSuffix(typ, ".delta") && refNonEmptyString(m["delta"])
	e.Terminal = typ == "response.completed" || typ == "response.failed" || typ == "response.incomplete"
	e.Error = e.Error || typ == "error" || typ == "response.failed"
	return e, true
}

// refInspectAnthropicEvent is InspectAnthropicEvent written with
// encoding/json.
func refInspectAnthropicEvent(data []byte) (Event, bool) {
	m, e, typ, ok := refEventCommon(data, "message")
	if !ok {
		return Event{}, false
	}
	top := refTokenUsage(m["usage"])
	for _, f := range []struct {
		dst *int64
		v   int64
	}{{&e.InputTokens, top.in}, {&e.OutputTokens, top.out}, {&e.CachedTokens, top.cached}, {&e.CacheWriteTokens, top.write}} {
		if f.v >= 0 {
			*f.dst = f.v
		}
	}
	if dm, ok := refObject(m["delta"]); ok && typ == "content_block_delta" {
		e.Content = refNonEmptyString(dm["text"]) || refNonEmptyString(dm["thinking"]) || refNonEmptyString(dm["partial_json"])
	}
	e.Terminal = typ == "message_stop"
	e.Error = e.Error || typ == "error"
	return e, true
}
