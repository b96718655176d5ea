package routing

import "time"

// inFlightLoad is the gateway's own load score of e:
// prefill*prefillWeight + decode.
func inFlightLoad(e *Endpoint, prefillWeight int64) int64 {
	pf, dc := e.InFlight()
	return pf*prefillWeight + dc
}

// queueDepth is e's queue depth as well as the gateway can tell at now:
// with fresh stats, the engine's vllm:num_requests_waiting plus the requests
// the gateway sent it since that scrape (the engine has not counted them
// yet, and a new request waits before it runs); without fresh stats, the
// gateway's own prefill count (requests sent that have produced no token:
// queued or prefilling).
func queueDepth(e *Endpoint, now time.Time) int64 {
	pf, dc := e.InFlight()
	if s := e.Stats(); s.Fresh(now) {
		return s.Waiting + max(pf+dc-s.InFlight, 0)
	}
	return pf
}

// kvUsage is e's KV-cache usage 0..1 from fresh stats, or -1 when unknown.
func kvUsage(e *Endpoint, now time.Time) float64 {
	if s := e.Stats(); s.Fresh(now) && s.KVCacheUsage >= 0 {
		return s.KVCacheUsage
	}
	return -1
}
