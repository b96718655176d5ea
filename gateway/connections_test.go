package gateway

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// connGauge returns switchboard.engine.connections by "engine/state".
func (h *harness) connGauge() map[string]int64 {
	h.t.Helper()
	return h.counterBy(telemetry.ConnectionsName, telemetry.AttrEngine, telemetry.AttrConnState)
}

// TestEngineConnectionsGauge: with the lean engine client (the default),
// switchboard.engine.connections says how many connections each engine
// has, by state: after a request, its connection is idle in the pool;
// with server.engine_client net/http there are no counts to report.
func TestEngineConnectionsGauge(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	for _, client := range []string{EngineClientLean, EngineClientNetHTTP} {
		t.Run(client, func(t *testing.T) {
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
			cfg.EngineClient = client
			// The body as it came (not read as a stream): read to its end,
			// its connection goes back to the pool.
			cfg.Migration.Limit = 0
			h := newHarness(t, cfg)
			if status, _, body := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			h.waitIdle()
			got := h.connGauge()
			if client == EngineClientNetHTTP {
				if len(got) != 0 {
					t.Errorf("net/http: connections %v, want none reported", got)
				}
				return
			}
			// The probes and the request may have used two connections.
			if idle := got["e1/idle"]; idle < 1 || got["e1/active"] != 0 || got["e1/waiting"] != 0 {
				t.Errorf("connections %v, want e1 idle >= 1, active 0, waiting 0", got)
			}
		})
	}
}

// TestEngineConnectionsBound: with server.max_engine_connections 1, a
// second request to a busy engine waits for the one connection (counted as
// waiting), and goes through it once the first is answered.
func TestEngineConnectionsBound(t *testing.T) {
	started, release := make(chan struct{}, 2), make(chan struct{})
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`)
	})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}})
	cfg.MaxEngineConnections = 1
	cfg.Migration.Limit = 0
	h := newHarness(t, cfg)
	const body = `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	codes := make(chan int, 2)
	go func() { s, _, _ := h.do(http.MethodPost, "/v1/chat/completions", body); codes <- s }()
	<-started
	go func() { s, _, _ := h.do(http.MethodPost, "/v1/chat/completions", body); codes <- s }()
	testutil.Eventually(t, 5*time.Second, func() bool { return h.connGauge()["e1/waiting"] == 1 }, "the second request waits for the connection")
	if got := h.connGauge(); got["e1/active"] != 1 || got["e1/idle"] != 0 {
		t.Errorf("connections %v, want e1 active 1, idle 0, waiting 1", got)
	}
	select {
	case <-started:
		t.Fatal("the engine got the second request while the first held the only connection")
	default:
	}
	close(release)
	for range 2 {
		if s := <-codes; s != http.StatusOK {
			t.Errorf("status %d", s)
		}
	}
	h.waitIdle()
	if got := h.connGauge(); got["e1/active"] != 0 || got["e1/waiting"] != 0 || got["e1/idle"] != 1 {
		t.Errorf("connections %v after both, want e1 idle 1", got)
	}
}
