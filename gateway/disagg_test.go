package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// legRecorder records each engine request (path, body, request id) and
// the engine's answer, in front of a simulated engine.
type legRecorder struct {
	next http.Handler
	mu   sync.Mutex
	legs []leg
	// started counts requests begun and not yet taken; fault, when set,
	// is the X-Enginesim-Fault of every generation request (not probes).
	started int
	fault   string
}

// setFault sets the fault of the engine's next generation requests.
func (rc *legRecorder) setFault(f string) {
	rc.mu.Lock()
	rc.fault = f
	rc.mu.Unlock()
}

type leg struct {
	path, requestID string
	body, answer    []byte
	status          int
}

// teeWriter keeps what is written through it.
type teeWriter struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *teeWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	return w.ResponseWriter.Write(p)
}
func (w *teeWriter) Flush()                      { w.ResponseWriter.(http.Flusher).Flush() }
func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (rc *legRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || strings.HasPrefix(r.URL.Path, "/sim/") {
		rc.next.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	rc.mu.Lock()
	rc.started++
	if rc.fault != "" {
		r.Header.Set(enginesim.FaultHeader, rc.fault)
	}
	rc.mu.Unlock()
	tw := &teeWriter{ResponseWriter: w, status: http.StatusOK}
	rc.next.ServeHTTP(tw, r)
	rc.mu.Lock()
	rc.legs = append(rc.legs, leg{path: r.URL.Path, requestID: r.Header.Get(RequestIDHeader), body: body, answer: tw.buf.Bytes(), status: tw.status})
	rc.mu.Unlock()
}

// take returns the legs recorded so far, once every request begun has
// ended (bounded: the engine's handler may end after the gateway's answer),
// and forgets them.
func (rc *legRecorder) take() []leg {
	testutil.Poll(5*time.Second, func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		return rc.started == len(rc.legs)
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.legs
	rc.legs, rc.started = nil, rc.started-len(rc.legs)
	return out
}

// pdEngine is one simulated engine with a role, behind a legRecorder.
type pdEngine struct {
	name, role string
	sim        *enginesim.Engine
	rec        *legRecorder
	url        string
}

// pdFleet starts one simulated engine per role (named p1, p2, ... and d1,
// d2, ... in order), each with cfg's settings, and returns them with a
// gateway config that serves model m on them, disaggregation on.
func pdFleet(t *testing.T, cfg func(name string, c *enginesim.Config), roles ...string) ([]*pdEngine, Config) {
	t.Helper()
	var engines []*pdEngine
	var ecs []fleet.EngineConfig
	n := map[string]int{}
	for _, role := range roles {
		n[role]++
		name := fmt.Sprintf("%c%d", role[0], n[role])
		sc := enginesim.Config{Models: []string{"m"}, KVEngineID: name + "-engine", TTFT: 5 * time.Millisecond, ITL: time.Millisecond, OutputTokens: 6, PromptTokensDetails: true}
		if cfg != nil {
			cfg(name, &sc)
		}
		// The fault goes on generation requests only: as the engine's
		// own, it would fail its health probes too.
		fault := sc.Fault
		sc.Fault = ""
		e, err := enginesim.New(enginetest.Fast(sc))
		if err != nil {
			t.Fatal(err)
		}
		rec := &legRecorder{next: e.Handler(), fault: fault}
		srv := enginetest.Serve(t, rec)
		engines = append(engines, &pdEngine{name: name, role: role, sim: e, rec: rec, url: srv.URL})
		ecs = append(ecs, fleet.EngineConfig{Name: name, URL: srv.URL, Models: []string{"m"}, Role: role})
	}
	c := testConfig(ecs...)
	c.Disaggregation.Enabled = true
	c.Disaggregation.MinUncachedTokens = 100
	return engines, c
}

// longPrompt is a prompt of about 250 tokens by the gateway's estimate
// (1,000 bytes at 4 bytes a token): over the tests' 100-token threshold.
var longPrompt = strings.Repeat("word ", 200)

// compactJSON returns raw compacted (or the test fails).
func compactJSON(t *testing.T, raw []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("not JSON: %v: %s", err, raw)
	}
	return b.String()
}

// members decodes a JSON object's members.
func members(t *testing.T, raw []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("not a JSON object: %v: %s", err, raw)
	}
	return m
}

// TestDisaggregationLegBodies checks the exact bodies of both legs of a
// disaggregated request, for chat and completions, streaming and not,
// and each token-cap field: the prefill leg is the client's body with
// stream false, no stream_options, the cap 1 and the do_remote_decode
// params; the decode leg is exactly the body the engine gets without
// disaggregation, with the prefill reply's kv_transfer_params, byte for
// byte, as its last member; both carry the client's request id.
func TestDisaggregationLegBodies(t *testing.T) {
	engines, cfg := pdFleet(t, nil, "prefill", "decode")
	p1, d1 := engines[0], engines[1]
	h := newHarness(t, cfg)
	// The same engines without disaggregation: the decode leg's reference.
	plain := cfg
	plain.Disaggregation.Enabled = false
	ref := newHarness(t, plain)
	for _, route := range []struct{ name, path, prompt string }{
		{"chat", "/v1/chat/completions", `"messages":[{"role":"user","content":"` + longPrompt + `"}]`},
		{"completions", "/v1/completions", `"prompt":"` + longPrompt + `"`},
	} {
		for _, stream := range []bool{false, true} {
			for _, capField := range []string{"max_tokens", "max_completion_tokens", ""} {
				if capField == "max_completion_tokens" && route.name == "completions" {
					continue // a chat field
				}
				name := fmt.Sprintf("%s/stream=%t/cap=%s", route.name, stream, capField)
				t.Run(name, func(t *testing.T) {
					body := `{"model":"m",` + route.prompt + `,"stream":` + fmt.Sprint(stream)
					if stream {
						body += `,"stream_options":{"include_usage":true}`
					}
					if capField != "" {
						body += `,"` + capField + `":5`
					}
					body += `,"temperature":0.5}`

					// The decode leg's reference: the same request without
					// disaggregation, as the decode engine gets it.
					status, _, _ := ref.do(http.MethodPost, route.path, body)
					if status != http.StatusOK {
						t.Fatalf("aggregated status %d", status)
					}
					refLegs := d1.rec.take()
					if len(refLegs) != 1 || len(p1.rec.take()) != 0 {
						t.Fatalf("aggregated request: %d legs on d1, want 1 and none on p1", len(refLegs))
					}

					status, hdr, answer := h.do(http.MethodPost, route.path, body, RequestIDHeader, "req-"+name)
					if status != http.StatusOK {
						t.Fatalf("status %d: %s", status, answer)
					}
					pl, dl := p1.rec.take(), d1.rec.take()
					if len(pl) != 1 || len(dl) != 1 {
						t.Fatalf("legs: %d prefill, %d decode; want 1 and 1", len(pl), len(dl))
					}
					// The prefill leg.
					want := members(t, []byte(body))
					delete(want, "stream_options")
					want["stream"] = json.RawMessage(`false`)
					if capField == "" {
						want["max_tokens"] = json.RawMessage(`1`)
					} else {
						want[capField] = json.RawMessage(`1`)
					}
					want["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false}`)
					got := members(t, pl[0].body)
					if len(got) != len(want) {
						t.Errorf("prefill body members %d, want %d: %s", len(got), len(want), pl[0].body)
					}
					for k, v := range want {
						if compactJSON(t, got[k]) != compactJSON(t, v) {
							t.Errorf("prefill body %s = %s, want %s", k, got[k], v)
						}
					}
					// The decode leg: the reference body, with the prefill
					// reply's params appended unchanged.
					params := members(t, pl[0].answer)["kv_transfer_params"]
					if len(params) == 0 || params[0] != '{' {
						t.Fatalf("prefill answer without params: %s", pl[0].answer)
					}
					ref0 := bytes.TrimRight(refLegs[0].body, " \n")
					wantDecode := string(ref0[:len(ref0)-1]) + `,"kv_transfer_params":` + string(params) + `}`
					if string(dl[0].body) != wantDecode {
						t.Errorf("decode body\n got %s\nwant %s", dl[0].body, wantDecode)
					}
					// One request id on both legs, the client's.
					if pl[0].requestID != "req-"+name || dl[0].requestID != "req-"+name || hdr.Get(RequestIDHeader) != "req-"+name {
						t.Errorf("request ids: prefill %q, decode %q, client %q; want %q", pl[0].requestID, dl[0].requestID, hdr.Get(RequestIDHeader), "req-"+name)
					}
					// The decode engine read the KV the prefill engine held.
					if p1.sim.Stats().KVHeld != 0 {
						t.Errorf("prefill engine still holds %d prompts' KV", p1.sim.Stats().KVHeld)
					}
				})
			}
		}
	}
	if got, want := p1.sim.Stats().KVPullsServed, d1.sim.Stats().KVPulled; got != want || got == 0 {
		t.Errorf("pulls served %d, pulled %d: want equal and > 0", got, want)
	}
	h.waitIdle()
	ref.waitIdle()
}

// cachedUsageOf returns the client's final usage: a non-stream body's, or the
// last usage chunk's of a stream.
func cachedUsageOf(t *testing.T, answer []byte, stream bool) (prompt, cached int64, hasCached bool) {
	t.Helper()
	type usage struct {
		PromptTokens        int64 `json:"prompt_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
	var u *usage
	read := func(b []byte) {
		var v struct{ Usage *usage }
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		if v.Usage != nil {
			u = v.Usage
		}
	}
	if !bytes.HasPrefix(answer, []byte("data:")) {
		read(answer)
	} else {
		sc := bufio.NewScanner(bytes.NewReader(answer))
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "[DONE]" {
				read([]byte(d))
			}
		}
	}
	if u == nil {
		t.Fatalf("no usage in %s", answer)
	}
	if u.PromptTokensDetails == nil {
		return u.PromptTokens, 0, false
	}
	return u.PromptTokens, u.PromptTokensDetails.CachedTokens, true
}

// TestDisaggregationCachedTokens checks the cached-token rewrite: the
// decode engine reports the whole prompt as cached (it read it), the
// client gets the prefill engine's count: 0 on a cold prefill engine, and
// its prefix cache's hits when the same prompt comes again.
func TestDisaggregationCachedTokens(t *testing.T) {
	engines, cfg := pdFleet(t, nil, "prefill", "decode")
	p1, d1 := engines[0], engines[1]
	h := newHarness(t, cfg)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			prompt := fmt.Sprintf("%t %s", stream, longPrompt) // its own prompt: cold the first time
			body := fmt.Sprintf(`{"model":"m","stream":%t,"stream_options":{"include_usage":true},"max_tokens":4,"messages":[{"role":"user","content":%q}]}`, stream, prompt)
			if !stream {
				body = fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":%q}]}`, prompt)
			}
			for turn, wantWarm := range []bool{false, true} {
				status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", body)
				if status != http.StatusOK {
					t.Fatalf("status %d: %s", status, answer)
				}
				pl, dl := p1.rec.take(), d1.rec.take()
				if len(pl) != 1 || len(dl) != 1 {
					t.Fatalf("turn %d: legs %d prefill, %d decode", turn, len(pl), len(dl))
				}
				_, engineCached, _ := cachedUsageOf(t, dl[0].answer, stream)
				_, prefillCached, _ := cachedUsageOf(t, pl[0].answer, false)
				prompt, cached, has := cachedUsageOf(t, answer, stream)
				if engineCached != prompt {
					t.Errorf("turn %d: the decode engine reported %d cached of %d: the test's premise", turn, engineCached, prompt)
				}
				if !has || cached != prefillCached {
					t.Errorf("turn %d: client cached_tokens %d (present %t), want the prefill engine's %d", turn, cached, has, prefillCached)
				}
				if wantWarm != (prefillCached > 0) {
					t.Errorf("turn %d: prefill engine cached %d", turn, prefillCached)
				}
			}
		})
	}
	if n := h.counter(telemetry.DisaggKVFailuresName); n != 0 {
		t.Errorf("kv transfer failures %d, want 0", n)
	}
	h.waitIdle()
}

// modes returns switchboard.disaggregation.requests by mode.
func (h *harness) modes() map[string]int64 {
	h.t.Helper()
	return countsBy(h.collect(), telemetry.DisaggRequestsName, telemetry.AttrDisaggMode)
}

// kvFailures returns switchboard.disaggregation.kv_transfer.failures by
// reason.
func (h *harness) kvFailures() map[string]int64 {
	h.t.Helper()
	return countsBy(h.collect(), telemetry.DisaggKVFailuresName, telemetry.AttrDisaggKVFailure)
}

// TestDisaggregationDecision checks who is disaggregated: a long uncached
// prompt is; a short one, n > 1 and a client's own kv_transfer_params go
// to the decode engine whole (aggregated), counted; a model without both
// roles and a route that does not generate take no part (not counted).
func TestDisaggregationDecision(t *testing.T) {
	engines, cfg := pdFleet(t, nil, "prefill", "decode")
	p1, d1 := engines[0], engines[1]
	h := newHarness(t, cfg)
	cases := []struct {
		name, path, body string
		mode             string // "" = not counted
		legs             int    // prefill legs
	}{
		{"long prompt", "/v1/chat/completions", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`, telemetry.DisaggModeDisaggregated, 1},
		{"short prompt", "/v1/chat/completions", `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, telemetry.DisaggModeAggregated, 0},
		{"n=2", "/v1/chat/completions", `{"model":"m","n":2,"max_tokens":3,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`, telemetry.DisaggModeAggregated, 0},
		{"prompt_logprobs", "/v1/completions", `{"model":"m","max_tokens":3,"prompt_logprobs":1,"prompt":"` + longPrompt + `"}`, telemetry.DisaggModeAggregated, 0},
		{"batch of prompts", "/v1/completions", `{"model":"m","max_tokens":3,"prompt":["` + longPrompt + `","` + longPrompt + `"]}`, telemetry.DisaggModeAggregated, 0},
		{"echo with logprobs", "/v1/completions", `{"model":"m","max_tokens":3,"echo":true,"logprobs":1,"prompt":"` + longPrompt + `"}`, telemetry.DisaggModeAggregated, 0},
		{"prompt of token ids", "/v1/completions", `{"model":"m","max_tokens":3,"prompt":[` + strings.Repeat("7,", 300) + `7]}`, telemetry.DisaggModeDisaggregated, 1},
		{"embeddings", "/v1/embeddings", `{"model":"m","input":"` + longPrompt + `"}`, "", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := h.modes()
			status, _, answer := h.do(http.MethodPost, c.path, c.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, answer)
			}
			pl, dl := p1.rec.take(), d1.rec.take()
			if len(pl) != c.legs {
				t.Errorf("prefill legs %d, want %d", len(pl), c.legs)
			}
			if c.path != "/v1/embeddings" && len(dl) != 1 {
				t.Errorf("decode legs %d, want 1: a generation never goes whole to a prefill engine", len(dl))
			}
			after := h.modes()
			for _, m := range []string{telemetry.DisaggModeDisaggregated, telemetry.DisaggModeAggregated, telemetry.DisaggModeRecompute} {
				want := before[m]
				if m == c.mode {
					want++
				}
				if after[m] != want {
					t.Errorf("mode %s: %d, want %d", m, after[m], want)
				}
			}
		})
	}
	h.waitIdle()
}

// TestDisaggregationRefusesClientKVParams checks that a client's own
// kv_transfer_params are refused while disaggregation is on (they would
// tell a decode engine where to read a KV cache from), with a 400 that
// names the parameter, before any engine is asked.
func TestDisaggregationRefusesClientKVParams(t *testing.T) {
	engines, cfg := pdFleet(t, nil, "prefill", "decode")
	h := newHarness(t, cfg)
	for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
		body := `{"model":"m","prompt":"x","messages":[{"role":"user","content":"x"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.1","remote_port":5600}}`
		resp := h.post(path, body)
		e := decodeErr(t, resp)
		if resp.StatusCode != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != "kv_transfer_params" {
			t.Errorf("%s: status %d, error %+v; want 400 naming kv_transfer_params", path, resp.StatusCode, e.Error)
		}
	}
	for _, e := range engines {
		if n := len(e.rec.take()); n != 0 {
			t.Errorf("%s got %d requests", e.name, n)
		}
	}
	h.assertIdle()
}

// TestDisaggregationTelemetry checks the instruments and spans of a
// disaggregated request: one span per leg under the request's, each with
// its engine, role, leg and the request id; the prefill duration and the
// handover recorded once; TTFT on the decode engine, the client's TTFT
// (gen_ai.client.operation.time_to_first_chunk) longer by the prefill.
func TestDisaggregationTelemetry(t *testing.T) {
	engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
		if name == "p1" {
			c.TTFT = 60 * time.Millisecond // a prefill long enough to tell the two TTFTs apart
		}
	}, "prefill", "decode")
	_ = engines
	h := newHarness(t, cfg)
	body := `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`
	status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", body, RequestIDHeader, "rid-1")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, answer)
	}
	h.waitIdle()
	if n := h.histCount(telemetry.DisaggPrefillDurationName, telemetry.AttrEngine.String("p1")); n != 1 {
		t.Errorf("prefill duration samples on p1: %d, want 1", n)
	}
	if n := h.histCount(telemetry.DisaggHandoverName, telemetry.AttrEngine.String("d1")); n != 1 {
		t.Errorf("handover samples on d1: %d, want 1", n)
	}
	if n := h.histCount(telemetry.TimeToFirstTokenName, telemetry.AttrEngine.String("p1")); n != 0 {
		t.Errorf("TTFT samples on the prefill engine: %d, want 0 (it generates nothing for the client)", n)
	}
	engineTTFT := h.histSum(telemetry.TimeToFirstTokenName, telemetry.AttrEngine.String("d1"))
	clientTTFT := h.histSum(telemetry.GenAIClientTimeToFirstChunkName)
	prefill := h.histSum(telemetry.DisaggPrefillDurationName)
	if !(prefill >= 0.06 && clientTTFT >= engineTTFT+prefill) {
		t.Errorf("client TTFT %.4fs, engine TTFT %.4fs, prefill %.4fs: want client >= engine + prefill >= 60ms", clientTTFT, engineTTFT, prefill)
	}
	spans := h.spans.Ended()
	var server trace.SpanContext
	for _, s := range spans {
		if s.SpanKind() == trace.SpanKindServer {
			server = s.SpanContext()
		}
	}
	legs := map[string]attribute.Set{}
	for _, s := range spans {
		set := attribute.NewSet(s.Attributes()...)
		if v, ok := set.Value(telemetry.AttrLeg); ok {
			legs[v.AsString()] = set
			if s.Parent().SpanID() != server.SpanID() || s.Parent().TraceID() != server.TraceID() {
				t.Errorf("the %s leg's span is not a child of the request's span", v.AsString())
			}
		}
	}
	for legName, engine := range map[string]string{"prefill": "p1", "decode": "d1"} {
		set, ok := legs[legName]
		if !ok {
			t.Errorf("no %s leg span among %d spans", legName, len(spans))
			continue
		}
		if v, _ := set.Value(telemetry.AttrRequestID); v.AsString() != "rid-1" {
			t.Errorf("%s leg request id %q", legName, v.AsString())
		}
		if v, _ := set.Value(telemetry.AttrSpanEngineRole); v.AsString() != legName {
			t.Errorf("%s leg engine role %q", legName, v.AsString())
		}
		found := false
		for _, kv := range set.ToSlice() {
			if kv.Value.AsString() == engine {
				found = true
			}
		}
		if !found {
			t.Errorf("%s leg span does not name engine %s", legName, engine)
		}
	}
}

// TestDisaggregationFailures covers each failure of the prefill leg and
// the KV transfer: the client's status, the mode counted, the KV
// failures counted, and both engines' gauges back at 0.
func TestDisaggregationFailures(t *testing.T) {
	body := func(stream bool) string {
		return fmt.Sprintf(`{"model":"m","stream":%t,"stream_options":{"include_usage":true},"max_tokens":4,"messages":[{"role":"user","content":"%s"}]}`, stream, longPrompt)
	}
	nonStream := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`
	t.Run("prefill 503 retried on another prefill engine", func(t *testing.T) {
		engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
			if name == "p1" {
				c.Fault = "status=503"
			}
		}, "prefill", "prefill", "prefill", "decode")
		cfg.MaxAttempts = 2
		cfg.Retry.On = []string{"503"}
		h := newHarness(t, cfg)
		// Round-robin over picks of both kinds: p1 comes first for some of
		// the requests, each then retried on p2 or p3.
		for i := range 3 {
			status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", nonStream)
			if status != http.StatusOK {
				t.Fatalf("request %d: status %d: %s", i, status, answer)
			}
		}
		p1, p2, p3, d1 := len(engines[0].rec.take()), len(engines[1].rec.take()), len(engines[2].rec.take()), len(engines[3].rec.take())
		if p1 == 0 || p2+p3 != 3 || d1 != 3 {
			t.Errorf("legs p1 %d, p2 %d, p3 %d, d1 %d; want p1 > 0, p2+p3 3, d1 3", p1, p2, p3, d1)
		}
		if n := h.counter(telemetry.RetriesName); n != int64(p1) {
			t.Errorf("retries %d, want one per p1 leg (%d)", n, p1)
		}
		if m := h.modes(); m[telemetry.DisaggModeDisaggregated] != 3 {
			t.Errorf("modes %v", m)
		}
		h.waitIdle()
	})
	t.Run("prefill error passed through", func(t *testing.T) {
		engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
			if name == "p1" {
				c.Fault = "status=429"
			}
		}, "prefill", "decode")
		cfg.MaxAttempts = 1
		h := newHarness(t, cfg)
		for _, stream := range []bool{false, true} {
			status, hdr, answer := h.do(http.MethodPost, "/v1/chat/completions", body(stream))
			if status != http.StatusTooManyRequests || !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
				t.Errorf("stream=%t: status %d (%s): %s; want the prefill engine's 429 and error object", stream, status, hdr.Get("Content-Type"), answer)
			}
			if e := members(t, answer)["error"]; len(e) == 0 {
				t.Errorf("no error object: %s", answer)
			}
		}
		if n := len(engines[1].rec.take()); n != 0 {
			t.Errorf("decode legs %d after a failed prefill, want 0", n)
		}
		if n := h.errorTypes()["429"]; n != 2 {
			t.Errorf("429 attempts recorded %d, want 2", n)
		}
		h.waitIdle()
	})
	t.Run("prefill without params recomputes", func(t *testing.T) {
		engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
			if name == "p1" {
				c.Fault = "kv-no-params"
			}
		}, "prefill", "decode")
		h := newHarness(t, cfg)
		status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", body(true))
		if status != http.StatusOK || !bytes.Contains(answer, []byte("data: [DONE]")) {
			t.Fatalf("status %d: %s", status, answer)
		}
		dl := engines[1].rec.take()
		if len(dl) != 1 || bytes.Contains(dl[0].body, []byte("kv_transfer_params")) {
			t.Fatalf("decode legs %d; want 1 without kv_transfer_params", len(dl))
		}
		if m := h.modes(); m[telemetry.DisaggModeRecompute] != 1 || m[telemetry.DisaggModeDisaggregated] != 0 {
			t.Errorf("modes %v, want one recompute", m)
		}
		if f := h.kvFailures(); f[telemetry.KVFailureMissingParams] != 1 {
			t.Errorf("kv failures %v", f)
		}
		if engines[1].sim.Stats().KVPulled != 0 {
			t.Error("the decode engine pulled")
		}
		if n := h.histCount(telemetry.DisaggHandoverName); n != 0 {
			t.Errorf("handover samples %d, want 0: nothing was handed over", n)
		}
		h.waitIdle()
	})
	t.Run("kv pull fails, decode recomputes", func(t *testing.T) {
		engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
			if name == "d1" {
				c.KVLoadFailurePolicy = enginesim.KVLoadRecompute
			}
		}, "prefill", "decode")
		h := newHarness(t, cfg)
		// A transfer that works: the gateway learns that d1 reports its
		// cached tokens (vLLM writes them only when not 0).
		if status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", nonStream); status != http.StatusOK {
			t.Fatalf("status %d: %s", status, answer)
		}
		if f := h.kvFailures(); f[telemetry.KVFailureNotTransferred] != 0 {
			t.Fatalf("kv failures %v after a transfer that worked", f)
		}
		engines[1].rec.setFault("kv-pull-fail")
		for _, stream := range []bool{false, true} {
			// Prompts of their own: d1's prefix cache holds the first.
			b := strings.Replace(body(stream), "word", fmt.Sprint(stream), 1)
			if !stream {
				b = strings.Replace(nonStream, "word", "other", 1)
			}
			status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", b)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, answer)
			}
		}
		if f := h.kvFailures(); f[telemetry.KVFailureNotTransferred] != 2 {
			t.Errorf("kv failures %v, want 2 not_transferred", f)
		}
		if n := engines[1].sim.Stats().KVRecomputed; n != 2 {
			t.Errorf("engine recomputed %d", n)
		}
		h.waitIdle()
	})
	t.Run("kv pull fails, decode fails, retried", func(t *testing.T) {
		engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
			if name == "d1" {
				c.Fault = "kv-pull-fail" // the fail policy: a 500
			}
		}, "prefill", "decode", "decode")
		cfg.MaxAttempts = 2
		cfg.Retry.On = []string{"500"}
		h := newHarness(t, cfg)
		status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", nonStream)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, answer)
		}
		d1, d2 := engines[1].rec.take(), engines[2].rec.take()
		if len(d1) != 1 || len(d2) != 1 {
			t.Fatalf("decode legs d1 %d, d2 %d", len(d1), len(d2))
		}
		// The retry after an engine that got the request goes without
		// the params: that engine may have read the KV.
		if !bytes.Contains(d1[0].body, []byte("kv_transfer_params")) || bytes.Contains(d2[0].body, []byte("kv_transfer_params")) {
			t.Errorf("params: first decode leg %t, retry %t; want true, false", bytes.Contains(d1[0].body, []byte("kv_transfer_params")), bytes.Contains(d2[0].body, []byte("kv_transfer_params")))
		}
		h.waitIdle()
	})
}

// TestDisaggregationCancel checks a client that leaves during the prefill
// leg and during the KV pull: the engine working on it aborts the
// request, nothing goes to the next leg, and every gauge is back at 0.
func TestDisaggregationCancel(t *testing.T) {
	for _, during := range []string{"prefill", "kv pull"} {
		t.Run(during, func(t *testing.T) {
			engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
				switch {
				case during == "prefill" && name == "p1":
					c.TTFT = 10 * time.Second
				case during == "kv pull" && name == "d1":
					c.KVTransferPerToken = 50 * time.Millisecond // ~250 tokens: 12 s
				}
			}, "prefill", "decode")
			h := newHarness(t, cfg)
			busy := engines[0]
			if during == "kv pull" {
				busy = engines[1]
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"`+longPrompt+`"}]}`))
			done := make(chan error, 1)
			go func() {
				resp, err := h.client.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				done <- err
			}()
			testutil.Poll(5*time.Second, func() bool { return busy.sim.Stats().Running == 1 })
			if g := h.gauges()[busy.name+"/prefill"]; g != 1 {
				t.Fatalf("%s prefill gauge %d before the cancel, want 1", busy.name, g)
			}
			cancel()
			<-done
			waitAborted(t, busy.sim, 1)
			h.waitIdle()
			if during == "prefill" {
				if n := len(engines[1].rec.take()); n != 0 {
					t.Errorf("decode legs %d after a cancelled prefill", n)
				}
			}
			if n := h.errorTypes()[ErrTypeClientCancelled]; n != 1 {
				t.Errorf("client_cancelled attempts %d, want 1", n)
			}
		})
	}
}

// pdFault is one case of the fault matrix over a disaggregated request's
// two legs.
type pdFault struct {
	name   string
	engine string // the engine that misbehaves: p1 (the prefill leg) or d1 (the decode leg)
	fault  string // its enginesim fault ("dead": nothing listens)
	// Expectations, indexed [non-stream, stream].
	status   [2]int
	errEvent [2]bool // the stream ends with an error event
	// released is each engine's releases by phase, "engine/phase" ->
	// count, the same in both modes unless releasedStream is set.
	released, releasedStream map[string]int
	client                   string // "cancel-mid-stream": the client leaves after the first content
}

// pdFaults is every fault of either leg the gateway must account for
// exactly on both engines.
var pdFaults = []pdFault{
	// A non-streaming answer relayed as it came has no first token: its
	// leg ends in prefill.
	{name: "success", status: [2]int{200, 200}, released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}, releasedStream: map[string]int{"p1/prefill": 1, "d1/decode": 1}},
	{name: "prefill refused", engine: "p1", fault: "dead", status: [2]int{502, 502}, released: map[string]int{"p1/prefill": 1}},
	{name: "prefill 500", engine: "p1", fault: "status=500", status: [2]int{500, 500}, released: map[string]int{"p1/prefill": 1}},
	{name: "prefill close before headers", engine: "p1", fault: "close-before-headers", status: [2]int{502, 502}, released: map[string]int{"p1/prefill": 1}},
	{name: "prefill close after headers", engine: "p1", fault: "close-after-headers", status: [2]int{502, 502}, released: map[string]int{"p1/prefill": 1}},
	{name: "prefill stall", engine: "p1", fault: "stall-before-headers", status: [2]int{504, 504}, released: map[string]int{"p1/prefill": 1}},
	{name: "prefill without params", engine: "p1", fault: "kv-no-params", status: [2]int{200, 200}, released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}, releasedStream: map[string]int{"p1/prefill": 1, "d1/decode": 1}},
	{name: "decode refused", engine: "d1", fault: "dead", status: [2]int{502, 502}, released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}},
	{name: "decode 500", engine: "d1", fault: "status=500", status: [2]int{500, 500}, released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}},
	{name: "kv pull fails", engine: "d1", fault: "kv-pull-fail", status: [2]int{500, 200}, errEvent: [2]bool{false, true}, released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}},
	{name: "decode close mid-stream", engine: "d1", fault: "close-after=3", status: [2]int{502, 200}, errEvent: [2]bool{false, true},
		released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}, releasedStream: map[string]int{"p1/prefill": 1, "d1/decode": 1}},
	{name: "decode stall mid-stream", engine: "d1", fault: "stall-after=2", status: [2]int{504, 200}, errEvent: [2]bool{false, true},
		released: map[string]int{"p1/prefill": 1, "d1/prefill": 1}, releasedStream: map[string]int{"p1/prefill": 1, "d1/decode": 1}},
	{name: "client gone mid-stream", client: "cancel-mid-stream", released: map[string]int{"p1/prefill": 1, "d1/decode": 1}},
}

// TestFaultMatrixDisaggregated runs every fault of either leg of a
// disaggregated request, streaming and not: after each, every gauge of
// both engines is exactly 0 and was never seen below 0, each leg released
// its slot exactly once from the phase it was in, each engine recorded one
// duration per leg, no attempt is live, and no goroutine is left.
func TestFaultMatrixDisaggregated(t *testing.T) {
	for _, fc := range pdFaults {
		for _, stream := range []bool{false, true} {
			if fc.client != "" && !stream {
				continue
			}
			name := fmt.Sprintf("%s/stream=%t", fc.name, stream)
			t.Run(name, func(t *testing.T) { runPDFault(t, fc, stream) })
		}
	}
}

func runPDFault(t *testing.T, fc pdFault, stream bool) {
	engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
		c.TTFT, c.ITL, c.OutputTokens = 20*time.Millisecond, 10*time.Millisecond, 8
		if name == fc.engine && fc.fault != "dead" {
			c.Fault = fc.fault
		}
	}, "prefill", "decode")
	if fc.fault == "dead" {
		for i, e := range engines {
			if e.name == fc.engine {
				cfg.Engines[i].URL = deadURL(t)
			}
		}
	}
	cfg.MaxAttempts = 1
	cfg.Timeouts.Attempt = 500 * time.Millisecond
	cfg.Timeouts.Idle = 300 * time.Millisecond
	cfg.Timeouts.FirstToken = time.Second
	cfg.Timeouts.ResponseHeader = 500 * time.Millisecond
	cfg.Timeouts.Request = 5 * time.Second
	cfg.Migration.Limit = 0 // no continuation: the case's one decode engine has no other
	h := newHarnessWith(t, cfg, nil, withoutStart())
	var relMu sync.Mutex
	released := map[string]int{}
	h.gw.onRelease = func(engine string, p routing.Phase) {
		relMu.Lock()
		released[engine+"/"+p.String()]++
		relMu.Unlock()
	}
	// The watcher reads the gauges all along: never below 0.
	var negative []string
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		for {
			for k, v := range h.gauges() {
				if v < 0 {
					negative = append(negative, fmt.Sprintf("%s=%d", k, v))
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	body := fmt.Sprintf(`{"model":"m","stream":%t,"max_tokens":8,"messages":[{"role":"user","content":"%s"}]}`, stream, longPrompt)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var answer []byte
	if fc.client == "cancel-mid-stream" {
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil || strings.Contains(line, `"content":"tok`) {
				break
			}
		}
		cancel()
	} else {
		answer, _ = io.ReadAll(resp.Body)
	}
	resp.Body.Close()
	i := 0
	if stream {
		i = 1
	}
	if fc.client == "" {
		if resp.StatusCode != fc.status[i] {
			t.Errorf("status %d, want %d: %s", resp.StatusCode, fc.status[i], answer)
		}
		if got := bytes.Contains(answer, []byte(`data: {"error"`)); stream && got != fc.errEvent[i] {
			t.Errorf("error event %t, want %t: %s", got, fc.errEvent[i], answer)
		}
	}
	testutil.Poll(3*time.Second, func() bool { return h.gw.LiveAttempts() == 0 })
	close(stop)
	<-watched
	h.assertIdle()
	if len(negative) > 0 {
		t.Errorf("gauges below 0: %v", negative)
	}
	want := fc.released
	if stream && fc.releasedStream != nil {
		want = fc.releasedStream
	}
	relMu.Lock()
	defer relMu.Unlock()
	if fmt.Sprint(released) != fmt.Sprint(want) {
		t.Errorf("releases %v, want %v", released, want)
	}
	for _, e := range []string{"p1", "d1"} {
		legs := 0
		for k, n := range want {
			if strings.HasPrefix(k, e+"/") {
				legs += n
			}
		}
		if n := h.histCount(telemetry.RequestDurationName, telemetry.AttrEngine.String(e)); n != uint64(legs) {
			t.Errorf("%s recorded %d durations, want %d", e, n, legs)
		}
	}
}

// deadURL returns the URL of a loopback port that refuses connections.
func deadURL(t *testing.T) string {
	t.Helper()
	return testutil.RefusedURL
}

// TestDisaggregationPrefillErrorKept checks that a failed prefill's client
// gets the prefill engine's own error object, byte for byte, every time
// (the leg's body is read before its context ends), named by
// X-Switchboard-Engine, and that the decision is counted.
func TestDisaggregationPrefillErrorKept(t *testing.T) {
	engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
		if name == "p1" {
			c.Fault = "status=429"
		}
	}, "prefill", "decode")
	cfg.MaxAttempts = 1
	cfg.EngineHeader = true
	h := newHarness(t, cfg)
	for i := range 20 {
		body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"%d %s"}]}`, i, longPrompt)
		status, hdr, answer := h.do(http.MethodPost, "/v1/chat/completions", body)
		pl := engines[0].rec.take()
		if len(pl) != 1 {
			t.Fatalf("request %d: %d prefill legs", i, len(pl))
		}
		if status != http.StatusTooManyRequests || string(answer) != string(pl[0].answer) || hdr.Get("X-Switchboard-Engine") != "p1" {
			t.Errorf("request %d: status %d, engine %q: %s; want 429 from p1 with its body %s", i, status, hdr.Get("X-Switchboard-Engine"), answer, pl[0].answer)
		}
	}
	if m := h.modes(); m[telemetry.DisaggModeDisaggregated] != 20 {
		t.Errorf("decisions %v, want 20 disaggregated (failed prefills count)", m)
	}
	h.waitIdle()
}

// TestDisaggregationNotTransferredWithoutClientUsage checks that a failed
// KV transfer is counted on a stream whose client did not ask for usage:
// the usage chunk the gateway asked for is checked before it is dropped.
func TestDisaggregationNotTransferredWithoutClientUsage(t *testing.T) {
	engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
		if name == "d1" {
			c.KVLoadFailurePolicy = enginesim.KVLoadRecompute
		}
	}, "prefill", "decode")
	h := newHarness(t, cfg)
	warm := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`
	if status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", warm); status != http.StatusOK {
		t.Fatalf("status %d: %s", status, answer)
	}
	engines[1].rec.setFault("kv-pull-fail")
	b := `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"other ` + longPrompt + `"}]}`
	status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", b)
	if status != http.StatusOK || bytes.Contains(answer, []byte(`"usage"`)) {
		t.Fatalf("status %d (want 200, no usage chunk for this client): %s", status, answer)
	}
	if n := engines[1].sim.Stats().KVRecomputed; n != 1 {
		t.Fatalf("engine recomputed %d (the test's premise)", n)
	}
	if f := h.kvFailures(); f[telemetry.KVFailureNotTransferred] != 1 {
		t.Errorf("kv failures %v, want 1 not_transferred", f)
	}
	h.waitIdle()
}

// TestDisaggregationDecodeGroup checks that a decode leg on an engine of
// another group than the prefill engine's is sent without the params
// (it could not reach that engine): d1, of p1's group, refuses
// connections, and the retry goes to d2 of another group as a plain
// request; the unused params are counted as abandoned.
func TestDisaggregationDecodeGroup(t *testing.T) {
	engines, cfg := pdFleet(t, nil, "prefill", "decode", "decode")
	cfg.Engines[0].Group, cfg.Engines[1].Group, cfg.Engines[2].Group = "a", "a", "b"
	cfg.Engines[1].URL = deadURL(t) // d1, group a: refuses connections
	cfg.MaxAttempts = 2
	cfg.Retry.On = []string{"connect-failure"}
	h := newHarnessWith(t, cfg, nil, withoutStart(), withPolicy(routing.NewRoundRobin()))
	n := 0
	for i := range 6 {
		body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"%d %s"}]}`, i, longPrompt)
		status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", body)
		if status != http.StatusOK {
			t.Errorf("request %d: status %d: %s", i, status, answer)
		}
	}
	for _, l := range engines[2].rec.take() {
		n++
		if bytes.Contains(l.body, []byte("kv_transfer_params")) {
			t.Errorf("d2 (group b) got group a's kv_transfer_params")
		}
	}
	if n != 6 {
		t.Fatalf("d2 served %d of 6", n)
	}
	// Requests whose decode engine was d1 (group a, with params, refused)
	// went to d2 without them; the others were picked on d2 first, and p1
	// (group a) was not its pair: those were aggregated.
	m := h.modes()
	if m[telemetry.DisaggModeDisaggregated] == 0 || m[telemetry.DisaggModeAggregated] == 0 {
		t.Errorf("modes %v: want both disaggregated (d1 picked first) and aggregated (d2 picked first)", m)
	}
	if f := h.kvFailures(); f[telemetry.KVFailureAbandoned] != m[telemetry.DisaggModeDisaggregated] {
		t.Errorf("abandoned %d, want one per disaggregated request (%v)", f[telemetry.KVFailureAbandoned], m)
	}
	h.waitIdle()
}

// TestDisaggregationKVPullFailContinued checks a decode leg whose KV read
// fails under vLLM's fail policy (its in-band error after the role chunk):
// the stream is continued on the other decode engine, which computes the
// prompt, the client gets the whole answer, and the access log has the
// client's TTFT (the first token came from the continuation).
func TestDisaggregationKVPullFailContinued(t *testing.T) {
	engines, cfg := pdFleet(t, nil, "prefill", "decode", "decode")
	cfg.Outlier.Enabled = false
	var buf testutil.LockedBuffer
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))}, withPolicy(routing.NewRoundRobin()))
	for _, d := range engines[1:] {
		d.rec.setFault("kv-pull-fail")
	}
	body := `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"` + longPrompt + `"}]}`
	status, _, answer := h.do(http.MethodPost, "/v1/chat/completions", body, RequestIDHeader, "r-kv")
	if status != http.StatusOK || !bytes.Contains(answer, []byte(`"content":"tok3 "`)) || bytes.Contains(answer, []byte(`data: {"error"`)) {
		t.Fatalf("status %d: %s; want the whole answer", status, answer)
	}
	h.waitIdle()
	line := accessLine(&buf, "r-kv")
	if line == nil || line["continued"] != 1.0 || line["disaggregation"] != telemetry.DisaggModeDisaggregated || line["ttft"] == nil {
		t.Errorf("access-log line %v: want continued 1, disaggregation disaggregated and a ttft", line)
	}
}

// TestDisaggregationPrefillByLoad checks that, under a policy blind to
// load (round-robin), the prefill engine is the one with the fewest
// requests in flight: while a long prefill holds one prefill engine, the
// next prefill goes to the other, whatever round-robin would have said.
func TestDisaggregationPrefillByLoad(t *testing.T) {
	for round := range 2 { // round-robin's turn differs between the rounds
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			engines, cfg := pdFleet(t, func(name string, c *enginesim.Config) {
				c.TTFT = 3 * time.Second // every prefill is long: the first one holds its engine
			}, "prefill", "prefill", "decode")
			rr := routing.NewRoundRobin()
			for range round {
				_, _ = rr.Pick(context.Background(), &routing.Request{}, []*routing.Endpoint{nil, nil})
			}
			h := newHarnessWith(t, cfg, nil, withPolicy(rr))
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait(); h.waitIdle() }()
			send := func(body string) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
				wg.Go(func() {
					if resp, err := h.client.Do(req); err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
			send(fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"first %s"}]}`, longPrompt))
			var busy, idle *pdEngine
			testutil.Poll(5*time.Second, func() bool {
				for i, e := range engines[:2] {
					if e.sim.Stats().Running == 1 {
						busy, idle = e, engines[1-i]
						return true
					}
				}
				return false
			})
			if busy == nil {
				t.Fatal("the first prefill never started")
			}
			send(fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"next %s"}]}`, longPrompt))
			testutil.Poll(5*time.Second, func() bool { return idle.sim.Stats().Received == 1 })
			if a, b := idle.sim.Stats().Received, busy.sim.Stats().Received; a != 1 || b != 1 {
				t.Errorf("the idle prefill engine %s received %d, the busy %s %d; want 1 each", idle.name, a, busy.name, b)
			}
		})
	}
}
