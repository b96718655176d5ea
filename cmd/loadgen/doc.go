// Command loadgen is an LLM-aware load generator for OpenAI-compatible
// servers (Switchboard, vLLM, the simulator). It sends POST
// /v1/chat/completions requests and reports throughput, time to first token
// (TTFT), inter-token latency (ITL), end-to-end latency and errors by class.
//
//	loadgen --url http://localhost:8080 --model m --stream --concurrency 8 --requests 500
//	loadgen --url http://localhost:8080 --stream --rate 20 --duration 1m --warmup 50
//	loadgen --workload conversations --conversations 32 --turns 6 --system-prompts 4 \
//	    --stream --concurrency 32 --duration 2m --json report.json
//	loadgen --stream --requests 100 --json - | jq .ttft
//	loadgen --stream --requests 1000 --max-error-rate 0.01   # exit 1 if over 1% failed
//	loadgen --workload conversations --stream --concurrency 32 --duration 1m --warmup 64 \
//	    --engine-metrics http://127.0.0.1:8001/metrics,http://127.0.0.1:8002/metrics
//
// # Load
//
// Closed loop (the default): --concurrency workers each send a request as
// soon as their previous one ends. Open loop (--rate R): requests start at
// Poisson arrival times, with exponential gaps of mean 1/R drawn from a
// source seeded by --seed, however long earlier requests take.
//
// The run ends when --requests measured requests have been sent, or when
// --duration has passed since the start (requests in flight then finish), or
// on SIGINT / SIGTERM (requests in flight are abandoned and not reported). At
// least one of --requests and --duration is required. The first --warmup
// requests are sent the same way but left out of the report and of
// --requests; the measured requests start only once every warmup request
// has ended, so the two never overlap (the open loop's arrivals start
// there).
//
// # Workloads
//
// fixed sends one prompt of --prompt-words deterministic words every time.
// With --long-share F (0 to 1) it is a mix: each request is, with
// probability F (the sequence drawn from --seed), a long one, whose prompt
// is "Long request N: " and --long-prompt-words words (N counts the long
// requests, so no two share a prefix block and each is prefilled in full)
// with max_tokens --long-max-tokens (0: --max-tokens); the others are the
// fixed prompt. The report then also gives the long and the short
// requests' counts, throughput, TTFT, ITL and end-to-end latency apart
// (JSON "kinds": {"long": ..., "short": ...}), since a long prefill hurts
// the ITL of the short streams beside it:
//
//	loadgen --stream --rate 16 --duration 1m --max-tokens 100 \
//	    --long-share 0.2 --long-prompt-words 4000 --long-max-tokens 100
//
// conversations runs --conversations multi-turn chats at once. Each starts
// with one of --system-prompts long deterministic system prompts
// (--system-prompt-words words), shared by the conversations so a server can
// reuse their prefix, and each turn sends the whole history: the system
// prompt, every earlier user message and the assistant reply received for
// it, and a new user message of --prompt-words words. Every request carries
// the conversation id in --session-header (x-session-id). A conversation has
// one request in flight at a time, so at most --conversations requests run
// at once; a worker or arrival waits for an idle conversation. After --turns
// turns, or a failed turn, a conversation is replaced by a new one.
//
// With --stagger (the default) the run starts in the steady state of a
// service whose conversations are at every stage: the first conversations
// start at turns spread evenly from 1 to --turns, each with the earlier
// turns it would have sent and made-up replies of --max-tokens words, so
// their first requests are long cold prompts (a warm-up of --conversations
// requests takes exactly those). --stagger=false starts every conversation
// at turn 1: they then move in loose step, every prompt short at first and
// long at the end, and a server's cache needs swing with them.
//
// # Measurements
//
// TTFT is the time from sending the request to the first SSE event carrying
// content: a non-empty delta.content, delta.reasoning_content or
// delta.tool_calls, or completions text; the role-only chunk, comments and
// the usage chunk do not count. ITL samples are the gaps between successive
// content events. Output tokens are usage.completion_tokens when the server
// sends usage (loadgen asks for it with stream_options.include_usage), else
// the number of content events. TTFT and ITL exist only with --stream.
// Latency and token statistics cover successful requests; throughput is
// successful requests and their output tokens over the time from the first
// measured start to the last end. Percentiles are exact (nearest rank) over
// every recorded sample.
//
// # Errors
//
// A failed request has one class:
//
//   - http_4xx, http_5xx: a status of 400 or more (the status is kept);
//   - connect: the connection could not be made (dial or DNS failure);
//   - timeout: --timeout expired, before or during the body;
//   - stream_error_event: the stream carried an event data: {"error":...};
//   - stream_no_done: the stream ended, cleanly or not, without data: [DONE];
//   - wrong_answer: with --expect-canonical, a response that otherwise
//     succeeded but whose content is not the simulator's canonical answer
//     of --max-tokens tokens, "tok0 tok1 ... tok<n-1> ", or that carried
//     no finish_reason: an answer cut short, or with tokens lost or
//     repeated, behind a clean end;
//   - other: anything else, such as a connection closed before the
//     response or a non-stream body that is cut short or not JSON.
//
// The error rate is the failed measured requests over all measured ones
// (warmup requests do not count). When it is above --max-error-rate, a
// fraction from 0 to 1, loadgen writes the report and then exits with
// status 1, naming the threshold, so a run can gate CI. The default 0 fails
// the run on any failed request; --max-error-rate 0.01 allows 1%, and
// --max-error-rate 1 never fails it.
//
// # Engines
//
// Behind Switchboard every response names the engine that served it in the
// X-Switchboard-Engine header. The report counts the measured requests,
// failed ones included, by that engine (the first 256 names; requests to
// further engines are counted as "other") and gives the busiest engine's
// count over the mean count per engine (1 is an even spread). The mean
// counts every --engine-metrics URL as an engine, so one that got no
// request still counts.
//
// --engine-metrics URL[,URL...] names the engines' Prometheus /metrics
// endpoints. They are scraped at the start (a failure stops loadgen before
// any load is sent), right before the first measured request (after the
// warmup, with nothing in flight) and after the last one. The prefix cache
// hit rate is the growth of vllm:prefix_cache_hits_total over that of
// vllm:prefix_cache_queries_total (both in prompt tokens; every series of
// each summed, names without _total accepted), summed over the engines,
// and is reported for each engine as well. A counter that went down was
// reset and counts from 0. A scrape failing after the start leaves the
// hit rate out of the report and makes loadgen exit with an error once the
// report is written. Requests abandoned on SIGINT were looked up by the
// engines all the same and count.
//
// # Output
//
// An aligned table goes to stdout; --json FILE also writes the report as
// JSON (--json - writes the JSON to stdout and the table to stderr). When
// stderr is a terminal a progress line is rewritten there 4 times a second.
//
// --fault SPEC is for the simulator only (internal/enginesim): it sends SPEC
// in the X-Enginesim-Fault header of every request, for example
// --fault status=500 or --fault close-after=2. --expect-canonical, also for
// the simulator only, checks every answer's text (see wrong_answer above):
// a benchmark that breaks engines under a gateway then counts the answers
// it lost even when their streams ended cleanly.
package main
