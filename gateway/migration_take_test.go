package gateway

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

// vllmTokenChunk is a chat stream's token chunk as vLLM writes it under
// return_token_ids (internal/enginesim: ChatCompletionStreamResponse, the
// choice's token_ids after finish_reason).
const vllmTokenChunk = `{"id":"chatcmpl-5f0c1e2d3b4a49588776655443322110","object":"chat.completion.chunk","created":1735689600,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"content":" the"},"logprobs":null,"finish_reason":null,"token_ids":[279]}]}`

// BenchmarkCarryTake: take on a token chunk of a stream's first leg (the
// gateway asked for the ids, the client did not: they are cut).
func BenchmarkCarryTake(b *testing.B) {
	ch, err := oai.InspectChunk([]byte(vllmTokenChunk))
	if err != nil {
		b.Fatal(err)
	}
	c := testCarry(migrateChat, `{}`)
	c.id, c.created, c.model = []byte(`"chatcmpl-5f0c1e2d3b4a49588776655443322110"`), []byte(`1735689600`), []byte(`"meta-llama/Llama-3.1-8B-Instruct"`)
	c.prompt, c.sawPrompt, c.promptLen = []int32{1, 2, 3}, true, 3
	c.gen = make([]int32, 0, 16)
	buf := make([]byte, len(vllmTokenChunk))
	b.SetBytes(int64(len(vllmTokenChunk)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(buf, vllmTokenChunk) // take cuts in place
		c.gen = c.gen[:0]
		if out := c.take(buf, &ch); len(out) == len(buf) {
			b.Fatal("token_ids not cut")
		}
	}
	if c.excluded != "" {
		b.Fatalf("excluded %q", c.excluded)
	}
}

// memberReference is member as take used it before its one scan: a
// search of its own for "key": (a byte search: a key's quotes cannot occur
// unescaped inside a string), then memberAt, which both versions share:
// data[from:to] is the member with its separating comma, data[v:end] its
// value. ok is false when the key is absent or its value is neither an
// array of numbers nor null.
func memberReference(data []byte, key string) (from, to, v, end int, ok bool) {
	var buf [24]byte
	pat := append(append(append(buf[:0], '"'), key...), '"', ':')
	return memberAt(data, bytes.Index(data, pat), len(pat))
}

// takeReference is take as it was before its one scan for both token id
// members (a copy, with two member searches): the reference the new take
// must agree with, byte for byte.
func (c *carry) takeReference(data []byte, ch *oai.Chunk) []byte {
	content := ch.Content
	if c.id == nil && ch.ID != nil {
		c.head(data, ch)
	}
	if content && c.keepText && c.excluded == "" {
		c.keepChunkText(data)
	}
	if content && c.excluded == "" {
		switch {
		case ch.ToolCalls:
			c.exclude(exclTools)
		case ch.Reasoning:
			c.exclude(exclReasoning)
		}
	}
	out := data
	if from, to, v, end, ok := memberReference(out, "prompt_token_ids"); ok {
		if c.excluded == "" && !c.sawPrompt {
			if n := bytes.Count(out[v:end], []byte{','}) + 1; cap(c.prompt) < n {
				c.prompt = make([]int32, 0, n)
			}
			var good bool
			c.prompt, good = appendIDs(c.prompt[:0], out[v:end])
			c.sawPrompt, c.promptLen = good, len(c.prompt)
		}
		if !c.clientIDs {
			out = cutRange(out, from, to)
		}
	}
	if from, to, v, end, ok := memberReference(out, "token_ids"); ok {
		if c.excluded == "" {
			if c.gen == nil {
				c.gen = make([]int32, 0, c.genCap)
			}
			n := len(c.gen)
			var good bool
			if c.gen, good = appendIDs(c.gen, out[v:end]); !good || (content && len(c.gen) == n) {
				c.exclude(exclNoTokenIDs)
			}
		}
		if !c.clientIDs {
			out = cutRange(out, from, to)
		}
	} else if content && c.excluded == "" {
		// Content without its ids: the generated ids are incomplete.
		c.exclude(exclNoTokenIDs)
	}
	if c.excluded == "" && c.held() > c.cfg.MaxTokens {
		c.exclude(exclMaxTokens)
	}
	return out
}

// takeEvents are events for take against takeReference: vLLM's shapes,
// and what a byte search for the token id members could get wrong.
var takeEvents = []string{
	// vLLM's chat stream: the role chunk (prompt ids only), a token chunk,
	// the finish chunk, the usage chunk.
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[5,6,7]}`,
	vllmTokenChunk,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[]}]}`,
	`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`,
	// vLLM's completions stream: both on the choice, prompt ids first.
	`{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2,3],"token_ids":[4]}]}`,
	`{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"b","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[5]}]}`,
	// Prompt ids first, token ids first, each the object's first member.
	`{"id":"x","prompt_token_ids":[1,2],"choices":[{"delta":{"content":"a"},"token_ids":[3]}]}`,
	`{"choices":[{"token_ids":[3],"delta":{"content":"a"}}],"prompt_token_ids":[1,2]}`,
	`{"prompt_token_ids":[1],"token_ids":[2],"x":1}`,
	`{"prompt_token_ids":[1],"token_ids":[2]}`,
	`{"token_ids":[2],"prompt_token_ids":[1]}`,
	`{"token_ids":[2],"prompt_token_ids":[1],"x":1}`,
	`{"prompt_token_ids":[1]}`,
	`{"token_ids":[1]}`,
	`{"token_ids":[2],"x":{"prompt_token_ids":[1]}}`,
	`{"x":{"prompt_token_ids":[1]},"token_ids":[2]}`,
	// Neither.
	`{"id":"x","choices":[{"delta":{"content":"a"}}]}`,
	`{}`,
	``,
	// null values.
	`{"id":"x","choices":[{"delta":{"content":"a"},"token_ids":null}]}`,
	`{"prompt_token_ids":null,"choices":[{"delta":{"content":"a"},"token_ids":[9]}]}`,
	`{"prompt_token_ids":null,"token_ids":null}`,
	`{"token_ids": nul}`,
	`{"token_ids":nullx}`,
	// Whitespace around colons, commas and members.
	`{ "prompt_token_ids" : [1], "token_ids" : [2] }`,
	`{"prompt_token_ids": [1, 2] , "token_ids":	[3] }`,
	`{ "prompt_token_ids":[1] ,"token_ids":[2] , "x":1}`,
	`{ "token_ids":[2] , "prompt_token_ids":[1] , "x":1}`,
	"{\n  \"prompt_token_ids\": [1,\n 2],\n  \"choices\": [{\"token_ids\":\r\n[3],\n\"delta\": {\"content\": \"a\"}}]\n}",
	`{"id": "x", "choices": [{"token_ids": [32000],` + "\n\t" + `"delta": {"content": "a"}, "finish_reason": null}]}`,
	// A key inside a string value.
	`{"choices":[{"delta":{"content":"token_ids\":[1]"},"token_ids":[2]}]}`,
	`{"choices":[{"delta":{"content":"\"token_ids\":[1]"},"token_ids":[2]}]}`,
	`{"choices":[{"delta":{"content":"x,\"token_ids\":[1]"},"token_ids":[2]}]}`,
	`{"choices":[{"delta":{"content":"a \"prompt_token_ids\":[9]"},"token_ids":[2]}],"prompt_token_ids":[1]}`,
	`{"choices":[{"delta":{"content":"a, \"prompt_token_ids\":[9]"},"token_ids":[2]}],"prompt_token_ids":[1]}`,
	// Malformed arrays.
	`{"token_ids":[1,}`,
	`{"token_ids":[1 2]}`,
	`{"token_ids":[}`,
	`{"token_ids":[`,
	`{"token_ids":"x"}`,
	`{"token_ids":[-1]}`,
	`{"token_ids":[1]]}`,
	`{"token_ids":[2147483648]}`,
	`{"prompt_token_ids":[1,2`,
	`{"prompt_token_ids":[1,"a"],"token_ids":[2]}`,
	`{"prompt_token_ids":[1.5],"token_ids":[2]}`,
	`{"prompt_token_ids":[1],"token_ids":[2,x]}`,
	// Other keys ending the same.
	`{"xtoken_ids":[1],"token_ids":[2]}`,
	`{"xprompt_token_ids":[1],"prompt_token_ids":[2]}`,
	`{"my_prompt_token_ids":[1],"token_ids":[2]}`,
	`{"stop_token_ids":[1],"prompt_token_idsx":[2],"token_idsx":[3]}`,
	`{"prompt_token_ids":[1],"xtoken_ids":[2],"token_ids":[3]}`,
	// The first key is not a member: the later one is not looked at.
	`{"a":["token_ids":[1]],"token_ids":[2]}`,
	`{"a":["prompt_token_ids":[1]],"prompt_token_ids":[2]}`,
	`{"token_ids":[1],"token_ids":[2]}`,
	`{"prompt_token_ids":[1],"prompt_token_ids":[2]}`,
	// At the data's ends.
	`token_ids":[1]`,
	`"token_ids":[1]`,
	`prompt_token_ids":[1]`,
	`"prompt_token_ids":[1]`,
	`{"prompt_token_ids":`,
	`{"token_ids":`,
	`{"prompt_token_ids":[1],"token_ids"`,
	// Not JSON: a token_ids key inside the prompt ids' brackets, and one
	// the prompt ids' cut joins.
	`{"prompt_token_ids":["token_ids":[7],"token_ids":[8]}`,
	`{"prompt_token_ids":["token_ids":[7]}`,
	`{"x":1,"token_i,"prompt_token_ids":[1]ds":[5]}`,
	`{"x":1,"token_i,"prompt_token_ids":[1]ds":[5],"token_ids":[6]}`,
	`{"x":1,",,"prompt_token_ids":[1]token_ids":[5]}`,
	`{"token_ids":[1,"prompt_token_ids":[2],"x":3]}`,
	`{"token_ids":[1 ,"prompt_token_ids":[2]  , "x":3]}`,
}

// takeSetups are the carries take runs against takeReference with.
var takeSetups = []struct {
	name string
	set  func(*carry)
}{
	{"cut", func(*carry) {}},
	{"client ids", func(c *carry) { c.clientIDs = true }},
	{"prompt seen", func(c *carry) { c.prompt, c.sawPrompt, c.promptLen = []int32{9, 9}, true, 2 }},
	{"excluded", func(c *carry) { c.excluded = exclTools }},
	{"max tokens 2", func(c *carry) { c.cfg.MaxTokens = 2 }},
	{"kept text", func(c *carry) { c.keepText = true }},
}

// takeBoth gives a copy of event to take on c and one to takeReference on
// ref, and fails unless the bytes returned and the carries agree.
func takeBoth(t *testing.T, c, ref *carry, event string, content bool) {
	t.Helper()
	ch, _ := oai.InspectChunk([]byte(event))
	ch.Content = content
	chRef := ch
	got := c.take([]byte(event), &ch)
	want := ref.takeReference([]byte(event), &chRef)
	if !bytes.Equal(got, want) {
		t.Fatalf("take(%q) (content %v):\n got %q\nwant %q", event, content, got, want)
	}
	if d := carryDiff(c, ref); d != "" {
		t.Fatalf("take(%q) (content %v): carry differs: %s", event, content, d)
	}
}

// carryDiff names the take state in which c and ref differ ("" when
// none).
func carryDiff(c, ref *carry) string {
	for _, f := range []struct {
		name     string
		got, ref any
	}{
		{"gen", c.gen, ref.gen},
		{"prompt", c.prompt, ref.prompt},
		{"sawPrompt", c.sawPrompt, ref.sawPrompt},
		{"promptLen", c.promptLen, ref.promptLen},
		{"excluded", c.excluded, ref.excluded},
		{"keepText", c.keepText, ref.keepText},
		{"text", c.text, ref.text},
		{"id", c.id, ref.id},
		{"created", c.created, ref.created},
		{"model", c.model, ref.model},
	} {
		if !reflect.DeepEqual(f.got, f.ref) {
			return fmt.Sprintf("%s %v, reference %v", f.name, f.got, f.ref)
		}
	}
	return ""
}

// TestCarryTakeMatchesReference: take's one scan for the token id members
// returns what its two member searches returned (takeReference), and
// leaves the carry as they did, for each event alone and for the events as
// one stream, with every setup; and so on random events built from the
// pieces such a search can trip on.
func TestCarryTakeMatchesReference(t *testing.T) {
	for _, s := range takeSetups {
		t.Run(s.name, func(t *testing.T) {
			for _, content := range []bool{false, true} {
				for _, e := range takeEvents {
					c, ref := testCarry(migrateChat, `{}`), testCarry(migrateChat, `{}`)
					s.set(c)
					s.set(ref)
					takeBoth(t, c, ref, e, content)
				}
				c, ref := testCarry(migrateChat, `{}`), testCarry(migrateChat, `{}`)
				s.set(c)
				s.set(ref)
				for _, e := range takeEvents {
					takeBoth(t, c, ref, e, content)
				}
			}
		})
	}

	pieces := []string{
		`{`, `}`, `[`, `]`, `,`, `, `, ` `, "\n", `:`, `"`, `\"`, `x`, `1`, `[1,2]`, `[3]`, `[]`, `null`, `nul`,
		`"token_ids":`, `"prompt_token_ids":`, `token_ids":`, `"prompt_`, `"token_i`, `ds":`, `"xtoken_ids":`,
		`"token_ids" :`, `"content":"`, `"x":1`, `"choices":[{`, `}]`,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var b strings.Builder
	for i := 0; i < 20000; i++ {
		b.Reset()
		for n := rng.IntN(16); n >= 0; n-- {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		s := takeSetups[rng.IntN(len(takeSetups))]
		c, ref := testCarry(migrateChat, `{}`), testCarry(migrateChat, `{}`)
		s.set(c)
		s.set(ref)
		takeBoth(t, c, ref, b.String(), rng.IntN(2) == 0)
	}
}

// FuzzCarryTake: take agrees with takeReference on any event.
func FuzzCarryTake(f *testing.F) {
	for _, e := range takeEvents {
		f.Add(e, 0, false)
	}
	f.Fuzz(func(t *testing.T, event string, setup int, content bool) {
		s := takeSetups[uint(setup)%uint(len(takeSetups))]
		c, ref := testCarry(migrateChat, `{}`), testCarry(migrateChat, `{}`)
		s.set(c)
		s.set(ref)
		takeBoth(t, c, ref, event, content)
	})
}
