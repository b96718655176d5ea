#!/usr/bin/env bash
# Does a collector that is down or hung slow the gateway? Runs the same
# batch of streamed requests through one gateway exporting traces (every
# span sampled) and metrics over OTLP/HTTP while its collector is
#   up       a real OpenTelemetry Collector (integration/tools/otelcol),
#   down     stopped: connections to its port are refused,
#   hung     a listener that accepts and never answers (bench/telemetry/blackhole),
# in interleaved rounds (up, down, hung, up, down, hung, ...), and prints a
# markdown table of each mode's median TTFT, p50 and p99 end-to-end latency
# and throughput, with the ratios to "up" and the command.
#
#   bench/telemetry/run.sh                 # 3 rounds of 2000 requests, about 2 minutes
#   ROUNDS=5 REQUESTS=4000 bench/telemetry/run.sh
#
# Needs go; builds the collector once into .tools/bin (as integration/run.sh
# does). Every process is stopped by its PID on exit.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env
ROUNDS="${ROUNDS:-3}"
REQUESTS="${REQUESTS:-2000}"
CONCURRENCY="${CONCURRENCY:-32}"
MAX_TOKENS="${MAX_TOKENS:-16}"

work="$(mktemp -d)"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

bin="$root/.tools/bin"
mkdir -p "$bin"
# shellcheck source=../../integration/tools/build.sh
. "$root/integration/tools/build.sh"
build_tool otelcol "$root/integration/tools/otelcol" .
(cd "$root" && go build -o "$work/gateway" ./cmd/gateway && go build -o "$work/enginesim" ./cmd/enginesim &&
	go build -o "$work/loadgen" ./cmd/loadgen && go build -o "$work/blackhole" ./bench/telemetry/blackhole)


eng="$(free_port)"
"$work/enginesim" --listen "127.0.0.1:$eng" --model bench --ttft 20ms --itl 5ms --max-num-seqs 256 >"$work/engine.log" 2>&1 &
pids+=($!)
otlp="$(free_port)"
gw="$(free_port)"
cat >"$work/gateway.yaml" <<YAML
server: {listen: "127.0.0.1:$gw"}
log: {access: false}
admin: {listen: ""}
engines: [{name: e1, url: "http://127.0.0.1:$eng", models: [bench]}]
YAML
wait_http "http://127.0.0.1:$eng/health"
OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$otlp" OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
	OTEL_METRIC_EXPORT_INTERVAL=1000 OTEL_BSP_SCHEDULE_DELAY=200 OTEL_TRACES_SAMPLER=always_on \
	"$work/gateway" --config "$work/gateway.yaml" >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$gw/ready"

collector=""
start_mode() {
	case "$1" in
	up)
		OTLP_HTTP_ENDPOINT="127.0.0.1:$otlp" "$bin/otelcol" --config "$root/bench/telemetry/collector.yaml" >>"$work/collector.log" 2>&1 &
		collector=$!
		for _ in $(seq 200); do (echo >"/dev/tcp/127.0.0.1/$otlp") 2>/dev/null && break; sleep 0.05; done
		;;
	hung)
		"$work/blackhole" --listen "127.0.0.1:$otlp" &
		collector=$!
		;;
	down) collector="" ;;
	esac
	[[ -n "$collector" ]] && pids+=("$collector")
	sleep 2 # let the exporters meet the new state (a failing export, a retry)
}
stop_mode() {
	if [[ -n "$collector" ]]; then
		kill "$collector" 2>/dev/null || true
		wait "$collector" 2>/dev/null || true
		collector=""
	fi
}

"$work/loadgen" --url "http://127.0.0.1:$gw" --model bench --stream --max-tokens "$MAX_TOKENS" --prompt-words 32 --max-error-rate 1 \
	--concurrency "$CONCURRENCY" --requests 500 >/dev/null # warm-up
for r in $(seq "$ROUNDS"); do
	for mode in up down hung; do
		start_mode "$mode"
		"$work/loadgen" --url "http://127.0.0.1:$gw" --model bench --stream --max-tokens "$MAX_TOKENS" --prompt-words 32 --max-error-rate 1 \
			--concurrency "$CONCURRENCY" --requests "$REQUESTS" --json "$work/$mode-$r.json" >/dev/null
		stop_mode
		echo "round $r $mode: p99 $(jq .e2e.p99_ms "$work/$mode-$r.json") ms, failed $(jq .failed "$work/$mode-$r.json")" >&2
	done
done

# Per mode: medians over the rounds.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
stat() { for r in $(seq "$ROUNDS"); do jq "$2" "$work/$1-$r.json"; done | median; }
echo
echo "| collector | TTFT p50 ms | e2e p50 ms | e2e p99 ms | req/s | failed | p99 / up |"
echo "|---|---|---|---|---|---|---|"
up99="$(stat up .e2e.p99_ms)"
for mode in up down hung; do
	p99="$(stat "$mode" .e2e.p99_ms)"
	printf '| %s | %.1f | %.1f | %.1f | %.0f | %s | x%.3f |\n' "$mode" "$(stat "$mode" .ttft.p50_ms)" "$(stat "$mode" .e2e.p50_ms)" \
		"$p99" "$(stat "$mode" .requests_per_s)" "$(stat "$mode" .failed)" "$(echo "$p99 / $up99" | bc -l)"
done
echo
echo "command: ROUNDS=$ROUNDS REQUESTS=$REQUESTS CONCURRENCY=$CONCURRENCY MAX_TOKENS=$MAX_TOKENS bench/telemetry/run.sh (commit $(git -C "$root" rev-parse --short HEAD)); medians over $ROUNDS interleaved rounds"
grep -c "opentelemetry export error" "$work/gateway.log" | sed 's/^/gateway log lines about export errors: /'
