package oai

import "github.com/cespare/xxhash/v2"

// TemplateHash returns a hash of the members of a chat completions body
// (a JSON object) that change the prompt an engine renders from its
// messages, other than the messages themselves: tools,
// chat_template_kwargs, add_generation_prompt, continue_final_message,
// chat_template and documents (vLLM's ChatCompletionRequest fields that
// its apply_hf_chat_template uses). It is 0 when the body has none of them
// (or is not an object): two requests with the same messages and hash are
// rendered into the same tokens. A member's raw JSON bytes count as
// written, so key order inside it and white space matter. It reads body in
// one pass and does not allocate.
func TemplateHash(body []byte) uint64 {
	d := decoder{b: body}
	if d.peek() != '{' {
		return 0
	}
	d.open('{')
	var h uint64
	for n := 0; d.more('}', &n); {
		switch k := d.key(); string(k) {
		case "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "chat_template", "documents":
			v := d.value()
			if d.bad || string(v) == "null" {
				continue
			}
			// Each member hashed with its name, combined by addition so
			// that their order in the body does not matter.
			var x xxhash.Digest
			x.Reset()
			_, _ = x.Write(k)
			_, _ = x.Write(v)
			h += x.Sum64() | 1
		default:
			d.skip()
		}
	}
	if d.bad {
		return 0
	}
	return h
}
