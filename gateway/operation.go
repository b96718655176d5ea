package gateway

import (
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

// bodyKind is what a route's request body is.
type bodyKind uint8

const (
	// bodyJSON: a JSON object, read by the row's oai.Schema.
	bodyJSON bodyKind = iota
	// bodyForm: multipart/form-data (audio uploads), read by oai.ParseForm.
	bodyForm
	// bodyNone: no body (GET, and POSTs that carry none).
	bodyNone
)

// modelSource is where a route's model name comes from.
type modelSource uint8

const (
	// modelBody: the body's "model" (JSON field or form field).
	modelBody modelSource = iota
	// modelPath: the chi URL parameter named by operation.param.
	modelPath
	// modelQuery: the query parameter named by operation.param.
	modelQuery
	// modelNone: the route names no model; any routable engine serves it.
	modelNone
)

// opClass is how a route holds an engine: what the engine span's slot and
// timings mean for it.
type opClass uint8

const (
	// classGenerative takes a prefill slot, moves it to decode at the first
	// content-bearing stream event and records TTFT and ITL (streams only;
	// a non-streaming answer records its duration).
	classGenerative opClass = iota
	// classPooling takes a slot and never moves it to decode: one forward
	// pass, no tokens to time (embeddings, rerank, score, ...).
	classPooling
	// classLight takes no slot: the engine does no GPU work that competes
	// with generation (tokenize, detokenize, count tokens, retrieving a
	// stored response). Only its duration is recorded.
	classLight
)

// framing is how a route's event stream is read and when it is complete.
type framing uint8

const (
	// frameOpenAI: OpenAI chunks (chat, completions, transcription),
	// complete at `data: [DONE]`; a body that ends without it was cut.
	frameOpenAI framing = iota
	// frameResponses: Responses API events, complete at
	// response.completed, response.failed or response.incomplete.
	frameResponses
	// frameAnthropic: Anthropic Messages events, complete at message_stop.
	frameAnthropic
	// frameAny: any other event stream, passed through and complete when
	// the engine ends the body cleanly; every data event counts as output.
	frameAny
)

// envelope is the shape of a route's error objects.
type envelope uint8

const (
	// envOpenAI: {"error":{"message","type","param","code"}}.
	envOpenAI envelope = iota
	// envAnthropic: {"type":"error","error":{"type","message"}}
	// (https://docs.anthropic.com/en/api/errors).
	envAnthropic
)

// operation is one route the gateway proxies: a row of the operation
// table. Everything the request path does differently per route is read
// from its row; adding a route is adding a row (and its simulator handler
// and test row).
type operation struct {
	// name is the operation attribute of the engine histograms and the
	// access log ("chat", "responses.retrieve", ...): a fixed vocabulary.
	name string
	// genai is gen_ai.operation.name (and the engine span's name prefix):
	// the GenAI semantic-convention value where one exists ("chat",
	// "text_completion", "embeddings"), the route's own name otherwise.
	genai string
	// method and paths are the gateway's routes; the engine gets the same
	// path the client used (vLLM serves /v1/rerank, /v2/rerank and
	// /rerank alike).
	method string
	paths  []string
	body   bodyKind
	// schema reads a bodyJSON body: the model, stream flags and prompt.
	schema *oai.Schema
	// model says where the model comes from; param names the URL or query
	// parameter for modelPath and modelQuery, and the file part for
	// bodyForm ("file").
	model modelSource
	param string
	class opClass
	// framing applies when the engine answers text/event-stream.
	framing framing
	env     envelope
	// injectUsage: a stream may get stream_options.include_usage
	// (Config.InjectUsage), so its token usage is known.
	injectUsage bool
	// remember: the response id of a successful answer is remembered with
	// the engine that made it, for the sticky routes.
	remember bool
	// sticky: the route addresses a stored response by the {id} path
	// parameter and goes to the engine that created it (remembered), else
	// to each routable engine in turn until one does not answer 404.
	sticky bool
	// observe: a non-streaming request may be sent to the engine as a
	// stream and its events reassembled into the body (observes;
	// oai.Reassembler, oai.MessagesReassembler): chat, completions and
	// Anthropic Messages.
	observe bool
	// migrate: a generation broken after its first tokens reached the
	// client may be continued on another engine (migration.go).
	migrate migrateKind
}

// idParam is the path parameter naming a stored response on the sticky
// routes.
const idParam = "id"

// operations is the operation table: every engine route the gateway serves.
// The shapes are vLLM's OpenAI-compatible server
// (vllm/entrypoints/openai/api_server.py) and the vLLM production-stack
// router's proxied routes.
var operations = []*operation{
	// Generation.
	{name: "chat", genai: "chat", method: http.MethodPost, paths: []string{"/v1/chat/completions"},
		schema: oai.SchemaChat, framing: frameOpenAI, injectUsage: true, observe: true, migrate: migrateChat},
	{name: "completions", genai: "text_completion", method: http.MethodPost, paths: []string{"/v1/completions"},
		schema: oai.SchemaCompletion, framing: frameOpenAI, injectUsage: true, observe: true, migrate: migrateCompletion},
	{name: "responses", genai: "chat", method: http.MethodPost, paths: []string{"/v1/responses"},
		schema: oai.SchemaResponses, framing: frameResponses, remember: true, observe: true, migrate: migrateResponses},
	{name: "responses.retrieve", genai: "responses.retrieve", method: http.MethodGet, paths: []string{"/v1/responses/{id}"},
		body: bodyNone, model: modelNone, class: classLight, framing: frameResponses, sticky: true},
	{name: "responses.cancel", genai: "responses.cancel", method: http.MethodPost, paths: []string{"/v1/responses/{id}/cancel"},
		body: bodyNone, model: modelNone, class: classLight, framing: frameResponses, sticky: true},
	{name: "messages", genai: "chat", method: http.MethodPost, paths: []string{"/v1/messages"},
		schema: oai.SchemaMessages, framing: frameAnthropic, env: envAnthropic, observe: true, migrate: migrateMessages},
	{name: "messages.count_tokens", genai: "count_tokens", method: http.MethodPost, paths: []string{"/v1/messages/count_tokens"},
		schema: oai.SchemaCountTokens, class: classLight, env: envAnthropic},
	{name: "audio.transcriptions", genai: "transcription", method: http.MethodPost, paths: []string{"/v1/audio/transcriptions"},
		body: bodyForm, param: "file", framing: frameOpenAI},
	{name: "audio.translations", genai: "translation", method: http.MethodPost, paths: []string{"/v1/audio/translations"},
		body: bodyForm, param: "file", framing: frameOpenAI},
	{name: "audio.speech", genai: "speech", method: http.MethodPost, paths: []string{"/v1/audio/speech"},
		schema: oai.SchemaSpeech, framing: frameAny},
	{name: "images.generations", genai: "image_generation", method: http.MethodPost, paths: []string{"/v1/images/generations"},
		schema: oai.SchemaImages, framing: frameAny},

	// Pooling and scoring.
	{name: "embeddings", genai: "embeddings", method: http.MethodPost, paths: []string{"/v1/embeddings"},
		schema: oai.SchemaEmbeddings, class: classPooling, framing: frameAny},
	{name: "rerank", genai: "rerank", method: http.MethodPost, paths: []string{"/v1/rerank", "/v2/rerank", "/rerank"},
		schema: oai.SchemaRerank, class: classPooling, framing: frameAny},
	{name: "score", genai: "score", method: http.MethodPost, paths: []string{"/v1/score", "/score"},
		schema: oai.SchemaScore, class: classPooling, framing: frameAny},
	{name: "pooling", genai: "pooling", method: http.MethodPost, paths: []string{"/pooling"},
		schema: oai.SchemaPooling, class: classPooling, framing: frameAny},
	{name: "classify", genai: "classify", method: http.MethodPost, paths: []string{"/classify"},
		schema: oai.SchemaClassify, class: classPooling, framing: frameAny},

	// Light.
	{name: "tokenize", genai: "tokenize", method: http.MethodPost, paths: []string{"/tokenize"},
		schema: oai.SchemaTokenize, class: classLight, framing: frameAny},
	{name: "detokenize", genai: "detokenize", method: http.MethodPost, paths: []string{"/detokenize"},
		schema: oai.SchemaDetokenize, class: classLight, framing: frameAny},
}

// fixedPaths returns the paths of ops without a pattern ({id}): the fleet
// builds each engine's URL for each once (fleet.WithPaths).
func fixedPaths(ops []*operation) []string {
	var out []string
	for _, op := range ops {
		for _, path := range op.paths {
			if !strings.Contains(path, "{") {
				out = append(out, path)
			}
		}
	}
	return out
}

// budget is a gateway-wide byte budget shared by all requests
// (Config.MaxBufferedBytes). It is always counted; limit 0 means take never
// fails.
type budget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes and reports whether they fit under the limit;
// when they do not, nothing is reserved.
func (b *budget) take(n int64) bool {
	if v := b.used.Add(n); b.limit > 0 && v > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n reserved bytes.
func (b *budget) give(n int64) { b.used.Add(-n) }
