#!/usr/bin/env bash
# Hybrid fleet: two self-hosted engines (simulated vLLM, engines[].max_in_flight
# SLOTS each) and, in the second run, a hosted provider tier (the simulator in
# OpenAI mode over TLS and HTTP/2, its key checked, gpt-4o-mini mapped to the
# model) behind one gateway, with a pricing list (a GPU-hour price for the
# self-hosted engines, OpenAI's list price for the provider) and three API
# keys: team-a and team-b without a budget, team-c with a daily spend budget
# (BUDGET USD) the run exhausts. Each key sends RATE streaming chats per
# second (open loop, Poisson arrivals) for DURATION: together more than the
# self-hosted slots hold. The same load runs twice: "self-hosted" (no
# provider engine: the baseline) and "hybrid". Prints two markdown tables:
# per run, the requests, those refused for want of a free slot (503) or of
# budget (429 insufficient_quota), the legs per tier and the provider's share
# (GET /admin/engines tiers), the overflows, the cost per tier
# (switchboard.request.cost) and the engines' TTFT p50/p99 per tier; per run
# and key, its requests, served, on the provider (X-Switchboard-Engine),
# refusals, spend (GET /admin/keys spend_usd), cost per 1,000 served requests
# and the client's TTFT. A measurement, not a test: it exits 0 whatever it
# finds, unless a process fails to start.
# README.md beside this script explains the setup and every parameter.
#
#   bench/hybrid/run.sh                        # about 1.5 minutes
#   DURATION=10s bench/hybrid/run.sh           # a shorter smoke run
#   bench/hybrid/run.sh --help
#
# Needs go, jq, curl, awk and sha256sum. Every process is stopped by its PID
# on exit, Ctrl-C included.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env

params=(
	"SLOTS=8"
	"RATE=12"
	"DURATION=30s"
	"MAX_TOKENS=32"
	"PROMPT_WORDS=64"
	"TTFT=50ms"
	"ITL=20ms"
	"PROVIDER_TTFT=250ms"
	"PROVIDER_ITL=10ms"
	"PROVIDER_RPM=0"
	"BUDGET=0.002"
	"GPU_USD=2.5"
	"GPU_INPUT_TPS=20000"
	"GPU_OUTPUT_TPS=2500"
	"PROVIDER_INPUT=0.15"
	"PROVIDER_CACHED_INPUT=0.075"
	"PROVIDER_OUTPUT=0.60"
	"RESULTS="
)
usage() {
	sed -n '2,27s/^# \{0,1\}//p' "$0"
	echo
	echo "Parameters (environment variables; defaults shown):"
	for p in "${params[@]}"; do echo "  $p"; done
}
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
(($# == 0)) || { echo "run.sh: no arguments (parameters are environment variables; --help lists them)" >&2; exit 2; }
read_params
for tool in go jq curl awk sha256sum; do
	command -v "$tool" >/dev/null || { echo "run.sh: $tool is required" >&2; exit 1; }
done
RESULTS="${RESULTS:-$root/bench/hybrid/results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$RESULTS"
model=llama
provider_model=gpt-4o-mini
keys=(team-a team-b team-c)

bin="$root/.tools/bench-hybrid" # .tools/ is git-ignored
mkdir -p "$bin"
(cd "$root" && go build -o "$bin/gateway" ./cmd/gateway && go build -o "$bin/enginesim" ./cmd/enginesim && go build -o "$bin/loadgen" ./cmd/loadgen)

trap_stop_all

# key_of NAME: the API key of NAME (a made-up one; the gateway keeps its hash).
key_of() { echo "sk-bench-$1"; }
sha_of() { printf %s "$(key_of "$1")" | sha256sum | cut -d' ' -f1; }

# start_engine DIR NAME ARGS...: a simulator serving the model; its address
# is left in $addr (not printed: start must run in this shell, for the trap).
start_engine() {
	local dir="$1" name="$2" log
	shift 2
	log="$dir/engine-$name.log"
	start "$log" "$bin/enginesim" --listen 127.0.0.1:0 --name "$name" --model "$model" \
		--max-num-seqs 256 --max-output-tokens "$MAX_TOKENS" "$@"
	if ! addr="$(await_addr "$started" "$log" "enginesim listening")"; then
		echo "run.sh: engine $name did not start:" >&2
		cat "$log" >&2
		exit 1
	fi
}

# gateway_config DIR GPU0 GPU1 [PROVIDER]: the gateway's YAML; the provider
# engine only with PROVIDER (its address).
gateway_config() {
	local dir="$1" provider="${4:-}" k
	cat <<YAML
server:
  listen: "127.0.0.1:0"
admin: {listen: "127.0.0.1:0"}
log: {access: false}
auth:
  keys:
YAML
	for k in "${keys[@]}"; do
		echo "    - name: $k"
		echo "      sha256: $(sha_of "$k")"
		echo "      models: [\"*\"]"
		[[ "$k" != team-c ]] || echo "      limits: {max_spend_per_day: $BUDGET}"
	done
	cat <<YAML
engines:
  - {name: gpu-0, url: "http://$2", models: [$model], max_in_flight: $SLOTS}
  - {name: gpu-1, url: "http://$3", models: [$model], max_in_flight: $SLOTS}
YAML
	if [[ -n "$provider" ]]; then
		cat <<YAML
  - name: openai
    provider: openai                   # tier 1 by default
    url: "https://$provider/v1"
    ca_file: "$dir/provider-ca.pem"
    api_key_file: "$dir/provider.key"
    model_map: {$model: $provider_model}
YAML
	fi
	cat <<YAML
pricing:
  - model: $model                      # the self-hosted engines: what their GPUs cost
    gpu_hour: {usd: $GPU_USD, gpus: 1, input_tokens_per_second: $GPU_INPUT_TPS, output_tokens_per_second: $GPU_OUTPUT_TPS}
  - {engine: openai, model: $model, input: $PROVIDER_INPUT, cached_input: $PROVIDER_CACHED_INPUT, output: $PROVIDER_OUTPUT}
YAML
}

# phase NAME: one run, with the provider tier when NAME is hybrid.
phase() {
	local name="$1" dir gpu0 gpu1 prov="" gw adm i k addr lgpids=()
	dir="$RESULTS/$name"
	mkdir -p "$dir"
	start_engine "$dir" gpu-0 --ttft "$TTFT" --itl "$ITL"
	gpu0="$addr"
	start_engine "$dir" gpu-1 --ttft "$TTFT" --itl "$ITL"
	gpu1="$addr"
	if [[ "$name" == hybrid ]]; then
		# The provider's key: the simulator checks it, the gateway sends it.
		printf '%s\n' "sk-bench-provider-$RANDOM$RANDOM" >"$dir/provider.key"
		start_engine "$dir" openai --ttft "$PROVIDER_TTFT" --itl "$PROVIDER_ITL" \
			--provider openai --provider-key-file "$dir/provider.key" --provider-model "$provider_model=$model" \
			--provider-rpm "$PROVIDER_RPM" --tls-self-signed --tls-ca-out "$dir/provider-ca.pem"
		prov="$addr"
	fi
	gateway_config "$dir" "$gpu0" "$gpu1" "$prov" >"$dir/gateway.yaml"
	start "$dir/gateway.log" "$bin/gateway" --config "$dir/gateway.yaml"
	if ! gw="$(await_addr "$started" "$dir/gateway.log" "switchboard listening")"; then
		echo "run.sh: the gateway did not start:" >&2
		cat "$dir/gateway.log" >&2
		exit 1
	fi
	adm="$(await_addr "$started" "$dir/gateway.log" "admin listening")"
	wait_http "http://$gw/ready"
	echo "== $name: gateway $gw, ${#keys[@]} keys x $RATE req/s for $DURATION" >&2
	i=0
	for k in "${keys[@]}"; do
		i=$((i + 1))
		start "$dir/loadgen-$k.txt" "$bin/loadgen" --url "http://$gw" --api-key "$(key_of "$k")" --model "$model" \
			--stream --rate "$RATE" --duration "$DURATION" --seed "$i" --max-tokens "$MAX_TOKENS" \
			--prompt-words "$PROMPT_WORDS" --timeout 30s --max-error-rate 1 --json "$dir/loadgen-$k.json"
		lgpids+=("$started")
	done
	for i in "${lgpids[@]}"; do
		wait "$i" || echo "run.sh: a loadgen failed; see $dir/loadgen-*.txt" >&2
		reaped "$i"
	done
	curl -fsS "http://$adm/admin/engines" >"$dir/engines.json"
	curl -fsS "http://$adm/admin/keys" >"$dir/keys.json"
	curl -fsS "http://$adm/metrics" >"$dir/metrics.txt"
	stop_all
}

phase self-hosted
phase hybrid

# counter METRICS NAME FILTER: the sum of NAME's series whose labels match
# the regexp FILTER.
counter() { awk -v name="$2" -v f="$3" 'index($0, name "{") == 1 && $0 ~ f { s += $NF } END { print s + 0 }' "$1"; }

# tier_engines DIR TIER: a regexp of the engine labels of TIER's engines.
tier_engines() {
	jq -r --argjson t "$2" '[.engines[] | select(.tier == $t) | .name] | if length == 0 then "^$" else "engine=\"(" + join("|") + ")\"" end' "$1/engines.json"
}
# tier_ttft DIR TIER: "p50 / p99" (buckets, ms) of the tier's engines.
tier_ttft() {
	local re b
	re="$(tier_engines "$1" "$2")"
	b="$(buckets "$1/metrics.txt" switchboard_engine_time_to_first_token_seconds "$re")"
	echo "$(quantile 0.5 <<<"$b") / $(quantile 0.99 <<<"$b")"
}
# usd X: X dollars with 4 decimals.
usd() { awk -v x="$1" 'BEGIN { printf "%.4f", x }'; }

cost_metric=switchboard_request_cost_total
summary_row() {
	local d="$RESULTS/$1" reqs no_room refused legs0 legs1 share over c0 c1
	reqs="$(jq -s 'map(.requests) | add' "$d"/loadgen-*.json)"
	no_room="$(jq -s 'map(.statuses["503"] // 0) | add' "$d"/loadgen-*.json)"
	refused="$(jq '[.keys[].refused] | add' "$d/keys.json")" # the keys' only limit is team-c's budget
	legs0="$(jq '[.tiers[] | select(.tier == 0) | .legs] | add // 0' "$d/engines.json")"
	legs1="$(jq '[.tiers[] | select(.tier == 1) | .legs] | add // 0' "$d/engines.json")"
	share="$(jq -r "$jq_fmt"'[.tiers[] | select(.tier == 1) | .share] | add // 0 | . * 100 | fixed(1)' "$d/engines.json")"
	over="$(jq '[.tiers[] | select(.tier == 1) | .overflows_in] | add // 0' "$d/engines.json")"
	c0="$(counter "$d/metrics.txt" "$cost_metric" "$(tier_engines "$d" 0)")"
	c1="$(counter "$d/metrics.txt" "$cost_metric" "$(tier_engines "$d" 1)")"
	printf '| %s | %s | %s | %s | %s / %s | %s%% | %s | $%s / $%s | %s | %s |\n' "$1" "$reqs" "$no_room" "$refused" \
		"$legs0" "$legs1" "$share" "$over" "$(usd "$c0")" "$(usd "$c1")" "$(tier_ttft "$d" 0)" "$(tier_ttft "$d" 1)"
}
key_row() {
	local d="$RESULTS/$1" j="$RESULTS/$1/loadgen-$2.json" spend refused
	spend="$(jq --arg k "$2" '.keys[] | select(.name == $k) | .spend_usd' "$d/keys.json")"
	refused="$(jq --arg k "$2" '.keys[] | select(.name == $k) | .refused' "$d/keys.json")"
	jq -r --arg run "$1" --arg key "$2" --argjson spend "$spend" --argjson refused "$refused" "$jq_fmt"'
		(.succeeded) as $ok
		| "| \($run) | \($key) | \(.requests) | \($ok) | \(.engine_requests.openai // 0) | \(.statuses["503"] // 0) | \(.statuses["429"] // 0) (\($refused)) | $\($spend | fixed(4)) | \(if $ok > 0 then "$" + ($spend / $ok * 1000 | fixed(4)) else "-" end) | \(.ttft.p50_ms | fixed(0)) / \(.ttft.p99_ms | fixed(0)) |"' "$j"
}

cmd="${overrides[*]:+${overrides[*]} }bench/hybrid/run.sh"
{
	echo "| run | requests | 503 no free slot | 429 budget | legs tier 0 / tier 1 | tier 1 share | overflows | cost tier 0 / tier 1 | TTFT tier 0 p50 / p99 ms | TTFT tier 1 p50 / p99 ms |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	summary_row self-hosted
	summary_row hybrid
	echo
	echo "| run | key | requests | served | on the provider | 503 | 429 budget (gateway) | spend | USD per 1k served | client TTFT p50 / p99 ms |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	for ph in self-hosted hybrid; do
		for k in "${keys[@]}"; do key_row "$ph" "$k"; done
	done
	echo
	echo "team-c: max_spend_per_day \$$BUDGET; self-hosted: 2 engines x max_in_flight $SLOTS; load: ${#keys[@]} keys x $RATE req/s (Poisson), $PROMPT_WORDS-word prompts, max_tokens $MAX_TOKENS, streamed"
	jq -r '.error_samples.http_4xx // empty | "team-c'"'"'s first refusal (hybrid): " + .' "$RESULTS/hybrid/loadgen-team-c.json"
	echo "tier TTFT is the gateway histogram's bucket holding the quantile (switchboard.engine.time_to_first_token); the client's TTFT is exact"
	echo "command: $cmd (commit $(bench_commit "$root" bench/hybrid))"
} | tee "$RESULTS/table.md"
