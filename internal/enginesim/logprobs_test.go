package enginesim

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// chatLogprobEntry decodes one element of chat's logprobs.content.
type chatLogprobEntry struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []int   `json:"bytes"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		Bytes   []int   `json:"bytes"`
	} `json:"top_logprobs"`
}

// checkChatEntry checks one chat logprob entry: the token (the delta's text), logprob <= 0,
// its UTF-8 bytes, top entries best first with the sampled token first, each with its
// bytes.
func checkChatEntry(t *testing.T, e chatLogprobEntry, token string, top int) {
	t.Helper()
	if e.Token != token || e.Logprob > 0 || e.Logprob < -9999 || !reflect.DeepEqual(e.Bytes, utf8Bytes(token)) {
		t.Errorf("entry %+v for token %q", e, token)
	}
	if len(e.TopLogprobs) != top || e.TopLogprobs == nil {
		t.Fatalf("%d top logprobs (%v), want %d", len(e.TopLogprobs), e.TopLogprobs, top)
	}
	for i, tl := range e.TopLogprobs {
		if i == 0 && (tl.Token != token || tl.Logprob != e.Logprob) {
			t.Errorf("top_logprobs[0] = %+v, want the sampled token", tl)
		}
		if i > 0 && tl.Logprob >= e.TopLogprobs[i-1].Logprob {
			t.Errorf("top_logprobs not strictly descending: %+v", e.TopLogprobs)
		}
		if !reflect.DeepEqual(tl.Bytes, utf8Bytes(tl.Token)) {
			t.Errorf("top_logprobs[%d] bytes %v for %q", i, tl.Bytes, tl.Token)
		}
	}
}

// TestLogprobsChat checks chat logprobs streamed and not: one entry per generated token,
// reasoning tokens included, {"content":[]} on the chunks without a token, and the
// non-stream body's entries equal to the stream's.
func TestLogprobsChat(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	for _, top := range []int{0, 3, 20} {
		t.Run("top_logprobs "+strconv.Itoa(top), func(t *testing.T) {
			body := `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":4,"logprobs":true,"top_logprobs":` + strconv.Itoa(top)
			hdr := map[string]string{FaultHeader: "reasoning=1,tool-call", "X-Request-Id": "lp"}
			resp := mustSend(t, srv, "POST", "/v1/chat/completions", body+`,"stream":true}`, hdr)
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			data := dataEvents(evs)
			// role, tool call, 4 tokens, finish, [DONE]
			if len(data) != 8 {
				t.Fatalf("events %q", data)
			}
			var streamed []chatLogprobEntry
			for i, d := range data[:len(data)-1] {
				var c struct {
					Choices []struct {
						Delta struct {
							Content          *string `json:"content"`
							ReasoningContent string  `json:"reasoning_content"`
						} `json:"delta"`
						Logprobs *struct {
							Content []chatLogprobEntry `json:"content"`
						} `json:"logprobs"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Fatal(err)
				}
				lp := c.Choices[0].Logprobs
				switch i {
				case 0: // the role chunk: null, as in vLLM
					if lp != nil {
						t.Errorf("role chunk logprobs %s", d)
					}
				case 1, len(data) - 2: // the tool call and the finish chunk: no token
					if lp == nil || lp.Content == nil || len(lp.Content) != 0 || !strings.Contains(d, `"logprobs":{"content":[]}`) {
						t.Errorf("chunk %d without a token: %s", i, d)
					}
				default:
					if lp == nil || len(lp.Content) != 1 {
						t.Fatalf("chunk %d: %s", i, d)
					}
					text := c.Choices[0].Delta.ReasoningContent
					if c.Choices[0].Delta.Content != nil {
						text = *c.Choices[0].Delta.Content
					}
					checkChatEntry(t, lp.Content[0], text, top)
					streamed = append(streamed, lp.Content[0])
				}
			}
			if streamed[0].Token != ReasoningToken(0) || streamed[1].Token != ContentToken(0) {
				t.Errorf("tokens %q %q", streamed[0].Token, streamed[1].Token)
			}

			resp = mustSend(t, srv, "POST", "/v1/chat/completions", body+`}`, hdr)
			b, _ := io.ReadAll(resp.Body)
			var out struct {
				Choices []struct {
					Logprobs struct {
						Content []chatLogprobEntry `json:"content"`
					} `json:"logprobs"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out.Choices[0].Logprobs.Content, streamed) {
				t.Errorf("non-stream logprobs %+v\nstreamed %+v", out.Choices[0].Logprobs.Content, streamed)
			}
		})
	}
}

// TestLogprobsCompletions checks completions logprobs: per chunk one token whose
// text_offset counts from the start of the whole text, max(k, 1) top entries in order (the
// sampled token first), empty arrays on the finish chunk, and the non-stream body equal to
// the streamed arrays concatenated.
func TestLogprobsCompletions(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	for _, k := range []int{0, 2, 5} {
		t.Run("logprobs "+strconv.Itoa(k), func(t *testing.T) {
			body := `{"model":"m2","prompt":"x y z","max_tokens":12,"logprobs":` + strconv.Itoa(k)
			type lps struct {
				TextOffset    []int                `json:"text_offset"`
				TokenLogprobs []float64            `json:"token_logprobs"`
				Tokens        []string             `json:"tokens"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			}
			type choice struct {
				Text     string `json:"text"`
				Logprobs *lps   `json:"logprobs"`
			}
			resp := mustSend(t, srv, "POST", "/v1/completions", body+`,"stream":true}`, nil)
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			data := dataEvents(evs)
			if len(data) != 14 {
				t.Fatalf("%d events", len(data))
			}
			var all lps
			text := ""
			for i, d := range data[:13] {
				var c struct{ Choices []choice }
				if err := json.Unmarshal([]byte(d), &c); err != nil {
					t.Fatal(err)
				}
				lp := c.Choices[0].Logprobs
				if lp == nil {
					t.Fatalf("chunk %d without logprobs: %s", i, d)
				}
				if i == 12 {
					if !strings.Contains(d, `"logprobs":{"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[]}`) {
						t.Errorf("finish chunk %s", d)
					}
					continue
				}
				if len(lp.Tokens) != 1 || lp.Tokens[0] != c.Choices[0].Text || lp.TextOffset[0] != len(text) ||
					lp.TokenLogprobs[0] > 0 || len(lp.TopLogprobs[0]) != max(k, 1) || lp.TopLogprobs[0][lp.Tokens[0]] != lp.TokenLogprobs[0] {
					t.Errorf("chunk %d: %s", i, d)
				}
				// The map is written best first, the sampled token first.
				if first := `"top_logprobs":[{` + strconv.Quote(lp.Tokens[0]) + `:`; !strings.Contains(d, first) {
					t.Errorf("chunk %d top_logprobs does not start with the sampled token: %s", i, d)
				}
				for tok, v := range lp.TopLogprobs[0] {
					if tok != lp.Tokens[0] && v >= lp.TokenLogprobs[0] {
						t.Errorf("chunk %d: %q at %v above the sampled token", i, tok, v)
					}
				}
				text += c.Choices[0].Text
				all.TextOffset = append(all.TextOffset, lp.TextOffset...)
				all.TokenLogprobs = append(all.TokenLogprobs, lp.TokenLogprobs...)
				all.Tokens = append(all.Tokens, lp.Tokens...)
				all.TopLogprobs = append(all.TopLogprobs, lp.TopLogprobs...)
			}
			resp = mustSend(t, srv, "POST", "/v1/completions", body+`}`, nil)
			b, _ := io.ReadAll(resp.Body)
			var out struct{ Choices []choice }
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
			if c := out.Choices[0]; c.Text != text || c.Logprobs == nil || !reflect.DeepEqual(*c.Logprobs, all) {
				t.Errorf("non-stream %s\nstreamed %+v", b, all)
			}
		})
	}
}

// TestLogprobsDeterministic checks that logprobs depend on the model and the position only.
func TestLogprobsDeterministic(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	get := func(model string) string {
		resp := mustSend(t, srv, "POST", "/v1/completions", `{"model":"`+model+`","prompt":"p","max_tokens":3,"logprobs":3}`, nil)
		b, _ := io.ReadAll(resp.Body)
		var out struct {
			Choices []struct {
				Logprobs json.RawMessage `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return string(out.Choices[0].Logprobs)
	}
	if a, b := get("m1"), get("m1"); a != b {
		t.Errorf("m1 twice: %s and %s", a, b)
	}
	if a, b := get("m1"), get("m2"); a == b {
		t.Errorf("m1 and m2 give the same logprobs %s", a)
	}
}

// TestLogprobsValidation checks vLLM's 400s for logprobs fields.
func TestLogprobsValidation(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	chat := `{"model":"m1","messages":[{"role":"user","content":"x"}],`
	cmpl := `{"model":"m1","prompt":"x",`
	tests := []struct {
		name, path, body, want string
	}{
		{"top_logprobs without logprobs", "/v1/chat/completions", chat + `"top_logprobs":2}`, "`logprobs` must be set to true"},
		{"top_logprobs with logprobs false", "/v1/chat/completions", chat + `"logprobs":false,"top_logprobs":1}`, "`logprobs` must be set to true"},
		{"negative top_logprobs", "/v1/chat/completions", chat + `"logprobs":true,"top_logprobs":-1}`, "`top_logprobs` must be a positive value."},
		{"too many top_logprobs", "/v1/chat/completions", chat + `"logprobs":true,"top_logprobs":21}`, "Requested sample logprobs of 21, which is greater than max allowed: 20"},
		{"chat logprobs not a boolean", "/v1/chat/completions", chat + `"logprobs":2}`, "logprobs must be a boolean"},
		{"negative completions logprobs", "/v1/completions", cmpl + `"logprobs":-1}`, "`logprobs` must be a positive value."},
		{"too many completions logprobs", "/v1/completions", cmpl + `"logprobs":21}`, "greater than max allowed: 20"},
		{"completions logprobs not an integer", "/v1/completions", cmpl + `"logprobs":true}`, "logprobs must be an integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", tc.path, tc.body, nil)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tc.want) {
				t.Errorf("%d %s, want 400 with %q", resp.StatusCode, b, tc.want)
			}
		})
	}
	for _, ok := range []string{chat + `"logprobs":true,"top_logprobs":20}`, chat + `"logprobs":null,"top_logprobs":0}`, chat + `"logprobs":false}`} {
		resp := mustSend(t, srv, "POST", "/v1/chat/completions", ok, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", ok, resp.StatusCode)
		}
	}
}

// TestLogprobsOffByDefault checks that logprobs are null without the request fields.
func TestLogprobsOffByDefault(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"x","max_tokens":1,"logprobs":null}`, nil)
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"logprobs":null`) {
		t.Errorf("body %s", b)
	}
}

// TestGenerationIDFromRequestID checks vLLM's response ids: "chatcmpl-" or "cmpl-" and the
// X-Request-Id header, else the body's request_id, else 32 random hex digits; the same
// streaming or not.
func TestGenerationIDFromRequestID(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	tests := []struct {
		name, path, body string
		hdr              map[string]string
		want             string // "" for a random id
	}{
		{"chat header", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"x"}],"request_id":"body"`, map[string]string{"X-Request-Id": "hdr-1"}, "chatcmpl-hdr-1"},
		{"chat body field", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"x"}],"request_id":"body-1"`, nil, "chatcmpl-body-1"},
		{"chat random", "/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"x"}]`, nil, ""},
		{"completions header", "/v1/completions", `{"model":"m1","prompt":"x"`, map[string]string{"X-Request-Id": "hdr-2"}, "cmpl-hdr-2"},
		{"completions body field", "/v1/completions", `{"model":"m1","prompt":"x","request_id":"body-2"`, nil, "cmpl-body-2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ids []string
			for _, stream := range []string{`,"stream":false}`, `,"stream":true}`} {
				resp := mustSend(t, srv, "POST", tc.path, tc.body+stream, tc.hdr)
				b, _ := io.ReadAll(resp.Body)
				first := strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "data: ")
				id, _ := chunkHead(t, first)
				ids = append(ids, id)
			}
			for _, id := range ids {
				switch {
				case tc.want != "" && id != tc.want:
					t.Errorf("id %q, want %q", id, tc.want)
				case tc.want == "" && !chatIDRe.MatchString(id):
					t.Errorf("random id %q", id)
				}
			}
			if tc.want == "" && ids[0] == ids[1] {
				t.Errorf("two random ids are equal: %q", ids[0])
			}
		})
	}
}

// TestGenerationShapes pins vLLM 0.10.1's chat and completions shapes, field for field: every
// field of a non-stream body with its null default, a chat chunk's fields as vLLM sets them,
// every field of a completions chunk, and the usage chunk without null fields.
func TestGenerationShapes(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	hdr := map[string]string{"X-Request-Id": "r"}
	chat := `{"model":"m1","messages":[{"role":"user","content":"a b"}],"max_tokens":1`
	cmpl := `{"model":"m1","prompt":"a b","max_tokens":1`
	const created = `"created":CREATED,`
	tests := []struct {
		name, path, body, fault string
		want                    []string // the data events, or the body
	}{
		{
			name: "chat", path: "/v1/chat/completions", body: chat + `}`,
			want: []string{`{"id":"chatcmpl-r","object":"chat.completion",` + created + `"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 ",` +
				`"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`},
		},
		{
			name: "chat all reasoning", path: "/v1/chat/completions", body: chat + `}`, fault: "reasoning=3",
			want: []string{`{"id":"chatcmpl-r","object":"chat.completion",` + created + `"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":null,` +
				`"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"think0 "},"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}`},
		},
		{
			name: "chat stream with a tool call", path: "/v1/chat/completions", body: chat + `,"stream":true,"stream_options":{"include_usage":true}}`, fault: "tool-call",
			want: []string{
				`{"id":"chatcmpl-r","object":"chat.completion.chunk",` + created + `"model":"m1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-r","object":"chat.completion.chunk",` + created + `"model":"m1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-r","object":"chat.completion.chunk",` + created + `"model":"m1","choices":[{"index":0,"delta":{"content":"tok0 "},"logprobs":null,"finish_reason":null}]}`,
				`{"id":"chatcmpl-r","object":"chat.completion.chunk",` + created + `"model":"m1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
				`{"id":"chatcmpl-r","object":"chat.completion.chunk",` + created + `"model":"m1","choices":[],"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1}}`,
				`[DONE]`,
			},
		},
		{
			name: "completions", path: "/v1/completions", body: cmpl + `}`,
			want: []string{`{"id":"cmpl-r","object":"text_completion",` + created + `"model":"m1","choices":[{"index":0,"text":"tok0 ","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],` +
				`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1,"prompt_tokens_details":null},"kv_transfer_params":null}`},
		},
		{
			name: "completions stream", path: "/v1/completions", body: cmpl + `,"stream":true,"stream_options":{"include_usage":true}}`,
			want: []string{
				`{"id":"cmpl-r","object":"text_completion",` + created + `"model":"m1","choices":[{"index":0,"text":"tok0 ","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}`,
				`{"id":"cmpl-r","object":"text_completion",` + created + `"model":"m1","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null}`,
				`{"id":"cmpl-r","object":"text_completion",` + created + `"model":"m1","choices":[],"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1}}`,
				`[DONE]`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{"X-Request-Id": hdr["X-Request-Id"]}
			if tc.fault != "" {
				h[FaultHeader] = tc.fault
			}
			resp := mustSend(t, srv, "POST", tc.path, tc.body, h)
			var got []string
			if strings.Contains(tc.body, `"stream":true`) {
				evs, err := readEvents(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				got = dataEvents(evs)
			} else {
				b, _ := io.ReadAll(resp.Body)
				got = []string{string(b)}
			}
			_, c := chunkHead(t, got[0])
			want := strings.Join(tc.want, "\n")
			want = strings.ReplaceAll(want, "CREATED", strconv.FormatInt(c, 10))
			if g := strings.Join(got, "\n"); g != want {
				t.Errorf("got\n%s\nwant\n%s", g, want)
			}
		})
	}
}
