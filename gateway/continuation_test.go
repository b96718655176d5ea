package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// clientStream is what a streaming client got, read as the OpenAI clients
// read it.
type clientStream struct {
	ids      map[string]int // chunk ids seen, with their counts
	models   map[string]int
	created  map[int64]int
	roles    int    // chunks with a role
	text     string // content (chat) or text (completions), concatenated
	finishes []string
	usage    *struct{ Prompt, Completion, Total int64 }
	tokenIDs int      // chunks with token_ids or prompt_token_ids
	errors   []string // error events' messages
	done     bool     // [DONE] seen
	after    int      // events after [DONE]
}

// readClientStream reads an SSE body to its end.
func readClientStream(t *testing.T, resp *http.Response) clientStream {
	t.Helper()
	defer resp.Body.Close()
	cs := clientStream{ids: map[string]int{}, models: map[string]int{}, created: map[int64]int{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if cs.done {
			cs.after++
		}
		if data == "[DONE]" {
			cs.done = true
			continue
		}
		var ch struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Created int64  `json:"created"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
				TokenIDs     []int   `json:"token_ids"`
			} `json:"choices"`
			PromptTokenIDs []int `json:"prompt_token_ids"`
			Usage          *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("unreadable event %q: %v", data, err)
		}
		if ch.Error != nil {
			cs.errors = append(cs.errors, ch.Error.Message)
			continue
		}
		cs.ids[ch.ID]++
		cs.models[ch.Model]++
		cs.created[ch.Created]++
		if ch.PromptTokenIDs != nil || strings.Contains(data, "token_ids") {
			cs.tokenIDs++
		}
		for _, c := range ch.Choices {
			if c.Delta != nil {
				if c.Delta.Role != "" {
					cs.roles++
				}
				cs.text += c.Delta.Content
			}
			if c.Text != nil {
				cs.text += *c.Text
			}
			if c.FinishReason != nil {
				cs.finishes = append(cs.finishes, *c.FinishReason)
			}
		}
		if ch.Usage != nil {
			cs.usage = &struct{ Prompt, Completion, Total int64 }{ch.Usage.Prompt, ch.Usage.Completion, ch.Usage.Total}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return cs
}

// canonical is the simulator's whole answer of n content tokens.
func canonical(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(enginesim.ContentToken(i))
	}
	return b.String()
}

// counterBy returns a counter's sums by the values of keys, joined by "/".
func (h *harness) counterBy(name string, keys ...attribute.Key) map[string]int64 {
	h.t.Helper()
	out := map[string]int64{}
	m, ok := findMetric(h.collect(), name)
	if !ok {
		return out
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		vals := make([]string, len(keys))
		for i, k := range keys {
			v, _ := dp.Attributes.Value(k)
			vals[i] = v.AsString()
		}
		out[strings.Join(vals, "/")] += dp.Value
	}
	return out
}

// migrations returns switchboard.request.migrations by "reason/outcome".
func (h *harness) migrations() map[string]int64 {
	return h.counterBy(telemetry.MigrationsName, telemetry.AttrMigrationReason, telemetry.AttrMigrationOutcome)
}

// exclusions returns switchboard.request.migration_exclusions by exclusion.
func (h *harness) exclusions() map[string]int64 {
	return h.counterBy(telemetry.MigrationExclusionsName, telemetry.AttrMigrationExclusion)
}

// TestContinuationCompletesAnswer: a stream whose engine fails after its
// first tokens is continued on the other engine, and the client gets the
// whole canonical answer once, in one stream: one id, created and model,
// one role chunk, no token repeated or missing, one finish_reason, the
// whole answer's usage, no token ids it did not ask for, and both
// engines' slots released from decode.
func TestContinuationCompletesAnswer(t *testing.T) {
	const n = 8
	for _, tc := range []struct {
		name, fault, reason string
		tune                func(*Config)
	}{
		{"eof", "close-after=3", "engine_disconnect", nil},
		{"idle timeout", "stall-after=3", "idle_timeout", func(c *Config) { c.Timeouts.Idle = 100 * time.Millisecond }},
		{"eof before the first token", "close-after=0", "engine_disconnect", func(c *Config) { c.Retry.On = nil }},
		{"reset", "reset-after=3", "engine_disconnect", nil},
		{"error event", "error-after=3", "stream_error", nil},
		{"engine drained", "drain-after=3", "engine_abort", nil},
	} {
		routes := []string{"chat", "completions"}
		if tc.fault == "close-after=0" {
			routes = routes[:1] // a completions stream has sent nothing yet: a retry's business
		}
		for _, route := range routes {
			t.Run(tc.name+"/"+route, func(t *testing.T) {
				rh := newRetryHarness(t, tc.fault, "", tc.tune)
				path, body := "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":`+strconv.Itoa(n)+`,"stream":true,"stream_options":{"include_usage":true}}`
				if route == "completions" {
					path, body = "/v1/completions", `{"model":"m","prompt":"a b c d","max_tokens":`+strconv.Itoa(n)+`,"stream":true,"stream_options":{"include_usage":true}}`
				}
				resp := rh.post(path, body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				cs := readClientStream(t, resp)
				if cs.text != canonical(n) {
					t.Errorf("answer %q, want %q", cs.text, canonical(n))
				}
				if len(cs.errors) != 0 || !cs.done || cs.after != 0 {
					t.Errorf("errors %v, done %v, events after [DONE] %d", cs.errors, cs.done, cs.after)
				}
				if len(cs.ids) != 1 || len(cs.models) != 1 || len(cs.created) != 1 || cs.models["m"] == 0 {
					t.Errorf("ids %v models %v created %v: want one of each", cs.ids, cs.models, cs.created)
				}
				if wantRoles := map[string]int{"chat": 1, "completions": 0}[route]; cs.roles != wantRoles {
					t.Errorf("%d role chunks, want %d", cs.roles, wantRoles)
				}
				if len(cs.finishes) != 1 || cs.finishes[0] != "length" {
					t.Errorf("finish reasons %v, want [length]", cs.finishes)
				}
				if cs.usage == nil || cs.usage.Prompt != 4 || cs.usage.Completion != n || cs.usage.Total != 4+n {
					t.Errorf("usage %+v, want prompt 4, completion %d, total %d", cs.usage, n, 4+n)
				}
				if cs.tokenIDs != 0 {
					t.Errorf("%d chunks carried token ids the client did not ask for", cs.tokenIDs)
				}
				rh.waitIdle()
				rel := rh.releases()
				if got := rel["e1"]; len(got) != 1 {
					t.Errorf("e1 released %v, want one release", got)
				}
				if got := rel["e2"]; len(got) != 1 || got[0] != routing.PhaseDecode {
					t.Errorf("e2 released %v, want one release from decode", got)
				}
				if got := rh.migrations(); got[tc.reason+"/rescued"] != 1 || len(got) != 1 {
					t.Errorf("migrations %v, want %s/rescued 1", got, tc.reason)
				}
				if got := rh.histCount(telemetry.TimeToFirstTokenName); got != 1 {
					t.Errorf("%d TTFT samples, want the client's one", got)
				}
				if got := rh.histCount(telemetry.MigrationGapName, attribute.String("engine", "e2")); got != 1 && tc.name != "eof before the first token" {
					t.Errorf("%d seam gap samples on e2, want 1", got)
				}
			})
		}
	}
}

// TestContinuationNotAfterFinish: a stream whose engine closes after its
// finish chunk (and usage), before [DONE], has its whole answer: it is not
// continued (a continuation would send a second finish chunk and usage),
// and ends as without continuation, with the explicit error event after
// the one finish; no migration is counted and the other engine is never
// asked.
func TestContinuationNotAfterFinish(t *testing.T) {
	for _, route := range []string{"chat", "completions"} {
		t.Run(route, func(t *testing.T) {
			rh := newRetryHarness(t, "truncate", "", nil)
			path, body := "/v1/chat/completions", contBody(4, "")
			if route == "completions" {
				path, body = "/v1/completions", `{"model":"m","prompt":"a b c d","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`
			}
			cs := readClientStream(t, rh.post(path, body))
			if cs.text != canonical(4) || len(cs.finishes) != 1 || cs.usage == nil || cs.usage.Completion != 4 {
				t.Errorf("answer %q, finishes %v, usage %+v: want the whole answer with one finish and its usage", cs.text, cs.finishes, cs.usage)
			}
			if cs.done || len(cs.errors) != 1 {
				t.Errorf("done %v, errors %v: want the error event and no [DONE]", cs.done, cs.errors)
			}
			rh.waitIdle()
			if got := rh.migrations(); len(got) != 0 {
				t.Errorf("migrations %v, want none", got)
			}
			if got := rh.releases(); len(got["e1"]) != 1 || len(got["e2"]) != 0 {
				t.Errorf("releases %v, want one on e1 and none on e2", got)
			}
		})
	}
	t.Run("whole answer", func(t *testing.T) {
		// A non-streaming client's answer broken after its finish: the
		// 502 it got before continuation existed, nothing continued.
		rh := newRetryHarness(t, "truncate", "", func(c *Config) { c.ObserveNonStreaming = true })
		status, _, raw := rh.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":4}`)
		if status != http.StatusBadGateway {
			t.Errorf("status %d, want 502: %s", status, raw)
		}
		rh.waitIdle()
		if got := rh.migrations(); len(got) != 0 {
			t.Errorf("migrations %v, want none", got)
		}
		if got := rh.releases(); len(got["e1"]) != 1 || len(got["e2"]) != 0 {
			t.Errorf("releases %v, want one on e1 and none on e2", got)
		}
	})
}

// contBody is a streaming chat request of n tokens with usage.
func contBody(n int, extra string) string {
	return `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":` + strconv.Itoa(n) + `,"stream":true,"stream_options":{"include_usage":true}` + extra + `}`
}

// TestContinuationFailsToo: a continuation that breaks too, with
// migration.limit reached, ends the stream as without continuation: the
// tokens both legs sent, then the explicit error event; counted once as
// failed and once as limit.
func TestContinuationFailsToo(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "close-after=2", nil)
	resp := rh.post("/v1/chat/completions", contBody(8, ""))
	cs := readClientStream(t, resp)
	if cs.text != canonical(5) {
		t.Errorf("answer %q, want the 3 + 2 tokens %q", cs.text, canonical(5))
	}
	if len(cs.errors) != 1 || cs.done || len(cs.finishes) != 0 || cs.usage != nil {
		t.Errorf("errors %v, done %v, finishes %v, usage %+v: want one error event and nothing else", cs.errors, cs.done, cs.finishes, cs.usage)
	}
	rh.waitIdle()
	if rel := rh.releases(); len(rel["e1"]) != 1 || len(rel["e2"]) != 1 {
		t.Errorf("releases %v, want one per engine", rel)
	}
	if got := rh.migrations(); got["engine_disconnect/failed"] != 1 || got["engine_disconnect/limit"] != 1 || len(got) != 2 {
		t.Errorf("migrations %v, want engine_disconnect/failed 1 and engine_disconnect/limit 1", got)
	}
}

// firstPolicy picks the first candidate, so a test knows where each leg
// goes.
type firstPolicy struct{}

func (firstPolicy) Name() string { return "first" }
func (firstPolicy) Pick(_ context.Context, _ *routing.Request, c []*routing.Endpoint) (*routing.Endpoint, error) {
	return c[0], nil
}

// TestContinuationSecondLimit: with migration.limit 2, a continuation that
// breaks too is continued again, on the third engine, and the client gets
// the whole answer.
func TestContinuationSecondLimit(t *testing.T) {
	var ecs []fleet.EngineConfig
	for i, f := range []string{"close-after=3", "close-after=2", ""} {
		_, srv := sim(t, enginesim.Config{Models: []string{"m"}, Fault: f})
		ecs = append(ecs, fleet.EngineConfig{Name: "e" + strconv.Itoa(i+1), URL: srv.URL, Models: []string{"m"}})
	}
	cfg := testConfig(ecs...)
	cfg.Migration.Limit = 2
	h := newHarness(t, cfg, withPolicy(firstPolicy{}))
	cs := readClientStream(t, h.post("/v1/chat/completions", contBody(8, "")))
	if cs.text != canonical(8) || len(cs.errors) != 0 || !cs.done || cs.usage == nil || cs.usage.Completion != 8 || len(cs.ids) != 1 {
		t.Errorf("answer %q errors %v done %v usage %+v ids %v", cs.text, cs.errors, cs.done, cs.usage, cs.ids)
	}
	h.waitIdle()
	if got := h.migrations(); got["engine_disconnect/failed"] != 1 || got["engine_disconnect/rescued"] != 1 || len(got) != 2 {
		t.Errorf("migrations %v, want one failed and one rescued", got)
	}
}

// TestContinuationClientCancels: a client that leaves during a
// continuation cancels it: the continuation's engine aborts the request,
// every slot is released, and the continuation counts as cancelled.
func TestContinuationClientCancels(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "stall-after=1", nil)
	resp := rh.post("/v1/chat/completions", contBody(8, ""))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"tok3 "`) {
			break // the continuation's first token: now leave
		}
	}
	resp.Body.Close()
	waitAborted(t, rh.e2, 1)
	rh.waitIdle()
	rh.checkHandOver(t, "e1", "e2")
	if got := rh.migrations(); got["engine_disconnect/cancelled"] != 1 || len(got) != 1 {
		t.Errorf("migrations %v, want engine_disconnect/cancelled 1", got)
	}
}

// TestContinuationExclusions: a request a continuation cannot reproduce
// is not continued: its break ends with the explicit error event after
// what the client got, the exclusion is counted, and no other engine is
// asked.
func TestContinuationExclusions(t *testing.T) {
	for _, tc := range []struct {
		name, extra, fault, want string
		tune                     func(*Config)
	}{
		{"structured output", `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`, "", exclStructured, nil},
		{"guided decoding", `,"guided_regex":"tok.*"`, "", exclStructured, nil},
		{"tools", `,"tools":[{"type":"function","function":{"name":"f"}}]`, "", exclTools, nil},
		{"reasoning streamed", ``, "reasoning=2,", exclReasoning, nil},
		{"n", `,"n":2`, "", exclN, nil},
		{"logprobs", `,"logprobs":true`, "", exclLogprobs, nil},
		{"stop strings", `,"stop":["zzz"]`, "", exclStop, nil},
		{"multimodal", `,"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]`, "", exclMultimodal, nil},
		{"too many tokens", ``, "", exclMaxTokens, func(c *Config) { c.Migration.MaxTokens = 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := newRetryHarness(t, tc.fault+"close-after=3", "", tc.tune)
			resp := rh.post("/v1/chat/completions", contBody(8, tc.extra))
			cs := readClientStream(t, resp)
			if len(cs.errors) != 1 || cs.done {
				t.Errorf("errors %v, done %v: want the explicit error event", cs.errors, cs.done)
			}
			rh.waitIdle()
			if got := rh.exclusions(); got[tc.want] != 1 || len(got) != 1 {
				t.Errorf("exclusions %v, want %s 1", got, tc.want)
			}
			if got := rh.migrations(); len(got) != 0 {
				t.Errorf("migrations %v, want none", got)
			}
			if n := rh.e2.Stats().Received; n != 0 {
				t.Errorf("e2 got %d requests", n)
			}
		})
	}
}

// TestContinuationWholeAnswer: a non-streaming client whose engine fails
// mid-generation, under each mid-generation fault the simulator offers,
// gets one complete body: the canonical answer (compared with the body an
// engine answers for the same request without a fault), the whole answer's
// usage (the prompt once, the completion tokens of both legs) and
// finish or stop reason, no token ids; one continuation, rescued, with the
// failure kind of the fault; each engine released its slot once, the
// continuation's from decode. The request is observed (sent as a stream)
// because it may be continued, whether or not
// server.observe_non_streaming is on.
func TestContinuationWholeAnswer(t *testing.T) {
	const n = 8
	for _, observe := range []bool{false, true} {
		for _, tc := range []struct {
			fault   string
			reasons map[string]string // by route, "" for the rest
		}{
			{"close-after=3", map[string]string{"": migrateDisconnect}},
			{"reset-after=3", map[string]string{"": migrateDisconnect}},
			{"error-after=3", map[string]string{"": migrateStreamErr}},
			// The simulator cuts a Messages stream at drain-after as at
			// close-after: that route has no finish reason "abort".
			{"drain-after=3", map[string]string{"": migrateAbort, "messages": migrateDisconnect, "responses": migrateDisconnect}},
			{"stall-after=3", map[string]string{"": migrateIdle}},
		} {
			for _, route := range []string{"chat", "completions", "messages", "responses"} {
				t.Run(fmt.Sprintf("observe_non_streaming=%t/%s/%s", observe, tc.fault, route), func(t *testing.T) {
					rh := newRetryHarness(t, tc.fault, "", func(c *Config) {
						c.ObserveNonStreaming = observe
						c.Timeouts.Idle = 100 * time.Millisecond
					})
					path, body := wholeAnswerRequest(route, n)
					status, _, raw := rh.do(http.MethodPost, path, body)
					if status != http.StatusOK {
						t.Fatalf("status %d: %s", status, raw)
					}
					ans := readWholeAnswer(t, route, raw)
					if ans.text != canonical(n) || ans.finish != map[string]string{"chat": "length", "completions": "length", "messages": "max_tokens", "responses": "incomplete"}[route] ||
						ans.model != "m" || ans.id == "" || ans.blocks != 1 {
						t.Errorf("answer %+v, want %q with one choice or block", ans, canonical(n))
					}
					prompt := int64(4)
					if route == "messages" || route == "responses" {
						prompt = 6 // "be brief" and "a b c d"
					}
					if ans.prompt != prompt || ans.completion != n || (route != "messages" && ans.total != prompt+n) {
						t.Errorf("usage %+v, want prompt %d and completion %d", ans, prompt, n)
					}
					if strings.Contains(string(raw), "token_ids") {
						t.Errorf("token ids the client did not ask for: %s", raw)
					}
					if diffs := diffAnswers(t, raw, simAnswer(t, path, body)); len(diffs) > 0 {
						t.Errorf("the body differs from an engine's answer without a fault: %v\n got %s", diffs, raw)
					}
					rh.waitIdle()
					reason := tc.reasons[route]
					if reason == "" {
						reason = tc.reasons[""]
					}
					if got := rh.migrations(); got[reason+"/rescued"] != 1 || len(got) != 1 {
						t.Errorf("migrations %v, want %s/rescued 1", got, reason)
					}
					rh.checkHandOver(t, "e1", "e2")
					if n := rh.e2.Stats().Received; n < 1 {
						t.Errorf("e2 received %d requests", n)
					}
				})
			}
		}
	}
}

// wholeAnswerRequest is a non-streaming request of n tokens on route
// (chat, completions or messages).
func wholeAnswerRequest(route string, n int) (path, body string) {
	switch route {
	case "completions":
		return "/v1/completions", `{"model":"m","prompt":"a b c d","max_tokens":` + strconv.Itoa(n) + `}`
	case "messages":
		return "/v1/messages", `{"model":"m","max_tokens":` + strconv.Itoa(n) + `,"system":"be brief","messages":[{"role":"user","content":"a b c d"}]}`
	case "responses":
		return "/v1/responses", `{"model":"m","instructions":"be brief","input":"a b c d","max_output_tokens":` + strconv.Itoa(n) + `,"store":false}`
	}
	return "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":` + strconv.Itoa(n) + `}`
}

// clientAnswer is what a non-streaming client read from a body: its text,
// finish or stop reason, usage and how many choices or content blocks.
type clientAnswer struct {
	id, model, text, finish   string
	prompt, completion, total int64
	blocks                    int
}

// readWholeAnswer reads a chat, completions or Messages body.
func readWholeAnswer(t *testing.T, route string, raw []byte) clientAnswer {
	t.Helper()
	var b struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Choices []struct {
			Text    *string `json:"text"`
			Message *struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Content []struct {
			Type, Text string
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Status     string `json:"status"`
		Output     []struct {
			Content []struct{ Type, Text string } `json:"content"`
		} `json:"output"`
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
			Total      int64 `json:"total_tokens"`
			Input      int64 `json:"input_tokens"`
			Output     int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	a := clientAnswer{id: b.ID, model: b.Model}
	if route == "responses" {
		// finish: the status ("incomplete" when the length ran out).
		a.finish, a.prompt, a.completion, a.total, a.blocks = b.Status, b.Usage.Input, b.Usage.Output, b.Usage.Total, len(b.Output)
		for _, o := range b.Output {
			for _, c := range o.Content {
				a.text += c.Text
			}
		}
		return a
	}
	if route == "messages" {
		a.finish, a.prompt, a.completion, a.blocks = b.StopReason, b.Usage.Input, b.Usage.Output, len(b.Content)
		for _, c := range b.Content {
			if c.Type == "text" {
				a.text += c.Text
			}
		}
		return a
	}
	a.prompt, a.completion, a.total, a.blocks = b.Usage.Prompt, b.Usage.Completion, b.Usage.Total, len(b.Choices)
	for _, c := range b.Choices {
		switch {
		case c.Text != nil:
			a.text += *c.Text
		case c.Message != nil:
			a.text += c.Message.Content
		}
		a.finish = c.FinishReason
	}
	return a
}

// simAnswer is the non-streaming body a simulated engine (the harness's
// timings, no fault) answers for body on path.
func simAnswer(t *testing.T, path, body string) []byte {
	t.Helper()
	e := newSim(t, enginesim.Config{Models: []string{"m"}})
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("engine: %d %s", rec.Code, rec.Body)
	}
	return rec.Body.Bytes()
}

// diffAnswers lists the top-level members where a gateway's body and an
// engine's differ, leaving out what differs between two generations (id,
// created) and the simulator's stop_sequence null, which vLLM's Messages
// body leaves out.
func diffAnswers(t *testing.T, got, want []byte) []string {
	t.Helper()
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%v: %s", err, want)
	}
	var diffs []string
	for _, m := range []map[string]any{g, w} {
		delete(m, "id")
		delete(m, "created")
		delete(m, "created_at")
		if out, ok := m["output"].([]any); ok { // a Responses body's items have ids of their own
			for _, it := range out {
				if item, ok := it.(map[string]any); ok {
					delete(item, "id")
				}
			}
		}
		if v, ok := m["stop_sequence"]; ok && v == nil {
			delete(m, "stop_sequence")
		}
	}
	for k := range w {
		if !reflect.DeepEqual(g[k], w[k]) {
			diffs = append(diffs, fmt.Sprintf("%s: %v, want %v", k, g[k], w[k]))
		}
	}
	for k := range g {
		if _, ok := w[k]; !ok {
			diffs = append(diffs, k+": not in the engine's body")
		}
	}
	return diffs
}

// TestOpenAIClientContinuation: openai-go reads a continued stream as one
// unbroken answer: its accumulator takes every chunk, stream.Err is nil,
// and the content, finish reason and usage are the whole answer's.
func TestOpenAIClientContinuation(t *testing.T) {
	rh := newRetryHarness(t, "close-after=2", "", nil)
	client := openAIClient(rh.harness)
	stream := client.Chat.Completions.NewStreaming(clientCtx(t), openai.ChatCompletionNewParams{
		Model:               "m",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.UserMessage("a b c d")},
		MaxCompletionTokens: openai.Int(6),
		StreamOptions:       openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		if chunk := stream.Current(); !acc.AddChunk(chunk) {
			t.Fatalf("the accumulator refused chunk %s", chunk.RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != canonical(6) || acc.Choices[0].FinishReason != "length" {
		t.Errorf("accumulated %+v, want %q finish length", acc.Choices, canonical(6))
	}
	if u := acc.Usage; u.PromptTokens != 4 || u.CompletionTokens != 6 || u.TotalTokens != 10 {
		t.Errorf("usage %+v, want 4 prompt and 6 completion tokens", u)
	}
	rh.waitIdle()
	if got := rh.migrations(); got["engine_disconnect/rescued"] != 1 {
		t.Errorf("migrations %v", got)
	}
}

// TestContinuationEngineEndKept: an engine's own end (an abort, an error
// event) that no continuation replaces reaches the client as the engine
// sent it, in the client's framing: no token ids, no usage chunk it did
// not ask for, and, on a continuation leg, the first leg's id and chunk
// object with the whole answer's usage. Counted as not continued.
func TestContinuationEngineEndKept(t *testing.T) {
	t.Run("one engine", func(t *testing.T) {
		_, srv := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "drain-after=3"})
		h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
		cs := readClientStream(t, h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":8,"stream":true}`))
		if cs.text != canonical(3) || len(cs.finishes) != 1 || cs.finishes[0] != "abort" || !cs.done {
			t.Errorf("answer %q finishes %v done %v: want the engine's abort end", cs.text, cs.finishes, cs.done)
		}
		if cs.tokenIDs != 0 || cs.usage != nil {
			t.Errorf("%d chunks with token ids, usage %+v: the client asked for neither", cs.tokenIDs, cs.usage)
		}
		h.waitIdle()
		if got := h.migrations(); got["engine_abort/no_engine"] != 1 || len(got) != 1 {
			t.Errorf("migrations %v, want engine_abort/no_engine 1", got)
		}
	})
	t.Run("on a continuation leg", func(t *testing.T) {
		var ecs []fleet.EngineConfig
		for i, f := range []string{"close-after=3", "drain-after=2"} {
			_, srv := sim(t, enginesim.Config{Models: []string{"m"}, Fault: f})
			ecs = append(ecs, fleet.EngineConfig{Name: "e" + strconv.Itoa(i+1), URL: srv.URL, Models: []string{"m"}})
		}
		cfg := testConfig(ecs...)
		cfg.Migration.Limit = 2
		h := newHarness(t, cfg, withPolicy(firstPolicy{}))
		cs := readClientStream(t, h.post("/v1/chat/completions", contBody(8, "")))
		if cs.text != canonical(5) || len(cs.ids) != 1 || len(cs.finishes) != 1 || cs.finishes[0] != "abort" || cs.tokenIDs != 0 {
			t.Errorf("answer %q ids %v finishes %v token ids %d", cs.text, cs.ids, cs.finishes, cs.tokenIDs)
		}
		if cs.usage == nil || cs.usage.Prompt != 4 || cs.usage.Completion != 5 || cs.usage.Total != 9 {
			t.Errorf("usage %+v, want the whole answer's 4 + 5", cs.usage)
		}
		h.waitIdle()
		if got := h.migrations(); got["engine_disconnect/failed"] != 1 || got["engine_abort/no_engine"] != 1 || len(got) != 2 {
			t.Errorf("migrations %v, want engine_disconnect/failed 1 and engine_abort/no_engine 1", got)
		}
	})
	t.Run("aborted continuation at the limit", func(t *testing.T) {
		rh := newRetryHarness(t, "close-after=3", "drain-after=2", nil)
		cs := readClientStream(t, rh.post("/v1/chat/completions", contBody(8, "")))
		if len(cs.finishes) != 1 || cs.finishes[0] != "abort" {
			t.Errorf("finishes %v, want the engine's abort", cs.finishes)
		}
		rh.waitIdle()
		if got := rh.migrations(); got["engine_disconnect/failed"] != 1 || got["engine_abort/limit"] != 1 || len(got) != 2 {
			t.Errorf("migrations %v, want engine_disconnect/failed 1 (not rescued) and engine_abort/limit 1", got)
		}
	})
	for _, tc := range []struct {
		fault  string
		status int
	}{{"drain-after=3", http.StatusOK}, {"error-after=3", http.StatusInternalServerError}} {
		t.Run("whole answer, one engine, "+tc.fault, func(t *testing.T) {
			// What a non-streaming client got before continuation
			// existed: the abort's partial body, the engine's error.
			_, srv := sim(t, enginesim.Config{Models: []string{"m"}, Fault: tc.fault})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
			cfg.ObserveNonStreaming = true
			h := newHarness(t, cfg)
			status, _, raw := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":8}`)
			if status != tc.status || (status == http.StatusOK && !strings.Contains(string(raw), `"finish_reason":"abort"`)) {
				t.Errorf("status %d: %s", status, raw)
			}
		})
	}
}

// TestContinuationUsageAfterExclusion: a continuation that passes
// migration.max_tokens lets go of the ids, not of the prompt's count: the
// whole answer's usage still counts the prompt.
func TestContinuationUsageAfterExclusion(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "", func(c *Config) { c.Migration.MaxTokens = 9 })
	cs := readClientStream(t, rh.post("/v1/chat/completions", contBody(8, "")))
	if cs.text != canonical(8) || cs.usage == nil || cs.usage.Prompt != 4 || cs.usage.Completion != 8 || cs.usage.Total != 12 {
		t.Errorf("answer %q usage %+v: want prompt 4 completion 8 total 12", cs.text, cs.usage)
	}
}

// anthropicStream is what an Anthropic streaming client got.
type anthropicStream struct {
	events   map[string]int // by type
	text     string
	stop     []string // message_delta stop reasons
	input    int64    // message_start's input tokens
	output   int64    // the last message_delta's output tokens
	errors   int
	lastType string
}

// readAnthropicStream reads a Messages stream to its end.
func readAnthropicStream(t *testing.T, resp *http.Response) anthropicStream {
	t.Helper()
	defer resp.Body.Close()
	as := anthropicStream{events: map[string]int{}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type    string `json:"type"`
			Message *struct {
				Usage struct {
					InputTokens int64 `json:"input_tokens"`
				} `json:"usage"`
			} `json:"message"`
			Delta *struct {
				Type       string `json:"type"`
				Text       string `json:"text"`
				StopReason string `json:"stop_reason"`
			} `json:"delta"`
			Usage *struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("unreadable event %q: %v", data, err)
		}
		as.events[ev.Type]++
		as.lastType = ev.Type
		switch ev.Type {
		case "message_start":
			as.input = ev.Message.Usage.InputTokens
		case "content_block_delta":
			as.text += ev.Delta.Text
		case "message_delta":
			as.stop = append(as.stop, ev.Delta.StopReason)
			as.output = ev.Usage.OutputTokens
		case "error":
			as.errors++
		}
	}
	return as
}

// TestContinuationAnthropicStream: an Anthropic Messages stream broken by
// its engine is continued from the text the client got (tokenized by the
// new engine): the client gets one message with the whole canonical text,
// one message_start, one message_delta with the whole output, message_stop
// last.
func TestContinuationAnthropicStream(t *testing.T) {
	for _, fault := range []string{"close-after=3", "reset-after=2", "stall-after=4", "error-after=3", "drain-after=3"} {
		t.Run(fault, func(t *testing.T) {
			rh := newRetryHarness(t, fault, "", func(c *Config) { c.Timeouts.Idle = 100 * time.Millisecond })
			resp := rh.post("/v1/messages", `{"model":"m","max_tokens":8,"stream":true,"system":"be brief","messages":[{"role":"user","content":"a b c d"}]}`)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			as := readAnthropicStream(t, resp)
			if as.text != canonical(8) || as.errors != 0 {
				t.Errorf("text %q errors %d, want %q", as.text, as.errors, canonical(8))
			}
			if as.events["message_start"] != 1 || as.events["message_stop"] != 1 || as.events["content_block_stop"] != 1 || as.lastType != "message_stop" {
				t.Errorf("events %v, last %q", as.events, as.lastType)
			}
			if len(as.stop) != 1 || as.stop[0] != "max_tokens" || as.output != 8 || as.input != 6 {
				t.Errorf("stop %v output %d input %d, want [max_tokens], 8, 6", as.stop, as.output, as.input)
			}
			rh.waitIdle()
			if got := rh.migrations(); len(got) != 1 {
				t.Errorf("migrations %v, want one rescued", got)
			}
			rh.checkHandOver(t, "e1", "e2")
		})
	}
}

// TestAnthropicClientContinuation: anthropic-sdk-go accumulates a
// continued Messages stream into one message: the whole text, max_tokens,
// and the whole usage.
func TestAnthropicClientContinuation(t *testing.T) {
	rh := newRetryHarness(t, "close-after=3", "", nil)
	client := anthropicClient(rh.harness)
	stream := client.Messages.NewStreaming(clientCtx(t), messageParams("m", 8))
	defer stream.Close()
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatalf("accumulate %s: %v", stream.Current().RawJSON(), err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream error: %v", err)
	}
	if got := messageText(&acc); got != canonical(8) || acc.StopReason != "max_tokens" {
		t.Errorf("text %q stop %q, want %q max_tokens", got, acc.StopReason, canonical(8))
	}
	if acc.Usage.InputTokens != 3 || acc.Usage.OutputTokens != 8 {
		t.Errorf("usage %d in / %d out, want 3 / 8", acc.Usage.InputTokens, acc.Usage.OutputTokens)
	}
	rh.waitIdle()
	if got := rh.migrations(); got["engine_disconnect/rescued"] != 1 {
		t.Errorf("migrations %v", got)
	}
}

// TestContinuationAnthropicExclusions: Messages requests a continuation
// cannot reproduce end, at a break, with the error event, counted.
func TestContinuationAnthropicExclusions(t *testing.T) {
	for _, tc := range []struct{ name, body, fault, want string }{
		{"tools", `"tools":[{"name":"f","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"a"}]`, "", exclTools},
		{"stop sequences", `"stop_sequences":["zzz"],"messages":[{"role":"user","content":"a"}]`, "", exclStop},
		{"thinking", `"thinking":{"type":"enabled","budget_tokens":10},"messages":[{"role":"user","content":"a"}]`, "", exclReasoning},
		{"image", `"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]`, "", exclMultimodal},
		{"thinking streamed", `"messages":[{"role":"user","content":"a"}]`, "reasoning=2,", exclReasoning},
		{"the engine's error event", `"stop_sequences":["zzz"],"messages":[{"role":"user","content":"a"}]`, "error-after=2,", exclStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rh := newRetryHarness(t, tc.fault+"close-after=3", "", nil)
			as := readAnthropicStream(t, rh.post("/v1/messages", `{"model":"m","max_tokens":8,"stream":true,`+tc.body+`}`))
			if as.errors != 1 || as.events["message_stop"] != 0 {
				t.Errorf("events %v: want the error event and no message_stop", as.events)
			}
			rh.waitIdle()
			if got := rh.exclusions(); got[tc.want] != 1 || len(got) != 1 {
				t.Errorf("exclusions %v, want %s 1", got, tc.want)
			}
			if n := rh.e2.Stats().Received; n != 0 {
				t.Errorf("e2 got %d requests", n)
			}
		})
	}
}

// TestContinuationAnthropicEndWithoutUsage: a continuation engine that
// ends with [DONE] and no usage chunk still gives the Messages client its
// content_block_stop, message_delta and message_stop, once.
func TestContinuationAnthropicEndWithoutUsage(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, Fault: "close-after=2"})
	e2 := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		sw := newSSE(w)
		sw.data(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"tok2 ","logprobs":null,"finish_reason":null,"stop_reason":null}]}`)
		sw.data(`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}]}`)
		sw.data(`[DONE]`)
	})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"count":2,"max_model_len":8192,"tokens":[1,2],"token_strs":null}`)
	})
	mux.Handle("/", httputil.NewSingleHostReverseProxy(mustURL(t, e2.URL)))
	front := httptest.NewServer(mux)
	t.Cleanup(front.Close)
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: front.URL, Models: []string{"m"}})
	h := newHarness(t, cfg, withPolicy(firstPolicy{}))
	as := readAnthropicStream(t, h.post("/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"a b"}]}`))
	if as.text != canonical(3) || as.events["content_block_stop"] != 1 || as.events["message_delta"] != 1 || as.events["message_stop"] != 1 || as.lastType != "message_stop" {
		t.Errorf("text %q events %v last %q", as.text, as.events, as.lastType)
	}
	if len(as.stop) != 1 || as.stop[0] != "max_tokens" || as.output != 3 {
		t.Errorf("stop %v output %d, want [max_tokens] 3", as.stop, as.output)
	}
	h.waitIdle()
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
