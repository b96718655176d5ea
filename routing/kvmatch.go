package routing

import "time"

// KVRouter is implemented by policies that route on what the engines
// report they hold in their KV caches (vLLM's KV-cache events, indexed in
// a [KVIndex]): [PrecisePrefixName], and [Scorer] with
// routing.scorer.precise_prefix. For them the gateway sets
// [Request.TokenKeys] when it knows the prompt's tokens.
type KVRouter interface {
	// KVBlockSize returns the tokens per block the request's
	// [Request.TokenKeys] must be cut into (kv_events.block_size, the
	// engines' --block-size), or 0 when the policy does not use them.
	KVBlockSize() int
}

// prefixMatcher measures how much of a request's prompt an engine holds,
// for the prefix policies. With a [KVIndex] (precise), an engine whose
// events are fresh ([KVIndex.Fresh]) is measured on the prompt's token
// blocks against what it reported storing; any other engine, and every
// engine when the request's tokens are unknown, on the prompt's text
// blocks against the approximate [PrefixIndex] of where the gateway sent
// them. So an engine whose events stopped falls back on its own, and comes
// back when they resume.
type prefixMatcher struct {
	approx    *PrefixIndex
	kv        *KVIndex // nil: approximate only
	blockSize int      // tokens per block of Request.TokenKeys
}

// prefixMatch is one engine's match: frac is the fraction of the prompt it
// holds, 0..1; approx is how many leading text blocks the approximate index
// has for it (-1 when not looked up); precise how many leading token blocks
// it reported (-1 when not used).
type prefixMatch struct {
	frac            float64
	approx, precise int
}

// precise reports whether the request can be measured on token blocks.
func (m *prefixMatcher) precise(req *Request) bool {
	return m.kv != nil && len(req.TokenKeys) > 0
}

// match returns e's match for req at now. It does not allocate.
func (m *prefixMatcher) match(req *Request, e *Endpoint, now time.Time) prefixMatch {
	if e.External() {
		return prefixMatch{approx: 0, precise: -1}
	}
	if m.precise(req) && m.kv.Fresh(e, now) {
		n := m.kv.Match(req.TokenKeys, e, now)
		return prefixMatch{frac: float64(n) / float64(max(req.TokenBlocks, len(req.TokenKeys))), approx: -1, precise: n}
	}
	if len(req.PrefixHashes) == 0 || m.approx == nil {
		return prefixMatch{approx: 0, precise: -1}
	}
	n := m.approx.Match(req.PrefixHashes, e)
	return prefixMatch{frac: float64(n) / float64(len(req.PrefixHashes)), approx: n, precise: -1}
}

// now is the time a pick measures engines at: time.Now with a KV index
// (freshness and speculation are timed), the zero time without one,
// which the approximate index does not read.
func (m *prefixMatcher) now() time.Time {
	if m.kv == nil {
		return time.Time{}
	}
	return time.Now()
}

// picked records that pick was chosen for req with match pm: the prompt's
// text blocks go into the approximate index (which an engine falls back
// on), and with token keys known, speculative entries go into the KV index
// ([KVIndex.Speculate]); req notes what a Forget and the gateway's
// prediction check need. It does not allocate.
func (m *prefixMatcher) picked(req *Request, pick *Endpoint, pm prefixMatch, now time.Time) {
	req.predicted = 0
	if pick.External() {
		// A provider's cache is not ours to route to: nothing recorded,
		// and nothing to forget (req.known covers every block).
		req.known = len(req.PrefixHashes)
		return
	}
	if m.approx != nil {
		known := pm.approx
		if known < 0 {
			known = m.approx.Match(req.PrefixHashes, pick)
		}
		req.known = known
		m.approx.Record(req.PrefixHashes, pick)
	}
	if m.precise(req) {
		if pm.precise >= 0 {
			// From what the engine reported, speculation aside: the
			// prediction checks the engine's reports.
			req.predicted = m.kv.MatchStored(req.TokenKeys, pick)*m.blockSize + 1
		}
		m.kv.Speculate(req.TokenKeys, pick, now)
	}
}

// forget undoes what picked recorded for e beyond what e already had: the
// text blocks in the approximate index past req.known, and the speculative
// entries of the token blocks. It does not allocate.
func (m *prefixMatcher) forget(req *Request, e *Endpoint) {
	if e.External() {
		return
	}
	if m.approx != nil && req.known < len(req.PrefixHashes) {
		m.approx.Forget(req.PrefixHashes[req.known:], e)
	}
	if m.precise(req) {
		m.kv.Unspeculate(req.TokenKeys, e)
	}
}
