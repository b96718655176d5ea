package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func endpoints(n int) []*Endpoint {
	eps := make([]*Endpoint, n)
	for i := range eps {
		u, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(8000+i))
		eps[i] = NewEndpoint("e"+strconv.Itoa(i), u)
	}
	return eps
}

func TestRoundRobinCycles(t *testing.T) {
	eps := endpoints(3)
	p := NewRoundRobin()
	var got []string
	for range 7 {
		e, err := p.Pick(context.Background(), &Request{}, eps)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.Name())
	}
	want := []string{"e0", "e1", "e2", "e0", "e1", "e2", "e0"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pick %d = %s, want %s (all: %v)", i, got[i], want[i], got)
		}
	}
}

func TestPoliciesNoCandidates(t *testing.T) {
	for _, p := range []Policy{NewRoundRobin(), NewLeastLoaded(2)} {
		e, err := p.Pick(context.Background(), &Request{}, nil)
		if e != nil || !errors.Is(err, ErrNoEndpoint) {
			t.Errorf("%T: got (%v, %v), want (nil, ErrNoEndpoint)", p, e, err)
		}
	}
}

func TestLeastLoadedPrefersLowestWeightedScore(t *testing.T) {
	eps := endpoints(3)
	var slots [6]Slot
	// e0: 2 prefill (score 4); e1: 3 decode (score 3); e2: 1 prefill + 2 decode (score 4).
	slots[0].Acquire(eps[0])
	slots[1].Acquire(eps[0])
	for i := 2; i < 5; i++ {
		slots[i].Acquire(eps[1])
		slots[i].Promote()
	}
	slots[5].Acquire(eps[2])
	var extra [2]Slot
	for i := range extra {
		extra[i].Acquire(eps[2])
		extra[i].Promote()
	}
	p := NewLeastLoaded(2)
	for range 20 {
		e, err := p.Pick(context.Background(), &Request{}, eps)
		if err != nil {
			t.Fatal(err)
		}
		if e != eps[1] {
			t.Fatalf("picked %s, want e1 (score 3 vs 4 and 5)", e.Name())
		}
	}
}

func TestLeastLoadedBreaksTiesFairly(t *testing.T) {
	eps := endpoints(4)
	p := NewLeastLoaded(2)
	counts := map[string]int{}
	const n = 40000
	for range n {
		e, _ := p.Pick(context.Background(), &Request{}, eps)
		counts[e.Name()]++
	}
	for _, e := range eps {
		c := counts[e.Name()]
		// Each should get n/4 = 10000; 5 sigma is about 430.
		if c < 9400 || c > 10600 {
			t.Errorf("%s got %d of %d picks, want about %d: %v", e.Name(), c, n, n/4, counts)
		}
	}
}

func TestSlotLifecycle(t *testing.T) {
	tests := []struct {
		name         string
		promote      bool
		wantReleased Phase
	}{
		{"released in prefill", false, PhasePrefill},
		{"released in decode", true, PhaseDecode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := endpoints(1)[0]
			var s Slot
			s.Acquire(e)
			if pf, dc := e.InFlight(); pf != 1 || dc != 0 {
				t.Fatalf("after Acquire: prefill=%d decode=%d, want 1 0", pf, dc)
			}
			if tt.promote {
				if !s.Promote() {
					t.Fatal("Promote returned false on a prefill slot")
				}
				if s.Promote() {
					t.Fatal("second Promote moved the slot again")
				}
				if pf, dc := e.InFlight(); pf != 0 || dc != 1 {
					t.Fatalf("after Promote: prefill=%d decode=%d, want 0 1", pf, dc)
				}
			}
			if got := s.Release(); got != tt.wantReleased {
				t.Fatalf("Release = %v, want %v", got, tt.wantReleased)
			}
			if got := s.Release(); got != PhaseNone {
				t.Fatalf("second Release = %v, want none", got)
			}
			if s.Promote() {
				t.Fatal("Promote after Release moved the slot")
			}
			if pf, dc := e.InFlight(); pf != 0 || dc != 0 {
				t.Fatalf("after Release: prefill=%d decode=%d, want 0 0", pf, dc)
			}
		})
	}
}

// TestCaseL03SlotReleaseGoesToItsOwnIncarnation is docs/cases.md L03: an engine
// removed and re-added under the same name gets a new Endpoint; a release
// of a slot taken on the old one never touches the new one.
func TestCaseL03SlotReleaseGoesToItsOwnIncarnation(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:8000")
	old := NewEndpoint("E", u)
	var r1 Slot
	r1.Acquire(old)
	r1.Promote()
	readded := NewEndpoint("E", u)
	var r2 Slot
	r2.Acquire(readded)
	r1.Release()
	if pf, dc := readded.InFlight(); pf != 1 || dc != 0 {
		t.Fatalf("re-added endpoint: prefill=%d decode=%d, want 1 0", pf, dc)
	}
	r2.Release()
	for _, e := range []*Endpoint{old, readded} {
		if pf, dc := e.InFlight(); pf != 0 || dc != 0 {
			t.Fatalf("prefill=%d decode=%d, want 0 0", pf, dc)
		}
	}
}

func TestSlotConcurrentSafe(t *testing.T) {
	e := endpoints(1)[0]
	var wg sync.WaitGroup
	var negative sync.Once
	neg := false
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				var s Slot
				s.Acquire(e)
				if (g+i)%2 == 0 {
					s.Promote()
				}
				if pf, dc := e.InFlight(); pf < 0 || dc < 0 {
					negative.Do(func() { neg = true })
				}
				s.Release()
				s.Release()
			}
		}()
	}
	wg.Wait()
	if neg {
		t.Fatal("a counter was observed below zero")
	}
	if pf, dc := e.InFlight(); pf != 0 || dc != 0 {
		t.Fatalf("prefill=%d decode=%d, want 0 0", pf, dc)
	}
}

func TestConfigValidate(t *testing.T) {
	with := func(f func(*Config)) Config {
		c := DefaultConfig()
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		cfg     Config
		wantErr error  // errors.Is target, or nil
		wantMsg string // substring of the error, "" when ok
	}{
		{"defaults", DefaultConfig(), nil, ""},
		{"least-loaded", with(func(c *Config) { c.Policy, c.PrefillWeight = LeastLoadedName, 1 }), nil, ""},
		{"every policy: scorer", with(func(c *Config) { c.Policy = ScorerName }), nil, ""},
		{"scorer precise_prefix", with(func(c *Config) { c.Policy, c.Scorer.PrecisePrefix = ScorerName, true }), nil, ""},
		{"scorer precise_prefix without prefix", with(func(c *Config) { c.Scorer.PrecisePrefix, c.Scorer.Prefix = true, 0 }), nil, "routing.scorer.precise_prefix needs routing.scorer.prefix > 0"},
		{"unknown policy", with(func(c *Config) { c.Policy = "random" }), ErrUnknownPolicy, "routing.policy"},
		{"near name", with(func(c *Config) { c.Policy = "Prefix_Aware" }), ErrUnknownPolicy, "did you mean prefix-aware?"},
		{"typo", with(func(c *Config) { c.Policy = "sesion-affinity" }), ErrUnknownPolicy, "did you mean session-affinity?"},
		{"typo two edits", with(func(c *Config) { c.Policy = "round-robn" }), ErrUnknownPolicy, "did you mean round-robin?"},
		{"far from any", with(func(c *Config) { c.Policy = "random" }), ErrUnknownPolicy, `"random" (known: least-loaded, power-of-two, precise-prefix, prefix-aware, round-robin, scorer, session-affinity)`},
		{"huge weight", with(func(c *Config) { c.PrefillWeight = 1 << 40 }), nil, "prefill_weight must be 1..1000"},
		{"header with space", with(func(c *Config) { c.SessionAffinity.Header = "x session" }), nil, "header must be a header name"},
		{"threshold 1", with(func(c *Config) { c.PrefixAware.CacheThreshold = 1 }), nil, "cache_threshold must be >= 0 and < 1"},
		{"huge load factor", with(func(c *Config) { c.SessionAffinity.LoadFactor = 1e300 }), nil, "load_factor must be > 0 and <= 1000"},
		{"zero weight", with(func(c *Config) { c.PrefillWeight = 0 }), nil, "routing.prefill_weight must be 1..1000, got 0"},
		{"one choice", with(func(c *Config) { c.PowerOfTwo.Choices = 1 }), nil, "routing.power_of_two.choices must be 2..8, got 1"},
		{"nine choices", with(func(c *Config) { c.PowerOfTwo.Choices = 9 }), nil, "choices must be 2..8, got 9"},
		{"header with colon", with(func(c *Config) { c.SessionAffinity.Header = "x-session:" }), nil, "routing.session_affinity.header must be a header name"},
		{"no vnodes", with(func(c *Config) { c.SessionAffinity.VirtualNodes = 0 }), nil, "virtual_nodes must be 1..10000, got 0"},
		{"zero load factor", with(func(c *Config) { c.SessionAffinity.LoadFactor = 0 }), nil, "load_factor must be > 0 and <= 1000, got 0"},
		{"NaN load factor", with(func(c *Config) { c.SessionAffinity.LoadFactor = math.NaN() }), nil, "load_factor must be > 0 and <= 1000, got NaN"},
		{"fallback itself", with(func(c *Config) { c.SessionAffinity.Fallback = SessionAffinityName }), nil, "fallback must not be session-affinity itself"},
		{"fallback unknown", with(func(c *Config) { c.SessionAffinity.Fallback = "least_loaded" }), ErrUnknownPolicy, "did you mean least-loaded?"},
		{"tiny block", with(func(c *Config) { c.Prefix.BlockBytes = 8 }), nil, "routing.prefix.block_bytes must be 16..65536, got 8"},
		{"no blocks", with(func(c *Config) { c.Prefix.MaxBlocks = 0 }), nil, "routing.prefix.max_blocks must be 1..65536, got 0"},
		{"tiny index", with(func(c *Config) { c.Prefix.IndexEntries = 4 }), nil, "routing.prefix.index_entries must be 8..268435456, got 4"},
		{"threshold above 1", with(func(c *Config) { c.PrefixAware.CacheThreshold = 1.5 }), nil, "cache_threshold must be >= 0 and < 1 (the match must exceed it), got 1.5"},
		{"negative abs", with(func(c *Config) { c.PrefixAware.BalanceAbsThreshold = -1 }), nil, "balance_abs_threshold must be >= 0, got -1"},
		{"rel below 1", with(func(c *Config) { c.PrefixAware.BalanceRelThreshold = 0.5 }), nil, "balance_rel_threshold must be >= 1, got 0.5"},
		{"negative weight", with(func(c *Config) { c.Scorer.Queue = -1 }), nil, "routing.scorer.queue must be a number >= 0, got -1"},
		{"all weights zero", with(func(c *Config) { c.Scorer = ScorerConfig{} }), nil, "at least one weight must be > 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != (tt.wantMsg == "") {
				t.Fatalf("Validate() = %v, want error containing %q", err, tt.wantMsg)
			}
			if err != nil && !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("Validate() = %v, want it to contain %q", err, tt.wantMsg)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Validate() = %v, want %v", err, tt.wantErr)
			}
			p, err := NewPolicy(tt.cfg)
			if tt.wantMsg == "" && (p == nil || err != nil) {
				t.Fatalf("NewPolicy = %v, %v", p, err)
			}
		})
	}
}

func TestNewPolicyBuildsEveryName(t *testing.T) {
	want := map[string]string{
		RoundRobinName: "*routing.RoundRobin", LeastLoadedName: "*routing.LeastLoaded",
		PowerOfTwoName: "*routing.PowerOfTwo", SessionAffinityName: "*routing.SessionAffinity",
		PrefixAwareName: "*routing.PrefixAware", ScorerName: "*routing.Scorer",
		PrecisePrefixName: "*routing.PrefixAware",
	}
	if got := Names(); len(got) != len(want) {
		t.Fatalf("Names() = %v, want the %d of %v", got, len(want), want)
	}
	for _, name := range Names() {
		c := DefaultConfig()
		c.Policy = name
		p, err := NewPolicy(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := fmt.Sprintf("%T", p); got != want[name] {
			t.Errorf("%s built %s, want %s", name, got, want[name])
		}
		hashes := false
		if ph, ok := p.(PrefixHasher); ok {
			bb, mb := ph.PrefixBlocks()
			hashes = bb == 64 && mb == 1024
		}
		if wantHashes := name == PrefixAwareName || name == ScorerName || name == PrecisePrefixName; hashes != wantHashes {
			t.Errorf("%s hashes prompt blocks = %v, want %v", name, hashes, wantHashes)
		}
		kvBlocks := 0
		if kr, ok := p.(KVRouter); ok {
			kvBlocks = kr.KVBlockSize()
		}
		if want := map[bool]int{true: DefaultKVBlockSize}[name == PrecisePrefixName]; kvBlocks != want {
			t.Errorf("%s cuts token keys into %d-token blocks, want %d", name, kvBlocks, want)
		}
		if sk, ok := p.(SessionKeyed); ok != (name == SessionAffinityName) || ok && sk.SessionHeader() != "x-session-id" {
			t.Errorf("%s: SessionKeyed %v", name, ok)
		}
	}
}

// TestRegistryEntries: every registered policy builds, a policy with a
// section both defaults and validates it (so DefaultConfig and Validate
// reach it), and its defaults are valid and are DefaultConfig's.
func TestRegistryEntries(t *testing.T) {
	r := registered()
	if len(r.order) != len(r.byName) {
		t.Fatalf("registration order %v has %d names for %d entries: a name registered twice", r.order, len(r.order), len(r.byName))
	}
	for _, name := range r.order {
		f := r.byName[name]
		if f.build == nil {
			t.Errorf("%s: no build", name)
		}
		if (f.defaults == nil) != (f.validate == nil) {
			t.Errorf("%s: defaults set = %v, validate set = %v, want both or neither", name, f.defaults != nil, f.validate != nil)
		}
		if f.defaults == nil {
			continue
		}
		var zero Config
		if err := f.validate(&zero); err == nil {
			t.Errorf("%s: its zero section validates; a section whose zero value is valid needs no defaults", name)
		}
		c := zero
		f.defaults(&c)
		if err := f.validate(&c); err != nil {
			t.Errorf("%s: its defaults do not validate: %v", name, err)
		}
	}
	for _, tt := range []struct {
		name    string
		section func(Config) any
		want    any
	}{
		{PowerOfTwoName, func(c Config) any { return c.PowerOfTwo }, PowerOfTwoConfig{Choices: 2}},
		{SessionAffinityName, func(c Config) any { return c.SessionAffinity }, SessionAffinityConfig{Header: "x-session-id", VirtualNodes: 160, LoadFactor: 0.25, Fallback: LeastLoadedName}},
		{PrefixAwareName, func(c Config) any { return c.PrefixAware }, PrefixAwareConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 16, BalanceRelThreshold: 1.5}},
		{ScorerName, func(c Config) any { return c.Scorer }, ScorerConfig{Queue: 2, KVCache: 2, Prefix: 3}},
	} {
		if got := tt.section(DefaultConfig()); got != tt.want {
			t.Errorf("DefaultConfig's %s section = %+v, want %+v", tt.name, got, tt.want)
		}
	}
	if c := DefaultConfig(); c.Policy != RoundRobinName || c.PrefillWeight != 2 || c.Prefix != (PrefixConfig{BlockBytes: 64, MaxBlocks: 1024, IndexEntries: 1 << 20}) {
		t.Errorf("DefaultConfig's shared settings = %q, %d, %+v", c.Policy, c.PrefillWeight, c.Prefix)
	}
}
