package enginesim

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// routeCase is one request on a route added beside chat, completions and embeddings.
type routeCase struct {
	name, method, path, body string
	form                     []formField // a multipart body instead of body
	stream                   bool
	api                      api
	tracked                  bool   // counted in Stats (generation and pooling)
	ct                       string // Content-Type of the non-stream 200 answer ("": none)
	// setup prepares the engine before each request (a stored response, a loaded or
	// unloaded adapter) and returns the path to use instead of path.
	setup func(t *testing.T, srv *httptest.Server) string
	// tokens counts the token events of a stream; done reports its terminator.
	tokens func(evs []sseEvent) int
	done   func(evs []sseEvent) bool
}

// countEvents counts the valid events named name (the malformed fault's event is named
// like a delta but is not one).
func countEvents(name string) func([]sseEvent) int {
	return func(evs []sseEvent) int {
		n := 0
		for _, ev := range evs {
			if ev.event == name && ev.data != badEventData {
				n++
			}
		}
		return n
	}
}

// badEventData is the data of the malformed fault's event.
const badEventData = `{"id":"bad", "choices": [`

func hasEvent(name string) func([]sseEvent) bool {
	return func(evs []sseEvent) bool { return countEvents(name)(evs) > 0 }
}

func countChunks(evs []sseEvent) int {
	n := 0
	for _, ev := range evs {
		if strings.Contains(ev.data, `"delta":{"content":`) && ev.data != badEventData {
			n++
		}
	}
	return n
}

func hasDone(evs []sseEvent) bool {
	d := dataEvents(evs)
	return len(d) > 0 && d[len(d)-1] == "[DONE]"
}

// postSetup posts body to path and returns the response's id.
func postSetup(t *testing.T, srv *httptest.Server, path, body string) string {
	t.Helper()
	resp := mustSend(t, srv, "POST", path, body, nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("setup %s: %d %s", path, resp.StatusCode, b)
	}
	return decode[responseHead](t, b).ID
}

// newRouteCases are the requests every fault is tried on.
func newRouteCases() []routeCase {
	msg := `"messages":[{"role":"user","content":"a b c"}]`
	file := formField{name: "file", value: wav2s, file: true}
	return []routeCase{
		{name: "responses", method: "POST", path: "/v1/responses", body: `{"input":"a b c"}`, tracked: true, ct: "application/json"},
		{name: "responses stream", method: "POST", path: "/v1/responses", body: `{"input":"a b c","stream":true}`, stream: true, tracked: true,
			tokens: countEvents("response.output_text.delta"), done: hasEvent("response.completed")},
		{name: "responses background", method: "POST", path: "/v1/responses", body: `{"input":"a b c","background":true}`, tracked: true, ct: "application/json"},
		{name: "messages", method: "POST", path: "/v1/messages", body: `{"model":"m1","max_tokens":50,` + msg + `}`, api: apiAnthropic, tracked: true, ct: "application/json"},
		{name: "messages stream", method: "POST", path: "/v1/messages", body: `{"model":"m1","max_tokens":50,"stream":true,` + msg + `}`,
			api: apiAnthropic, stream: true, tracked: true, tokens: countEvents("content_block_delta"), done: hasEvent("message_stop")},
		{name: "transcriptions", method: "POST", path: "/v1/audio/transcriptions", form: []formField{file, {name: "model", value: "m1"}}, tracked: true, ct: "application/json"},
		{name: "transcriptions stream", method: "POST", path: "/v1/audio/transcriptions", form: []formField{file, {name: "stream", value: "true"}},
			stream: true, tracked: true, tokens: countChunks, done: hasDone},
		{name: "translations", method: "POST", path: "/v1/audio/translations", form: []formField{file}, tracked: true, ct: "application/json"},
		{name: "speech", method: "POST", path: "/v1/audio/speech", body: `{"input":"a b c"}`, tracked: true, ct: "audio/wav"},
		{name: "images", method: "POST", path: "/v1/images/generations", body: `{"prompt":"a b c"}`, tracked: true, ct: "application/json"},
		{name: "rerank", method: "POST", path: "/v2/rerank", body: `{"query":"a","documents":["a b","c"]}`, tracked: true, ct: "application/json"},
		{name: "score", method: "POST", path: "/score", body: `{"text_1":"a","text_2":["a b","c"]}`, tracked: true, ct: "application/json"},
		{name: "pooling", method: "POST", path: "/pooling", body: `{"input":"a b c"}`, tracked: true, ct: "application/json"},
		{name: "classify", method: "POST", path: "/classify", body: `{"input":"a b c"}`, tracked: true, ct: "application/json"},
		{name: "tokenize", method: "POST", path: "/tokenize", body: `{"prompt":"a b c"}`, ct: "application/json"},
		{name: "detokenize", method: "POST", path: "/detokenize", body: `{"tokens":[1,2]}`, ct: "application/json"},
		{name: "count_tokens", method: "POST", path: "/v1/messages/count_tokens", body: `{"model":"m1",` + msg + `}`, api: apiAnthropic, ct: "application/json"},
		{name: "get response", method: "GET", ct: "application/json", setup: func(t *testing.T, srv *httptest.Server) string {
			return "/v1/responses/" + postSetup(t, srv, "/v1/responses", `{"input":"a"}`)
		}},
		{name: "cancel response", method: "POST", ct: "application/json", setup: func(t *testing.T, srv *httptest.Server) string {
			return "/v1/responses/" + postSetup(t, srv, "/v1/responses", `{"input":"a","background":true}`) + "/cancel"
		}},
		{name: "load lora", method: "POST", body: `{"lora_name":"l","lora_path":"/p"}`, ct: "text/plain; charset=utf-8",
			setup: func(t *testing.T, srv *httptest.Server) string {
				resp := mustSend(t, srv, "POST", "/v1/unload_lora_adapter", `{"lora_name":"l"}`, nil)
				_, _ = io.Copy(io.Discard, resp.Body)
				return "/v1/load_lora_adapter"
			}},
		{name: "unload lora", method: "POST", body: `{"lora_name":"pre"}`, ct: "text/plain; charset=utf-8",
			setup: func(t *testing.T, srv *httptest.Server) string {
				resp := mustSend(t, srv, "POST", "/v1/load_lora_adapter", `{"lora_name":"pre","lora_path":"/p","load_inplace":true}`, nil)
				_, _ = io.Copy(io.Discard, resp.Body)
				return "/v1/unload_lora_adapter"
			}},
		{name: "sleep", method: "POST", path: "/sleep?level=1"},
		{name: "wake_up", method: "POST", path: "/wake_up"},
		{name: "is_sleeping", method: "GET", path: "/is_sleeping", ct: "application/json"},
		{name: "reset_prefix_cache", method: "POST", path: "/reset_prefix_cache"},
	}
}

// startRouteEngine serves a fresh engine with a frozen clock (background responses stay
// pending).
func startRouteEngine(t *testing.T) (*Engine, *httptest.Server) {
	t.Helper()
	cfg := fastConfig()
	cfg.OutputTokens = 4
	cfg.LoRAs = []LoRA{{Name: "pre", Path: "/loras/pre"}}
	clk := testutil.NewClock(time.Unix(1_800_000_000, 0))
	return startEngineWith(t, cfg, func(e *Engine) { e.now = clk.Now })
}

// prepare runs rc's setup and returns the path to request and the engine's counters then.
func prepare(t *testing.T, e *Engine, srv *httptest.Server, rc routeCase) (string, Stats) {
	t.Helper()
	path := rc.path
	if rc.setup != nil {
		path = rc.setup(t, srv)
	}
	waitIdle(t, e, pendingBackground(e))
	return path, e.Stats()
}

// pendingBackground is the number of background responses still generating (received, no
// outcome yet).
func pendingBackground(e *Engine) int64 {
	e.responses.mu.Lock()
	defer e.responses.mu.Unlock()
	return int64(len(e.responses.pending))
}

// effect is how one request moves the engine's counters.
type effect struct{ received, completed, aborted, faulted int64 }

// served is the effect of rc answered normally: a tracked request completes (a background
// one only later), a cancel aborts the background response, other light routes count
// nothing.
func (rc routeCase) served() effect {
	switch {
	case rc.name == "responses background":
		return effect{received: 1}
	case rc.tracked:
		return effect{received: 1, completed: 1}
	case rc.name == "cancel response":
		return effect{aborted: 1}
	}
	return effect{}
}

// faulted is the effect of rc ended by a fault before its action.
func (rc routeCase) faulted() effect {
	if rc.tracked {
		return effect{received: 1, faulted: 1}
	}
	return effect{}
}

// bodyFaulted is the effect of rc whose answer's body is broken by a fault (malformed,
// truncate, close-after): tracked requests are faulted, except a background request, handed
// off before its reply; light routes have acted.
func (rc routeCase) bodyFaulted() effect {
	if rc.tracked && rc.name != "responses background" {
		return rc.faulted()
	}
	return rc.served()
}

// sendCase sends rc to path with the fault spec (a nil ctx means a background one).
func sendCase(t *testing.T, ctx context.Context, srv *httptest.Server, rc routeCase, path, spec string) (*http.Response, error) {
	t.Helper()
	if ctx == nil {
		ctx = context.Background()
	}
	var body io.Reader = strings.NewReader(rc.body)
	ct := "application/json"
	if rc.form != nil {
		var b []byte
		ct, b = multipartBody(t, rc.form...)
		body = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, rc.method, srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if rc.method == "POST" {
		req.Header.Set("Content-Type", ct)
	}
	if spec != "" {
		req.Header.Set(FaultHeader, spec)
	}
	resp, err := srv.Client().Do(req)
	if err == nil {
		t.Cleanup(func() { _ = resp.Body.Close() })
	}
	return resp, err
}

// wantDelta waits for the engine to be idle with its counters moved from before by d.
func wantDelta(t *testing.T, e *Engine, before Stats, d effect) {
	t.Helper()
	var s Stats
	testutil.Eventually(t, 2*time.Second, func() bool {
		s = e.Stats()
		return s.Running == 0 && s.Waiting == 0 && s.Received-before.Received == d.received &&
			s.Completed-before.Completed == d.completed && s.Aborted-before.Aborted == d.aborted &&
			s.Faulted-before.Faulted == d.faulted
	}, "engine idle with the expected counts")
	if got := e.kvBlocks.Load(); got != 0 {
		t.Errorf("KV blocks held when idle = %d", got)
	}
}

func TestRouteFaultStatus(t *testing.T) {
	for _, rc := range newRouteCases() {
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			resp, err := sendCase(t, nil, srv, rc, path, "status=503,retry-after=3,powered-by")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			want := `{"error":{"message":"enginesim: injected fault status=503","type":"ServiceUnavailableError","param":null,"code":503}}`
			if rc.api == apiAnthropic {
				want = `{"type":"error","error":{"type":"overloaded_error","message":"enginesim: injected fault status=503"}}`
			}
			if resp.StatusCode != 503 || string(b) != want || resp.Header.Get("Retry-After") != "3" ||
				resp.Header.Get("X-Powered-By") != "enginesim" || resp.Header.Get("Server") != "uvicorn" {
				t.Errorf("got %d %v %s", resp.StatusCode, resp.Header, b)
			}
			wantDelta(t, e, before, rc.faulted())

			path, before = prepare(t, e, srv, rc)
			resp, err = sendCase(t, nil, srv, rc, path, "status=502,error-body=html")
			if err != nil {
				t.Fatal(err)
			}
			b, _ = io.ReadAll(resp.Body)
			if resp.StatusCode != 502 || !strings.HasPrefix(string(b), "<html>") || !strings.Contains(string(b), InternalPath) {
				t.Errorf("html error body: %d %s", resp.StatusCode, b)
			}
			wantDelta(t, e, before, rc.faulted())
		})
	}
}

func TestRouteFaultCloseBeforeHeaders(t *testing.T) {
	for _, rc := range newRouteCases() {
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			resp, err := sendCase(t, nil, srv, rc, path, "close-before-headers")
			if err == nil {
				t.Fatalf("got response %d, want a transport error", resp.StatusCode)
			}
			wantDelta(t, e, before, rc.faulted())
		})
	}
}

func TestRouteFaultCloseAfterHeaders(t *testing.T) {
	for _, rc := range newRouteCases() {
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			resp, err := sendCase(t, nil, srv, rc, path, "close-after-headers")
			if err != nil {
				t.Fatal(err)
			}
			wantCT := rc.ct
			if rc.stream {
				wantCT = "text/event-stream"
			}
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != wantCT {
				t.Errorf("got %d %q, want 200 %q", resp.StatusCode, resp.Header.Get("Content-Type"), wantCT)
			}
			b, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) || len(b) != 0 {
				t.Errorf("body %q, err %v; want nothing and unexpected EOF", b, err)
			}
			wantDelta(t, e, before, rc.faulted())
		})
	}
}

func TestRouteFaultUnaryBody(t *testing.T) {
	for _, rc := range newRouteCases() {
		if rc.stream {
			continue
		}
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			resp, err := sendCase(t, nil, srv, rc, path, "malformed")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(b) != malformedBody {
				t.Errorf("malformed: %d %q", resp.StatusCode, b)
			}
			wantDelta(t, e, before, rc.bodyFaulted())

			// truncate: the whole body's length declared, half of it sent.
			path, before = prepare(t, e, srv, rc)
			resp, err = sendCase(t, nil, srv, rc, path, "truncate")
			if err != nil {
				t.Fatal(err)
			}
			b, err = io.ReadAll(resp.Body)
			declared := resp.ContentLength
			if (declared > 0) != (rc.ct != "") {
				t.Errorf("truncate: Content-Length %d", declared)
			}
			if declared > 0 && (!errors.Is(err, io.ErrUnexpectedEOF) || int64(len(b)) != declared/2) {
				t.Errorf("truncate: %d of %d bytes, err %v", len(b), declared, err)
			}
			wantDelta(t, e, before, rc.bodyFaulted())
		})
	}
}

func TestRouteFaultCloseAfterUnary(t *testing.T) {
	for _, rc := range newRouteCases() {
		if rc.stream || rc.ct == "" {
			continue
		}
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			resp, err := sendCase(t, nil, srv, rc, path, "close-after=1")
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.ContentLength != -1 || !errors.Is(err, io.ErrUnexpectedEOF) || len(b) == 0 {
				t.Errorf("got %d ContentLength %d, %d bytes, err %v", resp.StatusCode, resp.ContentLength, len(b), err)
			}
			wantDelta(t, e, before, rc.bodyFaulted())
		})
	}
}

func TestRouteFaultStreams(t *testing.T) {
	for _, rc := range newRouteCases() {
		if !rc.stream {
			continue
		}
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			check := func(spec string, wantTokens int, wantDone bool, wantErr error) []sseEvent {
				t.Helper()
				resp, err := sendCase(t, nil, srv, rc, path, spec)
				if err != nil {
					t.Fatal(err)
				}
				evs, err := readEvents(resp.Body)
				if !errors.Is(err, wantErr) {
					t.Errorf("%s: read error %v, want %v", spec, err, wantErr)
				}
				if got := rc.tokens(evs); got != wantTokens {
					t.Errorf("%s: %d token events, want %d", spec, got, wantTokens)
				}
				if got := rc.done(evs); got != wantDone {
					t.Errorf("%s: terminator %v, want %v", spec, got, wantDone)
				}
				return evs
			}
			check("", 4, true, nil)
			check("close-after=2", 2, false, io.ErrUnexpectedEOF)
			check("close-after=0", 0, false, io.ErrUnexpectedEOF)
			check("close-after=99", 4, false, io.ErrUnexpectedEOF)
			check("truncate", 4, false, nil)
			evs := check("malformed", 4, true, nil)
			bad := 0
			for _, ev := range evs {
				if ev.data == badEventData {
					bad++
				}
			}
			if bad != 1 {
				t.Errorf("malformed: %d invalid events in %v", bad, evs)
			}
			check("trickle=0s,keepalive", 4, true, nil)
			wantDelta(t, e, before, effect{received: 7, completed: 3, faulted: 4})
		})
	}
}

// readTokens reads SSE lines from br until n lines pass count, failing on a read error.
func readTokens(t *testing.T, br *bufio.Reader, n int, isToken func(line string) bool) {
	t.Helper()
	for seen := 0; seen < n; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read after %d token events: %v", seen, err)
		}
		if isToken(line) {
			seen++
		}
	}
}

// tokenLine reports whether an SSE line carries a token of rc's stream.
func tokenLine(rc routeCase) func(string) bool {
	return func(line string) bool {
		switch {
		case strings.HasPrefix(rc.path, "/v1/responses"):
			return strings.Contains(line, `"type":"response.output_text.delta"`)
		case strings.HasPrefix(rc.path, "/v1/messages"):
			return strings.Contains(line, `"text_delta"`)
		}
		return strings.Contains(line, `"delta":{"content":`)
	}
}

func TestRouteFaultStallAfter(t *testing.T) {
	for _, rc := range newRouteCases() {
		if !rc.stream {
			continue
		}
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := sendCase(t, ctx, srv, rc, path, "stall-after=2")
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			readTokens(t, br, 2, tokenLine(rc))
			time.Sleep(20 * time.Millisecond)
			if s := e.Stats(); s.Running != 1 || s.Aborted != 0 {
				t.Errorf("while stalled: %+v", s)
			}
			_, _ = br.ReadString('\n') // the blank line ending the second token's event
			if br.Buffered() != 0 {
				t.Errorf("%d bytes after the stall point", br.Buffered())
			}
			cancel()
			wantDelta(t, e, before, effect{received: 1, aborted: 1})
		})
	}
}

// TestRouteClientDisconnect checks that a client leaving a new generative route mid-way
// aborts it at once: the running slot and KV blocks are freed and it counts as aborted.
func TestRouteClientDisconnect(t *testing.T) {
	for _, rc := range newRouteCases() {
		if !rc.tracked || rc.name == "responses background" {
			continue
		}
		t.Run(rc.name, func(t *testing.T) {
			cfg := fastConfig()
			cfg.OutputTokens = 1000
			if rc.stream {
				cfg.ITL = time.Second // the client leaves after the first token, long before the second
			} else {
				cfg.TTFT = time.Hour // the client leaves during the prefill
			}
			e, srv := startEngine(t, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if !rc.stream {
				time.AfterFunc(30*time.Millisecond, cancel)
				if resp, err := sendCase(t, ctx, srv, rc, rc.path, ""); err == nil {
					b, _ := io.ReadAll(resp.Body)
					t.Fatalf("got %d %d bytes, want the client's cancellation", resp.StatusCode, len(b))
				}
				wantDelta(t, e, Stats{}, effect{received: 1, aborted: 1})
				return
			}
			resp, err := sendCase(t, ctx, srv, rc, rc.path, "")
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			readTokens(t, br, 1, tokenLine(rc))
			if s := e.Stats(); s.Running != 1 || e.kvBlocks.Load() == 0 {
				t.Errorf("while streaming: %+v, %d KV blocks", s, e.kvBlocks.Load())
			}
			cancel()
			wantDelta(t, e, Stats{}, effect{received: 1, aborted: 1})
			if gen := counterValue(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricGenerationTokens, "m1"); gen != 1 {
				t.Errorf("generation tokens %v, want 1: the stream must stop when its client leaves", gen)
			}
		})
	}
}

// TestRouteFaultLightActions checks that the admin and adapter routes act only when their
// answer would be sent: not under a status fault or an early close.
func TestRouteFaultLightActions(t *testing.T) {
	for _, spec := range []string{"status=500", "close-before-headers", "close-after-headers"} {
		t.Run(spec, func(t *testing.T) {
			e, srv := startEngine(t, fastConfig())
			for _, p := range []struct{ path, body string }{
				{"/sleep?level=2", ""},
				{"/v1/load_lora_adapter", `{"lora_name":"l","lora_path":"/p"}`},
			} {
				rc := routeCase{method: "POST", body: p.body}
				if resp, err := sendCase(t, nil, srv, rc, p.path, spec); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
				}
			}
			if e.asleep.Load() {
				t.Errorf("slept under %s", spec)
			}
			if _, ok := e.target("l"); ok {
				t.Errorf("loaded an adapter under %s", spec)
			}
		})
	}
	// Body faults still act: the engine did its work, only the answer is broken.
	e, srv := startEngine(t, fastConfig())
	resp, err := sendCase(t, nil, srv, routeCase{method: "POST"}, "/sleep", "truncate")
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	if !e.asleep.Load() {
		t.Errorf("truncate stopped the sleep")
	}
}

func TestRouteFaultSlowAndStallBeforeHeaders(t *testing.T) {
	for _, rc := range newRouteCases() {
		t.Run(rc.name, func(t *testing.T) {
			e, srv := startRouteEngine(t)
			path, before := prepare(t, e, srv, rc)
			start := time.Now()
			resp, err := sendCase(t, nil, srv, rc, path, "slow-headers=30ms")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if d := time.Since(start); d < 30*time.Millisecond || resp.StatusCode != 200 {
				t.Errorf("slow-headers: %d after %v", resp.StatusCode, d)
			}
			wantDelta(t, e, before, rc.served())

			path, before = prepare(t, e, srv, rc)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			if resp, err := sendCase(t, ctx, srv, rc, path, "stall-before-headers"); err == nil {
				t.Fatalf("stall-before-headers answered %d", resp.StatusCode)
			}
			want := effect{}
			if rc.tracked {
				want = effect{received: 1, aborted: 1}
			}
			wantDelta(t, e, before, want)
		})
	}
}

// TestRoutesConcurrentSafe runs the new routes concurrently with the actions that change
// what they see (adapters loaded and unloaded, sleep and wake, stored responses read and
// cancelled, faults), for the race detector; every request must end and free what it held.
func TestRoutesConcurrentSafe(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 3
	cfg.OutputTokens = 3
	e, srv := startEngine(t, cfg)
	cases := newRouteCases()
	specs := []string{"", "", "close-after=1", "status=500", "stall-after=1", "trickle=0s", "reasoning=1", "truncate"}
	var wg sync.WaitGroup
	for i := range 48 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			rc := cases[i%len(cases)]
			path := rc.path
			switch rc.name {
			case "get response", "cancel response":
				path = "/v1/responses/resp_" + strconv.Itoa(i)
				if rc.name == "cancel response" {
					path += "/cancel"
				}
			case "load lora":
				path, rc.body = "/v1/load_lora_adapter", `{"lora_name":"l`+strconv.Itoa(i%3)+`","lora_path":"/p"}`
			case "unload lora":
				path, rc.body = "/v1/unload_lora_adapter", `{"lora_name":"l`+strconv.Itoa(i%3)+`"}`
			}
			if i%4 == 0 {
				// Requests on an adapter that may be loaded, unloaded or reloaded meanwhile.
				rc = routeCase{method: "POST", path: "/v1/responses", body: `{"model":"l` + strconv.Itoa(i%3) + `","input":"a b","stream":true}`}
				path = rc.path
			}
			resp, err := sendCase(t, ctx, srv, rc, path, specs[i%len(specs)])
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = e.Stats()
		})
	}
	wg.Wait()
	resp := mustSend(t, srv, "POST", "/wake_up", "", nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	testutil.Eventually(t, 2*time.Second, func() bool {
		s := e.Stats()
		return s.Running == 0 && s.Waiting == 0 && s.Completed+s.Aborted+s.Faulted <= s.Received
	}, "engine idle")
	if got := e.kvBlocks.Load(); got != 0 {
		t.Errorf("KV blocks held when idle = %d", got)
	}
}
