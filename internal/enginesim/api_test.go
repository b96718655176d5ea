package enginesim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	chatIDRe = regexp.MustCompile(`^chatcmpl-[0-9a-f]{32}$`)
	cmplIDRe = regexp.MustCompile(`^cmpl-[0-9a-f]{32}$`)
)

func TestChatStream(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	tests := []struct {
		name    string
		body    string
		model   string
		tokens  int
		finish  string
		prompt  int
		wantUse bool
	}{
		{
			name:  "max_tokens with usage",
			body:  `{"model":"m1","messages":[{"role":"user","content":"hello there world"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`,
			model: "m1", tokens: 4, finish: "length", prompt: 3, wantUse: true,
		},
		{
			name:  "default length no usage, content parts",
			body:  `{"model":"m2","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"a b"},{"type":"image_url","image_url":{"url":"x"}}]}],"stream":true}`,
			model: "m2", tokens: DefaultOutputTokens, finish: "stop", prompt: 4,
		},
		{
			name:  "max_completion_tokens wins, no model",
			body:  `{"messages":[{"role":"user","content":""}],"max_tokens":9,"max_completion_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
			model: "m1", tokens: 2, finish: "length", prompt: 1, wantUse: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", "/v1/chat/completions", tc.body, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type = %q", ct)
			}
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			data := dataEvents(evs)
			if len(data) != len(evs) {
				t.Errorf("unexpected comments in %v", evs)
			}
			id, created := chunkHead(t, data[0])
			if !chatIDRe.MatchString(id) {
				t.Errorf("id = %q", id)
			}
			head := fmt.Sprintf(`{"id":"%s","object":"chat.completion.chunk","created":%d,"model":"%s","choices":[`, id, created, tc.model)
			var want []string
			want = append(want, head+`{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
			for i := range tc.tokens {
				want = append(want, head+`{"index":0,"delta":{"content":"tok`+strconv.Itoa(i)+` "},"logprobs":null,"finish_reason":null}]}`)
			}
			want = append(want, head+`{"index":0,"delta":{},"logprobs":null,"finish_reason":"`+tc.finish+`","stop_reason":null}]}`)
			if tc.wantUse {
				want = append(want, head+fmt.Sprintf(`],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`,
					tc.prompt, tc.prompt+tc.tokens, tc.tokens))
			}
			want = append(want, "[DONE]")
			if strings.Join(data, "\n") != strings.Join(want, "\n") {
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(data, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	s := waitIdle(t, e, 0)
	if s.Completed != 3 || s.Received != 3 {
		t.Errorf("stats = %+v", s)
	}
}

func TestCompletionStream(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	body := `{"model":"m1","prompt":["one two","three"],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`
	resp := mustSend(t, srv, "POST", "/v1/completions", body, nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	id, created := chunkHead(t, data[0])
	if !cmplIDRe.MatchString(id) {
		t.Errorf("id = %q", id)
	}
	head := fmt.Sprintf(`{"id":"%s","object":"text_completion","created":%d,"model":"m1","choices":[`, id, created)
	want := []string{
		head + `{"index":0,"text":"tok0 ","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
		head + `{"index":0,"text":"tok1 ","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
		head + `{"index":0,"text":"tok2 ","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
		head + `{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null}`,
		head + `],"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3}}`,
		"[DONE]",
	}
	if strings.Join(data, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(data, "\n"), strings.Join(want, "\n"))
	}
	waitIdle(t, e, 0)
}

// nullMessage is the fields of vLLM's ChatMessage after content, for a message without
// refusal, tool calls or reasoning.
const nullMessage = `"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null`

func TestUnary(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxOutputTokens = 5
	cfg.OutputTokens = 3
	e, srv := startEngine(t, cfg)
	tests := []struct {
		name, path, body, want string
	}{
		{
			name: "chat length",
			path: "/v1/chat/completions",
			body: `{"model":"m1","messages":[{"role":"user","content":"hi you"}],"max_tokens":3,"n":4}`,
			want: `{"id":"ID","object":"chat.completion","created":CREATED,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 ",` + nullMessage + `},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`,
		},
		{
			name: "chat capped by MaxOutputTokens",
			path: "/v1/chat/completions",
			body: `{"model":"m2","messages":[{"role":"user","content":"x"}],"max_tokens":8000,"stream":false}`,
			want: `{"id":"ID","object":"chat.completion","created":CREATED,"model":"m2","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 tok3 tok4 ",` + nullMessage + `},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":1,"total_tokens":6,"completion_tokens":5,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`,
		},
		{
			name: "completion stop",
			path: "/v1/completions",
			body: `{"model":"m1","prompt":"the quick brown fox"}`,
			want: `{"id":"ID","object":"text_completion","created":CREATED,"model":"m1","choices":[{"index":0,"text":"tok0 tok1 tok2 ","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3,"prompt_tokens_details":null},"kv_transfer_params":null}`,
		},
		{
			name: "completion token ids",
			path: "/v1/completions",
			body: `{"model":"m1","prompt":[1,2,3,4,5],"max_tokens":1}`,
			want: `{"id":"ID","object":"text_completion","created":CREATED,"model":"m1","choices":[{"index":0,"text":"tok0 ","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":null},"kv_transfer_params":null}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", tc.path, tc.body, map[string]string{"X-Request-Id": "req-1"})
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status = %d: %s", resp.StatusCode, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(b)) {
				t.Errorf("Content-Length = %q, body %d bytes", cl, len(b))
			}
			if got := resp.Header.Get("X-Request-Id"); got != "req-1" {
				t.Errorf("X-Request-Id = %q", got)
			}
			id, created := chunkHead(t, string(b))
			want := strings.NewReplacer("ID", id, "CREATED", strconv.FormatInt(created, 10)).Replace(tc.want)
			if string(b) != want {
				t.Errorf("body:\n%s\nwant:\n%s", b, want)
			}
		})
	}
	waitIdle(t, e, 0)
}

func TestEmbeddings(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	embed := func(t *testing.T, input string) (vecs [][]float64, prompt int) {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/v1/embeddings", `{"model":"m1","input":`+input+`}`, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status = %d: %s", resp.StatusCode, b)
		}
		var out struct {
			Object string `json:"object"`
			Data   []struct {
				Object    string    `json:"object"`
				Index     int       `json:"index"`
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
			Model string `json:"model"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
				TotalTokens  int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		if out.Object != "list" || out.Model != "m1" || out.Usage.TotalTokens != out.Usage.PromptTokens {
			t.Errorf("envelope = %s", b)
		}
		for i, d := range out.Data {
			if d.Object != "embedding" || d.Index != i || len(d.Embedding) != DefaultEmbeddingDim {
				t.Errorf("data[%d] = %+v", i, d)
			}
			var norm float64
			for _, x := range d.Embedding {
				norm += x * x
			}
			if math.Abs(math.Sqrt(norm)-1) > 1e-5 {
				t.Errorf("data[%d] norm = %v", i, math.Sqrt(norm))
			}
			vecs = append(vecs, d.Embedding)
		}
		return vecs, out.Usage.PromptTokens
	}
	tests := []struct {
		input  string
		n      int
		prompt int
	}{
		{`"hello world"`, 1, 2},
		{`["hello world","a","b c d"]`, 3, 6},
		{`[1,2,3]`, 1, 3},
		{`[[1,2],[3]]`, 2, 3},
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			vecs, prompt := embed(t, tc.input)
			if len(vecs) != tc.n || prompt != tc.prompt {
				t.Errorf("got %d vectors, %d prompt tokens; want %d, %d", len(vecs), prompt, tc.n, tc.prompt)
			}
		})
	}
	a, _ := embed(t, `["hello world","other"]`)
	b, _ := embed(t, `"hello world"`)
	if fmt.Sprint(a[0]) != fmt.Sprint(b[0]) {
		t.Errorf("same input, different vectors: %v vs %v", a[0], b[0])
	}
	if fmt.Sprint(a[0]) == fmt.Sprint(a[1]) {
		t.Errorf("different inputs, same vector")
	}

	resp := mustSend(t, srv, "POST", "/v1/embeddings", `{"model":"m1","input":"hello world","encoding_format":"base64"}`, nil)
	var out struct {
		Data []struct {
			Embedding string `json:"embedding"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Data) != 1 {
		t.Fatalf("base64 response: %v %+v", err, out)
	}
	raw, err := base64.StdEncoding.DecodeString(out.Data[0].Embedding)
	if err != nil || len(raw) != 4*DefaultEmbeddingDim {
		t.Fatalf("base64 embedding: %d bytes, %v", len(raw), err)
	}
	for i := range DefaultEmbeddingDim {
		x := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		if x != float32(b[0][i]) {
			t.Errorf("base64 element %d = %v, float format %v", i, x, b[0][i])
		}
	}
	waitIdle(t, e, 0)
}

func TestModels(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "GET", "/v1/models", "", nil)
	b, _ := io.ReadAll(resp.Body)
	c := e.created
	card := func(i int, id string) string {
		return fmt.Sprintf(`{"id":"%s","object":"model","created":%d,"owned_by":"vllm","root":"%s","parent":null,"max_model_len":8192,`+
			`"permission":[{"id":"%s","object":"model_permission","created":%d,"allow_create_engine":false,"allow_sampling":true,`+
			`"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*",`+
			`"group":null,"is_blocking":false}]}`, id, c, id, e.cards[i].Permission[0].ID, c)
	}
	want := `{"object":"list","data":[` + card(0, "m1") + "," + card(1, "m2") + `]}`
	if resp.StatusCode != http.StatusOK || string(b) != want {
		t.Errorf("got %d %s\nwant %s", resp.StatusCode, b, want)
	}
	if !regexp.MustCompile(`^modelperm-[0-9a-f]{32}$`).MatchString(e.cards[0].Permission[0].ID) {
		t.Errorf("permission id %q", e.cards[0].Permission[0].ID)
	}
}

func TestHealth(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	for _, tc := range []struct {
		healthy bool
		want    int
	}{{true, 200}, {false, 503}, {true, 200}} {
		e.SetHealthy(tc.healthy)
		resp := mustSend(t, srv, "GET", "/health", "", nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.want || len(b) != 0 {
			t.Errorf("healthy=%v: got %d %q, want %d and no body", tc.healthy, resp.StatusCode, b, tc.want)
		}
	}
}

func TestErrors(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	tests := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		typ, msg                 string
	}{
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, nil, 404, "NotFoundError", "The model `nope` does not exist."},
		{"unknown model completions", "POST", "/v1/completions", `{"model":"nope","prompt":"hi"}`, nil, 404, "NotFoundError", "does not exist"},
		{"unknown model embeddings", "POST", "/v1/embeddings", `{"model":"nope","input":"hi"}`, nil, 404, "NotFoundError", "does not exist"},
		{"invalid JSON", "POST", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":true, x}`, nil, 400, "BadRequestError", "invalid JSON"},
		{"empty body", "POST", "/v1/completions", ``, nil, 400, "BadRequestError", "empty"},
		{"wrong field type", "POST", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}],"stream":"yes"}`, nil, 400, "BadRequestError", "invalid JSON"},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"m1"}`, nil, 400, "BadRequestError", "messages"},
		{"bad content", "POST", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":7}]}`, nil, 400, "BadRequestError", "content"},
		{"no prompt", "POST", "/v1/completions", `{"model":"m1"}`, nil, 400, "BadRequestError", "prompt is required"},
		{"bad prompt", "POST", "/v1/completions", `{"model":"m1","prompt":{"a":1}}`, nil, 400, "BadRequestError", "prompt must be"},
		{"empty input", "POST", "/v1/embeddings", `{"model":"m1","input":[]}`, nil, 400, "BadRequestError", "input must not be empty"},
		{"bad encoding_format", "POST", "/v1/embeddings", `{"model":"m1","input":"x","encoding_format":"hex"}`, nil, 400, "BadRequestError", "encoding_format"},
		{"max_tokens 0", "POST", "/v1/completions", `{"model":"m1","prompt":"x","max_tokens":0}`, nil, 400, "BadRequestError", "max_tokens must be at least 1"},
		{"bad fault", "POST", "/v1/completions", `{"model":"m1","prompt":"x"}`, fault("close-afterr=3"), 400, "BadRequestError", "unknown fault"},
		{"unknown path", "GET", "/v2/nothing", ``, nil, 404, "NotFoundError", "no route"},
		{"wrong method", "GET", "/v1/chat/completions", ``, nil, 405, "MethodNotAllowedError", "not allowed"},
	}
	rejected := int64(0)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, tc.method, tc.path, tc.body, tc.hdr)
			if tc.method == "POST" {
				rejected++
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Errorf("status = %d, want %d (%s)", resp.StatusCode, tc.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var eb struct {
				Error struct {
					Message string           `json:"message"`
					Type    string           `json:"type"`
					Param   *json.RawMessage `json:"param"`
					Code    int              `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &eb); err != nil {
				t.Fatalf("body %q: %v", b, err)
			}
			if !strings.Contains(string(b), `"param":null`) {
				t.Errorf("param not null: %s", b)
			}
			if eb.Error.Code != tc.status || eb.Error.Type != tc.typ || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("error = %+v, want code %d type %s message containing %q", eb.Error, tc.status, tc.typ, tc.msg)
			}
		})
	}
	s := waitIdle(t, e, rejected)
	if s.Completed+s.Aborted+s.Faulted != 0 {
		t.Errorf("rejected requests were accounted as outcomes: %+v", s)
	}
}

func TestServerHeader(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	tests := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
	}{
		{"models", "GET", "/v1/models", "", nil, 200},
		{"health", "GET", "/health", "", nil, 200},
		{"health HEAD", "HEAD", "/health", "", nil, 200},
		{"metrics", "GET", "/metrics", "", nil, 200},
		{"chat stream", "POST", "/v1/chat/completions", chatStreamBody, nil, 200},
		{"chat unary", "POST", "/v1/chat/completions", chatUnaryBody, nil, 200},
		{"completions", "POST", "/v1/completions", `{"model":"m2","prompt":"x y","max_tokens":2}`, nil, 200},
		{"embeddings", "POST", "/v1/embeddings", embedBody, nil, 200},
		{"unknown path", "GET", "/v2/nope", "", nil, 404},
		{"wrong method", "GET", "/v1/chat/completions", "", nil, 405},
		{"invalid JSON", "POST", "/v1/chat/completions", `{"model":`, nil, 400},
		{"unknown model", "POST", "/v1/embeddings", `{"model":"zz","input":"a"}`, nil, 404},
		{"too large", "POST", "/v1/completions", strings.Repeat(" ", maxBodyBytes+1), nil, 413},
		{"bad fault spec", "POST", "/v1/chat/completions", chatUnaryBody, fault("error-body=html"), 400},
		{"status fault", "POST", "/v1/chat/completions", chatUnaryBody, fault("status=503"), 503},
		{"html error body", "POST", "/v1/completions", `{"prompt":"a"}`, fault("status=502,error-body=html"), 502},
		{"empty error body", "POST", "/v1/embeddings", embedBody, fault("status=500,error-body=empty"), 500},
		{"close-after-headers", "POST", "/v1/chat/completions", chatStreamBody, fault("close-after-headers"), 200},
		{"truncate", "POST", "/v1/chat/completions", chatUnaryBody, fault("truncate"), 200},
		{"malformed", "POST", "/v1/embeddings", embedBody, fault("malformed"), 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, tc.method, tc.path, tc.body, tc.hdr)
			_, _ = io.Copy(io.Discard, resp.Body) // some faults end the body with an error
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := resp.Header.Values("Server"); len(got) != 1 || got[0] != "uvicorn" {
				t.Errorf("Server = %q, want [uvicorn]", got)
			}
			if v, ok := resp.Header["X-Powered-By"]; ok {
				t.Errorf("X-Powered-By %q without the powered-by fault", v)
			}
		})
	}
	e.SetHealthy(false)
	resp := mustSend(t, srv, "GET", "/health", "", nil)
	if resp.StatusCode != 503 || resp.Header.Get("Server") != "uvicorn" {
		t.Errorf("unhealthy: %d Server %q", resp.StatusCode, resp.Header.Get("Server"))
	}
}
