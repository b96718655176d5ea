package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

const (
	shapeChat       = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	shapeChatStream = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	// hiddenBodyMsg is the debug line passError logs for an engine error
	// body it does not show.
	hiddenBodyMsg = `msg="engine error body not shown to the client"`
)

// logLines returns the lines of log that contain substr.
func logLines(log, substr string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// postCtx is h.post with a context, so a test whose gateway misbehaves
// (buffers what it should stream) fails at the deadline instead of hanging.
func (h *harness) postCtx(ctx context.Context, path, body string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// hijackEngine is a fake engine that answers every generation request by
// writing raw bytes on the TCP connection and closing it, so the response
// can be malformed in ways net/http's server never produces (a body short
// of its declared Content-Length).
func hijackEngine(t *testing.T, raw string) string {
	t.Helper()
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString(raw)
		_ = brw.Flush()
	})
	return eng.URL
}

// TestEngineErrorBodiesSafe proves that an engine's error answer reaches
// the client only in a shape that is safe to show: an OpenAI error object
// passes byte for byte with its status and Retry-After; an HTML page, a
// traceback, or an empty body is replaced (streamed or not) by an OpenAI
// error naming the engine and the status, with Retry-After kept and the
// type following the status class, and never shows the page or the
// engine's internal path. The original goes to the debug log, capped at
// 2 KiB, and is not logged at all at info level. error.type is the status.
func TestEngineErrorBodiesSafe(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	// A 3000-byte HTML body: only its first 2 KiB may be logged.
	bigHTML := "<html>HEAD" + strings.Repeat("a", 3000) + "TAILMARK</html>"
	big := fakeEngine(t, []string{"big"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(500)
		_, _ = io.WriteString(w, bigHTML)
	})
	var logBuf testutil.LockedBuffer
	logger := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL}, fleet.EngineConfig{Name: "big", URL: big.URL})
	h := newHarnessWith(t, cfg, []Option{WithLogger(logger)})

	const simJSON503 = `{"error":{"message":"enginesim: injected fault status=503","type":"ServiceUnavailableError","param":null,"code":503}}`
	tests := []struct {
		fault      string
		status     int
		retryAfter string
		passBody   string // the engine's body passes unchanged
		typ        string // otherwise: the replacement's type and message
		message    string
		logged     bool   // the original is logged at debug level
		loggedHas  string // and the logged line contains this
	}{
		{fault: "status=503,error-body=json,retry-after=7", status: 503, retryAfter: "7", passBody: simJSON503},
		{fault: "status=502,error-body=html", status: 502, typ: TypeServer, message: "engine e1 answered 502 Bad Gateway", logged: true, loggedHas: "<html><head><title>502 Bad Gateway"},
		{fault: "status=502,error-body=text", status: 502, typ: TypeServer, message: "engine e1 answered 502 Bad Gateway", logged: true, loggedHas: "Traceback"},
		{fault: "status=502,error-body=empty", status: 502, typ: TypeServer, message: "engine e1 answered 502 Bad Gateway", logged: true, loggedHas: `body=""`},
		{fault: "status=429,error-body=html,retry-after=3", status: 429, retryAfter: "3", typ: TypeInvalidRequest, message: "engine e1 answered 429 Too Many Requests", logged: true, loggedHas: "429 Too Many Requests"},
	}
	for _, tt := range tests {
		for _, body := range []string{shapeChat, shapeChatStream} {
			mode := "non-stream"
			if body == shapeChatStream {
				mode = "stream"
			}
			t.Run(tt.fault+"/"+mode, func(t *testing.T) {
				before := len(logLines(logBuf.String(), hiddenBodyMsg))
				resp := h.post("/v1/chat/completions", body, enginesim.FaultHeader, tt.fault)
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, tt.status, b)
				}
				if got := resp.Header.Get("Retry-After"); got != tt.retryAfter {
					t.Errorf("Retry-After %q, want %q", got, tt.retryAfter)
				}
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q, want application/json", ct)
				}
				if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(b)) {
					t.Errorf("Content-Length %q for a %d-byte body", cl, len(b))
				}
				if strings.Contains(string(b), "<html") || strings.Contains(string(b), enginesim.InternalPath) || strings.Contains(string(b), "Traceback") {
					t.Errorf("engine internals reached the client: %s", b)
				}
				if tt.passBody != "" {
					if string(b) != tt.passBody {
						t.Errorf("body %s, want the engine's %s", b, tt.passBody)
					}
				} else {
					var e apiErr
					if err := json.Unmarshal(b, &e); err != nil {
						t.Fatalf("body %q is not JSON: %v", b, err)
					}
					if e.Error.Message != tt.message || e.Error.Type != tt.typ || e.code() != strconv.Itoa(tt.status) || e.Error.Param != nil {
						t.Errorf("error %+v, want message %q type %q code %q param null", e.Error, tt.message, tt.typ, strconv.Itoa(tt.status))
					}
					if _, ok := e.Error.Code.(string); !ok {
						t.Errorf("code %v (%T), want the string %q", e.Error.Code, e.Error.Code, strconv.Itoa(tt.status))
					}
				}
				lines := logLines(logBuf.String(), hiddenBodyMsg)[before:]
				switch {
				case !tt.logged && len(lines) != 0:
					t.Errorf("a body shown to the client was also logged: %q", lines)
				case tt.logged && len(lines) != 1:
					t.Errorf("%d debug lines for the hidden body, want 1: %q", len(lines), lines)
				case tt.logged:
					l := lines[0]
					for _, want := range []string{"engine=e1", "status=" + strconv.Itoa(tt.status), tt.loggedHas} {
						if !strings.Contains(l, want) {
							t.Errorf("debug line lacks %q: %s", want, l)
						}
					}
					if !strings.Contains(tt.fault, "empty") && !strings.Contains(l, enginesim.InternalPath) {
						t.Errorf("debug line lacks the original body (%s): %s", enginesim.InternalPath, l)
					}
				}
			})
		}
	}

	t.Run("logged body capped at 2 KiB", func(t *testing.T) {
		before := len(logLines(logBuf.String(), hiddenBodyMsg))
		resp := h.post("/v1/chat/completions", `{"model":"big","messages":[{"role":"user","content":"hi"}]}`)
		if resp.StatusCode != 500 {
			t.Errorf("status %d, want 500", resp.StatusCode)
		}
		if e := decodeErr(t, resp); e.Error.Message != "engine big answered 500 Internal Server Error" || e.Error.Type != TypeServer || e.code() != "500" {
			t.Errorf("error %+v", e.Error)
		}
		lines := logLines(logBuf.String(), hiddenBodyMsg)[before:]
		if len(lines) != 1 {
			t.Fatalf("%d debug lines, want 1: %q", len(lines), lines)
		}
		l := lines[0]
		if !strings.Contains(l, "engine=big") || !strings.Contains(l, bigHTML[:2048]) || strings.Contains(l, bigHTML[:2049]) || strings.Contains(l, "TAILMARK") {
			t.Errorf("logged body not the first 2048 bytes of the original (line is %d bytes)", len(l))
		}
	})

	h.waitIdle()
	want := map[string]uint64{"503": 2, "502": 6, "429": 2, "500": 1}
	got := h.errorTypes()
	for k, n := range want {
		if got[k] != n {
			t.Errorf("error.type %q recorded %d times, want %d (all: %v)", k, got[k], n, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("error types %v, want exactly %v", got, want)
	}

	t.Run("info level logs nothing", func(t *testing.T) {
		var infoBuf testutil.LockedBuffer
		info := slog.New(slog.NewTextHandler(&infoBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		hi := newHarnessWith(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL}), []Option{WithLogger(info)})
		resp := hi.post("/v1/chat/completions", shapeChat, enginesim.FaultHeader, "status=502,error-body=html")
		if resp.StatusCode != 502 {
			t.Errorf("status %d, want 502", resp.StatusCode)
		}
		if e := decodeErr(t, resp); e.Error.Message != "engine e1 answered 502 Bad Gateway" {
			t.Errorf("error %+v", e.Error)
		}
		hi.waitIdle()
		if l := infoBuf.String(); strings.Contains(l, "engine error body not shown") || strings.Contains(l, enginesim.InternalPath) || strings.Contains(l, "<html") {
			t.Errorf("the hidden body was logged at info level: %s", l)
		}
	})
}

// TestQueryStringForwarded proves that the client's query string reaches
// the engine unchanged on every proxied route.
func TestQueryStringForwarded(t *testing.T) {
	var rec recorder
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"list","data":[]}`)
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	const q = "api-version=2024-06-01&x=1"
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", shapeChat},
		{"/v1/completions", `{"model":"m","prompt":"hi"}`},
		{"/v1/embeddings", `{"model":"m","input":"hi"}`},
	} {
		resp := h.post(tc.path+"?"+q, tc.body)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: status %d", tc.path, resp.StatusCode)
			continue
		}
		got := rec.last()
		if got.URL.Path != tc.path || got.URL.RawQuery != q {
			t.Errorf("engine saw %s?%s, want %s?%s", got.URL.Path, got.URL.RawQuery, tc.path, q)
		}
	}
	h.waitIdle()
}

// TestNonSSEStreamPassThrough proves that a streamed answer in a framing
// other than SSE (NDJSON, and chunked application/json of unknown length)
// is passed through byte for byte and flushed per write: each piece
// reaches the client while the engine is still waiting to write the next
// (the engine writes piece i+1 only after the client has read piece i).
// It is a success (error.type "") with no parse errors.
func TestNonSSEStreamPassThrough(t *testing.T) {
	for _, tc := range []struct {
		ct     string
		pieces []string
	}{
		{"application/x-ndjson", []string{
			`{"id":"c","choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n",
			`{"id":"c","choices":[{"index":0,"delta":{"content":"b"}}]}` + "\n",
			`{"id":"c","choices":[{"index":0,"delta":{"content":"c"}}]}` + "\n",
			`{"id":"c","choices":[{"index":0,"delta":{"content":"d"}}]}` + "\n",
			`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n",
		}},
		{"application/json", []string{
			`{"id":"c",` + "\n",
			`"object":"chat.completion",` + "\n",
			`"choices":[{"index":0,"message":{"role":"assistant","content":"abc"},"finish_reason":"stop"}]` + "\n",
			`}` + "\n",
		}},
	} {
		t.Run(tc.ct, func(t *testing.T) {
			acks := make(chan struct{})
			var written atomic.Int32 // pieces the engine has written
			eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", tc.ct)
				w.WriteHeader(200)
				rc := http.NewResponseController(w)
				for i, p := range tc.pieces {
					// Counted before the write: the client may read the
					// piece as soon as it is flushed.
					written.Store(int32(i + 1))
					_, _ = io.WriteString(w, p)
					_ = rc.Flush()
					if i == len(tc.pieces)-1 {
						return
					}
					select {
					case <-acks:
					case <-r.Context().Done():
						return
					case <-time.After(5 * time.Second):
						t.Errorf("piece %d never reached the client (buffered)", i)
						return
					}
				}
			})
			h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp := h.postCtx(ctx, "/v1/chat/completions", shapeChatStream)
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if ct := resp.Header.Get("Content-Type"); ct != tc.ct {
				t.Errorf("Content-Type %q, want %q", ct, tc.ct)
			}
			if resp.ContentLength != -1 {
				t.Errorf("Content-Length %d, want none (streamed)", resp.ContentLength)
			}
			br := bufio.NewReader(resp.Body)
			var all strings.Builder
			for i := range tc.pieces {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("piece %d: %v (got %q)", i, err, all.String())
				}
				all.WriteString(line)
				if n := written.Load(); n != int32(i+1) {
					t.Errorf("piece %d read when the engine had written %d pieces", i, n)
				}
				if i < len(tc.pieces)-1 {
					select {
					case acks <- struct{}{}:
					case <-ctx.Done():
						t.Fatalf("the engine stopped waiting after piece %d", i)
					}
				}
			}
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatalf("end of the stream: %v", err)
			}
			all.Write(rest)
			if want := strings.Join(tc.pieces, ""); all.String() != want {
				t.Errorf("client got %q, want %q", all.String(), want)
			}
			h.waitIdle()
			if et := h.errorTypes(); et[""] != 1 || len(et) != 1 {
				t.Errorf("error types %v, want one success", et)
			}
			if n := h.counter(telemetry.ParseErrorsName); n != 0 {
				t.Errorf("%d parse errors, want 0", n)
			}
		})
	}
}

// TestStreamEndRulePerRoute proves that each route's stream end rule is
// applied: a chat or completions SSE stream that ends cleanly without
// `data: [DONE]` was cut, and the client gets a final error event
// (engine_disconnect), while the same framing on /v1/embeddings (end at
// EOF) is a complete success passed byte for byte; and a chat stream is
// ended at [DONE] even when the engine keeps the connection open.
func TestStreamEndRulePerRoute(t *testing.T) {
	t.Run("chat and completions without [DONE] are cut", func(t *testing.T) {
		_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 3})
		h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL}))
		for _, tc := range []struct{ path, body string }{
			{"/v1/chat/completions", shapeChatStream},
			{"/v1/completions", `{"model":"m","stream":true,"prompt":"hi"}`},
		} {
			resp := h.post(tc.path, tc.body, enginesim.FaultHeader, "truncate")
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s: %v", tc.path, err)
			}
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d", tc.path, resp.StatusCode)
			}
			s := string(b)
			if strings.Contains(s, "[DONE]") {
				t.Errorf("%s: [DONE] in a cut stream: %s", tc.path, tail(s))
			}
			if !strings.Contains(s, "tok0") {
				t.Errorf("%s: the engine's events were not forwarded: %s", tc.path, s)
			}
			events := strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n")
			last, ok := strings.CutPrefix(events[len(events)-1], "data: ")
			var e apiErr
			if !ok || json.Unmarshal([]byte(last), &e) != nil {
				t.Fatalf("%s: last event %q is not a data: {\"error\"} event", tc.path, events[len(events)-1])
			}
			if e.code() != ErrTypeEngineDisconnect || e.Error.Type != TypeServer || e.Error.Message != "the engine closed the stream before it was complete" {
				t.Errorf("%s: error event %+v", tc.path, e.Error)
			}
		}
		h.waitIdle()
		if et := h.errorTypes(); et[ErrTypeEngineDisconnect] != 2 || len(et) != 1 {
			t.Errorf("error types %v, want engine_disconnect twice", et)
		}
	})

	t.Run("embeddings end at EOF", func(t *testing.T) {
		const events = "data: {\"object\":\"embedding\",\"index\":0,\"embedding\":[0.1,0.2]}\n\n" +
			"data: {\"object\":\"embedding\",\"index\":1,\"embedding\":[0.3,0.4]}\n\n"
		eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			s := newSSE(w)
			for _, ev := range strings.SplitAfter(events, "\n\n") {
				if ev != "" {
					s.raw(ev)
				}
			}
		})
		h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
		resp := h.post("/v1/embeddings", `{"model":"m","input":["a","b"]}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(b) != events {
			t.Errorf("embeddings: status %d, err %v, body %q; want 200 and the engine's events only", resp.StatusCode, err, b)
		}
		// The same engine framing on chat (end at [DONE]) is a cut stream.
		resp = h.post("/v1/chat/completions", shapeChatStream)
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.HasPrefix(string(b), events) || !strings.Contains(string(b)[len(events):], `"code":"engine_disconnect"`) {
			t.Errorf("chat with the same framing: %q, want the events and then an engine_disconnect error event", b)
		}
		h.waitIdle()
		if et := h.errorTypes(); et[""] != 1 || et[ErrTypeEngineDisconnect] != 1 || len(et) != 2 {
			t.Errorf("error types %v, want one success (embeddings) and one engine_disconnect (chat)", et)
		}
		if n := h.counter(telemetry.ParseErrorsName); n != 0 {
			t.Errorf("%d parse errors, want 0", n)
		}
	})

	t.Run("chat ends at [DONE] on a connection left open", func(t *testing.T) {
		engineGone := make(chan struct{})
		eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			s := newSSE(w)
			s.data(`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`)
			s.data(`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
			s.data("[DONE]")
			// Keep the response open: only the gateway going away ends it.
			select {
			case <-r.Context().Done():
				close(engineGone)
			case <-time.After(10 * time.Second):
				t.Error("the gateway kept the engine connection open after [DONE]")
			}
		})
		h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp := h.postCtx(ctx, "/v1/chat/completions", shapeChatStream)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("err %v, body %q; want a stream ended at [DONE]", err, b)
		}
		select {
		case <-engineGone:
		case <-ctx.Done():
			t.Fatal("the engine request was not cancelled after [DONE]")
		}
		h.waitIdle()
		if et := h.errorTypes(); et[""] != 1 || len(et) != 1 {
			t.Errorf("error types %v, want one success", et)
		}
	})
}

// TestCutNonStreamingBody proves that a non-streaming body the engine cuts
// short (close-after, truncate, or a raw response short of its declared
// Content-Length) is answered with a 502 engine_disconnect OpenAI error,
// never a 200 that looks whole; and that a complete body the engine sent
// chunked (trickle) reaches the client whole with its exact Content-Length.
func TestCutNonStreamingBody(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 6})
	raw := hijackEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"+
		strings.Repeat("y", 100))
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL}, fleet.EngineConfig{Name: "raw", URL: raw, Models: []string{"raw-model"}})
	h := newHarness(t, cfg)

	for _, tc := range []struct{ name, body, fault string }{
		{"close-after=3", shapeChat, "close-after=3"},
		{"truncate", shapeChat, "truncate"},
		{"raw short of Content-Length", `{"model":"raw-model","messages":[{"role":"user","content":"hi"}]}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.fault != "" {
				hdr = []string{enginesim.FaultHeader, tc.fault}
			}
			resp := h.post("/v1/chat/completions", tc.body, hdr...)
			if resp.StatusCode != http.StatusBadGateway {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("status %d (body %q), want 502", resp.StatusCode, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			e := decodeErr(t, resp)
			if e.code() != ErrTypeEngineDisconnect || e.Error.Type != TypeServer {
				t.Errorf("error %+v, want code engine_disconnect, type server_error", e.Error)
			}
		})
	}

	t.Run("chunked complete body gets its exact length", func(t *testing.T) {
		resp := h.post("/v1/chat/completions", shapeChat, enginesim.FaultHeader, "trickle=0s")
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d, err %v", resp.StatusCode, err)
		}
		if resp.ContentLength != int64(len(b)) || len(resp.TransferEncoding) != 0 {
			t.Errorf("Content-Length %d, Transfer-Encoding %v for a %d-byte body; want its exact length", resp.ContentLength, resp.TransferEncoding, len(b))
		}
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 || out.Choices[0].Message.Content != "tok0 tok1 tok2 tok3 tok4 tok5 " {
			t.Errorf("body %q is not the whole completion: %v", b, err)
		}
	})

	h.waitIdle()
	if n := h.histCount(telemetry.RequestDurationName, telemetry.AttrErrorType.String(ErrTypeEngineDisconnect)); n != 3 {
		t.Errorf("duration histogram has %d engine_disconnect requests, want 3 (all: %v)", n, h.errorTypes())
	}
	if et := h.errorTypes(); et[""] != 1 {
		t.Errorf("error types %v, want one success", et)
	}
}

// TestLargeBodyAbortsOnFailure proves that a non-streaming body over
// MaxResponseBufferBytes, relayed as it arrives, aborts the client
// connection when the engine cuts it (the client sees 200 and then an
// unexpected EOF, never a clean short body), while a good body of that
// size passes through whole with its Content-Length.
func TestLargeBodyAbortsOnFailure(t *testing.T) {
	raw := hijackEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"+
		strings.Repeat("z", 50000))
	good := `{"id":"g","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("w", 200<<10) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`
	goodEng := fakeEngine(t, []string{"good"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(good)))
		_, _ = io.WriteString(w, good)
	})
	cfg := testConfig(fleet.EngineConfig{Name: "raw", URL: raw, Models: []string{"m"}}, fleet.EngineConfig{Name: "good", URL: goodEng.URL})
	cfg.MaxResponseBufferBytes = 1024
	h := newHarness(t, cfg)

	resp := h.post("/v1/chat/completions", shapeChat)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != 100000 {
		t.Errorf("status %d, Content-Length %d; want the engine's 200 and 100000", resp.StatusCode, resp.ContentLength)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reading the cut body: err %v after %d bytes, want an unexpected EOF", err, len(b))
	}
	if len(b) >= 100000 {
		t.Errorf("read %d bytes of a body cut at 50000", len(b))
	}

	resp = h.post("/v1/chat/completions", `{"model":"good","messages":[{"role":"user","content":"hi"}]}`)
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || string(b) != good || resp.ContentLength != int64(len(good)) {
		t.Errorf("good body: status %d, err %v, %d bytes (want %d), Content-Length %d", resp.StatusCode, err, len(b), len(good), resp.ContentLength)
	}

	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeEngineDisconnect] != 1 || et[""] != 1 || len(et) != 2 {
		t.Errorf("error types %v, want one engine_disconnect and one success", et)
	}
	if n, first := h.serverLog.lines(); n != 0 {
		t.Errorf("net/http logged %d lines: %q", n, first)
	}
}

// TestBufferedBodyNotSentBeforeEnd proves that under the default response
// buffer cap a non-streaming body the engine sends in pieces reaches the
// client only once it is complete: nothing (not even the headers) arrives
// while the engine waits between its pieces, and the response the client
// gets was sent after the engine's last write, with its exact length.
func TestBufferedBodyNotSentBeforeEnd(t *testing.T) {
	const part1 = `{"id":"x","object":"chat.completion",`
	const part2 = `"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`
	wrote1 := make(chan struct{})
	release := make(chan struct{})
	var lastWritten atomic.Bool
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, part1)
		_ = rc.Flush()
		close(wrote1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		case <-time.After(5 * time.Second):
			t.Error("never released")
			return
		}
		_, _ = io.WriteString(w, part2)
		_ = rc.Flush()
		lastWritten.Store(true)
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))

	type result struct {
		resp *http.Response
		err  error
	}
	got := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(shapeChat))
		req.Header.Set("Content-Type", "application/json")
		resp, err := h.client.Do(req)
		got <- result{resp, err}
	}()
	select {
	case <-wrote1:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine never got the request")
	}
	// A bounded negative check: while the engine holds the rest back, the
	// client gets nothing.
	select {
	case r := <-got:
		if r.err == nil {
			r.resp.Body.Close()
		}
		close(release)
		t.Fatalf("the response started before the body was complete (err %v)", r.err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	var r result
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no response after the body ended")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !lastWritten.Load() {
		t.Error("the response headers arrived before the engine's last write")
	}
	b, err := io.ReadAll(r.resp.Body)
	r.resp.Body.Close()
	if err != nil || r.resp.StatusCode != 200 || string(b) != part1+part2 || r.resp.ContentLength != int64(len(part1+part2)) {
		t.Errorf("status %d, err %v, body %q, Content-Length %d; want the whole body with its length", r.resp.StatusCode, err, b, r.resp.ContentLength)
	}
	h.waitIdle()
}

// TestEngineErrorEventThenEOF: an engine that ends an Anthropic stream with
// its own error event and closes has ended the stream: the client gets that
// error event and no second one from the gateway, and the attempt is
// recorded as stream_error, not engine_disconnect.
func TestEngineErrorEventThenEOF(t *testing.T) {
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		s := newSSE(w)
		s.raw("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n")
		s.raw("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"engine overloaded\"}}\n\n")
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}}))
	st, _, b := h.do(http.MethodPost, "/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if st != 200 || strings.Count(string(b), "event: error") != 1 || !strings.Contains(string(b), "engine overloaded") {
		t.Errorf("got %d %q, want the engine's one error event", st, b)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeStreamError] != 1 {
		t.Errorf("error types %v, want one stream_error", et)
	}
}
