package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// bodyRecorder wraps an engine handler and keeps what each request carried
// (method, path, content type, body), so a test can check the engine got
// the client's bytes unchanged.
type bodyRecorder struct {
	next http.Handler
	mu   sync.Mutex
	got  []recorded
}

type recorded struct {
	method, path, query, contentType string
	body                             []byte
}

func (b *bodyRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/health" && r.URL.Path != "/v1/models" && r.URL.Path != "/metrics" {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.mu.Lock()
		b.got = append(b.got, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), body})
		b.mu.Unlock()
	}
	b.next.ServeHTTP(w, r)
}

// n returns how many requests were recorded.
func (b *bodyRecorder) n() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.got)
}

func (b *bodyRecorder) last() recorded {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.got) == 0 {
		return recorded{}
	}
	return b.got[len(b.got)-1]
}

// audioForm builds a multipart transcription body with the file part
// first and the model after it (clients may send them in any order).
func audioForm(t testing.TB, model string, stream bool) (body []byte, contentType string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, err := mw.CreateFormFile("file", "hello.wav")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write(bytes.Repeat([]byte("RIFF0000WAVEfmt "), 64))
	_ = mw.WriteField("response_format", "json")
	if stream {
		_ = mw.WriteField("stream", "true")
	}
	_ = mw.WriteField("model", model)
	_ = mw.Close()
	return b.Bytes(), mw.FormDataContentType()
}

// routeCase is one route of TestEveryRoute.
type routeCase struct {
	op          string // operation-table row
	method      string
	path        string
	body        string
	form        bool // a multipart audio body (body is ignored)
	stream      bool
	status      int
	contentType string                           // the answer's Content-Type prefix
	shape       func(t *testing.T, body []byte)  // checks the answer's shape
	released    routing.Phase                    // the phase the slot was released from; PhaseNone: no slot
	engineBody  func(t *testing.T, got recorded) // overrides the byte-for-byte check
}

// hasKeys checks that the JSON object b has every key.
func hasKeys(keys ...string) func(t *testing.T, b []byte) {
	return func(t *testing.T, b []byte) {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("answer is not a JSON object: %v: %.300q", err, b)
		}
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				t.Errorf("answer has no %q: %.300q", k, b)
			}
		}
	}
}

// sseEnds checks that an event stream ends with the framing's end.
func sseEnds(suffix string, contains ...string) func(t *testing.T, b []byte) {
	return func(t *testing.T, b []byte) {
		t.Helper()
		s := string(b)
		if !strings.HasSuffix(s, suffix) {
			t.Errorf("stream does not end with %q: %q", suffix, tail(s))
		}
		for _, c := range contains {
			if !strings.Contains(s, c) {
				t.Errorf("stream has no %q: %q", c, tail(s))
			}
		}
	}
}

var everyRoute = []routeCase{
	{op: "chat", path: "/v1/chat/completions", body: `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		status: 200, contentType: "application/json", shape: hasKeys("id", "choices", "usage"), released: routing.PhasePrefill},
	{op: "chat", path: "/v1/chat/completions", stream: true, body: `{"model":"m","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
		status: 200, contentType: "text/event-stream", shape: sseEnds("data: [DONE]\n\n", `"usage"`), released: routing.PhaseDecode},
	{op: "completions", path: "/v1/completions", stream: true, body: `{"model":"m","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"prompt":"hi"}`,
		status: 200, contentType: "text/event-stream", shape: sseEnds("data: [DONE]\n\n"), released: routing.PhaseDecode},
	{op: "responses", path: "/v1/responses", body: `{"model":"m","max_output_tokens":4,"input":"hi"}`,
		status: 200, contentType: "application/json", shape: hasKeys("id", "output", "usage", "status"), released: routing.PhasePrefill},
	{op: "responses", path: "/v1/responses", stream: true, body: `{"model":"m","max_output_tokens":4,"stream":true,"instructions":"be brief","input":[{"role":"user","content":"hi"}]}`,
		status: 200, contentType: "text/event-stream", shape: sseEnds("\n\n", "event: response.created", "event: response.output_text.delta", "event: response.completed"), released: routing.PhaseDecode},
	{op: "messages", path: "/v1/messages", body: `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		status: 200, contentType: "application/json", shape: hasKeys("id", "type", "content", "usage", "stop_reason"), released: routing.PhasePrefill},
	{op: "messages", path: "/v1/messages", stream: true, body: `{"model":"m","max_tokens":4,"stream":true,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`,
		status: 200, contentType: "text/event-stream", shape: sseEnds("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", "event: message_start", "event: content_block_delta"), released: routing.PhaseDecode},
	{op: "messages.count_tokens", path: "/v1/messages/count_tokens", body: `{"model":"m","messages":[{"role":"user","content":"hi there"}]}`,
		status: 200, contentType: "application/json", shape: hasKeys("input_tokens"), released: routing.PhaseNone},
	{op: "audio.transcriptions", path: "/v1/audio/transcriptions", form: true,
		status: 200, contentType: "application/json", shape: hasKeys("text"), released: routing.PhasePrefill},
	{op: "audio.transcriptions", path: "/v1/audio/transcriptions", form: true, stream: true,
		status: 200, contentType: "text/event-stream", shape: sseEnds("data: [DONE]\n\n"), released: routing.PhaseDecode},
	{op: "audio.translations", path: "/v1/audio/translations", form: true,
		status: 200, contentType: "application/json", shape: hasKeys("text"), released: routing.PhasePrefill},
	{op: "audio.speech", path: "/v1/audio/speech", body: `{"model":"m","input":"hello there","voice":"alloy"}`,
		status: 200, contentType: "audio/", shape: func(t *testing.T, b []byte) {
			if !bytes.HasPrefix(b, []byte("RIFF")) {
				t.Errorf("speech is not a WAV file: %.40q", b)
			}
		}, released: routing.PhasePrefill},
	{op: "images.generations", path: "/v1/images/generations", body: `{"model":"m","prompt":"a cat","n":1}`,
		status: 200, contentType: "application/json", shape: hasKeys("created", "data"), released: routing.PhasePrefill},
	{op: "embeddings", path: "/v1/embeddings", body: `{"model":"m","input":["a","b"]}`,
		status: 200, contentType: "application/json", shape: hasKeys("data", "usage"), released: routing.PhasePrefill},
	{op: "rerank", path: "/v1/rerank", body: `{"model":"m","query":"q","documents":["a","b"]}`,
		status: 200, contentType: "application/json", shape: hasKeys("results"), released: routing.PhasePrefill},
	{op: "rerank", path: "/v2/rerank", body: `{"model":"m","query":"q","documents":["a","b"]}`,
		status: 200, contentType: "application/json", shape: hasKeys("results"), released: routing.PhasePrefill},
	{op: "rerank", path: "/rerank", body: `{"query":"q","documents":["a","b"]}`, // no model: any engine
		status: 200, contentType: "application/json", shape: hasKeys("results"), released: routing.PhasePrefill},
	{op: "score", path: "/v1/score", body: `{"model":"m","text_1":"a","text_2":["b","c"]}`,
		status: 200, contentType: "application/json", shape: hasKeys("data"), released: routing.PhasePrefill},
	{op: "score", path: "/score", body: `{"model":"m","text_1":"a","text_2":"b"}`,
		status: 200, contentType: "application/json", shape: hasKeys("data"), released: routing.PhasePrefill},
	{op: "pooling", path: "/pooling", body: `{"model":"m","input":"a b"}`,
		status: 200, contentType: "application/json", shape: hasKeys("data"), released: routing.PhasePrefill},
	{op: "classify", path: "/classify", body: `{"model":"m","input":["a b"]}`,
		status: 200, contentType: "application/json", shape: hasKeys("data"), released: routing.PhasePrefill},
	{op: "tokenize", path: "/tokenize", body: `{"model":"m","prompt":"a b c"}`,
		status: 200, contentType: "application/json", shape: hasKeys("count", "tokens"), released: routing.PhaseNone},
	{op: "detokenize", path: "/detokenize", body: `{"model":"m","tokens":[1,2,3]}`,
		status: 200, contentType: "application/json", shape: hasKeys("prompt"), released: routing.PhaseNone},
}

// TestEveryRoute sends every route of the operation table through the
// gateway to the simulator and checks, for each: the status and the shape
// of the answer, that the engine received the client's body byte for byte
// (multipart included) on the same path, the phase the slot was released
// from for the route's class (decode after a stream's first token, prefill
// for a non-streaming or pooling answer, none for a light route), and one
// more duration sample carrying the route's operation attribute. Every row
// of the operation table must have a case here.
func TestEveryRoute(t *testing.T) {
	covered := map[string]bool{}
	for _, rc := range everyRoute {
		covered[rc.op] = true
	}
	covered["responses.retrieve"], covered["responses.cancel"] = true, true // TestResponsesSticky
	for _, op := range operations {
		if !covered[op.name] {
			t.Errorf("operation %q has no case in everyRoute", op.name)
		}
	}

	_, rec, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 4})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL})
	cfg.Migration.Limit = 0 // the body as sent, without return_token_ids (TestTokenIDsAsked)
	h := newHarness(t, cfg)

	var relMu sync.Mutex
	var released []routing.Phase
	h.gw.onRelease = func(_ string, p routing.Phase) {
		relMu.Lock()
		released = append(released, p)
		relMu.Unlock()
	}
	for _, rc := range everyRoute {
		name := rc.op + " " + rc.path
		if rc.stream {
			name += " stream"
		}
		t.Run(name, func(t *testing.T) {
			body, ct := []byte(rc.body), "application/json"
			if rc.form {
				body, ct = audioForm(t, "m", rc.stream)
			}
			method := rc.method
			if method == "" {
				method = http.MethodPost
			}
			opAttr := telemetry.AttrOperation.String(rc.op)
			before := h.histCount(telemetry.RequestDurationName, opAttr)
			ttftBefore := h.histCount(telemetry.TimeToFirstTokenName, opAttr)
			genaiOp := telemetry.AttrGenAIOp.String(opNamed(t, rc.op).genai)
			tokIn := h.histCount(telemetry.GenAIClientTokenUsageName, genaiOp, telemetry.AttrGenAITokType.String("input"))
			tokOut := h.histCount(telemetry.GenAIClientTokenUsageName, genaiOp, telemetry.AttrGenAITokType.String("output"))
			relMu.Lock()
			released = released[:0]
			relMu.Unlock()

			req, _ := http.NewRequest(method, h.srv.URL+rc.path, bytes.NewReader(body))
			req.Header.Set("Content-Type", ct)
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != rc.status {
				t.Fatalf("status %d, want %d: %.300q", resp.StatusCode, rc.status, got)
			}
			if c := resp.Header.Get("Content-Type"); !strings.HasPrefix(c, rc.contentType) {
				t.Errorf("Content-Type %q, want %s...", c, rc.contentType)
			}
			rc.shape(t, got)

			e := rec.last()
			if e.path != rc.path || e.method != method {
				t.Errorf("engine got %s %s, want %s %s", e.method, e.path, method, rc.path)
			}
			if !bytes.Equal(e.body, body) {
				t.Errorf("engine body differs from the client's:\n got %.300q\nwant %.300q", e.body, body)
			}
			if rc.form && e.contentType != ct {
				t.Errorf("engine Content-Type %q, want the client's %q", e.contentType, ct)
			}

			h.waitIdle()
			relMu.Lock()
			rel := append([]routing.Phase(nil), released...)
			relMu.Unlock()
			if len(rel) != 1 || rel[0] != rc.released {
				t.Errorf("released from %v, want [%v]", rel, rc.released)
			}
			if n := h.histCount(telemetry.RequestDurationName, opAttr); n != before+1 {
				t.Errorf("duration samples with operation=%s: %d, want %d", rc.op, n, before+1)
			}
			// Token usage: a light route spends none (a stored response read
			// again must not count its tokens twice), a pooling route no
			// output tokens.
			genai := telemetry.AttrGenAIOp.String(opNamed(t, rc.op).genai)
			in := h.histCount(telemetry.GenAIClientTokenUsageName, genai, telemetry.AttrGenAITokType.String("input"))
			out := h.histCount(telemetry.GenAIClientTokenUsageName, genai, telemetry.AttrGenAITokType.String("output"))
			switch rc.released {
			case routing.PhaseNone:
				if in+out != tokIn+tokOut {
					t.Errorf("a light route recorded token usage: %d+%d samples, had %d+%d", in, out, tokIn, tokOut)
				}
			case routing.PhasePrefill:
				if opNamed(t, rc.op).class == classPooling && out != tokOut {
					t.Errorf("a pooling route recorded output tokens")
				}
			}
			wantTTFT := ttftBefore
			if rc.released == routing.PhaseDecode {
				wantTTFT++
			}
			if n := h.histCount(telemetry.TimeToFirstTokenName, opAttr); n != wantTTFT {
				t.Errorf("TTFT samples with operation=%s: %d, want %d", rc.op, n, wantTTFT)
			}
		})
	}
}

// TestFormLimits sends bad multipart requests to the transcription route:
// each gets its error in the OpenAI envelope with the right status, and no
// engine is contacted (no slot taken).
func TestFormLimits(t *testing.T) {
	_, rec, srv := recordedSim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.MaxFormBytes = 4096
	h := newHarness(t, cfg)
	big, bigCT := audioForm(t, "m", false)
	for len(big) <= 4096 {
		big, bigCT = audioForm(t, strings.Repeat("m", 10), false)
		big = append(big, bytes.Repeat([]byte{'x'}, 4096)...)
	}
	noFile := "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n"
	for _, tc := range []struct {
		name, ct string
		body     []byte
		status   int
		param    string
	}{
		{"json body", "application/json", []byte(`{"model":"m"}`), 415, ""},
		{"no file", "multipart/form-data; boundary=b", []byte(noFile), 400, "file"},
		{"no boundary", "multipart/form-data", []byte(noFile), 400, ""},
		{"malformed content type", "multi part", []byte(noFile), 415, ""},
		{"malformed parameters", "multipart/form-data; boundary", []byte(noFile), 400, ""},
		{"too large", bigCT, big, 413, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/audio/transcriptions", bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.ct)
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			e := decodeErr(t, resp)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d (%s)", resp.StatusCode, tc.status, e.Error.Message)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Errorf("param %v, want %s", e.Error.Param, tc.param)
			}
		})
	}
	if n := rec.n(); n != 0 {
		t.Errorf("the engine got %d requests, want 0", n)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != 0 {
		t.Errorf("%d engine attempts recorded, want 0", n)
	}
	h.assertIdle()
}

// TestModelFromPathAndQuery adds rows whose model comes from a path
// parameter and from a query parameter (no current vLLM route does, the
// table supports both): each request goes to the engine serving that
// model, and an unknown one is a 404 before any engine is asked.
func TestModelFromPathAndQuery(t *testing.T) {
	answer := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"served_by":"`+name+`"}`)
		}
	}
	e1 := fakeEngine(t, []string{"a"}, answer("e1"))
	e2 := fakeEngine(t, []string{"b"}, answer("e2"))
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: e1.URL, Models: []string{"a"}}, fleet.EngineConfig{Name: "e2", URL: e2.URL, Models: []string{"b"}}))
	h.gw.ops = append(slices.Clone(operations),
		&operation{name: "test.query", genai: "test", method: http.MethodGet, paths: []string{"/v1/test/query"},
			body: bodyNone, model: modelQuery, param: "model", class: classLight, framing: frameAny},
		&operation{name: "test.path", genai: "test", method: http.MethodGet, paths: []string{"/v1/test/{model}/info"},
			body: bodyNone, model: modelPath, param: "model", class: classLight, framing: frameAny},
	)
	srv := httptest.NewServer(h.gw.Handler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ path, want string }{
		{"/v1/test/query?model=a", "e1"}, {"/v1/test/query?model=b", "e2"},
		{"/v1/test/a/info", "e1"}, {"/v1/test/b/info", "e2"},
	} {
		resp, err := srv.Client().Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != tc.want {
			t.Errorf("GET %s: %d from %q (%s), want 200 from %s", tc.path, resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), b, tc.want)
		}
	}
	before := h.histCount(telemetry.RequestDurationName)
	resp, err := srv.Client().Get(srv.URL + "/v1/test/query?model=nope")
	if err != nil {
		t.Fatal(err)
	}
	if e := decodeErr(t, resp); resp.StatusCode != 404 || e.code() != "model_not_found" {
		t.Errorf("unknown model: %d %v", resp.StatusCode, e)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != before {
		t.Errorf("an unknown model reached an engine")
	}
	h.waitIdle()
}
