package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
)

// Chat and completions bodies and chunks, field for field in vLLM's order as vLLM 0.10.1's
// OpenAI server writes them (vllm/entrypoints/openai/protocol.py): a non-stream body is
// pydantic's model_dump of the whole response, every field present with its null default; a
// chat chunk is model_dump_json(exclude_unset=True), so a field appears only where vLLM sets
// it; a completions chunk is model_dump_json(exclude_unset=False), every field present; the
// usage chunk of either drops its null fields (exclude_none=True).
//
// The token id fields of vLLM's return_token_ids (added after 0.10.1) are written only when
// the request sets it, in vLLM's places (vllm/entrypoints/openai/protocol.py,
// serving_chat.py and serving_completion.py): chat's prompt_token_ids on the response
// (ChatCompletionResponse, after prompt_logprobs) and on the stream's role chunk
// (ChatCompletionStreamResponse, after usage), its token_ids on each choice
// (ChatCompletionResponseChoice and ChatCompletionResponseStreamChoice, after
// stop_reason); completions' prompt_token_ids and token_ids on each choice
// (CompletionResponseChoice: token_ids after stop_reason, prompt_token_ids after
// prompt_logprobs; CompletionResponseStreamChoice: prompt_token_ids then token_ids after
// stop_reason, prompt_token_ids null but on the choice's first chunk). Without the flag
// vLLM writes them as null where its dump keeps unset fields; the simulator leaves them out,
// so that its bodies stay 0.10.1's.

// usage is vLLM's UsageInfo as the usage chunk of a stream writes it (no null fields).
type usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// promptTokensDetails is vLLM's PromptTokenUsageInfo: a decode leg reports the prompt it
// pulled as cached_tokens (see kvtransfer.go).
type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// usageInfo is vLLM's UsageInfo in a non-stream body: prompt_tokens_details is null (the
// simulator does not send --enable-prompt-tokens-details' cached_tokens) but on a decode
// leg, which reports its cached tokens.
type usageInfo struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *promptTokensDetails `json:"prompt_tokens_details"`
}

// chatChunk is vLLM's ChatCompletionStreamResponse; usage is set on the usage chunk only.
type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usage            `json:"usage,omitempty"`
	// PromptTokenIDs is set on the role chunk under return_token_ids.
	PromptTokenIDs []int `json:"prompt_token_ids,omitempty"`
}

// chatChunkChoice is vLLM's ChatCompletionResponseStreamChoice. logprobs is null unless the
// request asked for them (then an object, {"content": []} on chunks without a token);
// stop_reason is set (null) on the finish chunk only, as vLLM sets it there.
type chatChunkChoice struct {
	Index        int             `json:"index"`
	Delta        chatDelta       `json:"delta"`
	Logprobs     *chatLogprobs   `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"`
	// TokenIDs is the chunk's generated token ids under return_token_ids ([] on a chunk
	// without a token), omitted otherwise.
	TokenIDs *[]int `json:"token_ids,omitempty"`
}

// chatDelta is vLLM's DeltaMessage with only the fields vLLM sets.
type chatDelta struct {
	Role             string          `json:"role,omitempty"`
	Content          *string         `json:"content,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
	ToolCalls        []deltaToolCall `json:"tool_calls,omitempty"`
}

// deltaToolCall is vLLM's DeltaToolCall: the first delta of a call carries its id, type
// and name, later ones argument fragments only.
type deltaToolCall struct {
	Index    int           `json:"index"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function deltaFunction `json:"function"`
}

// deltaFunction is vLLM's DeltaFunctionCall.
type deltaFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// toolCall is vLLM's ToolCall in a non-stream message.
type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// chatCompletion is vLLM's ChatCompletionResponse.
type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	ServiceTier       *string      `json:"service_tier"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Usage             usageInfo    `json:"usage"`
	PromptLogprobs    *struct{}    `json:"prompt_logprobs"`
	PromptTokenIDs    *[]int       `json:"prompt_token_ids,omitempty"` // return_token_ids only
	KVTransferParams  *kvParamsOut `json:"kv_transfer_params"`
}

// chatChoice is vLLM's ChatCompletionResponseChoice.
type chatChoice struct {
	Index        int            `json:"index"`
	Message      chatMessageOut `json:"message"`
	Logprobs     *chatLogprobs  `json:"logprobs"`
	FinishReason string         `json:"finish_reason"`
	StopReason   *string        `json:"stop_reason"`
	TokenIDs     *[]int         `json:"token_ids,omitempty"` // return_token_ids only
}

// chatMessageOut is vLLM's ChatMessage: tool_calls is [] when there are none; content is null
// when the output is all reasoning or tool calls (as vLLM's reasoning and tool parsers
// return it), reasoning_content null without reasoning.
type chatMessageOut struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	Refusal          *string    `json:"refusal"`
	Annotations      *struct{}  `json:"annotations"`
	Audio            *struct{}  `json:"audio"`
	FunctionCall     *struct{}  `json:"function_call"`
	ToolCalls        []toolCall `json:"tool_calls"`
	ReasoningContent *string    `json:"reasoning_content"`
}

// chatLogprobs is vLLM's ChatCompletionLogProbs.
type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

// chatLogprob is vLLM's ChatCompletionLogProbsContent: the sampled token, its logprob, its
// UTF-8 bytes and the top_logprobs most likely tokens at its position, best first (the
// sampled token first, since the simulator samples greedily).
type chatLogprob struct {
	Token       string           `json:"token"`
	Logprob     pyFloat          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

// chatTopLogprob is vLLM's ChatCompletionLogProb.
type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob pyFloat `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// completionChunk is vLLM's CompletionStreamResponse: usage is null except on the usage
// chunk.
type completionChunk struct {
	ID      string                  `json:"id"`
	Object  string                  `json:"object"`
	Created int64                   `json:"created"`
	Model   string                  `json:"model"`
	Choices []completionChunkChoice `json:"choices"`
	Usage   *usage                  `json:"usage"`
}

// completionChunkChoice is vLLM's CompletionResponseStreamChoice.
type completionChunkChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	StopReason   *string             `json:"stop_reason"`
	// PromptTokenIDs and TokenIDs are set under return_token_ids only: the prompt's ids on
	// the choice's first chunk (JSON null on the others), the chunk's generated ids.
	PromptTokenIDs json.RawMessage `json:"prompt_token_ids,omitempty"`
	TokenIDs       *[]int          `json:"token_ids,omitempty"`
}

// completion is vLLM's CompletionResponse.
type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	Choices           []completionChoice `json:"choices"`
	ServiceTier       *string            `json:"service_tier"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Usage             usageInfo          `json:"usage"`
	KVTransferParams  *kvParamsOut       `json:"kv_transfer_params"`
}

// completionChoice is vLLM's CompletionResponseChoice.
type completionChoice struct {
	Index          int                 `json:"index"`
	Text           string              `json:"text"`
	Logprobs       *completionLogprobs `json:"logprobs"`
	FinishReason   string              `json:"finish_reason"`
	StopReason     *string             `json:"stop_reason"`
	TokenIDs       *[]int              `json:"token_ids,omitempty"` // return_token_ids only
	PromptLogprobs *struct{}           `json:"prompt_logprobs"`
	PromptTokenIDs *[]int              `json:"prompt_token_ids,omitempty"` // return_token_ids only
}

// completionLogprobs is vLLM's CompletionLogProbs: per token its character offset in the
// whole generated text, its logprob, its text and a map of the most likely tokens at its
// position (vLLM's sampled token plus the top logprobs: max(k, 1) entries for logprobs k,
// since the simulator's sampled token is also the most likely).
type completionLogprobs struct {
	TextOffset    []int           `json:"text_offset"`
	TokenLogprobs []pyFloat       `json:"token_logprobs"`
	Tokens        []string        `json:"tokens"`
	TopLogprobs   []topLogprobMap `json:"top_logprobs"`
}

// topLogprobMap is one {token: logprob} map of completions' top_logprobs, written in its
// order (best first), as Python keeps a dict's insertion order.
type topLogprobMap []tokenLogprob

type tokenLogprob struct {
	token   string
	logprob pyFloat
}

// MarshalJSON writes m as a JSON object in its order.
func (m topLogprobMap) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, e := range m {
		if i > 0 {
			b = append(b, ',')
		}
		k, err := json.Marshal(e.token)
		if err != nil {
			return nil, err
		}
		b = append(b, k...)
		b = append(b, ':')
		b = e.logprob.appendJSON(b)
	}
	return append(b, '}'), nil
}

// pyFloat is a float written the way Python writes one: an integral value keeps ".0"
// (vLLM's -9999.0), where Go would write -9999.
type pyFloat float64

// MarshalJSON implements json.Marshaler.
func (f pyFloat) MarshalJSON() ([]byte, error) { return f.appendJSON(nil), nil }

func (f pyFloat) appendJSON(b []byte) []byte {
	n := len(b)
	b = strconv.AppendFloat(b, float64(f), 'f', -1, 64)
	if !bytes.ContainsRune(b[n:], '.') {
		b = append(b, ".0"...)
	}
	return b
}

// jsonNull is a JSON null for a json.RawMessage field that is omitted when nil.
var jsonNull = json.RawMessage("null")

type embeddingList struct {
	Object string          `json:"object"`
	Data   []embeddingData `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingUsage  `json:"usage"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

// modelCard is vLLM's ModelCard. max_model_len is null on adapter cards, as in vLLM.
type modelCard struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	OwnedBy     string            `json:"owned_by"`
	Root        string            `json:"root"`
	Parent      *string           `json:"parent"`
	MaxModelLen *int              `json:"max_model_len"`
	Permission  []modelPermission `json:"permission"`
}

// modelPermission is vLLM's ModelPermission with its default values.
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// newPermission returns vLLM's default model permission, created at created.
func newPermission(created int64) modelPermission {
	return modelPermission{
		ID: newID("modelperm-"), Object: "model_permission", Created: created,
		AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*",
	}
}

// ContentToken returns the text of generated content token i: "tok<i> " (with a trailing
// space), so the content of n tokens is "tok0 tok1 ... tok<n-1> ".
func ContentToken(i int) string { return "tok" + strconv.Itoa(i) + " " }

// ReasoningToken returns the text of reasoning token i (fault reasoning=N): "think<i> ".
func ReasoningToken(i int) string { return "think" + strconv.Itoa(i) + " " }

// newID returns prefix followed by 32 random hex digits, like vLLM's request ids.
func newID(prefix string) string {
	return fmt.Sprintf("%s%016x%016x", prefix, rand.Uint64(), rand.Uint64())
}

// The tool call of the tool-call fault: function "f" with arguments "{}", id "call_0".
const (
	simToolCallID   = "call_0"
	simToolCallName = "f"
	simToolCallArgs = "{}"
)
