// Package gateway is Switchboard's HTTP front: the chi router, the
// OpenAI-compatible handlers, the engine pool, the proxy and SSE streaming,
// the OpenAI error object and the per-request engine lifecycle.
//
// # One request
//
// The body is read once under Config.MaxBodyBytes and only its routing
// fields are decoded (model, stream, stream_options, user). Bad input gets a
// 400 OpenAI error before any engine slot is taken. The candidates are the
// healthy engines serving the model (404 model_not_found when none serves
// it, 503 when none of those is healthy); the routing policy picks one.
//
// # Engine accounting
//
// Each try on an engine is an attempt: it starts a CLIENT span named
// "{operation} {model}" and takes the engine's prefill slot; the first
// content-bearing stream event (delta content, reasoning content, tool calls
// or completion text; never the role-only chunk, a comment or a usage chunk)
// moves it to decode and records time to first token; the attempt's deferred
// end releases the slot from whichever phase it is in, records the duration
// with error.type and ends the span. End is idempotent and is the only
// release path, so every exit releases exactly once. The slot holds a
// pointer to the engine incarnation it was taken from, so an engine removed
// and re-added under the same name never sees a foreign release. There is no
// per-request registry to leak: the attempt lives on the handler's stack.
//
// # Streaming
//
// SSE responses are scanned with internal/sse; the complete events of every
// read are written and flushed at once, a partial event waits for its end.
// No middleware buffers or compresses. If the engine fails mid-stream the
// client receives a final `data: {"error":...}` event and no [DONE].
//
// So that token usage and TPOT are known for every stream, a streamed
// request whose client set no stream_options is sent to the engine with
// stream_options.include_usage added (Config.InjectUsage); the usage chunk
// that comes back is recorded and not forwarded to that client.
//
// # Cancellation and timeouts
//
// The engine request is derived from the client's request context, so a
// client that goes away cancels the engine request in every phase (vLLM then
// aborts the sequence and frees its KV cache). Such requests are recorded
// with error.type client_cancelled (status 499) and never retried. Timeouts:
// connect, response headers (streaming), idle time between stream reads,
// and the whole request. A client that stops reading for a whole idle
// period is cut off by a write deadline (error.type client_stalled). Only a
// failed connection is retried on another engine, never after the engine
// received the request.
//
// # Errors
//
// Every error the gateway produces is an OpenAI error object
// {"error":{"message","type","param","code"}} (see [APIError]). Engine
// errors pass through with their status; bodies not already in the OpenAI
// envelope are wrapped in it.
package gateway
