package oai

import (
	"hash/fnv"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// refHashes computes PrefixHashes from the canonical stream written out in
// full, straight from the definition in the Parser doc comment, for a
// schema without a preamble.
func refHashes(model string, stream []byte, blockBytes, maxBlocks int) []uint64 {
	return refHashesPreamble(model, nil, stream, blockBytes, maxBlocks)
}

// refHashesPreamble is refHashes with the raw value of the preamble field
// (nil when absent).
func refHashesPreamble(model string, preamble, stream []byte, blockBytes, maxBlocks int) []uint64 {
	var out []uint64
	var prev uint64
	for i := 0; i+blockBytes <= len(stream) && (maxBlocks <= 0 || len(out) < maxBlocks); i += blockBytes {
		d := xxhash.NewWithSeed(prev)
		d.Write(stream[i : i+blockBytes])
		prev = d.Sum64()
		out = append(out, prev)
	}
	f := fnv.New64a()
	f.Write([]byte(model))
	m := stablehash.Mix64(f.Sum64())
	var pre uint64
	if len(preamble) > 0 && string(preamble) != "null" {
		if preamble[0] == '"' {
			preamble = preamble[1 : len(preamble)-1]
		}
		pre = xxhash.Sum64(preamble)
	}
	for i := range out {
		out[i] = stablehash.Mix64(out[i] ^ m ^ pre)
	}
	return out
}

// refStream builds the canonical stream of a raw prompt field of kind with
// encoding/json (exact keys, last duplicate wins), for the fuzz target.
func refStream(kind PromptKind, raw []byte) []byte {
	if kind == PromptInput || kind == PromptNone || len(raw) == 0 {
		return nil
	}
	if raw[0] == '"' {
		return raw[1 : len(raw)-1]
	}
	elems, ok := refArray(raw)
	if !ok {
		return nil
	}
	isNum := func(e []byte) bool { return e[0] == '-' || e[0] >= '0' && e[0] <= '9' }
	var out []byte
	for _, e := range elems {
		if kind == PromptMessages {
			m, ok := refObject(e)
			if !ok {
				continue
			}
			out = append(out, stringContents(m["role"])...)
			out = append(out, 0)
			if c := m["content"]; len(c) > 0 && c[0] == '[' {
				out = append(out, c...)
			} else {
				out = append(out, stringContents(c)...)
			}
			if tc := m["tool_calls"]; len(tc) > 0 && tc[0] == '[' {
				out = append(out, 0)
				out = append(out, tc...)
			}
			out = append(out, 1)
			continue
		}
		switch {
		case e[0] == '"':
			out = append(out, e[1:len(e)-1]...)
			out = append(out, 0)
		case e[0] == '[':
			ids, _ := refArray(e)
			for _, id := range ids {
				if isNum(id) {
					out = append(out, id...)
					out = append(out, 2)
				}
			}
			out = append(out, 1)
		case isNum(e):
			out = append(out, e...)
			out = append(out, 2)
		}
	}
	return out
}

// refParse is Parser.Parse built on refParseRequest and refStream.
func refParse(p Parser, s *Schema, body []byte) (Request, error) {
	r, err := refParseRequest(s, body)
	if err != nil || p.BlockBytes <= 0 || s.Prompt == "" {
		return r, err
	}
	m, _ := refObject(body)
	var preamble []byte
	if s.Preamble != "" {
		preamble = m[s.Preamble]
	}
	if h := refHashesPreamble(r.Model, preamble, refStream(s.PromptKind, m[s.Prompt]), p.BlockBytes, p.MaxBlocks); len(h) > 0 {
		r.PrefixHashes = h
	}
	return r, nil
}

// sharedPrefix returns how many leading hashes a and b have in common.
func sharedPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func mustParse(t *testing.T, p Parser, s *Schema, body string) Request {
	t.Helper()
	r, err := p.Parse(s, []byte(body))
	if err != nil {
		t.Fatalf("Parse(%s) error = %v", body, err)
	}
	return r
}

// TestPrefixHashesStream checks the hashes of hand-built bodies against the
// canonical stream written out by hand, and their count against
// floor(len(stream)/BlockBytes).
func TestPrefixHashesStream(t *testing.T) {
	p := Parser{BlockBytes: 8}
	tests := []struct {
		name   string
		s      *Schema
		body   string
		stream string
	}{
		{"chat", SchemaChat,
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]}`,
			"system\x00Be brief.\x01user\x00Hi there\x01"},
		{"chat keys in any order, other keys ignored", SchemaChat,
			`{"messages":[{"content":"Be brief.","name":"x","role":"system"},{"role":"user","content":"Hi there"}],"temperature":1,"model":"m"}`,
			"system\x00Be brief.\x01user\x00Hi there\x01"},
		{"escapes kept as written", SchemaChat,
			`{"model":"m","messages":[{"role":"user","content":"caf\u00e9 \"ok\"\n"}]}`,
			`user` + "\x00" + `caf\u00e9 \"ok\"\n` + "\x01"},
		{"content parts as raw bytes", SchemaChat,
			`{"model":"m","messages":[{"role":"user","content":[ {"type":"text","text":"look"}, {"type":"image_url","image_url":{"url":"data:x"}} ]}]}`,
			"user\x00" + `[ {"type":"text","text":"look"}, {"type":"image_url","image_url":{"url":"data:x"}} ]` + "\x01"},
		{"tool_calls raw bytes, null content", SchemaChat,
			`{"model":"m","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
			"user\x00weather?\x01assistant\x00\x00" + `[{"id":"c1","function":{"name":"w","arguments":"{}"}}]` + "\x01tool\x00sunny\x01"},
		{"last duplicate wins", SchemaChat,
			`{"model":"m","messages":[{"role":"system","content":"old text","role":"user","content":"new text"}]}`,
			"user\x00new text\x01"},
		{"odd elements and values", SchemaChat,
			`{"model":"m","messages":[1,"x",{"role":7,"content":{"a":1}},{},{"role":"user","content":"0123456789","tool_calls":null}]}`,
			"\x00\x01\x00\x01user\x000123456789\x01"},
		{"completion string", SchemaCompletion,
			`{"model":"m","prompt":"Once upon a time, in a land far away","max_tokens":5}`,
			"Once upon a time, in a land far away"},
		{"completion strings", SchemaCompletion,
			`{"model":"m","prompt":["Once upon a time,","in a land"]}`,
			"Once upon a time,\x00in a land\x00"},
		{"completion token ids", SchemaCompletion,
			`{"model":"m","prompt":[101, 2023,-1 ,7,1e3,9]}`,
			"101\x022023\x02-1\x027\x021e3\x029\x02"},
		{"completion token id batches and odd elements", SchemaCompletion,
			`{"model":"m","prompt":[[101,2023,"x"],[7,8],null,true,{"a":1},[]]}`,
			"101\x022023\x02\x017\x028\x02\x01\x01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustParse(t, p, tt.s, tt.body)
			if want := len(tt.stream) / p.BlockBytes; len(r.PrefixHashes) != want {
				t.Errorf("%d hashes, want floor(%d/%d) = %d", len(r.PrefixHashes), len(tt.stream), p.BlockBytes, want)
			}
			if want := refHashes("m", []byte(tt.stream), p.BlockBytes, 0); !slices.Equal(r.PrefixHashes, want) {
				t.Errorf("hashes = %x, want %x (stream %q)", r.PrefixHashes, want, tt.stream)
			}
			m, _ := refObject([]byte(tt.body))
			if got := refStream(tt.s.PromptKind, m[tt.s.Prompt]); string(got) != tt.stream {
				t.Errorf("refStream = %q, want %q", got, tt.stream)
			}
			// A block size of 1 makes the count the stream's length.
			if n := len(mustParse(t, Parser{BlockBytes: 1}, tt.s, tt.body).PrefixHashes); n != len(tt.stream) {
				t.Errorf("with 1-byte blocks: %d hashes, want %d", n, len(tt.stream))
			}
		})
	}
}

// TestPrefixHashesNone: no hashes, and no allocation for them, when hashing
// is off, for embeddings, and for a stream shorter than one block.
func TestPrefixHashesNone(t *testing.T) {
	long := strings.Repeat("a long input ", 100)
	for _, tc := range []struct {
		name string
		p    Parser
		s    *Schema
		body string
	}{
		{"hashing off", Parser{MaxBlocks: 4}, SchemaChat, `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`},
		{"negative block size", Parser{BlockBytes: -1}, SchemaCompletion, `{"model":"m","prompt":"` + long + `"}`},
		{"embeddings", Parser{BlockBytes: 4}, SchemaEmbeddings, `{"model":"m","input":"` + long + `"}`},
		{"embeddings array", Parser{BlockBytes: 4}, SchemaEmbeddings, `{"model":"m","input":["` + long + `"]}`},
		{"chat shorter than one block", Parser{BlockBytes: 16}, SchemaChat, `{"model":"m","messages":[{"role":"user","content":"012345678"}]}`}, // "user\x00012345678\x01": 15 bytes
		{"completion shorter than one block", Parser{BlockBytes: 16}, SchemaCompletion, `{"model":"m","prompt":"0123456789abcde"}`},
		{"empty prompt", Parser{BlockBytes: 1}, SchemaCompletion, `{"model":"m","prompt":""}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			r, err := tc.p.Parse(tc.s, body)
			if err != nil || r.PrefixHashes != nil {
				t.Fatalf("Parse() = %x, %v; want nil hashes", r.PrefixHashes, err)
			}
			want, _ := ParseRequest(tc.s, body)
			if !reflect.DeepEqual(r, want) {
				t.Errorf("Parse() = %+v, ParseRequest() = %+v", r, want)
			}
			if n := testing.AllocsPerRun(20, func() { _, _ = tc.p.Parse(tc.s, body) }); n > 1 {
				t.Errorf("%v allocations, want 1 (the model)", n)
			}
		})
	}
	// One byte more than in the short chat case above: exactly one block.
	r := mustParse(t, Parser{BlockBytes: 16}, SchemaChat, `{"model":"m","messages":[{"role":"user","content":"0123456789"}]}`)
	if len(r.PrefixHashes) != 1 {
		t.Errorf("a 16-byte stream with 16-byte blocks: %d hashes, want 1", len(r.PrefixHashes))
	}
}

// TestPrefixHashesSharedPrefix: two conversations that share a system
// prompt and first turn share exactly the blocks that lie inside that
// common stream, then differ at every later block.
func TestPrefixHashesSharedPrefix(t *testing.T) {
	const (
		system = "You are the support assistant for the Switchboard gateway. Answer briefly and cite the operator guide."
		turn1  = "Why did time to first token double after we added an engine?"
		answer = "Compare the per-engine histograms first; a cold engine has an empty prefix cache."
	)
	p := Parser{BlockBytes: 16}
	msgs := `{"role":"system","content":"` + system + `"},{"role":"user","content":"` + turn1 + `"}`
	a := mustParse(t, p, SchemaChat, `{"model":"llama","messages":[`+msgs+`,{"role":"assistant","content":"`+answer+`"}]}`)
	b := mustParse(t, p, SchemaChat, `{"model":"llama","stream":true,"messages":[`+msgs+`,{"role":"user","content":"`+answer+`"}]}`)

	common := len("system\x00" + system + "\x01user\x00" + turn1 + "\x01") // then "assistant" vs "user": differs at once
	k := common / p.BlockBytes
	total := common + len("assistant\x00"+answer+"\x01")
	if len(a.PrefixHashes) != total/p.BlockBytes {
		t.Fatalf("a: %d hashes, want %d", len(a.PrefixHashes), total/p.BlockBytes)
	}
	if got := sharedPrefix(a.PrefixHashes, b.PrefixHashes); got != k || k == 0 {
		t.Fatalf("shared %d leading hashes, want %d", got, k)
	}
	for i := k; i < min(len(a.PrefixHashes), len(b.PrefixHashes)); i++ {
		if a.PrefixHashes[i] == b.PrefixHashes[i] {
			t.Errorf("hash %d is shared after the prompts diverged at block %d", i, k)
		}
	}
	// A third conversation that continues a's: all of a's hashes are its
	// prefix (a's trailing partial block is not hashed, so it can grow).
	c := mustParse(t, p, SchemaChat, `{"model":"llama","messages":[`+msgs+`,{"role":"assistant","content":"`+answer+`"},{"role":"user","content":"Thanks, that was it."}]}`)
	if got := sharedPrefix(a.PrefixHashes, c.PrefixHashes); got != len(a.PrefixHashes) || len(c.PrefixHashes) <= got {
		t.Errorf("continuation shares %d of a's %d hashes and has %d", got, len(a.PrefixHashes), len(c.PrefixHashes))
	}
}

// TestPrefixHashesIdentity: what does and does not change the hashes.
func TestPrefixHashesIdentity(t *testing.T) {
	p := Parser{BlockBytes: 16}
	content := "Summarize the attached incident report in three bullet points for the on-call channel."
	chat := func(model, role string) string {
		return `{"model":"` + model + `","messages":[{"role":"` + role + `","content":"` + content + `"}]}`
	}
	base := mustParse(t, p, SchemaChat, chat("llama", "user"))
	if len(base.PrefixHashes) != len("user\x00"+content+"\x01")/16 {
		t.Fatalf("%d hashes", len(base.PrefixHashes))
	}

	same := []string{
		`{"messages":[{"content":"` + content + `","role":"user"}],"model":"llama"}`,
		`{"model":"llama","temperature":0.1,"messages":[{"name":"bob","content":"` + content + `","role":"user"}],"stream":true,"max_tokens":9}`,
		"{\n  \"model\": \"llam\\u0061\",\n  \"messages\": [ { \"role\" : \"user\" , \"content\" : \"" + content + "\" } ]\n}",
	}
	for _, body := range same {
		if got := mustParse(t, p, SchemaChat, body); !slices.Equal(got.PrefixHashes, base.PrefixHashes) {
			t.Errorf("%s: hashes differ from %s", body, chat("llama", "user"))
		}
	}

	for _, tc := range []struct {
		body    string
		sameLen bool
	}{
		{chat("llama-2", "user"), true}, // another model
		{chat("llama", "system"), false},
		{chat("llama", "resu"), true}, // same length, same content, another role
	} {
		got := mustParse(t, p, SchemaChat, tc.body).PrefixHashes
		if tc.sameLen && len(got) != len(base.PrefixHashes) {
			t.Fatalf("%s: %d hashes, want %d", tc.body, len(got), len(base.PrefixHashes))
		}
		for i, h := range got {
			if slices.Contains(base.PrefixHashes, h) {
				t.Errorf("%s: hash %d also occurs for %s", tc.body, i, chat("llama", "user"))
			}
		}
	}
}

// TestPrefixHashesChain: changing one byte of block k changes hashes k and
// after, never those before.
func TestPrefixHashesChain(t *testing.T) {
	const blocks, size = 10, 16
	prompt := []byte(strings.Repeat("0123456789abcdef", blocks))
	body := func(prompt []byte) string { return `{"model":"m","prompt":"` + string(prompt) + `"}` }
	p := Parser{BlockBytes: size}
	base := mustParse(t, p, SchemaCompletion, body(prompt)).PrefixHashes
	if want := refHashes("m", prompt, size, 0); !slices.Equal(base, want) || len(base) != blocks {
		t.Fatalf("hashes = %x, want %d: %x", base, blocks, want)
	}
	for k := range blocks {
		for _, off := range []int{0, size / 2, size - 1} {
			changed := slices.Clone(prompt)
			changed[k*size+off] = 'x'
			got := mustParse(t, p, SchemaCompletion, body(changed)).PrefixHashes
			if n := sharedPrefix(base, got); n != k || len(got) != blocks {
				t.Errorf("byte %d changed: %d hashes, %d shared; want %d, %d", k*size+off, len(got), n, blocks, k)
			}
			for i := k; i < blocks; i++ {
				if got[i] == base[i] {
					t.Errorf("byte %d changed: hash %d unchanged", k*size+off, i)
				}
			}
		}
	}
}

// TestPrefixHashesMaxBlocks: MaxBlocks caps the count; the hashes are the
// uncapped ones' prefix, and the slice is allocated at the capped size.
func TestPrefixHashesMaxBlocks(t *testing.T) {
	body := `{"model":"m","prompt":"` + strings.Repeat("0123456789abcdef", 10) + `"}`
	all := mustParse(t, Parser{BlockBytes: 16}, SchemaCompletion, body).PrefixHashes
	for _, limit := range []int{-1, 0, 1, 3, 9, 10, 11, 1000} {
		got := mustParse(t, Parser{BlockBytes: 16, MaxBlocks: limit}, SchemaCompletion, body).PrefixHashes
		want := all
		if limit > 0 && limit < len(all) {
			want = all[:limit]
		}
		if !slices.Equal(got, want) {
			t.Errorf("MaxBlocks %d: %d hashes %x, want %d %x", limit, len(got), got, len(want), want)
		}
		if wantCap := min(len(body)/16, limit); limit > 0 && cap(got) != wantCap {
			t.Errorf("MaxBlocks %d: capacity %d, want %d", limit, cap(got), wantCap)
		}
	}
}

// TestPrefixHashesCompletionForms: a prompt string and the same text as a
// one-element array share their full blocks; token ids are not text.
func TestPrefixHashesCompletionForms(t *testing.T) {
	p := Parser{BlockBytes: 4}
	str := mustParse(t, p, SchemaCompletion, `{"model":"m","prompt":"abcdefghij"}`).PrefixHashes   // abcd efgh (ij)
	arr := mustParse(t, p, SchemaCompletion, `{"model":"m","prompt":["abcdefghij"]}`).PrefixHashes // abcd efgh (ij\0)
	if len(str) != 2 || !slices.Equal(str, arr) {
		t.Errorf("string %x, one-element array %x; want the same 2 hashes", str, arr)
	}
	ids := mustParse(t, p, SchemaCompletion, `{"model":"m","prompt":[1,2,3,4]}`).PrefixHashes         // 1\x022\x02 3\x024\x02
	txt := mustParse(t, p, SchemaCompletion, `{"model":"m","prompt":["1","2","3","4"]}`).PrefixHashes // 1\x002\x00 3\x004\x00
	if len(ids) != 2 || len(txt) != 2 || sharedPrefix(ids, txt) != 0 {
		t.Errorf("token ids %x, strings %x; want 2 hashes each, none shared", ids, txt)
	}
	batch := mustParse(t, p, SchemaCompletion, `{"model":"m","prompt":[[1,2,3,4]]}`).PrefixHashes
	if !slices.Equal(batch, ids) {
		t.Errorf("batch of one %x, want the flat ids' %x", batch, ids)
	}
}

// TestPrefixHashesGolden pins the hash values: replicas and versions must
// agree on them (see Parser). If this fails, the stream or the hash changed.
func TestPrefixHashesGolden(t *testing.T) {
	p := Parser{BlockBytes: 16}
	chat := mustParse(t, p, SchemaChat, // "system\x00You are a helpful assistant.\x01user\x00What is a KV cache?\x01": 61 bytes
		`{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is a KV cache?"}]}`)
	if want := []uint64{0x5dff62d7e336ffd, 0x2f5d2653ceea8c68, 0x70e15b72febffe24}; !slices.Equal(chat.PrefixHashes, want) {
		t.Errorf("chat hashes = %#x, want %#x", chat.PrefixHashes, want)
	}
	completion := mustParse(t, p, SchemaCompletion, `{"model":"m","prompt":"0123456789abcdef0123456789abcdef"}`)
	if want := []uint64{0xb50505a856dcef90, 0x2d4900a113b8a5c8}; !slices.Equal(completion.PrefixHashes, want) {
		t.Errorf("completion hashes = %#x, want %#x", completion.PrefixHashes, want)
	}
	f := fnv.New64a()
	f.Write([]byte("m"))
	if got, want := stablehash.String("m"), stablehash.Mix64(f.Sum64()); got != want {
		t.Errorf("stablehash.String(m) = %#x, want stablehash.Mix64(FNV-1a 64) = %#x", got, want)
	}
}

// TestParseAllocs: hashing costs one allocation, the hashes' slice, sized
// so that it never grows.
func TestParseAllocs(t *testing.T) {
	body := []byte(longChatBody)
	p := Parser{BlockBytes: 64, MaxBlocks: 256}
	r, err := p.Parse(SchemaChat, body)
	if err != nil || len(r.PrefixHashes) < 60 {
		t.Fatalf("Parse() = %d hashes, %v", len(r.PrefixHashes), err)
	}
	if cap(r.PrefixHashes) != len(body)/64 {
		t.Errorf("capacity %d, want %d", cap(r.PrefixHashes), len(body)/64)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := p.Parse(SchemaChat, body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 { // Model, User and PrefixHashes
		t.Errorf("Parse allocations = %v, want <= 3", allocs)
	}
}

// TestPrefixHashesDuplicateKey: with the prompt key twice, the engine reads
// the last one, and so do the hashes.
func TestPrefixHashesDuplicateKey(t *testing.T) {
	p := Parser{BlockBytes: 16}
	msgs := func(s string) string { return `[{"role":"user","content":"` + s + `"}]` }
	a, b := strings.Repeat("first prompt ", 8), strings.Repeat("second prompt ", 6)
	dup := mustParse(t, p, SchemaChat, `{"model":"m","messages":`+msgs(a)+`,"messages":`+msgs(b)+`}`)
	last := mustParse(t, p, SchemaChat, `{"model":"m","messages":`+msgs(b)+`}`)
	if !slices.Equal(dup.PrefixHashes, last.PrefixHashes) || len(last.PrefixHashes) == 0 {
		t.Fatalf("duplicate messages: hashes %x, want the last array's %x", dup.PrefixHashes, last.PrefixHashes)
	}
}

// TestPrefixHashesPreamble: a schema's preamble (Anthropic's system,
// Responses' instructions) seeds the hashes as the Parser doc defines,
// wherever it is in the body; without one they are chat's.
func TestPrefixHashesPreamble(t *testing.T) {
	p := Parser{BlockBytes: 16}
	msgs := `"messages":[{"role":"user","content":"Summarize the incident report in three bullet points."}]`
	stream := "user\x00Summarize the incident report in three bullet points.\x01"
	hash := func(body string) []uint64 { return mustParse(t, p, SchemaMessages, body).PrefixHashes }

	// The definition, term by term.
	got := hash(`{"model":"m","system":"Be terse.",` + msgs + `}`)
	chain := refHashes("m", []byte(stream), 16, 0) // Mix64(c_i ^ String(m))
	if len(got) != len(stream)/16 || len(got) != len(chain) {
		t.Fatalf("%d hashes, want %d", len(got), len(stream)/16)
	}
	pre := xxhash.Sum64String("Be terse.")
	var prev uint64 // c_{i-1}
	for i := range got {
		d := xxhash.NewWithSeed(prev)
		d.WriteString(stream[i*16 : (i+1)*16])
		prev = d.Sum64()
		if want := stablehash.Mix64(prev ^ stablehash.String("m") ^ pre); got[i] != want {
			t.Errorf("hash %d = %#x, want Mix64(c_i ^ String(model) ^ XXH64(system)) = %#x", i, got[i], want)
		}
	}

	same := []string{
		`{` + msgs + `,"system":"Be terse.","model":"m"}`, // preamble after the prompt
		`{"model":"m","system":"old","system":"Be terse.",` + msgs + `,"max_tokens":9,"stream":true}`,
	}
	for _, body := range same {
		if h := hash(body); !slices.Equal(h, got) {
			t.Errorf("%s: hashes %x, want %x", body, h, got)
		}
	}

	// No preamble, or a null one, is P = 0: chat's hashes for the same
	// stream.
	for _, body := range []string{`{"model":"m",` + msgs + `}`, `{"model":"m","system":null,` + msgs + `}`} {
		if h := hash(body); !slices.Equal(h, chain) {
			t.Errorf("%s: hashes %x, want the unseeded chain %x", body, h, chain)
		}
	}
	if h := mustParse(t, p, SchemaChat, `{"model":"m",`+msgs+`,"system":"Be terse."}`).PrefixHashes; !slices.Equal(h, chain) {
		t.Errorf("chat reads no preamble: %x, want %x", h, chain)
	}

	// Another system prompt, or the same text in another form, shares no
	// hash at any position.
	for _, system := range []string{`"Be brief."`, `[{"type":"text","text":"Be terse."}]`, `""`, `0`} {
		h := hash(`{"model":"m","system":` + system + `,` + msgs + `}`)
		want := refHashesPreamble("m", []byte(system), []byte(stream), 16, 0)
		if !slices.Equal(h, want) || len(h) != len(got) {
			t.Errorf("system %s: hashes %x, want %x", system, h, want)
		}
		for i := range h {
			if h[i] == got[i] || h[i] == chain[i] {
				t.Errorf("system %s: hash %d is shared", system, i)
			}
		}
	}

	// Responses: instructions and a string input.
	input := "Summarize the incident report in three bullet points."
	r := mustParse(t, p, SchemaResponses, `{"input":"`+input+`","instructions":"Be terse.","model":"m"}`)
	if want := refHashesPreamble("m", []byte(`"Be terse."`), []byte(input), 16, 0); !slices.Equal(r.PrefixHashes, want) || len(want) != 3 {
		t.Errorf("responses: hashes %x, want %x", r.PrefixHashes, want)
	}
}

// TestPrefixHashesUnhashedSchemas: PromptNone and PromptInput schemas never
// hash, whatever the body holds.
func TestPrefixHashesUnhashedSchemas(t *testing.T) {
	long := strings.Repeat("a long prompt ", 50)
	p := Parser{BlockBytes: 4}
	for _, tc := range []struct {
		s    *Schema
		body string
	}{
		{SchemaCountTokens, `{"model":"m","system":"s","messages":[{"role":"user","content":"` + long + `"}]}`},
		{SchemaPooling, `{"input":"` + long + `"}`},
		{SchemaClassify, `{"input":["` + long + `"]}`},
		{SchemaTokenize, `{"prompt":"` + long + `"}`},
		{SchemaRerank, `{"query":"` + long + `","documents":["` + long + `"]}`},
		{&Schema{Preamble: "system"}, `{"system":"` + long + `"}`},
	} {
		r, err := p.Parse(tc.s, []byte(tc.body))
		if err != nil || r.PrefixHashes != nil {
			t.Errorf("%.60s: %d hashes, %v; want none", tc.body, len(r.PrefixHashes), err)
		}
	}
}

// TestPrefixHashesGoldenPreamble pins the hashes of a schema with a
// preamble, as TestPrefixHashesGolden does for chat and completions.
func TestPrefixHashesGoldenPreamble(t *testing.T) {
	r := mustParse(t, Parser{BlockBytes: 16}, SchemaMessages, // "user\x00What is a KV cache?\x01": 25 bytes
		`{"model":"claude-like","system":"You are a helpful assistant.","messages":[{"role":"user","content":"What is a KV cache?"}]}`)
	if want := []uint64{0x8449e9f8d39a0aee}; !slices.Equal(r.PrefixHashes, want) {
		t.Errorf("messages hashes = %#x, want %#x", r.PrefixHashes, want)
	}
}
