-- wrk script of bench/proxy/run.sh: POSTs one chat completion request per
-- request, non-streaming or (BENCH_STREAM=1) streamed with the usage chunk,
-- and when the run ends prints one JSON line, prefixed "BENCH_RESULT ", with
-- the exact counts and latency percentiles (microseconds) instead of wrk's
-- rounded human text:
--
--   BENCH_STREAM=1 wrk -t1 -c1 -d10s --latency -s bench/proxy/chat.lua http://HOST:PORT/v1/chat/completions
--
-- A streamed request's latency is the whole response: headers, all 19 events
-- and [DONE], up to the last chunk of the chunked body.
local stream = os.getenv("BENCH_STREAM") == "1"
local model = os.getenv("BENCH_MODEL") or "bench"
local tokens = tonumber(os.getenv("BENCH_TOKENS") or "16")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
if stream then
  wrk.body = string.format('{"model":"%s","max_tokens":%d,"stream":true,"stream_options":{"include_usage":true},'
    .. '"messages":[{"role":"user","content":"Say hello"}]}', model, tokens)
else
  wrk.body = string.format('{"model":"%s","max_tokens":%d,"messages":[{"role":"user","content":"Say hello"}]}',
    model, tokens)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,'
    .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
    .. '"latency_us":{"min":%d,"mean":%.1f,"p50":%d,"p75":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency:percentile(50), latency:percentile(75), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max))
end
