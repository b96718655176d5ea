package gateway

import (
	"net/http"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// connGauge returns switchboard.engine.connections by "engine/state".
func (h *harness) connGauge() map[string]int64 {
	h.t.Helper()
	out := map[string]int64{}
	m, ok := findMetric(h.collect(), telemetry.ConnectionsName)
	if !ok {
		return out
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		e, _ := dp.Attributes.Value(telemetry.AttrEngine)
		s, _ := dp.Attributes.Value(telemetry.AttrConnState)
		out[e.AsString()+"/"+s.AsString()] = dp.Value
	}
	return out
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
