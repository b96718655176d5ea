package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
)

// WriteTable prints r as aligned text.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mode := fmt.Sprintf("closed loop, concurrency %d", r.Concurrency)
	if r.Mode == "open" {
		mode = fmt.Sprintf("open loop, rate %g/s", r.Rate)
	}
	fmt.Fprintf(tw, "mode\t%s, workload %s, stream %t\n", mode, r.Workload, r.Stream)
	fmt.Fprintf(tw, "requests\t%d (%d ok, %d failed, %d warmup)\n", r.Requests, r.Succeeded, r.Failed, r.Warmup)
	verdict := ""
	if r.ErrorRateExceeded() {
		verdict = ": above it, the run fails"
	}
	fmt.Fprintf(tw, "error rate\t%.4g (--max-error-rate %g%s)\n", r.ErrorRate, r.MaxErrorRate, verdict)
	fmt.Fprintf(tw, "duration\t%.3fs\n", r.DurationSeconds)
	fmt.Fprintf(tw, "throughput\t%.2f requests/s, %.2f output tokens/s (%d tokens)\n", r.RequestsPerSecond, r.OutputTokensPerSecond, r.OutputTokens)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "latency (ms)\tcount\tmean\tp50\tp90\tp99\tmax")
	for _, row := range []struct {
		name string
		s    Summary
	}{{"ttft", r.TTFT}, {"itl", r.ITL}, {"e2e", r.EndToEnd}} {
		s := row.s
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\n", row.name, s.Count, s.Mean, s.P50, s.P90, s.P99, s.Max)
	}
	for _, kind := range sortedKeys(r.Kinds) {
		k := r.Kinds[kind]
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "%s requests\t%d (%d ok, %d failed), %.2f requests/s, %.2f output tokens/s\n", kind, k.Requests, k.Succeeded, k.Failed, k.RequestsPerSecond, k.OutputTokensPerSecond)
		for _, row := range []struct {
			name string
			s    Summary
		}{{"ttft", k.TTFT}, {"itl", k.ITL}, {"e2e", k.EndToEnd}} {
			s := row.s
			fmt.Fprintf(tw, "%s %s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\n", kind, row.name, s.Count, s.Mean, s.P50, s.P90, s.P99, s.Max)
		}
	}
	if len(r.EngineRequests) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "engine\trequests")
		for _, name := range sortedKeys(r.EngineRequests) {
			fmt.Fprintf(tw, "%s\t%d\n", name, r.EngineRequests[name])
		}
		fmt.Fprintf(tw, "busiest/mean\t%.3f\n", r.BusiestEngineShare)
	}
	if pc := r.PrefixCache; pc != nil {
		fmt.Fprintln(tw)
		if pc.Error != "" {
			fmt.Fprintf(tw, "prefix cache\tunknown: %s\n", pc.Error)
		} else {
			fmt.Fprintln(tw, "prefix cache\thit rate\thit tokens\tqueried tokens")
			fmt.Fprintf(tw, "all (%d engines)\t%.2f%%\t%.0f\t%.0f\n", pc.Engines, 100*pc.HitRate, pc.HitTokens, pc.QueriedTokens)
			for _, e := range pc.PerEngine {
				fmt.Fprintf(tw, "%s\t%.2f%%\t%.0f\t%.0f\n", e.URL, 100*e.HitRate, e.HitTokens, e.QueriedTokens)
			}
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "errors\tcount\tfirst message")
		for _, class := range sortedKeys(r.Errors) {
			fmt.Fprintf(tw, "%s\t%d\t%s\n", class, r.Errors[class], r.ErrorSamples[class])
		}
		for _, st := range sortedKeys(r.Statuses) {
			fmt.Fprintf(tw, "  status %s\t%d\t\n", st, r.Statuses[st])
		}
	}
	return tw.Flush()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// WriteJSON writes r as indented JSON to w.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// writeJSONTo writes r to the --json destination: "-" is stdout.
func (r *Report) writeJSONTo(dest string, stdout io.Writer) (err error) {
	if dest == "-" {
		return r.WriteJSON(stdout)
	}
	f, err := os.Create(dest)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return r.WriteJSON(f)
}
