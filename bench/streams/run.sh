#!/usr/bin/env bash
# Many concurrent streams through one gateway: STREAMS clients (default
# 1000) each stream EVENTS tokens (default 64) that the simulated engine
# sends ITL apart (default 20ms), all at once. Reports, from cmd/loadgen,
# the largest gap between two content events any client saw (the target:
# at most 2x the engine's ITL: no stream stalls) and the ITL percentiles,
# and, from the gateway while every stream is open, its heap in use (its
# admin /metrics, go_memstats_heap_inuse_bytes) and RSS (/proc/PID/status)
# above its idle baseline, per stream. It also prints the largest gap
# through the gateway over the largest gap straight to the engine (the
# BENCHMARKS.md "gap / direct" column). A measurement, not a test: it exits
# 0 whether or not a stream stalled (STALL: ... says so).
#
#   bench/streams/run.sh
#   STREAMS=2000 EVENTS=32 bench/streams/run.sh
#
# Needs go, jq and curl. Every process is stopped by its PID on exit.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env
STREAMS="${STREAMS:-1000}"
EVENTS="${EVENTS:-64}"
ITL="${ITL:-20ms}"
TTFT="${TTFT:-20ms}"
case "${1:-}" in -h | --help) sed -n '2,17s/^# \{0,1\}//p' "$0"; exit 0 ;; esac

work="$(mktemp -d)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
(cd "$root" && go build -o "$work/gateway" ./cmd/gateway && go build -o "$work/enginesim" ./cmd/enginesim && go build -o "$work/loadgen" ./cmd/loadgen)
eng="$(free_port)"
"$work/enginesim" --listen "127.0.0.1:$eng" --model bench --ttft "$TTFT" --itl "$ITL" --max-num-seqs $((STREAMS + 16)) \
	--max-output-tokens "$EVENTS" --output-tokens "$EVENTS" >"$work/engine.log" 2>&1 &
pids+=($!)
gw="$(free_port)"
adm="$(free_port)"
cat >"$work/gateway.yaml" <<YAML
server: {listen: "127.0.0.1:$gw"}
admin: {listen: "127.0.0.1:$adm"}
log: {access: false}
engines: [{name: e1, url: "http://127.0.0.1:$eng", models: [bench]}]
YAML
wait_http "http://127.0.0.1:$eng/health"
"$work/gateway" --config "$work/gateway.yaml" >"$work/gateway.log" 2>&1 &
gwpid=$!
pids+=($gwpid)
wait_http "http://127.0.0.1:$gw/ready"

heap() { curl -s "http://127.0.0.1:$adm/metrics" | awk '$1=="go_memstats_heap_inuse_bytes"{printf "%.0f\n", $2}'; }
rss() { awk '/^VmRSS:/{print $2*1024}' "/proc/$gwpid/status"; }
# The same streams straight to the engine first: what the machine (engine
# and client on the same cores) manages without a gateway.
"$work/loadgen" --url "http://127.0.0.1:$eng" --model bench --stream --max-tokens "$EVENTS" --prompt-words 16 --max-error-rate 1 \
	--concurrency "$STREAMS" --requests "$STREAMS" --json "$work/direct.json" >/dev/null
jq -r '"direct to the engine: succeeded \(.succeeded), failed \(.failed); client ITL p50 \(.itl.p50_ms) ms, p99 \(.itl.p99_ms) ms, largest gap \(.itl.max_ms) ms; TTFT p99 \(.ttft.p99_ms) ms"' "$work/direct.json"
# A warm-up round, so the baseline has the connection pools and buffers.
"$work/loadgen" --url "http://127.0.0.1:$gw" --model bench --stream --max-tokens "$EVENTS" --prompt-words 16 --max-error-rate 1 \
	--concurrency 64 --requests 64 >/dev/null
sleep 1
heap0="$(heap)"
rss0="$(rss)"
# The gateway's CPU over the measured round (utime + stime, in clock ticks).
cpu() { awk '{print $14 + $15}' "/proc/$gwpid/stat"; }
cpu0="$(cpu)"
"$work/loadgen" --url "http://127.0.0.1:$gw" --model bench --stream --max-tokens "$EVENTS" --prompt-words 16 --max-error-rate 1 \
	--concurrency "$STREAMS" --requests "$STREAMS" --json "$work/run.json" >"$work/loadgen.txt" &
lg=$!
pids+=($lg)
# Sample the gateway while the streams are open: the peak of a few samples
# in the middle of the streams' life (TTFT + EVENTS x ITL).
life_ms=$(( ${TTFT%ms} + EVENTS * ${ITL%ms} ))
sleep "$(echo "scale=3; $life_ms / 2000" | bc)"
heap1=0 rss1=0
for _ in 1 2 3 4 5; do
	h="$(heap)"; r="$(rss)"
	((h > heap1)) && heap1=$h
	((r > rss1)) && rss1=$r
	sleep 0.1
done
wait "$lg"
cpu1="$(cpu)"
# The gateway's own ITL histogram (engine to gateway, per content event):
# the share of gaps under 1 ms says whether events came from the engine
# in bursts or left the gateway in them (the client's ITL p50).
curl -s "http://127.0.0.1:$adm/metrics" | awk '
	/^switchboard_engine_inter_token_latency_seconds_bucket/ && /le="0.001"/ { sub(/.* /, ""); under += $0 }
	/^switchboard_engine_inter_token_latency_seconds_count/ { sub(/.* /, ""); total += $0 }
	END { if (total > 0) printf "gateway-observed ITL (engine to gateway): %.1f%% of %d gaps under 1 ms\n", 100 * under / total, total }' >"$work/gwitl.txt"
jq -r --arg s "$STREAMS" --arg itl "$ITL" '"through the gateway: streams \($s), events \(.output_tokens / (.succeeded|if .==0 then 1 else . end) | floor) each, engine ITL \($itl): succeeded \(.succeeded), failed \(.failed); client ITL p50 \(.itl.p50_ms) ms, p99 \(.itl.p99_ms) ms, largest gap \(.itl.max_ms) ms; TTFT p99 \(.ttft.p99_ms) ms"' "$work/run.json"
echo "gateway heap in use: idle $((heap0 / 1024)) KiB, with $STREAMS streams open $((heap1 / 1024)) KiB: $(( (heap1 - heap0) / STREAMS )) B per stream"
echo "gateway RSS: idle $((rss0 / 1024)) KiB, with $STREAMS streams open $((rss1 / 1024)) KiB: $(( (rss1 - rss0) / STREAMS )) B per stream"
cat "$work/gwitl.txt"
events="$(jq .output_tokens "$work/run.json")"
echo "gateway CPU: $(echo "scale=2; ($cpu1 - $cpu0) / $(getconf CLK_TCK)" | bc) s for $events events: $(echo "scale=2; ($cpu1 - $cpu0) * 1000000 / $(getconf CLK_TCK) / $events" | bc) µs per event"
max="$(jq .itl.max_ms "$work/run.json")"
limit="$(echo "2 * ${ITL%ms}" | bc)"
if (($(echo "$max <= $limit" | bc))); then echo "no stream stalled: largest gap $max ms <= 2 x ITL ($limit ms)"; else echo "STALL: largest gap $max ms > 2 x ITL ($limit ms)"; fi
# The same clients straight to the engine show what the machine itself
# does: the gateway's share of the largest gap is the ratio of the two.
direct_max="$(jq .itl.max_ms "$work/direct.json")"
echo "largest gap through the gateway / straight to the engine: $(echo "scale=2; $max / $direct_max" | bc)"
echo "command: STREAMS=$STREAMS EVENTS=$EVENTS ITL=$ITL TTFT=$TTFT bench/streams/run.sh (commit $(git -C "$root" rev-parse --short HEAD))"
