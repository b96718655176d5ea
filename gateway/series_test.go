package gateway

import (
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
)

// TestPoolLive: an engine is live while it is in the pool, and after
// Remove (or a reload that drops it) while a request holds a slot on it;
// an engine never added is not.
func TestPoolLive(t *testing.T) {
	// Nothing listens: the pool is never started, and the reload's
	// probe of a new incarnation fails at once.
	cfg := testConfig(EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
	p, err := newPool(cfg, mustMetrics(t), http.DefaultTransport, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	check := func(when string, want map[string]bool) {
		t.Helper()
		for name, w := range want {
			if got := p.Live(name); got != w {
				t.Errorf("%s: Live(%q) = %t, want %t", when, name, got, w)
			}
		}
	}
	check("configured", map[string]bool{"e1": true, "e2": false, "": false})

	e2 := EngineConfig{Name: "e2", URL: "http://127.0.0.1:2", Models: []string{"m"}}
	if err := p.Add(e2); err != nil {
		t.Fatal(err)
	}
	check("after Add", map[string]bool{"e1": true, "e2": true})

	// Removed with nothing in flight: gone at once.
	if !p.Remove("e1") {
		t.Fatal("Remove(e1) = false")
	}
	check("e1 removed, drained", map[string]bool{"e1": false, "e2": true})

	// Removed while a request holds a slot: live until it releases it.
	ep := p.byName("e2").ep
	var s routing.Slot
	s.Acquire(ep)
	if !p.Remove("e2") {
		t.Fatal("Remove(e2) = false")
	}
	check("e2 removed, one slot held", map[string]bool{"e2": true})
	s.Release()
	check("e2 removed, slot released", map[string]bool{"e2": false})

	// Added again, then dropped by a reload while a request holds a
	// slot: live until it releases it.
	if err := p.Add(e2); err != nil {
		t.Fatal(err)
	}
	s.Acquire(p.byName("e2").ep)
	if _, removed, _, err := p.apply(nil, nil); err != nil || len(removed) != 1 {
		t.Fatalf("apply(no engines): removed %v, %v", removed, err)
	}
	check("e2 dropped by a reload, one slot held", map[string]bool{"e2": true})
	s.Release()
	check("e2 dropped by a reload, slot released", map[string]bool{"e2": false, "e1": false})
}
