package fleet

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
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

// connectProbeRig is a fleet with outlier detection off of e1 and e2, both
// probed once and found healthy; then e1 stops listening.
type connectProbeRig struct {
	t   *testing.T
	f   *Fleet
	clk *testutil.Clock
	hc  *healthCounter
	e1  *Engine
}

func newConnectProbeRig(t *testing.T, unhealthyAfter int) *connectProbeRig {
	t.Helper()
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
	_, s2 := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: 2})
	cfg := testConfig(EngineConfig{Name: "e1", URL: s1.URL, Models: []string{"m"}}, EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"m"}})
	cfg.Outlier.Enabled = false
	cfg.Health.UnhealthyAfter = unhealthyAfter
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	r := &connectProbeRig{t: t, clk: testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), hc: &healthCounter{base: base, n: map[string]int{}}}
	// Not started: no probe round runs by itself (health.interval is an
	// hour anyway), so the fleet's WaitGroup counts only the probes a
	// refused connection starts, and the test waits for them with it.
	r.f = newTestFleet(t, cfg, WithClock(r.clk.Now), WithTransport(r.hc))
	r.f.ProbeNow(context.Background())
	r.e1 = r.f.Engine("e1")
	if st := r.status("e1"); st.State != "ready" || r.probes() != 1 {
		t.Fatalf("e1 before it stops listening: %+v after %d probes", st, r.probes())
	}
	s1.Close()
	return r
}

func (r *connectProbeRig) status(name string) EngineStatus { return statusOf(r.t, r.f, name) }

func (r *connectProbeRig) probes() int { return r.hc.probes(r.e1.ep.URL().Host) }

// refused reports a refused connection to e1, as the request path does
// (and retries the request on e2), and waits for the probe that started,
// if any.
func (r *connectProbeRig) refused() {
	r.f.MarkFailed(r.e1, errors.New("dial tcp: connection refused"))
	r.f.wg.Wait()
}

// outOfRouting checks that e1 is unhealthy and gets no more requests.
func (r *connectProbeRig) outOfRouting() {
	r.t.Helper()
	if st := r.status("e1"); st.State != "unhealthy" || st.Routable {
		r.t.Fatalf("e1 after its probe failed: %+v, want unhealthy", st)
	}
	if got := routed(r.f, "m"); !slices.Equal(got, []string{"e2"}) {
		r.t.Errorf("m routed to %v out of routing, want e2 alone", got)
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
		r.clk.Advance(r.f.health.Timeout)
		r.refused()
		if n := r.probes(); n != 3 {
			t.Errorf("e1 probed %d times, want 3", n)
		}
		r.outOfRouting()
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
			r.f.MarkFailed(r.e1, errors.New("dial tcp: connection refused"))
			r.clk.Advance(r.f.health.Timeout)
		}
		close(hold)
		r.f.wg.Wait()
		if n := r.probes(); n != 2 {
			t.Errorf("e1 probed %d times, want 2 (the round, then one for both refused connections)", n)
		}
		r.outOfRouting()
	})
	t.Run("not the last ready engine", func(t *testing.T) {
		// e2 drained: e1 is the model's last ready engine. Taking it out
		// early would only turn its 502 into a 503 (the retry asks it
		// again), so it waits for the rounds, as it is never ejected.
		r := newConnectProbeRig(t, 1)
		if _, ok := r.f.SetDrained("e2", true); !ok {
			t.Fatal("no e2")
		}
		r.refused()
		r.refused() // the retry on the same engine, refused again
		if st := r.status("e1"); r.probes() != 1 || st.State != "ready" {
			t.Errorf("%d probes, e1 %+v; want no probe and ready", r.probes(), st)
		}
	})
	t.Run("none after Close", func(t *testing.T) {
		r := newConnectProbeRig(t, 1)
		r.f.Close()
		r.f.MarkFailed(r.e1, errors.New("dial tcp: connection refused"))
		r.f.wg.Wait()
		if n := r.probes(); n != 1 {
			t.Errorf("e1 probed %d times, want 1: no probe after Close", n)
		}
		if st := r.status("e1"); st.State != "ready" {
			t.Errorf("e1 after Close: %+v", st)
		}
	})
}
