package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/switchboard-gw/switchboard/internal/vllmmetrics"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// statsBodyLimit caps one metrics body. vLLM's is a few hundred KiB (its
// histograms, per model); a larger one is refused, not parsed.
const statsBodyLimit = 4 << 20

// statsAccept asks for the text format vllmmetrics parses.
var statsAccept = []string{vllmmetrics.Accept}

var (
	// errNoEngineMetrics is a metrics page without the scheduler gauges:
	// not a vLLM engine (or a proxy's page), so nothing is stored rather
	// than a queue of 0 that was never reported.
	errNoEngineMetrics = errors.New("metrics have neither " + vllmmetrics.Running + " nor " + vllmmetrics.Waiting)
)

// parseEngineMetrics reads one engine's metrics page, of at most
// statsBodyLimit bytes. Errors: vllmmetrics.ErrTooLarge (with the limit), a
// malformed page, or errNoEngineMetrics for a page without the scheduler
// gauges.
func parseEngineMetrics(r io.Reader) (vllmmetrics.Sample, error) {
	s, err := vllmmetrics.Parse(r, statsBodyLimit)
	switch {
	case errors.Is(err, vllmmetrics.ErrTooLarge):
		return s, fmt.Errorf("%w (%d MiB)", err, statsBodyLimit>>20)
	case err != nil:
		return s, err
	case !s.HasScheduler:
		return s, errNoEngineMetrics
	}
	return s, nil
}

// prefixState is the prefix cache bookkeeping of one engine incarnation:
// the counters of its last successful scrape and the ratio derived so far.
// It is touched only under Fleet.statsMu.
type prefixState struct {
	hits, queries float64
	known         bool    // hits and queries hold a baseline
	ratio         float64 // -1 until two scrapes have shown queries
}

// update takes a new sample and returns the hit ratio to report: the
// growth of hits over the growth of queries since the previous successful
// scrape; the previous ratio when no query was made in between; -1 (and a
// new baseline) when a counter went down, which means the engine
// restarted, or when the engine stopped reporting the counters.
func (ps *prefixState) update(s vllmmetrics.Sample) float64 {
	if !s.HasPrefixHits || !s.HasPrefixQueries {
		*ps = prefixState{ratio: -1}
		return -1
	}
	hits, queries := s.PrefixHits, s.PrefixQueries
	switch {
	case !ps.known:
		ps.ratio = -1 // a baseline only
	case hits < ps.hits || queries < ps.queries:
		ps.ratio = -1 // a new process: its cache says nothing yet
	case queries > ps.queries:
		ps.ratio = min(max((hits-ps.hits)/(queries-ps.queries), 0), 1)
	}
	ps.hits, ps.queries, ps.known = hits, queries, true
	return ps.ratio
}

// ScrapeNow scrapes every engine's metrics once, concurrently, each bounded
// by EngineStatsConfig.Timeout, whether or not periodic scraping is
// enabled. A successful scrape stores new stats on the engine's
// routing.Endpoint (expiring after EngineStatsConfig.MaxAge); a failed one
// leaves the previous stats to expire and is logged at debug level. Then
// engines whose verdict changed (sleeping or self-reported unhealthy with
// fresh stats: no new requests) are taken out of or put back into routing.
// Scrapes never change an engine's health verdict, which the health probe
// owns. Safe for concurrent use; rounds do not overlap.
func (f *Fleet) ScrapeNow(ctx context.Context) {
	f.statsMu.Lock()
	defer f.statsMu.Unlock()
	f.forEachEngine(func(e *Engine) {
		err := f.scrape(ctx, e)
		switch {
		case err == nil:
			if e.statsFailing.Swap(false) {
				f.log.Info("engine stats scrape recovered", "engine", e.cfg.Name)
			}
		case ctx.Err() != nil: // shutting down
		case !e.statsFailing.Swap(true):
			// Once per failure streak: an operator whose engine answers
			// /metrics with 401 or 404 must learn that the stats-driven
			// policies run on the gateway's counters alone.
			f.log.Warn("engine stats scrape failing; routing uses the gateway's own counters for it until it recovers", "engine", e.cfg.Name, "error", err)
		default:
			f.log.Debug("engine stats scrape failed", "engine", e.cfg.Name, "error", err)
		}
	})
	f.applyStatsVerdicts()
}

// scrape reads one engine's metrics and stores its stats.
func (f *Fleet) scrape(ctx context.Context, e *Engine) error {
	if e.prov != nil {
		return nil // a provider publishes no vLLM stats
	}
	ctx, cancel := context.WithTimeout(ctx, f.stats.Timeout)
	defer cancel()
	resp, err := f.engineGet(ctx, f.statsClient, e, e.statsURL, f.stats.Path, statsAccept)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	s, err := parseEngineMetrics(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", f.stats.Path, err)
	}
	// The gateway's count right after the page was read, so the drift
	// compares two views of (nearly) the same moment.
	pf, dc := e.ep.InFlight()
	now := f.now()
	e.ep.SetStats(&routing.Stats{
		At:                  now,
		Expires:             now.Add(f.stats.MaxAge),
		Running:             s.Running,
		Waiting:             s.Waiting,
		KVCacheUsage:        s.KVCacheUsage,
		PrefixCacheHitRatio: e.prefix.update(s),
		Sleeping:            s.Sleeping,
		Unhealthy:           s.Unhealthy,
		InFlight:            pf + dc,
	})
	f.checkBlockSize(e, s.BlockSize)
	return nil
}

// statsBlocked reports whether st keeps its engine from new requests at
// now: fresh stats saying the engine sleeps or is unhealthy.
func statsBlocked(st *routing.Stats, now time.Time) bool {
	return st.Fresh(now) && (st.Sleeping || st.Unhealthy)
}

// applyStatsVerdicts recomputes every engine's stats verdict and rebuilds
// the routing snapshot when one changed. Stale stats stop blocking here,
// at the first round after they expire.
func (f *Fleet) applyStatsVerdicts() {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	changed := false
	for _, e := range f.engines {
		st := e.ep.Stats()
		blocked := statsBlocked(st, now)
		if blocked == e.blocked {
			continue
		}
		e.blocked, changed = blocked, true
		switch {
		case blocked && st.Sleeping:
			f.log.Info("engine sleeping: no new requests until it wakes", "engine", e.cfg.Name)
		case blocked:
			f.log.Warn("engine reports itself unhealthy: no new requests", "engine", e.cfg.Name)
		case st.Fresh(now):
			f.log.Info("engine awake and healthy again: back in routing", "engine", e.cfg.Name)
		default:
			f.log.Info("engine stats expired: back in routing, the health probe decides", "engine", e.cfg.Name)
		}
	}
	if changed {
		f.rebuildLocked()
	}
}

// ObserveStats reports the stats gauges of every engine with fresh stats
// (telemetry.Metrics ObserveEngineStats): queue depth, KV cache usage,
// prefix cache hit ratio and accounting drift.
func (f *Fleet) ObserveStats(report func(e *telemetry.Engine, s telemetry.EngineStats)) {
	now := f.now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.engines {
		st := e.ep.Stats()
		if !st.Fresh(now) {
			continue
		}
		report(e.tel, telemetry.EngineStats{
			QueueDepth:          st.Waiting,
			KVCacheUsage:        st.KVCacheUsage,
			PrefixCacheHitRatio: st.PrefixCacheHitRatio,
			AccountingDrift:     st.Running + st.Waiting - st.InFlight,
		})
	}
}

// EngineStatsStatus is an engine's last scraped stats as GET
// /admin/engines shows them.
type EngineStatsStatus struct {
	Running             int64    `json:"running"`                          // vllm:num_requests_running, requests
	Waiting             int64    `json:"waiting"`                          // vllm:num_requests_waiting, requests
	KVCacheUsage        *float64 `json:"kv_cache_usage,omitempty"`         // 0..1; absent when not reported
	PrefixCacheHitRatio *float64 `json:"prefix_cache_hit_ratio,omitempty"` // 0..1; absent until known
	Sleeping            bool     `json:"sleeping"`                         // vllm:engine_sleep_state says asleep
	EngineUnhealthy     bool     `json:"engine_unhealthy"`                 // vllm:engine_healthy reads 0
	GatewayInFlight     int64    `json:"gateway_in_flight"`                // the gateway's in-flight count at scrape time
	AgeSeconds          float64  `json:"age_seconds"`                      // time since the scrape, in seconds
	Fresh               bool     `json:"fresh"`                            // younger than engine_stats.max_age: trusted
}

// statsStatus returns st as the admin list shows it; nil for no stats.
func statsStatus(st *routing.Stats, now time.Time) *EngineStatsStatus {
	if st == nil {
		return nil
	}
	out := &EngineStatsStatus{Running: st.Running, Waiting: st.Waiting, Sleeping: st.Sleeping,
		EngineUnhealthy: st.Unhealthy, GatewayInFlight: st.InFlight,
		AgeSeconds: now.Sub(st.At).Seconds(), Fresh: st.Fresh(now)}
	if st.KVCacheUsage >= 0 {
		v := st.KVCacheUsage
		out.KVCacheUsage = &v
	}
	if st.PrefixCacheHitRatio >= 0 {
		v := st.PrefixCacheHitRatio
		out.PrefixCacheHitRatio = &v
	}
	return out
}
