package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// run parses args, runs the load and writes the report. When ctx ends the
// run stops, requests in flight are abandoned, and the report covers the
// requests that had finished.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = max(cfg.Concurrency, 256)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	runner := NewRunner(cfg, newWorkload(cfg), NewClient(cfg, hc))

	var cache *cacheWatch
	if len(cfg.EngineMetrics) > 0 {
		var err error
		if cache, err = watchCache(ctx, &metricsScraper{urls: cfg.EngineMetrics, hc: hc}, runner); err != nil {
			return err
		}
	}

	stopProgress := func() {}
	if isTerminal(stderr) {
		stopProgress = startProgress(stderr, runner)
	}
	results, window := runner.Run(ctx)
	stopProgress()

	report := Aggregate(cfg, results, window, runner.Warmup())
	if cache != nil {
		// The run's context may be over (SIGINT): the report still wants
		// the counters.
		report.PrefixCache = cache.end(context.WithoutCancel(ctx))
	}
	// With --json - stdout carries only the JSON, so it can be piped.
	table := stdout
	if cfg.JSON == "-" {
		table = stderr
	}
	if err := report.WriteTable(table); err != nil {
		return err
	}
	if cfg.JSON != "" {
		if err := report.writeJSONTo(cfg.JSON, stdout); err != nil {
			return fmt.Errorf("writing --json: %w", err)
		}
	}
	var errs []error
	if pc := report.PrefixCache; pc != nil && pc.Error != "" {
		errs = append(errs, fmt.Errorf("--engine-metrics: %s", pc.Error))
	}
	return errors.Join(append(errs, report.errorRateError())...)
}

// cacheWatch takes the engines' prefix cache counters around the measured
// requests of a run.
type cacheWatch struct {
	s *metricsScraper

	// Written by the runner's BeforeMeasured hook; read after Run returns,
	// which waits for the request that ran the hook.
	started   bool
	before    []prefixCounters
	beforeErr error
}

// watchCache scrapes every engine once, so a wrong URL fails the run before
// any load is sent, and makes r snapshot the counters right before its
// measured requests.
func watchCache(ctx context.Context, s *metricsScraper, r *Runner) (*cacheWatch, error) {
	if _, err := s.scrape(ctx); err != nil {
		return nil, fmt.Errorf("--engine-metrics: %w", err)
	}
	w := &cacheWatch{s: s}
	r.BeforeMeasured(func() {
		w.started = true
		w.before, w.beforeErr = s.scrape(ctx)
	})
	return w, nil
}

// end scrapes the counters again, after the run, and returns their growth
// over the measured requests.
func (w *cacheWatch) end(ctx context.Context) *PrefixCache {
	fail := func(msg string) *PrefixCache { return &PrefixCache{Engines: len(w.s.urls), Error: msg} }
	switch {
	case !w.started:
		return fail("the run ended before its measured requests started")
	case w.beforeErr != nil:
		return fail("scrape before the measured requests: " + w.beforeErr.Error())
	}
	after, err := w.s.scrape(ctx)
	if err != nil {
		return fail("scrape after the measured requests: " + err.Error())
	}
	return prefixCacheGrowth(w.s.urls, w.before, after)
}
