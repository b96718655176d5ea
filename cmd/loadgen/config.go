package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Workload names accepted by --workload.
const (
	FixedName         = "fixed"
	ConversationsName = "conversations"
)

// Config is the whole run configuration, filled from the command line by
// parseFlags and checked by Validate.
type Config struct {
	// URL is the base URL of the server; requests go to URL +
	// "/v1/chat/completions". Several, comma-separated, are replicas of one
	// server behind a load balancer: each request goes to the next in turn,
	// so a conversation's turns land on every replica.
	URL string
	// APIKey is sent as "Authorization: Bearer <key>" when not empty.
	APIKey string
	// Model is the request's "model" field.
	Model string

	// Concurrency is the number of closed-loop workers. It is ignored when
	// Rate is set.
	Concurrency int
	// Rate, when > 0, selects open-loop mode: requests start at Poisson
	// arrival times with this mean rate (requests/s), whatever the latency.
	Rate float64
	// Requests bounds the number of measured requests (0: no bound).
	Requests int
	// Duration bounds the time during which requests are started (0: no
	// bound). Requests in flight when it ends are allowed to finish.
	Duration time.Duration
	// Warmup is the number of requests sent first and left out of the report.
	Warmup int
	// Timeout bounds each request, headers and body.
	Timeout time.Duration
	// Stream asks for SSE responses (and stream_options.include_usage).
	Stream bool

	// MaxTokens is each request's max_tokens, in tokens (>= 1).
	MaxTokens int
	// Workload is FixedName or ConversationsName.
	Workload string
	// PromptWords is the words of the fixed prompt, or of each user turn
	// of a conversation (>= 1).
	PromptWords int
	// SystemPrompts is how many distinct system prompts the conversations
	// share, each SystemPromptWords words (conversations workload).
	SystemPrompts     int
	SystemPromptWords int
	// Conversations is how many conversations run (at most one request in
	// flight each), of Turns user turns each, every request carrying the
	// conversation id in the SessionHeader header (conversations workload).
	Conversations int
	Turns         int
	SessionHeader string
	// LongShare, when > 0, mixes long requests into the fixed workload:
	// each request is, with this probability (0 to 1), a prompt of
	// LongPromptWords words of its own with max_tokens LongMaxTokens (0:
	// MaxTokens), and the report gives the long and the short requests'
	// statistics apart (fixed workload).
	LongShare       float64
	LongPromptWords int
	LongMaxTokens   int
	// Stagger starts the first conversations at turns spread evenly from
	// 1 to Turns with made-up earlier turns (replies of MaxTokens words),
	// so the run sees conversations at every stage from its start
	// (conversations workload). The --stagger flag defaults to true; the
	// zero Config has it off.
	Stagger bool

	// Seed seeds the open-loop arrival process and the generated texts.
	Seed uint64
	// JSON is where the JSON report goes: a file name, "-" for stdout, or
	// "" for none.
	JSON string
	// Fault is sent as the X-Enginesim-Fault header (simulator only).
	Fault string
	// ExpectCanonical fails a request whose answer is not the simulator's
	// canonical answer of MaxTokens tokens with a finish_reason (class
	// wrong_answer; simulator only).
	ExpectCanonical bool
	// EngineMetrics lists the engines' Prometheus /metrics URLs, scraped
	// before and after the measured requests for the prefix cache hit rate.
	EngineMetrics []string
	// MaxErrorRate is the largest fraction (0 to 1) of the measured
	// requests that may fail: above it loadgen exits non-zero once the
	// report is written. 0 (the default) fails the run on any failed
	// request; 1 never does.
	MaxErrorRate float64
}

// OpenLoop reports whether the run uses Poisson arrivals.
func (c *Config) OpenLoop() bool { return c.Rate > 0 }

// Validate reports every problem in c, joined.
func (c *Config) Validate() error {
	var errs []error
	for _, raw := range strings.Split(c.URL, ",") {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--url %q: want an http or https base URL (several: comma-separated)", raw))
		}
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency %d: must be at least 1", c.Concurrency))
	}
	if c.Rate < 0 {
		errs = append(errs, fmt.Errorf("--rate %g: must not be negative", c.Rate))
	}
	if c.Requests < 0 {
		errs = append(errs, fmt.Errorf("--requests %d: must not be negative", c.Requests))
	}
	if c.Duration < 0 {
		errs = append(errs, fmt.Errorf("--duration %v: must not be negative", c.Duration))
	}
	if c.Requests == 0 && c.Duration == 0 {
		errs = append(errs, errors.New("set --requests, --duration or both"))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("--warmup %d: must not be negative", c.Warmup))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %v: must be positive", c.Timeout))
	}
	if c.MaxTokens < 1 {
		errs = append(errs, fmt.Errorf("--max-tokens %d: must be at least 1", c.MaxTokens))
	}
	if c.PromptWords < 1 {
		errs = append(errs, fmt.Errorf("--prompt-words %d: must be at least 1", c.PromptWords))
	}
	if !(c.MaxErrorRate >= 0 && c.MaxErrorRate <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("--max-error-rate %g: must be a fraction from 0 to 1", c.MaxErrorRate))
	}
	for _, m := range c.EngineMetrics {
		u, err := url.Parse(m)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--engine-metrics %q: want an http or https URL", m))
		}
	}
	if !(c.LongShare >= 0 && c.LongShare <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("--long-share %g: must be a fraction from 0 to 1", c.LongShare))
	}
	if c.LongShare > 0 && c.LongPromptWords < 1 {
		errs = append(errs, fmt.Errorf("--long-prompt-words %d: must be at least 1", c.LongPromptWords))
	}
	if c.LongMaxTokens < 0 {
		errs = append(errs, fmt.Errorf("--long-max-tokens %d: must not be negative", c.LongMaxTokens))
	}
	switch c.Workload {
	case FixedName:
	case ConversationsName:
		if c.LongShare > 0 {
			errs = append(errs, errors.New("--long-share: only with --workload fixed"))
		}
		if c.SystemPrompts < 1 {
			errs = append(errs, fmt.Errorf("--system-prompts %d: must be at least 1", c.SystemPrompts))
		}
		if c.SystemPromptWords < 1 {
			errs = append(errs, fmt.Errorf("--system-prompt-words %d: must be at least 1", c.SystemPromptWords))
		}
		if c.Conversations < 1 {
			errs = append(errs, fmt.Errorf("--conversations %d: must be at least 1", c.Conversations))
		}
		if c.Turns < 1 {
			errs = append(errs, fmt.Errorf("--turns %d: must be at least 1", c.Turns))
		}
		if c.SessionHeader == "" {
			errs = append(errs, errors.New("--session-header: must not be empty"))
		}
	default:
		errs = append(errs, fmt.Errorf("--workload %q: want %q or %q", c.Workload, FixedName, ConversationsName))
	}
	return errors.Join(errs...)
}

// parseFlags parses args (without the program name) into a validated Config.
// It returns pflag.ErrHelp after printing usage for -h/--help.
func parseFlags(args []string, stderr io.Writer) (*Config, error) {
	c := &Config{}
	fs := pflag.NewFlagSet("loadgen", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.URL, "url", "http://localhost:8080", "base URL of the OpenAI-compatible server; several, comma-separated: replicas, each request to the next in turn")
	fs.StringVar(&c.APIKey, "api-key", "", "API key, sent as Authorization: Bearer KEY")
	fs.StringVar(&c.Model, "model", "", "model name (empty: omitted from the request)")
	fs.IntVar(&c.Concurrency, "concurrency", 1, "closed loop: number of requests in flight")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: mean request rate in requests/s, Poisson arrivals (excludes --concurrency)")
	fs.IntVar(&c.Requests, "requests", 0, "number of measured requests (0: unbounded)")
	fs.DurationVar(&c.Duration, "duration", 0, "stop starting requests after this long (0: unbounded)")
	fs.IntVar(&c.Warmup, "warmup", 0, "requests sent first and left out of the report")
	fs.DurationVar(&c.Timeout, "timeout", 60*time.Second, "per-request timeout (headers and body)")
	fs.BoolVar(&c.Stream, "stream", false, "stream responses (SSE); needed for TTFT and ITL")
	fs.IntVar(&c.MaxTokens, "max-tokens", 64, "max_tokens of every request")
	fs.StringVar(&c.Workload, "workload", FixedName, "workload: fixed or conversations")
	fs.IntVar(&c.PromptWords, "prompt-words", 64, "words in the prompt (fixed) or in each user turn (conversations)")
	fs.Float64Var(&c.LongShare, "long-share", 0, "fixed: fraction (0 to 1) of requests that are long, each a prompt of --long-prompt-words words of its own, reported apart from the short ones")
	fs.IntVar(&c.LongPromptWords, "long-prompt-words", 4000, "fixed, with --long-share: words in each long prompt (after a 3-word label that makes it unique)")
	fs.IntVar(&c.LongMaxTokens, "long-max-tokens", 0, "fixed, with --long-share: max_tokens of the long requests (0: --max-tokens)")
	fs.IntVar(&c.SystemPrompts, "system-prompts", 4, "conversations: number of distinct system prompts shared by the conversations")
	fs.IntVar(&c.SystemPromptWords, "system-prompt-words", 1024, "conversations: words in each system prompt")
	fs.IntVar(&c.Conversations, "conversations", 16, "conversations: number of conversations open at once")
	fs.IntVar(&c.Turns, "turns", 4, "conversations: user turns per conversation")
	fs.StringVar(&c.SessionHeader, "session-header", "x-session-id", "conversations: header carrying the conversation id")
	fs.BoolVar(&c.Stagger, "stagger", true, "conversations: start the initial --conversations conversations at turns spread over the conversation, with made-up earlier turns, so their first requests are long and cold (a --warmup of at least --conversations takes them all); false: all start at turn 1")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the arrival process and generated texts")
	fs.StringVar(&c.JSON, "json", "", "also write the report as JSON to FILE (- for stdout)")
	fs.StringVar(&c.Fault, "fault", "", "simulator only: X-Enginesim-Fault header sent with every request")
	fs.BoolVar(&c.ExpectCanonical, "expect-canonical", false, "simulator only: fail (class wrong_answer) every answer that is not the canonical \"tok0 ... tok<n-1> \" of --max-tokens n tokens with a finish_reason (the engine's --max-output-tokens must allow n)")
	fs.StringSliceVar(&c.EngineMetrics, "engine-metrics", nil, "engines' /metrics URLs (comma-separated or repeated): report their prefix cache hit rate over the measured requests")
	fs.Float64Var(&c.MaxErrorRate, "max-error-rate", 0, "exit with status 1 when more than this fraction (0 to 1) of the measured requests failed; 0: any failed request, 1: never")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var errs []error
	if fs.Changed("rate") && fs.Changed("concurrency") {
		errs = append(errs, errors.New("--rate and --concurrency are mutually exclusive"))
	}
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}
