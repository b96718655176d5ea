package gateway

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestCaseL10FirstTokenRule: TTFT starts at the first chunk carrying
// content, reasoning content, tool calls or completion text; never at the
// role-only prelude, comments, usage-only chunks, finish chunks or [DONE].
// A stream without content and a non-streaming request record no TTFT.
func TestCaseL10FirstTokenRule(t *testing.T) {
	const role = `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	const finish = `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
	const usage = `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":6,"total_tokens":9}}`
	content := func(s string) string {
		return `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + s + `"},"finish_reason":null}]}`
	}
	const firstDelay = 200 * time.Millisecond
	tests := []struct {
		name      string
		stream    bool
		first     string // the first generated chunk, sent after firstDelay
		more      int    // content chunks after it, 20 ms apart
		wantTTFT  uint64
		wantITL   uint64
		noContent bool
	}{
		{name: "content", stream: true, first: content("Hi"), more: 5, wantTTFT: 1, wantITL: 5},
		{name: "reasoning first", stream: true, first: `{"id":"c1","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}`, more: 2, wantTTFT: 1, wantITL: 2},
		{name: "tool call first", stream: true, first: `{"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}`, more: 1, wantTTFT: 1, wantITL: 1},
		{name: "completion text", stream: true, first: `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"Hi","finish_reason":null}]}`, more: 0, wantTTFT: 1},
		{name: "no content", stream: true, noContent: true, wantTTFT: 0},
		{name: "non-streaming", stream: false, wantTTFT: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if !tt.stream {
					time.Sleep(firstDelay)
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
					return
				}
				s := newSSE(w)
				time.Sleep(10 * time.Millisecond)
				s.data(role)
				s.raw(": ping\n\n")
				time.Sleep(firstDelay)
				if !tt.noContent {
					s.data(tt.first)
					for i := range tt.more {
						time.Sleep(20 * time.Millisecond)
						s.data(content(string(rune('a' + i))))
					}
				}
				s.data(finish)
				s.data(usage)
				s.data("[DONE]")
			})
			h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
			stream := "false"
			if tt.stream {
				stream = "true"
			}
			resp := h.post("/v1/chat/completions", `{"model":"m","stream":`+stream+`,"messages":[{"role":"user","content":"hi"}]}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			h.waitIdle()
			engAttr := telemetry.AttrEngine.String("e1")
			if n := h.histCount(telemetry.TimeToFirstTokenName, engAttr, telemetry.AttrModel.String("m")); n != tt.wantTTFT {
				t.Fatalf("TTFT samples = %d, want %d", n, tt.wantTTFT)
			}
			if tt.wantTTFT == 1 {
				ttft := h.histSum(telemetry.TimeToFirstTokenName, engAttr)
				// The clock starts at the first generated chunk (~210 ms),
				// not at the role chunk (~10 ms) or the ping.
				if ttft < firstDelay.Seconds() || ttft > firstDelay.Seconds()+0.5 {
					t.Errorf("TTFT = %.3fs, want about %.3fs", ttft, firstDelay.Seconds()+0.01)
				}
			}
			if n := h.histCount(telemetry.InterTokenLatencyName, engAttr); n != tt.wantITL {
				t.Errorf("ITL samples = %d, want %d", n, tt.wantITL)
			}
			if tt.wantITL > 0 {
				mean := h.histSum(telemetry.InterTokenLatencyName, engAttr) / float64(tt.wantITL)
				if mean < 0.015 || mean > 0.2 {
					t.Errorf("mean ITL %.3fs, want about 0.020s", mean)
				}
			}
			if et := h.errorTypes(); et[""] != 1 || len(et) != 1 {
				t.Errorf("error types %v, want one success", et)
			}
			// The span carries the first_token event exactly when TTFT was recorded.
			var events int
			for _, s := range h.spans.Ended() {
				for _, ev := range s.Events() {
					if ev.Name == "first_token" {
						events++
					}
				}
			}
			if uint64(events) != tt.wantTTFT {
				t.Errorf("first_token span events = %d, want %d", events, tt.wantTTFT)
			}
		})
	}
}

// TestFirstTokenBoundsHeaderWait: the first-token deadline also bounds the
// wait for a stream's response headers, so an engine that never answers is
// cut at timeouts.first_token even when the response-header timeout is
// longer (or off) and there is no request timeout.
func TestFirstTokenBoundsHeaderWait(t *testing.T) {
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.Timeouts.ResponseHeader = 0
	cfg.Timeouts.Request = 0
	cfg.Timeouts.FirstToken = 300 * time.Millisecond
	h := newHarness(t, cfg)
	start := time.Now()
	resp := h.post("/v1/chat/completions", chatStream, enginesim.FaultHeader, "stall-before-headers")
	e := decodeErr(t, resp)
	if resp.StatusCode != http.StatusGatewayTimeout || e.Error.Code != ErrTypeFirstToken {
		t.Fatalf("%d %+v, want 504 %s", resp.StatusCode, e.Error, ErrTypeFirstToken)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 3*time.Second {
		t.Errorf("answered after %s, want about the first-token timeout (300ms)", d)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeFirstToken] != 1 {
		t.Errorf("error types %v", et)
	}
	waitAborted(t, eng, 1)
}
