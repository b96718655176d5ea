package fleet

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestLive: an engine is live while it is in the fleet, and after
// Remove (or a reload that drops it) while a request holds a slot on it;
// an engine never added is not.
func TestLive(t *testing.T) {
	// Nothing listens: the fleet is never started, and the reload's
	// probe of a new incarnation fails at once.
	cfg := testConfig(EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
	p, err := New(cfg, mustMetrics(t), WithLogger(discard))
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
	ep := p.Engine("e2").ep
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
	s.Acquire(p.Engine("e2").ep)
	if _, removed, _, err := p.apply(nil, nil, nil); err != nil || len(removed) != 1 {
		t.Fatalf("apply(no engines): removed %v, %v", removed, err)
	}
	check("e2 dropped by a reload, one slot held", map[string]bool{"e2": true})
	s.Release()
	check("e2 dropped by a reload, slot released", map[string]bool{"e2": false, "e1": false})
}

// TestLiveServer: a server is live while an engine in the fleet has
// its host and port (the scheme's default when the URL names none), and
// after the engine leaves while a request holds a slot on it.
func TestLiveServer(t *testing.T) {
	cfg := testConfig(
		EngineConfig{Name: "http", URL: "http://10.0.0.1", Models: []string{"m"}},
		EngineConfig{Name: "https", URL: "https://10.0.0.2/v1", Models: []string{"m"}},
		EngineConfig{Name: "port", URL: "http://10.0.0.3:8000", Models: []string{"m"}},
		EngineConfig{Name: "tlsport", URL: "https://10.0.0.4:8443", Models: []string{"m"}},
		EngineConfig{Name: "v6", URL: "http://[fd00::1]:9000", Models: []string{"m"}},
		EngineConfig{Name: "creds", URL: "https://user:secret@Engine.Example", Models: []string{"m"}},
	)
	p, err := New(cfg, mustMetrics(t), WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	type srv struct {
		address string
		port    int
	}
	check := func(when string, want map[srv]bool) {
		t.Helper()
		for s, w := range want {
			if got := p.LiveServer(s.address, s.port); got != w {
				t.Errorf("%s: LiveServer(%q, %d) = %t, want %t", when, s.address, s.port, got, w)
			}
		}
	}
	check("configured", map[srv]bool{
		{"10.0.0.1", 80}: true, {"10.0.0.1", 443}: false, {"10.0.0.1", 0}: true,
		{"10.0.0.2", 443}: true, {"10.0.0.2", 80}: false,
		{"10.0.0.3", 8000}: true, {"10.0.0.3", 80}: false,
		{"10.0.0.4", 8443}: true, {"10.0.0.4", 443}: false,
		{"fd00::1", 9000}: true, {"[fd00::1]", 9000}: false,
		{"Engine.Example", 443}: true, {"engine.example", 443}: false, // as the URL spells it, as telemetry reports it
		{"10.0.0.9", 80}: false, {"", 0}: false, {"", 80}: false,
	})

	// Removed with nothing in flight: gone at once.
	if !p.Remove("http") {
		t.Fatal("Remove(http) = false")
	}
	check("http removed, drained", map[srv]bool{{"10.0.0.1", 80}: false, {"10.0.0.1", 0}: false, {"10.0.0.2", 443}: true})

	// Removed while a request holds a slot: live until it releases it.
	var s routing.Slot
	s.Acquire(p.Engine("port").ep)
	if !p.Remove("port") {
		t.Fatal("Remove(port) = false")
	}
	check("port removed, one slot held", map[srv]bool{{"10.0.0.3", 8000}: true, {"10.0.0.3", 0}: true, {"10.0.0.3", 80}: false})
	s.Release()
	check("port removed, slot released", map[srv]bool{{"10.0.0.3", 8000}: false, {"10.0.0.3", 0}: false})

	// A reload moves an engine to a new address (a pod replaced) while a
	// request holds a slot on the old incarnation: both are live until
	// the old one drains, then only the new one. (Nothing listens there:
	// the new incarnation's probe fails at once.)
	s.Acquire(p.Engine("https").ep)
	var next []EngineConfig
	for _, e := range p.engines {
		ec := e.cfg
		if ec.Name == "https" {
			ec.URL = "https://127.0.0.1:1"
		}
		next = append(next, ec)
	}
	if _, _, changed, err := p.apply(next, nil, nil); err != nil || len(changed) != 1 {
		t.Fatalf("apply(https moved): changed %v, %v", changed, err)
	}
	check("https moved, old incarnation holding a slot", map[srv]bool{{"10.0.0.2", 443}: true, {"127.0.0.1", 1}: true})
	s.Release()
	check("https moved, old incarnation drained", map[srv]bool{{"10.0.0.2", 443}: false, {"127.0.0.1", 1}: true, {"127.0.0.1", 443}: false})
	if !p.Live("https") {
		t.Error("Live(https) = false after the move")
	}
}

// TestLiveServerMatchesTelemetry: every engine's GenAI data points
// carry a server.address and server.port LiveServer reports live (it
// computes them as newEngine does for telemetry.WithServer), and no
// longer once the engine is gone.
func TestLiveServerMatchesTelemetry(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := telemetry.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	urls := []string{"http://10.0.0.1", "https://10.0.0.2", "http://10.0.0.3:8000", "https://10.0.0.4:8443", "http://[fd00::1]:9000", "https://u:p@engine.example/v1", "http://10.0.0.5:0080"}
	var engines []EngineConfig
	for i, u := range urls {
		engines = append(engines, EngineConfig{Name: fmt.Sprintf("e%d", i), URL: u, Models: []string{"m"}})
	}
	p, err := New(testConfig(engines...), m, WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, e := range p.engines {
		m.RecordFirstToken(context.Background(), e.tel.Attrs("m", "chat", "chat"), 0.1)
	}
	rm := &metricdata.ResourceMetrics{}
	if err := reader.Collect(context.Background(), rm); err != nil {
		t.Fatal(err)
	}
	type srv struct {
		address string
		port    int
	}
	var servers []srv
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != telemetry.GenAIClientTimeToFirstChunkName {
				continue
			}
			for _, pt := range mt.Data.(metricdata.Histogram[float64]).DataPoints {
				a, _ := pt.Attributes.Value(telemetry.AttrServerAddress)
				port, ok := pt.Attributes.Value(telemetry.AttrServerPort)
				if !ok || port.Type() != attribute.INT64 {
					t.Errorf("%s point without an int server.port: %v", mt.Name, pt.Attributes.ToSlice())
				}
				servers = append(servers, srv{a.AsString(), int(port.AsInt64())})
			}
		}
	}
	if len(servers) != len(urls) {
		t.Fatalf("%d GenAI points (%v), want %d", len(servers), servers, len(urls))
	}
	for _, s := range servers {
		if !p.LiveServer(s.address, s.port) {
			t.Errorf("LiveServer(%q, %d) = false for an engine in the pool", s.address, s.port)
		}
	}
	for _, ec := range engines {
		p.Remove(ec.Name)
	}
	for _, s := range servers {
		if p.LiveServer(s.address, s.port) {
			t.Errorf("LiveServer(%q, %d) = true with every engine removed", s.address, s.port)
		}
	}
}

// TestLiveServerDoesNotAllocate: a collection asks once per server.
func TestLiveServerDoesNotAllocate(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	cfg := testConfig(
		EngineConfig{Name: "a", URL: "https://10.0.0.1", Models: []string{"m"}},
		EngineConfig{Name: "b", URL: "http://[fd00::1]:9000", Models: []string{"m"}},
	)
	p, err := New(cfg, mustMetrics(t), WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if a := testing.AllocsPerRun(1000, func() {
		p.LiveServer("fd00::1", 9000)
		p.LiveServer("10.0.0.1", 443)
		p.LiveServer("10.0.0.9", 80)
	}); a != 0 {
		t.Errorf("LiveServer allocates %v per call", a)
	}
}
