package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestSummarize(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	got := Summarize(samples)
	want := Summary{Count: 100, Mean: 50.5, P50: 50, P90: 90, P99: 99, Max: 100}
	if got != want {
		t.Errorf("Summarize(1..100 ms) = %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{[]time.Duration{7}, 50, 7},
		{[]time.Duration{7}, 99, 7},
		{[]time.Duration{1, 2}, 50, 1},
		{[]time.Duration{1, 2}, 51, 2},
		{[]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9},
		{[]time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 10},
		{[]time.Duration{1, 2, 3}, 100, 3},
	} {
		if got := Percentile(tc.samples, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %g) = %v, want %v", tc.samples, tc.p, got, tc.want)
		}
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Errorf("Summarize(nil) = %+v", got)
	}
}

func TestAggregate(t *testing.T) {
	cfg := &Config{Workload: FixedName, Concurrency: 2, Stream: true}
	start := time.Unix(1000, 0)
	results := []*Result{
		{Start: start, Latency: 2 * time.Second, TTFT: time.Second, HasTTFT: true, ITL: []time.Duration{time.Millisecond}, OutputTokens: 10},
		{Start: start.Add(time.Second), Latency: 3 * time.Second, TTFT: 3 * time.Second, HasTTFT: true, OutputTokens: 30},
		{Start: start, Latency: time.Second, Class: ClassHTTP5xx, Status: 502, Err: errors.New("bad gateway")},
		{Start: start, Latency: time.Second, Class: ClassHTTP5xx, Status: 500, Err: errors.New("boom")},
	}
	rep := Aggregate(cfg, results, window(results), 3)
	if rep.DurationSeconds != 4 || rep.RequestsPerSecond != 0.5 || rep.OutputTokensPerSecond != 10 || rep.OutputTokens != 40 {
		t.Errorf("throughput: %+v", rep)
	}
	if rep.Requests != 4 || rep.Succeeded != 2 || rep.Failed != 2 || rep.Warmup != 3 {
		t.Errorf("counts: %+v", rep)
	}
	if rep.TTFT.P50 != 1000 || rep.TTFT.Max != 3000 || rep.EndToEnd.Mean != 2500 || rep.ITL.Count != 1 {
		t.Errorf("summaries: ttft %+v e2e %+v itl %+v", rep.TTFT, rep.EndToEnd, rep.ITL)
	}
	if !reflect.DeepEqual(rep.Errors, map[string]int{ClassHTTP5xx: 2}) || !reflect.DeepEqual(rep.Statuses, map[string]int{"500": 1, "502": 1}) ||
		rep.ErrorSamples[ClassHTTP5xx] != "bad gateway" {
		t.Errorf("errors %v statuses %v samples %v", rep.Errors, rep.Statuses, rep.ErrorSamples)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"0.50 requests/s", "10.00 output tokens/s", "http_5xx", "status 502", "ttft "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}

func TestRunJSONRoundTrip(t *testing.T) {
	srv := serve(t, newSim(t))
	path := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"--url", srv.URL, "--model", "m", "--stream", "--requests", "6",
		"--concurrency", "2", "--max-tokens", "3", "--json", path}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "latency (ms)") || !strings.Contains(stdout.String(), "6 ok") {
		t.Errorf("table:\n%s", stdout.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr is not a terminal but got %q", stderr.String())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Requests != 6 || rep.Succeeded != 6 || rep.OutputTokens != 18 || rep.TTFT.Count != 6 || rep.ITL.Count != 12 {
		t.Errorf("decoded report: %+v", rep)
	}
	var again bytes.Buffer
	if err := rep.WriteJSON(&again); err != nil {
		t.Fatal(err)
	}
	if again.String() != string(data) {
		t.Errorf("JSON does not round-trip:\n%s\nvs\n%s", data, again.String())
	}

	// --json - puts only JSON on stdout.
	stdout.Reset()
	stderr.Reset()
	if err := run(context.Background(), []string{"--url", srv.URL, "--requests", "2", "--json", "-"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Succeeded != 2 {
		t.Errorf("--json -: %v, %+v\n%s", err, rep, stdout.String())
	}
	if !strings.Contains(stderr.String(), "latency (ms)") {
		t.Errorf("--json -: table not on stderr: %q", stderr.String())
	}
}

func TestOpenLoop(t *testing.T) {
	var got atomic.Int64
	sim := newSim(t)
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		sim.ServeHTTP(w, r)
	}))
	results, rep := load(t, context.Background(), srv.URL, "--rate", "2000", "--requests", "25", "--warmup", "5",
		"--stream", "--max-tokens", "2")
	if len(results) != 25 || rep.Succeeded != 25 || rep.Warmup != 5 || rep.Mode != "open" || rep.Rate != 2000 {
		t.Errorf("%d results, report %+v", len(results), rep)
	}
	if got.Load() != 30 {
		t.Errorf("server got %d requests, want 25 + 5 warmup", got.Load())
	}
	// Open loop with conversations: arrivals wait for an idle conversation.
	results, rep = load(t, context.Background(), srv.URL, "--rate", "5000", "--requests", "10", "--stream",
		"--workload", "conversations", "--conversations", "2", "--turns", "2", "--system-prompt-words", "5")
	if len(results) != 10 || rep.Succeeded != 10 {
		t.Errorf("conversations: %d results, %d ok", len(results), rep.Succeeded)
	}
}

func TestDuration(t *testing.T) {
	srv := serve(t, newSim(t))
	results, rep := load(t, context.Background(), srv.URL, "--duration", "30ms", "--concurrency", "2", "--stream", "--max-tokens", "2")
	if len(results) == 0 || rep.Failed != 0 {
		t.Errorf("%d results, %d failed; want some, none failed", len(results), rep.Failed)
	}
}

func TestCancel(t *testing.T) {
	rec := &recorder{next: newSim(t), got: make(chan struct{}, 16)}
	srv := serve(t, rec)
	ctx, cancel := context.WithCancel(context.Background())
	cfg, err := parseFlags([]string{"--url", srv.URL, "--requests", "5", "--concurrency", "2", "--stream", "--fault", "stall-before-headers"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	done := make(chan []*Result)
	go func() {
		results, _ := NewRunner(cfg, newWorkload(cfg), NewClient(cfg, &http.Client{Transport: tr})).Run(ctx)
		done <- results
	}()
	<-rec.got
	cancel()
	if results := <-done; len(results) != 0 {
		t.Errorf("%d results after cancel, want none (in-flight requests are dropped)", len(results))
	}
}

func TestStreamParsing(t *testing.T) {
	// No usage chunk: tokens are the content events; the role chunk,
	// comments, an empty finish chunk, a malformed event and tool-call and
	// reasoning deltas are handled; CRLF line ends and multi-line data.
	body := ": keep-alive\r\n\r\n" +
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\r\n\r\n" +
		"data: {\"id\":\"bad\", \"choices\": [\n\n" +
		"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"Hel\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: [DONE]\n\n"
	res := &Result{Start: time.Now()}
	readStream(&oneByteReader{s: body}, res)
	if !res.OK() || res.OutputTokens != 4 || !res.HasTTFT || len(res.ITL) != 3 || res.text != "Hello" {
		t.Errorf("result %+v (class %q, err %v)", res, res.Class, res.Err)
	}
	// Usage wins over the event count.
	res = &Result{Start: time.Now()}
	readStream(strings.NewReader("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":9}}\n\ndata: [DONE]\n\n"), res)
	if !res.OK() || res.OutputTokens != 9 || len(res.ITL) != 0 || !res.HasTTFT {
		t.Errorf("usage: %+v", res)
	}
	// Only a role chunk: no TTFT.
	res = &Result{Start: time.Now()}
	readStream(strings.NewReader("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: [DONE]\n\n"), res)
	if !res.OK() || res.HasTTFT || res.OutputTokens != 0 {
		t.Errorf("role only: %+v", res)
	}
}

// oneByteReader returns its string one byte per Read, so every event is
// split across reads.
type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:1], r.s)
	r.s = r.s[n:]
	return n, nil
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // substring of the error, "" for none
	}{
		{[]string{"--requests", "1"}, ""},
		{[]string{"--duration", "1s", "--rate", "5"}, ""},
		{[]string{"--requests", "1", "--workload", "conversations"}, ""},
		{nil, "set --requests, --duration or both"},
		{[]string{"--requests", "1", "--rate", "5", "--concurrency", "2"}, "mutually exclusive"},
		{[]string{"--requests", "1", "--url", "localhost:8080"}, "--url"},
		{[]string{"--requests", "1", "--url", "http://a:1,http://b:2"}, ""},
		{[]string{"--requests", "1", "--url", "http://a:1,b:2"}, `--url "b:2"`},
		{[]string{"--requests", "1", "--concurrency", "0"}, "--concurrency"},
		{[]string{"--requests", "1", "--rate", "-1"}, "--rate"},
		{[]string{"--requests", "-1"}, "--requests"},
		{[]string{"--requests", "1", "--timeout", "0s"}, "--timeout"},
		{[]string{"--requests", "1", "--max-tokens", "0"}, "--max-tokens"},
		{[]string{"--requests", "1", "--workload", "chat"}, "--workload"},
		{[]string{"--requests", "1", "--workload", "conversations", "--turns", "0", "--session-header", ""}, "--turns"},
		{[]string{"--requests", "1", "extra"}, "unexpected arguments"},
		{[]string{"--bogus"}, "unknown flag"},
		{[]string{"--requests", "1", "--max-error-rate", "0.05"}, ""},
		{[]string{"--requests", "1", "--max-error-rate", "1"}, ""},
		{[]string{"--requests", "1", "--max-error-rate", "1.5"}, "--max-error-rate 1.5: must be a fraction from 0 to 1"},
		{[]string{"--requests", "1", "--max-error-rate", "-0.1"}, "--max-error-rate -0.1"},
		{[]string{"--requests", "1", "--max-error-rate", "NaN"}, "--max-error-rate NaN"},
		{[]string{"--requests", "1", "--long-share", "0.2", "--long-prompt-words", "4000", "--long-max-tokens", "8"}, ""},
		{[]string{"--requests", "1", "--long-share", "1.5"}, "--long-share 1.5: must be a fraction from 0 to 1"},
		{[]string{"--requests", "1", "--long-share", "0.2", "--long-prompt-words", "0"}, "--long-prompt-words 0"},
		{[]string{"--requests", "1", "--long-max-tokens", "-1"}, "--long-max-tokens -1"},
		{[]string{"--requests", "1", "--workload", "conversations", "--long-share", "0.2"}, "--long-share: only with --workload fixed"},
	} {
		_, err := parseFlags(tc.args, io.Discard)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("parseFlags(%q): %v", tc.args, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	var stderr bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &stderr); !errors.Is(err, pflag.ErrHelp) || !strings.Contains(stderr.String(), "--session-header") {
		t.Errorf("--help: %v\n%s", err, stderr.String())
	}
}

func TestWorkloadTextsDeterministic(t *testing.T) {
	cfg := &Config{SystemPrompts: 2, SystemPromptWords: 30, Conversations: 1, Turns: 2, PromptWords: 5, SessionHeader: "x-session-id", Seed: 7}
	a := NewConversations(cfg)
	b := NewConversations(cfg)
	if !reflect.DeepEqual(a.system, b.system) || a.system[0] == a.system[1] || len(strings.Fields(a.system[0])) != 33 {
		t.Errorf("system prompts not deterministic and distinct: %q", a.system)
	}
	f := NewFixed(12, 3)
	req, err := f.Next(context.Background())
	if err != nil || len(req.Messages) != 1 || len(strings.Fields(req.Messages[0].Content)) != 12 {
		t.Errorf("fixed: %+v, %v", req, err)
	}
	if isTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is not a terminal")
	}
	if line := progressLine(2*time.Second, 10, 1, 3); !strings.HasPrefix(line, "\r") || !strings.Contains(line, "5.0 req/s") {
		t.Errorf("progress line %q", line)
	}
}

// TestErrorRateExceeded: the run fails when the share of measured requests
// that failed is above --max-error-rate, not at it; by default any failed
// request fails it.
func TestErrorRateExceeded(t *testing.T) {
	results := func(ok, failed int) []*Result {
		var out []*Result
		for range ok {
			out = append(out, &Result{Latency: time.Millisecond})
		}
		for range failed {
			out = append(out, &Result{Latency: time.Millisecond, Class: ClassHTTP5xx, Status: 500, Err: errors.New("boom")})
		}
		return out
	}
	for _, tc := range []struct {
		ok, failed int
		max        float64
		rate       float64
		exceeded   bool
	}{
		{ok: 10, max: 0, rate: 0, exceeded: false},
		{ok: 9, failed: 1, max: 0, rate: 0.1, exceeded: true},
		{ok: 9, failed: 1, max: 0.1, rate: 0.1, exceeded: false},
		{ok: 8, failed: 2, max: 0.1, rate: 0.2, exceeded: true},
		{ok: 999, failed: 1, max: 0.001, rate: 0.001, exceeded: false},
		{failed: 3, max: 1, rate: 1, exceeded: false},
		{failed: 3, max: 0.99, rate: 1, exceeded: true},
		{max: 0, rate: 0, exceeded: false}, // no measured request
	} {
		rs := results(tc.ok, tc.failed)
		rep := Aggregate(&Config{Workload: FixedName, Concurrency: 1, MaxErrorRate: tc.max}, rs, window(rs), 0)
		if rep.ErrorRate != tc.rate || rep.MaxErrorRate != tc.max || rep.ErrorRateExceeded() != tc.exceeded {
			t.Errorf("%d ok, %d failed, max %g: rate %g (max %g), exceeded %t; want %g, %t",
				tc.ok, tc.failed, tc.max, rep.ErrorRate, rep.MaxErrorRate, rep.ErrorRateExceeded(), tc.rate, tc.exceeded)
		}
		if err := rep.errorRateError(); (err != nil) != tc.exceeded {
			t.Errorf("%d ok, %d failed, max %g: errorRateError() = %v", tc.ok, tc.failed, tc.max, err)
		}
	}
}

// TestRunMaxErrorRate: run returns an error (main exits 1) after writing
// the report when more requests failed than --max-error-rate allows, and
// the report says which threshold was crossed.
func TestRunMaxErrorRate(t *testing.T) {
	sim := newSim(t)
	var n atomic.Int64
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 0 { // every second request
			http.Error(w, `{"error":{"message":"engine down"}}`, http.StatusServiceUnavailable)
			return
		}
		sim.ServeHTTP(w, r)
	}))
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // "" for none
		verdict string // in the table
	}{
		{"default", nil, "2 of 4 measured requests failed (error rate 0.5), above --max-error-rate 0",
			"error rate  0.5 (--max-error-rate 0: above it, the run fails)"},
		{"below", []string{"--max-error-rate", "0.4"}, "2 of 4 measured requests failed (error rate 0.5), above --max-error-rate 0.4",
			"error rate  0.5 (--max-error-rate 0.4: above it, the run fails)"},
		{"at", []string{"--max-error-rate", "0.5"}, "", "error rate  0.5 (--max-error-rate 0.5)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.Store(0)
			path := filepath.Join(t.TempDir(), "report.json")
			var stdout bytes.Buffer
			args := append([]string{"--url", srv.URL, "--model", "m", "--requests", "4", "--concurrency", "1", "--max-tokens", "2", "--json", path}, tc.args...)
			err := run(context.Background(), args, &stdout, io.Discard)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Errorf("run = %v, want %q", err, tc.wantErr)
			}
			if !strings.Contains(stdout.String(), tc.verdict) {
				t.Errorf("table lacks %q:\n%s", tc.verdict, stdout.String())
			}
			// The report is written either way.
			data, rerr := os.ReadFile(path)
			var rep Report
			if rerr != nil || json.Unmarshal(data, &rep) != nil || rep.Failed != 2 || rep.ErrorRate != 0.5 {
				t.Errorf("JSON report: %v\n%s", rerr, data)
			}
		})
	}
}

// TestClientReplicas: with several base URLs each request goes to the next
// in turn.
func TestClientReplicas(t *testing.T) {
	var hits [2]atomic.Int64
	var srvs [2]*httptest.Server
	for i := range srvs {
		srvs[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}))
		defer srvs[i].Close()
	}
	cfg, err := parseFlags([]string{"--url", srvs[0].URL + "," + srvs[1].URL + "/", "--requests", "6", "--model", "m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(cfg, srvs[0].Client())
	for range 6 {
		if res := c.Do(context.Background(), &Request{Messages: []Message{{Role: "user", Content: "x"}}}); !res.OK() {
			t.Fatalf("request failed: %v", res.Err)
		}
	}
	if a, b := hits[0].Load(), hits[1].Load(); a != 3 || b != 3 {
		t.Errorf("requests per replica %d, %d; want 3, 3", a, b)
	}
}
