package gateway

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
)

// TestConnectFailureProbesThroughTraffic: with outlier detection off, a
// request whose connection to e1 is refused is retried on e2 and tells the
// fleet (fleet.Fleet.MarkFailed), whose probe takes e1 out of routing at
// once, not at the next round (health.interval, an hour here). With e1
// the model's last ready engine (e2 drained), the request gets e1's 502
// after its two attempts and e1 stays in. The fleet's own tests cover the
// probe's rules.
func TestConnectFailureProbesThroughTraffic(t *testing.T) {
	chat := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	rig := func(t *testing.T) (*harness, func() int) {
		_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
		_, s2 := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
		cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
		cfg.Outlier.Enabled = false
		h := newHarness(t, cfg)
		var mu sync.Mutex
		attempts := 0 // e1's ended attempts
		h.gw.onRelease = func(name string, _ routing.Phase) {
			if name == "e1" {
				mu.Lock()
				attempts++
				mu.Unlock()
			}
		}
		if st := h.status("e1"); st.State != "ready" {
			t.Fatalf("e1 before it stops listening: %+v", st)
		}
		s1.Close()
		return h, func() int {
			mu.Lock()
			defer mu.Unlock()
			return attempts
		}
	}
	t.Run("out of routing", func(t *testing.T) {
		h, e1Attempts := rig(t)
		for i := 0; e1Attempts() == 0; i++ {
			if i > 20 {
				t.Fatal("no request tried e1")
			}
			resp := h.post("/v1/chat/completions", chat)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
				t.Fatalf("status %d from %q, want 200 from e2", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
			}
		}
		testutil.Eventually(t, 5*time.Second, func() bool { return h.status("e1").State == "unhealthy" }, "e1 unhealthy after its refused connection")
		before := e1Attempts()
		for range 6 {
			resp := h.post("/v1/chat/completions", chat)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
				t.Fatalf("status %d from %q, want 200 from e2", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
			}
		}
		if n := e1Attempts() - before; n != 0 {
			t.Errorf("e1 tried %d more times out of routing", n)
		}
		h.waitIdle()
	})
	t.Run("not the last ready engine", func(t *testing.T) {
		h, e1Attempts := rig(t)
		if _, ok := h.gw.fleet.SetDrained("e2", true); !ok {
			t.Fatal("no e2")
		}
		resp := h.post("/v1/chat/completions", chat)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || e1Attempts() != 2 {
			t.Errorf("status %d after %d attempts on e1, want 502 after 2", resp.StatusCode, e1Attempts())
		}
		if st := h.status("e1"); st.State != "ready" {
			t.Errorf("e1 %+v; want ready", st)
		}
		h.waitIdle()
	})
}
