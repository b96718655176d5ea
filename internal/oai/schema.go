package oai

// Schema says how one route's JSON request body is read: which fields
// [Parser.Parse] requires, which one holds the prompt and how that prompt is
// walked for [Request.PromptBytes] and [Request.PrefixHashes], and whether
// the generation fields are read. The gateway keeps one Schema per route in
// its route table; the exported Schema variables cover the routes it serves
// today, and a new route may use its own literal.
//
// A Schema is read, never written, by Parse, so one value can be shared by
// concurrent calls; it must not be modified while Parse may be using it.
// Field names match body keys exactly, after decoding escapes.
type Schema struct {
	// ModelRequired says "model" must be present and a non-empty string
	// (400 "model is required" / "model must not be empty", param
	// "model"); otherwise it may be absent or null, and when present it
	// must still be a string ("model must be a string").
	ModelRequired bool
	// Prompt is the name of the prompt field ("messages", "prompt",
	// "input", ...); "" means the route has none.
	Prompt string
	// PromptKind says how Prompt is walked for PromptBytes and the
	// prefix hashes.
	PromptKind PromptKind
	// PromptRequired says Prompt must be present and not null: 400
	// "<name> is required", param <name>.
	PromptRequired bool
	// PromptNonEmpty says Prompt, when present and not null, must be an
	// array with at least one element: 400 "<name> must be a non-empty
	// array", param <name>.
	PromptNonEmpty bool
	// Preamble names a field whose value is part of the prompt but not of
	// Prompt ("system" for Anthropic, "instructions" for Responses): it is
	// mixed into the prefix hashes' seed (see [Parser]) and its text counts
	// in PromptBytes. "" means none.
	Preamble string
	// Require lists more fields that must be present and not null
	// ("query" and "documents" for rerank): 400 "<f> is required", param
	// f, for the first missing one in this order. Their values are not
	// otherwise checked.
	Require []string
	// Generative says the route generates tokens: stream, stream_options,
	// max_tokens, max_completion_tokens and max_output_tokens are read and
	// type-checked. Otherwise they are not read, and Request.Stream is
	// false.
	Generative bool
}

// PromptKind says how a Schema's Prompt field is walked.
type PromptKind uint8

// The prompt kinds. [Parser] defines each kind's canonical stream.
const (
	// PromptNone: the prompt field is only checked for presence; it is
	// neither walked nor hashed, and PromptBytes is 0.
	PromptNone PromptKind = iota
	// PromptMessages: an array of message objects (role and content), as
	// for chat; it also serves Anthropic messages and Responses input
	// items. A plain string is also accepted and treated as text
	// (Responses "input" may be a string).
	PromptMessages
	// PromptText: a completion-style prompt: a string, an array of
	// strings, an array of token ids, or an array of arrays of token ids.
	PromptText
	// PromptInput: an embeddings-style "input", whose bytes are counted as
	// PromptText's are; it is never hashed, since pooling requests are not
	// prefix-cached.
	PromptInput
)

// The schemas of the routes the gateway serves. They are pointers so that
// a route table can hold them as is; treat them as constants.
var (
	// SchemaChat is POST /v1/chat/completions.
	SchemaChat = &Schema{
		ModelRequired: true,
		Prompt:        "messages", PromptKind: PromptMessages, PromptRequired: true, PromptNonEmpty: true,
		Generative: true,
	}
	// SchemaCompletion is POST /v1/completions.
	SchemaCompletion = &Schema{
		ModelRequired: true,
		Prompt:        "prompt", PromptKind: PromptText, PromptRequired: true,
		Generative: true,
	}
	// SchemaEmbeddings is POST /v1/embeddings.
	SchemaEmbeddings = &Schema{
		ModelRequired: true,
		Prompt:        "input", PromptKind: PromptInput, PromptRequired: true,
	}
	// SchemaResponses is OpenAI's Responses API, POST /v1/responses: the
	// optional "input" is a string or an array of input items, and
	// "instructions" (the system prompt) is the preamble.
	SchemaResponses = &Schema{
		ModelRequired: true,
		Prompt:        "input", PromptKind: PromptMessages,
		Preamble:   "instructions",
		Generative: true,
	}
	// SchemaMessages is Anthropic's Messages API, POST /v1/messages; the
	// top-level "system" is the preamble.
	SchemaMessages = &Schema{
		ModelRequired: true,
		Prompt:        "messages", PromptKind: PromptMessages, PromptRequired: true, PromptNonEmpty: true,
		Preamble:   "system",
		Generative: true,
	}
	// SchemaCountTokens is Anthropic's POST /v1/messages/count_tokens. It
	// runs no model, so its messages are not walked or hashed.
	SchemaCountTokens = &Schema{
		ModelRequired: true,
		Prompt:        "messages", PromptRequired: true,
	}
	// SchemaRerank is POST /rerank, /v1/rerank and /v2/rerank (vLLM,
	// Jina and Cohere style).
	SchemaRerank = &Schema{Require: []string{"query", "documents"}}
	// SchemaScore is vLLM's POST /score and /v1/score, which takes
	// text_1/text_2 or queries/documents, so nothing more is required.
	SchemaScore = &Schema{}
	// SchemaPooling is vLLM's POST /pooling.
	SchemaPooling = &Schema{Prompt: "input", PromptKind: PromptInput, PromptRequired: true}
	// SchemaClassify is vLLM's POST /classify.
	SchemaClassify = &Schema{Prompt: "input", PromptKind: PromptInput, PromptRequired: true}
	// SchemaTokenize is vLLM's POST /tokenize, which takes "prompt" or
	// "messages", so nothing is required.
	SchemaTokenize = &Schema{}
	// SchemaDetokenize is vLLM's POST /detokenize.
	SchemaDetokenize = &Schema{Require: []string{"tokens"}}
	// SchemaSpeech is POST /v1/audio/speech (text to speech; a JSON body,
	// unlike transcriptions: see [ParseForm]).
	SchemaSpeech = &Schema{Require: []string{"input"}}
	// SchemaImages is POST /v1/images/generations.
	SchemaImages = &Schema{Require: []string{"prompt"}}
)
