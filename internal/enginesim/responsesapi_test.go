package enginesim

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

var (
	respIDRe = regexp.MustCompile(`^resp_[0-9a-f]{32}$`)
	msgIDRe  = regexp.MustCompile(`^msg_[0-9a-f]{32}$`)
)

// responseHead is the identifying part of a Responses API body.
type responseHead struct {
	ID        string `json:"id"`
	CreatedAt int64  `json:"created_at"`
	Status    string `json:"status"`
	Output    []struct {
		ID string `json:"id"`
	} `json:"output"`
}

// fillResponse replaces ID, CREATED, MSGID and RSID in want with the values of body.
func fillResponse(t *testing.T, body []byte, want string) string {
	t.Helper()
	h := decode[responseHead](t, body)
	if !respIDRe.MatchString(h.ID) {
		t.Errorf("id %q", h.ID)
	}
	r := []string{"ID", h.ID, "CREATED", strconv.FormatInt(h.CreatedAt, 10)}
	for _, o := range h.Output {
		switch {
		case strings.HasPrefix(o.ID, "msg_"):
			if !msgIDRe.MatchString(o.ID) {
				t.Errorf("message id %q", o.ID)
			}
			r = append(r, "MSGID", o.ID)
		case strings.HasPrefix(o.ID, "rs_"):
			r = append(r, "RSID", o.ID)
		}
	}
	return strings.NewReplacer(r...).Replace(want)
}

// responseJSON is the expected response body with the fields every test varies.
func responseJSON(status, details, instructions, metadata, output, temperature string, maxOut int, usage string) string {
	return `{"id":"ID","created_at":CREATED,"incomplete_details":` + details + `,"instructions":` + instructions +
		`,"metadata":` + metadata + `,"model":"m1","object":"response","output":` + output +
		`,"parallel_tool_calls":true,"temperature":` + temperature + `,"tool_choice":"auto","tools":[],"top_p":1,` +
		`"background":false,"max_output_tokens":` + strconv.Itoa(maxOut) + `,"max_tool_calls":null,"previous_response_id":null,` +
		`"prompt":null,"reasoning":null,"service_tier":"auto","status":"` + status + `","text":null,"top_logprobs":null,` +
		`"truncation":"disabled","usage":` + usage + `,"user":null,"input_messages":null,"output_messages":null}`
}

func responseUsageJSON(in, cached, out, reasoning int) string {
	return fmt.Sprintf(`{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,`+
		`"output_tokens_details":{"reasoning_tokens":%d,"tool_output_tokens":0},"total_tokens":%d}`, in, cached, out, reasoning, in+out)
}

func messageJSON(text string) string {
	return `{"id":"MSGID","content":[{"annotations":[],"text":"` + text + `","type":"output_text","logprobs":null}],` +
		`"role":"assistant","status":"completed","type":"message"}`
}

// responsesConfig generates 3 tokens unless cut.
func responsesConfig() Config {
	cfg := fastConfig()
	cfg.OutputTokens = 3
	return cfg
}

func TestResponsesUnary(t *testing.T) {
	e, srv := startEngine(t, responsesConfig())
	tests := []struct {
		name, body, fault, want string
	}{
		{
			name: "string input, natural length",
			body: `{"model":"m1","input":"hello there world"}`,
			want: responseJSON("completed", "null", "null", "null", "["+messageJSON("tok0 tok1 tok2 ")+"]", "1", 4096,
				responseUsageJSON(3, 0, 3, 0)),
		},
		{
			name: "items and instructions, cut by max_output_tokens",
			body: `{"input":[{"role":"user","content":[{"type":"input_text","text":"a b"},{"type":"input_image","image_url":"x"}]},` +
				`{"type":"message","role":"assistant","content":"c"}],"instructions":"be brief","max_output_tokens":2,` +
				`"temperature":0.5,"metadata":{"k":"v"}}`,
			want: responseJSON("incomplete", `{"reason":"max_output_tokens"}`, `"be brief"`, `{"k":"v"}`,
				"["+messageJSON("tok0 tok1 ")+"]", "0.5", 2, responseUsageJSON(5, 0, 2, 0)),
		},
		{
			name: "max_output_tokens above the natural length",
			body: `{"input":"x","max_output_tokens":100}`,
			want: responseJSON("completed", "null", "null", "null", "["+messageJSON("tok0 tok1 tok2 ")+"]", "1", 100,
				responseUsageJSON(1, 0, 3, 0)),
		},
		{
			name:  "reasoning fault",
			body:  `{"input":"x"}`,
			fault: "reasoning=2",
			want: responseJSON("completed", "null", "null", "null",
				`[{"id":"RSID","summary":[],"type":"reasoning","content":[{"text":"think0 think1 ","type":"reasoning_text"}],`+
					`"encrypted_content":null,"status":null},`+messageJSON("tok0 ")+`]`, "1", 4096, responseUsageJSON(1, 0, 3, 2)),
		},
		{
			name:  "no content",
			body:  `{"input":"x"}`,
			fault: "no-content",
			want:  responseJSON("completed", "null", "null", "null", "[]", "1", 4096, responseUsageJSON(1, 0, 0, 0)),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"X-Request-Id": "r-1"}
			if tc.fault != "" {
				hdr[FaultHeader] = tc.fault
			}
			resp := mustSend(t, srv, "POST", "/v1/responses", tc.body, hdr)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Request-Id") != "r-1" {
				t.Fatalf("got %d %v: %s", resp.StatusCode, resp.Header, b)
			}
			if want := fillResponse(t, b, tc.want); string(b) != want {
				t.Errorf("body:\n%s\nwant:\n%s", b, want)
			}
		})
	}
	s := waitIdle(t, e, 0)
	if s.Completed != int64(len(tests)) {
		t.Errorf("stats %+v", s)
	}
	mfs := testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")
	if got := counterValue(t, mfs, MetricRequestSuccess, "m1", "finished_reason", "length"); got != 1 {
		t.Errorf("length successes = %v, want 1", got)
	}
	if got := counterValue(t, mfs, MetricGenerationTokens, "m1"); got != 3+2+3+3 {
		t.Errorf("generation tokens = %v", got)
	}
}

// typedEvents checks that every data event carries "type" equal to its event name and
// "sequence_number" counting from 0, and returns the names.
func typedEvents(t *testing.T, evs []sseEvent, numbered bool) []string {
	t.Helper()
	var names []string
	for i, ev := range evs {
		if ev.comment != "" {
			continue
		}
		h := decode[struct {
			Type           string `json:"type"`
			SequenceNumber *int   `json:"sequence_number"`
		}](t, []byte(ev.data))
		if h.Type != ev.event {
			t.Errorf("event %d: event %q, data type %q", i, ev.event, h.Type)
		}
		if numbered && (h.SequenceNumber == nil || *h.SequenceNumber != len(names)) {
			t.Errorf("event %d (%s): sequence_number %v, want %d", i, ev.event, h.SequenceNumber, len(names))
		}
		names = append(names, ev.event)
	}
	return names
}

func TestResponsesStream(t *testing.T) {
	tests := []struct {
		name, fault string
		want        []string
		output      string // the completed response's output
		usage       string
	}{
		{
			name: "text",
			want: []string{
				"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
				"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
			},
			output: "[" + messageJSON("tok0 tok1 tok2 ") + "]",
			usage:  responseUsageJSON(2, 0, 3, 0),
		},
		{
			name:  "reasoning then text",
			fault: "reasoning=1",
			want: []string{
				"response.created", "response.in_progress",
				"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
				"response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
				"response.output_item.added", "response.content_part.added",
				"response.output_text.delta", "response.output_text.delta",
				"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
			},
			output: `[{"id":"RSID","summary":[],"type":"reasoning","content":[{"text":"think0 ","type":"reasoning_text"}],` +
				`"encrypted_content":null,"status":null},` + messageJSON("tok0 tok1 ") + `]`,
			usage: responseUsageJSON(2, 0, 3, 1),
		},
		{
			name:   "no content",
			fault:  "no-content",
			want:   []string{"response.created", "response.in_progress", "response.completed"},
			output: "[]",
			usage:  responseUsageJSON(2, 0, 0, 0),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, srv := startEngine(t, responsesConfig())
			resp := mustSend(t, srv, "POST", "/v1/responses", `{"model":"m1","input":"a b","stream":true}`, fault(tc.fault))
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			names := typedEvents(t, evs, true)
			if strings.Join(names, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("events\n%s\nwant\n%s", strings.Join(names, " "), strings.Join(tc.want, " "))
			}
			for _, ev := range evs {
				if strings.Contains(ev.data, "[DONE]") {
					t.Errorf("a [DONE] in the Responses stream")
				}
			}
			created := decode[struct {
				Response struct {
					ID     string `json:"id"`
					Status string `json:"status"`
					Usage  *struct{}
				} `json:"response"`
			}](t, []byte(evs[0].data))
			if created.Response.Status != "in_progress" || created.Response.Usage != nil || !respIDRe.MatchString(created.Response.ID) {
				t.Errorf("response.created %s", evs[0].data)
			}
			// The completed event carries the whole response, and it is stored.
			last := evs[len(evs)-1].data
			inner := strings.TrimSuffix(strings.TrimPrefix(last, `{"response":`), fmt.Sprintf(`,"sequence_number":%d,"type":"response.completed"}`, len(evs)-1))
			want := fillResponse(t, []byte(inner), responseJSON("completed", "null", "null", "null", tc.output, "1", 4096, tc.usage))
			if inner != want {
				t.Errorf("completed response:\n%s\nwant:\n%s", inner, want)
			}
			got := mustSend(t, srv, "GET", "/v1/responses/"+created.Response.ID, "", nil)
			b, _ := io.ReadAll(got.Body)
			if got.StatusCode != 200 || string(b) != inner {
				t.Errorf("GET stored: %d %s\nwant %s", got.StatusCode, b, inner)
			}
			wantOutcome(t, e, 1, 0, 0)
		})
	}
}

func TestResponsesStreamDeltas(t *testing.T) {
	_, srv := startEngine(t, responsesConfig())
	resp := mustSend(t, srv, "POST", "/v1/responses", `{"input":"a","stream":true}`, nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	h := decode[struct {
		Item struct {
			ID string `json:"id"`
		} `json:"item"`
	}](t, []byte(evs[2].data))
	id := h.Item.ID
	want := []string{
		`{"item":{"id":"` + id + `","content":[],"role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}`,
		`{"content_index":0,"item_id":"` + id + `","output_index":0,"part":{"annotations":[],"text":"","type":"output_text","logprobs":[]},"sequence_number":3,"type":"response.content_part.added"}`,
		`{"content_index":0,"delta":"tok0 ","item_id":"` + id + `","logprobs":[],"output_index":0,"sequence_number":4,"type":"response.output_text.delta"}`,
		`{"content_index":0,"delta":"tok1 ","item_id":"` + id + `","logprobs":[],"output_index":0,"sequence_number":5,"type":"response.output_text.delta"}`,
		`{"content_index":0,"delta":"tok2 ","item_id":"` + id + `","logprobs":[],"output_index":0,"sequence_number":6,"type":"response.output_text.delta"}`,
		`{"content_index":0,"item_id":"` + id + `","logprobs":[],"output_index":0,"sequence_number":7,"text":"tok0 tok1 tok2 ","type":"response.output_text.done"}`,
		`{"content_index":0,"item_id":"` + id + `","output_index":0,"part":{"annotations":[],"text":"tok0 tok1 tok2 ","type":"output_text","logprobs":null},"sequence_number":8,"type":"response.content_part.done"}`,
		`{"item":{"id":"` + id + `","content":[{"annotations":[],"text":"tok0 tok1 tok2 ","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"},"output_index":0,"sequence_number":9,"type":"response.output_item.done"}`,
	}
	for i, w := range want {
		if got := evs[2+i].data; got != w {
			t.Errorf("event %d:\n%s\nwant\n%s", 2+i, got, w)
		}
	}
}

func TestResponsesStore(t *testing.T) {
	cfg := responsesConfig()
	cfg.BlockSize = 4
	e, srv := startEngine(t, cfg)
	post := func(t *testing.T, body string) (int, []byte) {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/v1/responses", body, nil)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	get := func(t *testing.T, path string) (int, string) {
		t.Helper()
		resp := mustSend(t, srv, "GET", path, "", nil)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("stored by default", func(t *testing.T) {
		_, b := post(t, `{"input":"a b"}`)
		id := decode[responseHead](t, b).ID
		if code, got := get(t, "/v1/responses/"+id); code != 200 || got != string(b) {
			t.Errorf("GET: %d %s\nwant %s", code, got, b)
		}
	})
	t.Run("store false", func(t *testing.T) {
		_, b := post(t, `{"input":"a b","store":false}`)
		id := decode[responseHead](t, b).ID
		want := `{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":null,"code":404}}`
		if code, got := get(t, "/v1/responses/"+id); code != 404 || got != want {
			t.Errorf("GET: %d %s\nwant %s", code, got, want)
		}
	})
	t.Run("cancel a synchronous response", func(t *testing.T) {
		_, b := post(t, `{"input":"a b"}`)
		id := decode[responseHead](t, b).ID
		resp := mustSend(t, srv, "POST", "/v1/responses/"+id+"/cancel", "", nil)
		got, _ := io.ReadAll(resp.Body)
		want := `{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":null,"code":400}}`
		if resp.StatusCode != 400 || string(got) != want {
			t.Errorf("cancel: %d %s", resp.StatusCode, got)
		}
		resp = mustSend(t, srv, "POST", "/v1/responses/resp_nope/cancel", "", nil)
		if resp.StatusCode != 404 {
			t.Errorf("cancel unknown: %d", resp.StatusCode)
		}
	})
	t.Run("previous_response_id", func(t *testing.T) {
		_, b := post(t, `{"input":"w0 w1 w2 w3 w4"}`)
		id := decode[responseHead](t, b).ID
		// The follow-up's prompt: the previous prompt (5), its output (3) and the input (2);
		// its first block (4 tokens) was cached by the first request.
		_, b = post(t, `{"input":"w8 w9","previous_response_id":"`+id+`"}`)
		u := decode[struct {
			PreviousResponseID string `json:"previous_response_id"`
			Usage              struct {
				InputTokens        int `json:"input_tokens"`
				InputTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			} `json:"usage"`
		}](t, b)
		if u.PreviousResponseID != id || u.Usage.InputTokens != 10 || u.Usage.InputTokensDetails.CachedTokens != 4 {
			t.Errorf("follow-up %s", b)
		}
		code, b := post(t, `{"input":"x","previous_response_id":"resp_gone"}`)
		want := `{"error":{"message":"Response with id 'resp_gone' not found.","type":"invalid_request_error","param":null,"code":404}}`
		if code != 404 || string(b) != want {
			t.Errorf("unknown previous: %d %s", code, b)
		}
	})
	t.Run("replayed streams", func(t *testing.T) {
		if code, _ := get(t, "/v1/responses/resp_x?stream=true"); code != 400 {
			t.Errorf("stream=true: %d", code)
		}
	})
	waitIdle(t, e, 1) // the unknown previous_response_id
}

func TestResponsesStoreBounded(t *testing.T) {
	e, srv := startEngineWith(t, responsesConfig(), func(e *Engine) { e.responses = newResponseStore(2, 1<<20) })
	var ids []string
	for range 3 {
		resp := mustSend(t, srv, "POST", "/v1/responses", `{"input":"a"}`, nil)
		b, _ := io.ReadAll(resp.Body)
		ids = append(ids, decode[responseHead](t, b).ID)
	}
	for i, id := range ids {
		resp := mustSend(t, srv, "GET", "/v1/responses/"+id, "", nil)
		if want := map[bool]int{true: 404, false: 200}[i == 0]; resp.StatusCode != want {
			t.Errorf("response %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	// Bounded in bytes too: one large prompt evicts everything before it.
	e.responses.mu.Lock()
	e.responses.maxBytes = 4096
	e.responses.mu.Unlock()
	resp := mustSend(t, srv, "POST", "/v1/responses", `{"input":"`+strings.Repeat("w ", 4000)+`"}`, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	e.responses.mu.Lock()
	n, bytes := e.responses.order.Len(), e.responses.bytes
	e.responses.mu.Unlock()
	if n != 1 || bytes <= 4096 {
		t.Errorf("after a large response: %d stored, %d bytes", n, bytes)
	}
}

func TestResponsesBackground(t *testing.T) {
	cfg := responsesConfig()
	cfg.TTFT = time.Hour // on the fake clock; the real one must not matter
	cfg.ITL = time.Minute
	clk := testutil.NewClock(time.Unix(1_800_000_000, 0))
	e, srv := startEngineWith(t, cfg, func(e *Engine) { e.now = clk.Now })
	post := func(body string) (int, []byte) {
		resp := mustSend(t, srv, "POST", "/v1/responses", body, nil)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	get := func(id string) responseHead {
		resp := mustSend(t, srv, "GET", "/v1/responses/"+id, "", nil)
		b, _ := io.ReadAll(resp.Body)
		return decode[responseHead](t, b)
	}

	start := time.Now()
	code, b := post(`{"input":"a b","background":true}`)
	if d := time.Since(start); d > time.Minute {
		t.Errorf("background POST took %v, want an immediate answer", d)
	}
	want := fillResponse(t, b, strings.Replace(strings.Replace(responseJSON("queued", "null", "null", "null", "[]", "1", 4096, "null"),
		`"background":false`, `"background":true`, 1), "CREATED", "1800000000", 1))
	if code != 200 || string(b) != want {
		t.Fatalf("POST: %d %s\nwant %s", code, b, want)
	}
	id := decode[responseHead](t, b).ID
	if s := e.Stats(); s.Received != 1 || s.Running != 0 || s.Completed+s.Aborted+s.Faulted != 0 {
		t.Errorf("while generating: %+v", s)
	}
	if h := get(id); h.Status != "in_progress" || len(h.Output) != 0 {
		t.Errorf("GET before its time: %+v", h)
	}
	clk.Advance(time.Hour + 2*time.Minute - time.Nanosecond)
	if h := get(id); h.Status != "in_progress" {
		t.Errorf("GET just before its time: %+v", h)
	}
	clk.Advance(time.Nanosecond) // TTFT + 2 ITL: the third token is out
	if h := get(id); h.Status != "completed" || len(h.Output) != 1 {
		t.Errorf("GET after its time: %+v", h)
	}
	if s := e.Stats(); s.Completed != 1 || s.Aborted != 0 {
		t.Errorf("after completion: %+v", s)
	}

	// A second one is cancelled half way through its time to first token.
	_, b = post(`{"input":"a b","background":true}`)
	id2 := decode[responseHead](t, b).ID
	clk.Advance(30 * time.Minute)
	resp := mustSend(t, srv, "POST", "/v1/responses/"+id2+"/cancel", "", nil)
	cb, _ := io.ReadAll(resp.Body)
	if h := decode[responseHead](t, cb); resp.StatusCode != 200 || h.Status != "cancelled" || len(h.Output) != 0 {
		t.Errorf("cancel: %d %s", resp.StatusCode, cb)
	}
	clk.Advance(10 * time.Hour)
	if h := get(id2); h.Status != "cancelled" {
		t.Errorf("GET after cancel: %+v", h)
	}
	resp = mustSend(t, srv, "POST", "/v1/responses/"+id2+"/cancel", "", nil)
	if resp.StatusCode != 400 {
		t.Errorf("second cancel: %d", resp.StatusCode)
	}
	s := e.Stats()
	if s.Received != 2 || s.Completed != 1 || s.Aborted != 1 || s.Running != 0 {
		t.Errorf("stats %+v", s)
	}
	mfs := testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")
	if got := counterValue(t, mfs, MetricGenerationTokens, "m1"); got != 3 {
		t.Errorf("generation tokens %v, want 3 (the cancelled one never reached its first token)", got)
	}
	if got := series(t, mfs, MetricTimeToFirstToken, "m1").GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("TTFT samples %d, want 1", got)
	}
	if got := counterValue(t, mfs, MetricAbortedRequests, "m1"); got != 1 {
		t.Errorf("aborted %v", got)
	}

	// A third completes while nobody looks: /metrics counts it.
	_, _ = post(`{"input":"a b","background":true,"max_output_tokens":1}`)
	clk.Advance(time.Hour)
	mfs = testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")
	if got := counterValue(t, mfs, MetricRequestSuccess, "m1", "finished_reason", "length"); got != 1 {
		t.Errorf("length successes %v, want 1", got)
	}

	for _, tc := range []struct{ body, msg string }{
		{`{"input":"a","background":true,"store":false}`, "background can only be used when `store` is true"},
		{`{"input":"a","background":true,"stream":true}`, "enginesim does not stream background responses; set stream to false"},
	} {
		code, b := post(tc.body)
		want := `{"error":{"message":"` + tc.msg + `","type":"invalid_request_error","param":null,"code":400}}`
		if code != 400 || string(b) != want {
			t.Errorf("%s: %d %s", tc.body, code, b)
		}
	}
	s = waitIdle(t, e, 2)
	if s.Completed != 2 || s.Aborted != 1 {
		t.Errorf("final stats %+v", s)
	}
}

func TestResponsesErrors(t *testing.T) {
	e, srv := startEngine(t, responsesConfig())
	tests := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"no input", `{"model":"m1"}`, 400, "input is required"},
		{"bad input", `{"input":7}`, 400, "input must be a string or an array"},
		{"empty input", `{"input":[]}`, 400, "input must not be empty"},
		{"bad item", `{"input":[{"type":"bogus"}]}`, 400, "input[0] must be a message"},
		{"bad content", `{"input":[{"role":"user","content":7}]}`, 400, "input[0].content"},
		{"zero max_output_tokens", `{"input":"a","max_output_tokens":0}`, 400, "max_output_tokens must be at least 1"},
		{"unknown model", `{"model":"nope","input":"a"}`, 404, "The model `nope` does not exist."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", "/v1/responses", tc.body, nil)
			b, _ := io.ReadAll(resp.Body)
			eb := decode[errorBody](t, b)
			if resp.StatusCode != tc.status || eb.Error.Code != tc.status || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("got %d %s", resp.StatusCode, b)
			}
		})
	}
	if resp := mustSend(t, srv, "GET", "/v1/responses", "", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/responses: %d", resp.StatusCode)
	}
	waitIdle(t, e, int64(len(tests)))
}
