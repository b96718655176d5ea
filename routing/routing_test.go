package routing

import (
	"context"
	"errors"
	"net/url"
	"strconv"
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

// TestCaseL03SlotReleaseGoesToItsOwnIncarnation is shared/cases L03: an engine
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
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
		ok      bool
	}{
		{"defaults", DefaultConfig(), nil, true},
		{"least-loaded", Config{Policy: LeastLoadedName, PrefillWeight: 1}, nil, true},
		{"unknown policy", Config{Policy: "random", PrefillWeight: 2}, ErrUnknownPolicy, false},
		{"zero weight", Config{Policy: RoundRobinName, PrefillWeight: 0}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Validate() = %v, want %v", err, tt.wantErr)
			}
			p, err := NewPolicy(tt.cfg)
			if tt.ok && (p == nil || err != nil) {
				t.Fatalf("NewPolicy = %v, %v", p, err)
			}
		})
	}
}

func BenchmarkPick(b *testing.B) {
	eps := endpoints(8)
	req := &Request{Model: "m"}
	ctx := context.Background()
	for _, p := range []struct {
		name string
		p    Policy
	}{{RoundRobinName, NewRoundRobin()}, {LeastLoadedName, NewLeastLoaded(2)}} {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.p.Pick(ctx, req, eps); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
