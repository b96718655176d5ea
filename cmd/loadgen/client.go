package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// Error classes of a failed request.
const (
	ClassHTTP4xx          = "http_4xx"
	ClassHTTP5xx          = "http_5xx"
	ClassConnect          = "connect"
	ClassTimeout          = "timeout"
	ClassStreamErrorEvent = "stream_error_event"
	ClassStreamNoDone     = "stream_no_done"
	ClassWrongAnswer      = "wrong_answer"
	ClassOther            = "other"
)

// faultHeader is the simulator's fault header (internal/enginesim.FaultHeader).
const faultHeader = "X-Enginesim-Fault"

// engineHeader is the response header in which the gateway names the engine
// that served the request (its server.engine_header setting).
const engineHeader = "X-Switchboard-Engine"

// Result is the outcome of one request.
type Result struct {
	// Start is when the request was sent.
	Start time.Time
	// Latency is the end-to-end time, from sending to the end of the body.
	Latency time.Duration
	// TTFT is the time to the first content-bearing event; valid when
	// HasTTFT (streams that produced content).
	TTFT    time.Duration
	HasTTFT bool
	// ITL holds the gaps between consecutive content events.
	ITL []time.Duration
	// OutputTokens is usage.completion_tokens when the server sent usage,
	// else the number of content events (streams) or of whitespace
	// separated words of the content (non-streams).
	OutputTokens int
	// Class is "" on success, else one of the Class constants.
	Class string
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Engine is the X-Switchboard-Engine response header: the engine that
	// served the request, "" when the response named none.
	Engine string
	// Err describes the failure.
	Err error
	// Canceled is set when the run was interrupted during the request; such
	// results are not reported.
	Canceled bool
	// Kind is the request's Kind ("" outside a mixed workload).
	Kind string

	text   string // assistant content, for conversations and --expect-canonical
	finish string // the last finish_reason seen ("" if none)
}

// OK reports whether the request succeeded.
func (r *Result) OK() bool { return r.Class == "" && !r.Canceled }

// Client sends chat completion requests and measures them. Safe for
// concurrent use.
type Client struct {
	cfg       *Config
	http      *http.Client
	endpoints []string      // one per base URL of cfg.URL
	next      atomic.Uint64 // the next request's endpoint, modulo len(endpoints)
}

// NewClient returns a Client for cfg using hc.
func NewClient(cfg *Config, hc *http.Client) *Client {
	c := &Client{cfg: cfg, http: hc}
	for _, u := range strings.Split(cfg.URL, ",") {
		c.endpoints = append(c.endpoints, strings.TrimSuffix(u, "/")+"/v1/chat/completions")
	}
	return c
}

// endpoint returns the next request's URL: the base URLs in turn.
func (c *Client) endpoint() string {
	return c.endpoints[(c.next.Add(1)-1)%uint64(len(c.endpoints))]
}

// Do sends req and returns its measured result. ctx is the run's context:
// when it ends, the request is abandoned and marked Canceled.
func (c *Client) Do(ctx context.Context, req *Request) *Result {
	res := &Result{Start: time.Now(), Kind: req.Kind}
	body, err := encodeRequest(c.cfg, req)
	if err != nil {
		res.Class, res.Err = ClassOther, err
		return res
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(rctx, http.MethodPost, c.endpoint(), bytes.NewReader(body))
	if err != nil {
		res.Class, res.Err = ClassOther, err
		return res
	}
	hr.Header.Set("Content-Type", "application/json")
	if c.cfg.Stream {
		hr.Header.Set("Accept", "text/event-stream")
	}
	if c.cfg.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	}
	if c.cfg.Fault != "" {
		hr.Header.Set(faultHeader, c.cfg.Fault)
	}
	for k, v := range req.Header {
		hr.Header[k] = v
	}

	res.Start = time.Now()
	defer func() {
		res.Latency = time.Since(res.Start)
		if res.Class != "" {
			c.classifyCtx(ctx, rctx, res)
		}
	}()
	resp, err := c.http.Do(hr)
	if err != nil {
		res.Class, res.Err = transportClass(err), err
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Engine = resp.Header.Get(engineHeader)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Class = ClassOther
		switch {
		case resp.StatusCode >= 500:
			res.Class = ClassHTTP5xx
		case resp.StatusCode >= 400:
			res.Class = ClassHTTP4xx
		}
		res.Err = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return res
	}
	if c.cfg.Stream {
		readStream(resp.Body, res)
	} else {
		readBody(resp.Body, res)
	}
	if c.cfg.ExpectCanonical && res.Class == "" {
		n := c.cfg.MaxTokens
		if req.MaxTokens > 0 {
			n = req.MaxTokens
		}
		checkCanonical(res, n)
	}
	return res
}

// checkCanonical fails a successful res whose answer is not the
// simulator's canonical answer of n tokens (enginesim.ContentToken 0 to
// n-1) with a finish_reason: a stream that ended with [DONE] but lost or
// repeated tokens is a wrong answer, not a success.
func checkCanonical(res *Result, n int) {
	var want strings.Builder
	for i := range n {
		want.WriteString(enginesim.ContentToken(i))
	}
	switch {
	case res.text != want.String():
		got, w := res.text, want.String()
		i := 0
		for i < len(got) && i < len(w) && got[i] == w[i] {
			i++
		}
		res.Class = ClassWrongAnswer
		res.Err = fmt.Errorf("not the canonical answer of %d tokens: %d of %d bytes, first difference at byte %d: %q, finish_reason %q", n, len(got), len(w), i, truncate([]byte(got[i:]), 40), res.finish)
	case res.finish == "":
		res.Class, res.Err = ClassWrongAnswer, errors.New("the answer has no finish_reason")
	}
}

// classifyCtx refines the class of a failed request from the contexts: a
// run interrupted meanwhile makes it Canceled, an expired per-request
// deadline makes it a timeout, whatever error the transport reported.
func (c *Client) classifyCtx(run, req context.Context, res *Result) {
	switch {
	case run.Err() != nil:
		res.Canceled = true
	case errors.Is(req.Err(), context.DeadlineExceeded) && res.Class != ClassStreamErrorEvent:
		res.Class = ClassTimeout
		res.Err = fmt.Errorf("timed out after %v: %w", c.cfg.Timeout, res.Err)
	}
}

// transportClass classifies an error from http.Client.Do.
func transportClass(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ClassTimeout
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return ClassConnect
	}
	var de *net.DNSError
	if errors.As(err, &de) {
		return ClassConnect
	}
	return ClassOther
}

// chunk holds the fields of a streamed event that the measurements use.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// present reports whether a raw JSON value is there and not null or empty.
func present(raw json.RawMessage) bool {
	s := string(bytes.TrimSpace(raw))
	return s != "" && s != "null" && s != "[]" && s != "{}"
}

// readStream parses an SSE body into res.
func readStream(body io.Reader, res *Result) {
	var (
		sc      sse.Scanner
		text    strings.Builder
		events  int
		usage   = -1
		done    bool
		last    time.Time
		errData []byte
	)
	onEvent := func(ev sse.Event) {
		if ev.Comment || ev.Data == nil || done || errData != nil {
			return
		}
		if sse.IsDone(ev.Data) {
			done = true
			return
		}
		now := time.Now()
		var ch chunk
		if err := json.Unmarshal(ev.Data, &ch); err != nil {
			return // not JSON: neither content nor an error event
		}
		if present(ch.Error) {
			errData = bytes.Clone(ev.Data)
			return
		}
		if ch.Usage != nil {
			usage = ch.Usage.CompletionTokens
		}
		content := false
		for _, c := range ch.Choices {
			if c.Delta.Content != "" || c.Delta.ReasoningContent != "" || c.Delta.Reasoning != "" || c.Text != "" || present(c.Delta.ToolCalls) {
				content = true
			}
			text.WriteString(c.Delta.Content)
			text.WriteString(c.Text)
			if c.FinishReason != "" {
				res.finish = c.FinishReason
			}
		}
		if !content {
			return
		}
		events++
		if !res.HasTTFT {
			res.TTFT, res.HasTTFT = now.Sub(res.Start), true
		} else {
			res.ITL = append(res.ITL, now.Sub(last))
		}
		last = now
	}
	buf := make([]byte, 32<<10)
	var readErr error
	for {
		n, err := body.Read(buf)
		if n > 0 {
			sc.Push(buf[:n], onEvent)
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	res.OutputTokens = events
	if usage >= 0 {
		res.OutputTokens = usage
	}
	res.text = text.String()
	switch {
	case errData != nil:
		res.Class = ClassStreamErrorEvent
		res.Err = fmt.Errorf("error event: %s", truncate(errData, 512))
	case done:
		// A read error after [DONE] lost nothing.
	case readErr != nil:
		res.Class, res.Err = ClassStreamNoDone, fmt.Errorf("stream ended without [DONE]: %w", readErr)
	default:
		res.Class, res.Err = ClassStreamNoDone, errors.New("stream ended without [DONE]")
	}
}

// completion holds the fields of a non-streamed response that the
// measurements use.
type completion struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readBody parses a non-streamed JSON body into res.
func readBody(body io.Reader, res *Result) {
	data, err := io.ReadAll(body)
	if err != nil {
		res.Class, res.Err = ClassOther, fmt.Errorf("reading body: %w", err)
		return
	}
	var c completion
	if err := json.Unmarshal(data, &c); err != nil {
		res.Class, res.Err = ClassOther, fmt.Errorf("decoding body: %w", err)
		return
	}
	if present(c.Error) {
		res.Class, res.Err = ClassOther, fmt.Errorf("error body with status %d: %s", res.Status, truncate(data, 512))
		return
	}
	var text strings.Builder
	for _, ch := range c.Choices {
		text.WriteString(ch.Message.Content)
		text.WriteString(ch.Text)
		if ch.FinishReason != "" {
			res.finish = ch.FinishReason
		}
	}
	res.text = text.String()
	if c.Usage != nil {
		res.OutputTokens = c.Usage.CompletionTokens
	} else {
		res.OutputTokens = len(strings.Fields(res.text))
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
