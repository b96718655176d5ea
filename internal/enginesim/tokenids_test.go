package enginesim

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// idList writes ids as the JSON list vLLM writes.
func idList(ids ...int) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

// wordIDs is the simulator's tokenization of the whitespace-separated words of s.
func wordIDs(s string) []int { return promptTokenIDs(strings.Fields(s)) }

func contentIDs(from, to int) []int {
	var ids []int
	for i := from; i < to; i++ {
		ids = append(ids, contentIDBase+i)
	}
	return ids
}

func TestTokenIDsOfGeneratedWords(t *testing.T) {
	tests := []struct {
		word string
		want int
	}{
		{"tok0", 32000},
		{"tok17", 32017},
		{"think2", 1<<30 + 2},
		{"123", 123},
		{"tok01", tokenID("tok01")}, // not canonical: a hashed word
		{"tok", tokenID("tok")},
		{"tok-1", tokenID("tok-1")},
	}
	for _, tc := range tests {
		if got := tokenID(tc.word); got != tc.want {
			t.Errorf("tokenID(%q) = %d, want %d", tc.word, got, tc.want)
		}
	}
	for _, w := range []string{"tok01", "tok", "tok-1", "hello"} {
		if id := tokenID(w); id >= vocabSize {
			t.Errorf("tokenID(%q) = %d, want a hash below %d", w, id, vocabSize)
		}
	}
	if got := resumeIndex([]int{5, 32000, 32001, 32002}); got != 3 {
		t.Errorf("resumeIndex = %d, want 3", got)
	}
	for _, ids := range [][]int{{32001, 32002}, {32000, 32002}, {32000, 7}, {}, {1 << 30}} {
		if got := resumeIndex(ids); got != 0 {
			t.Errorf("resumeIndex(%v) = %d, want 0", ids, got)
		}
	}
}

func TestTokenizeDetokenizeGeneratedTokens(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/tokenize", `{"prompt":"tok3 think2 7"}`, nil)
	b, _ := io.ReadAll(resp.Body)
	want := `{"count":3,"max_model_len":8192,"tokens":[32003,1073741826,7],"token_strs":null}`
	if string(b) != want {
		t.Errorf("tokenize = %s, want %s", b, want)
	}
	resp = mustSend(t, srv, "POST", "/detokenize", `{"tokens":[32003,1073741826,7]}`, nil)
	b, _ = io.ReadAll(resp.Body)
	if want := `{"prompt":"tok3 think2 7"}`; string(b) != want {
		t.Errorf("detokenize = %s, want %s", b, want)
	}
}

func TestReturnTokenIDsChatUnary(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"a b c"}],"max_tokens":3,"return_token_ids":true}`, nil)
	b, _ := io.ReadAll(resp.Body)
	body := string(b)
	prompt := wordIDs("be brief a b c")
	for _, want := range []string{
		`"finish_reason":"length","stop_reason":null,"token_ids":` + idList(32000, 32001, 32002) + `}]`,
		`"prompt_logprobs":null,"prompt_token_ids":` + idList(prompt...) + `,"kv_transfer_params":null}`,
		`"usage":{"prompt_tokens":5,`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("body lacks %s:\n%s", want, body)
		}
	}
	var got struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		Usage          struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.PromptTokenIDs) != got.Usage.PromptTokens {
		t.Errorf("%d prompt ids, prompt_tokens %d", len(got.PromptTokenIDs), got.Usage.PromptTokens)
	}
}

func TestReturnTokenIDsChatStream(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"user","content":"a b c"}],"max_tokens":2,"stream":true,"return_token_ids":true}`, nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	if len(data) != 5 {
		t.Fatalf("%d events: %q", len(data), data)
	}
	wants := []string{
		`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":` + idList(wordIDs("a b c")...) + `}`,
		`"choices":[{"index":0,"delta":{"content":"tok0 "},"logprobs":null,"finish_reason":null,"token_ids":[32000]}]}`,
		`"choices":[{"index":0,"delta":{"content":"tok1 "},"logprobs":null,"finish_reason":null,"token_ids":[32001]}]}`,
		`"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[]}]}`,
		`[DONE]`,
	}
	for i, want := range wants {
		if !strings.HasSuffix(data[i], want) {
			t.Errorf("event %d = %s, want suffix %s", i, data[i], want)
		}
	}
}

func TestReturnTokenIDsCompletions(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/completions",
		`{"model":"m1","prompt":"x y","max_tokens":2,"return_token_ids":true}`, nil)
	b, _ := io.ReadAll(resp.Body)
	want := `"choices":[{"index":0,"text":"tok0 tok1 ","logprobs":null,"finish_reason":"length","stop_reason":null,` +
		`"token_ids":[32000,32001],"prompt_logprobs":null,"prompt_token_ids":` + idList(wordIDs("x y")...) + `}]`
	if !strings.Contains(string(b), want) {
		t.Errorf("body %s\nlacks %s", b, want)
	}

	resp = mustSend(t, srv, "POST", "/v1/completions",
		`{"model":"m1","prompt":"x y","max_tokens":2,"stream":true,"return_token_ids":true}`, nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	wants := []string{
		`"text":"tok0 ","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":` + idList(wordIDs("x y")...) + `,"token_ids":[32000]}],"usage":null}`,
		`"text":"tok1 ","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":[32001]}],"usage":null}`,
		`"text":"","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[]}],"usage":null}`,
		`[DONE]`,
	}
	if len(data) != len(wants) {
		t.Fatalf("%d events: %q", len(data), data)
	}
	for i, want := range wants {
		if !strings.HasSuffix(data[i], want) {
			t.Errorf("event %d = %s, want suffix %s", i, data[i], want)
		}
	}
}

func TestNoReturnTokenIDsNoFields(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	for _, body := range []string{
		`{"model":"m1","messages":[{"role":"user","content":"a"}],"max_tokens":2}`,
		`{"model":"m1","messages":[{"role":"user","content":"a"}],"max_tokens":2,"stream":true}`,
		`{"model":"m1","prompt":"a","max_tokens":2,"return_token_ids":false}`,
		`{"model":"m1","prompt":"a","max_tokens":2,"stream":true}`,
	} {
		path := "/v1/completions"
		if strings.Contains(body, "messages") {
			path = "/v1/chat/completions"
		}
		b, _ := io.ReadAll(mustSend(t, srv, "POST", path, body, nil).Body)
		if strings.Contains(string(b), "token_ids") {
			t.Errorf("%s: %s", body, b)
		}
	}
}

// TestContinuationReassembles cuts a canonical generation after every k of its n tokens
// and continues it from a token-array prompt (the prompt's ids plus the k generated ids,
// max_tokens reduced by k, or no max_tokens), as a gateway migrating a broken stream does:
// the text before the cut plus the continuation's text is the canonical text, with the
// canonical finish_reason and end.
func TestContinuationReassembles(t *testing.T) {
	const n = 6
	cfg := fastConfig()
	cfg.OutputTokens = n
	_, srv := startEngine(t, cfg)
	type result struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
			TokenIDs     []int  `json:"token_ids"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	post := func(body string) result {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/v1/completions", body, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return decode[result](t, b)
	}
	for _, limit := range []string{`,"max_tokens":` + fmt.Sprint(n), ""} {
		canon := post(`{"model":"m1","prompt":"p q r","return_token_ids":true` + limit + `}`)
		c := canon.Choices[0]
		if want := "tok0 tok1 tok2 tok3 tok4 tok5 "; c.Text != want {
			t.Fatalf("canonical text %q, want %q", c.Text, want)
		}
		if !slices.Equal(c.TokenIDs, contentIDs(0, n)) {
			t.Fatalf("canonical ids %v", c.TokenIDs)
		}
		wantFinish := "stop"
		if limit != "" {
			wantFinish = "length"
		}
		prompt := wordIDs("p q r")
		for k := 0; k <= n; k++ {
			ids := append(slices.Clone(prompt), c.TokenIDs[:k]...)
			rest := ""
			if limit != "" {
				rest = `,"max_tokens":` + fmt.Sprint(n-k)
				if n-k == 0 {
					continue // max_tokens must be at least 1: nothing left to ask for
				}
			}
			cont := post(`{"model":"m1","prompt":` + idList(ids...) + `,"return_token_ids":true` + rest + `}`)
			cc := cont.Choices[0]
			before := strings.Join(strings.SplitAfter(c.Text, " ")[:k], "")
			if got := before + cc.Text; got != c.Text {
				t.Errorf("%s k=%d: reassembled %q, want %q", limit, k, got, c.Text)
			}
			if !slices.Equal(cc.TokenIDs, contentIDs(k, n)) {
				t.Errorf("%s k=%d: ids %v, want %v", limit, k, cc.TokenIDs, contentIDs(k, n))
			}
			if cc.FinishReason != wantFinish {
				t.Errorf("%s k=%d: finish %q, want %q", limit, k, cc.FinishReason, wantFinish)
			}
			if cont.Usage.PromptTokens != len(ids) || cont.Usage.CompletionTokens != n-k {
				t.Errorf("%s k=%d: usage %+v, want prompt %d completion %d", limit, k, cont.Usage, len(ids), n-k)
			}
		}
	}
}

// TestContinuationTextPrompt resumes from a text prompt ending with the generated words,
// streaming, and from a chat prompt.
func TestContinuationTextPrompt(t *testing.T) {
	cfg := fastConfig()
	cfg.OutputTokens = 4
	_, srv := startEngine(t, cfg)
	b, _ := io.ReadAll(mustSend(t, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"hi tok0 tok1"}`, nil).Body)
	if !strings.Contains(string(b), `"text":"tok2 tok3 ","logprobs":null,"finish_reason":"stop"`) {
		t.Errorf("text continuation: %s", b)
	}
	resp := mustSend(t, srv, "POST", "/v1/chat/completions",
		`{"model":"m1","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"tok0 tok1 tok2"}],"stream":true}`, nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	if len(data) != 4 || !strings.Contains(data[1], `"content":"tok3 "`) || !strings.Contains(data[2], `"finish_reason":"stop"`) {
		t.Errorf("chat continuation: %q", data)
	}
}

// TestMigrationAfterCutStream does what a gateway migrating a broken generation does: a chat
// stream with return_token_ids is cut after k tokens (close-after=k); the prompt ids of its
// role chunk plus the token ids it received become a /v1/completions token prompt with
// max_tokens reduced by k; the streamed text of both reassembles to the uncut answer.
func TestMigrationAfterCutStream(t *testing.T) {
	const n = 5
	_, srv := startEngine(t, fastConfig())
	chat := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"say it"}],"max_tokens":%d,"stream":true,"return_token_ids":true}`, n)
	type chunk struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		Choices        []struct {
			Text  string `json:"text"`
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
			TokenIDs     []int   `json:"token_ids"`
		} `json:"choices"`
	}
	stream := func(path, body, spec string) (prompt, ids []int, text, finish string) {
		t.Helper()
		hdr := map[string]string{}
		if spec != "" {
			hdr = fault(spec)
		}
		evs, _ := readEvents(mustSend(t, srv, "POST", path, body, hdr).Body) // a cut stream ends in an error
		for _, d := range dataEvents(evs) {
			if d == "[DONE]" {
				continue
			}
			c := decode[chunk](t, []byte(d))
			prompt = append(prompt, c.PromptTokenIDs...)
			for _, ch := range c.Choices {
				ids = append(ids, ch.TokenIDs...)
				text += ch.Text + ch.Delta.Content
				if ch.FinishReason != nil {
					finish = *ch.FinishReason
				}
			}
		}
		return prompt, ids, text, finish
	}
	_, canonIDs, canon, canonFinish := stream("/v1/chat/completions", chat, "")
	if canon != "tok0 tok1 tok2 tok3 tok4 " || canonFinish != "length" || !slices.Equal(canonIDs, contentIDs(0, n)) {
		t.Fatalf("canonical %q %q %v", canon, canonFinish, canonIDs)
	}
	for k := 1; k < n; k++ {
		prompt, ids, text, finish := stream("/v1/chat/completions", chat, fmt.Sprintf("close-after=%d", k))
		if finish != "" || len(ids) != k || !slices.Equal(prompt, wordIDs("say it")) {
			t.Fatalf("k=%d: cut stream prompt %v ids %v finish %q", k, prompt, ids, finish)
		}
		cont := fmt.Sprintf(`{"model":"m1","prompt":%s,"max_tokens":%d,"stream":true,"return_token_ids":true}`,
			idList(append(prompt, ids...)...), n-k)
		_, ids2, text2, finish2 := stream("/v1/completions", cont, "")
		if text+text2 != canon || finish2 != canonFinish || !slices.Equal(append(ids, ids2...), canonIDs) {
			t.Errorf("k=%d: reassembled %q (%s), ids %v, want %q (%s) %v", k, text+text2, finish2, append(ids, ids2...), canon, canonFinish, canonIDs)
		}
	}
}
