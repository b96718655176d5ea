package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// responsesRequest holds the fields the simulator reads from a Responses API request; the
// others listed here are echoed in the response, as vLLM does. Unknown fields are ignored.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	Background         bool            `json:"background"`
	PreviousResponseID *string         `json:"previous_response_id"`
	RequestID          string          `json:"request_id"`
	Metadata           json.RawMessage `json:"metadata"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	MaxToolCalls       *int            `json:"max_tool_calls"`
	Reasoning          json.RawMessage `json:"reasoning"`
	ServiceTier        *string         `json:"service_tier"`
	Text               json.RawMessage `json:"text"`
	Truncation         *string         `json:"truncation"`
	User               *string         `json:"user"`
}

// responseInputItem is one element of an array-valued input: a message (role and content, a
// string or input_text/output_text parts), or a function_call / function_call_output item.
type responseInputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// responseObject is vLLM's ResponsesResponse, field for field in its order.
type responseObject struct {
	ID                 string             `json:"id"`
	CreatedAt          int64              `json:"created_at"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	Metadata           json.RawMessage    `json:"metadata"`
	Model              string             `json:"model"`
	Object             string             `json:"object"`
	Output             []any              `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	Temperature        float64            `json:"temperature"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopP               float64            `json:"top_p"`
	Background         bool               `json:"background"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	MaxToolCalls       *int               `json:"max_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Prompt             json.RawMessage    `json:"prompt"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	ServiceTier        string             `json:"service_tier"`
	Status             string             `json:"status"`
	Text               json.RawMessage    `json:"text"`
	TopLogprobs        *int               `json:"top_logprobs"`
	Truncation         string             `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               *string            `json:"user"`
	InputMessages      json.RawMessage    `json:"input_messages"`
	OutputMessages     json.RawMessage    `json:"output_messages"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type responseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

type inputTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type outputTokensDetails struct {
	ReasoningTokens  int `json:"reasoning_tokens"`
	ToolOutputTokens int `json:"tool_output_tokens"`
}

// Output items and content parts (openai-python's models, in their field order).

type outputMessage struct {
	ID      string       `json:"id"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

type outputText struct {
	Annotations []struct{}      `json:"annotations"`
	Text        string          `json:"text"`
	Type        string          `json:"type"`
	Logprobs    json.RawMessage `json:"logprobs"` // [] while streaming, null when done
}

type reasoningItem struct {
	ID               string          `json:"id"`
	Summary          []struct{}      `json:"summary"`
	Type             string          `json:"type"`
	Content          []reasoningText `json:"content"`
	EncryptedContent *string         `json:"encrypted_content"`
	Status           *string         `json:"status"`
}

type reasoningText struct {
	Text string `json:"text"`
	Type string `json:"type"`
}

// Stream events.

type lifecycleEvent struct {
	Response       responseObject `json:"response"`
	SequenceNumber int            `json:"sequence_number"`
	Type           string         `json:"type"`
}

type outputItemEvent struct {
	Item           any    `json:"item"`
	OutputIndex    int    `json:"output_index"`
	SequenceNumber int    `json:"sequence_number"`
	Type           string `json:"type"`
}

type contentPartEvent struct {
	ContentIndex   int    `json:"content_index"`
	ItemID         string `json:"item_id"`
	OutputIndex    int    `json:"output_index"`
	Part           any    `json:"part"`
	SequenceNumber int    `json:"sequence_number"`
	Type           string `json:"type"`
}

type textDeltaEvent struct {
	ContentIndex   int             `json:"content_index"`
	Delta          string          `json:"delta"`
	ItemID         string          `json:"item_id"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"` // [] on output text, absent on reasoning
	OutputIndex    int             `json:"output_index"`
	SequenceNumber int             `json:"sequence_number"`
	Type           string          `json:"type"`
}

type textDoneEvent struct {
	ContentIndex   int             `json:"content_index"`
	ItemID         string          `json:"item_id"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"`
	OutputIndex    int             `json:"output_index"`
	SequenceNumber int             `json:"sequence_number"`
	Text           string          `json:"text"`
	Type           string          `json:"type"`
}

// rawEmptyList is the JSON [] of a streamed output_text part's logprobs.
var rawEmptyList = json.RawMessage("[]")

// outputWords returns the words of a response's output text, as a follow-up request's
// prompt sees them (reasoning is not carried over).
func outputWords(n, reasoning int) []string {
	words := make([]string, 0, n-reasoning)
	for i := range n - reasoning {
		words = append(words, strings.TrimSpace(ContentToken(i)))
	}
	return words
}

// outputContent returns the output text and the reasoning text of n tokens, the first
// reasoning of which are reasoning tokens.
func outputContent(n, reasoning int) (text, reasoningText string) {
	var t, r strings.Builder
	for i := range n {
		if i < reasoning {
			r.WriteString(ReasoningToken(i))
		} else {
			t.WriteString(ContentToken(i - reasoning))
		}
	}
	return t.String(), r.String()
}

// responseOutput returns the output items of a finished response: a reasoning item when
// there are reasoning tokens (without status: only the last item has one, as in vLLM), then
// the message when there is output text.
func responseOutput(msgID, rsID string, n, reasoning int) []any {
	text, rtext := outputContent(n, reasoning)
	out := []any{}
	if reasoning > 0 {
		out = append(out, reasoningItem{
			ID: rsID, Summary: []struct{}{}, Type: "reasoning",
			Content: []reasoningText{{Text: rtext, Type: "reasoning_text"}},
		})
	}
	if n > reasoning {
		out = append(out, outputMessage{
			ID: msgID, Content: []outputText{{Annotations: []struct{}{}, Text: text, Type: "output_text"}},
			Role: "assistant", Status: statusCompleted, Type: "message",
		})
	}
	return out
}

// responsesPrompt returns the prompt words of req: its instructions, the prompt and output
// of the previous response, then its input.
func responsesPrompt(req *responsesRequest, history []string) ([]string, error) {
	var words []string
	if req.Instructions != nil {
		words = wordList(*req.Instructions)
	}
	words = append(words, history...)
	if isNull(req.Input) {
		return nil, badRequestf("input is required")
	}
	var s string
	if json.Unmarshal(req.Input, &s) == nil {
		return append(words, wordList(s)...), nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(req.Input, &items); err != nil {
		return nil, badRequestf("input must be a string or an array of input items")
	}
	if len(items) == 0 {
		return nil, badRequestf("input must not be empty")
	}
	for i, raw := range items {
		var it responseInputItem
		if err := json.Unmarshal(raw, &it); err != nil {
			return nil, badRequestf("input[%d] must be an object", i)
		}
		switch {
		case it.Role != "":
			w, err := responseContentWords(it.Content)
			if err != nil {
				return nil, badRequestf("input[%d].content %v", i, err)
			}
			words = append(words, w...)
		case it.Type == "function_call":
			words = append(words, wordList(it.Arguments)...)
		case it.Type == "function_call_output":
			var out string
			if json.Unmarshal(it.Output, &out) == nil {
				words = append(words, wordList(out)...)
			}
		case it.Type == "reasoning", it.Type == "item_reference":
		default:
			return nil, badRequestf("input[%d] must be a message (role and content) or an input item with a known type", i)
		}
	}
	return words, nil
}

// responseContentWords returns the words of a Responses message's content: a string, or
// parts of type input_text, output_text or text (other parts, such as images, are ignored).
func responseContentWords(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return wordList(s), nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, fmt.Errorf("must be a string or an array of content parts")
	}
	var words []string
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			words = append(words, wordList(p.Text)...)
		}
	}
	return words, nil
}

// naturalLength returns the tokens a Responses or Messages request generates and why it
// stops: the engine's natural length (Config.OutputTokens), cut by a smaller limit.
func (e *Engine) naturalLength(limit *int, field string) (int, string, error) {
	natural := min(e.cfg.OutputTokens, e.cfg.MaxOutputTokens)
	if limit == nil {
		return natural, finishStop, nil
	}
	if *limit < 1 {
		return 0, "", badRequestf("%s must be at least 1, got %d", field, *limit)
	}
	if *limit < natural {
		return *limit, finishLength, nil
	}
	return natural, finishStop, nil
}

// newResponseObject returns the response for req without output, usage or status: the
// echoed request fields with vLLM's defaults.
func (e *Engine) newResponseObject(req *responsesRequest, id, model string, created int64) responseObject {
	obj := responseObject{
		ID: id, CreatedAt: created, Instructions: req.Instructions, Metadata: req.Metadata, Model: model,
		Object: "response", Output: []any{}, ParallelToolCalls: true, Temperature: 1, ToolChoice: req.ToolChoice,
		Tools: req.Tools, TopP: 1, Background: req.Background, MaxOutputTokens: e.cfg.MaxOutputTokens,
		MaxToolCalls: req.MaxToolCalls, PreviousResponseID: req.PreviousResponseID, Reasoning: req.Reasoning,
		ServiceTier: "auto", Text: req.Text, Truncation: "disabled", User: req.User,
	}
	if req.ParallelToolCalls != nil {
		obj.ParallelToolCalls = *req.ParallelToolCalls
	}
	if req.Temperature != nil {
		obj.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		obj.TopP = *req.TopP
	}
	if isNull(obj.ToolChoice) {
		obj.ToolChoice = json.RawMessage(`"auto"`)
	}
	if isNull(obj.Tools) {
		obj.Tools = json.RawMessage(`[]`)
	}
	if req.MaxOutputTokens != nil {
		obj.MaxOutputTokens = min(*req.MaxOutputTokens, e.cfg.MaxOutputTokens)
	}
	if req.ServiceTier != nil {
		obj.ServiceTier = *req.ServiceTier
	}
	if req.Truncation != nil {
		obj.Truncation = *req.Truncation
	}
	return obj
}

// serveResponses serves POST /v1/responses.
func (e *Engine) serveResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *responsesRequest) string { return q.Model })
	if !ok {
		return
	}
	invalid := func(msg string) { apiOpenAI.writeTypedError(w, http.StatusBadRequest, "invalid_request_error", msg) }
	store := req.Store == nil || *req.Store
	if req.Background && !store {
		invalid("background can only be used when `store` is true")
		return
	}
	if req.Background && req.Stream {
		invalid("enginesim does not stream background responses; set stream to false")
		return
	}
	var history []string
	if req.PreviousResponseID != nil {
		_, h, found, _ := e.readResponse(*req.PreviousResponseID)
		if !found {
			responseNotFound(w, *req.PreviousResponseID)
			return
		}
		history = h
	}
	words, err := responsesPrompt(&req, history)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// vLLM's Responses API refuses a prompt that fills the context
	// (OpenAIServingResponses._validate_generator_input in serving_responses.py) and clips
	// max_output_tokens to what is left (ResponsesRequest.to_sampling_params takes
	// min(max_output_tokens, max_model_len - prompt)), where chat would refuse it.
	if p := promptTokens(words); p >= e.cfg.MaxModelLen {
		invalid(fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", p, e.cfg.MaxModelLen))
		return
	}
	n, finish, err := e.naturalLength(req.MaxOutputTokens, "max_output_tokens")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if room := e.cfg.MaxModelLen - promptTokens(words); n > room {
		n, finish = room, finishLength
	}
	if f.noContent {
		n, finish = 0, finishStop
	}
	id := req.RequestID
	if id == "" {
		id = newID("resp_")
	}
	created := e.now()
	sr := &storedResponse{
		obj:   e.newResponseObject(&req, id, t.name, created.Unix()),
		msgID: newID("msg_"), rsID: newID("rs_"),
		n: n, reasoning: min(f.reasoning, n), prompt: promptTokens(words), finish: finish,
		promptText: strings.Join(words, " "),
		background: req.Background, m: t.m, created: created,
	}
	sr.size = 1024 + len(sr.promptText) + len(sr.obj.Metadata) + len(sr.obj.Tools) + len(sr.obj.ToolChoice) +
		len(sr.obj.Reasoning) + len(sr.obj.Text)
	if req.Instructions != nil {
		sr.size += len(*req.Instructions)
	}
	s := &seq{
		call:  e.newCall(w, r, f, apiOpenAI, t, req.Stream),
		words: words, promptTokens: sr.prompt, cacheable: true, n: n, finish: finish,
	}
	defer s.end(&err)
	if req.Background {
		err = e.startBackground(s, sr)
		return
	}
	rs := &responder{seq: s, sr: sr, store: store}
	if req.Stream {
		err = s.serveStream(rs)
		return
	}
	err = s.serveUnary("application/json", func() ([]byte, error) {
		rs.finished()
		return json.Marshal(sr.final())
	})
}

// startBackground answers a background request at once with the queued response, after the
// faults before the headers. From then on the response generates by time alone (see
// [storedResponse]): it takes no running slot, its time to first token and inter-token
// latency are fixed from the load at creation, and it is counted as completed (or aborted
// when cancelled) once the engine sees its time pass. The reply itself is then untracked:
// body faults on it do not change the response's outcome.
func (e *Engine) startBackground(s *seq, sr *storedResponse) error {
	if handled, err := s.preHeaders(); handled || err != nil {
		return err
	}
	s.closeAfterHeaders("application/json")
	sr.cached = e.lookupPrefix(sr.m, s.model, s.words, sr.prompt)
	running := e.sched.numRunning() + 1
	sr.ttft = e.ttftFor(sr.prompt-sr.cached, running)
	sr.itl = e.itlFor(running)
	queued := sr.obj
	queued.Status = statusQueued
	e.storeResponse(sr)
	s.tracked = false
	b, err := json.Marshal(queued)
	if err != nil {
		return err
	}
	return s.writeBody(b, finishStop)
}

// responder renders a Responses API stream: response.created and response.in_progress at
// once; at the first token of each output item its output_item.added and
// content_part.added; one response.output_text.delta (or response.reasoning_text.delta)
// per token; the done events after the last token; response.completed with the whole
// response last. Every event has "type" and a "sequence_number" counted from 0.
type responder struct {
	*seq
	sr    *storedResponse
	store bool
	seqNo int
}

var _ streamer = (*responder)(nil)

// emit numbers v and writes it as the typed event typ.
func (rs *responder) emit(typ string, v any) error {
	b, err := rs.eventBytes(typ, v)
	if err != nil {
		return err
	}
	return rs.write(b)
}

// eventBytes numbers v and encodes it as the typed event typ.
func (rs *responder) eventBytes(typ string, v any) ([]byte, error) {
	n := rs.seqNo
	rs.seqNo++
	switch ev := v.(type) {
	case *responsesErrorEvent:
		ev.SequenceNumber, ev.Type = n, typ
	case *lifecycleEvent:
		ev.SequenceNumber, ev.Type = n, typ
	case *outputItemEvent:
		ev.SequenceNumber, ev.Type = n, typ
	case *contentPartEvent:
		ev.SequenceNumber, ev.Type = n, typ
	case *textDeltaEvent:
		ev.SequenceNumber, ev.Type = n, typ
	case *textDoneEvent:
		ev.SequenceNumber, ev.Type = n, typ
	}
	return eventBytes(typ, v)
}

// open implements streamer.
func (rs *responder) open() error {
	obj := rs.sr.obj
	obj.Status = statusInProgress
	if err := rs.emit("response.created", &lifecycleEvent{Response: obj}); err != nil {
		return err
	}
	return rs.emit("response.in_progress", &lifecycleEvent{Response: obj})
}

// lead implements streamer.
func (rs *responder) lead() (bool, error) { return false, nil }

// messageIndex is the output index of the message item: after the reasoning item, if any.
func (rs *responder) messageIndex() int {
	if rs.sr.reasoning > 0 {
		return 1
	}
	return 0
}

// token implements streamer.
func (rs *responder) token(i int) error {
	sr := rs.sr
	if i < sr.reasoning {
		if i == 0 {
			item := reasoningItem{ID: sr.rsID, Summary: []struct{}{}, Type: "reasoning", Status: new(statusInProgress)}
			if err := rs.emit("response.output_item.added", &outputItemEvent{Item: item}); err != nil {
				return err
			}
			part := reasoningText{Type: "reasoning_text"}
			if err := rs.emit("response.content_part.added", &contentPartEvent{ItemID: sr.rsID, Part: part}); err != nil {
				return err
			}
		}
		return rs.emit("response.reasoning_text.delta", &textDeltaEvent{ItemID: sr.rsID, Delta: ReasoningToken(i)})
	}
	j, idx := i-sr.reasoning, rs.messageIndex()
	if j == 0 {
		if sr.reasoning > 0 {
			if err := rs.reasoningDone(); err != nil {
				return err
			}
		}
		item := outputMessage{ID: sr.msgID, Content: []outputText{}, Role: "assistant", Status: statusInProgress, Type: "message"}
		if err := rs.emit("response.output_item.added", &outputItemEvent{Item: item, OutputIndex: idx}); err != nil {
			return err
		}
		part := outputText{Annotations: []struct{}{}, Type: "output_text", Logprobs: rawEmptyList}
		if err := rs.emit("response.content_part.added", &contentPartEvent{ItemID: sr.msgID, OutputIndex: idx, Part: part}); err != nil {
			return err
		}
	}
	return rs.emit("response.output_text.delta", &textDeltaEvent{
		ItemID: sr.msgID, OutputIndex: idx, Delta: ContentToken(j), Logprobs: rawEmptyList,
	})
}

// reasoningDone writes the done events of the reasoning item.
func (rs *responder) reasoningDone() error {
	sr := rs.sr
	_, text := outputContent(sr.reasoning, sr.reasoning)
	if err := rs.emit("response.reasoning_text.done", &textDoneEvent{ItemID: sr.rsID, Text: text}); err != nil {
		return err
	}
	part := reasoningText{Text: text, Type: "reasoning_text"}
	if err := rs.emit("response.content_part.done", &contentPartEvent{ItemID: sr.rsID, Part: part}); err != nil {
		return err
	}
	item := reasoningItem{
		ID: sr.rsID, Summary: []struct{}{}, Type: "reasoning", Content: []reasoningText{part}, Status: new(statusCompleted),
	}
	return rs.emit("response.output_item.done", &outputItemEvent{Item: item})
}

// close implements streamer: the done events of the last output item. The generation is
// over, so the response is stored now.
func (rs *responder) close() error {
	rs.finished()
	sr := rs.sr
	switch {
	case sr.n == 0:
		return nil
	case sr.n == sr.reasoning:
		return rs.reasoningDone()
	}
	idx := rs.messageIndex()
	text, _ := outputContent(sr.n, sr.reasoning)
	if err := rs.emit("response.output_text.done", &textDoneEvent{
		ItemID: sr.msgID, OutputIndex: idx, Text: text, Logprobs: rawEmptyList,
	}); err != nil {
		return err
	}
	part := outputText{Annotations: []struct{}{}, Text: text, Type: "output_text"}
	if err := rs.emit("response.content_part.done", &contentPartEvent{ItemID: sr.msgID, OutputIndex: idx, Part: part}); err != nil {
		return err
	}
	item := outputMessage{ID: sr.msgID, Content: []outputText{part}, Role: "assistant", Status: statusCompleted, Type: "message"}
	return rs.emit("response.output_item.done", &outputItemEvent{Item: item, OutputIndex: idx})
}

// finished records the end of the generation: the cached prompt tokens and, when the
// request stores it, the stored response.
func (rs *responder) finished() {
	sr := rs.sr
	sr.cached = rs.cached
	sr.status = sr.finalStatus()
	if rs.store {
		rs.e.storeResponse(sr)
	}
}

// terminator implements streamer: response.completed, with the whole response.
func (rs *responder) terminator() ([]byte, error) {
	return rs.eventBytes("response.completed", &lifecycleEvent{Response: rs.sr.final()})
}

// responsesErrorEvent is the Responses API's stream error event (OpenAI's
// ResponseErrorEvent): {type "error", code, message, param, sequence_number}.
type responsesErrorEvent struct {
	Type           string  `json:"type"`
	Code           string  `json:"code"`
	Message        string  `json:"message"`
	Param          *string `json:"param"`
	SequenceNumber int     `json:"sequence_number"`
}

// midError implements streamer: the error event, numbered in the stream, with vLLM's 500
// error type as its code; nothing follows it.
func (rs *responder) midError() ([]byte, error) {
	return rs.eventBytes("error", &responsesErrorEvent{Code: errorType(midErrorStatus), Message: midErrorMessage})
}

// malformed implements streamer.
func (rs *responder) malformed() string {
	return "event: response.output_text.delta\n" + malformedEvent
}

// serveGetResponse serves GET /v1/responses/{id}: the stored response as it is now (a
// background response is in_progress until its generation time has passed), or vLLM's 404.
func (e *Engine) serveGetResponse(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	if v := r.URL.Query().Get("stream"); v == "true" {
		apiOpenAI.writeTypedError(w, http.StatusBadRequest, "invalid_request_error", "enginesim does not replay response streams")
		return
	}
	id := r.PathValue("id")
	body, _, found, err := e.readResponse(id)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if !found {
		responseNotFound(w, id)
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("application/json", func() ([]byte, error) { return body, nil })
}

// serveCancelResponse serves POST /v1/responses/{id}/cancel: a background response still
// generating is cancelled (status "cancelled", counted as aborted) and returned; any other
// stored response is vLLM's 400 "Cannot cancel a synchronous response."; an unknown id 404.
func (e *Engine) serveCancelResponse(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	id := r.PathValue("id")
	found, cancellable := e.cancellable(id)
	switch {
	case !found:
		responseNotFound(w, id)
		return
	case !cancellable:
		apiOpenAI.writeTypedError(w, http.StatusBadRequest, "invalid_request_error", "Cannot cancel a synchronous response.")
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("application/json", func() ([]byte, error) {
		// Done in the meantime: it is returned as it is, like a cancel that lost the race.
		body, _, _, err := e.cancelResponse(id)
		return body, err
	})
}

// responseNotFound writes vLLM's 404 for an unknown response id.
func responseNotFound(w http.ResponseWriter, id string) {
	apiOpenAI.writeTypedError(w, http.StatusNotFound, "invalid_request_error", fmt.Sprintf("Response with id '%s' not found.", id))
}
