package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Attribute keys of Switchboard's instruments and spans: the one place
// they are spelled, so the gateway never writes a key as a string. A key
// the OpenTelemetry Go semconv package defines is its constant; the GenAI
// keys are spelled out, because semconv v1.43.0 (the version the HTTP
// server attributes come from) no longer carries the gen_ai namespace, after the conventions of
// [GenAIConventions] (model/gen-ai/registry.yaml); the switchboard.* keys
// are Switchboard's own.
//
// The metric attributes are the short ones (engine, model, phase,
// operation, ...); the span attributes are namespaced. The keys of the API
// key metrics, the reload counter and the retry counter sit with their
// instruments (keys.go, reload.go, retry.go).
const (
	// AttrEngine is the engine's configured name on the switchboard.engine.*
	// metrics: a bounded set.
	AttrEngine = attribute.Key("engine")
	// AttrPhase is the phase of switchboard.engine.active_requests:
	// prefill or decode.
	AttrPhase = attribute.Key("phase")
	// AttrModel is the served model on the switchboard.engine.* metrics,
	// one the engines report (never the request's raw field).
	AttrModel = attribute.Key("model")
	// AttrOperation is the gateway route's operation name from its
	// operation table ("chat", "responses", "messages", "rerank",
	// "tokenize", ...): a fixed vocabulary.
	AttrOperation = attribute.Key("operation")
	// AttrState is the engine state of switchboard.engine.state, one of
	// [EngineStates].
	AttrState = attribute.Key("state")
	// AttrRole is the engine's prefill/decode role on
	// switchboard.engine.state: "both", "prefill" or "decode" (the
	// gateway's fleet.Role names, [DefaultRole] when unset); a bounded
	// set. The span attribute is [AttrSpanEngineRole].
	AttrRole = attribute.Key("role")
	// AttrStep is the step of switchboard.gateway.step.duration: "parse",
	// "pick" or "prepare".
	AttrStep = attribute.Key("step")

	// AttrErrorType is the semantic conventions' error.type: the class of
	// a failed attempt (the gateway's ErrType values), on the metrics and
	// the engine span.
	AttrErrorType = semconv.ErrorTypeKey
	// AttrServerAddress and AttrServerPort are the conventions'
	// server.address and server.port: the engine's host and port.
	AttrServerAddress = semconv.ServerAddressKey
	AttrServerPort    = semconv.ServerPortKey
	// AttrHTTPStatus is the conventions' http.response.status_code: the
	// status of the engine's answer, on the engine span.
	AttrHTTPStatus = semconv.HTTPResponseStatusCodeKey

	// GenAI attributes (conventions v1.41.1, registry gen_ai.*).

	// AttrGenAIOp is gen_ai.operation.name (chat, text_completion,
	// embeddings, ...).
	AttrGenAIOp = attribute.Key("gen_ai.operation.name")
	// AttrGenAIProvider is gen_ai.provider.name, the engine's configured
	// provider (default [DefaultProvider]).
	AttrGenAIProvider = attribute.Key("gen_ai.provider.name")
	// AttrGenAIReqModel is gen_ai.request.model: the model the engine is
	// asked for.
	AttrGenAIReqModel = attribute.Key("gen_ai.request.model")
	// AttrGenAIRespModel is gen_ai.response.model: the model the engine's
	// answer names.
	AttrGenAIRespModel = attribute.Key("gen_ai.response.model")
	// AttrGenAIFinish is gen_ai.response.finish_reasons (a string slice).
	AttrGenAIFinish = attribute.Key("gen_ai.response.finish_reasons")
	// AttrGenAIStream is gen_ai.request.stream, set (true) only when the
	// request to the engine streams.
	AttrGenAIStream = attribute.Key("gen_ai.request.stream")
	// AttrGenAIFirstChunk is gen_ai.response.time_to_first_chunk, in
	// seconds.
	AttrGenAIFirstChunk = attribute.Key("gen_ai.response.time_to_first_chunk")
	// AttrGenAITokType is gen_ai.token.type of gen_ai.client.token.usage:
	// input or output.
	AttrGenAITokType = attribute.Key("gen_ai.token.type")
	// AttrGenAIResponseID is gen_ai.response.id, the engine's completion id.
	AttrGenAIResponseID = attribute.Key("gen_ai.response.id")
	// AttrGenAIInputTok and AttrGenAIOutputTok are
	// gen_ai.usage.input_tokens and gen_ai.usage.output_tokens, from the
	// engine's usage.
	AttrGenAIInputTok  = attribute.Key("gen_ai.usage.input_tokens")
	AttrGenAIOutputTok = attribute.Key("gen_ai.usage.output_tokens")
	// AttrGenAIMaxTokens is gen_ai.request.max_tokens.
	AttrGenAIMaxTokens = attribute.Key("gen_ai.request.max_tokens")
	// AttrGenAITemperature, AttrGenAITopP, AttrGenAITopK,
	// AttrGenAIFrequencyPenalty and AttrGenAIPresencePenalty are the
	// request's sampling parameters gen_ai.request.temperature, top_p,
	// top_k, frequency_penalty and presence_penalty (doubles), set when
	// the request sets them.
	AttrGenAITemperature      = attribute.Key("gen_ai.request.temperature")
	AttrGenAITopP             = attribute.Key("gen_ai.request.top_p")
	AttrGenAITopK             = attribute.Key("gen_ai.request.top_k")
	AttrGenAIFrequencyPenalty = attribute.Key("gen_ai.request.frequency_penalty")
	AttrGenAIPresencePenalty  = attribute.Key("gen_ai.request.presence_penalty")
	// AttrGenAISeed is gen_ai.request.seed (an int).
	AttrGenAISeed = attribute.Key("gen_ai.request.seed")
	// AttrGenAIChoiceCount is gen_ai.request.choice.count, the request's
	// n, set only when it is not 1 (as the conventions require).
	AttrGenAIChoiceCount = attribute.Key("gen_ai.request.choice.count")
	// AttrGenAIStopSequences is gen_ai.request.stop_sequences (a string
	// slice).
	AttrGenAIStopSequences = attribute.Key("gen_ai.request.stop_sequences")
	// AttrGenAIOutputType is gen_ai.output.type, the requested output
	// format (text, json, ...).
	AttrGenAIOutputType = attribute.Key("gen_ai.output.type")

	// Switchboard's own span attributes.

	// AttrRequestID is switchboard.request_id, the request's X-Request-Id.
	AttrRequestID = attribute.Key("switchboard.request_id")
	// AttrKey is the configured name of the request's API key (never the
	// key): a bounded set.
	AttrKey = attribute.Key("switchboard.key")
	// AttrSpanEngine is switchboard.engine, the engine's configured name
	// on the engine span (the metrics carry it as [AttrEngine]).
	AttrSpanEngine = attribute.Key("switchboard.engine")
	// AttrSpanEngineRole is switchboard.engine.role, the engine's
	// prefill/decode role on the engine span: "both", "prefill" or
	// "decode" (fleet.Role's names; engines[].role, or the pod's
	// llm-d.ai/role label under Kubernetes discovery), a bounded set.
	// The metric attribute is [AttrRole].
	AttrSpanEngineRole = attribute.Key("switchboard.engine.role")
	// AttrStream is switchboard.stream: whether the client asked for a
	// stream (the request to the engine may stream either way; see
	// [AttrGenAIStream]).
	AttrStream = attribute.Key("switchboard.stream")
	// AttrModelAlias is switchboard.model_alias: the model name the client
	// used, set when it is an alias of the served model.
	AttrModelAlias = attribute.Key("switchboard.model_alias")
	// AttrReleasedPhase is switchboard.released_phase: the phase (prefill
	// or decode) the attempt's slot was in when it was released.
	AttrReleasedPhase = attribute.Key("switchboard.released_phase")
)

// AttrContinuedTokens is the number of generated tokens a continuation
// leg was given (EventContinuation).
const AttrContinuedTokens = attribute.Key("switchboard.continued_tokens")

// Span event names.
const (
	// EventFirstToken, on the engine span, marks the attempt's first
	// generated token.
	EventFirstToken = "first_token"
	// EventContinuation, on a continuation leg's engine span (linked to
	// the span of the leg that broke), names why the generation was
	// continued (AttrMigrationReason) and from how many generated tokens
	// (AttrContinuedTokens).
	EventContinuation = "continuation"
	// EventClientGone, on the server span, marks a request whose client
	// went away (cancelled, or stalled reading) while it was served.
	EventClientGone = "client went away"
)
