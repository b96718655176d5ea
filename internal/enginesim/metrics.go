package enginesim

import (
	"math"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names exported on /metrics. The vllm: names and their model_name label follow vLLM
// v1, so code that scrapes a real engine can scrape the simulator.
const (
	// MetricNumRequestsRunning is a gauge of running sequences, in requests.
	MetricNumRequestsRunning = "vllm:num_requests_running"
	// MetricNumRequestsWaiting is a gauge of sequences queued for a running slot, in requests.
	MetricNumRequestsWaiting = "vllm:num_requests_waiting"
	// MetricKVCacheUsagePerc is a gauge of the KV cache fraction in use, 0..1 (1 = 100%).
	MetricKVCacheUsagePerc = "vllm:kv_cache_usage_perc"
	// MetricPrefixCacheQueries is a counter of prompt tokens looked up in the prefix cache, in
	// tokens.
	MetricPrefixCacheQueries = "vllm:prefix_cache_queries_total"
	// MetricPrefixCacheHits is a counter of prompt tokens found in the prefix cache, in tokens.
	MetricPrefixCacheHits = "vllm:prefix_cache_hits_total"
	// MetricRequestSuccess is a counter of completed requests, in requests, with the extra
	// label finished_reason ("stop" or "length").
	MetricRequestSuccess = "vllm:request_success_total"
	// MetricPromptTokens is a counter of prefilled prompt tokens, in tokens.
	MetricPromptTokens = "vllm:prompt_tokens_total"
	// MetricGenerationTokens is a counter of generated tokens, in tokens.
	MetricGenerationTokens = "vllm:generation_tokens_total"
	// MetricTimeToFirstToken is a histogram of the time from request arrival to the first
	// generated token, in seconds.
	MetricTimeToFirstToken = "vllm:time_to_first_token_seconds"
	// MetricEngineSleepState is a gauge of the sleep mode, one series per sleep_state label
	// value: "awake" is 1 while the engine is awake, "weights_offloaded" (sleep level 1) or
	// "discard_all" (level 2) is 1 while it sleeps. As in vLLM it also carries engine="0".
	MetricEngineSleepState = "vllm:engine_sleep_state"
	// MetricCacheConfigInfo is vLLM's info gauge of the KV cache's configuration: value 1,
	// one label per setting (vllm/v1/metrics/loggers.py log_metrics_info("cache_config", ...),
	// CacheConfig.metrics_info()), of which the simulator sets block_size, num_gpu_blocks and
	// enable_prefix_caching.
	MetricCacheConfigInfo = "vllm:cache_config_info"
	// MetricNixlFailedTransfers is a counter of a decode engine's failed KV pulls, in
	// requests, with engine="0", as vLLM's NIXL connector exports it (vLLM's
	// vllm:nixl_num_failed_transfers, nixl_connector.py; prometheus_client adds _total).
	MetricNixlFailedTransfers = "vllm:nixl_num_failed_transfers_total"
	// MetricNixlExpiredReqs is a counter of a prefill engine's KV holds freed because
	// their lease ended before a decode engine pulled them, in requests, with engine="0"
	// (vLLM's vllm:nixl_num_kv_expired_reqs).
	MetricNixlExpiredReqs = "vllm:nixl_num_kv_expired_reqs_total"
	// MetricAbortedRequests is a counter of requests aborted because the client went away, in
	// requests (simulator only).
	MetricAbortedRequests = "enginesim_aborted_requests_total"
	// MetricFaultedRequests is a counter of requests ended by an injected fault, in requests
	// (simulator only).
	MetricFaultedRequests = "enginesim_faulted_requests_total"
)

// ttftBuckets are vLLM's buckets for vllm:time_to_first_token_seconds, in seconds.
var ttftBuckets = []float64{
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
	2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
}

// modelState is the per-model bookkeeping: scheduler counts and metric handles bound to the
// model's model_name label, created once in New so the request path does no label lookups.
type modelState struct {
	name   string
	counts modelCounts

	promptTokens prometheus.Counter
	genTokens    prometheus.Counter
	successStop  prometheus.Counter
	successLen   prometheus.Counter
	pcQueries    prometheus.Counter
	pcHits       prometheus.Counter
	aborted      prometheus.Counter
	faulted      prometheus.Counter
	ttft         prometheus.Observer
}

// newMetrics builds the engine's registry and one modelState per served model.
func newMetrics(e *Engine) (*prometheus.Registry, map[string]*modelState) {
	reg := prometheus.NewRegistry()
	label := []string{"model_name"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	promptTokens := counter(MetricPromptTokens, "Number of prefill tokens processed.", label...)
	genTokens := counter(MetricGenerationTokens, "Number of generation tokens processed.", label...)
	success := counter(MetricRequestSuccess, "Count of successfully processed requests.", "model_name", "finished_reason")
	pcQueries := counter(MetricPrefixCacheQueries, "Prefix cache queries, in terms of number of queried tokens.", label...)
	pcHits := counter(MetricPrefixCacheHits, "Prefix cache hits, in terms of number of cached tokens.", label...)
	aborted := counter(MetricAbortedRequests, "Requests aborted because the client went away (simulator only).", label...)
	faulted := counter(MetricFaultedRequests, "Requests ended by an injected fault (simulator only).", label...)
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricTimeToFirstToken,
		Help:    "Histogram of time to first token in seconds.",
		Buckets: ttftBuckets,
	}, label)
	reg.MustRegister(ttft)
	reg.MustRegister(&stateCollector{e: e})

	models := make(map[string]*modelState, len(e.cfg.Models))
	for _, name := range e.cfg.Models {
		models[name] = &modelState{
			name:         name,
			promptTokens: promptTokens.WithLabelValues(name),
			genTokens:    genTokens.WithLabelValues(name),
			successStop:  success.WithLabelValues(name, finishStop),
			successLen:   success.WithLabelValues(name, finishLength),
			pcQueries:    pcQueries.WithLabelValues(name),
			pcHits:       pcHits.WithLabelValues(name),
			aborted:      aborted.WithLabelValues(name),
			faulted:      faulted.WithLabelValues(name),
			ttft:         ttft.WithLabelValues(name),
		}
	}
	return reg, models
}

var (
	descRunning = prometheus.NewDesc(MetricNumRequestsRunning,
		"Number of requests in model execution batches.", []string{"model_name"}, nil)
	descWaiting = prometheus.NewDesc(MetricNumRequestsWaiting,
		"Number of requests waiting to be processed.", []string{"model_name"}, nil)
	descKVUsage = prometheus.NewDesc(MetricKVCacheUsagePerc,
		"KV-cache usage. 1 means 100 percent usage.", []string{"model_name"}, nil)
	descSleepState = prometheus.NewDesc(MetricEngineSleepState,
		"Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "+
			"weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
		[]string{"model_name", "engine", "sleep_state"}, nil)
	descNixlFailed = prometheus.NewDesc(MetricNixlFailedTransfers,
		"Number of failed NIXL KV Cache transfers.", []string{"model_name", "engine"}, nil)
	descNixlExpired = prometheus.NewDesc(MetricNixlExpiredReqs,
		"Number of requests that had their KV expire.", []string{"model_name", "engine"}, nil)
	descCacheConfig = prometheus.NewDesc(MetricCacheConfigInfo,
		"Information of the LLMEngine CacheConfig", []string{"block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"}, nil)
)

// sleepStates are the sleep_state label values, in vLLM's order.
var sleepStates = []string{sleepAwake, sleepWeightsOffloaded, sleepDiscardAll}

// stateCollector reports the gauges from live engine state at scrape time, so they can never
// drift from the scheduler.
type stateCollector struct{ e *Engine }

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRunning
	ch <- descWaiting
	ch <- descKVUsage
	ch <- descSleepState
	ch <- descNixlFailed
	ch <- descNixlExpired
	ch <- descCacheConfig
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.e.cfg.Models {
		m := c.e.models[name]
		ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(m.counts.running.Load()), name)
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(m.counts.waiting.Load()), name)
	}
	// The KV cache is shared by all models, so it is reported once, under the first served
	// model name (vLLM labels every metric with its first served model name).
	// Expired KV holds are freed first, so neither the usage nor the counters are a scrape
	// late.
	c.e.kvHeld()
	ch <- prometheus.MustNewConstMetric(descKVUsage, prometheus.GaugeValue, c.e.kvCacheUsage(), c.e.cfg.Models[0])
	// The KV transfer counters are the engine's, under the first served model in engine 0.
	ch <- prometheus.MustNewConstMetric(descNixlFailed, prometheus.CounterValue, float64(c.e.kv.failedTransfers.Load()), c.e.cfg.Models[0], "0")
	ch <- prometheus.MustNewConstMetric(descNixlExpired, prometheus.CounterValue, float64(c.e.kv.leasesExpired.Load()), c.e.cfg.Models[0], "0")
	// The engine sleeps as a whole: one series per state, under the first served model, in
	// vLLM's engine 0.
	ch <- prometheus.MustNewConstMetric(descCacheConfig, prometheus.GaugeValue, 1,
		strconv.Itoa(c.e.cfg.BlockSize), "True", "0", strconv.Itoa(c.e.cfg.KVCacheBlocks))
	g := c.e.sleepGauges()
	for _, s := range sleepStates {
		ch <- prometheus.MustNewConstMetric(descSleepState, prometheus.GaugeValue, g[s], c.e.cfg.Models[0], "0", s)
	}
}

// kvCacheUsage returns the fraction of KV cache blocks held by running sequences, 0..1.
func (e *Engine) kvCacheUsage() float64 {
	return math.Min(1, float64(e.kvBlocks.Load())/float64(e.cfg.KVCacheBlocks))
}
