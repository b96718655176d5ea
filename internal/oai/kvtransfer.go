package oai

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// ErrNotObject is the error of [PrefillBody] and [DecodeBody] for a body
// (or kv_transfer_params value) that is not valid JSON or not a JSON
// object.
var ErrNotObject = errors.New("oai: not a json object")

// prefillParams is the kv_transfer_params of a prefill leg: vLLM's
// NixlConnector computes the prompt's KV blocks, keeps them for a remote
// decode and answers with the parameters the decode leg pulls them with
// (vLLM tests/v1/kv_connector/nixl_integration/toy_proxy_server.py).
const prefillParams = `{"do_remote_decode":true,"do_remote_prefill":false}`

// memberEdit is what editObject does with one top-level member.
type memberEdit uint8

const (
	keepMember memberEdit = iota // copy it unchanged
	dropMember                   // remove it with one separating comma
	setOne                       // replace its value with 1
)

// editObject copies the JSON object body to a new slice with the edits
// that edit chooses for each top-level member (by its name, escapes
// decoded), and returns it split at the point where members can be added:
// head ends just after the last member's value (or the opening brace's
// white space of an empty object) and tail is the rest (white space and the
// closing brace). comma says whether head ends with a member, so that an
// added member needs a separating comma. head has capacity for len(tail)
// plus extra bytes more.
//
// Every byte not edited is copied as the client wrote it: key order,
// spacing and number spelling. A dropped member takes one separating comma
// with it (the one before it, or the one after it when no member before it
// is kept), so the result is valid JSON. Nested values are never edited.
// err wraps ErrNotObject when body is not valid JSON or not an object.
func editObject(body []byte, extra int, edit func(key []byte) memberEdit) (head, tail []byte, comma bool, err error) {
	d := decoder{b: body}
	if !d.open('{') {
		return nil, nil, false, fmt.Errorf("%w: body", ErrNotObject)
	}
	head = make([]byte, 0, len(body)+extra)
	from := 0        // body[:from] is copied to head or skipped
	prevEnd := 0     // end of the previous member's value
	skipSep := false // a leading member was dropped: skip up to the next key
	insert := -1
	n := 0
	for d.more('}', &n) {
		d.peek()
		ks := d.i
		if skipSep {
			from, skipSep = ks, false
		}
		e := edit(d.key())
		d.peek()
		vs := d.i
		d.skip()
		ve := d.i
		if d.bad {
			break
		}
		switch e {
		case keepMember:
			comma = true
		case setOne:
			head = append(head, body[from:vs]...)
			head = append(head, '1')
			from, comma = ve, true
		case dropMember:
			if comma { // drop the comma before it: [prevEnd, ve)
				head = append(head, body[from:prevEnd]...)
			} else { // drop [ks, next key) or [ks, ve) when it is last
				head = append(head, body[from:ks]...)
				skipSep = true
			}
			from = ve
		}
		prevEnd, insert = ve, ve
	}
	if insert < 0 && !d.bad { // empty object: before the closing brace
		insert = d.i - 1
	}
	d.end()
	if d.bad {
		return nil, nil, false, fmt.Errorf("%w: body", ErrNotObject)
	}
	head = append(head, body[from:insert]...)
	return head, body[insert:], comma, nil
}

// PrefillBody returns the body of the prefill leg of a disaggregated
// request (vLLM's NixlConnector contract, as in vLLM's
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py and the llm-d
// routing sidecar): the client's chat completions or completions body with
// these top-level edits, so that the prefill engine computes the prompt's
// KV cache, generates one token and keeps the blocks for the decode engine:
//
//   - every "stream" and "stream_options" member is removed and
//     "stream":false added;
//   - the value of every "max_tokens" and "max_completion_tokens" member
//     present (whatever it is, null included) becomes 1; when neither is
//     present, "max_tokens":1 is added;
//   - every "min_tokens" member is removed (vLLM rejects min_tokens greater
//     than max_tokens);
//   - every "kv_transfer_params" member is removed and
//     "kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}
//     added.
//
// Added members go at the end, in that order, after the last member and
// before the white space and closing brace. Every other byte is the
// client's (key order, spacing, numbers); nested values are never
// touched, and keys match after decoding escapes, as the engine's parser
// reads them. The result is a new slice. The error wraps [ErrNotObject]
// when body is not valid JSON or not an object. Safe for concurrent use.
func PrefillBody(body []byte) ([]byte, error) {
	const (
		addStream = `"stream":false`
		addMax    = `"max_tokens":1`
		addParams = `"kv_transfer_params":` + prefillParams
	)
	hasMax := false
	head, tail, comma, err := editObject(body, len(addStream)+len(addMax)+len(addParams)+3, func(key []byte) memberEdit {
		switch string(key) {
		case "stream", "stream_options", "min_tokens", "kv_transfer_params":
			return dropMember
		case "max_tokens", "max_completion_tokens":
			hasMax = true
			return setOne
		}
		return keepMember
	})
	if err != nil {
		return nil, err
	}
	if comma {
		head = append(head, ',')
	}
	head = append(head, addStream...)
	if !hasMax {
		head = append(head, ',')
		head = append(head, addMax...)
	}
	head = append(head, ',')
	head = append(head, addParams...)
	return append(head, tail...), nil
}

// DecodeBody returns the body of the decode leg of a disaggregated
// request: body (the gateway's outgoing body for the client's request)
// with every top-level "kv_transfer_params" member removed and
// "kv_transfer_params":<params> added as the last member, params being the
// prefill engine's answer (see [ParsePrefill]) copied byte for byte. Every
// other byte of body is kept, as [PrefillBody] keeps it. The result is a
// new slice. The error wraps [ErrNotObject] when body or params is not
// valid JSON or not an object. Safe for concurrent use.
func DecodeBody(body, params []byte) ([]byte, error) {
	p := decoder{b: params}
	if p.peek() != '{' {
		return nil, fmt.Errorf("%w: kv_transfer_params", ErrNotObject)
	}
	p.skip()
	p.end()
	if p.bad {
		return nil, fmt.Errorf("%w: kv_transfer_params", ErrNotObject)
	}
	const key = `"kv_transfer_params":`
	head, tail, comma, err := editObject(body, len(key)+len(params)+1, func(k []byte) memberEdit {
		if string(k) == "kv_transfer_params" {
			return dropMember
		}
		return keepMember
	})
	if err != nil {
		return nil, err
	}
	if comma {
		head = append(head, ',')
	}
	head = append(head, key...)
	head = append(head, params...)
	return append(head, tail...), nil
}

// Prefill is what [ParsePrefill] reads from a prefill leg's non-streaming
// response.
type Prefill struct {
	// Params is the raw top-level "kv_transfer_params" value when it is a
	// JSON object (aliasing the body; copy it to keep it past the body's
	// lifetime), for [DecodeBody]; nil when it is absent, null or not an
	// object. vLLM's NixlConnector answers with the remote engine id,
	// block ids, host and port the decode engine pulls the KV cache from.
	Params []byte
	// PromptTokens is usage.prompt_tokens: 0 when usage or the field is
	// absent or not a number; fractions are truncated and values too large
	// saturate.
	PromptTokens int64
	// CachedTokens is usage.prompt_tokens_details.cached_tokens (the
	// prompt tokens the prefill engine found in its prefix cache) and
	// HasCached says it is a number; prompt_tokens_details may be null or
	// absent (vLLM writes it only with a non-zero count).
	CachedTokens int64
	HasCached    bool
}

// ParsePrefill reads a prefill leg's non-streaming response body (a chat
// completion or completion that [PrefillBody] asked for); ok=false when
// the body is not valid JSON or not an object. For duplicate keys, at any
// level, the last one wins, as in the engines' parsers. It allocates
// nothing for a body without escaped keys. Safe for concurrent use.
func ParsePrefill(body []byte) (p Prefill, ok bool) {
	d := decoder{b: body}
	if !d.open('{') {
		return Prefill{}, false
	}
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "kv_transfer_params":
			p.Params = nil
			if d.peek() == '{' {
				p.Params = d.value()
			} else {
				d.skip()
			}
		case "usage":
			p.PromptTokens, p.CachedTokens, p.HasCached = d.prefillUsage()
		default:
			d.skip()
		}
	}
	d.end()
	if d.bad {
		return Prefill{}, false
	}
	return p, true
}

// prefillUsage reads a usage value: prompt_tokens and
// prompt_tokens_details.cached_tokens, zero when usage is not an object.
func (d *decoder) prefillUsage() (prompt, cached int64, hasCached bool) {
	if d.peek() != '{' {
		d.skip()
		return 0, 0, false
	}
	d.open('{')
	for n := 0; d.more('}', &n); {
		switch string(d.key()) {
		case "prompt_tokens":
			prompt, _ = d.int()
		case "prompt_tokens_details":
			cached, _, _, hasCached = d.cachedTokens()
		default:
			d.skip()
		}
	}
	return prompt, cached, hasCached
}

// cachedTokens reads a prompt_tokens_details value: the last
// cached_tokens member's value and its span in the input, ok when that
// member is a number (a fraction truncated, saturating); ok is false when
// the value is not an object or its last cached_tokens is not a number.
func (d *decoder) cachedTokens() (v int64, start, end int, ok bool) {
	if d.peek() != '{' {
		d.skip()
		return 0, 0, 0, false
	}
	d.open('{')
	for k := 0; d.more('}', &k); {
		if string(d.key()) != "cached_tokens" {
			d.skip()
			continue
		}
		d.peek()
		start = d.i
		v, ok = d.int()
		end = d.i
	}
	return v, start, end, ok
}

// cachedTokensKey is SetCachedTokens' precheck.
var cachedTokensKey = []byte("cached_tokens")

// SetCachedTokens rewrites the value of the top-level
// usage.prompt_tokens_details.cached_tokens member of data (a streamed
// chunk's data or a whole response body, a JSON object) to cached,
// appends the result to dst (which may be nil) and returns it, with was,
// the value it replaced (a fraction truncated, saturating). Every other
// byte of data is copied unchanged.
//
// ok=false, and out is dst unchanged, when data is not valid JSON or not
// an object, or has no such numeric member (usage, or its
// prompt_tokens_details, null, absent or not an object; cached_tokens
// absent or not a number): the caller then forwards data as it is. For
// duplicate keys, at every level, the last one is edited (the one JSON
// parsers keep), and ok says whether that one is a number.
//
// A cheap byte search for "cached_tokens" runs first, so that the chunks
// of a stream without it (all but the final usage chunk) cost next to
// nothing; a key spelled with escape sequences, which engines never write,
// is therefore not found. It does not allocate when dst has the capacity
// (BenchmarkSetCachedTokens). Safe for concurrent use.
func SetCachedTokens(dst, data []byte, cached int64) (out []byte, was int64, ok bool) {
	if !bytes.Contains(data, cachedTokensKey) {
		return dst, 0, false
	}
	d := decoder{b: data}
	if !d.open('{') {
		return dst, 0, false
	}
	vs, ve := -1, -1
	for n := 0; d.more('}', &n); {
		if string(d.key()) != "usage" {
			d.skip()
			continue
		}
		vs, ve = -1, -1 // the last usage wins
		if d.peek() != '{' {
			d.skip()
			continue
		}
		d.open('{')
		for m := 0; d.more('}', &m); {
			if string(d.key()) != "prompt_tokens_details" {
				d.skip()
				continue
			}
			vs, ve = -1, -1
			if v, start, end, ok := d.cachedTokens(); ok {
				vs, ve, was = start, end, v
			}
		}
	}
	d.end()
	if d.bad || vs < 0 {
		return dst, 0, false
	}
	out = append(dst, data[:vs]...)
	out = strconv.AppendInt(out, cached, 10)
	return append(out, data[ve:]...), was, true
}
