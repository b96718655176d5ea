// Package oai reads the few fields of OpenAI-compatible bodies that the
// gateway routes and accounts on, without decoding the rest.
//
// [ParseRequest] runs once per request on the raw body, which the gateway
// keeps and forwards unchanged: it validates the body as JSON and extracts
// the model, the stream flags, the session key, the token limit and an
// estimate of the prompt size, or returns a [RequestError] that the gateway
// turns into a 400 invalid_request_error without contacting an engine.
// [Parser.Parse] does the same and, in the same pass, hashes the prompt's
// leading fixed-size blocks into [Request.PrefixHashes] for prefix-cache-
// aware routing.
// [InspectChunk] runs on the data of every streamed SSE event and says
// whether it carries output (for time to first token and inter-token
// latency), finishes a choice, reports usage or is an error.
// [ParseResponse] takes the id and usage from a non-streaming response.
//
// # Parsing
//
// All three read the body in a single pass with a small validating JSON
// reader that accepts exactly what encoding/json accepts (the tests compare
// it with json.Valid and with encoding/json reference implementations,
// including under fuzzing). Object keys match exactly, after decoding
// escapes, and the last of duplicate keys wins, which is how the engines'
// JSON parsers read a body; encoding/json's case-insensitive field matching
// would let {"model":"a","MODEL":"b"} route as "b" while the engine serves
// "a". encoding/json is still used where it is rare and convenient: to
// describe a syntax error and to decode strings that contain escapes.
//
// # Prefix hashes
//
// Two requests for the same model whose prompts start with the same blocks
// get the same leading PrefixHashes, so a policy can remember which engine
// saw which hashes and send a request where most of its prefix is likely to
// be in the KV cache, as the Gateway API Inference Extension's prefix-cache
// scorer does. The hashes cover a canonical stream of the prompt (roles,
// contents and tool calls for chat; the prompt for completions), not the
// whole body, and are deterministic across processes. [Parser] defines the
// stream and the hash.
//
// # Allocation
//
// InspectChunk does not allocate for a valid chunk; [Chunk.ID] aliases the
// input. ParseRequest allocates only the Model and User strings, and
// ParseResponse only the id. Parse with hashing on allocates one slice more,
// for PrefixHashes. Inspecting a typical 220-byte vLLM chunk takes
// about 0.35 µs on a 2-core Xeon, against about 3 µs and 10 allocations for
// encoding/json decoding into structs with raw-recording leaves, the approach
// this replaced (BenchmarkInspectChunk and
// BenchmarkInspectChunkEncodingJSON).
//
// All functions are safe for concurrent use and never panic.
package oai
