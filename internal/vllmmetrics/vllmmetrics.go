// Package vllmmetrics reads what a vLLM engine says about itself on its
// Prometheus /metrics page: its scheduler queue, KV cache, prefix cache,
// sleep state and health. The gateway's engine stats scraper and
// cmd/loadgen's prefix cache report both parse pages with it, so the two
// agree on every name and edge case.
package vllmmetrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The vLLM metric names read (vLLM v1, vllm/v1/metrics/loggers.py). Every
// series carries model_name (and, with data parallelism, engine).
const (
	// Running is a gauge of running sequences, per model, in requests.
	Running = "vllm:num_requests_running"
	// Waiting is a gauge of queued sequences, per model, in requests.
	Waiting = "vllm:num_requests_waiting"
	// KVCacheUsage is a gauge of the KV cache fraction in use, 0..1.
	KVCacheUsage = "vllm:kv_cache_usage_perc"
	// GPUCacheUsage is the name vLLM used for KVCacheUsage before it
	// (removed in later versions).
	GPUCacheUsage = "vllm:gpu_cache_usage_perc"
	// PrefixHits and PrefixQueries are the prefix cache counters, in prompt
	// tokens. prometheus_client exposes a counter named
	// vllm:prefix_cache_hits as vllm:prefix_cache_hits_total; other
	// exporters (and OpenMetrics family names) drop the suffix, so both
	// are read, the suffixed one first.
	PrefixHits    = "vllm:prefix_cache_hits"
	PrefixQueries = "vllm:prefix_cache_queries"
	// SleepState is vLLM's sleep gauge. PrometheusStatLogger in
	// vllm/v1/metrics/loggers.py (vllm-project/vllm) registers it with the
	// extra label sleep_state and three series per engine index, set by
	// record_sleep_state: sleep_state="awake" is 1 when awake and 0 while
	// sleeping; sleep_state="weights_offloaded" is 1 at sleep level 1
	// (weights moved to CPU); sleep_state="discard_all" is 1 at sleep level
	// 2 (weights discarded). Its help text: "awake = 0 means engine is
	// sleeping; awake = 1 means engine is awake; weights_offloaded = 1
	// means sleep level 1; discard_all = 1 means sleep level 2".
	SleepState = "vllm:engine_sleep_state"
	// EngineHealthy is exported by vLLM only with --enable-fault-tolerance:
	// vllm:engine_healthy{engine="<rank>"} is 1 while the rank is healthy
	// and 0 when it is unhealthy or dead (vLLM docs/usage/metrics.md,
	// "Fault Tolerance Metrics": "exclude zero").
	EngineHealthy = "vllm:engine_healthy"
	// CacheConfigInfo is vLLM's info gauge of its KV cache's settings, one
	// label each (vllm/v1/metrics/loggers.py, CacheConfig.metrics_info()):
	// its block_size label is the tokens per KV block.
	CacheConfigInfo = "vllm:cache_config_info"
)

// Accept is the Accept header value to send: it asks for the classic
// Prometheus text format, which prometheus_client (vLLM's exporter) serves
// unless OpenMetrics is asked for.
const Accept = "text/plain;version=0.0.4;q=1,*/*;q=0.1"

// ErrTooLarge is returned by [Parse] for a page over its byte limit.
var ErrTooLarge = errors.New("metrics body over the size limit")

// Sample is what one metrics page says.
type Sample struct {
	// Running and Waiting are Running and Waiting summed over their series
	// (models), rounded, never negative and at most 2^31, in requests.
	Running, Waiting int64
	// HasScheduler is true when the page has Running or Waiting: with
	// neither it is not a vLLM engine's page (or it is a proxy's).
	HasScheduler bool
	// KVCacheUsage is the largest KVCacheUsage series (else GPUCacheUsage),
	// clamped to 0..1; -1 when the page has neither.
	KVCacheUsage float64
	// PrefixHits and PrefixQueries are the prefix cache counters summed
	// over their series, in tokens; HasPrefixHits and HasPrefixQueries say
	// whether the page has each.
	PrefixHits, PrefixQueries       float64
	HasPrefixHits, HasPrefixQueries bool
	// Sleeping is true when SleepState says the engine sleeps: its awake
	// series is 0, or another series (a sleep level) is above 0.
	Sleeping bool
	// Unhealthy is true when some EngineHealthy series reads 0.
	Unhealthy bool
	// BlockSize is CacheConfigInfo's block_size label, the engine's KV
	// block size in tokens; 0 when the page has none (or it is not a
	// positive integer).
	BlockSize int
}

// Parse reads a Prometheus text exposition of at most limit bytes from r
// (limit <= 0: no limit). Errors: the page is malformed ("parse metrics:
// ..."), or longer than limit ([ErrTooLarge]; what was read is not
// parsed). NaN and infinite samples count as absent. An empty page is a
// valid page with nothing in it.
func Parse(r io.Reader, limit int64) (Sample, error) {
	var capped *cappedReader
	if limit > 0 {
		capped = &cappedReader{r: r, left: limit}
		r = capped
	}
	// vLLM's names contain ':', which the legacy scheme allows too; UTF-8
	// validation also accepts the quoted names of newer exporters.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if capped != nil && capped.over {
		return Sample{}, ErrTooLarge
	}
	if err != nil {
		return Sample{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := Sample{KVCacheUsage: -1}
	running, okR := sumOf(fams[Running])
	waiting, okW := sumOf(fams[Waiting])
	s.Running, s.Waiting, s.HasScheduler = requests(running), requests(waiting), okR || okW

	v, ok := maxOf(fams[KVCacheUsage])
	if !ok {
		v, ok = maxOf(fams[GPUCacheUsage])
	}
	if ok {
		s.KVCacheUsage = min(max(v, 0), 1)
	}

	s.PrefixHits, s.HasPrefixHits = sumOf(counterFamily(fams, PrefixHits))
	s.PrefixQueries, s.HasPrefixQueries = sumOf(counterFamily(fams, PrefixQueries))

	for _, m := range fams[SleepState].GetMetric() {
		v, ok := valueOf(m)
		if !ok {
			continue
		}
		switch labelValue(m, "sleep_state") {
		case "awake":
			s.Sleeping = s.Sleeping || v == 0
		default:
			// weights_offloaded, discard_all, any later level, or a plain
			// level gauge without the label: sleeping above 0.
			s.Sleeping = s.Sleeping || v > 0
		}
	}
	for _, m := range fams[EngineHealthy].GetMetric() {
		if v, ok := valueOf(m); ok && v == 0 {
			s.Unhealthy = true
		}
	}
	for _, m := range fams[CacheConfigInfo].GetMetric() {
		if n, err := strconv.Atoi(labelValue(m, "block_size")); err == nil && n > 0 && n <= 1<<20 {
			s.BlockSize = n
			break
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
	// Clamped: a page is input, and a float beyond int64 would convert to a
	// platform-defined value.
	return int64(math.Round(min(v, 1<<31)))
}

// cappedReader reads at most left bytes from r; reading beyond them fails
// with ErrTooLarge (and sets over) as soon as r has more.
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
			return 0, ErrTooLarge
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
