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
	runner := NewRunner(cfg, newWorkload(cfg), NewClient(cfg, &http.Client{Transport: tr}))

	stopProgress := func() {}
	if isTerminal(stderr) {
		stopProgress = startProgress(stderr, runner)
	}
	results, window := runner.Run(ctx)
	stopProgress()

	report := Aggregate(cfg, results, window, runner.Warmup())
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
	return nil
}
