package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/internal/vllmmetrics"
)

// scrapeTimeout bounds one /metrics scrape.
const scrapeTimeout = 10 * time.Second

// maxScrapeBytes bounds the /metrics body read from one engine.
const maxScrapeBytes = 32 << 20

// PrefixCache is the prefix cache activity of the engines during the
// measured requests: the growth of their counters between a scrape just
// before the first measured request and one after the last.
type PrefixCache struct {
	// Engines is the number of /metrics URLs scraped.
	Engines int `json:"engines"`
	// QueriedTokens and HitTokens are the growth of
	// vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total, in
	// prompt tokens, summed over the engines.
	QueriedTokens float64 `json:"queried_tokens"`
	HitTokens     float64 `json:"hit_tokens"`
	// HitRate is HitTokens / QueriedTokens, 0 when nothing was queried.
	HitRate float64 `json:"hit_rate"`
	// PerEngine holds each URL's share, in --engine-metrics order.
	PerEngine []EngineCache `json:"per_engine,omitempty"`
	// Error says why the figures are missing when a scrape failed.
	Error string `json:"error,omitempty"`
}

// EngineCache is one engine's prefix cache growth over the measured
// requests.
type EngineCache struct {
	URL           string  `json:"url"`            // the engine's /metrics URL
	QueriedTokens float64 `json:"queried_tokens"` // prompt tokens looked up, tokens
	HitTokens     float64 `json:"hit_tokens"`     // prompt tokens found cached, tokens
	HitRate       float64 `json:"hit_rate"`       // HitTokens / QueriedTokens, 0 when none
}

// prefixCounters are one engine's prefix cache counters at one scrape, in
// tokens.
type prefixCounters struct {
	queries, hits float64
}

// metricsScraper reads the prefix cache counters of a fixed list of engines.
// It is safe for concurrent use.
type metricsScraper struct {
	urls []string
	hc   *http.Client
}

// scrape reads the counters of every engine, in urls order. Any failure
// fails the whole scrape: a hit rate over some of the engines would be
// misleading.
func (s *metricsScraper) scrape(ctx context.Context) ([]prefixCounters, error) {
	out := make([]prefixCounters, len(s.urls))
	for i, u := range s.urls {
		c, err := s.scrapeOne(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", u, err)
		}
		out[i] = c
	}
	return out, nil
}

func (s *metricsScraper) scrapeOne(ctx context.Context, u string) (prefixCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return prefixCounters{}, err
	}
	req.Header.Set("Accept", vllmmetrics.Accept)
	resp, err := s.hc.Do(req)
	if err != nil {
		return prefixCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return prefixCounters{}, fmt.Errorf("status %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return parsePrefixCounters(resp.Body)
}

// parsePrefixCounters reads a metrics page (at most maxScrapeBytes) and
// returns its prefix cache counters, each the sum of all the series of its
// family (one per model_name in vLLM), the _total-suffixed family first. It
// fails when either counter is missing, the page is malformed or too large.
func parsePrefixCounters(r io.Reader) (prefixCounters, error) {
	s, err := vllmmetrics.Parse(r, maxScrapeBytes)
	if err != nil {
		return prefixCounters{}, err
	}
	if !s.HasPrefixQueries {
		return prefixCounters{}, fmt.Errorf("no %s_total metric (is prefix caching on?)", vllmmetrics.PrefixQueries)
	}
	if !s.HasPrefixHits {
		return prefixCounters{}, fmt.Errorf("no %s_total metric (is prefix caching on?)", vllmmetrics.PrefixHits)
	}
	return prefixCounters{queries: s.PrefixQueries, hits: s.PrefixHits}, nil
}

// prefixCacheGrowth builds the PrefixCache report of the engines at urls
// from the scrapes before and after the measured requests. A counter that
// went down was reset (the engine restarted), so its growth is its value
// after, as Prometheus's increase() assumes.
func prefixCacheGrowth(urls []string, before, after []prefixCounters) *PrefixCache {
	pc := &PrefixCache{Engines: len(urls)}
	growth := func(b, a float64) float64 {
		if a < b {
			return a
		}
		return a - b
	}
	for i, u := range urls {
		e := EngineCache{
			URL:           u,
			QueriedTokens: growth(before[i].queries, after[i].queries),
			HitTokens:     growth(before[i].hits, after[i].hits),
		}
		e.HitRate = ratio(e.HitTokens, e.QueriedTokens)
		pc.QueriedTokens += e.QueriedTokens
		pc.HitTokens += e.HitTokens
		pc.PerEngine = append(pc.PerEngine, e)
	}
	pc.HitRate = ratio(pc.HitTokens, pc.QueriedTokens)
	return pc
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
