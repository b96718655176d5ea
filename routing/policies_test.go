package routing

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// loadOn gives e prefill requests in prefill and decode in decode until the
// test ends.
func loadOn(tb testing.TB, e *Endpoint, prefill, decode int) {
	tb.Helper()
	slots := make([]Slot, prefill+decode)
	for i := range slots {
		slots[i].Acquire(e)
		if i >= prefill {
			slots[i].Promote()
		}
	}
	tb.Cleanup(func() {
		for i := range slots {
			slots[i].Release()
		}
	})
}

func pick(t *testing.T, p Policy, req *Request, eps []*Endpoint) *Endpoint {
	t.Helper()
	e, err := p.Pick(context.Background(), req, eps)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestNewPoliciesNoCandidates(t *testing.T) {
	for _, name := range Names() {
		c := DefaultConfig()
		c.Policy = name
		p, _ := NewPolicy(c)
		for _, req := range []*Request{{}, {SessionKey: "s", PrefixHashes: []uint64{1, 2}}} {
			if e, err := p.Pick(context.Background(), req, nil); e != nil || err != ErrNoEndpoint {
				t.Errorf("%s: got (%v, %v), want (nil, ErrNoEndpoint)", name, e, err)
			}
		}
	}
}

func TestPowerOfTwo(t *testing.T) {
	t.Run("two candidates: the less loaded always", func(t *testing.T) {
		eps := endpoints(2)
		loadOn(t, eps[0], 0, 3)
		p := NewPowerOfTwo(2)
		for range 200 {
			if e := pick(t, p, &Request{}, eps); e != eps[1] {
				t.Fatalf("picked %s (load 3) over e1 (load 0)", e.Name())
			}
		}
	})
	t.Run("prefill weight", func(t *testing.T) {
		eps := endpoints(2)
		loadOn(t, eps[0], 2, 0) // score 2*3 = 6
		loadOn(t, eps[1], 0, 5) // score 5
		if e := pick(t, NewPowerOfTwo(3), &Request{}, eps); e != eps[1] {
			t.Fatalf("picked %s, want e1 (5 < 2 prefill x weight 3)", e.Name())
		}
	})
	t.Run("distinct candidates: the most loaded never, the least 2/n", func(t *testing.T) {
		const n, picks = 8, 40000
		eps := endpoints(n)
		for i, e := range eps {
			loadOn(t, e, 0, i) // e_i has load i, all distinct
		}
		p := NewPowerOfTwo(1)
		counts := make([]int, n)
		for range picks {
			counts[slices.Index(eps, pick(t, p, &Request{}, eps))]++
		}
		if counts[n-1] != 0 {
			t.Fatalf("the most loaded engine was picked %d times: the two choices were not distinct", counts[n-1])
		}
		// e_i wins when it is drawn and the other is above it:
		// P = 2(n-1-i) / (n(n-1)).
		for i, c := range counts {
			want := float64(picks) * 2 * float64(n-1-i) / float64(n*(n-1))
			if math.Abs(float64(c)-want) > 5*math.Sqrt(want)+1 {
				t.Errorf("e%d picked %d times, want about %.0f (all %v)", i, c, want, counts)
			}
		}
	})
	t.Run("d choices equal to n: least loaded", func(t *testing.T) {
		eps := endpoints(5)
		for i, e := range eps {
			loadOn(t, e, 0, 5-i)
		}
		p := NewPowerOfChoices(8, 1)
		for range 100 {
			if e := pick(t, p, &Request{}, eps); e != eps[4] {
				t.Fatalf("picked %s, want e4 (the only least loaded)", e.Name())
			}
		}
	})
	t.Run("equal loads spread", func(t *testing.T) {
		eps := endpoints(4)
		p := NewPowerOfTwo(2)
		counts := map[string]int{}
		for range 4000 {
			counts[pick(t, p, &Request{}, eps).Name()]++
		}
		for _, e := range eps {
			if c := counts[e.Name()]; c < 850 || c > 1150 {
				t.Errorf("%s picked %d of 4000 at equal load, want about 1000: %v", e.Name(), c, counts)
			}
		}
	})
}

// named returns endpoints with the given names.
func named(names ...string) []*Endpoint {
	out := make([]*Endpoint, len(names))
	for i, n := range names {
		out[i] = NewEndpoint(n, nil)
	}
	return out
}

func sessionMap(t *testing.T, p *SessionAffinity, eps []*Endpoint, n int) map[string]string {
	t.Helper()
	m := make(map[string]string, n)
	for i := range n {
		k := "session-" + strconv.Itoa(i)
		m[k] = pick(t, p, &Request{SessionKey: k}, eps).Name()
	}
	return m
}

func TestSessionAffinitySticks(t *testing.T) {
	eps := named("a", "b", "c")
	p := NewSessionAffinity(160, 0.25, nil, "")
	first := sessionMap(t, p, eps, 300)
	again := sessionMap(t, p, eps, 300)
	for k, v := range first {
		if again[k] != v {
			t.Fatalf("session %s went to %s then %s", k, v, again[k])
		}
	}
	// Roughly even ownership (160 virtual nodes: within about 8% of 1/3).
	owned := map[string]int{}
	for _, v := range sessionMap(t, p, eps, 30000) {
		owned[v]++
	}
	for _, e := range eps {
		if f := float64(owned[e.Name()]) / 30000; f < 0.25 || f > 0.42 {
			t.Errorf("%s owns %.3f of sessions, want about 1/3: %v", e.Name(), f, owned)
		}
	}
}

func TestSessionAffinityNoKeyUsesFallback(t *testing.T) {
	eps := endpoints(3)
	loadOn(t, eps[0], 0, 2)
	loadOn(t, eps[2], 0, 1)
	p := NewSessionAffinity(160, 0.25, NewLeastLoaded(1), "")
	for range 20 {
		if e := pick(t, p, &Request{}, eps); e != eps[1] {
			t.Fatalf("no session key: picked %s, want the fallback's least loaded e1", e.Name())
		}
	}
}

// TestSessionAffinityReplicasAgree builds two pools independently, engines
// listed in different orders, and checks 1,000 sessions map identically.
func TestSessionAffinityReplicasAgree(t *testing.T) {
	names := []string{"gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"}
	rev := slices.Clone(names)
	slices.Reverse(rev)
	shuffled := []string{"gpu-c", "gpu-e", "gpu-a", "gpu-d", "gpu-b"}
	a := sessionMap(t, NewSessionAffinity(160, 0.25, nil, ""), named(names...), 1000)
	for _, order := range [][]string{rev, shuffled} {
		b := sessionMap(t, NewSessionAffinity(160, 0.25, nil, ""), named(order...), 1000)
		for k, v := range a {
			if b[k] != v {
				t.Fatalf("order %v: session %s maps to %s, the other replica says %s", order, k, b[k], v)
			}
		}
	}
}

// TestSessionAffinityMovement is the property consistent hashing exists
// for: adding a fourth engine to three moves about a quarter of the
// sessions, every one of them to the new engine; removing an engine moves
// only the sessions it had.
func TestSessionAffinityMovement(t *testing.T) {
	const n = 20000
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, 0))
		name := func() string { return fmt.Sprintf("engine-%08x", r.Uint32()) }
		three := named(name(), name(), name())
		four := append(slices.Clone(three), NewEndpoint(name(), nil))
		p := NewSessionAffinity(160, 0.25, nil, "")
		before, after := sessionMap(t, p, three, n), sessionMap(t, p, four, n)
		moved := 0
		for k, v := range before {
			if after[k] != v {
				moved++
				if after[k] != four[3].Name() {
					t.Fatalf("seed %d: session %s moved %s -> %s, not to the new engine", seed, k, v, after[k])
				}
			}
		}
		if f := float64(moved) / n; f < 0.18 || f > 0.32 {
			t.Errorf("seed %d: adding a 4th engine moved %.3f of sessions, want about 0.25", seed, f)
		}
		// Remove each engine of the four in turn.
		for i := range four {
			rest := slices.Delete(slices.Clone(four), i, i+1)
			removed := sessionMap(t, p, rest, n)
			for k, v := range after {
				if v != four[i].Name() && removed[k] != v {
					t.Fatalf("seed %d: removing %s moved session %s off %s", seed, four[i].Name(), k, v)
				}
			}
		}
	}
}

// refRingPick walks a fully built ring from h: the reference the
// per-endpoint distance search must agree with.
func refRingPick(vnodes int, factor float64, h uint64, eps []*Endpoint) *Endpoint {
	type pt struct {
		p uint64
		e *Endpoint
	}
	var ring []pt
	var total int64
	for _, e := range eps {
		for _, p := range e.ringPointsFor(vnodes) {
			ring = append(ring, pt{p, e})
		}
		pf, dc := e.InFlight()
		total += pf + dc
	}
	sort.Slice(ring, func(i, j int) bool { return ring[i].p < ring[j].p })
	bound := int64(math.Ceil(factor * float64(total+1) / float64(len(eps))))
	start := sort.Search(len(ring), func(i int) bool { return ring[i].p >= h })
	for k := range ring {
		e := ring[(start+k)%len(ring)].e
		if pf, dc := e.InFlight(); pf+dc < bound {
			return e
		}
	}
	return nil
}

func TestSessionAffinityBoundedLoadMatchesRingWalk(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for round := range 50 {
		eps := endpoints(2 + r.IntN(7))
		for _, e := range eps {
			loadOn(t, e, r.IntN(3), r.IntN(6))
		}
		p := NewSessionAffinity(40, 0.25, nil, "")
		for range 200 {
			h := r.Uint64()
			got, want := p.pick(h, eps), refRingPick(40, 1.25, h, eps)
			if got != want {
				t.Fatalf("round %d: pick = %s, ring walk = %s", round, got.Name(), want.Name())
			}
		}
	}
}

func TestSessionAffinitySkipsOverloadedHome(t *testing.T) {
	eps := named("a", "b", "c", "d")
	p := NewSessionAffinity(160, 0.25, nil, "")
	home := pick(t, p, &Request{SessionKey: "chat-42"}, eps)
	// Load the home engine to 6 with 0 elsewhere: the bound is
	// ceil(1.25*(6+1)/4) = 3, so the session goes to its next engine.
	loadOn(t, home, 0, 6)
	next := pick(t, p, &Request{SessionKey: "chat-42"}, eps)
	if next == home {
		t.Fatalf("home %s at load 6 (bound 3) still picked", home.Name())
	}
	rest := slices.DeleteFunc(slices.Clone(eps), func(e *Endpoint) bool { return e == home })
	if want := pick(t, p, &Request{SessionKey: "chat-42"}, rest); next != want {
		t.Fatalf("overflow went to %s, want the next on the ring %s", next.Name(), want.Name())
	}
	// With the bound off (ε = +Inf) the home engine keeps the session.
	unbounded := NewSessionAffinity(160, math.Inf(1), nil, "")
	if e := pick(t, unbounded, &Request{SessionKey: "chat-42"}, eps); e != home {
		t.Fatalf("unbounded: picked %s, want home %s", e.Name(), home.Name())
	}
}

func TestPrefixIndex(t *testing.T) {
	x := NewPrefixIndex(1 << 10)
	// Bytes is Capacity*PrefixEntryBytes by definition; what must hold is
	// that an entry really is PrefixEntryBytes in memory.
	if x.Capacity() != 1024 || unsafe.Sizeof(prefixEntry{}) != PrefixEntryBytes || unsafe.Sizeof(prefixBucket{}) != prefixWays*PrefixEntryBytes {
		t.Fatalf("capacity %d, entry %d bytes, want 1024 and %d", x.Capacity(), unsafe.Sizeof(prefixEntry{}), PrefixEntryBytes)
	}
	a, b := NewEndpoint("a", nil), NewEndpoint("b", nil)
	prompt := []uint64{11, 12, 13, 14, 15}
	x.Record(prompt[:3], a)
	tests := []struct {
		hashes []uint64
		e      *Endpoint
		want   int
	}{
		{prompt, a, 3},
		{prompt[:2], a, 2},
		{prompt, b, 0},
		{[]uint64{99, 100, 101}, a, 0},
		{nil, a, 0},
	}
	for _, tt := range tests {
		if got := x.Match(tt.hashes, tt.e); got != tt.want {
			t.Errorf("Match(%v, %s) = %d, want %d", tt.hashes, tt.e.Name(), got, tt.want)
		}
	}
	x.Record(prompt, b)
	if got := x.Match(prompt, b); got != 5 {
		t.Errorf("after Record, Match(b) = %d, want 5", got)
	}
	if got := x.Len(); got != 8 {
		t.Errorf("Len = %d, want 8 (3 for a, 5 for b)", got)
	}
}

// TestPrefixIndexForget: Forget removes exactly the given blocks of the
// given engine, leaves other engines' and other blocks alone, frees the
// entries for new ones, and forgetting what is not there changes nothing.
func TestPrefixIndexForget(t *testing.T) {
	x := NewPrefixIndex(1 << 10)
	a, b := NewEndpoint("a", nil), NewEndpoint("b", nil)
	prompt := []uint64{11, 12, 13, 14, 15}
	x.Record(prompt, a)
	x.Record(prompt, b)
	x.Record([]uint64{21, 22}, a)
	x.Forget(prompt[2:], a)
	for _, tt := range []struct {
		hashes []uint64
		e      *Endpoint
		want   int
	}{
		{prompt, a, 2}, // blocks 0 and 1 stay
		{prompt, b, 5},
		{[]uint64{21, 22}, a, 2},
	} {
		if got := x.Match(tt.hashes, tt.e); got != tt.want {
			t.Errorf("after Forget, Match(%v, %s) = %d, want %d", tt.hashes, tt.e.Name(), got, tt.want)
		}
	}
	if got := x.Len(); got != 9 {
		t.Errorf("Len = %d, want 9 (2+2 for a, 5 for b)", got)
	}
	x.Forget([]uint64{99, 100}, a)
	x.Forget(nil, a)
	x.Forget(prompt, a)
	if got, n := x.Match(prompt, a), x.Len(); got != 0 || n != 7 {
		t.Errorf("a forgotten: Match %d, Len %d; want 0, 7", got, n)
	}
	// A bucket's forgotten entry is free again: one bucket of 8 takes 8
	// new blocks after forgetting 4 of 8 without evicting the other 4.
	y := NewPrefixIndex(8)
	y.Record([]uint64{1, 2, 3, 4, 5, 6, 7, 8}, a)
	y.Forget([]uint64{5, 6, 7, 8}, a)
	y.Record([]uint64{1, 2, 3, 4, 9, 10, 11, 12}, a)
	if got := y.Match([]uint64{1, 2, 3, 4, 9, 10, 11, 12}, a); got != 8 || y.Len() != 8 {
		t.Errorf("after forgetting half a full bucket: Match %d, Len %d; want 8, 8", got, y.Len())
	}
}

// TestPoliciesForget: prefix-aware and scorer forget what a pick recorded,
// so the same prompt is no longer drawn to that engine; session-affinity
// passes a keyless request's Forget to its prefix-aware fallback, and one
// with a key to nobody (the ring learns nothing).
func TestPoliciesForget(t *testing.T) {
	prompt := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		name    string
		edit    func(*Config)
		key     string
		forgets bool
	}{
		{name: PrefixAwareName, forgets: true},
		{name: ScorerName, forgets: true},
		{name: SessionAffinityName, edit: func(c *Config) { c.SessionAffinity.Fallback = PrefixAwareName }, forgets: true},
		{name: SessionAffinityName, edit: func(c *Config) { c.SessionAffinity.Fallback = PrefixAwareName }, key: "s1", forgets: false},
	} {
		t.Run(fmt.Sprintf("%s key %q", tc.name, tc.key), func(t *testing.T) {
			c := DefaultConfig()
			c.Policy = tc.name
			if tc.edit != nil {
				tc.edit(&c)
			}
			p, err := NewPolicy(c)
			if err != nil {
				t.Fatal(err)
			}
			eps := endpoints(3)
			req := &Request{PrefixHashes: prompt}
			first := pick(t, p, req, eps) // keyless: recorded by the prefix policy
			req.SessionKey = tc.key
			p.(Forgetter).Forget(req, first)
			// Another engine is sent the prompt, and then the one that
			// failed is as idle as it: the prompt goes where it was
			// recorded last unless the failed engine is still remembered.
			second := pick(t, p, &Request{PrefixHashes: prompt}, without(eps, first))
			var drawnBack int
			for range 50 {
				if pick(t, p, &Request{PrefixHashes: prompt}, eps) == first {
					drawnBack++
				}
			}
			switch {
			case tc.forgets && drawnBack != 0:
				t.Errorf("forgotten %s still drew %d of 50 picks (%s had the prompt)", first.Name(), drawnBack, second.Name())
			case !tc.forgets && drawnBack == 0:
				t.Errorf("Forget with a session key forgot %s (0 of 50 picks), want the record kept", first.Name())
			}
		})
	}
}

// TestForgetKeepsKnownPrefix: Forget takes back only the blocks the pick
// added; a shared prefix the engine was already recorded for stays, so one
// failed attempt does not wipe the engine's system prompt for every
// conversation. A scorer without the prefix scorer has nothing to forget.
func TestForgetKeepsKnownPrefix(t *testing.T) {
	prompt := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, p := range []interface {
		Policy
		Forgetter
		Index() *PrefixIndex
	}{
		NewPrefixAware(NewPrefixIndex(1<<12), 0.3, 4, 1.5, 2),
		NewScorer(DefaultConfig().Scorer, NewPrefixIndex(1<<12)),
	} {
		eps := endpoints(3)
		for _, e := range eps {
			p.Index().Record(prompt[:4], e) // the shared system prompt
		}
		req := &Request{PrefixHashes: prompt}
		e := pick(t, p, req, eps)
		if got := p.Index().Match(prompt, e); got != 10 {
			t.Fatalf("%T: after the pick %s matches %d, want 10", p, e.Name(), got)
		}
		p.Forget(req, e)
		if got := p.Index().Match(prompt, e); got != 4 {
			t.Errorf("%T: after Forget %s matches %d blocks, want the 4 it was known to hold", p, e.Name(), got)
		}
	}
	// One candidate: the scorer records without matching, and Forget
	// takes the whole prompt.
	s, eps := NewScorer(DefaultConfig().Scorer, NewPrefixIndex(1<<12)), endpoints(1)
	s.Index().Record(prompt[:4], eps[0])
	req := &Request{PrefixHashes: prompt}
	pick(t, s, req, eps)
	s.Forget(req, eps[0])
	if got := s.Index().Match(prompt, eps[0]); got != 0 {
		t.Errorf("scorer, one candidate: after Forget matches %d, want 0", got)
	}
	w := DefaultConfig().Scorer
	w.Prefix = 0
	noPrefix := NewScorer(w, nil)
	req = &Request{PrefixHashes: prompt}
	pick(t, noPrefix, req, eps)
	noPrefix.Forget(req, eps[0]) // no index: nothing recorded, nothing to do
}

func without(eps []*Endpoint, e *Endpoint) []*Endpoint {
	var out []*Endpoint
	for _, x := range eps {
		if x != e {
			out = append(out, x)
		}
	}
	return out
}

func TestPrefixIndexEvictsLeastRecentlyUsed(t *testing.T) {
	x := NewPrefixIndex(8) // one bucket of 8
	e := NewEndpoint("e", nil)
	old := []uint64{1, 2, 3, 4}
	x.Record(old, e)
	x.Record([]uint64{5, 6, 7, 8}, e)
	x.Record(old[:1], e) // touch block 1: now the most recent
	x.Record([]uint64{9, 10}, e)
	// Evicted: the two least recently used, blocks 4 and 3 (a prompt's later
	// blocks are older than its first, and 1 was touched again).
	for h, want := range map[uint64]bool{1: true, 2: true, 3: false, 4: false, 5: true, 6: true, 7: true, 8: true, 9: true, 10: true} {
		if got := x.has(entryKey(h, e)); got != want {
			t.Errorf("block %d present = %v, want %v", h, got, want)
		}
	}
}

// TestPrefixIndexMemoryBound routes 1,000,000 distinct prompts and checks
// the index never holds more than its capacity nor grows the heap. Under
// the race detector (an atomic operation costs about 1 us there) each
// prompt is one block recorded straight into the index, which is still
// 1,000,000 distinct entries through the same insert path; without it, each
// prompt is 16 blocks routed by Pick over 8 engines.
func TestPrefixIndexMemoryBound(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = PrefixAwareName
	cfg.Prefix.IndexEntries = 1 << 16
	pol, err := NewPolicy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := pol.(*PrefixAware)
	eps := endpoints(8)
	blocks := 16
	if testutil.RaceEnabled {
		blocks = 1
	}
	before := heapInUse()
	hashes := make([]uint64, blocks)
	for i := range 1_000_000 {
		for j := range hashes {
			hashes[j] = stablehash.Mix64(uint64(i)<<8 | uint64(j))
		}
		if testutil.RaceEnabled {
			p.Index().Record(hashes, eps[i%len(eps)])
			continue
		}
		if _, err := p.Pick(context.Background(), &Request{PrefixHashes: hashes}, eps); err != nil {
			t.Fatal(err)
		}
	}
	after := heapInUse()
	if n, c := p.Index().Len(), p.Index().Capacity(); n > c || c != 1<<16 || n < c*9/10 {
		t.Fatalf("index holds %d entries, capacity %d (want it full, never over)", n, c)
	}
	if grown := int64(after) - int64(before); grown > 1<<20 {
		t.Fatalf("heap grew by %d bytes over 1,000,000 prompts; the index is %d bytes and allocated up front", grown, p.Index().Bytes())
	}
}

func TestPrefixAware(t *testing.T) {
	shared := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	newPolicy := func() *PrefixAware { return NewPrefixAware(NewPrefixIndex(1<<12), 0.3, 4, 1.5, 2) }
	t.Run("longest match wins", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(4)
		p.Index().Record(shared[:4], eps[1])
		p.Index().Record(shared[:8], eps[2])
		loadOn(t, eps[2], 0, 3) // busier, but within the balance thresholds
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps); e != eps[2] {
			t.Fatalf("picked %s, want e2 (8 of 10 blocks)", e.Name())
		}
		if got := p.Index().Match(shared, eps[2]); got != 10 {
			t.Fatalf("after the pick e2 matches %d blocks, want all 10 recorded", got)
		}
	})
	t.Run("external endpoint: no match, nothing recorded", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(2)
		eps[0].SetExternal()
		p.Index().Record(shared, eps[0]) // as if recorded before: still no match
		loadOn(t, eps[1], 0, 1)          // e1 busier: only a prefix match would pick e0
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps[:1]); e != eps[0] {
			t.Fatalf("picked %s, want the only candidate", e.Name())
		}
		req := &Request{PrefixHashes: shared[:5]}
		if e := pick(t, p, req, eps[:1]); e != eps[0] {
			t.Fatalf("picked %s", e.Name())
		}
		if got := p.Index().Match(shared[:5], eps[0]); got != 5 {
			t.Fatalf("the index changed for the external endpoint: %d blocks", got)
		}
		p.Index().Record(shared, eps[1])
		loadOn(t, eps[1], 0, 1) // e1 at 2, e0 at 0
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps); e != eps[1] {
			t.Fatalf("picked %s, want e1 (its cache), not the external e0", e.Name())
		}
		p2, eps2 := newPolicy(), endpoints(2)
		eps2[0].SetExternal()
		r := &Request{PrefixHashes: shared}
		if e := pick(t, p2, r, eps2[:1]); e != eps2[0] {
			t.Fatal("not the only candidate")
		}
		if got := p2.Index().Match(shared, eps2[0]); got != 0 {
			t.Fatalf("a pick of the external endpoint recorded %d blocks, want 0", got)
		}
	})
	t.Run("equal match: least loaded", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(3)
		for _, e := range eps {
			p.Index().Record(shared[:6], e)
		}
		loadOn(t, eps[0], 1, 0)
		loadOn(t, eps[2], 0, 1)
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps); e != eps[1] {
			t.Fatalf("picked %s, want the idle e1", e.Name())
		}
	})
	t.Run("overloaded best goes by load", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(3)
		p.Index().Record(shared, eps[0])
		loadOn(t, eps[0], 0, 6) // 6 - 1 > 4 and 6 > 1.5*1
		loadOn(t, eps[1], 0, 1)
		loadOn(t, eps[2], 0, 2)
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps); e != eps[1] {
			t.Fatalf("picked %s, want the least loaded e1", e.Name())
		}
	})
	t.Run("both thresholds must hold", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(2)
		p.Index().Record(shared, eps[0])
		loadOn(t, eps[0], 0, 30) // 30 - 25 = 5 > 4, but 30 < 1.5*25
		loadOn(t, eps[1], 0, 25)
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps); e != eps[0] {
			t.Fatalf("picked %s, want e0 (not 1.5x the least loaded)", e.Name())
		}
	})
	t.Run("weak match goes by load", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(2)
		p.Index().Record(shared[:3], eps[0]) // 3/10 is not > 0.3
		loadOn(t, eps[0], 0, 1)
		if e := pick(t, p, &Request{PrefixHashes: shared}, eps); e != eps[1] {
			t.Fatalf("picked %s, want e1", e.Name())
		}
	})
	t.Run("no hashes: least loaded", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(3)
		loadOn(t, eps[0], 0, 1)
		loadOn(t, eps[1], 1, 0) // prefill weight 2
		if e := pick(t, p, &Request{}, eps); e != eps[2] {
			t.Fatalf("picked %s, want e2", e.Name())
		}
	})
	t.Run("a conversation stays", func(t *testing.T) {
		p, eps := newPolicy(), endpoints(4)
		turn := []uint64{100, 101}
		first := pick(t, p, &Request{PrefixHashes: turn}, eps)
		for k := range 5 {
			turn = append(turn, uint64(200+k), uint64(300+k))
			if e := pick(t, p, &Request{PrefixHashes: turn}, eps); e != first {
				t.Fatalf("turn %d went to %s, the conversation is on %s", k+2, e.Name(), first.Name())
			}
		}
	})
}

func TestScorer(t *testing.T) {
	only := func(w ScorerConfig) *Scorer { return NewScorer(w, NewPrefixIndex(1<<12)) }
	fresh := func(e *Endpoint, s Stats) {
		s.At, s.Expires = time.Now(), time.Now().Add(time.Hour)
		e.SetStats(&s)
	}
	t.Run("queue depth from fresh stats", func(t *testing.T) {
		p, eps := only(ScorerConfig{Queue: 1}), endpoints(3)
		fresh(eps[0], Stats{Waiting: 5, KVCacheUsage: -1})
		fresh(eps[1], Stats{Waiting: 1, KVCacheUsage: -1})
		fresh(eps[2], Stats{Waiting: 3, KVCacheUsage: -1})
		if e := pick(t, p, &Request{}, eps); e != eps[1] {
			t.Fatalf("picked %s, want e1 (1 waiting)", e.Name())
		}
		// Requests sent since the scrape count as queued: 1 + 4 > 3.
		loadOn(t, eps[1], 4, 0)
		if e := pick(t, p, &Request{}, eps); e != eps[2] {
			t.Fatalf("picked %s, want e2 once e1 got 4 more requests", e.Name())
		}
	})
	t.Run("kv cache usage", func(t *testing.T) {
		p, eps := only(ScorerConfig{KVCache: 1}), endpoints(3)
		fresh(eps[0], Stats{KVCacheUsage: 0.9})
		fresh(eps[1], Stats{KVCacheUsage: 0.2})
		fresh(eps[2], Stats{KVCacheUsage: 0.6})
		if e := pick(t, p, &Request{}, eps); e != eps[1] {
			t.Fatalf("picked %s, want e1 (20%% used)", e.Name())
		}
	})
	t.Run("unknown kv is neutral", func(t *testing.T) {
		p, eps := only(ScorerConfig{KVCache: 1}), endpoints(2)
		fresh(eps[0], Stats{KVCacheUsage: 0.6}) // score 0.4 < 0.5
		if e := pick(t, p, &Request{}, eps); e != eps[1] {
			t.Fatalf("picked %s, want e1 (no stats: 0.5)", e.Name())
		}
	})
	t.Run("weights trade off", func(t *testing.T) {
		eps := endpoints(2)
		hashes := []uint64{1, 2, 3, 4}
		// e0 holds the whole prefix but has 2 waiting; e1 is empty and cold.
		fresh(eps[0], Stats{Waiting: 2, KVCacheUsage: 0.5})
		fresh(eps[1], Stats{Waiting: 0, KVCacheUsage: 0.5})
		llmd := only(ScorerConfig{Queue: 2, KVCache: 2, Prefix: 3})
		llmd.Index().Record(hashes, eps[0])
		if e := pick(t, llmd, &Request{PrefixHashes: hashes}, eps); e != eps[0] {
			t.Fatalf("queue 2 prefix 3: picked %s, want the cached e0 (3 > 2)", e.Name())
		}
		queueHeavy := only(ScorerConfig{Queue: 4, Prefix: 3})
		queueHeavy.Index().Record(hashes, eps[0])
		if e := pick(t, queueHeavy, &Request{PrefixHashes: hashes}, eps); e != eps[1] {
			t.Fatalf("queue 4 prefix 3: picked %s, want the idle e1 (4 > 3)", e.Name())
		}
	})
	t.Run("ties at random", func(t *testing.T) {
		p, eps := only(DefaultConfig().Scorer), endpoints(4)
		counts := map[string]int{}
		for range 4000 {
			counts[pick(t, p, &Request{}, eps).Name()]++
		}
		for _, e := range eps {
			if c := counts[e.Name()]; c < 850 || c > 1150 {
				t.Errorf("%s picked %d of 4000 on equal scores: %v", e.Name(), c, counts)
			}
		}
	})
}

// TestScorerIgnoresStaleStats: stats past their Expires are not trusted,
// and the queue scorer falls back to the gateway's prefill counts.
func TestScorerIgnoresStaleStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, eps := NewScorer(ScorerConfig{Queue: 1}, nil), endpoints(2)
		now := time.Now()
		eps[0].SetStats(&Stats{At: now, Expires: now.Add(5 * time.Second), Waiting: 10, KVCacheUsage: -1})
		eps[1].SetStats(&Stats{At: now, Expires: now.Add(5 * time.Second), Waiting: 0, KVCacheUsage: -1})
		loadOn(t, eps[1], 3, 0) // the gateway's own view: e1 has 3 in prefill
		if e := pick(t, p, &Request{}, eps); e != eps[1] {
			t.Fatalf("fresh stats: picked %s, want e1 (0 waiting + 3 sent since = 3 < 10)", e.Name())
		}
		time.Sleep(5 * time.Second) // the fake clock: the stats expire
		if e := pick(t, p, &Request{}, eps); e != eps[0] {
			t.Fatalf("stale stats: picked %s, want e0 (gateway prefill 0 < 3)", e.Name())
		}
		if s := eps[0].Stats(); s.Fresh(time.Now()) {
			t.Fatal("stats still fresh after their max age")
		}
	})
}

// BenchmarkPick measures every policy at 4 and 64 candidates under uneven
// load, with a 40-block prompt for the prefix policies; each must report
// 0 allocs/op.
func BenchmarkPick(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{4, 64} {
		eps := endpoints(n)
		for i, e := range eps {
			loadOn(b, e, i%3, i%5)
			now := time.Now()
			e.SetStats(&Stats{At: now, Expires: now.Add(time.Hour), Waiting: int64(i % 4), KVCacheUsage: float64(i%10) / 10})
		}
		hashes := make([]uint64, 40)
		for i := range hashes {
			hashes[i] = stablehash.Mix64(uint64(i + 1))
		}
		// The engines' KV-cache events: every engine publishes, one holds
		// the prompt's 40 token blocks (precise-prefix and the scorer with
		// precise_prefix measure them; the others ignore TokenKeys).
		kv := NewKVIndex(DefaultKVIndexConfig())
		tokens := kvTokens(1, 40)
		for i, e := range eps {
			if i == n/2 {
				kv.Apply(e, kvBatch(kvStored(1, 0, tokens)), time.Now())
			} else {
				kv.Apply(e, kvBatch(kvStored(kvevents.Hash(1000*(i+1)), 0, kvTokens(uint32(i+2), 4))), time.Now())
			}
		}
		req := &Request{Model: "m", SessionKey: "conversation-1234", PrefixHashes: hashes, TokenKeys: kvKeys(tokens, 0), TokenBlocks: 40}
		for _, name := range Names() {
			c := DefaultConfig()
			c.Policy = name
			c.Scorer.PrecisePrefix = true
			p, err := NewPolicy(c, WithKVIndex(kv, kvBS))
			if err != nil {
				b.Fatal(err)
			}
			// Warm: session rings built, the prompt recorded somewhere.
			if _, err := p.Pick(ctx, req, eps); err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.Pick(ctx, req, eps); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// heapInUse returns the live heap after a full collection, in bytes.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// forget removes e's entry for block h, as an eviction would.
func (x *PrefixIndex) forget(h uint64, e *Endpoint) {
	k := entryKey(h, e)
	b := x.bucket(k)
	for i := range b {
		if b[i].key.Load() == k {
			b[i].key.Store(0)
		}
	}
}

// TestPrefixIndexMatchWithGaps: per-bucket eviction leaves gaps in a
// prompt's blocks; Match never claims more than the highest stored block
// proves, and finds it in the usual shapes.
func TestPrefixIndexMatchWithGaps(t *testing.T) {
	e := NewEndpoint("e", nil)
	prompt := make([]uint64, 10)
	for i := range prompt {
		prompt[i] = stablehash.Mix64(uint64(1000 + i))
	}
	tests := []struct {
		stored string // T: block stored, F: evicted
		want   int
	}{
		{"TTTTTTTTTT", 10},
		{"TTFFFFFTTT", 10}, // the last block proves them all
		{"TTTTTTTFFF", 7},
		{"TTFTTTTFFF", 7},
		{"TFFFFFFFFF", 1},
		{"FFFFFFFFFF", 0},
	}
	for _, tt := range tests {
		x := NewPrefixIndex(1 << 12)
		x.Record(prompt, e)
		highest := 0
		for i, c := range tt.stored {
			if c == 'F' {
				x.forget(prompt[i], e)
			} else {
				highest = i + 1
			}
		}
		got := x.Match(prompt, e)
		if got != tt.want {
			t.Errorf("stored %s: Match = %d, want %d", tt.stored, got, tt.want)
		}
		if got > highest {
			t.Errorf("stored %s: Match = %d claims more than the highest stored block %d", tt.stored, got, highest)
		}
	}
}

// TestPickDoesNotAllocate holds every policy to 0 allocations per pick, at
// 4 and 64 candidates (BenchmarkPick reports the same numbers).
func TestPickDoesNotAllocate(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, n := range []int{4, 64} {
		eps := endpoints(n)
		for i, e := range eps {
			loadOn(t, e, i%3, i%5)
			now := time.Now()
			e.SetStats(&Stats{At: now, Expires: now.Add(time.Hour), Waiting: int64(i % 4), KVCacheUsage: 0.5})
		}
		req := &Request{SessionKey: "conversation-1", PrefixHashes: []uint64{1, 2, 3, 4, 5, 6, 7, 8}}
		for _, name := range Names() {
			c := DefaultConfig()
			c.Policy = name
			p, _ := NewPolicy(c)
			_, _ = p.Pick(context.Background(), req, eps) // ring points built once
			if a := testing.AllocsPerRun(100, func() { _, _ = p.Pick(context.Background(), req, eps) }); a != 0 {
				t.Errorf("%s at %d candidates: %v allocs per pick, want 0", name, n, a)
			}
			if f, ok := p.(Forgetter); ok {
				if a := testing.AllocsPerRun(100, func() { f.Forget(req, eps[0]) }); a != 0 {
					t.Errorf("%s at %d candidates: %v allocs per Forget, want 0", name, n, a)
				}
			}
		}
	}
}

// TestSessionAffinityFallbackGetsPrefixBlocks: a prefix-aware fallback
// makes the gateway hash prompts for session-affinity too.
func TestSessionAffinityFallbackGetsPrefixBlocks(t *testing.T) {
	c := DefaultConfig()
	c.Policy = SessionAffinityName
	c.SessionAffinity.Fallback = PrefixAwareName
	c.Prefix.BlockBytes = 32
	p, err := NewPolicy(c)
	if err != nil {
		t.Fatal(err)
	}
	if bb, mb := p.(PrefixHasher).PrefixBlocks(); bb != 32 || mb != 1024 {
		t.Fatalf("PrefixBlocks = %d, %d; want the fallback's 32, 1024", bb, mb)
	}
	c.SessionAffinity.Fallback = RoundRobinName
	p, _ = NewPolicy(c)
	if bb, mb := p.(PrefixHasher).PrefixBlocks(); bb != 0 || mb != 0 {
		t.Fatalf("round-robin fallback: PrefixBlocks = %d, %d; want 0, 0 (no hashing)", bb, mb)
	}
}
