package routing

import (
	"context"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// preciseSetup returns engines a and b, a KV index in which a reported
// storing the prompt's 8 token blocks, and a request for that prompt whose
// 10 text blocks the approximate index of policy p has for b: the
// gateway's guess (b) and the engine's truth (a) disagree, as after b
// evicted the prompt and a got it through another replica.
//
// Speculation is off: a pick would otherwise make its engine hold the
// prompt (as it will), which the tests of fallback do not want.
func preciseSetup(t *testing.T, policy string, scorerPrecise bool) (p Policy, kv *KVIndex, a, b *Endpoint, req *Request) {
	t.Helper()
	cfg := DefaultKVIndexConfig()
	cfg.SpeculativeTTL = 0
	kv = NewKVIndex(cfg)
	c := DefaultConfig()
	c.Policy = policy
	c.Scorer.PrecisePrefix = scorerPrecise
	p, err := NewPolicy(c, WithKVIndex(kv, kvBS))
	if err != nil {
		t.Fatal(err)
	}
	a, b = kvEndpoint("a"), kvEndpoint("b")
	tokens := kvTokens(1, 8)
	kv.Apply(a, kvBatch(kvStored(100, 0, tokens)), time.Now())
	kv.Apply(b, kvBatch(kvStored(900, 0, kvTokens(9, 2))), time.Now()) // b publishes too, other blocks
	text := make([]uint64, 10)
	for i := range text {
		text[i] = stablehash.Mix64(uint64(i) + 77)
	}
	switch q := p.(type) {
	case *PrefixAware:
		q.Index().Record(text, b)
	case *Scorer:
		q.Index().Record(text, b)
	}
	return p, kv, a, b, &Request{Model: "m", PrefixHashes: text, TokenKeys: kvKeys(tokens, 0), TokenBlocks: 8}
}

func pickOne(t *testing.T, p Policy, req *Request, eps ...*Endpoint) *Endpoint {
	t.Helper()
	e, err := p.Pick(context.Background(), req, eps)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestPrecisePrefixRoutesOnReportedBlocks: precise-prefix (and the scorer
// with precise_prefix) send the prompt to the engine that reported its
// blocks, predicting its cached tokens, where prefix-aware follows its
// own guess; without the prompt's tokens precise-prefix goes by the guess.
func TestPrecisePrefixRoutesOnReportedBlocks(t *testing.T) {
	for _, tc := range []struct {
		policy  string
		precise bool
		want    string
	}{
		{PrecisePrefixName, false, "a"},
		{ScorerName, true, "a"},
		{PrefixAwareName, false, "b"},
		{ScorerName, false, "b"},
	} {
		p, _, a, b, req := preciseSetup(t, tc.policy, tc.precise)
		if got := pickOne(t, p, req, a, b); got.Name() != tc.want {
			t.Errorf("%s (precise_prefix %v) picked %s, want %s", tc.policy, tc.precise, got.Name(), tc.want)
		}
		wantPred := -1
		if tc.want == "a" {
			wantPred = 8 * kvBS
		}
		if got := req.PredictedCached(); got != wantPred {
			t.Errorf("%s: predicted %d cached tokens, want %d", tc.policy, got, wantPred)
		}
		if tc.want == "a" && req.Known() != 0 {
			t.Errorf("%s: Known() = %d, want 0 (a was never sent the prompt's text)", tc.policy, req.Known())
		}
	}
	p, _, a, b, req := preciseSetup(t, PrecisePrefixName, false)
	req.TokenKeys, req.TokenBlocks = nil, 0
	if got := pickOne(t, p, req, a, b); got != b || req.PredictedCached() != -1 {
		t.Errorf("without token keys: picked %s predicting %d, want b (the approximate index) predicting -1", got.Name(), req.PredictedCached())
	}
}

// TestPrecisePrefixFallsBackWhenStale: an engine whose index is unknown
// (events lost: Drop) or stale (sent new blocks, silent past stale_after)
// is measured on the approximate index, and on its events again once they
// resume.
func TestPrecisePrefixFallsBackWhenStale(t *testing.T) {
	p, kv, a, _, req := preciseSetup(t, PrecisePrefixName, false)
	m := &p.(*PrefixAware).m
	measured := func(e *Endpoint) (precise, approx int) {
		pm := m.match(req, e, time.Now())
		return pm.precise, pm.approx
	}
	if pr, ap := measured(a); pr != 8 || ap != -1 {
		t.Fatalf("a fresh: measured %d precise, %d approx; want 8 on its events", pr, ap)
	}
	p.(*PrefixAware).Index().Record(req.PrefixHashes, a) // the gateway had sent a the prompt too
	kv.Drop(a, time.Now().Add(-time.Hour))               // lost an hour ago: its rebuilding time is over
	if pr, ap := measured(a); pr != -1 || ap != 10 {
		t.Fatalf("a's events lost: measured %d precise, %d approx; want the approximate index (10)", pr, ap)
	}
	kv.Apply(a, kvBatch(kvStored(100, 0, kvTokens(1, 8))), time.Now())
	if pr, _ := measured(a); pr != 8 {
		t.Fatalf("a's events back: measured %d precise, want 8", pr)
	}
	// Lost just now: the approximate index while the events rebuild the
	// engine's blocks (stale_after), even with a batch since.
	kv.Drop(a, time.Now())
	kv.Apply(a, kvBatch(kvStored(100, 0, kvTokens(1, 8))), time.Now())
	if pr, ap := measured(a); pr != -1 || ap != 10 {
		t.Fatalf("a's events lost just now: measured %d precise, %d approx; want the approximate index", pr, ap)
	}
	kv.Drop(a, time.Now().Add(-time.Hour))
	kv.Apply(a, kvBatch(kvStored(100, 0, kvTokens(1, 8))), time.Now())
	// a was sent a new prompt an hour ago and has published nothing since.
	kv.Speculate(kvKeys(kvTokens(5, 4), 0), a, time.Now().Add(-time.Hour))
	if pr, ap := measured(a); pr != -1 || ap != 10 {
		t.Errorf("a stale: measured %d precise, %d approx; want the approximate index (10)", pr, ap)
	}
	kv.Apply(a, kvBatch(kvStored(200, 0, kvTokens(5, 4))), time.Now())
	if pr, _ := measured(a); pr != 8 {
		t.Errorf("a's events resumed: measured %d precise, want 8", pr)
	}
}

// TestPrecisePrefixSpeculates: the engine picked for a new prompt holds
// it speculatively, so the same prompt again goes there before the
// engine's events arrive; the speculation ends with its TTL.
func TestPrecisePrefixSpeculates(t *testing.T) {
	kv := NewKVIndex(DefaultKVIndexConfig())
	p := NewPrecisePrefix(kv, kvBS, nil, 0.3, 16, 1.5, 2)
	eps := []*Endpoint{kvEndpoint("a"), kvEndpoint("b"), kvEndpoint("c")}
	for i, e := range eps {
		kv.Apply(e, kvBatch(kvStored(kvevents.Hash(1000*(i+1)), 0, kvTokens(uint32(10+i), 1))), time.Now())
	}
	keys := kvKeys(kvTokens(3, 6), 0)
	// Token keys only, no text blocks: the approximate index plays no part.
	first := pickOne(t, p, &Request{TokenKeys: keys, TokenBlocks: 6}, eps...)
	for range 20 {
		req := &Request{TokenKeys: keys, TokenBlocks: 6}
		if got := pickOne(t, p, req, eps...); got != first {
			t.Fatalf("the same prompt within the TTL went to %s, the first to %s", got.Name(), first.Name())
		}
		if req.PredictedCached() != 0 {
			t.Fatalf("predicted %d, want 0: the engine reported none of it (speculation is not a report)", req.PredictedCached())
		}
	}
	if n := kv.Match(keys, first, time.Now().Add(3*time.Second)); n != 0 {
		t.Errorf("after the 2 s TTL %s matches %d speculative blocks, want 0", first.Name(), n)
	}
}

// TestPrecisePrefixForgetUnspeculates: a pick whose attempt failed before
// the engine saw it takes back its speculative entries, so the next
// request with the prefix is not pulled to the failed engine.
func TestPrecisePrefixForgetUnspeculates(t *testing.T) {
	kv := NewKVIndex(DefaultKVIndexConfig())
	p := NewPrecisePrefix(kv, kvBS, nil, 0.3, 16, 1.5, 2)
	a, b := kvEndpoint("a"), kvEndpoint("b")
	for i, e := range []*Endpoint{a, b} {
		kv.Apply(e, kvBatch(kvStored(kvevents.Hash(1000*(i+1)), 0, kvTokens(uint32(10+i), 1))), time.Now())
	}
	keys := kvKeys(kvTokens(3, 6), 0)
	req := &Request{TokenKeys: keys, TokenBlocks: 6}
	first := pickOne(t, p, req, a, b)
	if n := kv.Match(keys, first, time.Now()); n != 6 {
		t.Fatalf("after the pick %s holds %d speculative blocks, want 6", first.Name(), n)
	}
	p.Forget(req, first)
	if n := kv.Match(keys, first, time.Now()); n != 0 {
		t.Errorf("after Forget %s holds %d speculative blocks, want 0", first.Name(), n)
	}
}
