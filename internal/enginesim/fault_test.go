package enginesim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestParseFaults(t *testing.T) {
	tests := []struct {
		spec  string
		check func(f *faults) bool
	}{
		{"", func(f *faults) bool { return f == noFaults }},
		{"  ", func(f *faults) bool { return f == noFaults }},
		{"status=503", func(f *faults) bool { return f.status == 503 }},
		{"close-before-headers", func(f *faults) bool { return f.closeBeforeHeaders }},
		{"close-after-headers", func(f *faults) bool { return f.closeAfterHeaders }},
		{"close-after=0", func(f *faults) bool { return f.closeAfter == 0 && f.stallAfter == -1 }},
		{"stall-before-headers", func(f *faults) bool { return f.stallBeforeHeaders && f.stallBeforeFor == 0 }},
		{"stall-before-headers=2s", func(f *faults) bool { return f.stallBeforeHeaders && f.stallBeforeFor == 2*time.Second }},
		{"stall-after=4", func(f *faults) bool { return f.stallAfter == 4 }},
		{"slow-headers=150ms", func(f *faults) bool { return f.slowHeaders == 150*time.Millisecond }},
		{"malformed", func(f *faults) bool { return f.malformed }},
		{"trickle", func(f *faults) bool { return f.trickle == time.Millisecond }},
		{"trickle=0s", func(f *faults) bool { return f.trickle == 0 }},
		{"keepalive", func(f *faults) bool { return f.keepAlive && f.keepAliveEvery == 0 }},
		{"keepalive=5ms", func(f *faults) bool { return f.keepAlive && f.keepAliveEvery == 5*time.Millisecond }},
		{"no-content", func(f *faults) bool { return f.noContent }},
		{"reasoning=3", func(f *faults) bool { return f.reasoning == 3 }},
		{"tool-call", func(f *faults) bool { return f.toolCall }},
		{"status=502,error-body=html", func(f *faults) bool { return f.status == 502 && f.errorBody == "html" }},
		{"error-body=text,status=500", func(f *faults) bool { return f.status == 500 && f.errorBody == "text" }},
		{"status=503,error-body=empty", func(f *faults) bool { return f.errorBody == "empty" && f.retryAfter == -1 }},
		{"status=503,error-body=json", func(f *faults) bool { return f.errorBody == "json" }},
		{"status=429,retry-after=7", func(f *faults) bool { return f.retryAfter == 7 && f.errorBody == "" }},
		{"retry-after=0,status=503", func(f *faults) bool { return f.retryAfter == 0 }},
		{"truncate", func(f *faults) bool { return f.truncate && f.closeAfter == -1 }},
		{"powered-by", func(f *faults) bool { return f.poweredBy && f.status == 0 }},
		{" close-after=3 , trickle=2ms,,", func(f *faults) bool {
			return f.closeAfter == 3 && f.trickle == 2*time.Millisecond && f.spec == "close-after=3 , trickle=2ms,,"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			f, err := parseFaults(tc.spec)
			if err != nil {
				t.Fatalf("parseFaults(%q): %v", tc.spec, err)
			}
			if !tc.check(f) {
				t.Errorf("parseFaults(%q) = %+v", tc.spec, f)
			}
		})
	}
	bad := []string{
		"nope", "status", "status=abc", "status=200", "status=600", "close-after", "close-after=-1",
		"close-after=x", "close-before-headers=1", "malformed=yes", "slow-headers", "slow-headers=5",
		"slow-headers=-1s", "trickle=fast", "keepalive=0s", "reasoning=", "stall-after=1.5", "tool-call=1",
		"status=503,bogus",
		"error-body=html", "error-body=json", "retry-after=5", "error-body", "status=500,error-body",
		"status=500,error-body=xml", "status=500,error-body=HTML", "status=429,retry-after=-1",
		"status=429,retry-after=1.5", "status=429,retry-after", "retry-after=-1", "truncate=1", "powered-by=yes",
	}
	for _, spec := range bad {
		t.Run("bad "+spec, func(t *testing.T) {
			if _, err := parseFaults(spec); !errors.Is(err, ErrBadFault) {
				t.Errorf("parseFaults(%q) error = %v, want ErrBadFault", spec, err)
			}
		})
	}
}

const (
	chatStreamBody = `{"model":"m1","messages":[{"role":"user","content":"a b c"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`
	chatUnaryBody  = `{"model":"m1","messages":[{"role":"user","content":"a b c"}],"max_tokens":4}`
	embedBody      = `{"model":"m1","input":"a b c"}`
)

// endpoints are the request shapes every connection-level fault is tried with.
var endpoints = []struct {
	name, path, body string
	stream           bool
}{
	{"chat stream", "/v1/chat/completions", chatStreamBody, true},
	{"chat unary", "/v1/chat/completions", chatUnaryBody, false},
	{"completions stream", "/v1/completions", `{"model":"m1","prompt":"a b c","max_tokens":4,"stream":true}`, true},
	{"embeddings", "/v1/embeddings", embedBody, false},
}

// wantOutcome waits for e to be idle and checks its outcome counters.
func wantOutcome(t *testing.T, e *Engine, completed, aborted, faulted int64) {
	t.Helper()
	s := waitIdle(t, e, 0)
	if s.Completed != completed || s.Aborted != aborted || s.Faulted != faulted {
		t.Errorf("stats = %+v, want completed %d aborted %d faulted %d", s, completed, aborted, faulted)
	}
}

func TestFaultStatus(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp := mustSend(t, srv, "POST", ep.path, ep.body, fault("status=503"))
			b, _ := io.ReadAll(resp.Body)
			want := `{"error":{"message":"enginesim: injected fault status=503","type":"ServiceUnavailableError","param":null,"code":503}}`
			if resp.StatusCode != 503 || string(b) != want {
				t.Errorf("got %d %s", resp.StatusCode, b)
			}
			wantOutcome(t, e, 0, 0, 1)
		})
	}
}

func TestFaultCloseBeforeHeaders(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp, err := send(t, nil, srv, "POST", ep.path, ep.body, fault("close-before-headers"))
			if err == nil {
				_ = resp.Body.Close()
				t.Fatalf("got response %d, want a transport error", resp.StatusCode)
			}
			wantOutcome(t, e, 0, 0, 1)
		})
	}
}

func TestFaultCloseAfterHeaders(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp := mustSend(t, srv, "POST", ep.path, ep.body, fault("close-after-headers"))
			wantCT := "application/json"
			if ep.stream {
				wantCT = "text/event-stream"
			}
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != wantCT {
				t.Errorf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			b, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) || len(b) != 0 {
				t.Errorf("body %q, err %v; want nothing and unexpected EOF", b, err)
			}
			wantOutcome(t, e, 0, 0, 1)
		})
	}
}

func TestFaultCloseAfterStream(t *testing.T) {
	tests := []struct {
		spec    string
		content int
	}{
		{"close-after=3", 3},
		{"close-after=0", 0},
		{"close-after=50", 4}, // more than generated: after the last token
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault(tc.spec))
			evs, err := readEvents(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read error = %v, want unexpected EOF", err)
			}
			data := dataEvents(evs)
			if len(data) != 1+tc.content {
				t.Fatalf("got %d events, want role + %d: %q", len(data), tc.content, data)
			}
			if !strings.Contains(data[0], `"role":"assistant"`) {
				t.Errorf("first event %s", data[0])
			}
			for i, d := range data[1:] {
				if !strings.Contains(d, `"content":"`+ContentToken(i)+`"`) {
					t.Errorf("event %d = %s", i+1, d)
				}
			}
			wantOutcome(t, e, 0, 0, 1)
		})
	}
}

func TestFaultCloseAfterUnary(t *testing.T) {
	for _, ep := range endpoints {
		if ep.stream {
			continue
		}
		t.Run(ep.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			full := mustSend(t, srv, "POST", ep.path, ep.body, nil)
			fb, _ := io.ReadAll(full.Body)
			resp := mustSend(t, srv, "POST", ep.path, ep.body, fault("close-after=1"))
			if resp.ContentLength != -1 {
				t.Errorf("ContentLength = %d, want unknown (chunked)", resp.ContentLength)
			}
			b, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read error = %v, want unexpected EOF", err)
			}
			if len(b) != len(fb)/2 || !strings.HasPrefix(string(fb), string(b[:10])) {
				t.Errorf("partial body %q (%d bytes), full body %d bytes", b, len(b), len(fb))
			}
			wantOutcome(t, e, 1, 0, 1)
		})
	}
}

func TestFaultStallBeforeHeaders(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			time.AfterFunc(30*time.Millisecond, cancel)
			resp, err := send(t, ctx, srv, "POST", ep.path, ep.body, fault("stall-before-headers"))
			if err == nil {
				_ = resp.Body.Close()
				t.Fatalf("got response %d, want the client's cancellation", resp.StatusCode)
			}
			cancelled := time.Now()
			testutil.Eventually(t, time.Second, func() bool { return e.Stats().Aborted == 1 }, "Aborted == 1")
			t.Logf("aborted %v after the client cancelled", time.Since(cancelled))
			wantOutcome(t, e, 0, 1, 0)
		})
	}
}

func TestFaultStallBeforeHeadersFor(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	start := time.Now()
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("stall-before-headers=30ms"))
	if d := time.Since(start); d < 30*time.Millisecond || resp.StatusCode != 200 {
		t.Errorf("status %d after %v, want 200 after >= 30ms", resp.StatusCode, d)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	wantOutcome(t, e, 1, 0, 0)
}

func TestFaultSlowHeaders(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	start := time.Now()
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("slow-headers=50ms"))
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("headers after %v, want >= 50ms", d)
	}
	evs, err := readEvents(resp.Body)
	if err != nil || len(evs) != 8 { // role, 4 tokens, finish, usage, [DONE]
		t.Errorf("got %d events, err %v", len(evs), err)
	}
	wantOutcome(t, e, 1, 0, 0)
}

func TestFaultStallAfter(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		e, srv := startEngine(t, fastConfig())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := send(t, ctx, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("stall-after=2"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		br := bufio.NewReader(resp.Body)
		content := 0
		for content < 2 {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("read after %d content events: %v", content, err)
			}
			if strings.Contains(line, `"content":"tok`) {
				content++
			}
		}
		// The engine now stalls: nothing more arrives while the client waits.
		time.Sleep(20 * time.Millisecond)
		if s := e.Stats(); s.Running != 1 || s.Aborted != 0 {
			t.Errorf("while stalled: %+v", s)
		}
		if br.Buffered() > 1 {
			t.Errorf("%d bytes after the stall point", br.Buffered())
		}
		cancel()
		testutil.Eventually(t, time.Second, func() bool { return e.Stats().Aborted == 1 }, "Aborted == 1")
		wantOutcome(t, e, 0, 1, 0)
	})
	t.Run("unary", func(t *testing.T) {
		e, srv := startEngine(t, fastConfig())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp, err := send(t, ctx, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("stall-after=0"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		buf := make([]byte, 10)
		if _, err := io.ReadFull(resp.Body, buf); err != nil || !strings.HasPrefix(string(buf), `{"id":"cha`) {
			t.Fatalf("partial body %q, err %v", buf, err)
		}
		cancel()
		testutil.Eventually(t, time.Second, func() bool { return e.Stats().Aborted == 1 }, "Aborted == 1")
		wantOutcome(t, e, 0, 1, 0)
	})
}

func TestFaultMalformed(t *testing.T) {
	t.Run("stream", func(t *testing.T) {
		e, srv := startEngine(t, fastConfig())
		resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("malformed"))
		evs, err := readEvents(resp.Body)
		data := dataEvents(evs)
		if err != nil || len(data) != 9 {
			t.Fatalf("got %d events, err %v", len(data), err)
		}
		if data[1] != `{"id":"bad", "choices": [` {
			t.Errorf("event after the role chunk = %q", data[1])
		}
		if json.Valid([]byte(data[1])) || !json.Valid([]byte(data[2])) || data[8] != "[DONE]" {
			t.Errorf("events %q", data)
		}
		wantOutcome(t, e, 1, 0, 0)
	})
	t.Run("unary", func(t *testing.T) {
		e, srv := startEngine(t, fastConfig())
		resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("malformed"))
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != malformedBody {
			t.Errorf("got %d %q", resp.StatusCode, b)
		}
		wantOutcome(t, e, 0, 0, 1)
	})
}

// countingReader counts the reads that returned data.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.reads++
	}
	return n, err
}

func TestFaultTrickle(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	body := `{"model":"m1","messages":[{"role":"user","content":"a"}],"max_tokens":1,"stream":true}`
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", body, fault("trickle=1ms"))
	cr := &countingReader{r: resp.Body}
	raw, err := io.ReadAll(cr)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readEvents(strings.NewReader(string(raw)))
	data := dataEvents(evs)
	if err != nil || len(data) != 4 || data[3] != "[DONE]" || !strings.Contains(data[1], `"content":"tok0 "`) {
		t.Fatalf("events %q, err %v", data, err)
	}
	// Every byte is its own flush followed by a pause, so the client needs far more reads
	// than there are events, and events necessarily arrive split across reads.
	if cr.reads < len(raw)/4 {
		t.Errorf("%d reads for %d bytes in %d events", cr.reads, len(raw), len(data))
	}
	t.Logf("%d reads for %d bytes", cr.reads, len(raw))

	// The default pause is 1ms after each byte.
	start := time.Now()
	resp = mustSend(t, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"a","max_tokens":1}`, fault("trickle"))
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.ContentLength != -1 || !json.Valid(b) {
		t.Errorf("unary trickle: ContentLength %d, body %q, err %v", resp.ContentLength, b, err)
	}
	if d := time.Since(start); d < time.Duration(len(b))*time.Millisecond {
		t.Errorf("%d bytes trickled in %v, want >= 1ms each", len(b), d)
	}
	wantOutcome(t, e, 2, 0, 0)
}

func TestFaultKeepAlive(t *testing.T) {
	tests := []struct {
		spec        string
		minComments int // before the first content event
	}{
		{"keepalive", 1},
		{"keepalive=1ms", 3},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			cfg := fastConfig()
			cfg.TTFT = 30 * time.Millisecond
			e, srv := startEngine(t, cfg)
			resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault(tc.spec))
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			before := 0
			for _, ev := range evs {
				if strings.Contains(ev.data, `"content":"tok`) {
					break
				}
				if ev.comment != "" {
					if ev.comment != ": keep-alive" {
						t.Errorf("comment %q", ev.comment)
					}
					before++
				}
			}
			if before < tc.minComments {
				t.Errorf("%d keep-alives before the first token, want >= %d", before, tc.minComments)
			}
			if data := dataEvents(evs); len(data) != 8 {
				t.Errorf("data events %q", data)
			}
			wantOutcome(t, e, 1, 0, 0)
		})
	}
}

func TestFaultNoContent(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("no-content"))
	evs, err := readEvents(resp.Body)
	data := dataEvents(evs)
	if err != nil || len(data) != 4 {
		t.Fatalf("events %q, err %v", data, err)
	}
	if !strings.Contains(data[0], `"delta":{"role":"assistant","content":""}`) ||
		!strings.Contains(data[1], `"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null`) ||
		!strings.Contains(data[2], `"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0}`) ||
		data[3] != "[DONE]" {
		t.Errorf("events %q", data)
	}
	resp = mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("no-content"))
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"message":{"role":"assistant","content":"","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null}`) ||
		!strings.Contains(string(b), `"completion_tokens":0`) {
		t.Errorf("unary body %s", b)
	}
	wantOutcome(t, e, 2, 0, 0)
}

func TestFaultReasoning(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("reasoning=2"))
	evs, err := readEvents(resp.Body)
	data := dataEvents(evs)
	if err != nil || len(data) != 8 {
		t.Fatalf("events %q, err %v", data, err)
	}
	wantDeltas := []string{
		`"delta":{"reasoning_content":"think0 "}`,
		`"delta":{"reasoning_content":"think1 "}`,
		`"delta":{"content":"tok0 "}`,
		`"delta":{"content":"tok1 "}`,
	}
	for i, want := range wantDeltas {
		if !strings.Contains(data[1+i], want) {
			t.Errorf("event %d = %s, want %s", 1+i, data[1+i], want)
		}
	}
	if !strings.Contains(data[6], `"completion_tokens":4`) {
		t.Errorf("usage %s", data[6])
	}
	resp = mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("reasoning=2"))
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"message":{"role":"assistant","content":"tok0 tok1 ","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"think0 think1 "}`) {
		t.Errorf("unary body %s", b)
	}
	wantOutcome(t, e, 2, 0, 0)
}

func TestFaultToolCall(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("tool-call"))
	evs, err := readEvents(resp.Body)
	data := dataEvents(evs)
	if err != nil || len(data) != 9 {
		t.Fatalf("events %q, err %v", data, err)
	}
	want := `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`
	if !strings.HasSuffix(data[1], want) {
		t.Errorf("event 1 = %s\nwant suffix %s", data[1], want)
	}
	if !strings.Contains(data[2], `"delta":{"content":"tok0 "}`) {
		t.Errorf("event 2 = %s", data[2])
	}
	resp = mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("tool-call"))
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), `"tool_calls":[{"id":"call_0","type":"function","function":{"name":"f","arguments":"{}"}}]`) {
		t.Errorf("unary body %s", b)
	}
	wantOutcome(t, e, 2, 0, 0)
}

func TestDefaultFault(t *testing.T) {
	cfg := fastConfig()
	cfg.Fault = "status=500"
	e, srv := startEngine(t, cfg)
	status := func(hdr map[string]string) int {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, hdr)
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := status(nil); got != 500 {
		t.Errorf("default fault: status %d, want 500", got)
	}
	if got := status(fault("")); got != 200 {
		t.Errorf("empty header: status %d, want 200", got)
	}
	if got := status(fault("status=502")); got != 502 {
		t.Errorf("header fault: status %d, want 502", got)
	}
	if err := e.SetFault("status=429"); err != nil {
		t.Fatal(err)
	}
	if got := status(nil); got != 429 {
		t.Errorf("after SetFault: status %d, want 429", got)
	}
	if err := e.SetFault("bogus"); !errors.Is(err, ErrBadFault) {
		t.Errorf("SetFault(bogus) = %v", err)
	}
	if got := status(nil); got != 429 {
		t.Errorf("after a rejected SetFault: status %d, want 429", got)
	}
	if err := e.SetFault(""); err != nil {
		t.Fatal(err)
	}
	if got := status(nil); got != http.StatusOK {
		t.Errorf("after SetFault(\"\"): status %d, want 200", got)
	}
	wantOutcome(t, e, 2, 0, 4)
}

// tracebackWant is the traceback the html and text error bodies must contain, spelled out
// here rather than taken from the implementation.
const tracebackWant = `Traceback (most recent call last):
  File "/srv/vllm/worker.py", line 42, in execute_model
    output = self.model_runner.execute_model(scheduler_output)
RuntimeError: CUDA error: an illegal memory access was encountered
`

func TestFaultErrorBody(t *testing.T) {
	tests := []struct {
		spec, ct, body string
		status         int
	}{
		{
			spec: "status=503,error-body=json", status: 503, ct: "application/json",
			body: `{"error":{"message":"enginesim: injected fault status=503","type":"ServiceUnavailableError","param":null,"code":503}}`,
		},
		{
			spec: "error-body=html,status=502", status: 502, ct: "text/html; charset=utf-8",
			body: "<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1><pre>" +
				tracebackWant + "</pre></body></html>\n",
		},
		{
			spec: "status=599,error-body=html", status: 599, ct: "text/html; charset=utf-8",
			body: "<html><head><title>599</title></head><body><h1>599</h1><pre>" + tracebackWant + "</pre></body></html>\n",
		},
		{spec: "status=500,error-body=text", status: 500, ct: "text/plain; charset=utf-8", body: tracebackWant},
		{spec: "status=503,error-body=empty", status: 503, ct: "", body: ""},
	}
	for _, tc := range tests {
		for _, ep := range endpoints {
			t.Run(tc.spec+"/"+ep.name, func(t *testing.T) {
				e, srv := startEngine(t, fastConfig())
				resp := mustSend(t, srv, "POST", ep.path, ep.body, fault(tc.spec))
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tc.status || string(b) != tc.body {
					t.Errorf("got %d %q\nwant %d %q", resp.StatusCode, b, tc.status, tc.body)
				}
				if ct := resp.Header.Get("Content-Type"); ct != tc.ct {
					t.Errorf("Content-Type = %q, want %q", ct, tc.ct)
				}
				if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(tc.body)) {
					t.Errorf("Content-Length = %q, want %d", cl, len(tc.body))
				}
				if ra, ok := resp.Header["Retry-After"]; ok {
					t.Errorf("Retry-After %q without retry-after", ra)
				}
				if tc.spec != "status=503,error-body=json" && tc.body != "" && !strings.Contains(string(b), InternalPath) {
					t.Errorf("body lacks the internal path %s", InternalPath)
				}
				wantOutcome(t, e, 0, 0, 1)
			})
		}
	}
}

func TestFaultRetryAfter(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("status=429,retry-after=7"))
	b, _ := io.ReadAll(resp.Body)
	want := `{"error":{"message":"enginesim: injected fault status=429","type":"RateLimitError","param":null,"code":429}}`
	if resp.StatusCode != 429 || string(b) != want || resp.Header.Get("Retry-After") != "7" {
		t.Errorf("got %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	resp = mustSend(t, srv, "POST", "/v1/embeddings", embedBody, fault("retry-after=0,error-body=empty,status=503"))
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || len(b) != 0 || resp.Header.Get("Retry-After") != "0" {
		t.Errorf("got %d Retry-After %q %q", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	resp = mustSend(t, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"a","max_tokens":1,"stream":true}`,
		fault("status=502,error-body=html,retry-after=30"))
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 502 || resp.Header.Get("Retry-After") != "30" || !strings.HasPrefix(string(b), "<html>") {
		t.Errorf("got %d Retry-After %q %q", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	wantOutcome(t, e, 0, 0, 3)
}

func TestFaultNeedsStatus(t *testing.T) {
	tests := []struct{ spec, msg string }{
		{"error-body=html", `invalid fault spec: "error-body=html": needs status=CODE`},
		{"retry-after=5", `invalid fault spec: "retry-after=5": needs status=CODE`},
		{"status=500,error-body=xml", `invalid fault spec: "error-body=xml": kind must be json, html, text or empty`},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault(tc.spec))
			var eb errorBody
			if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 400 || eb.Error.Message != tc.msg || eb.Error.Code != 400 {
				t.Errorf("got %d %+v, want 400 %q", resp.StatusCode, eb, tc.msg)
			}
			if err := e.SetFault(tc.spec); !errors.Is(err, ErrBadFault) {
				t.Errorf("SetFault(%q) = %v, want ErrBadFault", tc.spec, err)
			}
			if _, err := New(Config{Fault: tc.spec}); !errors.Is(err, ErrBadFault) {
				t.Errorf("New with Fault %q: %v, want ErrBadFault", tc.spec, err)
			}
			s := waitIdle(t, e, 1)
			if s.Received != 1 || s.Completed+s.Aborted+s.Faulted != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func TestFaultPoweredBy(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	for _, ep := range endpoints {
		resp := mustSend(t, srv, "POST", ep.path, ep.body, fault("powered-by"))
		_, err := io.Copy(io.Discard, resp.Body)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Powered-By") != "enginesim" {
			t.Errorf("%s: %d X-Powered-By %q, err %v", ep.name, resp.StatusCode, resp.Header.Get("X-Powered-By"), err)
		}
	}
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("status=500,powered-by,error-body=text"))
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 500 || resp.Header.Get("X-Powered-By") != "enginesim" || resp.Header.Get("Server") != "uvicorn" {
		t.Errorf("status fault: %d %v", resp.StatusCode, resp.Header)
	}
	resp = mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	if v, ok := resp.Header["X-Powered-By"]; ok {
		t.Errorf("X-Powered-By %q without the fault", v)
	}
	wantOutcome(t, e, 5, 0, 1)
}

func TestFaultTruncateUnary(t *testing.T) {
	for _, ep := range endpoints {
		if ep.stream {
			continue
		}
		for _, spec := range []string{"truncate", "truncate,trickle=0s"} {
			t.Run(ep.name+"/"+spec, func(t *testing.T) {
				e, srv := startEngine(t, fastConfig())
				full := mustSend(t, srv, "POST", ep.path, ep.body, nil)
				fb, err := io.ReadAll(full.Body)
				if err != nil || full.ContentLength != int64(len(fb)) {
					t.Fatalf("full body: ContentLength %d, %d bytes, err %v", full.ContentLength, len(fb), err)
				}
				resp := mustSend(t, srv, "POST", ep.path, ep.body, fault(spec))
				if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
					t.Errorf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
				}
				// Same shape, same length: ids are fixed-width, embeddings are deterministic.
				if resp.ContentLength != int64(len(fb)) || resp.Header.Get("Content-Length") != strconv.Itoa(len(fb)) {
					t.Errorf("ContentLength = %d, want the full body's %d", resp.ContentLength, len(fb))
				}
				b, err := io.ReadAll(resp.Body)
				if !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Errorf("read error = %v, want unexpected EOF", err)
				}
				if len(b) != len(fb)/2 {
					t.Errorf("got %d bytes of %d, want %d", len(b), len(fb), len(fb)/2)
				}
				if ep.path == "/v1/embeddings" {
					if string(b) != string(fb[:len(fb)/2]) {
						t.Errorf("partial body %q is not the first half of %q", b, fb)
					}
				} else if !strings.HasPrefix(string(b), `{"id":"chatcmpl-`) {
					t.Errorf("partial body %q", b)
				}
				wantOutcome(t, e, 1, 0, 1)
			})
		}
	}
	t.Run("malformed", func(t *testing.T) {
		e, srv := startEngine(t, fastConfig())
		resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("truncate,malformed"))
		b, err := io.ReadAll(resp.Body)
		if !errors.Is(err, io.ErrUnexpectedEOF) || resp.ContentLength != int64(len(malformedBody)) ||
			string(b) != malformedBody[:len(malformedBody)/2] {
			t.Errorf("ContentLength %d, body %q, err %v", resp.ContentLength, b, err)
		}
		wantOutcome(t, e, 0, 0, 1)
	})
}

func TestFaultTruncateStream(t *testing.T) {
	tests := []struct {
		name, path, body string
		last             string // a fragment of the last event
		events           int    // data events, without [DONE]
	}{
		{"chat with usage", "/v1/chat/completions", chatStreamBody, `"choices":[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}`, 7},
		{"completions", "/v1/completions", `{"model":"m1","prompt":"a b c","max_tokens":4,"stream":true}`, `"text":"","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":null}`, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp := mustSend(t, srv, "POST", tc.path, tc.body, fault("truncate"))
			raw, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("read error %v, want a clean end", err)
			}
			// Counted before the response ended: visible as soon as the client sees the end.
			if s := e.Stats(); s.Faulted != 1 || s.Completed != 0 {
				t.Errorf("stats at the end of the stream: %+v", s)
			}
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.ContentLength != -1 {
				t.Errorf("got %d %q ContentLength %d", resp.StatusCode, resp.Header.Get("Content-Type"), resp.ContentLength)
			}
			if strings.Contains(string(raw), "[DONE]") || !strings.HasSuffix(string(raw), "}\n\n") {
				t.Errorf("body ends %q", raw[max(0, len(raw)-40):])
			}
			evs, err := readEvents(strings.NewReader(string(raw)))
			data := dataEvents(evs)
			if err != nil || len(data) != tc.events || !strings.HasSuffix(data[len(data)-1], tc.last) {
				t.Fatalf("events %q, err %v", data, err)
			}
			tokens := data
			if tc.path == "/v1/chat/completions" {
				tokens = tokens[1:] // the role chunk
			}
			for i := range 4 {
				if !strings.Contains(tokens[i], `"`+ContentToken(i)+`"`) {
					t.Errorf("token event %d = %s", i, tokens[i])
				}
			}
			wantOutcome(t, e, 0, 0, 1)
		})
	}
}

func TestFaultStallAfterZeroStream(t *testing.T) {
	tests := []struct {
		name, path, body, spec string
		before                 []string // lines (without "\n") expected before the silence
	}{
		{"chat", "/v1/chat/completions", chatStreamBody, "stall-after=0", []string{`"delta":{"role":"assistant","content":""}`, ""}},
		{"chat keepalive", "/v1/chat/completions", chatStreamBody, "stall-after=0,keepalive",
			[]string{`"delta":{"role":"assistant","content":""}`, "", ": keep-alive", ""}},
		{"completions", "/v1/completions", `{"model":"m1","prompt":"a b c","max_tokens":4,"stream":true}`, "stall-after=0", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := send(t, ctx, srv, "POST", tc.path, tc.body, fault(tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = resp.Body.Close() }()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			br := bufio.NewReader(resp.Body)
			for i, want := range tc.before {
				line, err := br.ReadString('\n')
				if err != nil || !strings.Contains(line, want) || (want == "" && line != "\n") {
					t.Fatalf("line %d = %q, err %v; want %q", i, line, err, want)
				}
			}
			if n := br.Buffered(); n != 0 {
				t.Fatalf("%d more bytes buffered after the expected lines", n)
			}
			// Prefill is over (the first token's time is observed), yet nothing else comes.
			testutil.Eventually(t, time.Second, func() bool {
				return series(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricTimeToFirstToken, "m1").GetHistogram().GetSampleCount() == 1
			}, "prefill done")
			reads := make(chan string, 1)
			go func() {
				buf := make([]byte, 256)
				n, err := br.Read(buf)
				reads <- fmt.Sprintf("%q %v", buf[:n], err)
			}()
			select {
			case got := <-reads:
				t.Fatalf("read during the stall: %s", got)
			case <-time.After(50 * time.Millisecond): // a normal stream would have ended by now
			}
			if s := e.Stats(); s.Running != 1 || s.Aborted != 0 || s.Completed+s.Faulted != 0 {
				t.Errorf("while stalled: %+v", s)
			}
			cancel()
			got := <-reads
			if !strings.HasPrefix(got, `"" `) {
				t.Errorf("read after cancel: %s", got)
			}
			testutil.Eventually(t, time.Second, func() bool { return e.Stats().Aborted == 1 }, "Aborted == 1")
			wantOutcome(t, e, 0, 1, 0)
		})
	}
}
