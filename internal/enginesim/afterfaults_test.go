package enginesim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseAfterFaults(t *testing.T) {
	f, err := parseFaults("reset-after=2, error-after=0 ,drain-after=5")
	if err != nil {
		t.Fatal(err)
	}
	if f.resetAfter != 2 || f.errorAfter != 0 || f.drainAfter != 5 || f.closeAfter != -1 || f.stallAfter != -1 {
		t.Errorf("parsed %+v", f)
	}
	if noFaults.resetAfter != -1 || noFaults.errorAfter != -1 || noFaults.drainAfter != -1 {
		t.Errorf("noFaults %+v", noFaults)
	}
	for _, bad := range []string{"reset-after", "error-after=-1", "drain-after=x"} {
		if _, err := parseFaults(bad); !errors.Is(err, ErrBadFault) {
			t.Errorf("%q: err = %v, want ErrBadFault", bad, err)
		}
	}
}

func TestFaultResetAfterStream(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("reset-after=2"))
	evs, err := readEvents(resp.Body)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read error = %v, want connection reset", err)
	}
	data := dataEvents(evs)
	if len(data) != 3 {
		t.Fatalf("got %d events, want role + 2 tokens: %q", len(data), data)
	}
	for i, d := range data[1:] {
		if !strings.Contains(d, `"content":"`+ContentToken(i)+`"`) {
			t.Errorf("event %d = %s", i+1, d)
		}
	}
	wantOutcome(t, e, 0, 0, 1)
}

func TestFaultResetAfterUnary(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("reset-after=1"))
	b, err := io.ReadAll(resp.Body)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read error = %v after %q, want connection reset", err, b)
	}
	if !strings.HasPrefix(string(b), `{"id":"chatcmpl-`) {
		t.Errorf("body start %q, want half the JSON body", b)
	}
	wantOutcome(t, e, 0, 0, 1)
}

const midErrorJSON = `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`

func TestFaultErrorAfterStream(t *testing.T) {
	tests := []struct {
		name, path, body string
		tokens           int // token events before the error
		tail             []sseEvent
	}{
		{"chat", "/v1/chat/completions", chatStreamBody, 2,
			[]sseEvent{{data: midErrorJSON}, {data: "[DONE]"}}},
		{"chat past the end", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":1,"stream":true}`, 1,
			[]sseEvent{{data: midErrorJSON}, {data: "[DONE]"}}},
		{"completions", "/v1/completions", `{"prompt":"a","max_tokens":4,"stream":true}`, 2,
			[]sseEvent{{data: midErrorJSON}, {data: "[DONE]"}}},
		{"messages", "/v1/messages", `{"model":"m1","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"a"}]}`, 2,
			[]sseEvent{{event: "error", data: `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			resp := mustSend(t, srv, "POST", tc.path, tc.body, fault("error-after=2"))
			evs, err := readEvents(resp.Body)
			if err != nil {
				t.Fatalf("read: %v (the stream must end cleanly)", err)
			}
			if len(evs) < len(tc.tail) {
				t.Fatalf("events %+v", evs)
			}
			tail := evs[len(evs)-len(tc.tail):]
			for i := range tc.tail {
				if tail[i] != tc.tail[i] {
					t.Errorf("tail event %d = %+v, want %+v", i, tail[i], tc.tail[i])
				}
			}
			tokens := 0
			for _, ev := range evs {
				if strings.Contains(ev.data, `"tok`) {
					tokens++
				}
			}
			if tokens != tc.tokens {
				t.Errorf("%d token events, want %d: %+v", tokens, tc.tokens, evs)
			}
			wantOutcome(t, e, 0, 0, 1)
		})
	}
}

func TestFaultErrorAfterResponsesStream(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/responses", `{"input":"a","stream":true}`, fault("error-after=1"))
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	// created, in_progress, output_item.added, content_part.added, one delta: 5 events, 0..4.
	last := evs[len(evs)-1]
	want := sseEvent{event: "error", data: `{"type":"error","code":"InternalServerError","message":"Internal server error","param":null,"sequence_number":5}`}
	if len(evs) != 6 || last != want {
		t.Errorf("events %+v, want 6 ending with %+v", evs, want)
	}
}

func TestFaultErrorAfterUnary(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, fault("error-after=1"))
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInternalServerError || string(b) != midErrorJSON {
		t.Errorf("%d %s, want 500 %s", resp.StatusCode, b, midErrorJSON)
	}
	resp = mustSend(t, srv, "POST", "/v1/messages", `{"model":"m1","max_tokens":4,"messages":[{"role":"user","content":"a"}]}`, fault("error-after=1"))
	b, _ = io.ReadAll(resp.Body)
	if want := `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`; resp.StatusCode != 500 || string(b) != want {
		t.Errorf("messages: %d %s, want 500 %s", resp.StatusCode, b, want)
	}
	wantOutcome(t, e, 0, 0, 2)
}

// healthStatus returns GET /health's status.
func healthStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

func TestFaultDrainAfterStream(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatStreamBody, fault("drain-after=2"))
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	if len(data) != 6 {
		t.Fatalf("events %q, want role, 2 tokens, finish, usage, [DONE]", data)
	}
	for _, want := range []struct {
		i    int
		part string
	}{
		{1, `"content":"tok0 "`}, {2, `"content":"tok1 "`},
		{3, `"delta":{},"logprobs":null,"finish_reason":"abort","stop_reason":null}]`},
		{4, `"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}`},
	} {
		if !strings.Contains(data[want.i], want.part) {
			t.Errorf("event %d = %s, want %s", want.i, data[want.i], want.part)
		}
	}
	if data[5] != "[DONE]" {
		t.Errorf("last event %s", data[5])
	}
	wantOutcome(t, e, 0, 0, 1)

	if !e.Draining() || healthStatus(t, srv.URL) != http.StatusServiceUnavailable {
		t.Errorf("draining %v health %d, want draining and 503", e.Draining(), healthStatus(t, srv.URL))
	}
	resp = mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, nil)
	b, _ := io.ReadAll(resp.Body)
	if want := `{"error":{"message":"` + errDraining + `","type":"ServiceUnavailableError","param":null,"code":503}}`; resp.StatusCode != 503 || string(b) != want {
		t.Errorf("new request while draining: %d %s, want 503 %s", resp.StatusCode, b, want)
	}
	if resp := mustSend(t, srv, "POST", "/tokenize", `{"prompt":"a"}`, nil); resp.StatusCode != 200 {
		t.Errorf("tokenize while draining: %d", resp.StatusCode)
	}

	e.SetDraining(false)
	if healthStatus(t, srv.URL) != http.StatusOK {
		t.Error("health after undrain")
	}
	if resp := mustSend(t, srv, "POST", "/v1/chat/completions", chatUnaryBody, nil); resp.StatusCode != 200 {
		t.Errorf("request after undrain: %d", resp.StatusCode)
	}
}

func TestFaultDrainAfterUnaryAndTyped(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/v1/completions", `{"prompt":"a b","max_tokens":4}`, fault("drain-after=1"))
	b, _ := io.ReadAll(resp.Body)
	if want := `"choices":[{"index":0,"text":"tok0 ","logprobs":null,"finish_reason":"abort","stop_reason":null,"prompt_logprobs":null}],` +
		`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":2,"total_tokens":3,"completion_tokens":1,`; resp.StatusCode != 200 || !strings.Contains(string(b), want) {
		t.Errorf("%d %s\nwant %s", resp.StatusCode, b, want)
	}
	if !e.Draining() {
		t.Error("not draining")
	}
	e.SetDraining(false)

	// A route without an abort finish_reason is cut.
	resp = mustSend(t, srv, "POST", "/v1/messages", `{"model":"m1","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"a"}]}`, fault("drain-after=1"))
	if _, err := readEvents(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("messages stream: read error %v, want unexpected EOF", err)
	}
	wantOutcome(t, e, 0, 0, 2)
	if !e.Draining() {
		t.Error("messages: not draining")
	}
}

func TestParseAtFaults(t *testing.T) {
	f, err := parseFaults("cut-at=3, reset-at=2,stall-at=5")
	if err != nil {
		t.Fatal(err)
	}
	if f.cutAt != 3 || f.resetAt != 2 || f.stallAt != 5 || f.closeAfter != -1 || f.resetAfter != -1 || f.stallAfter != -1 {
		t.Errorf("parsed %+v", f)
	}
	if noFaults.cutAt != -1 || noFaults.resetAt != -1 || noFaults.stallAt != -1 {
		t.Errorf("noFaults %+v", noFaults)
	}
	for _, bad := range []string{"cut-at", "cut-at=0", "reset-at=-1", "stall-at=x"} {
		if _, err := parseFaults(bad); !errors.Is(err, ErrBadFault) {
			t.Errorf("%q: err = %v, want ErrBadFault", bad, err)
		}
	}
	// Resolved: relative to where the generation starts, the earlier of
	// an after-fault and an at-fault, nothing from N on; f is unchanged.
	g := f.resolveAt(1, 0)
	if g.closeAfter != 2 || g.resetAfter != 1 || g.stallAfter != 4 || g.cutAt != -1 || f.cutAt != 3 {
		t.Errorf("resolveAt(1, 0) = %+v (f %+v)", g, f)
	}
	if g := f.resolveAt(3, 0); g.closeAfter != -1 || g.resetAfter != -1 || g.stallAfter != 2 {
		t.Errorf("resolveAt(3, 0) = %+v", g)
	}
	if g := f.resolveAt(0, 2); g.closeAfter != 5 {
		t.Errorf("resolveAt(0, 2): close-after %d, want 5 (2 reasoning tokens lead)", g.closeAfter)
	}
	both, _ := parseFaults("close-after=1,cut-at=3")
	if g := both.resolveAt(0, 0); g.closeAfter != 1 {
		t.Errorf("close-after=1,cut-at=3: close-after %d, want the earlier 1", g.closeAfter)
	}
}

// TestFaultCutAt: cut-at=N cuts a generation that starts before content
// token N when it reaches N, and lets a continuation that resumes at N
// (or later) through whole; reset-at resets, stall-at stalls, the same
// way.
func TestFaultCutAt(t *testing.T) {
	const n = 5
	_, srv := startEngine(t, fastConfig())
	contBody := func(k int) string {
		return fmt.Sprintf(`{"model":"m1","prompt":%s,"max_tokens":%d,"stream":true}`, idList(append(wordIDs("a b c"), contentIDs(0, k)...)...), n-k)
	}
	chat := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"a b c"}],"max_tokens":%d,"stream":true}`, n)
	for _, tc := range []struct {
		name, path, body, spec string
		want                   []string // content tokens, in order
		cut                    error    // nil: the whole stream and [DONE]
	}{
		{"first leg cut at 3", "/v1/chat/completions", chat, "cut-at=3", []string{"tok0 ", "tok1 ", "tok2 "}, io.ErrUnexpectedEOF},
		{"reasoning first", "/v1/chat/completions", chat, "cut-at=1,reasoning=2", []string{"tok0 "}, io.ErrUnexpectedEOF},
		{"continuation from 1 cut at 3", "/v1/completions", contBody(1), "cut-at=3", []string{"tok1 ", "tok2 "}, io.ErrUnexpectedEOF},
		{"continuation from 3 passes", "/v1/completions", contBody(3), "cut-at=3", []string{"tok3 ", "tok4 "}, nil},
		{"continuation from 4 passes", "/v1/completions", contBody(4), "cut-at=3", []string{"tok4 "}, nil},
		{"reset at 2", "/v1/chat/completions", chat, "reset-at=2", []string{"tok0 ", "tok1 "}, syscall.ECONNRESET},
		{"reset: continuation from 2 passes", "/v1/completions", contBody(2), "reset-at=2", []string{"tok2 ", "tok3 ", "tok4 "}, nil},
		{"stall: continuation from 2 passes", "/v1/completions", contBody(2), "stall-at=2", []string{"tok2 ", "tok3 ", "tok4 "}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", tc.path, tc.body, fault(tc.spec))
			evs, err := readEvents(resp.Body)
			if tc.cut == nil && err != nil || tc.cut != nil && !errors.Is(err, tc.cut) {
				t.Errorf("read error = %v, want %v", err, tc.cut)
			}
			data := dataEvents(evs)
			var got []string
			for _, d := range data {
				for _, tok := range []string{"tok0 ", "tok1 ", "tok2 ", "tok3 ", "tok4 "} {
					if strings.Contains(d, `"content":"`+tok+`"`) || strings.Contains(d, `"text":"`+tok+`"`) {
						got = append(got, tok)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("content %q, want %q (events %q)", got, tc.want, data)
			}
			if done := len(data) > 0 && data[len(data)-1] == "[DONE]"; done != (tc.cut == nil) {
				t.Errorf("[DONE] %v, want %v", done, tc.cut == nil)
			}
		})
	}
	// A stalled first leg holds its slot until the client leaves.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/chat/completions", strings.NewReader(chat))
	req.Header.Set(FaultHeader, "stall-at=2")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readEvents(resp.Body)
	if !errors.Is(err, context.DeadlineExceeded) || len(dataEvents(evs)) != 3 {
		t.Errorf("stall-at=2: read error %v after %q, want the role chunk and 2 tokens, then the client's deadline", err, dataEvents(evs))
	}
	resp.Body.Close()
}
