// Package gateway is Switchboard's HTTP front: the chi router, the
// OpenAI-compatible handlers (every route of the operation table), the
// proxy and SSE streaming, the OpenAI and Anthropic error objects and the
// per-request engine lifecycle, in front of the engine fleet (package
// fleet).
//
// # Operation table
//
// Every proxied route is one row of the operation table (operation.go):
// method and paths; body kind (JSON read by an oai.Schema, multipart form
// read by oai.ParseForm, none); where the model comes from (body, path,
// query, or none: any routable engine); its class (generative: slot,
// decode at the first token, TTFT and ITL; pooling: slot, no TTFT; light:
// no slot, duration only); its stream framing (OpenAI chunks ending in
// [DONE], Responses API events ending in response.completed / failed /
// incomplete, Anthropic events ending in message_stop, or any stream ending
// at EOF); and its error envelope (OpenAI's, or Anthropic's on
// /v1/messages). Handlers, the engine path, the parser, the first-token
// rule and the stream's end rule all come from the row.
//
// # One request
//
// A proxied request is admitted under Config.MaxConcurrentRequests (503
// otherwise). Its body is read once, under Config.MaxBodyBytes (a multipart
// form: Config.MaxFormBytes) and Config.BodyReadTimeout (408), into a
// buffer that grows with the bytes that arrive and is reserved in the
// gateway-wide Config.MaxBufferedBytes budget (503 when full); only its
// routing fields are decoded (model, stream, stream_options, user). Bad
// input gets a 400 error in the route's envelope before any engine slot is
// taken. The candidates are the routable engines serving the model, an
// alias resolved (404 model_not_found when none serves it, 503 when none
// of those is routable); the routing policy picks one. Each attempt's
// result (the engine's response headers, or the gateway's error) is
// decided on in one place, the planner (see # Plan of legs): it goes to
// another engine only when nothing was sent to the client. The engine request carries the
// client's query string and end-to-end headers, less its credentials
// ([StrippedRequestHeaders], Config.StripRequestHeaders), with
// X-Forwarded-For/-Proto/-Host set as Envoy and Caddy do
// (Config.TrustedProxies decides whether incoming ones are extended or
// replaced).
//
// # Plan of legs
//
// A request is a plan of legs (plan.go). A leg is one engine exchange
// (exchange.go): its span, its slot and its timers, ended exactly once by
// its attempt's end. Each leg ends with an outcome value (the engine's
// status or the gateway's error, its error.type, and the stage it was
// taken at: before the answer was relayed, or in a held relay that sent
// nothing), and one function, plan.next, decides what follows: another leg
// on another engine, on the same one after its Retry-After or a back-off,
// or none, when the leg's own result is the answer. The rules are
// server.retry's (retry.go): the conditions retried, max_attempts, the
// time budget and the retry budget. A stream broken after bytes reached
// the client is a cut (stageCut): plan.next decides a continuation
// (legContinue, continuation.go), which re-issues the prompt and generated
// token ids to another engine of the model and reshapes its chunks into
// the client's stream (migration.go, [MigrationConfig]), or none, and the
// exchange ends the stream with the error event. A new kind of leg (a
// prefill) is a new legKind and a case in plan.next, as the continuation
// and the fallback model are (legFallback, fallback.go): when a model's own
// legs are over after a failure before content, or none of its engines
// can take the request, it goes to the next model of its
// Config.Models.Fallbacks (a request too long for the model: its
// ContextFallbacks), named in the [FallbackHeader] response header. A
// generative request whose max_tokens alone is over the model's
// max_model_len (from GET /v1/models) gets 400 context_length_exceeded
// before any engine slot is taken (context.go). Handlers return their error instead of writing it;
// door (errors.go) writes it, in the route's envelope.
//
// # Memory
//
// Per request, within Config.MaxBufferedBytes (capacity is reserved before
// it is allocated): the body (at most twice the bytes received, from 16 KiB,
// and at most MaxBodyBytes) and a held non-streaming response (at most
// MaxResponseBufferBytes; 1 MiB of a relayed one, for its usage). Outside
// it: a pooled 32 KiB copy buffer, the engine connection's buffers, and for
// a stream an SSE scanner holding at most one incomplete event (1 MiB, then
// forwarded unparsed) and the joined data of a multi-line event (1 MiB).
//
// # Engine accounting
//
// Each try on an engine is an attempt: it starts a CLIENT span named
// "{operation} {model}" and, unless its route is light, takes the engine's
// prefill slot; on a generative route the first content-bearing stream
// event (delta content, reasoning content, tool calls or completion text;
// a Responses or Anthropic text, reasoning or tool-argument delta; never
// the role-only chunk, a comment or a usage chunk) moves it to decode and
// records time to first token; the attempt's deferred
// end releases the slot from whichever phase it is in, records the duration
// with error.type and ends the span. End is idempotent and is the only
// release path, so every exit releases exactly once. The slot holds a
// pointer to the engine incarnation it was taken from, so an engine removed
// and re-added under the same name never sees a foreign release. There is no
// per-request registry to leak: the attempt lives on the handler's stack.
//
// # Engines
//
// The engines are package fleet's: their incarnations and state, health
// probes and model discovery, stats scraping, outlier detection, the
// admin actions, reloads and discovery. The request path reads the fleet's
// routing snapshot once per decision, looks the model up in it, tells the
// fleet of a refused connection (fleet.Fleet.MarkFailed) and reports every
// attempt's outcome as a routing.Outcome when the attempt ends
// (fleet.Fleet.Report; outcomeOf classifies it). The fleet's lookup errors
// are sentinels, answered in errors.go: 404 model_not_found, or 503 when
// no engine serving the model is routable.
//
// # Streaming
//
// SSE responses are scanned with internal/sse; the complete events of every
// read are written and flushed at once, a partial event waits for its end.
// No middleware buffers or compresses. If the engine fails mid-stream the
// client receives a final error event in the route's framing (`data:
// {"error":...}`, or `event: error` on the Responses and Anthropic routes)
// and no end event.
//
// So that token usage is known for every stream, a streamed
// request whose client did not ask for usage (stream_options absent, null or
// {}, include_usage false or null) is sent to the engine with
// include_usage added (Config.InjectUsage), between slices of the client's
// bytes rather than in a copy; the usage chunk that comes back is recorded
// and not forwarded to that client.
//
// A stream's end is its route's framing: OpenAI chunks end with `data:
// [DONE]`, Responses events at response.completed, response.failed or
// response.incomplete, Anthropic events at message_stop, other SSE streams
// at the body's clean end; an engine that sent its own error event and
// closed has ended its stream too. A streamed
// response in another framing (NDJSON, chunked JSON) is passed through byte
// for byte, flushed per write, and not parsed.
//
// A non-streaming response is buffered whole up to
// Config.MaxResponseBufferBytes and sent with its exact Content-Length, so
// an engine failing before the end of its body gets the client a 502, never
// a 200 with a cut body; a larger one is relayed as it arrives and a failure
// then aborts the client connection. A non-streaming chat, completions or
// Messages request that may be continued (or every one, with
// Config.ObserveNonStreaming) is sent to the engine as a stream instead,
// and its events reassembled into the body (observe.go): a break is then
// a cut like a stream's, continued into the same body.
//
// # Cancellation and timeouts
//
// The engine request is derived from the client's request context, so a
// client that goes away cancels the engine request in every phase (vLLM then
// aborts the sequence and frees its KV cache). Such requests are recorded
// with error.type client_cancelled (status 499) and never retried. Timeouts
// (Config.Timeouts): connect; response headers (streaming); the first
// token, which bounds the silence vLLM keeps while a request queues and
// prefills after sending its headers; idle, the engine's silence after the
// first content; one non-streaming attempt; each write to the client (a
// client that stops reading is cut off, error.type client_stalled); and the
// whole request. Only a failed connection is retried on another engine,
// never after the engine received the request, except on the sticky
// Responses routes, where an engine's 404 (it does not hold that stored
// response) sends the request to the next engine.
//
// # Shutdown
//
// Serve the handler with [Server.BaseContext]. At the shutdown deadline
// [Server.Abort] ends what is still in flight (a started stream gets a final
// error event with code server_shutdown) and [Server.Wait] returns once
// every handler has returned, so the telemetry providers can be flushed
// after it with every request recorded.
//
// # Reloading
//
// [Server.Reload] applies a new configuration while requests run. It is
// validated whole and rejected whole. The engine set changes as one batch
// (one new routing snapshot): an engine removed or replaced keeps its
// incarnation, with its own slot counters, until its requests in flight have
// finished, so every slot is released where it was taken; a new incarnation
// is probed before it takes traffic and has its own metric and span
// attributes (server.address, server.port), fresh circuit breaker counts and
// outlier state, and the admin drain of the one it replaces. An engine whose
// max_in_flight or configured models alone changed is no new server: it
// keeps its incarnation (slots, ejection, drain), updated in place. The
// settings the request path reads (timeouts, limits, attempts, retries, the
// policy) are one immutable snapshot behind an atomic pointer, loaded once
// per request: a reload swaps it, and a request keeps the settings it
// started with. Settings read only where they are built (listener-side
// timeouts, health checks, stats scraping, the buffered-bytes budget, header
// rules) keep their running values and are reported as needing a restart.
//
// # Errors
//
// Every error the gateway produces is an error object in its route's
// envelope (see [APIError]): OpenAI's {"error":{"message","type","param",
// "code"}}, or on /v1/messages Anthropic's {"type":"error","error":{"type",
// "message"}}. Engine JSON errors pass through with their status and
// Retry-After; JSON bodies not already in the route's envelope are
// rewritten in it. A non-JSON error body (HTML, a stack trace, text) is
// replaced by an error naming the engine and its status, and logged (capped) at debug level. Engine response
// headers naming the engine's software (Server, X-Powered-By) never reach
// clients, and credentials in engine URLs never appear in logs or in the
// admin engine list.
//
// # Access log
//
// With Config.AccessLog every request but /health and /ready is logged at
// info level: request_id, method, route, model, engines, attempts, status,
// error.type, ttft, duration, input_tokens, output_tokens.
package gateway
