package enginesim

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestContextLength(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxModelLen = 10
	_, srv := startEngine(t, cfg)
	const tooLong = "This model's maximum context length is 10 tokens. However, you requested "
	openAIErr := func(msg string) string {
		return `{"error":{"message":"` + msg + `","type":"BadRequestError","param":null,"code":400}}`
	}
	tests := []struct {
		name, path, body string
		status           int
		want             string // the whole body for errors, a part of it for 200s
	}{
		{"chat fits", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a b c"}],"max_tokens":7}`,
			200, `"finish_reason":"length"`},
		{"chat max_tokens too large", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a b c"}],"max_tokens":8}`,
			400, openAIErr(tooLong + "11 tokens (3 in the messages, 8 in the completion). Please reduce the length of the messages or completion.")},
		{"chat max_completion_tokens wins", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a b c"}],"max_tokens":1,"max_completion_tokens":100000000}`,
			400, openAIErr(tooLong + "100000003 tokens (3 in the messages, 100000000 in the completion). Please reduce the length of the messages or completion.")},
		{"chat prompt too long", "/v1/chat/completions", `{"messages":[{"role":"user","content":"1 2 3 4 5 6 7 8 9 10"}]}`,
			400, openAIErr(tooLong + "10 tokens in the messages, Please reduce the length of the messages.")},
		{"chat default length clipped", "/v1/chat/completions", `{"messages":[{"role":"user","content":"1 2 3 4 5 6 7 8"}]}`,
			200, `"content":"tok0 tok1 ",`},
		{"completions default max_tokens 16", "/v1/completions", `{"prompt":"a b"}`,
			400, openAIErr(tooLong + "18 tokens (2 in the messages, 16 in the completion). Please reduce the length of the messages or completion.")},
		{"completions token prompt", "/v1/completions", `{"prompt":[1,2,3,4,5,6,7,8,9,10],"max_tokens":1}`,
			400, openAIErr(tooLong + "11 tokens (10 in the messages, 1 in the completion). Please reduce the length of the messages or completion.")},
		{"messages", "/v1/messages", `{"model":"m1","messages":[{"role":"user","content":"a b c"}],"max_tokens":100000000}`,
			400, `{"type":"error","error":{"type":"invalid_request_error","message":"` + tooLong + `100000003 tokens (3 in the messages, 100000000 in the completion). Please reduce the length of the messages or completion."}}`},
		{"responses prompt too long", "/v1/responses", `{"input":"1 2 3 4 5 6 7 8 9 10"}`,
			400, `{"error":{"message":"The engine prompt length 10 exceeds the max_model_len 10. Please reduce prompt.","type":"invalid_request_error","param":null,"code":400}}`},
		{"responses max_output_tokens clipped", "/v1/responses", `{"input":"1 2 3 4 5 6 7 8","max_output_tokens":100000000}`,
			200, `"output_tokens":2,`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", tc.path, tc.body, nil)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if tc.status == http.StatusOK {
				if !strings.Contains(string(b), tc.want) {
					t.Errorf("body %s lacks %s", b, tc.want)
				}
				return
			}
			if string(b) != tc.want {
				t.Errorf("body\n%s\nwant\n%s", b, tc.want)
			}
		})
	}
	b, _ := io.ReadAll(mustSend(t, srv, "GET", "/v1/models", "", nil).Body)
	if !strings.Contains(string(b), `"max_model_len":10,`) {
		t.Errorf("models: %s", b)
	}
	b, _ = io.ReadAll(mustSend(t, srv, "POST", "/tokenize", `{"prompt":"a"}`, nil).Body)
	if !strings.Contains(string(b), `"max_model_len":10,`) {
		t.Errorf("tokenize: %s", b)
	}
}

// TestHugeMaxTokensRejected: the default engine refuses max_tokens 100000000 instead of
// generating (as vLLM does with its default max_model_len).
func TestHugeMaxTokensRejected(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":100000000,"stream":true}`, nil)
	b, _ := io.ReadAll(resp.Body)
	want := `{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 100000001 tokens (1 in the messages, 100000000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}}`
	if resp.StatusCode != http.StatusBadRequest || string(b) != want {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	if s := e.Stats(); s.Completed+s.Aborted+s.Faulted != 0 || s.Running != 0 {
		t.Errorf("stats %+v: the request must not run", s)
	}
}
