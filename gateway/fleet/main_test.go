package fleet

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testConfig returns a fleet config for tests: the defaults, with the
// given engines, probes only when a test asks (health.interval is an
// hour), a 1 s probe timeout, one failed probe to turn unhealthy, and no
// stats scraping (tests turn it on or call ScrapeNow).
func testConfig(engines ...EngineConfig) Config {
	cfg := Config{Engines: engines, Health: DefaultHealthConfig(), Stats: DefaultEngineStatsConfig(), Outlier: routing.DefaultOutlierConfig()}
	cfg.Health.Interval = time.Hour
	cfg.Health.Timeout = time.Second
	cfg.Health.UnhealthyAfter = 1
	cfg.Stats.Enabled = false
	return cfg
}

// discard is a logger that logs nothing.
var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestFleet builds a fleet of cfg with no-op metrics, logging nothing
// unless opts say otherwise, closed when the test ends. It is not
// started.
func newTestFleet(t testing.TB, cfg Config, opts ...Option) *Fleet {
	t.Helper()
	f, err := New(cfg, mustMetrics(t), append([]Option{WithLogger(discard)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// mustMetrics returns no-op metrics.
func mustMetrics(t testing.TB) *telemetry.Metrics {
	t.Helper()
	m, err := telemetry.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sim starts a simulated engine on a loopback listener, closed when the
// test ends.
func sim(t testing.TB, cfg enginesim.Config) (*enginesim.Engine, *httptest.Server) {
	t.Helper()
	return enginetest.Start(t, cfg)
}

// statusOf returns the status of the engine in the fleet called name.
func statusOf(t testing.TB, f *Fleet, name string) EngineStatus {
	t.Helper()
	for _, s := range f.Status() {
		if s.Name == name && !s.Retired {
			return s
		}
	}
	t.Fatalf("no engine %q in %v", name, f.Status())
	return EngineStatus{}
}

// routed returns the names of the engines the current snapshot routes
// model to, in order.
func routed(f *Fleet, model string) []string {
	rt, err := f.Lookup(model)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range rt.Engines() {
		out = append(out, e.Name())
	}
	return out
}

// handlerTransport serves requests with a handler in memory, on the
// caller's goroutine: no sockets, so it works inside a synctest bubble.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return rec.Result(), nil
}
