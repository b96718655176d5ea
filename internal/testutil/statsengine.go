package testutil

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
)

// VLLMPage is a /metrics page shaped like vLLM v1's prometheus_client
// output (abridged): two served models, counters exposed with _total and
// their _created companions, a histogram, the sleep-state gauge with its
// three sleep_state series, and the help and type comments.
const VLLMPage = `# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="0",model_name="lora-a"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:num_requests_waiting{engine="0",model_name="lora-a"} 4.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="discard_all"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0
vllm:prefix_cache_queries_total{engine="0",model_name="lora-a"} 24.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 600.0
vllm:prefix_cache_hits_total{engine="0",model_name="lora-a"} 16.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
`

// SleepPage returns a page of one engine at the given vLLM sleep level (0
// awake, 1 weights offloaded, 2 discard all), as record_sleep_state sets
// the three series.
func SleepPage(level int) string {
	awake, offloaded, discard := 1, 0, 0
	switch level {
	case 1:
		awake, offloaded = 0, 1
	case 2:
		awake, discard = 0, 1
	}
	return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} %d.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} %d.0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} %d.0
`, awake, offloaded, discard)
}

// MetricsMode is what a StatsEngine's /metrics does.
type MetricsMode int32

// The MetricsModes (StatsEngine.SetMode).
const (
	MetricsServe MetricsMode = iota // the current page
	MetricsFail                     // 500
	MetricsHang                     // nothing until the scraper gives up
)

// StatsEngine is a test engine's /health, /v1/models and /metrics. Its
// page and mode can be changed at any time.
type StatsEngine struct {
	models  []string
	page    atomic.Pointer[string]
	mode    atomic.Int32
	scrapes atomic.Int64
	auth    atomic.Pointer[string] // the Authorization header of the last scrape
	next    http.HandlerFunc       // the /v1/ handler; nil: 404
}

// NewStatsEngine returns a StatsEngine serving models and page.
func NewStatsEngine(page string, models ...string) *StatsEngine {
	e := &StatsEngine{models: models}
	e.SetPage(page)
	return e
}

// SetPage sets the /metrics page.
func (e *StatsEngine) SetPage(p string) { e.page.Store(&p) }

// SetMode sets what /metrics does.
func (e *StatsEngine) SetMode(m MetricsMode) { e.mode.Store(int32(m)) }

// LastAuth returns the Authorization header of the last scrape.
func (e *StatsEngine) LastAuth() string { return *e.auth.Load() }

// HandleV1 sets the handler of every other /v1/ path (404 without one).
// Set it before serving.
func (e *StatsEngine) HandleV1(h http.HandlerFunc) { e.next = h }

// Scrapes returns how many times /metrics was asked for.
func (e *StatsEngine) Scrapes() int64 { return e.scrapes.Load() }

// ServeHTTP serves /health, /v1/models, /metrics and HandleV1's paths.
func (e *StatsEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/health":
	case r.URL.Path == "/v1/models":
		var data []map[string]string
		for _, m := range e.models {
			data = append(data, map[string]string{"id": m, "object": "model"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	case r.URL.Path == "/metrics":
		e.scrapes.Add(1)
		a := r.Header.Get("Authorization")
		e.auth.Store(&a)
		switch MetricsMode(e.mode.Load()) {
		case MetricsFail:
			http.Error(w, "boom", http.StatusInternalServerError)
		case MetricsHang:
			<-r.Context().Done()
		default:
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = io.WriteString(w, *e.page.Load())
		}
	case strings.HasPrefix(r.URL.Path, "/v1/") && e.next != nil:
		e.next(w, r)
	default:
		http.NotFound(w, r)
	}
}
