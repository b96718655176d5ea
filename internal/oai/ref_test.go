package oai

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
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
	return Usage{
		PromptTokens:     refInt(m["prompt_tokens"]),
		CompletionTokens: refInt(m["completion_tokens"]),
		TotalTokens:      refInt(m["total_tokens"]),
	}, true
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

// refPromptBytes counts prompt bytes like ParseRequest.
func refPromptBytes(op Operation, raw []byte) int {
	if len(raw) == 0 {
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
		if op == OpChat {
			m, ok := refObject(e)
			if !ok {
				continue
			}
			c := m["content"]
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

// refParseRequest is ParseRequest with encoding/json doing the parsing. It
// shares the per-field rules (stringField, boolField, ...) so that it checks
// the decoder, while the table tests check the rules.
func refParseRequest(op Operation, body []byte) (Request, error) {
	if op < OpChat || op > OpEmbeddings {
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
	if r.Model, err = stringField("model", m["model"], true); err != nil {
		return Request{}, err
	}
	required := m[requiredField(op)]
	if err := checkRequired(op, required); err != nil {
		return Request{}, err
	}
	r.PromptBytes = refPromptBytes(op, required)
	if op != OpEmbeddings {
		if r.Stream, err = boolField("stream", m["stream"]); err != nil {
			return Request{}, err
		}
		if r.IncludeUsage, _, err = streamOptions(m["stream_options"]); err != nil {
			return Request{}, err
		}
		if obj, ok := refObject(m["stream_options"]); ok {
			r.ContinuousUsage = string(obj["continuous_usage_stats"]) == "true"
		}
		so := m["stream_options"]
		r.HasStreamOptions = len(so) > 0 && string(so) != "null"
		if r.HasStreamOptions {
			r.StreamOptionsEnd = refStreamOptionsEnd(body)
			obj, _ := refObject(so)
			r.StreamOptionsEmpty = len(obj) == 0
		}
		mt, err := intField("max_tokens", m["max_tokens"])
		if err != nil {
			return Request{}, err
		}
		mct, err := intField("max_completion_tokens", m["max_completion_tokens"])
		if err != nil {
			return Request{}, err
		}
		r.MaxTokens = mt
		if mct != 0 {
			r.MaxTokens = mct
		}
	}
	if r.User, err = stringField("user", m["user"], false); err != nil {
		return Request{}, err
	}
	return r, nil
}

// refStreamOptionsEnd returns the offset of the last byte of the last
// top-level stream_options value in the valid JSON object body, found with
// encoding/json's token stream.
func refStreamOptionsEnd(body []byte) int {
	dec := json.NewDecoder(bytes.NewReader(body))
	if _, err := dec.Token(); err != nil {
		return -1
	}
	end := -1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return -1
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return -1
		}
		if tok == "stream_options" {
			end = int(dec.InputOffset()) - 1
		}
	}
	return end
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
	return id, u, true
}
