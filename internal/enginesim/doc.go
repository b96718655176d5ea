// Package enginesim simulates a vLLM engine's OpenAI-compatible HTTP server without a GPU,
// for the gateway's demo, tests and benchmarks.
//
// An [Engine] is created from a [Config] with [New] and served with [Engine.Handler]:
//
//   - POST /v1/chat/completions and POST /v1/completions, streaming (SSE) or not;
//   - POST /v1/embeddings;
//   - GET /v1/models, GET /health (503 after SetHealthy(false)) and GET /metrics.
//
// Responses have vLLM's shapes, field for field. Errors are
// {"error":{"message":"...","type":"...","param":null,"code":<status>}}: 400 for invalid JSON
// or fields, 404 for an unknown model or path, 405 for a wrong method, 413 for a body over
// 32 MiB. A request that names no model gets the first served model, as in vLLM.
//
// # Tokens
//
// There is no tokenizer. The prompt is the text of all chat messages (string contents and
// {"type":"text"} parts) or of the completions prompt (a string, an array of strings, or
// token ids, one token each); its token count is its number of whitespace-separated words,
// at least 1. Generated token i is the word "tok<i> " (see [ContentToken]), so a response of
// n tokens has content "tok0 tok1 ... tok<n-1> ". n is max_completion_tokens or max_tokens
// when set (capped at Config.MaxOutputTokens, finish_reason "length"), otherwise
// Config.OutputTokens (finish_reason "stop"). The n field is ignored: there is always one
// choice.
//
// A stream sends, in order: the headers; for chat, a role-only chunk
// (delta {"role":"assistant","content":""}) at once, before the sequence is even scheduled;
// after the time to first token, one chunk per token spaced by the inter-token latency
// (Config.ITL, plus the load term below); a finish chunk (empty delta or text, with
// finish_reason); a usage chunk (empty choices) when stream_options.include_usage is true;
// and "data: [DONE]". Each event is flushed as it is written. A non-stream request waits for
// the whole generation (the time to first token plus n-1 inter-token latencies) and then
// sends one JSON body with Content-Length.
//
// Embeddings are deterministic unit-length vectors of Config.EmbeddingDim elements derived
// from a hash of the model name and each input (encoding_format "float", the default, or
// "base64" of little-endian float32s); they take a running slot and one prefill wait (TTFT
// plus the TTFTPerRunning load term below, without TTFTPerPromptToken), and do not use the
// prefix cache.
//
// A request's X-Request-Id header is echoed in the response. Every response the engine
// writes, on every path and errors included, carries "Server: uvicorn", as vLLM's uvicorn
// server sends, so a gateway in front can be tested for hiding engine-identifying headers.
//
// # Scheduling
//
// At most Config.MaxNumSeqs sequences run at once; further requests wait in a FIFO queue
// (Stats.Waiting, vllm:num_requests_waiting). A running sequence first waits its time to first
// token, then one inter-token latency (ITL) per further token:
//
//	ttft = TTFT + TTFTPerPromptToken*uncached + TTFTPerRunning*(running-1)
//	itl  = ITL + ITLPerRunning*(running-1)
//
// where uncached is the number of prompt tokens not found in the prefix cache (below) and
// running is Stats.Running, the sequences running on the engine (all models together, since
// they share one simulated GPU), the sequence itself included.
//
// Load: TTFTPerRunning and ITLPerRunning make latency depend on load, so that a routing
// policy that piles requests onto one engine pays for it. Both default to 0, which turns
// the load terms off (latency then does not depend on other requests, as before they
// existed). running is read when the prefill starts (after the queue wait, once the
// sequence holds its slot) and the prefill wait is then fixed, modelling prefill
// contention; for the ITL it is read again before every token, modelling decode batch
// contention, so a stream speeds up as its neighbours finish and slows down as others
// join. Queued sequences do not count. This is a simple linear model of the simulator's
// own, chosen to be predictable; it is not fitted to measurements of a real engine and is
// a simplification of vLLM, where continuous batching runs all running sequences in shared
// engine steps whose duration grows with the number of tokens in the batch (decode tokens
// plus prefill chunks), so a real engine's slowdown depends on prompt lengths, chunked
// prefill and KV cache pressure, not on the sequence count alone.
//
// Prefix cache: the prompt's words are split into blocks of Config.BlockSize tokens; each
// full block is hashed together with the hashes of all blocks before it (and the model name).
// The engine keeps an LRU set of at most Config.KVCacheBlocks block hashes. The leading
// blocks of a prompt found in that set are cached tokens: they skip TTFTPerPromptToken and
// count as prefix cache hits. A partial last block is never cached. Queries and hits are
// counted in tokens. vllm:kv_cache_usage_perc is the number of blocks held by running
// sequences (prompt plus generated tokens, each sequence rounded up to whole blocks) over
// Config.KVCacheBlocks, capped at 1; the KV capacity never limits admission.
//
// Every wait (queue, TTFT, ITL, stalls, trickle pauses) also watches the request context:
// when the client goes away the engine stops at once, frees the running slot or queue place
// and counts the request as aborted (vLLM's "Aborted request"). The engine starts no
// goroutines; everything runs on the request's handler goroutine.
//
// Every request that passes validation ends as exactly one of Stats.Completed,
// Stats.Aborted or Stats.Faulted. Completed and Faulted requests are counted, and their
// slot and KV blocks freed, just before the last bytes are written (or the connection is
// closed), so a client that has seen the end of a response already sees it in Stats and
// /metrics. An aborted request is counted as soon as the handler notices the client left
// (at once for HTTP/1.1, where net/http watches the connection).
//
// # Faults
//
// A request's faults come from its X-Enginesim-Fault header ([FaultHeader]) or, when the
// header is absent, from Config.Fault (changeable at run time with [Engine.SetFault]). An
// empty header means no fault, overriding the default. The spec is a comma-separated list of
// key or key=value items, for example "close-after=3" or "slow-headers=200ms,trickle".
// Unknown keys and bad values are answered with 400, so typos are loud. Durations use Go
// syntax (250ms, 2s). Faults act after the request is validated; they apply to the chat,
// completions and embeddings endpoints only.
//
//   - status=CODE: answer CODE (400..599) instead of generating, with the body chosen by
//     error-body (default the error JSON, message "enginesim: injected fault status=CODE")
//     and Content-Length. Faulted.
//   - error-body=KIND, with status: the body of the status response. json: the error JSON
//     (application/json). html: a small error page such as a reverse proxy or a crashed
//     worker returns (text/html; charset=utf-8), titled "CODE Reason" (for example "502 Bad
//     Gateway") with a Python traceback in a <pre>. text: that traceback alone
//     (text/plain; charset=utf-8). empty: no body and no Content-Type (Content-Length 0).
//     The traceback names the internal path [InternalPath] ("/srv/vllm/worker.py", line 42),
//     so a gateway test can assert it never reaches a client. Without status it is a spec
//     error (400, "needs status=CODE").
//   - retry-after=SECONDS, with status: also send "Retry-After: SECONDS" (an integer, 0 or
//     more) on the status response. Without status it is a spec error.
//   - powered-by: also send "X-Powered-By: enginesim" on the response, whatever it is.
//   - close-before-headers: read the request, then close the TCP connection without any
//     response (hijacked; on HTTP/2 the stream is reset instead). Faulted.
//   - close-after-headers: send 200 headers (text/event-stream or application/json, as the
//     request would get) and flush, then abort the connection: the client sees an unexpected
//     EOF. For streams this is before the role chunk. Faulted.
//   - close-after=N: stream: send the role chunk and N token events (content or reasoning),
//     then abort the connection, with no finish chunk and no [DONE]; N larger than the
//     number of tokens aborts after the last token. Non-stream and embeddings: after
//     generating, write the first half of the JSON body (chunked, no Content-Length), flush
//     and abort. Faulted.
//   - stall-before-headers or stall-before-headers=DUR: block before writing headers until
//     the client goes away (Aborted), or for DUR and then proceed normally.
//   - stall-after=N: stream: after N token events, block until the client goes away.
//     Non-stream and embeddings: send the headers and half of the body, then block. Aborted
//     when the client leaves. The stall itself sends nothing, not even keep-alives.
//     stall-after=0 on a stream models vLLM's silence after the headers while a request
//     waits in the queue or in prefill: the client gets 200 with text/event-stream and, for
//     chat, the role chunk (plus the tool-call delta under tool-call), for completions only
//     the headers, and then nothing at all however long it waits (under keepalive, only the
//     keep-alives of the queue and first-token waits, which come before the stall), while
//     the engine holds a running slot (Stats.Running) until the client leaves.
//   - truncate: non-stream and embeddings: after generating, send 200 with the
//     Content-Length of the full JSON body (even under trickle), write its first half
//     (len/2 bytes), flush and abort the connection: the client sees an unexpected EOF short
//     of the declared length. Combined with malformed, the malformed body is the one
//     truncated. Stream: send the whole stream (role chunk, tokens, finish chunk, usage chunk
//     if asked) except the final "data: [DONE]", then end the response cleanly (the chunked
//     terminator on HTTP/1.1), like an engine that ends a stream without its terminator.
//     Faulted in both cases; a stream is counted after its last event is written and before
//     the response ends. close-after and stall-after act first.
//   - slow-headers=DUR: sleep DUR before anything else, then proceed normally. Not a fault.
//     Combined with status or close-before-headers it delays them.
//   - malformed: stream: right after the role chunk, emit the invalid event
//     `data: {"id":"bad", "choices": [` and continue normally (Completed). Non-stream and
//     embeddings: answer 200 with that invalid JSON as the whole body (Faulted).
//   - trickle or trickle=DUR: write every response byte separately, each followed by a flush
//     and a pause of DUR (default 1ms; 0 only flushes), so events arrive split across reads.
//     Non-stream bodies then have no Content-Length.
//   - keepalive or keepalive=DUR: stream: write the comment ": keep-alive" before each wait
//     (queue, first token, each further token), and with DUR also every DUR during a wait.
//   - no-content: generate zero tokens: a stream sends the role chunk, the finish chunk
//     ("stop"), the usage chunk if asked (completion_tokens 0) and [DONE]; a non-stream body
//     has empty content.
//   - reasoning=N: chat: the first N of the generated tokens are reasoning tokens, streamed
//     as delta {"reasoning_content":"think<i> "} before the content tokens (non-stream: the
//     message's reasoning_content); content tokens are then numbered from tok0. They count as
//     completion tokens. Ignored by completions.
//   - tool-call: chat: the first generated event is the delta
//     {"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":""}}]},
//     sent at the time to first token; content tokens follow one ITL apart. It is not a
//     token and does not change finish_reason (non-stream: the message gets a tool_calls
//     entry with arguments "{}"). Ignored by completions.
//
// Faults combine; for example "keepalive,trickle=0s,reasoning=2". Stats counts a request
// ended by a fault as Faulted, one whose client left first (including during a stall) as
// Aborted.
//
// # Metrics
//
// GET /metrics serves the Prometheus text exposition from the engine's own registry (never
// the global one). The vLLM v1 names carry a model_name label:
//
//   - vllm:num_requests_running, vllm:num_requests_waiting (gauges, per model);
//   - vllm:kv_cache_usage_perc (gauge, 0..1; one series, labelled with the first model,
//     because the KV cache is shared);
//   - vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (counters, tokens);
//   - vllm:request_success_total (counter, extra label finished_reason "stop" or "length");
//   - vllm:prompt_tokens_total, vllm:generation_tokens_total (counters, tokens; prompt tokens
//     are counted when prefill ends, generation tokens as each token is produced, so aborted
//     requests count what they consumed);
//   - vllm:time_to_first_token_seconds (histogram, vLLM's buckets; from request arrival,
//     queue time included, to the first token, whether or not it is streamed).
//
// Simulator-only counters: enginesim_aborted_requests_total and
// enginesim_faulted_requests_total, with model_name.
package enginesim
