package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// TestAccessLogAbortedRequest: a request whose response is cut after it
// started (a relayed body the engine drops; the gateway aborts the client
// connection) still gets its access-log line, with the error type.
func TestAccessLogAbortedRequest(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	var buf testutil.LockedBuffer
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.MaxResponseBufferBytes = 64 // relay every body, so a cut one aborts the client
	cfg.Migration.Limit = 0         // and do not observe it (continuation would)
	h := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	resp := h.post("/v1/chat/completions", `{"model":"m","max_tokens":30,"messages":[{"role":"user","content":"hi"}]}`,
		enginesim.FaultHeader, "close-after=3", "X-Request-Id", "r-cut")
	_, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err == nil {
		t.Fatalf("status %d, read error %v: want a 200 whose body is cut", resp.StatusCode, err)
	}
	h.waitIdle()
	line := accessLine(&buf, "r-cut")
	if line == nil || line["error.type"] != ErrTypeEngineDisconnect || line["status"] != 200.0 {
		t.Errorf("access-log line %v, want one with status 200 and error.type %s\n%s", line, ErrTypeEngineDisconnect, buf.String())
	}
}

// TestAccessLogUnmatchedPath: a request no route matches is logged with
// its path, so an operator sees what was asked for.
func TestAccessLogUnmatchedPath(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	var buf testutil.LockedBuffer
	h := newHarnessWith(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}),
		[]Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	for _, c := range []struct {
		method, path string
		status       int
	}{{http.MethodGet, "/v1/nope", 404}, {http.MethodGet, "/v1/chat/completions", 405}} {
		req, _ := http.NewRequest(c.method, h.srv.URL+c.path, nil)
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		found := false
		for _, l := range strings.Split(buf.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m["path"] == c.path && m["status"] == float64(c.status) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s %s: no access-log line with its path and status %d:\n%s", c.method, c.path, c.status, buf.String())
		}
	}
}

// TestAccessLog: one structured line per request through slog, with the
// request id, route, model, engines tried, status, error.type, time to
// first token, duration and token usage; probes are not logged; the log
// can be switched off.
func TestAccessLog(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	dead := testutil.RefusedURL
	var buf testutil.LockedBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "dead", URL: dead, Models: []string{"gone"}})
	cfg.MaxAttempts = 1
	// Not started: no probe marks the dead engine down before the request.
	h := newHarnessWith(t, cfg, []Option{WithLogger(log)}, withoutStart())
	for _, c := range []struct{ path, body, id string }{
		{"/v1/chat/completions", chatStream, "r-stream"},
		{"/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, "r-404"},
		{"/v1/chat/completions", `{"model":"gone","messages":[{"role":"user","content":"hi"}]}`, "r-502"},
	} {
		resp := h.post(c.path, c.body, "X-Request-Id", c.id)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, p := range []string{"/health", "/ready"} {
		resp, err := h.client.Get(h.srv.URL + p)
		if err == nil {
			resp.Body.Close()
		}
	}
	h.waitIdle()
	lines := map[string]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	n := 0
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil || m["msg"] != "request" {
			continue
		}
		n++
		lines[m["request_id"].(string)] = m
	}
	if n != 3 {
		t.Fatalf("%d access-log lines, want 3 (probes are not logged):\n%s", n, buf.String())
	}
	s := lines["r-stream"]
	if s["route"] != "/v1/chat/completions" || s["method"] != "POST" || s["model"] != "m" || s["engines"] != "e1" ||
		s["status"] != 200.0 || s["input_tokens"] != 3.0 || s["output_tokens"] != 4.0 || s["ttft"] == nil || s["duration"] == nil || s["error.type"] != nil {
		t.Errorf("stream line: %v", s)
	}
	if l := lines["r-404"]; l["status"] != 404.0 || l["error.type"] != "model_not_found" || l["engines"] != nil {
		t.Errorf("404 line: %v", l)
	}
	if l := lines["r-502"]; l["status"] != 502.0 || l["error.type"] != ErrTypeConnect || l["engines"] != "dead" || l["attempts"] != 1.0 {
		t.Errorf("502 line: %v", l)
	}

	// Off: no lines.
	var quiet testutil.LockedBuffer
	cfg.AccessLog = false
	h2 := newHarnessWith(t, cfg, []Option{WithLogger(slog.New(slog.NewJSONHandler(&quiet, nil)))})
	resp := h2.post("/v1/chat/completions", chatStream)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	h2.waitIdle()
	if strings.Contains(quiet.String(), `"msg":"request"`) {
		t.Errorf("access log off, but logged:\n%s", quiet.String())
	}
}

// TestAccessLogStickyMissNoErrorType: a sticky lookup whose last engine
// answers 404 in a body that is not an OpenAI error (vLLM's older
// {"object":"error"}) is rewritten in the route's envelope, and the access
// log still names no error.type: no engine misbehaved (as for a 404 that
// passes unchanged). The leg's own answer keeps the error type its attempt
// recorded.
func TestAccessLogStickyMissNoErrorType(t *testing.T) {
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"object":"error","message":"no such response","type":"NotFoundError","code":404}`)
	})
	var buf testutil.LockedBuffer
	h := newHarnessWith(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}}),
		[]Option{WithLogger(slog.New(slog.NewJSONHandler(&buf, nil)))})
	st, _, b := h.do(http.MethodGet, "/v1/responses/resp_gone", "")
	if st != 404 || !strings.Contains(string(b), "no such response") {
		t.Fatalf("%d %s, want the engine's 404 in the OpenAI envelope", st, b)
	}
	h.waitIdle()
	for _, l := range strings.Split(buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "request" && m["route"] == "/v1/responses/{id}" {
			if et, ok := m["error.type"]; ok {
				t.Errorf("access log error.type %v for a sticky miss, want none", et)
			}
			return
		}
	}
	t.Fatalf("no access-log line for the lookup:\n%s", buf.String())
}

// accessLine waits up to 2 s for the JSON access-log line of the request
// with id in buf, and returns it (nil when none came).
func accessLine(buf fmt.Stringer, id string) map[string]any {
	var line map[string]any
	testutil.Poll(2*time.Second, func() bool {
		sc := bufio.NewScanner(strings.NewReader(buf.String()))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "request" && m["request_id"] == id {
				line = m
			}
		}
		return line != nil
	})
	return line
}
