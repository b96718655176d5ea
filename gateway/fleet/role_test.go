package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func TestParseRole(t *testing.T) {
	tests := []struct {
		in      string
		want    Role
		wantErr bool
	}{
		{"", RoleBoth, false},
		{"both", RoleBoth, false},
		{"prefill-decode", RoleBoth, false},
		{"prefill", RolePrefill, false},
		{"decode", RoleDecode, false},
		{"Prefill", RoleBoth, true},
		{" decode", RoleBoth, true},
		{"encode", RoleBoth, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseRole(tt.in)
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Fatalf("ParseRole(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
			}
			if err == nil {
				return
			}
			if !errors.Is(err, ErrUnknownRole) {
				t.Errorf("error %v does not wrap ErrUnknownRole", err)
			}
			for _, sub := range []string{`"` + tt.in + `"`, "prefill", "decode", "both", "prefill-decode"} {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("error %q does not name %s", err, sub)
				}
			}
		})
	}
}

func TestRoleString(t *testing.T) {
	for r, want := range map[Role]string{RoleBoth: "both", RolePrefill: "prefill", RoleDecode: "decode", Role(7): "Role(7)"} {
		if got := r.String(); got != want {
			t.Errorf("Role(%d).String() = %q, want %q", r, got, want)
		}
	}
	// Every name String gives parses back to its role.
	for _, r := range []Role{RoleBoth, RolePrefill, RoleDecode} {
		if got, err := ParseRole(r.String()); got != r || err != nil {
			t.Errorf("ParseRole(%q) = %v, %v", r.String(), got, err)
		}
	}
}

func TestEngineConfigValidateRole(t *testing.T) {
	tests := []struct {
		role, group string
		want        []string // substrings of the error; none: valid
	}{
		{role: ""},
		{role: "prefill", group: "rack-1"},
		{role: "decode"},
		{role: "prefill-decode"},
		{role: "both"},
		{role: "prefil", want: []string{`engine "e"`, "role", `"prefil"`, "prefill, decode, both or prefill-decode"}},
		{role: "decode", group: " rack-1", want: []string{`engine "e"`, `group " rack-1"`, "spaces"}},
	}
	for _, tt := range tests {
		t.Run(tt.role+"/"+tt.group, func(t *testing.T) {
			err := EngineConfig{Name: "e", URL: "http://10.0.0.1:8000", Role: tt.role, Group: tt.group}.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want an ErrInvalidConfig", err)
			}
			for _, sub := range tt.want {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("error %q does not contain %q", err, sub)
				}
			}
		})
	}
}

// names returns the engine names of eps, looked up through rt.Engine.
func names(t *testing.T, rt *Route, eps []*routing.Endpoint) []string {
	t.Helper()
	out := []string{}
	for _, ep := range eps {
		e := rt.Engine(ep)
		if e == nil {
			t.Fatalf("Engine(%s) = nil: not an endpoint of the route", ep.Name())
		}
		out = append(out, e.Name())
	}
	return out
}

// sameSlice reports whether a and b are the same slice (not a copy).
func sameSlice(a, b []*routing.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// TestRouteRoles: Decode, Prefill and Disaggregable of a model's route and
// of All, for each mix of roles; Decode and Prefill are Endpoints itself
// when they hold all of it.
func TestRouteRoles(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	tests := []struct {
		name          string
		roles         []string // of engines e0, e1, ...
		unhealthy     []string // engines taken out of routing
		decode        []string
		prefill       []string
		disaggregable bool
	}{
		{name: "unset", roles: []string{"", ""}, decode: []string{"e0", "e1"}, prefill: []string{"e0", "e1"}},
		{name: "both only", roles: []string{"both", "prefill-decode"}, decode: []string{"e0", "e1"}, prefill: []string{"e0", "e1"}},
		{name: "prefill and decode", roles: []string{"prefill", "decode", "prefill", "decode"},
			decode: []string{"e1", "e3"}, prefill: []string{"e0", "e2"}, disaggregable: true},
		{name: "mixed", roles: []string{"decode", "both", "prefill"},
			decode: []string{"e0", "e1"}, prefill: []string{"e1", "e2"}, disaggregable: true},
		{name: "prefill and both", roles: []string{"prefill", "both"}, decode: []string{"e1"}, prefill: []string{"e0", "e1"}},
		{name: "decode and both", roles: []string{"decode", "both"}, decode: []string{"e0", "e1"}, prefill: []string{"e1"}},
		{name: "decode only", roles: []string{"decode", "decode"}, decode: []string{"e0", "e1"}, prefill: []string{}},
		// Never strand a model: prefill engines alone take whole
		// generations.
		{name: "prefill only", roles: []string{"prefill", "prefill"}, decode: []string{"e0", "e1"}, prefill: []string{"e0", "e1"}},
		{name: "decode engine unhealthy", roles: []string{"prefill", "decode"}, unhealthy: []string{"e1"},
			decode: []string{"e0"}, prefill: []string{"e0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ecs []EngineConfig
			for i, r := range tt.roles {
				ecs = append(ecs, EngineConfig{Name: "e" + string(rune('0'+i)), URL: srv.URL, Models: []string{"m"}, Role: r})
			}
			f := newTestFleet(t, testConfig(ecs...))
			f.Start()
			for _, n := range tt.unhealthy {
				f.Engine(n).Endpoint().SetHealthy(false)
			}
			f.rebuild()
			s := f.Snapshot()
			rt, err := s.Lookup("m")
			if err != nil {
				t.Fatal(err)
			}
			for label, r := range map[string]*Route{"route m": rt, "All": s.All()} {
				if got := names(t, r, r.Decode()); !slices.Equal(got, tt.decode) {
					t.Errorf("%s: Decode %v, want %v", label, got, tt.decode)
				}
				if got := names(t, r, r.Prefill()); !slices.Equal(got, tt.prefill) {
					t.Errorf("%s: Prefill %v, want %v", label, got, tt.prefill)
				}
				if got := r.Disaggregable(); got != tt.disaggregable {
					t.Errorf("%s: Disaggregable %v, want %v", label, got, tt.disaggregable)
				}
				if len(tt.decode) == len(r.Endpoints()) && !sameSlice(r.Decode(), r.Endpoints()) {
					t.Errorf("%s: Decode is a copy of Endpoints, want the same slice", label)
				}
				if len(tt.prefill) == len(r.Endpoints()) && !sameSlice(r.Prefill(), r.Endpoints()) {
					t.Errorf("%s: Prefill is a copy of Endpoints, want the same slice", label)
				}
				if n := testing.AllocsPerRun(100, func() { _, _, _ = r.Decode(), r.Prefill(), r.Disaggregable() }); n != 0 {
					t.Errorf("%s: %v allocations per call, want 0", label, n)
				}
			}
		})
	}
}

// TestRoleReload: a reload that changes an engine's role or group makes a
// new incarnation with them (the old one drains), shown on
// /admin/engines and in the routing snapshot; one that only respells its
// role ("" and "both") changes nothing.
func TestRoleReload(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	ec := func(name, role, group string) EngineConfig {
		return EngineConfig{Name: name, URL: srv.URL, Models: []string{"m"}, Role: role, Group: group}
	}
	f := newTestFleet(t, testConfig(ec("p", "", ""), ec("d", "", "")))
	f.Start()
	if rt, _ := f.Lookup("m"); rt.Disaggregable() {
		t.Fatal("Disaggregable with engines of role both")
	}
	oldP := f.Engine("p")

	steps := []struct {
		name          string
		p, d          EngineConfig
		changed       []string
		pRole, dRole  Role
		pGroup        string
		disaggregable bool
		decode        []string
		newP          bool // p is a new incarnation
	}{
		{name: "respelled", p: ec("p", "both", ""), d: ec("d", "prefill-decode", ""), pRole: RoleBoth, dRole: RoleBoth,
			decode: []string{"p", "d"}},
		{name: "roles set", p: ec("p", "prefill", "g1"), d: ec("d", "decode", ""), changed: []string{"p", "d"},
			pRole: RolePrefill, dRole: RoleDecode, pGroup: "g1", disaggregable: true, decode: []string{"d"}, newP: true},
		{name: "group changed", p: ec("p", "prefill", "g2"), d: ec("d", "decode", ""), changed: []string{"p"},
			pRole: RolePrefill, dRole: RoleDecode, pGroup: "g2", disaggregable: true, decode: []string{"d"}, newP: true},
		{name: "max_in_flight in place", p: func() EngineConfig { c := ec("p", "prefill", "g2"); c.MaxInFlight = 3; return c }(),
			d: ec("d", "decode", ""), changed: []string{"p"}, pRole: RolePrefill, dRole: RoleDecode, pGroup: "g2",
			disaggregable: true, decode: []string{"d"}},
	}
	for _, st := range steps {
		ch, err := f.SetConfigured([]EngineConfig{st.p, st.d}, nil)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if !slices.Equal(ch.Changed, st.changed) || len(ch.Added)+len(ch.Removed) > 0 {
			t.Errorf("%s: changes %+v, want changed %v only", st.name, ch, st.changed)
		}
		p, d := f.Engine("p"), f.Engine("d")
		if p.Role() != st.pRole || d.Role() != st.dRole || p.Group() != st.pGroup || d.Group() != "" {
			t.Errorf("%s: p %v/%q, d %v/%q; want p %v/%q, d %v", st.name, p.Role(), p.Group(), d.Role(), d.Group(), st.pRole, st.pGroup, st.dRole)
		}
		if (p != oldP) != st.newP {
			t.Errorf("%s: p a new incarnation: %v, want %v", st.name, p != oldP, st.newP)
		}
		oldP = p
		rt, err := f.Lookup("m")
		if err != nil {
			t.Fatal(err)
		}
		if rt.Disaggregable() != st.disaggregable {
			t.Errorf("%s: Disaggregable %v", st.name, rt.Disaggregable())
		}
		if got := names(t, rt, rt.Decode()); !slices.Equal(got, st.decode) {
			t.Errorf("%s: Decode %v, want %v", st.name, got, st.decode)
		}
		if s := statusOf(t, f, "p"); s.Role != st.pRole.String() || s.Group != st.pGroup {
			t.Errorf("%s: status of p: role %q group %q", st.name, s.Role, s.Group)
		}
	}
}

// TestStatusRoleJSON: /admin/engines shows every engine's role, and its
// group only when it has one.
func TestStatusRoleJSON(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	f := newTestFleet(t, testConfig(
		EngineConfig{Name: "a", URL: srv.URL, Models: []string{"m"}},
		EngineConfig{Name: "b", URL: srv.URL, Models: []string{"m"}, Role: "prefill", Group: "rack-1"},
	))
	f.Start()
	want := map[string]map[string]any{
		"a": {"role": "both"},
		"b": {"role": "prefill", "group": "rack-1"},
	}
	for _, s := range f.Status() {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		w := want[s.Name]
		if m["role"] != w["role"] {
			t.Errorf("%s: role %v, want %v", s.Name, m["role"], w["role"])
		}
		if g, ok := m["group"]; ok != (w["group"] != nil) || (ok && g != w["group"]) {
			t.Errorf("%s: group %v (present %v), want %v", s.Name, g, ok, w["group"])
		}
	}
}

// TestRoleTelemetry: the role is on the engine span attributes and on
// switchboard.engine.state, follows a reload that changes it (a new
// incarnation, reported once under the engine's name), and stays off the
// per-request histograms.
func TestRoleTelemetry(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := telemetry.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	f, err := New(testConfig(EngineConfig{Name: "p", URL: srv.URL, Models: []string{"m"}, Role: "prefill"},
		EngineConfig{Name: "b", URL: srv.URL, Models: []string{"m"}}), m, WithLogger(discard))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Start()
	reg, err := m.ObserveEngineState(f.ObserveState)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Unregister() }()

	check := func(step string, want map[string]string) {
		t.Helper()
		for name, role := range want {
			e := f.Engine(name)
			wantAttrs := []attribute.KeyValue{telemetry.AttrSpanEngine.String(name), telemetry.AttrSpanEngineRole.String(role)}
			if got := e.SpanAttrs(); !slices.Equal(got, wantAttrs) {
				t.Errorf("%s: %s SpanAttrs %v, want %v", step, name, got, wantAttrs)
			}
			m.RecordFirstToken(context.Background(), e.Telemetry().Attrs("m", "chat", "chat"), 0.1)
		}
		rm := &metricdata.ResourceMetrics{}
		if err := reader.Collect(context.Background(), rm); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, sm := range rm.ScopeMetrics {
			for _, mt := range sm.Metrics {
				switch d := mt.Data.(type) {
				case metricdata.Gauge[int64]:
					if mt.Name != telemetry.EngineStateName {
						continue
					}
					for _, dp := range d.DataPoints {
						e, _ := dp.Attributes.Value(telemetry.AttrEngine)
						r, _ := dp.Attributes.Value(telemetry.AttrRole)
						if s, _ := dp.Attributes.Value(telemetry.AttrState); s.AsString() == "ready" && dp.Value == 1 {
							if prev, dup := got[e.AsString()]; dup {
								t.Errorf("%s: %s ready twice, roles %s and %s", step, e.AsString(), prev, r.AsString())
							}
							got[e.AsString()] = r.AsString()
						}
					}
				case metricdata.Histogram[float64]:
					for _, dp := range d.DataPoints {
						if _, ok := dp.Attributes.Value(telemetry.AttrRole); ok {
							t.Errorf("%s: %s point with a role: %v", step, mt.Name, dp.Attributes.ToSlice())
						}
					}
				}
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: ready engines' roles on %s %v, want %v", step, telemetry.EngineStateName, got, want)
		}
	}
	check("start", map[string]string{"p": "prefill", "b": "both"})
	if _, err := f.SetConfigured([]EngineConfig{{Name: "p", URL: srv.URL, Models: []string{"m"}, Role: "decode"},
		{Name: "b", URL: srv.URL, Models: []string{"m"}}}, nil); err != nil {
		t.Fatal(err)
	}
	check("reload", map[string]string{"p": "decode", "b": "both"})
}
