package enginesim

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestMessagesUnary(t *testing.T) {
	e, srv := startEngine(t, responsesConfig())
	tests := []struct {
		name, body, fault, want string
	}{
		{
			name: "string content and system, natural length",
			body: `{"model":"m1","max_tokens":100,"system":"be nice","messages":[{"role":"user","content":"hi there"}],"metadata":{"user_id":"u"}}`,
			want: `{"id":"ID","type":"message","role":"assistant","model":"m1","content":[{"type":"text","text":"tok0 tok1 tok2 "}],` +
				`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":4,"output_tokens":3}}`,
		},
		{
			name: "blocks, cut by max_tokens",
			body: `{"model":"m2","max_tokens":2,"system":[{"type":"text","text":"sys"}],"messages":[` +
				`{"role":"user","content":[{"type":"text","text":"a b"},{"type":"image","source":{"data":"x"}}]},` +
				`{"role":"assistant","content":"c"},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"d e"}]}]}]}`,
			want: `{"id":"ID","type":"message","role":"assistant","model":"m2","content":[{"type":"text","text":"tok0 tok1 "}],` +
				`"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":6,"output_tokens":2}}`,
		},
		{
			name:  "thinking",
			body:  `{"model":"m1","max_tokens":100,"messages":[{"role":"user","content":"x"}]}`,
			fault: "reasoning=1",
			want: `{"id":"ID","type":"message","role":"assistant","model":"m1","content":[{"type":"thinking","thinking":"think0 ","signature":"SIG"},` +
				`{"type":"text","text":"tok0 tok1 "}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":3}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", "/v1/messages", tc.body, fault(tc.fault))
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("got %d: %s", resp.StatusCode, b)
			}
			h := decode[struct {
				ID      string `json:"id"`
				Content []struct {
					Signature string `json:"signature"`
				} `json:"content"`
			}](t, b)
			if !msgIDRe.MatchString(h.ID) {
				t.Errorf("id %q", h.ID)
			}
			want := strings.NewReplacer("ID", h.ID, "SIG", h.Content[0].Signature).Replace(tc.want)
			if string(b) != want {
				t.Errorf("body:\n%s\nwant:\n%s", b, want)
			}
		})
	}
	wantOutcome(t, e, 3, 0, 0)
}

func TestMessagesStream(t *testing.T) {
	const head = `{"type":"message_start","message":{"id":"ID","type":"message","role":"assistant","model":"m1","content":[],` +
		`"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2,"output_tokens":1}}}`
	text := func(i int, s string) string {
		return `{"type":"content_block_delta","index":` + string(rune('0'+i)) + `,"delta":{"type":"text_delta","text":"` + s + `"}}`
	}
	tests := []struct {
		name, body, fault string
		want              []string // "event data" lines
	}{
		{
			name: "text",
			body: `{"model":"m1","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"a b"}]}`,
			want: []string{
				"message_start " + head,
				`content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
				`ping {"type":"ping"}`,
				"content_block_delta " + text(0, "tok0 "),
				"content_block_delta " + text(0, "tok1 "),
				`content_block_stop {"type":"content_block_stop","index":0}`,
				`message_delta {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":2}}`,
				`message_stop {"type":"message_stop"}`,
			},
		},
		{
			name:  "thinking then text",
			body:  `{"model":"m1","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"a b"}]}`,
			fault: "reasoning=1",
			want: []string{
				"message_start " + head,
				`content_block_start {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`,
				`ping {"type":"ping"}`,
				`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"think0 "}}`,
				`content_block_delta {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"SIG"}}`,
				`content_block_stop {"type":"content_block_stop","index":0}`,
				`content_block_start {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
				"content_block_delta " + text(1, "tok0 "),
				"content_block_delta " + text(1, "tok1 "),
				`content_block_stop {"type":"content_block_stop","index":1}`,
				`message_delta {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}`,
				`message_stop {"type":"message_stop"}`,
			},
		},
		{
			name:  "no content",
			body:  `{"model":"m1","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"a b"}]}`,
			fault: "no-content",
			want: []string{
				"message_start " + head,
				`ping {"type":"ping"}`,
				`message_delta {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":0}}`,
				`message_stop {"type":"message_stop"}`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, srv := startEngine(t, responsesConfig())
			resp := mustSend(t, srv, "POST", "/v1/messages", tc.body, fault(tc.fault))
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			typedEvents(t, evs, false)
			id := decode[struct {
				Message struct {
					ID string `json:"id"`
				} `json:"message"`
			}](t, []byte(evs[0].data)).Message.ID
			sig := ""
			var got []string
			for _, ev := range evs {
				if s := decode[struct {
					Delta struct {
						Signature string `json:"signature"`
					} `json:"delta"`
				}](t, []byte(ev.data)).Delta.Signature; s != "" {
					sig = s
				}
				got = append(got, ev.event+" "+ev.data)
			}
			want := strings.NewReplacer("ID", id, "SIG", sig).Replace(strings.Join(tc.want, "\n"))
			if strings.Join(got, "\n") != want {
				t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
			}
			wantOutcome(t, e, 1, 0, 0)
		})
	}
}

func TestMessagesErrors(t *testing.T) {
	e, srv := startEngine(t, responsesConfig())
	msg := `"messages":[{"role":"user","content":"hi"}]`
	tests := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		want                     string // the whole body
		counted                  bool   // a tracked request (Received)
		faulted                  bool   // ended by a fault (else rejected, when counted)
	}{
		{"unknown model", "POST", "/v1/messages", `{"model":"nope","max_tokens":5,` + msg + `}`, nil, 404,
			`{"type":"error","error":{"type":"not_found_error","message":"The model ` + "`nope`" + ` does not exist."}}`, true, false},
		{"no max_tokens", "POST", "/v1/messages", `{"model":"m1",` + msg + `}`, nil, 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}`, true, false},
		{"no model", "POST", "/v1/messages", `{"max_tokens":5,` + msg + `}`, nil, 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"model: Field required"}}`, true, false},
		{"bad role", "POST", "/v1/messages", `{"model":"m1","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, nil, 400,
			`{"type":"error","error":{"type":"invalid_request_error","message":"messages[0].role must be user or assistant, got \"system\""}}`, true, false},
		{"invalid JSON", "POST", "/v1/messages", `{"model":`, nil, 400, "", true, false},
		{"wrong method", "GET", "/v1/messages", ``, nil, 405,
			`{"type":"error","error":{"type":"invalid_request_error","message":"method GET not allowed; use POST"}}`, false, false},
		{"status fault 503", "POST", "/v1/messages", `{"model":"m1","max_tokens":5,` + msg + `}`, fault("status=503"), 503,
			`{"type":"error","error":{"type":"overloaded_error","message":"enginesim: injected fault status=503"}}`, true, true},
		{"status fault 429", "POST", "/v1/messages", `{"model":"m1","max_tokens":5,` + msg + `}`, fault("status=429"), 429,
			`{"type":"error","error":{"type":"rate_limit_error","message":"enginesim: injected fault status=429"}}`, true, true},
		{"status fault 500", "POST", "/v1/messages", `{"model":"m1","max_tokens":5,` + msg + `}`, fault("status=500"), 500,
			`{"type":"error","error":{"type":"api_error","message":"enginesim: injected fault status=500"}}`, true, true},
		{"bad fault spec", "POST", "/v1/messages", `{"model":"m1","max_tokens":5,` + msg + `}`, fault("nope"), 400, "", true, false},
		{"count_tokens unknown model", "POST", "/v1/messages/count_tokens", `{"model":"nope",` + msg + `}`, nil, 404,
			`{"type":"error","error":{"type":"not_found_error","message":"The model ` + "`nope`" + ` does not exist."}}`, false, false},
		{"count_tokens status fault", "POST", "/v1/messages/count_tokens", `{"model":"m1",` + msg + `}`, fault("status=401"), 401,
			`{"type":"error","error":{"type":"authentication_error","message":"enginesim: injected fault status=401"}}`, false, false},
	}
	var received, faulted int64
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, tc.method, tc.path, tc.body, tc.hdr)
			b, _ := io.ReadAll(resp.Body)
			if tc.counted {
				received++
			}
			if tc.faulted {
				faulted++
			}
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			eb := decode[anthropicError](t, b)
			if eb.Type != "error" || eb.Error.Type == "" || eb.Error.Message == "" {
				t.Errorf("not Anthropic's envelope: %s", b)
			}
			if tc.want != "" && string(b) != tc.want {
				t.Errorf("body:\n%s\nwant:\n%s", b, tc.want)
			}
		})
	}
	s := waitIdle(t, e, received-faulted)
	if s.Received != received || s.Faulted != faulted {
		t.Errorf("stats %+v, want %d received, %d faulted", s, received, faulted)
	}
}

func TestMessagesCountTokens(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/messages/count_tokens",
		`{"model":"m1","system":"be nice","messages":[{"role":"user","content":[{"type":"text","text":"a b c"}]}]}`, nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(b) != `{"input_tokens":5}` {
		t.Errorf("got %d %s", resp.StatusCode, b)
	}
	if s := e.Stats(); s.Received != 0 {
		t.Errorf("count_tokens was counted as a generation request: %+v", s)
	}
}
