package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// The vLLM metric names the scraper reads (vLLM v1, vllm/v1/metrics/loggers.py).
// Every series carries model_name (and, with data parallelism, engine).
const (
	metricRunning = "vllm:num_requests_running" // gauge, per model
	metricWaiting = "vllm:num_requests_waiting" // gauge, per model
	metricKVUsage = "vllm:kv_cache_usage_perc"  // gauge, 0..1
	// metricGPUCacheUsage is the name vLLM used for the KV cache usage
	// before vllm:kv_cache_usage_perc (removed in later versions).
	metricGPUCacheUsage = "vllm:gpu_cache_usage_perc"
	// The prefix cache counters, in tokens. prometheus_client exposes a
	// counter named vllm:prefix_cache_hits as vllm:prefix_cache_hits_total;
	// other exporters may drop the suffix, so both are read.
	metricPrefixHits    = "vllm:prefix_cache_hits"
	metricPrefixQueries = "vllm:prefix_cache_queries"
	// metricSleepState is vLLM's sleep gauge. PrometheusStatLogger in
	// vllm/v1/metrics/loggers.py (vllm-project/vllm) registers it with the
	// extra label sleep_state and three series per engine index, set by
	// record_sleep_state: sleep_state="awake" is 1 when awake and 0 while
	// sleeping; sleep_state="weights_offloaded" is 1 at sleep level 1
	// (weights moved to CPU); sleep_state="discard_all" is 1 at sleep level
	// 2 (weights discarded). Its help text: "awake = 0 means engine is
	// sleeping; awake = 1 means engine is awake; weights_offloaded = 1
	// means sleep level 1; discard_all = 1 means sleep level 2".
	metricSleepState = "vllm:engine_sleep_state"
	// metricEngineHealthy is exported by vLLM only with
	// --enable-fault-tolerance: vllm:engine_healthy{engine="<rank>"} is 1
	// while the rank is healthy and 0 when it is unhealthy or dead (vLLM
	// docs/usage/metrics.md, "Fault Tolerance Metrics": "exclude zero").
	metricEngineHealthy = "vllm:engine_healthy"
)

// statsBodyLimit caps one metrics body. vLLM's is a few hundred KiB (its
// histograms, per model); a larger one is refused, not parsed.
const statsBodyLimit = 4 << 20

// statsAccept asks for the classic Prometheus text format: prometheus_client
// (vLLM's exporter) answers OpenMetrics only when asked for it.
var statsAccept = []string{"text/plain;version=0.0.4;q=1,*/*;q=0.1"}

var (
	// errStatsTooLarge is a metrics body over statsBodyLimit.
	errStatsTooLarge = errors.New("metrics body over 4 MiB")
	// errNoEngineMetrics is a metrics page without the scheduler gauges:
	// not a vLLM engine (or a proxy's page), so nothing is stored rather
	// than a queue of 0 that was never reported.
	errNoEngineMetrics = errors.New("metrics have neither " + metricRunning + " nor " + metricWaiting)
)

// engineSample is what one metrics page says, before the deltas between
// two scrapes.
type engineSample struct {
	running, waiting int64   // summed over series, in requests
	kvUsage          float64 // max over series, 0..1; -1 when not reported
	hits, queries    float64 // prefix cache counters summed over series, in tokens
	hasPrefix        bool    // both prefix cache counters are reported
	sleeping         bool    // vllm:engine_sleep_state says the engine sleeps
	unhealthy        bool    // some vllm:engine_healthy series reads 0
}

// parseEngineMetrics reads a Prometheus text exposition and returns what
// the routing stats need. It fails on a malformed page and on one without
// vllm:num_requests_running and vllm:num_requests_waiting.
func parseEngineMetrics(r io.Reader) (engineSample, error) {
	// vLLM's names contain ':', which the legacy scheme allows too; UTF-8
	// validation also accepts the quoted names of newer exporters.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return engineSample{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := engineSample{kvUsage: -1}
	running, okR := sumOf(fams[metricRunning])
	waiting, okW := sumOf(fams[metricWaiting])
	if !okR && !okW {
		return engineSample{}, errNoEngineMetrics
	}
	s.running, s.waiting = requests(running), requests(waiting)

	kv := fams[metricKVUsage]
	if _, ok := sumOf(kv); !ok {
		kv = fams[metricGPUCacheUsage]
	}
	if v, ok := maxOf(kv); ok {
		s.kvUsage = min(max(v, 0), 1)
	}

	hits, okH := sumOf(counterFamily(fams, metricPrefixHits))
	queries, okQ := sumOf(counterFamily(fams, metricPrefixQueries))
	if okH && okQ {
		s.hits, s.queries, s.hasPrefix = hits, queries, true
	}

	if mf := fams[metricSleepState]; mf != nil {
		for _, m := range mf.GetMetric() {
			v, ok := valueOf(m)
			if !ok {
				continue
			}
			switch labelValue(m, "sleep_state") {
			case "awake":
				s.sleeping = s.sleeping || v == 0
			default:
				// weights_offloaded, discard_all, any later level, or a
				// plain level gauge without the label: sleeping above 0.
				s.sleeping = s.sleeping || v > 0
			}
		}
	}
	if mf := fams[metricEngineHealthy]; mf != nil {
		for _, m := range mf.GetMetric() {
			if v, ok := valueOf(m); ok && v == 0 {
				s.unhealthy = true
			}
		}
	}
	return s, nil
}

// counterFamily returns the family of a counter exposed as name_total or
// as name, preferring name_total.
func counterFamily(fams map[string]*dto.MetricFamily, name string) *dto.MetricFamily {
	if mf, ok := fams[name+"_total"]; ok {
		return mf
	}
	return fams[name]
}

// valueOf returns the value of a gauge, counter or untyped sample; false
// for other types and for NaN or infinite values.
func valueOf(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// sumOf sums the values of mf's series; false when mf has none.
func sumOf(mf *dto.MetricFamily) (float64, bool) {
	var sum float64
	found := false
	for _, m := range mf.GetMetric() {
		if v, ok := valueOf(m); ok {
			sum += v
			found = true
		}
	}
	return sum, found
}

// maxOf returns the largest value of mf's series; false when mf has none.
func maxOf(mf *dto.MetricFamily) (float64, bool) {
	best, found := 0.0, false
	for _, m := range mf.GetMetric() {
		if v, ok := valueOf(m); ok && (!found || v > best) {
			best, found = v, true
		}
	}
	return best, found
}

// labelValue returns the value of m's label called name, or "".
func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// requests rounds a gauge of requests to a whole, non-negative number.
func requests(v float64) int64 {
	if !(v > 0) {
		return 0
	}
	// Clamped: an engine's page is input, and a float beyond int64 would
	// convert to a platform-defined value and wrap the drift and scores.
	return int64(math.Round(min(v, 1<<31)))
}

// cappedReader reads at most limit bytes from r; reading beyond them
// fails with errStatsTooLarge (and sets over) as soon as r has more.
type cappedReader struct {
	r    io.Reader
	left int64
	over bool
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var one [1]byte
		n, err := c.r.Read(one[:])
		if n > 0 {
			c.over = true
			return 0, errStatsTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// prefixState is the prefix cache bookkeeping of one engine incarnation:
// the counters of its last successful scrape and the ratio derived so far.
// It is touched only under Pool.statsMu.
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
func (ps *prefixState) update(s engineSample) float64 {
	if !s.hasPrefix {
		*ps = prefixState{ratio: -1}
		return -1
	}
	switch {
	case !ps.known:
		ps.ratio = -1 // a baseline only
	case s.hits < ps.hits || s.queries < ps.queries:
		ps.ratio = -1 // a new process: its cache says nothing yet
	case s.queries > ps.queries:
		ps.ratio = min(max((s.hits-ps.hits)/(s.queries-ps.queries), 0), 1)
	}
	ps.hits, ps.queries, ps.known = s.hits, s.queries, true
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
func (p *Pool) ScrapeNow(ctx context.Context) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.mu.Lock()
	engines := make([]*engine, len(p.engines))
	copy(engines, p.engines)
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := p.scrape(ctx, e)
			switch {
			case err == nil:
				if e.statsFailing.Swap(false) {
					p.log.Info("engine stats scrape recovered", "engine", e.cfg.Name)
				}
			case ctx.Err() != nil: // shutting down
			case !e.statsFailing.Swap(true):
				// Once per failure streak: an operator whose engine answers
				// /metrics with 401 or 404 must learn that the stats-driven
				// policies run on the gateway's counters alone.
				p.log.Warn("engine stats scrape failing; routing uses the gateway's own counters for it until it recovers", "engine", e.cfg.Name, "error", err)
			default:
				p.log.Debug("engine stats scrape failed", "engine", e.cfg.Name, "error", err)
			}
		}()
	}
	wg.Wait()
	p.applyStatsVerdicts()
}

// scrape reads one engine's metrics and stores its stats.
func (p *Pool) scrape(ctx context.Context, e *engine) error {
	ctx, cancel := context.WithTimeout(ctx, p.stats.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.statsURL, nil)
	if err != nil {
		return err
	}
	req.Header["Accept"] = statsAccept
	if e.auth != nil {
		req.Header["Authorization"] = e.auth
	}
	resp, err := p.statsClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("GET %s: %w %d", p.stats.Path, errProbeStatus, resp.StatusCode)
	}
	body := &cappedReader{r: resp.Body, left: statsBodyLimit}
	s, err := parseEngineMetrics(body)
	if body.over {
		return fmt.Errorf("GET %s: %w", p.stats.Path, errStatsTooLarge)
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", p.stats.Path, err)
	}
	// The gateway's count right after the page was read, so the drift
	// compares two views of (nearly) the same moment.
	pf, dc := e.ep.InFlight()
	now := p.now()
	e.ep.SetStats(&routing.Stats{
		At:                  now,
		Expires:             now.Add(p.stats.MaxAge),
		Running:             s.running,
		Waiting:             s.waiting,
		KVCacheUsage:        s.kvUsage,
		PrefixCacheHitRatio: e.prefix.update(s),
		Sleeping:            s.sleeping,
		Unhealthy:           s.unhealthy,
		InFlight:            pf + dc,
	})
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
func (p *Pool) applyStatsVerdicts() {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for _, e := range p.engines {
		st := e.ep.Stats()
		blocked := statsBlocked(st, now)
		if blocked == e.blocked {
			continue
		}
		e.blocked, changed = blocked, true
		switch {
		case blocked && st.Sleeping:
			p.log.Info("engine sleeping: no new requests until it wakes", "engine", e.cfg.Name)
		case blocked:
			p.log.Warn("engine reports itself unhealthy: no new requests", "engine", e.cfg.Name)
		case st.Fresh(now):
			p.log.Info("engine awake and healthy again: back in routing", "engine", e.cfg.Name)
		default:
			p.log.Info("engine stats expired: back in routing, the health probe decides", "engine", e.cfg.Name)
		}
	}
	if changed {
		p.rebuildLocked()
	}
}

// observeStats reports the stats gauges of every engine with fresh stats.
func (p *Pool) observeStats(report func(e *telemetry.Engine, s telemetry.EngineStats)) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.engines {
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
