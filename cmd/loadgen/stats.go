package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Summary describes a set of duration samples, in milliseconds.
type Summary struct {
	Count int     `json:"count"`   // number of samples
	Mean  float64 `json:"mean_ms"` // arithmetic mean, ms
	P50   float64 `json:"p50_ms"`  // exact percentiles (nearest rank), ms
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"` // largest sample, ms
}

// Summarize returns the exact summary of samples, which it sorts in place.
// Percentiles use the nearest-rank method: the p-th percentile is the
// smallest sample with at least p% of the samples at or below it.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum float64
	for _, d := range samples {
		sum += ms(d)
	}
	return Summary{
		Count: len(samples),
		Mean:  sum / float64(len(samples)),
		P50:   ms(Percentile(samples, 50)),
		P90:   ms(Percentile(samples, 90)),
		P99:   ms(Percentile(samples, 99)),
		Max:   ms(samples[len(samples)-1]),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, which must be sorted and not empty.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Report is the result of a run, as printed and as written with --json.
type Report struct {
	Mode        string  `json:"mode"`                  // "closed" or "open"
	Workload    string  `json:"workload"`              // Config.Workload
	Stream      bool    `json:"stream"`                // Config.Stream
	Concurrency int     `json:"concurrency,omitempty"` // closed loop: workers
	Rate        float64 `json:"rate,omitempty"`        // open loop: mean arrivals per second

	Requests  int `json:"requests"`  // measured requests
	Succeeded int `json:"succeeded"` // measured requests that completed
	Failed    int `json:"failed"`    // measured requests that failed, by Errors
	Warmup    int `json:"warmup"`    // warmup requests, not measured

	// ErrorRate is Failed over Requests (0 without requests), held to
	// MaxErrorRate, the --max-error-rate: see ErrorRateExceeded.
	ErrorRate    float64 `json:"error_rate"`
	MaxErrorRate float64 `json:"max_error_rate"`

	// DurationSeconds spans the first measured start to the last end.
	DurationSeconds float64 `json:"duration_s"`
	// RequestsPerSecond and OutputTokensPerSecond count successful
	// requests only.
	RequestsPerSecond     float64 `json:"requests_per_s"`
	OutputTokens          int     `json:"output_tokens"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`

	// TTFT, ITL and EndToEnd are over successful requests; TTFT and ITL
	// only exist for streams.
	TTFT     Summary `json:"ttft"`
	ITL      Summary `json:"itl"`
	EndToEnd Summary `json:"e2e"`

	// Errors counts failed requests by class, Statuses by HTTP status
	// (http_4xx and http_5xx), and ErrorSamples keeps the first message of
	// each class.
	Errors       map[string]int    `json:"errors"`
	Statuses     map[string]int    `json:"statuses"`
	ErrorSamples map[string]string `json:"error_samples"`

	// EngineRequests counts the measured requests, failed ones included,
	// by the engine their response named in the X-Switchboard-Engine
	// header: at most MaxEngineNames names, the rest under OtherEngines.
	// It is absent when no response named an engine (no gateway in front,
	// or its engine_header is off).
	EngineRequests map[string]int `json:"engine_requests,omitempty"`
	// BusiestEngineShare is the busiest engine's count in EngineRequests
	// over the mean per engine (1 = an even spread); the mean counts every
	// --engine-metrics URL as an engine even if it got no request. Absent
	// with EngineRequests.
	BusiestEngineShare float64 `json:"busiest_engine_share,omitempty"`
	// PrefixCache is the engines' prefix cache activity during the measured
	// requests, from --engine-metrics; absent without it.
	PrefixCache *PrefixCache `json:"prefix_cache,omitempty"`
	// Kinds gives each request kind of a mixed workload (--long-share),
	// "long" and "short", its own statistics; absent outside one.
	Kinds map[string]*KindReport `json:"kinds,omitempty"`
}

// KindReport is the statistics of one kind of request in a mixed workload:
// as the Report's, over that kind's measured requests; the rates are over
// the whole run's DurationSeconds.
type KindReport struct {
	Requests              int     `json:"requests"`
	Succeeded             int     `json:"succeeded"`
	Failed                int     `json:"failed"`
	RequestsPerSecond     float64 `json:"requests_per_s"`
	OutputTokens          int     `json:"output_tokens"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_s"`
	TTFT                  Summary `json:"ttft"`
	ITL                   Summary `json:"itl"`
	EndToEnd              Summary `json:"e2e"`
}

// aggregateKinds splits results by Kind into KindReports; nil when no
// result has a kind.
func aggregateKinds(results []*Result, window time.Duration) map[string]*KindReport {
	byKind := map[string][]*Result{}
	for _, res := range results {
		if res.Kind != "" {
			byKind[res.Kind] = append(byKind[res.Kind], res)
		}
	}
	if len(byKind) == 0 {
		return nil
	}
	kinds := make(map[string]*KindReport, len(byKind))
	for kind, rs := range byKind {
		k := &KindReport{Requests: len(rs)}
		var ok samples
		for _, res := range rs {
			if !res.OK() {
				k.Failed++
				continue
			}
			ok.add(res)
		}
		k.Succeeded, k.OutputTokens = ok.n, ok.tokens
		k.TTFT, k.ITL, k.EndToEnd = Summarize(ok.ttft), Summarize(ok.itl), Summarize(ok.e2e)
		if window > 0 {
			k.RequestsPerSecond = float64(k.Succeeded) / window.Seconds()
			k.OutputTokensPerSecond = float64(k.OutputTokens) / window.Seconds()
		}
		kinds[kind] = k
	}
	return kinds
}

// samples gathers the successful results' latencies and output tokens.
type samples struct {
	n, tokens      int
	ttft, itl, e2e []time.Duration
}

// add counts one successful result.
func (s *samples) add(res *Result) {
	s.n++
	s.tokens += res.OutputTokens
	s.e2e = append(s.e2e, res.Latency)
	if res.HasTTFT {
		s.ttft = append(s.ttft, res.TTFT)
	}
	s.itl = append(s.itl, res.ITL...)
}

// Aggregate builds the Report of results measured over window.
func Aggregate(cfg *Config, results []*Result, window time.Duration, warmup int) *Report {
	r := &Report{
		Mode:         "closed",
		Workload:     cfg.Workload,
		Stream:       cfg.Stream,
		Concurrency:  cfg.Concurrency,
		Requests:     len(results),
		Warmup:       warmup,
		Errors:       map[string]int{},
		Statuses:     map[string]int{},
		ErrorSamples: map[string]string{},
	}
	if cfg.OpenLoop() {
		r.Mode, r.Concurrency, r.Rate = "open", 0, cfg.Rate
	}
	var ok samples
	nITL := 0
	for _, res := range results {
		nITL += len(res.ITL)
	}
	ok.itl = make([]time.Duration, 0, nITL)
	for _, res := range results {
		if !res.OK() {
			r.Failed++
			r.Errors[res.Class]++
			if res.Class == ClassHTTP4xx || res.Class == ClassHTTP5xx {
				r.Statuses[strconv.Itoa(res.Status)]++
			}
			if _, ok := r.ErrorSamples[res.Class]; !ok && res.Err != nil {
				r.ErrorSamples[res.Class] = res.Err.Error()
			}
			continue
		}
		ok.add(res)
	}
	r.Succeeded, r.OutputTokens = ok.n, ok.tokens
	r.MaxErrorRate = cfg.MaxErrorRate
	if r.Requests > 0 {
		r.ErrorRate = float64(r.Failed) / float64(r.Requests)
	}
	r.TTFT, r.ITL, r.EndToEnd = Summarize(ok.ttft), Summarize(ok.itl), Summarize(ok.e2e)
	r.EngineRequests = countEngines(results)
	r.BusiestEngineShare = busiestShare(r.EngineRequests, len(cfg.EngineMetrics))
	r.Kinds = aggregateKinds(results, window)
	if window > 0 {
		r.DurationSeconds = window.Seconds()
		r.RequestsPerSecond = float64(r.Succeeded) / r.DurationSeconds
		r.OutputTokensPerSecond = float64(r.OutputTokens) / r.DurationSeconds
	}
	return r
}

// ErrorRateExceeded reports whether more of the measured requests failed
// than MaxErrorRate allows: with the default 0, whether any failed.
func (r *Report) ErrorRateExceeded() bool { return r.ErrorRate > r.MaxErrorRate }

// errorRateError is the error loadgen exits with when ErrorRateExceeded,
// nil when not: "3 of 40 measured requests failed (error rate 0.075),
// above --max-error-rate 0.05".
func (r *Report) errorRateError() error {
	if !r.ErrorRateExceeded() {
		return nil
	}
	return fmt.Errorf("%d of %d measured requests failed (error rate %.4g), above --max-error-rate %g", r.Failed, r.Requests, r.ErrorRate, r.MaxErrorRate)
}
