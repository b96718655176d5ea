package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Finish reasons, as in vLLM.
const (
	finishStop   = "stop"
	finishLength = "length"
)

// genRequest holds the fields the simulator reads from a chat or completions request. Other
// fields are accepted and ignored (n is always 1).
type genRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// Logprobs is chat's boolean logprobs or completions' integer logprobs (the number of
	// most likely tokens per position); see [genRequest.logprobs].
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"` // chat only
	// RequestID is vLLM's request_id extension field: the response id's base when the
	// request has no X-Request-Id header.
	RequestID string `json:"request_id"`
	// ReturnTokenIDs is vLLM's return_token_ids extension field: return the prompt's and
	// the generated tokens' ids.
	ReturnTokenIDs bool `json:"return_token_ids"`
	// KVTransferParams is vLLM's kv_transfer_params: a prefill leg's or a decode leg's
	// (see kvtransfer.go).
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// maxLogprobs is vLLM's default --max-logprobs: the most top logprobs a request may ask for.
const maxLogprobs = 20

// logprobs returns whether the request of kind k asks for logprobs and how many top
// logprobs per position: chat's logprobs (a boolean) and top_logprobs (0..20, which needs
// logprobs), or completions' logprobs (an integer 0..20). The errors are vLLM's validation
// errors, answered with 400.
func (req *genRequest) logprobs(k kind) (on bool, top int, err error) {
	if k == kindCompletion {
		if isNull(req.Logprobs) {
			return false, 0, nil
		}
		if err := json.Unmarshal(req.Logprobs, &top); err != nil {
			return false, 0, badRequestf("logprobs must be an integer")
		}
		if top < 0 {
			return false, 0, badRequestf("`logprobs` must be a positive value.")
		}
		return true, top, checkMaxLogprobs(top)
	}
	if !isNull(req.Logprobs) {
		if err := json.Unmarshal(req.Logprobs, &on); err != nil {
			return false, 0, badRequestf("logprobs must be a boolean")
		}
	}
	if req.TopLogprobs != nil {
		top = *req.TopLogprobs
	}
	switch {
	case top < 0:
		return false, 0, badRequestf("`top_logprobs` must be a positive value.")
	case top > 0 && !on:
		return false, 0, badRequestf("when using `top_logprobs`, `logprobs` must be set to true.")
	}
	if !on {
		return false, 0, nil
	}
	return true, top, checkMaxLogprobs(top)
}

// checkMaxLogprobs rejects more top logprobs than vLLM's default --max-logprobs allows, with
// vLLM's message.
func checkMaxLogprobs(n int) error {
	if n > maxLogprobs {
		return badRequestf("Requested sample logprobs of %d, which is greater than max allowed: %d", n, maxLogprobs)
	}
	return nil
}

// chatMessage is one chat message; content is a string, an array of parts, or null.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one element of an array-valued message content. Only "text" parts count.
type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// embeddingRequest holds the fields the simulator reads from an embeddings request.
type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"` // "float" (default) or "base64"
}

// badRequestf returns a client error, answered with 400 and its text as the message.
func badRequestf(format string, args ...any) error {
	return fmt.Errorf(format, args...)
}

// decodeJSON decodes body into v, reporting every failure as a client error.
func decodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequestf("request body is empty; expected a JSON object")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequestf("invalid JSON body: %v", err)
	}
	return nil
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// chatPromptWords returns the whitespace-separated words of all message text: string
// contents and the text of {"type":"text"} parts (other part types are ignored).
func chatPromptWords(msgs []chatMessage) ([]string, error) {
	if len(msgs) == 0 {
		return nil, badRequestf("messages must be a non-empty array")
	}
	var words []string
	for i, m := range msgs {
		if isNull(m.Content) {
			continue
		}
		var s string
		if err := json.Unmarshal(m.Content, &s); err == nil {
			words = append(words, strings.Fields(s)...)
			continue
		}
		var parts []contentPart
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return nil, badRequestf("messages[%d].content must be a string or an array of content parts", i)
		}
		for _, p := range parts {
			if p.Type == "text" {
				words = append(words, strings.Fields(p.Text)...)
			}
		}
	}
	return words, nil
}

// inputItems decodes a completions prompt or an embeddings input: a string, an array of
// strings, an array of token ids, or an array of arrays of token ids. It returns one word list
// per item (a token id counts as one word, its decimal form) and a key per item that
// identifies its content.
func inputItems(raw json.RawMessage, field string) (items [][]string, keys []string, err error) {
	if isNull(raw) {
		return nil, nil, badRequestf("%s is required", field)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return [][]string{strings.Fields(s)}, []string{"s:" + s}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		for _, s := range ss {
			items = append(items, strings.Fields(s))
			keys = append(keys, "s:"+s)
		}
		return nonEmpty(items, keys, field)
	}
	idsKey := func(ids []int) ([]string, string) {
		words := make([]string, len(ids))
		for i, id := range ids {
			words[i] = strconv.Itoa(id)
		}
		return words, "t:" + strings.Join(words, ",")
	}
	var ids []int
	if json.Unmarshal(raw, &ids) == nil {
		words, key := idsKey(ids)
		return nonEmpty([][]string{words}, []string{key}, field)
	}
	var idss [][]int
	if json.Unmarshal(raw, &idss) == nil {
		for _, ids := range idss {
			words, key := idsKey(ids)
			items = append(items, words)
			keys = append(keys, key)
		}
		return nonEmpty(items, keys, field)
	}
	return nil, nil, badRequestf("%s must be a string, an array of strings, an array of token ids or an array of arrays of token ids", field)
}

func nonEmpty(items [][]string, keys []string, field string) ([][]string, []string, error) {
	if len(items) == 0 {
		return nil, nil, badRequestf("%s must not be empty", field)
	}
	return items, keys, nil
}

// wordList returns the whitespace-separated words of the strings ss, in order.
func wordList(ss ...string) []string {
	var words []string
	for _, s := range ss {
		words = append(words, strings.Fields(s)...)
	}
	return words
}

// promptTokens is the simulator's token count for words: one token per word, at least 1.
func promptTokens(words []string) int {
	return max(1, len(words))
}

// vllmCompletionMaxTokens is vLLM's default max_tokens of a completions request
// (CompletionRequest.max_tokens = 16 in vllm/entrypoints/openai/protocol.py), which its
// context length check uses when the request sets none.
const vllmCompletionMaxTokens = 16

// contextMaxTokens returns the max_tokens that vLLM checks against max_model_len for a chat
// or completions request: chat's "max_completion_tokens or max_tokens" (a Python or, so 0
// falls through), completions' max_tokens or its default of 16; nil when chat sets neither.
func (req *genRequest) contextMaxTokens(k kind) *int {
	if k == kindCompletion {
		if req.MaxTokens == nil {
			d := vllmCompletionMaxTokens
			return &d
		}
		return req.MaxTokens
	}
	if req.MaxCompletionTokens != nil && *req.MaxCompletionTokens != 0 {
		return req.MaxCompletionTokens
	}
	return req.MaxTokens
}

// checkContextLength is vLLM's context length check of a generation request
// (OpenAIServing._validate_input in vllm/entrypoints/openai/serving_engine.py, 0.10.x): with
// no max_tokens, a prompt of max_model_len tokens or more is refused; with max_tokens, a
// prompt plus max_tokens over max_model_len is. The messages are vLLM's, word for word (the
// first one's comma included); the caller answers them with 400.
func (e *Engine) checkContextLength(promptTokens int, maxTokens *int) error {
	maxLen := e.cfg.MaxModelLen
	if maxTokens == nil {
		if promptTokens >= maxLen {
			return badRequestf("This model's maximum context length is %d tokens. However, you requested "+
				"%d tokens in the messages, Please reduce the length of the messages.", maxLen, promptTokens)
		}
		return nil
	}
	if promptTokens+*maxTokens > maxLen {
		return badRequestf("This model's maximum context length is %d tokens. However, you requested "+
			"%d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			maxLen, *maxTokens+promptTokens, promptTokens, *maxTokens)
	}
	return nil
}

// outputTokens returns the number of tokens to generate and the finish reason for req, whose
// generation starts at content token start (a continuation; 0 otherwise).
// max_completion_tokens wins over max_tokens, as in vLLM. Without either the generation
// ends at content token Config.OutputTokens (capped by Config.MaxOutputTokens) whatever
// start is, so that a continuation stops where the uncut generation stops.
//
// Without a limit the generation also stops at max_model_len (vLLM's default max_tokens is
// max_model_len minus the prompt), given the prompt's promptTokens.
func (e *Engine) outputTokens(req *genRequest, start, promptTokens int) (int, string, error) {
	limit := req.MaxCompletionTokens
	name := "max_completion_tokens"
	if limit == nil {
		limit, name = req.MaxTokens, "max_tokens"
	}
	if limit == nil {
		n := max(0, min(e.cfg.OutputTokens, e.cfg.MaxOutputTokens)-start)
		if room := e.cfg.MaxModelLen - promptTokens; n > room {
			return room, finishLength, nil // vLLM's default max_tokens: the room left
		}
		return n, finishStop, nil
	}
	if *limit < 1 {
		return 0, "", badRequestf("%s must be at least 1, got %d", name, *limit)
	}
	return min(*limit, e.cfg.MaxOutputTokens), finishLength, nil
}

// target is the model a request runs on: the base model's state (scheduler counts and
// metrics, shared with its LoRA adapters, as vLLM labels adapter requests with the base
// model) and the name echoed in responses (the model or the adapter).
type target struct {
	m    *modelState
	name string
}

// begin does what every tracked endpoint does first: count the request, echo its id and
// parse its faults. On a bad fault spec it writes the 400 and returns ok=false.
func (e *Engine) begin(a api, w http.ResponseWriter, r *http.Request) (*faults, bool) {
	e.received.Add(1)
	return e.beginLight(a, w, r)
}

// beginLight is begin for the untracked routes: the request is not counted.
func (e *Engine) beginLight(a api, w http.ResponseWriter, r *http.Request) (*faults, bool) {
	echoRequestID(w, r)
	f, err := e.faultsFor(r)
	if err != nil {
		a.writeError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return f, true
}

// resolve finds the target of a request naming model ("": the first served model). An
// unknown model (or an unloaded adapter) is answered with vLLM's 404.
func (e *Engine) resolve(a api, w http.ResponseWriter, model string) (target, bool) {
	t, ok := e.target(model)
	if !ok {
		a.writeError(w, http.StatusNotFound, modelNotFound(model))
	}
	return t, ok
}

// awake answers 503 and returns false while the engine sleeps (POST /sleep): a sleeping
// vLLM engine has no weights or KV cache to serve generation or pooling requests with.
func (e *Engine) awake(a api, w http.ResponseWriter) bool {
	if e.asleep.Load() {
		a.writeError(w, http.StatusServiceUnavailable, errSleeping)
		return false
	}
	if e.draining.Load() {
		a.writeError(w, http.StatusServiceUnavailable, errDraining)
		return false
	}
	return true
}

// errDraining is the message of the 503 answered while the engine drains.
const errDraining = "The engine is draining (shutting down) and accepts no new requests."

// errSleeping is the message of the 503 answered while the engine sleeps.
const errSleeping = "The engine is sleeping; POST /wake_up to serve requests again."

// admit does what every tracked JSON endpoint does first: begin, parse its body into req,
// resolve the model model(req) names and check that the engine is awake. On failure it
// writes the error (in the route's envelope a: 400, 404, 503 or the body reader's status)
// and returns ok=false.
func admit[T any](e *Engine, a api, w http.ResponseWriter, r *http.Request, req *T, model func(*T) string) (*faults, target, bool) {
	f, ok := e.begin(a, w, r)
	if !ok {
		return nil, target{}, false
	}
	if !decodeBody(a, w, r, req) {
		return nil, target{}, false
	}
	t, ok := e.resolve(a, w, model(req))
	if !ok || !e.awake(a, w) {
		return nil, target{}, false
	}
	return f, t, true
}

// decodeBody reads r's body (capped at maxBodyBytes) and decodes it into req, writing the
// error (400 or 413) and returning false on failure.
func decodeBody[T any](a api, w http.ResponseWriter, r *http.Request, req *T) bool {
	body, status, err := readBody(w, r)
	if err != nil {
		a.writeError(w, status, "failed to read request body: "+err.Error())
		return false
	}
	if err := decodeJSON(body, req); err != nil {
		a.writeError(w, http.StatusBadRequest, err.Error())
		return false
	}
	return true
}
