// Package enginesim simulates a vLLM engine's HTTP server without a GPU, for the gateway's
// demo, tests and benchmarks: vLLM's OpenAI-compatible API, its Anthropic Messages endpoint,
// its pooling, tokenizer, LoRA and sleep-mode endpoints, with vLLM's response shapes, field
// for field.
//
// An [Engine] is created from a [Config] with [New] and served with [Engine.Handler].
//
// # Routes
//
// Generation (a running slot, the prefix cache, the time to first token and inter-token
// latency below; streaming or not):
//
//   - POST /v1/chat/completions, POST /v1/completions;
//   - POST /v1/responses (the Responses API), GET /v1/responses/{id},
//     POST /v1/responses/{id}/cancel;
//   - POST /v1/messages (Anthropic), POST /v1/messages/count_tokens (no slot);
//   - POST /v1/audio/transcriptions, POST /v1/audio/translations (multipart),
//     POST /v1/audio/speech (a WAV), POST /v1/images/generations (PNGs).
//
// Pooling (a running slot and one prefill wait, no prefix cache): POST /v1/embeddings,
// POST /v1/rerank, /v2/rerank and /rerank, POST /v1/score and /score, POST /pooling,
// POST /classify.
//
// Light (answered at once, no slot, not counted in Stats): POST /tokenize, POST /detokenize,
// GET /v1/models, POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter, POST /sleep,
// POST /wake_up, GET /is_sleeping, POST /reset_prefix_cache, GET /health (503 after
// SetHealthy(false) and while draining) and GET /metrics; and the simulator's own POST
// /admin/fault, whose body (a fault spec, "" for none) replaces the default fault as
// [Engine.SetFault] does (400 for an invalid spec), so a running engine process can be
// broken from outside, POST /admin/kv-events/drop, /stop, /resume and /restart (see KV-cache
// events), and POST /sim/kv/pull, the KV side channel of prefill and decode (see Prefill and
// decode; faults do not act on them).
//
// Errors are vLLM's {"error":{"message":"...","type":"...","param":null,"code":<status>}}:
// 400 for invalid JSON or fields, 404 for an unknown model or path, 405 for a wrong method,
// 413 for a body over 32 MiB, 503 while the engine sleeps; where vLLM spells out the type
// (the Responses API's invalid_request_error, the LoRA routes' InvalidUserInput) the
// simulator does too. /v1/messages and /v1/messages/count_tokens answer every error, the
// injected ones included, in Anthropic's envelope {"type":"error","error":{"type":...,
// "message":...}}, the type from the status: invalid_request_error (400 and other 4xx),
// authentication_error (401), permission_error (403), not_found_error (404),
// request_too_large (413), rate_limit_error (429), overloaded_error (503, 529), api_error
// (other 5xx). A request that names no model gets the first served model, as in vLLM (but
// /v1/messages requires one, as vLLM's does).
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
// Token ids: a prompt word's id is the word itself when it is a decimal number (so a
// completions token-id prompt keeps its ids), else a hash below 32000; an empty prompt is
// the one token 0. Generated tokens have ids that name their index: content token i
// ("tok<i>") has id 32000+i, reasoning token i ("think<i>") 2^30+i, and the words "tok<i>"
// and "think<i>" in a prompt have those ids too (/tokenize and /detokenize agree).
//
// return_token_ids (chat and completions, vLLM's extension field) returns the ids, in vLLM's
// places (vllm/entrypoints/openai/protocol.py, serving_chat.py, serving_completion.py):
// chat: the non-stream body gets "prompt_token_ids" (after prompt_logprobs) and its choice
// "token_ids" (after stop_reason); a stream's role chunk gets "prompt_token_ids" at its end
// (on the chunk, not the choice), and every later chunk's choice "token_ids" (its token's
// id, [] on chunks without a token: the tool-call delta, the finish chunk). Completions: the
// non-stream choice gets "token_ids" after stop_reason and "prompt_token_ids" after
// prompt_logprobs; a stream chunk's choice gets "prompt_token_ids" (the prompt's ids on the
// first chunk, null after) and "token_ids" after stop_reason. len(prompt_token_ids) is
// usage.prompt_tokens. Without the flag these fields are left out (vLLM after 0.10.1 writes
// some of them as null).
//
// Continuations: when a prompt's ids (a token-id prompt, or text whose words end so) end
// with the ids of content tokens 0..k-1 in order, generation resumes at content token k, as
// a gateway that migrates a cut stream to another engine expects: the text generated before
// the cut plus the continuation's text is the uncut text. Without max_tokens the
// continuation ends where the uncut generation ends (content token Config.OutputTokens,
// "stop": it generates OutputTokens-k tokens, none when k >= OutputTokens); with max_tokens
// M-k it ends at token M ("length"). usage.prompt_tokens counts the whole prompt, as vLLM
// does. A continuation has no reasoning tokens (the reasoning fault is ignored) and its
// logprobs are those of the uncut generation's positions.
//
// A stream sends, in order: the headers; for chat, a role-only chunk
// (delta {"role":"assistant","content":""}) at once, before the sequence is even scheduled;
// after the time to first token, one chunk per token spaced by the inter-token latency
// (Config.ITL, plus the load term below); a finish chunk (empty delta or text, with
// finish_reason and stop_reason null); a usage chunk (empty choices) when
// stream_options.include_usage is true; and "data: [DONE]". Each event is flushed as it is
// written. A non-stream request waits for the whole generation (the time to first token plus
// n-1 inter-token latencies) and then sends one JSON body with Content-Length.
//
// Chat and completions bodies are vLLM 0.10.1's, field for field and in its order (later
// releases add token_ids and prompt_token_ids, and later still rename reasoning_content to
// reasoning). A non-stream body has every field of vLLM's response model with its
// null default: chat {id, object "chat.completion", created, model, choices [{index,
// message {role, content, refusal, annotations, audio, function_call, tool_calls ([] when
// none), reasoning_content}, logprobs, finish_reason, stop_reason}], service_tier,
// system_fingerprint, usage {prompt_tokens, total_tokens, completion_tokens,
// prompt_tokens_details}, prompt_logprobs, kv_transfer_params}; completions {id, object
// "text_completion", created, model, choices [{index, text, logprobs, finish_reason,
// stop_reason, prompt_logprobs}], service_tier, system_fingerprint, usage,
// kv_transfer_params} (kv_transfer_params is null but on the legs of prefill and decode,
// below; prompt_tokens_details is null but on a decode leg and, with
// Config.PromptTokensDetails, vLLM's --enable-prompt-tokens-details, on any answer whose
// prompt hit the prefix cache: {"cached_tokens": n}). content is null when the output is all reasoning or tool calls (as
// vLLM's parsers return it), "" when there is none at all; reasoning_content is null without
// reasoning. A chat chunk has only the fields vLLM sets ({index, delta, logprobs,
// finish_reason}, plus stop_reason on the finish chunk; usage on the usage chunk only); a
// completions chunk has all of them ({index, text, logprobs, finish_reason, stop_reason},
// and "usage": null but on the usage chunk); the usage chunk's usage has no null fields.
// So a client that reassembles a stream gets exactly the non-stream body of the same
// request, created aside.
//
// # Logprobs
//
// Chat's "logprobs": true, with "top_logprobs": k (0..20; more than 0 needs logprobs), and
// completions' "logprobs": k (0..20; vLLM's default --max-logprobs allows 20, OpenAI 5)
// return vLLM's logprobs for every generated token, reasoning tokens included. Out of range
// values get vLLM's 400s. The simulator samples greedily: the sampled token is the most
// likely, and the tokens after it are "alt<r> " at rank r+1. Values depend only on the
// model's name and the token's position, so a stream and a non-stream generation of the
// same request carry the same ones: multiples of 0.0001, the sampled token's in
// [-0.4999, -0.0001] and each next rank's 0.0001 to 2 lower (integral values are written
// with ".0", as Python writes them).
//
// Chat: choices[].logprobs is {"content": [{token, logprob, bytes (the token's UTF-8
// bytes), top_logprobs: k × {token, logprob, bytes}, best first, the sampled token first}]}
// (top_logprobs [] when k is 0). Each token chunk carries its token's entry, a chunk
// without a token (the tool-call delta, the finish chunk) {"content": []}, the role chunk
// null; the non-stream body carries all entries.
//
// Completions: choices[].logprobs is {text_offset, token_logprobs, tokens, top_logprobs},
// one element per token; text_offset is the token's character offset in the whole
// generated text (in a stream too, as vLLM counts it), and a top_logprobs element is the
// map {token: logprob} of the max(k, 1) most likely tokens, best first (vLLM's sampled
// token plus the top k, the sampled token being one of them). Each token chunk carries its
// token, the finish chunk empty arrays, the non-stream body all tokens.
//
// Response ids are vLLM's: "chatcmpl-" or "cmpl-" followed by the request's X-Request-Id
// header, else its request_id field, else 32 random hex digits (vLLM's
// _base_request_id), so a stream and a non-stream request sent with the same X-Request-Id
// get the same id.
//
// Context length: every model has Config.MaxModelLen tokens of context (default 8192,
// reported by /v1/models and /tokenize). Chat, completions and the Messages API refuse a
// request as vLLM's OpenAIServing._validate_input does (serving_engine.py, 0.10.x): with a
// limit L (chat: max_completion_tokens, else max_tokens; completions: max_tokens, else
// vLLM's default 16; messages: max_tokens) and a prompt of P tokens with P+L over the
// context, 400 "This model's maximum context length is C tokens. However, you requested
// P+L tokens (P in the messages, L in the completion). Please reduce the length of the
// messages or completion."; without a limit (chat) and P >= C, 400 "This model's maximum
// context length is C tokens. However, you requested P tokens in the messages, Please
// reduce the length of the messages." (vLLM's text, comma included). Type BadRequestError;
// the Messages API answers in Anthropic's envelope (invalid_request_error). Without a limit
// the generation also stops when the context is full (finish_reason "length"). The
// Responses API refuses P >= C with vLLM's invalid_request_error "The engine prompt length
// P exceeds the max_model_len C. Please reduce prompt." and clips max_output_tokens to the
// room left, as vLLM's ResponsesRequest.to_sampling_params does.
//
// The Responses API and the Messages API do not follow chat's max_tokens rule: their natural
// length is Config.OutputTokens, and max_output_tokens / max_tokens only cut it when smaller
// (status "incomplete" with incomplete_details {"reason":"max_output_tokens"}; stop_reason
// "max_tokens"), since the Messages API requires max_tokens and clients send large ones.
//
// Embeddings are deterministic unit-length vectors of Config.EmbeddingDim elements derived
// from a hash of the model name and each input (encoding_format "float", the default, or
// "base64" of little-endian float32s); they take a running slot and one prefill wait (TTFT
// plus the TTFTPerRunning load term below, without TTFTPerPromptToken), and do not use the
// prefix cache. The other pooling routes wait the same way.
//
// # Responses API
//
// POST /v1/responses reads model, input (a string, or items: messages with role and content
// as a string or input_text/output_text parts, function_call and function_call_output
// items), instructions, max_output_tokens, stream, store (default true), background,
// previous_response_id and request_id, and echoes metadata, temperature, top_p, tool_choice,
// tools, parallel_tool_calls, max_tool_calls, reasoning, service_tier, text, truncation and
// user. The prompt is the instructions, then (with previous_response_id) the previous
// response's prompt and output text, then the input. The body is vLLM's ResponsesResponse:
// id "resp_<32 hex>", object "response", created_at, status "completed" or "incomplete",
// output [{type "message", id "msg_<32 hex>", status, role "assistant", content
// [{type "output_text", text, annotations [], logprobs null}]}] (after a reasoning item
// under the reasoning fault), usage {input_tokens, input_tokens_details {cached_tokens},
// output_tokens, output_tokens_details {reasoning_tokens, tool_output_tokens}, total_tokens}
// and the echoed fields, with vLLM's defaults and nulls.
//
// A stream is SSE with "event: <type>" and data carrying the same "type" and a
// "sequence_number" counted from 0: response.created and response.in_progress (the response
// in_progress, no output, no usage) at once; at the first token response.output_item.added
// and response.content_part.added; one response.output_text.delta per token ("delta" the
// token's text); response.output_text.done, response.content_part.done and
// response.output_item.done; response.completed with the whole response. There is no
// [DONE]. Under the reasoning fault a reasoning item (response.reasoning_text.delta per
// reasoning token) comes first, at output_index 0.
//
// Responses are stored unless store is false: the engine keeps the newest 1024 (fewer when
// their prompts and echoed fields pass 64 MiB; an entry holds no output text, which is
// rebuilt from its token counts). GET /v1/responses/{id} returns one, or vLLM's 404 "Response
// with id '...' not found." (type invalid_request_error). A background request (background
// true, which needs store) is answered at once with status "queued" and generates by time
// alone, since the engine runs no goroutine for it: it holds no running slot; its time to first
// token and inter-token latency are computed at creation from the load then; GET shows it
// in_progress until that time has passed since its creation, then completed. POST
// /v1/responses/{id}/cancel cancels a background response still generating (status
// "cancelled", counted as aborted); any other stored response gets vLLM's 400 "Cannot cancel
// a synchronous response.". A background response is counted (Completed, its tokens and time
// to first token) when the engine first looks after its time: Stats, /metrics, and every
// read of a stored response look. Background streams are not served (400).
//
// # Messages API
//
// POST /v1/messages reads model, messages (content a string or blocks: text, and
// tool_result contents, count), system (a string or text blocks), max_tokens, stream and
// metadata. The body is {id "msg_<32 hex>", type "message", role "assistant", model, content
// [{type "text", text}], stop_reason "end_turn" or "max_tokens", stop_sequence null, usage
// {input_tokens, output_tokens}}; under the reasoning fault a {type "thinking", thinking,
// signature} block comes first. A stream sends, each as "event: <type>" with the same "type"
// in its data: message_start (the message with no content, usage output_tokens 1) at once;
// at the first token content_block_start ({type "text", text ""}) and ping; one
// content_block_delta (delta {type "text_delta", text}) per token; content_block_stop;
// message_delta ({delta {stop_reason, stop_sequence null}, usage {output_tokens}});
// message_stop. POST /v1/messages/count_tokens answers {"input_tokens": N} at once.
//
// # Audio and images
//
// POST /v1/audio/transcriptions and /v1/audio/translations take multipart/form-data: the file
// part (required, at most 25 MiB; hashed as it is read, never held) and the fields model,
// language, prompt, response_format (json, the default; text; verbose_json), temperature,
// stream, stream_include_usage and max_completion_tokens, in any order. Anything else is a
// 400. The audio lasts the data of a PCM WAV at its header's byte rate, or the file at 32000
// bytes a second; its transcript is 2 words a second (at least one) drawn from a small
// vocabulary by a PRNG seeded with the file's FNV-1a hash, one token per word, cut by
// max_completion_tokens; the prompt is the prompt field's words plus 50 tokens per second of
// audio, never found in the prefix cache. json is {"text", "usage": {"type": "duration",
// "seconds": <rounded up>}} for transcriptions and {"text"} for translations (as in vLLM);
// text is the text (text/plain); verbose_json is vLLM's {duration, language, text, segments,
// words}. A stream is vLLM's: data chunks {id "transcribe-..." or "translate-...", object
// "transcription.chunk" or "translation.chunk", created, model, choices [{delta {content}}]},
// the last with finish_reason and stop_reason null, then a usage chunk (no choices) when
// stream_include_usage is true, then data: [DONE].
//
// POST /v1/audio/speech (model, input, voice, response_format wav or pcm) generates one token
// per input word and answers 50 ms of 24 kHz 16-bit mono tone per token: a WAV (audio/wav) or
// the raw samples (audio/pcm). POST /v1/images/generations (model, prompt, n up to 10, size,
// response_format b64_json) prefills the prompt, takes Config.OutputTokens steps of one
// inter-token latency, and answers {created, data [{b64_json}]} with n PNGs of one colour
// (from the prompt), size/64 pixels a side.
//
// # Pooling
//
// On all pooling routes model is optional. /v1/rerank, /v2/rerank and /rerank read query,
// documents (strings or {text} objects) and top_n (0: all), and answer {id "rerank-...",
// model, usage {prompt_tokens, total_tokens}, results [{index, document {text},
// relevance_score}]} best first. /v1/score and /score read text_1 and text_2 (a string, or
// lists; one text_1 is paired with every text_2; queries/documents and data_1/data_2 are
// accepted too) and answer {id "score-...", object "list", created, model, data [{index,
// object "score", score}], usage}. Scores are deterministic: mostly the share of the first
// text's words found in the second, plus a small hash jitter, so overlapping documents rank
// first. The prompt of a pair is both texts' tokens. /pooling (input as for embeddings, or
// messages) answers data [{index, object "pooling", data [floats]}], the embeddings' vectors;
// /classify answers data [{index, label "LABEL_<i>", probs, num_classes 2}]. Their usage is
// vLLM's UsageInfo {prompt_tokens, total_tokens, completion_tokens 0, prompt_tokens_details
// null}.
//
// # Tokenizer, adapters and sleep mode
//
// POST /tokenize (prompt or messages) answers {count, max_model_len, tokens, token_strs null}
// with one id per word (see Tokens); POST /detokenize (tokens) answers {prompt}, the ids'
// words joined by spaces: "tok<i>" or "think<i>" for a generated token's id, else the
// decimal form.
//
// GET /v1/models lists vLLM's ModelCards: id, object "model", created (the engine's start),
// owned_by "vllm", root (the model's name), parent null, max_model_len, permission (one
// default model_permission). LoRA adapters (Config.LoRAs, or POST /v1/load_lora_adapter
// {lora_name, lora_path, load_inplace}) follow, with root their path, parent their base model,
// created their load time and max_model_len null, as vLLM lists them. Loading answers vLLM's
// plain-text "Success: LoRA adapter '<name>' added successfully."; a missing field, a name
// already loaded (without load_inplace) or a served model's name is a 400 InvalidUserInput.
// POST /v1/unload_lora_adapter {lora_name} answers "Success: LoRA adapter '<name>' removed
// successfully.", or 404 NotFoundError for an adapter not loaded. At most 1024 adapters are
// loaded. A request naming an adapter runs on its base model (its scheduler counts and
// metrics series, as vLLM labels adapter requests with the base model) with its own prefix
// cache blocks, and echoes the adapter's name; once unloaded, the adapter is an unknown model.
//
// POST /sleep?level=1|2 (default 1) puts the engine to sleep and empties its prefix cache:
// generation and pooling requests get 503 until POST /wake_up (optionally ?tags=weights and
// ?tags=kv_cache, waking one part; the engine serves once both are awake); requests already
// running finish. GET /is_sleeping answers {"is_sleeping": bool}; /health stays 200, and the
// tokenizer, models and adapter routes keep working. POST /reset_prefix_cache empties the
// prefix cache. These answer 200 with an empty body (400 for a bad level or tag).
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
// prefill and KV cache pressure, not on the sequence count alone (Prefill interference,
// below, models the prefill chunks).
//
// Prefix cache: the prompt's token ids (one per word, the ids /tokenize returns, see Tokens)
// are split into blocks of Config.BlockSize tokens; each full block is hashed together with
// the hash of the block before it, the chain seeded with the model name (a LoRA adapter's
// name for its requests, so an adapter's blocks are its own).
// The engine keeps an LRU set of at most Config.KVCacheBlocks block hashes. The leading
// blocks of a prompt found in that set are cached tokens: they skip TTFTPerPromptToken and
// count as prefix cache hits. A partial last block is never cached. Queries and hits are
// counted in tokens. vllm:kv_cache_usage_perc is the number of blocks held by running
// sequences (prompt plus generated tokens, each sequence rounded up to whole blocks) over
// Config.KVCacheBlocks, capped at 1; the KV capacity never limits admission.
//
// Every wait (queue, TTFT, ITL, stalls, trickle pauses) also watches the request context:
// when the client goes away the engine stops at once, frees the running slot or queue place
// and counts the request as aborted (vLLM's "Aborted request"). Everything runs on the
// request's handler goroutine; the engine starts goroutines of its own only to publish
// KV-cache events (see KV-cache events), and [Engine.Close] stops them.
//
// Every generation or pooling request that passes validation ends as exactly one of
// Stats.Completed, Stats.Aborted or Stats.Faulted (a background response when the engine
// sees its time pass). Completed and Faulted requests are counted, and their
// slot and KV blocks freed, just before the last bytes are written (or the connection is
// closed), so a client that has seen the end of a response already sees it in Stats and
// /metrics. An aborted request is counted as soon as the handler notices the client left
// (at once for HTTP/1.1, where net/http watches the connection).
//
// # Prefill interference
//
// Config.PrefillInterference (cmd/enginesim --prefill-interference; off by default, and
// then nothing below applies) models the effect that prefill/decode disaggregation exists
// to remove: on an aggregated engine, vLLM V1's continuous batching with chunked prefill
// runs a long prompt's prefill in the same engine steps as the decode tokens of every
// running stream, so their inter-token gaps grow while it lasts, in proportion to the
// prompt. As vLLM's scheduler (vllm/v1/core/sched/scheduler.py) fills a step's token budget,
// Config.MaxNumBatchedTokens (vLLM's max_num_batched_tokens, vllm/config/scheduler.py;
// default 2048, the OpenAI server's default in vllm/engine/arg_utils.py on GPUs under 70
// GiB and on the A100, 8192 on larger ones), the running sequences first take one token
// each, and a prompt's P uncached tokens (after the prefix cache) are prefilled in chunks of
// at most the budget left, left = MaxNumBatchedTokens - decoding sequences (at least 1),
// one chunk per step: ceil(P/left) steps. While that prefill lasts, each decode step of
// every other running sequence carries the step's chunk and is stretched by its compute,
// the chunk's tokens times TTFTPerPromptToken (the per-token cost the prefill itself pays):
//
//	itl = ITL + ITLPerRunning*(running-1) + TTFTPerPromptToken*chunk
//
// so a stream decoding beside a prefill of P tokens gets ceil(P/left) stretched gaps (the
// last one by the remainder chunk), P*TTFTPerPromptToken late in all, then its ITL again.
// Prefills at once take turns, in arrival order: a step carries as many of their chunks
// as its budget holds (usually the first one's alone), and a later prefill stretches the
// steps once those before it are done. MaxNumBatchedTokens must be at least
// MaxNumSeqs, as vLLM requires, so a step always has room for a chunk.
//
// The steps are counted in each decoding sequence's own inter-token waits, not in wall
// time: a sequence decoding when a prefill starts is stretched for exactly its ceil(P/left)
// steps, whatever its own ITL, and one that starts decoding during the prefill (its own
// prefill ended, or its KV was pulled) joins at the step the furthest decoder has reached.
// A prefill cut by its client leaving stops stretching at once. The prefilling sequence's
// own time to first token is the formula of Scheduling, plus its turn: prompts share the
// engine's compute, so a prefill waits for the prompt tokens of the prefills that came before
// it on the engine (first come, first served, as vLLM's scheduler admits waiting prompts
// into each step's budget) to be computed at TTFTPerPromptToken each. A decode
// leg of prefill and decode (below) computes no prompt and stretches nobody (its KV
// transfer is not compute on this engine); under the recompute policy it prefills as any
// request. Embeddings and the other pooling routes, which pay no per-token prefill cost,
// stretch nobody, and background responses (which hold no slot) are neither stretched nor
// stretch.
//
// Left out: the prefilling sequence does not itself wait in chunks (its prefill stays one
// wait), so the stretched steps and its prefill wait agree only roughly in time; a prefill
// cut short keeps its turn's compute reserved; a
// step's cost is linear in its tokens, with no attention cost growing with context, no
// CUDA graphs, no KV cache pressure or preemption; vLLM's long_prefill_token_threshold and
// max_num_partial_prefills are not modelled.
//
// # Prefill and decode
//
// Chat and completions speak vLLM's NixlConnector contract for prefill/decode (P/D)
// disaggregation in pull mode (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py
// and its pull scheduler; the router side is
// tests/v1/kv_connector/nixl_integration/toy_proxy_server.py). By default every engine can
// take either role and the router decides, as with vLLM's kv_role kv_both; Config.KVRole
// (cmd/enginesim --kv-role) kv_producer makes it act on prefill legs only (a decode leg's
// params are ignored: it computes the prompt, pulls nothing), kv_consumer on decode legs only
// (a prefill leg's do_remote_decode is ignored: no params, nothing held).
//
// Prefill leg: a non-stream request with "kv_transfer_params": {"do_remote_decode": true,
// ...} (the router also sets max_tokens 1) is served as any request (its slot, prefix cache
// and time to first token), and its body's top-level kv_transfer_params is the object of
// vLLM's request_finished: {"do_remote_prefill": true, "do_remote_decode": false,
// "remote_block_ids": [ids of the prompt's blocks of Config.BlockSize tokens, the last one
// partial; opaque], "remote_engine_id": Config.KVEngineID (default a random UUID),
// "remote_request_id": the response id followed by "-" and 8 random hex digits (vLLM
// randomizes its internal ids), "remote_host", "remote_port": Config.KVSideChannelHost and
// Port (default the local address of the connection the request came on: the engine's
// listener), "tp_size": 1, "remote_num_tokens": the prompt tokens, "transfer_mode":
// "pull"}. As in vLLM the params are returned only when the prefill finished with length or
// stop: under the drain-after and error-after faults, and the kv-no-params fault, the body
// carries null (or is the error) and nothing is held. A stream with do_remote_decode is
// served as a plain stream, without params, holding nothing.
//
// The engine then holds the prompt's blocks (they count in vllm:kv_cache_usage_perc and
// Stats.KVHeld) until a decode engine pulls them or Config.KVLeaseDuration (vLLM's
// kv_lease_duration, default 30 s) passes on the engine's clock; expired holds are freed
// when the engine next looks (Stats, a pull, a new prefill leg).
//
// Decode leg: a chat or completions request whose kv_transfer_params has
// "do_remote_prefill": true and the remote_* fields of a prefill answer. Once it has a
// running slot (and has looked its prompt up in its own prefix cache), the engine pulls the
// KV from remote_host:remote_port with POST /sim/kv/pull {"remote_request_id",
// "remote_engine_id"}, which the prefill engine answers 200 {remote_request_id,
// remote_num_tokens, remote_block_ids} and frees the blocks, 404 when it holds nothing for
// the id (unknown, already pulled or expired) and 409 when the engine id is not its own.
// The pull then costs Config.KVTransferPerToken per prompt token not in the decode engine's
// prefix cache, in place of the prefill wait (no TTFT, TTFTPerPromptToken or
// TTFTPerRunning); the generation goes on as usual, streaming or not as the decode request
// asks, and its usage reports the whole prompt as cached: prompt_tokens_details
// {"cached_tokens": prompt_tokens}, on the non-stream body and the usage chunk, as vLLM's
// decode engine does when run with --enable-prompt-tokens-details (vLLM writes the field
// only then, and only for a non-zero count: a decode leg that recomputed an uncached
// prompt reports null, as other requests here do). A client that leaves during the pull
// cancels it and frees the slot (Aborted).
//
// The pull's address comes from the request body, so it is bounded: remote_host must be an
// IP address or a DNS name (nothing that adds a path, query or credentials to the URL),
// remote_port 1 to 65535, the dial times out after 5 s and the answer's headers after 30
// s, and a redirect is not followed (it fails the pull). A gateway in front should still
// strip kv_transfer_params from its clients' bodies.
//
// A decode leg whose params lack remote_engine_id, remote_request_id, remote_host or
// remote_port (or name no valid host and port), whose pull is answered with anything but 200 or cannot be sent, or that
// carries the kv-pull-fail fault, follows Config.KVLoadFailurePolicy (vLLM's
// kv_load_failure_policy): "fail" (the default) finishes it as vLLM's scheduler finishes it
// (FINISHED_ERROR, vllm/v1/core/sched/scheduler.py), which the OpenAI server answers as a
// generation error: 500 {"error":{"message":"Internal server
// error","type":"InternalServerError","param":null,"code":500}}, or in a stream (after the
// role chunk) that error event and "data: [DONE]" (Faulted); "recompute" computes the
// prompt as a plain request does (its prefill wait; cached_tokens is its own prefix cache
// hits). A kv_transfer_params that is not an object is answered with 400.
//
// Stats counts prefill legs answered with params (KVParamsSent), holds (KVHeld now,
// KVPullsServed, KVLeasesExpired), and decode legs that pulled (KVPulled), failed to load
// (KVLoadFailures) and recomputed (KVRecomputed). /metrics adds the two of vLLM's NIXL
// connector counters the simulator can tell (see Metrics).
//
// # KV-cache events
//
// With Config.KVEvents set (enginesim --kv-events-endpoint), the prefix cache publishes
// vLLM's KV-cache events as vLLM's ZmqEventPublisher does with --kv-events-config
// (vllm/distributed/kv_events.py), so a router can index the engine's blocks: every message
// on the PUB socket bound at Config.KVEvents ([Engine.KVEventsAddr]) is three frames [topic
// (Config.KVEventsTopic), seq (8 bytes big-endian, from 0, one per batch), payload], the
// payload a msgpack batch [ts (seconds, float), [events], data_parallel_rank 0], its events
// maps or positional arrays (Config.KVEventsEncoding); internal/kvevents decodes them. The
// events are those of vLLM's block pool (vllm/v1/core/block_pool.py), one batch per engine
// step:
//
//   - a request whose prompt's full blocks are not all cached makes one batch: a
//     BlockRemoved {block_hashes [h], medium "GPU", group_idx 0} per block evicted to make
//     room (least recently used first), then one BlockStored of the new blocks
//     {block_hashes, parent_block_hash (the hash of the block before the first new one; nil
//     when the prompt's first block is new), token_ids (exactly the ids /tokenize gives for
//     those blocks), block_size, lora_id nil, medium "GPU", lora_name (the adapter's name
//     for an adapter's request, else nil), extra_keys (one per block: [lora_name] or nil),
//     group_idx 0, kv_cache_spec_kind "full_attention"}; a request whose blocks are all
//     cached makes none;
//   - POST /reset_prefix_cache and POST /sleep make a batch of one AllBlocksCleared.
//
// Only prompt blocks are cached (vLLM also caches the blocks its generated tokens fill).
// Block hashes are the simulator's own (FNV-1a chained over token ids; vLLM's cannot be
// reproduced), the same for the same prompt, model and block size. Token ids over 2^32-1 (a
// decimal word that large) are written modulo 2^32.
//
// Publishing never blocks a request: batches join a queue of Config.KVEventsQueue for one
// publisher goroutine; when it is full a batch is dropped and counted (KVEventsStats), its
// seq skipped, so subscribers see a gap. Subscribers that connect late miss what was
// published before (ZMQ's slow joiner). The last Config.KVEventsBuffer batches are kept for
// the ROUTER socket at Config.KVEventsReplay ([Engine.KVReplayAddr]), which answers as
// vLLM's does: it takes [identity, "", start (8 bytes big-endian)], what a REQ client
// sending [start] or a DEALER client sending ["", start] delivers, and answers [identity,
// "", seq, payload] for every buffered batch with seq >= start, then [identity, "", -1 as 8
// bytes, ""] (a REQ client receives [seq, payload] and [-1, ""]); other requests get no
// answer.
//
// Faults on the stream, besides requests: Config.KVEventsDrop or POST /admin/kv-events/drop
// (body "N" or "N-M", empty to remove; [Engine.SetKVEventsDrop]) keeps the batches with those
// seqs off PUB but in the replay buffer, as a PUB high-water-mark drop would; POST
// /admin/kv-events/stop and /resume ([Engine.SetKVEventsStopped]) keep every batch off PUB
// meanwhile (still numbered and buffered); POST /admin/kv-events/restart
// ([Engine.RestartKVEvents]) acts as a restarted engine process: the cache is emptied
// without AllBlocksCleared, seq starts over at 0 and the replay buffer is emptied. These
// answer 200 with an empty body, 400 for a bad range, 409 when KV events are off.
//
// An engine with KV events owns two goroutines (publisher and replay); [Engine.Close] stops
// them and closes the sockets. (zmq4's PUB socket leaves one idle goroutine of its own
// after Close.)
//
// # Faults
//
// A request's faults come from its X-Enginesim-Fault header ([FaultHeader]) or, when the
// header is absent, from Config.Fault (changeable at run time with [Engine.SetFault] or
// POST /admin/fault). An empty header means no fault, overriding the default. The spec is a
// comma-separated list of key or key=value items, for example "close-after=3" or
// "slow-headers=200ms,trickle". Unknown keys and bad values are answered with 400, so typos
// are loud. Durations use Go syntax (250ms, 2s). Faults act after the request is validated,
// on every route except GET /v1/models, /health, /metrics and POST /admin/fault, with the
// same meaning everywhere; what is said below of chat streams holds for every stream
// (Responses, Messages, transcriptions), of non-stream bodies for every JSON, text or binary body, and a status fault's json body is in the
// route's envelope. On the light routes a fault ends nothing in Stats, and their action
// (sleeping, loading an adapter, cancelling a response, resetting the cache) is taken only
// once the faults before the headers and close-after-headers have passed: under status,
// close-before-headers, close-after-headers or a stall-before-headers the client leaves, the
// engine is unchanged. A background response's reply is handed off: once the queued response
// exists, faults on its body do not change its outcome.
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
//     number of tokens aborts after the last token. On the typed streams a token's events
//     are the token's delta with the events that open its output item or content block
//     (response.output_item.added, content_block_start, ...), and nothing after them. Non-stream and embeddings: after
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
//   - reset-after=N: like close-after=N (stream: the role chunk and N token events;
//     non-stream and embeddings: half the body), but the connection is then reset: the
//     engine hijacks it and closes it with SO_LINGER 0, so the kernel sends a TCP RST and
//     the client's read fails with "connection reset by peer" (ECONNRESET) instead of an
//     EOF. On HTTP/2 the stream is reset. Faulted.
//   - error-after=N: a generation error after N token events, as vLLM reports one (its
//     GenerationError: status 500, type InternalServerError, message "Internal server
//     error"; serving_engine.py _raise_if_error). Chat, completions and transcription
//     streams: the in-band event data: {"error":{"message":"Internal server
//     error","type":"InternalServerError","param":null,"code":500}} then "data: [DONE]",
//     as vLLM's stream generators send after catching it, and a clean end of the
//     response; no finish chunk or usage chunk. The Responses stream: the event "error"
//     {"type":"error","code":"InternalServerError","message":"Internal server
//     error","param":null,"sequence_number":N}, nothing after it. The Messages stream:
//     Anthropic's "event: error" {"type":"error","error":{"type":"api_error","message":
//     "Internal server error"}}. Non-stream and embeddings: after min(N, n) tokens,
//     the 500 error body in the route's envelope instead of the answer. N larger than the
//     number of tokens errs after the last token. Faulted.
//   - drain-after=N: after N token events the engine starts draining, as vLLM does when it
//     shuts down ([Engine.SetDraining]): GET /health answers 503 and new generation and
//     pooling requests get 503 (ServiceUnavailableError, "The engine is draining (shutting
//     down) and accepts no new requests."; the light routes keep working) until
//     SetDraining(false). The request itself is aborted the way vLLM's engine aborts a
//     request in flight (its output ends with finish_reason "abort", FinishReason.ABORT):
//     chat and completions streams send a finish chunk with finish_reason "abort" (empty
//     delta), the usage chunk if asked (completion_tokens N) and [DONE]; their non-stream
//     bodies carry the N tokens with finish_reason "abort". Routes without that finish
//     reason (Responses, Messages, audio, images, pooling, light routes) are cut as by
//     close-after (the stream after N token events, the body after half). Faulted.
//   - cut-at=N, reset-at=N, stall-at=N (N >= 1): close-after, reset-after and stall-after
//     at an absolute place in the answer: when the generation reaches content token N (the
//     answer's tokN), counted from the answer's start, so that a continuation gets through.
//     A generation that starts at content token k (a continuation: the prompt ends with the
//     ids of tok0..tok(k-1), see Continuations) is cut, reset or stalled after N-k token events
//     when k < N (plus the reasoning tokens streamed first, under reasoning), and not at all
//     when k >= N: the continuation a gateway sends from the break at N with the same
//     header passes. On the routes that do not resume (Responses, Messages, audio, images,
//     pooling, light routes) k is 0 and N counts token events as close-after's N does.
//     Non-stream bodies: as close-after (half the body) when k < N. With the matching
//     after-fault too, the earlier of the two acts. Faulted (stall-at: Aborted).
//   - truncate: non-stream and embeddings: after generating, send 200 with the
//     Content-Length of the full JSON body (even under trickle), write its first half
//     (len/2 bytes), flush and abort the connection: the client sees an unexpected EOF short
//     of the declared length. Combined with malformed, the malformed body is the one
//     truncated. Stream: send the whole stream (role chunk, tokens, finish chunk, usage chunk
//     if asked) except the final "data: [DONE]", then end the response cleanly (the chunked
//     terminator on HTTP/1.1), like an engine that ends a stream without its terminator.
//     Faulted in both cases; a stream is counted after its last event is written and before
//     the response ends. close-after, reset-after, error-after, drain-after and stall-after
//     act first (in that order when several are at the same token). The terminator of the
//     Responses stream is response.completed, of the Messages stream message_stop.
//   - slow-headers=DUR: sleep DUR before anything else, then proceed normally. Not a fault.
//     Combined with status or close-before-headers it delays them.
//   - malformed: stream: right after the role chunk (the typed streams: after
//     response.in_progress, after message_start), emit the invalid event
//     `data: {"id":"bad", "choices": [` (named response.output_text.delta or
//     content_block_delta on the typed streams, so clients parse it) and continue normally
//     (Completed). Non-stream and embeddings: answer 200 with that invalid JSON as the whole
//     body, whatever the route's Content-Type (Faulted).
//   - trickle or trickle=DUR: write every response byte separately, each followed by a flush
//     and a pause of DUR (default 1ms; 0 only flushes), so events arrive split across reads.
//     Non-stream bodies then have no Content-Length.
//   - keepalive or keepalive=DUR: stream: write the comment ": keep-alive" before each wait
//     (queue, first token, each further token), and with DUR also every DUR during a wait.
//   - no-content: generate zero tokens: a stream sends the role chunk, the finish chunk
//     ("stop"), the usage chunk if asked (completion_tokens 0) and [DONE]; a non-stream body
//     has empty content. The Responses API then has no output items, the Messages API no
//     content blocks, speech no samples; images take no steps.
//   - reasoning=N: chat: the first N of the generated tokens are reasoning tokens, streamed
//     as delta {"reasoning_content":"think<i> "} before the content tokens (non-stream: the
//     message's reasoning_content); content tokens are then numbered from tok0. They count as
//     completion tokens. The Responses API streams them as a reasoning item, the Messages
//     API as a thinking block (thinking_delta, then a signature_delta). Ignored by the other
//     routes.
//   - tool-call: chat: the first generated event is the delta
//     {"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"f","arguments":""}}]},
//     sent at the time to first token; content tokens follow one ITL apart, and the finish
//     chunk's delta carries the arguments, {"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}
//     (as vLLM's finish chunk carries the arguments its tool parser had not streamed). It
//     is not a token and does not change finish_reason (non-stream: the message gets the
//     tool_calls entry {"id":"call_0","type":"function","function":{"name":"f","arguments":"{}"}},
//     and content null if there is no content). Chat only.
//   - kv-no-params: a prefill leg (see Prefill and decode) answers without
//     kv_transfer_params (null) and holds nothing, as vLLM's aborted prefill does. Other
//     requests ignore it. Completed.
//   - kv-pull-fail: a decode leg's pull fails without reaching the prefill engine (whose
//     blocks stay held until the lease ends); Config.KVLoadFailurePolicy decides what
//     follows. Other requests ignore it.
//
// Faults combine; for example "keepalive,trickle=0s,reasoning=2". Stats counts a request
// ended by a fault as Faulted, one whose client left first (including during a stall) as
// Aborted.
//
// # Hosted providers
//
// Config.Provider (a [ProviderConfig]) makes the engine answer as a hosted provider
// answers a gateway, for tests of provider engines: Kind [ProviderOpenAI], [ProviderAzure]
// or [ProviderAnthropic] (off by default). Serve it over HTTPS with a certificate from
// [NewTestTLS] (HTTP/2 when the server offers "h2"). In front of every route but GET
// /health and GET /metrics (the simulator's own, never keyed):
//
//   - Keys: openai wants "Authorization: Bearer <Key>", azure "api-key: <Key>", anthropic
//     "x-api-key: <Key>" and an anthropic-version header on /v1/messages and
//     /v1/messages/count_tokens, and a Bearer key (or x-api-key) on the other routes, its
//     OpenAI-compatible endpoints. A wrong or missing key gets the provider's 401: OpenAI's
//     {"error":{"message":"Incorrect API key provided. ...","type":"invalid_request_error",
//     "param":null,"code":"invalid_api_key"}} (the key is never echoed), Azure's
//     {"error":{"code":"401","message":"Access denied due to invalid subscription key or
//     wrong API endpoint. ..."}}, Anthropic's {"type":"error","error":{"type":
//     "authentication_error","message":"invalid x-api-key"}}; a missing anthropic-version
//     gets Anthropic's 400 "anthropic-version: header is required".
//   - Model names: with ProviderConfig.Models, requests name the provider's models (or
//     Azure deployments), each run on its served model, and responses echo the provider's
//     name; other names, and none, get the 404 for an unknown model (in vLLM's words).
//   - Azure: POST /openai/deployments/{deployment}/chat/completions, /completions and
//     /embeddings with an api-version query parameter run on the engine's
//     /v1/chat/completions, /v1/completions and /v1/embeddings, the deployment name as
//     the body's model; any other path, or no api-version, gets Azure's 404
//     {"error":{"code":"404","message":"Resource not found"}}, an unknown deployment
//     Azure's 404 DeploymentNotFound.
//   - Rate limits: with ProviderConfig.RequestsPerMinute, requests are counted in fixed
//     one-minute windows on the engine's clock (the window starts at its first request).
//     Only requests that pass the checks above are counted, and every answer to them
//     carries x-ratelimit-limit-requests, x-ratelimit-remaining-requests
//     and x-ratelimit-reset-requests (a Go duration such as "50s", as OpenAI writes it;
//     openai and azure) or anthropic-ratelimit-requests-limit, -remaining and -reset
//     (RFC 3339; anthropic). A request over the limit is not counted and gets 429 with
//     Retry-After (whole seconds to the window's end, rounded up) and the provider's body:
//     OpenAI's type "requests", code "rate_limit_exceeded"; Azure's code "429"; on
//     /v1/messages Anthropic's rate_limit_error (its OpenAI-compatible routes answer in
//     OpenAI's envelope).
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
//     queue time included, to the first token, whether or not it is streamed);
//   - vllm:engine_sleep_state (gauge, labels model_name, engine "0" and sleep_state, as
//     vLLM's PrometheusStatLogger exports it): sleep_state="awake" is 1 while awake,
//     "weights_offloaded" 1 while asleep at level 1, "discard_all" 1 at level 2.
//   - vllm:nixl_num_failed_transfers_total (counter, labels model_name and engine "0": a
//     decode engine's failed KV pulls, the kv-pull-fail fault included, not params
//     lacking their remote fields) and vllm:nixl_num_kv_expired_reqs_total (a prefill
//     engine's KV holds freed by the lease), as vLLM's NixlConnector exports them
//     (nixl_connector.py's Prometheus metrics); vLLM's transfer time and size
//     histograms are not simulated.
//
// Requests on every generation and pooling route count in these series the way chat and
// embeddings do.
//
// Simulator-only counters: enginesim_aborted_requests_total and
// enginesim_faulted_requests_total, with model_name.
package enginesim
