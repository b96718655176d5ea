// Package oai reads the few fields of OpenAI-compatible (and Anthropic-
// compatible) bodies that the gateway routes and accounts on, without
// decoding the rest.
//
// # Routes and schemas
//
// The package knows no routes. The gateway's route table gives each route a
// [Schema], which says which field is the prompt and how it is walked,
// which fields are required, whether "model" is, and whether the route
// generates tokens (and so has stream flags and token limits). [SchemaChat],
// [SchemaCompletion], [SchemaEmbeddings], [SchemaResponses],
// [SchemaMessages] and the others are the schemas of the routes the gateway
// serves; a new route can use its own Schema literal. Audio transcription
// and translation bodies are forms, read by [ParseForm].
//
// # Requests
//
// [ParseRequest] runs once per request on the raw body, which the gateway
// keeps and forwards unchanged: it validates the body as JSON and extracts
// the model and its offsets (to swap an alias in place), the stream flags,
// the session key, the token limit and an estimate of the prompt size, or
// returns a [RequestError] that the gateway turns into a 400
// invalid_request_error without contacting an engine. [Parser.Parse] does
// the same and, in the same pass, hashes the prompt's leading fixed-size
// blocks into [Request.PrefixHashes] for prefix-cache-aware routing.
// [ParseForm] reads the model, the stream flag and the presence of the file
// from a multipart/form-data body.
//
// # Responses and streams
//
// [InspectChunk] runs on the data of every streamed SSE event of a chat or
// completions stream and says whether it carries output (for time to first
// token and inter-token latency), finishes a choice, reports usage or is an
// error. [InspectResponsesEvent] and [InspectAnthropicEvent] do the same
// for the Responses API's and Anthropic's typed events, reporting an
// [Event]: the first output, the end event, errors, the id and usage.
// [ParseResponse] takes the id and usage from a non-streaming response of
// any of these APIs.
//
// # Reassembly
//
// A [Reassembler] turns the data of a chat or completions stream's events
// back into the non-streaming body the engine would have answered for the
// same generation, byte for byte as vLLM writes it, so a gateway can send
// a non-streaming request to the engine as a stream (to see its first
// token and its progress) and still answer the client with one JSON body.
// [Reassembler.Add] merges one event's data, [Reassembler.Finished] says
// whether every choice has its finish_reason, and [Reassembler.Body]
// builds the body. An engine's in-stream error event is reported as a
// [StreamError], data that cannot be merged as an error wrapping
// [ErrMalformedChunk]. Each event is validated and walked with the same
// reader as the inspectors; values are copied as the engine wrote them,
// never decoded and re-encoded.
//
// A [MessagesReassembler] does the same for an Anthropic Messages stream
// (vLLM's /v1/messages): its content blocks (text, thinking with its
// signature, tool_use with the input_json_delta fragments joined into its
// input), stop reason and usage become vLLM's non-streaming Messages body;
// an error event is a [StreamError] whose Code is the HTTP status of its
// error type.
//
// # Prefill/decode disaggregation
//
// For vLLM's NixlConnector (the contract of vLLM's toy_proxy_server.py
// and the llm-d routing sidecar), a request runs in two legs: a prefill
// engine computes the prompt's KV cache and generates one token, and a
// decode engine pulls those blocks and generates the answer. [PrefillBody]
// turns the client's chat or completions body into the prefill leg's
// (non-streaming, one token, do_remote_decode), [ParsePrefill] reads the
// prefill reply's kv_transfer_params and prompt usage, and [DecodeBody]
// hands those parameters to the decode leg. [SetCachedTokens] rewrites
// usage.prompt_tokens_details.cached_tokens in the decode engine's final
// chunk or body, for a gateway that reports a count of its own (the
// prefill leg's, say). Each edit is made on the bytes: every member it
// does not touch keeps the client's (or the engine's) spelling, order and
// spacing.
//
// # Parsing
//
// The JSON functions read the body in a single pass with a small
// validating JSON reader that accepts exactly what encoding/json accepts
// (the tests compare it with json.Valid and with encoding/json reference
// implementations, including under fuzzing). Object keys match exactly,
// after decoding escapes, and the last of duplicate keys wins, which is how
// the engines' JSON parsers read a body; encoding/json's case-insensitive
// field matching would let {"model":"a","MODEL":"b"} route as "b" while the
// engine serves "a". encoding/json is still used where it is rare and
// convenient: to describe a syntax error and to decode strings that contain
// escapes. ParseForm scans the form in place as Go's mime/multipart reads
// it (a fuzz test compares the two), stricter where a lax reading could
// make the gateway and the engine disagree on the model.
//
// # Prefix hashes
//
// Two requests for the same model whose prompts start with the same blocks
// get the same leading PrefixHashes, so a policy can remember which engine
// saw which hashes and send a request where most of its prefix is likely to
// be in the KV cache, as the Gateway API Inference Extension's prefix-cache
// scorer does. The hashes cover a canonical stream of the prompt (roles,
// contents and tool calls for messages; the prompt for completions), not
// the whole body, seeded by the model and, for Anthropic and the Responses
// API, the system prompt, and are deterministic across processes. [Parser]
// defines the stream and the hash.
//
// # Allocation
//
// InspectChunk, InspectResponsesEvent and InspectAnthropicEvent do not
// allocate for a valid event; [Chunk.ID], [Event.Type] and [Event.ID] alias
// the input. ParseRequest allocates only the Model and User strings, and
// ParseResponse only the id. Parse with hashing on allocates one slice
// more, for PrefixHashes. Inspecting a typical 220-byte vLLM chunk takes
// about 0.35 µs on a 2-core Xeon, against about 3 µs and 10 allocations for
// encoding/json decoding into structs with raw-recording leaves, the
// approach this replaced (BenchmarkInspectChunk and
// BenchmarkInspectChunkEncodingJSON). ParseForm, off the hot path, also
// allocates the part headers' parameter maps. Reassembler.Add allocates
// only to grow what it keeps (the merged text, the first id, model and
// created): a 200-token chat stream takes 16 allocations in all, its body
// included (BenchmarkReassemble). PrefillBody and DecodeBody allocate the
// edited body; SetCachedTokens allocates nothing when dst has room
// (BenchmarkSetCachedTokens).
//
// All functions are safe for concurrent use and never panic. A
// Reassembler or MessagesReassembler never panics either, but serves one
// stream, used by one goroutine at a time.
package oai
