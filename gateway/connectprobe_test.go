package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
)

// healthCounter is the engine transport of the connect probe tests: it
// counts the GET /health requests per host and, while hold is set, keeps
// them waiting until it is closed.
type healthCounter struct {
	base *http.Transport
	mu   sync.Mutex
	n    map[string]int
	hold chan struct{}
}

func (c *healthCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == "/health" {
		c.mu.Lock()
		c.n[r.URL.Host]++
		hold := c.hold
		c.mu.Unlock()
		if hold != nil {
			<-hold
		}
	}
	return c.base.RoundTrip(r)
}

func (c *healthCounter) CloseIdleConnections() { c.base.CloseIdleConnections() }

func (c *healthCounter) probes(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[host]
}

// connectProbeRig is a gateway with outlier detection off in front of e1
// and e2, both probed once and found healthy; then e1 stops listening.
type connectProbeRig struct {
	*harness
	clk      *testutil.Clock
	hc       *healthCounter
	e1       *engine
	mu       sync.Mutex
	attempts int // e1's ended attempts
}

func newConnectProbeRig(t *testing.T, unhealthyAfter int) *connectProbeRig {
	t.Helper()
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
	cfg := testConfig(EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
	cfg.Outlier.Enabled = false
	cfg.Health.UnhealthyAfter = unhealthyAfter
	r := &connectProbeRig{clk: testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), hc: &healthCounter{base: NewTransport(time.Second), n: map[string]int{}}}
	// Not started: no probe round runs by itself (health.interval is an
	// hour anyway), so the pool's WaitGroup counts only the probes a
	// refused connection starts, and the test waits for them with it.
	r.harness = newHarnessWith(t, cfg, []Option{withClock(r.clk.Now), WithTransport(r.hc)}, withoutStart())
	r.gw.pool.ProbeNow(context.Background())
	r.e1 = r.gw.pool.byName("e1")
	r.gw.onRelease = func(name string, _ routing.Phase) {
		if name == "e1" {
			r.mu.Lock()
			r.attempts++
			r.mu.Unlock()
		}
	}
	if st := r.status("e1"); st.State != "ready" || r.probes() != 1 {
		t.Fatalf("e1 before it stops listening: %+v after %d probes", st, r.probes())
	}
	s1.Close()
	return r
}

func (r *connectProbeRig) probes() int { return r.hc.probes(r.e1.ep.URL().Host) }

func (r *connectProbeRig) e1Attempts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts
}

// refused sends requests until one has tried e1 (its connection refused,
// then retried on e2), and waits for the probe that started, if any.
func (r *connectProbeRig) refused() {
	r.t.Helper()
	for i, want := 0, r.e1Attempts()+1; r.e1Attempts() < want; i++ {
		if i > 20 {
			r.t.Fatal("no request tried e1")
		}
		resp := r.post("/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
			r.t.Fatalf("status %d from %q, want 200 from e2", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
		}
	}
	r.gw.pool.wg.Wait()
}

// outOfRouting checks that e1 is unhealthy and gets no more requests.
func (r *connectProbeRig) outOfRouting() {
	r.t.Helper()
	if st := r.status("e1"); st.State != "unhealthy" || st.Routable {
		r.t.Fatalf("e1 after its probe failed: %+v, want unhealthy", st)
	}
	before := r.e1Attempts()
	for range 6 {
		resp := r.post("/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "e2" {
			r.t.Fatalf("status %d from %q, want 200 from e2", resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
		}
	}
	if n := r.e1Attempts() - before; n != 0 {
		r.t.Errorf("e1 tried %d more times out of routing", n)
	}
}

// TestConnectFailureProbesAtOnce: with outlier detection off, a refused
// connection probes its engine at once, not at the next round
// (health.interval, an hour here); the probe's own rules give the verdict
// (unhealthy_after failures in a row), one probe at a time per engine and
// at most one per health.timeout, none for a model's last ready engine,
// none after Close.
func TestConnectFailureProbesAtOnce(t *testing.T) {
	t.Run("unhealthy_after 1", func(t *testing.T) {
		r := newConnectProbeRig(t, 1)
		r.refused()
		if n := r.probes(); n != 2 {
			t.Errorf("e1 probed %d times, want 2 (the first round, then at its refused connection)", n)
		}
		r.outOfRouting()
		r.waitIdle()
	})
	t.Run("unhealthy_after 2", func(t *testing.T) {
		r := newConnectProbeRig(t, 2)
		r.refused()
		if st := r.status("e1"); r.probes() != 2 || st.State != "ready" {
			t.Fatalf("after one refused connection: %d probes, %+v; want 2 probes and ready (1 failure of 2)", r.probes(), st)
		}
		r.refused() // within health.timeout of the last probe: none
		if st := r.status("e1"); r.probes() != 2 || st.State != "ready" {
			t.Fatalf("a second refused connection at once: %d probes, %+v; want still 2, ready", r.probes(), st)
		}
		r.clk.Advance(r.gw.pool.cfg.Timeout)
		r.refused()
		if n := r.probes(); n != 3 {
			t.Errorf("e1 probed %d times, want 3", n)
		}
		r.outOfRouting()
		r.waitIdle()
	})
	t.Run("one probe at a time", func(t *testing.T) {
		r := newConnectProbeRig(t, 1)
		hold := make(chan struct{})
		r.hc.mu.Lock()
		r.hc.hold = hold
		r.hc.mu.Unlock()
		// The first refused connection's probe waits in the transport;
		// a second one, past health.timeout, finds it still running.
		for range 2 {
			for i, want := 0, r.e1Attempts()+1; r.e1Attempts() < want; i++ {
				if i > 20 {
					t.Fatal("no request tried e1")
				}
				resp := r.post("/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			r.clk.Advance(r.gw.pool.cfg.Timeout)
		}
		close(hold)
		r.gw.pool.wg.Wait()
		if n := r.probes(); n != 2 {
			t.Errorf("e1 probed %d times, want 2 (the round, then one for both refused connections)", n)
		}
		r.outOfRouting()
		r.waitIdle()
	})
	t.Run("not the last ready engine", func(t *testing.T) {
		// e2 drained: e1 is the model's last ready engine. Taking it out
		// early would only turn its 502 into a 503 (the retry asks it
		// again), so it waits for the rounds, as it is never ejected.
		r := newConnectProbeRig(t, 1)
		if _, ok := r.gw.pool.setDrained("e2", true); !ok {
			t.Fatal("no e2")
		}
		resp := r.post("/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r.gw.pool.wg.Wait()
		if resp.StatusCode != http.StatusBadGateway || r.e1Attempts() != 2 {
			t.Errorf("status %d after %d attempts on e1, want 502 after 2", resp.StatusCode, r.e1Attempts())
		}
		if st := r.status("e1"); r.probes() != 1 || st.State != "ready" {
			t.Errorf("%d probes, e1 %+v; want no probe and ready", r.probes(), st)
		}
		r.waitIdle()
	})
	t.Run("none after Close", func(t *testing.T) {
		r := newConnectProbeRig(t, 1)
		r.gw.pool.Close()
		r.gw.pool.markFailed(r.e1, errors.New("dial tcp: connection refused"))
		r.gw.pool.wg.Wait()
		if n := r.probes(); n != 1 {
			t.Errorf("e1 probed %d times, want 1: no probe after Close", n)
		}
		if st := r.status("e1"); st.State != "ready" {
			t.Errorf("e1 after Close: %+v", st)
		}
	})
}
