package oai

import "testing"

// TestTemplateHash: the members that change a chat's rendering count,
// whatever their order in the body; the messages and other members do
// not; null and absent are the same.
func TestTemplateHash(t *testing.T) {
	base := TemplateHash([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if base != 0 {
		t.Errorf("no template members: %x, want 0", base)
	}
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"other"}],"max_tokens":5,"tools":null}`,
		`not json`,
		`[1,2]`,
	} {
		if h := TemplateHash([]byte(body)); h != 0 {
			t.Errorf("TemplateHash(%s) = %x, want 0", body, h)
		}
	}
	tools := `{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"add_generation_prompt":false}`
	swapped := `{"add_generation_prompt":false,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`
	a, b := TemplateHash([]byte(tools)), TemplateHash([]byte(swapped))
	if a == 0 || a != b {
		t.Errorf("same members in another order: %x, %x; want equal and not 0", a, b)
	}
	for _, other := range []string{
		`{"tools":[{"type":"function","function":{"name":"g"}}],"add_generation_prompt":false}`,
		`{"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"tools":[{"type":"function","function":{"name":"f"}}],"add_generation_prompt":false,"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"documents":[{"text":"d"}]}`,
		`{"chat_template":"{{ messages }}"}`,
		`{"continue_final_message":true}`,
	} {
		if h := TemplateHash([]byte(other)); h == a || h == 0 {
			t.Errorf("TemplateHash(%s) = %x: want another non-zero hash than %x", other, h, a)
		}
	}
	tb := []byte(tools)
	if n := testing.AllocsPerRun(100, func() { TemplateHash(tb) }); n != 0 {
		t.Errorf("%v allocs, want 0", n)
	}
}
