package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// SpanName is the name of the span the engine emits per generation request when
// Config.TracerProvider is set: vLLM's "llm_request" (vllm/v1/engine/output_processor.py,
// do_tracing), a SERVER span parented on the request's W3C traceparent.
const SpanName = "llm_request"

// tracerScope is the instrumentation scope of the engine's spans.
const tracerScope = "github.com/switchboard-gw/switchboard/internal/enginesim"

// The attributes of the llm_request span, with vLLM's names (vllm/tracing/utils.py,
// SpanAttributes). Latencies are float seconds, as in vLLM.
const (
	AttrRequestID          = attribute.Key("gen_ai.request.id")
	AttrRequestMaxTokens   = attribute.Key("gen_ai.request.max_tokens")
	AttrRequestTemperature = attribute.Key("gen_ai.request.temperature")
	AttrRequestTopP        = attribute.Key("gen_ai.request.top_p")
	AttrRequestN           = attribute.Key("gen_ai.request.n")
	AttrResponseModel      = attribute.Key("gen_ai.response.model")
	AttrFinishReasons      = attribute.Key("gen_ai.response.finish_reasons")
	AttrPromptTokens       = attribute.Key("gen_ai.usage.prompt_tokens")
	AttrCompletionTokens   = attribute.Key("gen_ai.usage.completion_tokens")
	AttrTimeInQueue        = attribute.Key("gen_ai.latency.time_in_queue")
	AttrTimeToFirstToken   = attribute.Key("gen_ai.latency.time_to_first_token")
	AttrE2E                = attribute.Key("gen_ai.latency.e2e")
	AttrTimeInPrefill      = attribute.Key("gen_ai.latency.time_in_model_prefill")
	AttrTimeInDecode       = attribute.Key("gen_ai.latency.time_in_model_decode")
	AttrTimeInInference    = attribute.Key("gen_ai.latency.time_in_model_inference")
)

// finishAbort is vLLM's finish reason of an aborted request (FinishReason.ABORT).
const finishAbort = "abort"

// maxTracedBody caps how much of a non-stream response body the tracer keeps to read its
// usage; the simulator's bodies are far smaller.
const maxTracedBody = 1 << 20

// tracedRoute is a generation route the engine emits spans for, with the prefix vLLM puts
// before the X-Request-Id header to make the request id (chatcmpl-<id>, cmpl-<id>, ...).
type tracedRoute struct {
	api      string // chat, completions, responses or messages
	idPrefix string
}

// tracedRoutes are the text generation routes: the ones whose requests reach vLLM's engine
// and its output processor, which emits llm_request.
var tracedRoutes = map[string]tracedRoute{
	"/v1/chat/completions": {"chat", "chatcmpl-"},
	"/v1/completions":      {"completions", "cmpl-"},
	"/v1/responses":        {"responses", "resp_"},
	"/v1/messages":         {"messages", "chatcmpl-"}, // vLLM serves it through its chat path
}

// traced wraps h so that POST requests on the generation routes get an llm_request span
// from tp; with a nil tp it returns h unchanged (no spans, no cost).
//
// The span is built the way vLLM builds it: once the request is over, with the arrival time
// as its start and the attributes known at the end. The simulator's internals are not
// instrumented; the wrapper reads the request body's sampling parameters and watches the
// response (its status, each SSE event as it is written, or the JSON body) for the first
// token, the usage, the model and the finish reason. What it cannot see is documented on
// [Config.TracerProvider].
func (e *Engine) traced(tp trace.TracerProvider, h http.Handler) http.Handler {
	if tp == nil {
		return h
	}
	tr := tp.Tracer(tracerScope)
	prop := propagation.TraceContext{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt, ok := tracedRoutes[r.URL.Path]
		if !ok || r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		t := &reqTrace{e: e, route: rt, arrival: time.Now()}
		t.queued = e.mustQueue()
		r.Body = t.readRequest(r.Body)
		tw := &traceWriter{ResponseWriter: w, t: t}
		parent := prop.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
		defer func() {
			rec := recover()
			t.finish(tr, parent, r, rec)
			if rec != nil {
				panic(rec)
			}
		}()
		h.ServeHTTP(tw, r)
	})
}

// mustQueue reports whether a sequence arriving now has to wait for a running slot: every
// slot is taken or others are already waiting (the scheduler is FIFO).
func (e *Engine) mustQueue() bool {
	running, waiting := e.sched.counts()
	return waiting > 0 || running >= int64(e.cfg.MaxNumSeqs)
}

// reqTrace is what the tracer learns about one request. It lives on the request's handler
// goroutine.
type reqTrace struct {
	e       *Engine
	route   tracedRoute
	arrival time.Time
	queued  bool // no free running slot at arrival

	req struct {
		Model               string   `json:"model"`
		MaxTokens           *int     `json:"max_tokens"`
		MaxCompletionTokens *int     `json:"max_completion_tokens"`
		MaxOutputTokens     *int     `json:"max_output_tokens"`
		Temperature         *float64 `json:"temperature"`
		TopP                *float64 `json:"top_p"`
		N                   *int     `json:"n"`
	}

	status     int  // response status; 0 while no header was written
	stream     bool // the response is an SSE stream
	done       bool // the response was complete: a stream's terminator, or a whole JSON body
	firstToken time.Time
	lastToken  time.Time
	tokens     int // token events seen on a stream

	respID, respModel, finishReason string
	promptTokens, completionTokens  int
	usage                           bool // promptTokens and completionTokens come from the engine's usage

	reqBody []byte // the request body, for the prompt's token count when the engine sends no usage
	pending []byte // a stream's partial event, or a non-stream body
}

// readRequest reads the request body (at most maxBodyBytes+1 bytes, so the handler still
// sees a body over the limit), decodes the sampling parameters and returns a reader that
// gives the handler the same bytes, and the same read error if there was one.
func (t *reqTrace) readRequest(body io.ReadCloser) io.ReadCloser {
	b, err := io.ReadAll(io.LimitReader(body, maxBodyBytes+1))
	_ = json.Unmarshal(b, &t.req) // an invalid body is the handler's 400
	t.reqBody = b
	var rd io.Reader = bytes.NewReader(b)
	if err != nil {
		rd = io.MultiReader(rd, errReader{err})
	}
	return readCloser{rd, body}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

type readCloser struct {
	io.Reader
	io.Closer
}

// traceWriter passes the response through and shows every byte to its reqTrace.
type traceWriter struct {
	http.ResponseWriter
	t *reqTrace
}

// Unwrap lets http.ResponseController reach the connection's Flush and Hijack.
func (w *traceWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *traceWriter) WriteHeader(code int) {
	w.t.header(code, w.Header())
	w.ResponseWriter.WriteHeader(code)
}

func (w *traceWriter) Write(b []byte) (int, error) {
	w.t.header(http.StatusOK, w.Header())
	n, err := w.ResponseWriter.Write(b)
	w.t.body(b[:n])
	return n, err
}

// header records the response status (the first one written) and whether it is a stream.
func (t *reqTrace) header(code int, h http.Header) {
	if t.status != 0 || code < 200 {
		return
	}
	t.status = code
	t.stream = strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
}

// body takes response bytes: a stream's events as they complete, a JSON body whole.
func (t *reqTrace) body(b []byte) {
	if !t.stream {
		if len(t.pending)+len(b) <= maxTracedBody {
			t.pending = append(t.pending, b...)
		}
		return
	}
	t.pending = append(t.pending, b...)
	for {
		i := bytes.Index(t.pending, []byte("\n\n"))
		if i < 0 {
			return
		}
		t.event(t.pending[:i])
		t.pending = t.pending[i+2:]
	}
}

// event takes one complete SSE event (without its blank line).
func (t *reqTrace) event(ev []byte) {
	var typ string
	var data []byte
	for line := range bytes.SplitSeq(ev, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("event: ")); ok {
			typ = string(v)
		} else if v, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			data = v
		}
	}
	if data == nil { // a comment (": keep-alive") or nothing
		return
	}
	if string(data) == "[DONE]" {
		t.done = true
		return
	}
	var p eventProbe
	if err := json.Unmarshal(data, &p); err != nil {
		var typeErr *json.UnmarshalTypeError
		if !errors.As(err, &typeErr) {
			return // not JSON: the malformed fault's event is no token
		}
		// A field of another shape (a Responses event's string delta): the rest is decoded.
	}
	t.take(&p)
	token, opening := p.classify(typ)
	now := time.Now()
	if !opening && t.firstToken.IsZero() {
		t.firstToken = now // the first event after the prefill: the first token, or the finish
	}
	if token {
		t.tokens++
		t.lastToken = now
	}
	switch typ {
	case "response.completed", "response.incomplete", "response.failed", "message_stop":
		t.done = true
	}
}

// take copies what p says about the response: its id, model, usage and finish reason.
func (t *reqTrace) take(p *eventProbe) {
	for _, o := range []*eventProbe{p, p.Response, p.Message} {
		if o == nil {
			continue
		}
		if o.ID != "" && t.respID == "" {
			t.respID = o.ID
		}
		if o.Model != "" {
			t.respModel = o.Model
		}
		if u := o.Usage; u != nil {
			if v := u.PromptTokens; v != nil {
				t.promptTokens, t.usage = *v, true
			}
			if v := u.InputTokens; v != nil {
				t.promptTokens, t.usage = *v, true
			}
			if v := u.CompletionTokens; v != nil {
				t.completionTokens = *v
			}
			if v := u.OutputTokens; v != nil {
				t.completionTokens = *v
			}
		}
		switch o.Status {
		case "completed":
			t.finishReason = finishStop
		case "incomplete":
			t.finishReason = finishLength
		}
		if o.StopReason != nil {
			t.finishReason = anthropicFinish(*o.StopReason)
		}
		if o.Delta != nil && o.Delta.StopReason != nil {
			t.finishReason = anthropicFinish(*o.Delta.StopReason)
		}
		for _, c := range o.Choices {
			if c.FinishReason != nil && *c.FinishReason != "" {
				t.finishReason = *c.FinishReason
			}
		}
	}
}

// anthropicFinish maps a Messages API stop_reason back to the engine's finish reason.
func anthropicFinish(stop string) string {
	if stop == "max_tokens" {
		return finishLength
	}
	return finishStop
}

// eventProbe decodes the fields the tracer reads from any of the routes' stream events or
// bodies: chat and completions chunks, Responses API events and objects, Anthropic events
// and messages.
type eventProbe struct {
	ID         string      `json:"id"`
	Model      string      `json:"model"`
	Status     string      `json:"status"`      // a Responses API object
	StopReason *string     `json:"stop_reason"` // an Anthropic message
	Usage      *probeUsage `json:"usage"`
	Choices    []struct {
		FinishReason *string `json:"finish_reason"`
		Text         string  `json:"text"`
		Message      *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role             string            `json:"role"`
			Content          string            `json:"content"`
			ReasoningContent string            `json:"reasoning_content"`
			ToolCalls        []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Delta *struct {
		Type       string  `json:"type"`
		StopReason *string `json:"stop_reason"`
	} `json:"delta"`
	Response *eventProbe `json:"response"`
	Message  *eventProbe `json:"message"`
}

type probeUsage struct {
	PromptTokens     *int `json:"prompt_tokens"`
	CompletionTokens *int `json:"completion_tokens"`
	InputTokens      *int `json:"input_tokens"`
	OutputTokens     *int `json:"output_tokens"`
}

// classify reports whether the event of type typ carries a generated token, and whether it
// is one of the events a stream sends before the prefill (chat's role chunk,
// response.created and response.in_progress, message_start and ping).
func (p *eventProbe) classify(typ string) (token, opening bool) {
	switch typ {
	case "response.created", "response.in_progress", "message_start", "ping":
		return false, true
	case "":
		for _, c := range p.Choices {
			if c.Text != "" {
				return true, false
			}
			if d := c.Delta; d != nil {
				if d.Content != "" || d.ReasoningContent != "" {
					return true, false
				}
				if d.Role != "" && len(d.ToolCalls) == 0 {
					return false, true
				}
			}
		}
		return false, false
	case "content_block_delta":
		return p.Delta != nil && (p.Delta.Type == "text_delta" || p.Delta.Type == "thinking_delta"), false
	}
	// response.output_text.delta, response.reasoning_text.delta.
	return strings.HasPrefix(typ, "response.") && strings.HasSuffix(typ, "_text.delta"), false
}

// finish emits the span once the handler has returned (or panicked with rec): a request
// rejected with a 4xx never reached the engine and gets none, as in vLLM.
func (t *reqTrace) finish(tr trace.Tracer, parent context.Context, r *http.Request, rec any) {
	end := time.Now()
	if t.status >= 400 && t.status < 500 {
		return
	}
	if !t.stream && t.status == http.StatusOK && rec == nil {
		var p eventProbe
		if json.Unmarshal(t.pending, &p) == nil {
			t.take(&p)
			t.done = true
		}
	}
	var err error
	var msg string
	switch {
	case rec != nil:
		err, msg = errors.New("connection aborted"), "the engine aborted the connection mid-response"
	case t.status >= 500:
		err, msg = errors.New(http.StatusText(t.status)), "the engine answered "+http.StatusText(t.status)
	case !t.done && r.Context().Err() != nil:
		err, msg = context.Cause(r.Context()), "request aborted: the client disconnected"
	case !t.done:
		err, msg = errors.New("incomplete response"), "the response ended before its terminator"
	}
	if err != nil {
		t.finishReason = finishAbort
	}
	_, span := tr.Start(parent, SpanName, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(t.arrival))
	if span.IsRecording() {
		span.SetAttributes(t.attributes(r, end)...)
		if err != nil {
			span.RecordError(err, trace.WithTimestamp(end))
			span.SetStatus(codes.Error, msg)
		}
	}
	span.End(trace.WithTimestamp(end))
}

// attributes returns the span's attributes, vLLM's set: the request id, the sampling
// parameters (only the ones that are set and not zero, as vLLM tests them for truth), the
// token usage and the latencies.
func (t *reqTrace) attributes(r *http.Request, end time.Time) []attribute.KeyValue {
	id := t.respID
	if h := r.Header.Get("X-Request-Id"); h != "" {
		id = t.route.idPrefix + h
	}
	model := t.respModel
	if model == "" {
		model = t.req.Model
	}
	if model == "" {
		model = t.e.cfg.Models[0]
	}
	reasons, _ := json.Marshal([]string{t.finishReason})
	attrs := []attribute.KeyValue{
		AttrRequestID.String(id),
		AttrResponseModel.String(model),
		AttrFinishReasons.String(string(reasons)),
		AttrE2E.Float64(end.Sub(t.arrival).Seconds()),
	}
	if t.finishReason == "" {
		attrs[2] = AttrFinishReasons.String("[]")
	}
	if v := firstSet(t.req.MaxCompletionTokens, t.req.MaxTokens, t.req.MaxOutputTokens); v != nil && *v != 0 {
		attrs = append(attrs, AttrRequestMaxTokens.Int(*v))
	}
	temp, topP, n := 1.0, 1.0, 1 // vLLM's SamplingParams defaults
	if t.req.Temperature != nil {
		temp = *t.req.Temperature
	}
	if t.req.TopP != nil {
		topP = *t.req.TopP
	}
	if t.req.N != nil {
		n = *t.req.N
	}
	if temp != 0 {
		attrs = append(attrs, AttrRequestTemperature.Float64(temp))
	}
	if topP != 0 {
		attrs = append(attrs, AttrRequestTopP.Float64(topP))
	}
	if n != 0 {
		attrs = append(attrs, AttrRequestN.Int(n))
	}
	completion := t.completionTokens
	if !t.usage {
		completion = t.tokens
	}
	if t.usage || t.stream {
		attrs = append(attrs, AttrCompletionTokens.Int(completion))
	}
	if prompt, ok := t.prompt(); ok {
		attrs = append(attrs, AttrPromptTokens.Int(prompt))
	}
	// The queue: none when a slot was free at arrival; otherwise the time to first token
	// minus the configured base prefill (an upper bound).
	var queue time.Duration
	known := !t.queued
	if !t.firstToken.IsZero() {
		ttft := t.firstToken.Sub(t.arrival)
		attrs = append(attrs, AttrTimeToFirstToken.Float64(ttft.Seconds()))
		if t.queued {
			queue, known = max(ttft-t.e.cfg.TTFT, 0), true
		}
		last := t.lastToken
		if last.IsZero() {
			last = t.firstToken
		}
		attrs = append(attrs,
			AttrTimeInPrefill.Float64((ttft - queue).Seconds()),
			AttrTimeInDecode.Float64(last.Sub(t.firstToken).Seconds()),
			AttrTimeInInference.Float64((last.Sub(t.arrival) - queue).Seconds()),
		)
	}
	if known {
		attrs = append(attrs, AttrTimeInQueue.Float64(queue.Seconds()))
	}
	return attrs
}

// prompt returns the number of prompt tokens: the engine's usage, else (a chat or
// completions stream whose client did not ask for usage) the simulator's count of the
// request's prompt.
func (t *reqTrace) prompt() (int, bool) {
	if t.usage {
		return t.promptTokens, true
	}
	var req struct {
		Messages []chatMessage   `json:"messages"`
		Prompt   json.RawMessage `json:"prompt"`
	}
	if json.Unmarshal(t.reqBody, &req) != nil {
		return 0, false
	}
	switch t.route.api {
	case "chat":
		words, err := chatPromptWords(req.Messages)
		return promptTokens(words), err == nil
	case "completions":
		items, _, err := inputItems(req.Prompt, "prompt")
		var words []string
		for _, it := range items {
			words = append(words, it...)
		}
		return promptTokens(words), err == nil
	}
	return 0, false
}

// firstSet returns the first non-nil pointer of ps, or nil.
func firstSet(ps ...*int) *int {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}
