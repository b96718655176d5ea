// Package enginetest starts simulated vLLM engines (internal/enginesim)
// and fake engines for tests, on loopback listeners that are closed when
// the test ends. It is the one copy of that helper for every package's
// tests except enginesim's own (which this package imports).
package enginetest

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// Start builds a simulated engine from cfg, as given (no defaults added),
// and serves it. The engine and its server are returned; the server's
// client connections are closed, then the server, when the test ends.
func Start(t testing.TB, cfg enginesim.Config) (*enginesim.Engine, *httptest.Server) {
	t.Helper()
	e, err := enginesim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e, Serve(t, e.Handler())
}

// Serve serves h on a loopback listener closed when the test ends (its
// client connections first, so a held stream does not block the close).
func Serve(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// Fast returns cfg with a 2 ms time to first token and a 1 ms inter-token
// latency where it sets none, so tests stream quickly but still in steps.
func Fast(cfg enginesim.Config) enginesim.Config {
	if cfg.TTFT == 0 {
		cfg.TTFT = 2 * time.Millisecond
	}
	if cfg.ITL == 0 {
		cfg.ITL = time.Millisecond
	}
	return cfg
}
