package telemetry

// This file holds only data: a transcription of the OpenTelemetry GenAI
// semantic conventions that the gateway's telemetry is checked against.
//
// Source repository: github.com/open-telemetry/semantic-conventions
// Tag:               v1.41.1 (lightweight tag, commit dated 2026-05-11T15:25:37-07:00)
// Commit:            ead83b9b0fa36540c1642fce46e874f002ac23f1
//
// Transcribed from these paths at that commit:
//
//	model/gen-ai/metrics.yaml        (metric names, instruments, units, attribute requirement levels)
//	model/gen-ai/spans.yaml          (span.gen_ai.inference.client and its attribute groups)
//	model/gen-ai/registry.yaml       (attribute types and well-known values)
//	docs/gen-ai/gen-ai-metrics.md    (advised ExplicitBucketBoundaries, metric requirement levels)
//	docs/gen-ai/gen-ai-spans.md      (inference span name, kind and rendered attribute table)
//
// Why v1.41.1 and not a newer tag: github.com/open-telemetry/semantic-conventions-genai
// (where GenAI now lives) could not be fetched, and in the fallback repository
// v1.42.0 (#3696, commit c9e48b1d1af565454b73b9e14f0841bca4670ada) moved GenAI out:
// from v1.42.0 to v1.44.0 (the newest tag) docs/gen-ai/*.md are "Moved" stubs and
// every gen_ai.* definition is marked deprecated under model/gen-ai/deprecated/.
// v1.41.1 is therefore the newest tag with normative GenAI conventions. Its GenAI
// files are identical to v1.41.0's.
//
// Level is one of "required", "conditionally_required", "recommended", "opt_in".
// Any condition attached to a level is in the trailing comment.

const genaiSpecVersion = "v1.41.1"

const genaiSpecCommit = "ead83b9b0fa36540c1642fce46e874f002ac23f1"

type specAttr struct {
	Key   string
	Level string
}

type specMetric struct {
	Name, Kind, Unit string
	Buckets          []float64
	Attrs            []specAttr
}

// Advised ExplicitBucketBoundaries from docs/gen-ai/gen-ai-metrics.md.
var (
	genaiSpecTokenBuckets    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	genaiSpecDurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	genaiSpecTPOTBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
	genaiSpecTTFTBuckets     = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}
)

// genaiSpecMetrics lists every gen_ai.* metric defined at genaiSpecVersion
// (7 metrics, all histograms, all stability "development"). Attribute order
// follows the rendered tables in docs/gen-ai/gen-ai-metrics.md.
var genaiSpecMetrics = []specMetric{
	{
		// Client metric. "recommended when an operation involves the usage of
		// tokens and the count is readily available". No error.type.
		Name: "gen_ai.client.token.usage", Kind: "histogram", Unit: "{token}",
		Buckets: genaiSpecTokenBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"gen_ai.token.type", "required"},                  // "input" | "output"
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
	{
		// Client metric. "This metric is required."
		Name: "gen_ai.client.operation.duration", Kind: "histogram", Unit: "s",
		Buckets: genaiSpecDurationBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"error.type", "conditionally_required"},           // if the operation ended in an error
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
	{
		// Client metric, recommended. "SHOULD be reported for streaming calls and
		// SHOULD NOT be reported otherwise." No error.type.
		Name: "gen_ai.client.operation.time_to_first_chunk", Kind: "histogram", Unit: "s",
		Buckets: genaiSpecDurationBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
	{
		// Client metric, recommended. One observation per chunk after the first
		// (end of previous chunk to end of current chunk). Streaming calls only.
		// No error.type.
		Name: "gen_ai.client.operation.time_per_output_chunk", Kind: "histogram", Unit: "s",
		Buckets: genaiSpecDurationBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
	{
		// Model-server metric, recommended.
		Name: "gen_ai.server.request.duration", Kind: "histogram", Unit: "s",
		Buckets: genaiSpecDurationBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"error.type", "conditionally_required"},           // if the operation ended in an error
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
	{
		// Model-server metric, recommended. "for successful responses"; no error.type.
		Name: "gen_ai.server.time_per_output_token", Kind: "histogram", Unit: "s",
		Buckets: genaiSpecTPOTBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
	{
		// Model-server metric, recommended. "for successful responses"; no error.type.
		Name: "gen_ai.server.time_to_first_token", Kind: "histogram", Unit: "s",
		Buckets: genaiSpecTTFTBuckets,
		Attrs: []specAttr{
			{"gen_ai.operation.name", "required"},
			{"gen_ai.provider.name", "required"},
			{"gen_ai.request.model", "conditionally_required"}, // If available.
			{"server.port", "conditionally_required"},          // If `server.address` is set.
			{"gen_ai.response.model", "recommended"},
			{"server.address", "recommended"},
		},
	},
}

// genaiSpecSpanAttrs is span.gen_ai.inference.client ("Inference" in
// docs/gen-ai/gen-ai-spans.md): span name `{gen_ai.operation.name} {gen_ai.request.model}`,
// span kind CLIENT. 31 attributes, in the rendered table's order.
// Sampling-relevant (SHOULD be set at span creation): gen_ai.operation.name,
// gen_ai.provider.name, gen_ai.request.model, server.address, server.port.
var genaiSpecSpanAttrs = []specAttr{
	{"gen_ai.operation.name", "required"},
	{"gen_ai.provider.name", "required"},
	{"error.type", "conditionally_required"},                  // if the operation ended in an error
	{"gen_ai.conversation.id", "conditionally_required"},      // when available
	{"gen_ai.output.type", "conditionally_required"},          // when applicable and if the request includes an output format.
	{"gen_ai.request.choice.count", "conditionally_required"}, // if available, in the request, and !=1
	{"gen_ai.request.model", "conditionally_required"},        // If available.
	{"gen_ai.request.seed", "conditionally_required"},         // if applicable and if the request includes a seed
	{"gen_ai.request.stream", "conditionally_required"},       // If and only if the request is streaming. If unset, the request is assumed to be non-streaming.
	{"server.port", "conditionally_required"},                 // If `server.address` is set.
	{"gen_ai.request.frequency_penalty", "recommended"},
	{"gen_ai.request.max_tokens", "recommended"},
	{"gen_ai.request.presence_penalty", "recommended"},
	{"gen_ai.request.stop_sequences", "recommended"}, // string[]
	{"gen_ai.request.temperature", "recommended"},
	{"gen_ai.request.top_k", "recommended"}, // double
	{"gen_ai.request.top_p", "recommended"},
	{"gen_ai.response.finish_reasons", "recommended"}, // string[]
	{"gen_ai.response.id", "recommended"},
	{"gen_ai.response.model", "recommended"},
	{"gen_ai.response.time_to_first_chunk", "recommended"}, // if the request was a streaming request; double, seconds
	{"gen_ai.usage.cache_creation.input_tokens", "recommended"},
	{"gen_ai.usage.cache_read.input_tokens", "recommended"},
	{"gen_ai.usage.input_tokens", "recommended"},
	{"gen_ai.usage.output_tokens", "recommended"},
	{"gen_ai.usage.reasoning.output_tokens", "recommended"}, // when applicable
	{"server.address", "recommended"},
	{"gen_ai.input.messages", "opt_in"},
	{"gen_ai.output.messages", "opt_in"},
	{"gen_ai.system_instructions", "opt_in"},
	{"gen_ai.tool.definitions", "opt_in"},
}
