package gateway

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
)

// newCrossHarness serves model a on engine a1 (with fault) and model b on
// engine b1, models.fallbacks {a: [b]}: a continuation of a's answer has
// no engine of a left and crosses to b.
//
// b1's POST /tokenize calls are counted in its tokenized: a crossing must ask
// b's tokenizer (the two simulators share one id space, so ids of a sent
// to b would pass unnoticed otherwise).
func newCrossHarness(t *testing.T, fault string, tune func(*Config)) (*crossHarness, *enginesim.Engine) {
	t.Helper()
	ch := &crossHarness{}
	ea, sa := sim(t, enginesim.Config{Models: []string{"a"}, Fault: fault})
	eb, sb := sim(t, enginesim.Config{Models: []string{"b"}})
	proxy := httputil.NewSingleHostReverseProxy(mustURL(t, sb.URL))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/tokenize" {
			ch.tokenized.Add(1)
		}
		// Full duplex: else net/http closes the request body when the
		// (fast) engine's answer starts, and the proxy's Transport may
		// drop the engine connection mid-stream (golang/go#40747).
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	cfg := testConfig(fleet.EngineConfig{Name: "a1", URL: sa.URL, Models: []string{"a"}}, fleet.EngineConfig{Name: "b1", URL: front.URL, Models: []string{"b"}})
	cfg.Models.Fallbacks = map[string][]string{"a": {"b"}}
	if tune != nil {
		tune(&cfg)
	}
	rh := &retryHarness{harness: newHarness(t, cfg), e1: ea, e2: eb, rel: map[string][]routing.Phase{}}
	ch.retryHarness = rh
	rh.gw.onRelease = func(engine string, p routing.Phase) {
		rh.mu.Lock()
		rh.rel[engine] = append(rh.rel[engine], p)
		rh.mu.Unlock()
	}
	return ch, eb
}

// crossHarness is a retryHarness whose b1 counts its POST /tokenize
// calls in tokenized.
type crossHarness struct {
	*retryHarness
	tokenized atomic.Int64
}

// checkCrossed checks the accounting of an answer begun on a1 and
// finished on b1: one release each (b1's from decode), one rescued
// continuation, one fallback a>b for continuation, gauges at 0.
func checkCrossed(t *testing.T, rh *crossHarness) {
	t.Helper()
	rh.waitIdle()
	if n := rh.tokenized.Load(); n != 2 {
		t.Errorf("b1's /tokenize was called %d times, want 2 (the prompt, the text)", n)
	}
	rh.checkHandOver(t, "a1", "b1")
	if got := rh.migrations(); len(got) != 1 || got["engine_disconnect/rescued"] != 1 {
		t.Errorf("migrations %v, want engine_disconnect/rescued 1", got)
	}
	if got := rh.fallbackCounts(); len(got) != 1 || got["a>b:continuation"] != 1 {
		t.Errorf("fallbacks %v, want a>b:continuation 1", got)
	}
	for k, v := range rh.gauges() {
		if v != 0 {
			t.Errorf("gauge %s = %d after the request", k, v)
		}
	}
}

// TestContinuationCrossesToFallback: a stream of model a whose only
// engine breaks mid-answer is continued on its fallback b from the text
// the client got (b's /tokenize reads the prompt and the text): the
// client gets the whole canonical answer in one stream, and the chunks
// after the seam name b, the model that finished it.
func TestContinuationCrossesToFallback(t *testing.T) {
	const n = 8
	for _, route := range []string{"chat", "completions"} {
		t.Run(route, func(t *testing.T) {
			rh, eb := newCrossHarness(t, "close-after=3", nil)
			path, body := "/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"a b c d"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
			if route == "completions" {
				path, body = "/v1/completions", `{"model":"a","prompt":"a b c d","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`
			}
			cs := readClientStream(t, rh.post(path, body))
			if cs.text != canonical(n) || len(cs.errors) != 0 || !cs.done {
				t.Errorf("answer %q errors %v done %v, want %q", cs.text, cs.errors, cs.done, canonical(n))
			}
			if len(cs.ids) != 1 || cs.models["a"] == 0 || cs.models["b"] == 0 || len(cs.models) != 2 {
				t.Errorf("ids %v models %v: want one id, chunks of a then of b", cs.ids, cs.models)
			}
			if len(cs.finishes) != 1 || cs.finishes[0] != "length" {
				t.Errorf("finish reasons %v, want [length]", cs.finishes)
			}
			if cs.usage == nil || cs.usage.Prompt != 4 || cs.usage.Completion != n || cs.usage.Total != 4+n {
				t.Errorf("usage %+v, want 4 + %d", cs.usage, n)
			}
			if cs.tokenIDs != 0 {
				t.Errorf("%d chunks carried token ids", cs.tokenIDs)
			}
			if st := eb.Stats(); st.Received != 1 {
				t.Errorf("b1 got %d generation requests, want the continuation", st.Received)
			}
			checkCrossed(t, rh)
		})
	}
}

// TestContinuationCrossesWholeAnswer: a non-streaming chat answer of a
// (observed as a stream) broken on a's only engine is finished on b: the
// client gets one body with the whole answer, naming b, with the
// fallback header.
func TestContinuationCrossesWholeAnswer(t *testing.T) {
	rh, _ := newCrossHarness(t, "close-after=3", func(c *Config) { c.ObserveNonStreaming = true })
	status, hdr, raw := rh.do(http.MethodPost, "/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"a b c d"}],"max_tokens":8}`)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, raw)
	}
	var got struct {
		Model   string `json:"model"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct{ PromptTokens, CompletionTokens int64 } `json:"usage"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || len(got.Choices) != 1 {
		t.Fatalf("%v: %s", err, raw)
	}
	if got.Choices[0].Message.Content != canonical(8) || got.Model != "b" || hdr.Get(FallbackHeader) != "b" {
		t.Errorf("content %q model %q %s %q, want the whole answer from b", got.Choices[0].Message.Content, got.Model, FallbackHeader, hdr.Get(FallbackHeader))
	}
	checkCrossed(t, rh)
}

// TestContinuationCrossesResponses: a Responses stream of a finished on
// b ends with a response.completed naming b.
func TestContinuationCrossesResponses(t *testing.T) {
	rh, _ := newCrossHarness(t, "close-after=3", nil)
	got := readResponsesStream(t, rh.post("/v1/responses", strings.Replace(responsesBody, `"model":"m"`, `"model":"a"`, 1)))
	if got.text != canonical(8) || got.errors != 0 || got.final == nil {
		t.Fatalf("text %q errors %d final %v", got.text, got.errors, got.final)
	}
	if string(got.final["model"]) != `"b"` {
		t.Errorf("response.completed model %s, want b", got.final["model"])
	}
	checkCrossed(t, rh)
}

// TestContinuationNotCrossed: what does not cross to a fallback model ends
// with the error event, counted no_engine, and b gets nothing: a Messages
// stream (its model is named only in message_start, which the client
// has), a completions prompt of token ids (b's tokenizer cannot read
// them), and a model without fallbacks.
func TestContinuationNotCrossed(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
		noFallbacks      bool
	}{
		{"messages", "/v1/messages", `{"model":"a","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"a b c d"}]}`, false},
		{"token-id prompt", "/v1/completions", `{"model":"a","prompt":[1,2,3],"max_tokens":8,"stream":true}`, false},
		{"no fallbacks", "/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"a b"}],"max_tokens":8,"stream":true}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh, eb := newCrossHarness(t, "close-after=3", func(c *Config) {
				if tc.noFallbacks {
					c.Models.Fallbacks = nil
				}
			})
			resp := rh.post(tc.path, tc.body)
			raw := readBodyT(t, resp)
			if !strings.Contains(raw, "error") {
				t.Errorf("no error event in %s", raw)
			}
			rh.waitIdle()
			if got := rh.migrations(); len(got) != 1 || got["engine_disconnect/no_engine"] != 1 {
				t.Errorf("migrations %v, want engine_disconnect/no_engine 1", got)
			}
			if got := rh.fallbackCounts(); len(got) != 0 {
				t.Errorf("fallbacks %v, want none", got)
			}
			if n := eb.Stats().Received; n != 0 || rh.tokenized.Load() != 0 {
				t.Errorf("b1 got %d requests and %d /tokenize calls", n, rh.tokenized.Load())
			}
		})
	}
}
