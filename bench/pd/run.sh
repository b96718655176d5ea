#!/usr/bin/env bash
# Compares an aggregated fleet with a prefill/decode disaggregated one of the
# same size over simulated engines with prefill interference on, under a mix
# of long-prompt requests and short streaming chats, and prints one markdown
# table row per configuration: the short chats' TTFT p50 and p99 and ITL p99
# (what a long prefill beside them hurts), the long requests' TTFT,
# throughput and errors. README.md beside this script explains every
# parameter.
#
#   bench/pd/run.sh                                  # aggregated and disaggregated
#   bench/pd/run.sh aggregated                       # only this one
#   CONFIGS=aggregated DURATION=15s bench/pd/run.sh
#   SWEEP="LONG_SHARE=0 0.1 0.2 0.4" bench/pd/run.sh # every configuration at each value
#
# Each configuration gets fresh engines and a fresh gateway. Nothing is
# left running: every process is stopped by its PID on exit, Ctrl-C
# included.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"

# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env

# name=default pairs; each can be overridden from the environment.
params=(
	"CONFIGS=aggregated disaggregated"
	"ENGINES=4"
	"PREFILL_ENGINES=1"
	# enginesim
	"TTFT=5ms"
	"TTFT_PER_TOKEN=50us"
	"TTFT_PER_RUNNING=100us"
	"ITL=8ms"
	"ITL_PER_RUNNING=100us"
	"MAX_NUM_SEQS=256"
	"MAX_NUM_BATCHED_TOKENS=2048"
	"KV_TRANSFER_PER_TOKEN=5us"
	"KV_CACHE_BLOCKS=26000"
	"BLOCK_SIZE=16"
	"MAX_MODEL_LEN=32768"
	# loadgen
	"RATE=16"
	"CONCURRENCY=32"
	"LONG_SHARE=0.2"
	"LONG_PROMPT_WORDS=4000"
	"LONG_MAX_TOKENS=100"
	"PROMPT_WORDS=200"
	"MAX_TOKENS=100"
	"WARMUP=16"
	"DURATION=30s"
	"SEED=1"
	# gateway
	"ROUTING_POLICY=least-loaded"
	"MIN_UNCACHED_TOKENS=256"
	"GATEWAY="
	"SWEEP="
	"RESULTS="
)
usage() {
	sed -n '2,17s/^# \{0,1\}//p' "$0"
	echo
	echo "Parameters (environment variables; defaults shown):"
	for p in "${params[@]}"; do echo "  $p"; done
}

read_params
case "${1:-}" in -h | --help)
	usage
	exit 0
	;;
esac
if (($# > 0)); then
	CONFIGS="$*"
fi
for config in $CONFIGS; do
	case "$config" in aggregated | disaggregated) ;; *)
		echo "run.sh: unknown configuration $config (want aggregated or disaggregated)" >&2
		exit 2
		;;
	esac
done
# check_fleet: exits unless 1 <= PREFILL_ENGINES < ENGINES.
check_fleet() {
	if ((PREFILL_ENGINES < 1 || PREFILL_ENGINES >= ENGINES)); then
		echo "run.sh: ENGINES=$ENGINES PREFILL_ENGINES=$PREFILL_ENGINES: want PREFILL_ENGINES from 1 to ENGINES-1" >&2
		exit 2
	fi
}
check_fleet

# SWEEP="NAME=v1 v2 ...": every configuration runs once per value of the
# parameter NAME; without it, once with the parameters as they are.
sweep_name="" sweep_values=("")
if [[ -n "$SWEEP" ]]; then
	sweep_name="${SWEEP%%=*}"
	read -r -a sweep_values <<<"${SWEEP#*=}"
	known=0
	for p in "${params[@]}"; do [[ "${p%%=*}" == "$sweep_name" ]] && known=1; done
	case "$sweep_name" in CONFIGS | SWEEP | RESULTS) known=0 ;; esac
	if [[ "$SWEEP" != *=* ]] || ((!known || ${#sweep_values[@]} == 0)); then
		echo "run.sh: SWEEP=\"$SWEEP\": want NAME=\"v1 v2 ...\" with NAME a parameter other than CONFIGS, SWEEP and RESULTS" >&2
		exit 2
	fi
fi
RESULTS="${RESULTS:-$root/bench/pd/results/$(date -u +%Y%m%dT%H%M%SZ)}"
model=bench-model

for tool in go jq curl ps; do
	command -v "$tool" >/dev/null || {
		echo "run.sh: $tool is required" >&2
		exit 1
	}
done

# --- processes --------------------------------------------------------------

# Every process is started with start (bench/lib.sh) and stopped by its PID
# on exit, Ctrl-C and SIGTERM included.
trap_stop_all

# --- build --------------------------------------------------------------------

bin="$root/.tools/bench-pd" # .tools/ is git-ignored
mkdir -p "$bin" "$RESULTS"
if [[ -n "$GATEWAY" ]]; then
	# A gateway built elsewhere (another branch); the rest from the work tree.
	[[ -x "$GATEWAY" ]] || {
		echo "run.sh: GATEWAY=$GATEWAY is not an executable" >&2
		exit 2
	}
	gateway_bin="$GATEWAY"
	echo "building enginesim and loadgen into ${bin#"$root"/}/, gateway $GATEWAY ..." >&2
	(cd "$root" && go build -o "$bin/" ./cmd/enginesim ./cmd/loadgen)
else
	gateway_bin="$bin/gateway"
	echo "building gateway, enginesim and loadgen into ${bin#"$root"/}/ ..." >&2
	(cd "$root" && go build -o "$bin/" ./cmd/gateway ./cmd/enginesim ./cmd/loadgen)
fi
commit="$(bench_commit "$root" bench/pd)"

# --- one configuration --------------------------------------------------------

# engine_names CONFIG: the engines' names, one a line, with their role
# after a space for the disaggregated configuration (p1..pN prefill, d1..dM
# decode); aggregated engines are e1..eN with no role (both).
engine_names() {
	local i
	if [[ "$1" == aggregated ]]; then
		for ((i = 1; i <= ENGINES; i++)); do echo "e$i"; done
		return
	fi
	for ((i = 1; i <= PREFILL_ENGINES; i++)); do echo "p$i prefill"; done
	for ((i = 1; i <= ENGINES - PREFILL_ENGINES; i++)); do echo "d$i decode"; done
}

# gateway_config CONFIG NAME=URL[=ROLE]...: the gateway configuration, on
# stdout.
gateway_config() {
	local config="$1" e name url role
	shift
	cat <<-EOF
		server:
		  listen: "127.0.0.1:0"
		  shutdown_timeout: 5s
		  engine_header: true
		admin:
		  listen: ""
		log:
		  level: info
		  access: false
		routing:
		  policy: $ROUTING_POLICY
	EOF
	if [[ "$config" == disaggregated ]]; then
		cat <<-EOF
			disaggregation:
			  enabled: true
			  min_uncached_tokens: $MIN_UNCACHED_TOKENS
		EOF
	fi
	echo "engines:"
	for e in "$@"; do
		IFS='=' read -r name url role <<<"$e"
		printf '  - name: %s\n    url: %s\n    models: [%s]\n' "$name" "$url" "$model"
		if [[ -n "$role" ]]; then
			printf '    role: %s\n' "$role"
		fi
	done
}

ran=()      # "point config" pairs with a result
failed=()   # the same, failed
skipped=""  # the keys of the disaggregated configuration the gateway refused
refused=()  # configurations the gateway refused: not tried again

# run_config POINT CONFIG: fresh engines and gateway, one loadgen run, into
# $RESULTS/POINT/CONFIG, or $RESULTS/CONFIG without a sweep. Returns 2 when the
# gateway does not know the configuration's keys, 1 on any other failure.
run_config() {
	local point="$1" config="$2" dir addr gw name role log
	local members=() metrics=()
	dir="$RESULTS${sweep_name:+/$point}/$config"
	mkdir -p "$dir"
	while read -r name role; do
		log="$dir/engine-$name.log"
		start "$log" "$bin/enginesim" --listen 127.0.0.1:0 --name "$name" --model "$model" \
			--ttft "$TTFT" --ttft-per-token "$TTFT_PER_TOKEN" --ttft-per-running "$TTFT_PER_RUNNING" \
			--itl "$ITL" --itl-per-running "$ITL_PER_RUNNING" --max-num-seqs "$MAX_NUM_SEQS" \
			--prefill-interference --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS" \
			--kv-transfer-per-token "$KV_TRANSFER_PER_TOKEN" \
			--kv-cache-blocks "$KV_CACHE_BLOCKS" --block-size "$BLOCK_SIZE" --max-model-len "$MAX_MODEL_LEN" \
			--max-output-tokens "$((MAX_TOKENS > LONG_MAX_TOKENS ? MAX_TOKENS : LONG_MAX_TOKENS))"
		if ! addr="$(await_addr "$started" "$log" "enginesim listening")"; then
			echo "run.sh: engine $name did not start:" >&2
			cat "$log" >&2
			return 1
		fi
		members+=("$name=http://$addr${role:+=$role}")
		metrics+=("http://$addr/metrics")
	done < <(engine_names "$config")
	gateway_config "$config" "${members[@]}" >"$dir/gateway.yaml"
	start "$dir/gateway.log" "$gateway_bin" --config "$dir/gateway.yaml"
	if ! gw="$(await_addr "$started" "$dir/gateway.log" "switchboard listening")"; then
		if alive "$started"; then
			echo "run.sh: the gateway did not start listening in 20 s; see $dir/gateway.log" >&2
			return 1
		fi
		wait "$started" 2>/dev/null || true
		reaped "$started"
		if [[ "$config" == disaggregated ]] && grep -Eq '(disaggregation|role)[^ ]*: unknown key' "$dir/gateway.log"; then
			echo "skipping disaggregated: this gateway does not know its keys:" >&2
			grep -E '(disaggregation|role)[^ ]*: unknown key' "$dir/gateway.log" | sed 's/^/  /' >&2
			skipped="$(grep -Eo '[][a-z_.0-9]*(disaggregation|role)[^ ]*: unknown key' "$dir/gateway.log" |
				sed 's/\[[0-9]*\]/[]/g; s/: unknown key//' | sort -u | paste -sd ',' - | sed 's/,/, /g')"
			return 2
		fi
		echo "run.sh: the gateway exited:" >&2
		cat "$dir/gateway.log" >&2
		return 1
	fi
	local lg=("$bin/loadgen" --url "http://$gw" --model "$model" --stream --max-error-rate 1
		--workload fixed --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS"
		--long-share "$LONG_SHARE" --long-prompt-words "$LONG_PROMPT_WORDS" --long-max-tokens "$LONG_MAX_TOKENS"
		--warmup "$WARMUP" --duration "$DURATION" --seed "$SEED"
		--engine-metrics "$(
			IFS=,
			echo "${metrics[*]}"
		)" --json "$dir/loadgen.json")
	local load
	if [[ "$RATE" == 0 ]]; then
		lg+=(--concurrency "$CONCURRENCY")
		load="concurrency $CONCURRENCY"
	else
		lg+=(--rate "$RATE")
		load="$RATE req/s"
	fi
	printf '%q ' "${lg[@]}" >"$dir/loadgen.cmd"
	echo >>"$dir/loadgen.cmd"
	echo "== $config${sweep_name:+ at $sweep_name=$point}: ${#members[@]} engines, $load, gateway on $gw, loadgen for $DURATION after $WARMUP warm-up requests" >&2
	# In the background, and waited for: a trapped signal interrupts wait
	# at once, where a foreground command would be waited for to the end.
	start "$dir/loadgen.txt" "${lg[@]}"
	local lg_pid="$started" lg_rc=0
	wait "$lg_pid" || lg_rc=$?
	reaped "$lg_pid"
	if ((lg_rc != 0)); then
		echo "run.sh: loadgen failed for $config:" >&2
		cat "$dir/loadgen.txt" >&2
		return 1
	fi
	# The requests each engine completed, warm-up included (a disaggregated
	# request completes on two engines): engines.json, {name: count}.
	local i count
	for i in "${!members[@]}"; do
		if ! count="$(curl -fsS --max-time 5 "${metrics[$i]}" | awk '/^vllm:request_success_total[{ ]/ { n += $NF } END { print n + 0 }')"; then
			echo "run.sh: could not scrape ${metrics[$i]}" >&2
			return 1
		fi
		jq -n --arg name "${members[$i]%%=*}" --argjson n "$count" '{($name): $n}'
	done | jq -s add >"$dir/engines.json"
	jq -r "$jq_fmt"'(.kinds.short // .) as $s | "   short: TTFT p50 \($s.ttft.p50_ms | fixed(1)) ms, ITL p99 \($s.itl.p99_ms | fixed(1)) ms; \(.requests_per_s | fixed(2)) req/s, \(.output_tokens_per_s | fixed(0)) tok/s, \(.failed) failed"' \
		"$dir/loadgen.json" >&2
	return 0
}

swept="" # the swept parameter's own value, restored after the sweep
[[ -z "$sweep_name" ]] || swept="${!sweep_name}"
for value in "${sweep_values[@]}"; do
	point=.
	if [[ -n "$sweep_name" ]]; then
		printf -v "$sweep_name" '%s' "$value"
		point="$value"
		check_fleet
	fi
	for config in $CONFIGS; do
		[[ " ${refused[*]} " == *" $config "* ]] && continue
		rc=0
		run_config "$point" "$config" || rc=$?
		stop_all
		case $rc in
		0) ran+=("$point $config") ;;
		2) refused+=("$config") ;;
		*) failed+=("$point $config") ;;
		esac
	done
done
[[ -z "$sweep_name" ]] || printf -v "$sweep_name" '%s' "$swept"

# --- table --------------------------------------------------------------------

{
	for r in "${ran[@]}"; do
		read -r point config <<<"$r"
		d="$RESULTS${sweep_name:+/$point}/$config"
		# Without long requests (LONG_SHARE=0) every request is a short one.
		# two_engine_requests: the engines' completions beyond the requests
		# that succeeded, warm-up included: the requests served in two legs.
		jq --arg point "$point" --arg config "$config" --slurpfile engines "$d/engines.json" '
			(.kinds.short // (if .kinds then null else . end)) as $short | {
			point: $point,
			config: $config,
			short_ttft_p50_ms: $short.ttft.p50_ms,
			short_ttft_p99_ms: $short.ttft.p99_ms,
			short_itl_p50_ms: $short.itl.p50_ms,
			short_itl_p99_ms: $short.itl.p99_ms,
			long_ttft_p50_ms: .kinds.long.ttft.p50_ms,
			long_ttft_p99_ms: .kinds.long.ttft.p99_ms,
			long_requests: (.kinds.long.requests // 0),
			itl_p99_ms: .itl.p99_ms,
			requests_per_s: .requests_per_s,
			output_tokens_per_s: .output_tokens_per_s,
			requests: .requests,
			failed: .failed,
			warmup: .warmup,
			errors: .errors,
			engine_requests: .engine_requests,
			engine_completions: $engines[0],
			two_engine_requests: (($engines[0] | add) - .succeeded - .warmup)
		}' "$d/loadgen.json"
	done
} | jq -s --arg commit "$commit" --arg sweep "$sweep_name" \
	--argjson params "$(for p in "${params[@]}"; do n="${p%%=*}"; [[ $n == RESULTS ]] || jq -n --arg k "$n" --arg v "${!n}" '{($k): $v}'; done | jq -s add)" '
	. as $rows
	| {commit: $commit, sweep: (if $sweep == "" then null else $sweep end), params: $params,
	   rows: map(. as $r
		| ($rows | map(select(.point == $r.point and .config == "aggregated")) | first) as $agg
		| . + {
		short_itl_p99_vs_aggregated: (if $agg and ($agg.short_itl_p99_ms // 0) > 0 and .short_itl_p99_ms then .short_itl_p99_ms / $agg.short_itl_p99_ms else null end),
		output_tokens_per_s_vs_aggregated: (if $agg and $agg.output_tokens_per_s > 0 then .output_tokens_per_s / $agg.output_tokens_per_s else null end)
	   })}' >"$RESULTS/rows.json"
if [[ -n "$sweep_name" ]]; then
	# The swept parameter's value is each row's point.
	jq --arg n "$sweep_name" --arg v "${sweep_values[*]}" '.params[$n] = $v' "$RESULTS/rows.json" >"$RESULTS/rows.json.tmp"
	mv "$RESULTS/rows.json.tmp" "$RESULTS/rows.json"
fi

reproduce="bench/pd/run.sh"
if ((${#overrides[@]} > 0)); then
	reproduce="${overrides[*]} $reproduce"
fi
if (($# > 0)); then
	reproduce="$reproduce $*"
fi
fleet="$ENGINES simulated engines ($PREFILL_ENGINES prefill + $((ENGINES - PREFILL_ENGINES)) decode when disaggregated)"
case "$sweep_name" in ENGINES | PREFILL_ENGINES)
	fleet="<ENGINES> simulated engines (<PREFILL_ENGINES> of them prefill when disaggregated)"
	;;
esac
# The title names the swept parameter in place of its value.
[[ -z "$sweep_name" ]] || printf -v "$sweep_name" '%s' "<$sweep_name>"
if [[ "$RATE" == 0 ]]; then load="closed loop, concurrency $CONCURRENCY"; else load="$RATE req/s (Poisson)"; fi
{
	mix="$LONG_SHARE of the requests long ($LONG_PROMPT_WORDS-token prompts, $LONG_MAX_TOKENS output tokens), the others short chats ($PROMPT_WORDS-token prompt, $MAX_TOKENS output tokens)"
	echo "Prefill/decode on $fleet, prefill interference on every engine, $load, $mix; commit $commit${GATEWAY:+, gateway $GATEWAY}:"
	echo
	echo "| ${sweep_name:+$sweep_name | }config | short TTFT p50 | short TTFT p99 | short ITL p99 | ITL p99 vs aggregated | long TTFT p50 | long TTFT p99 | req/s | output tok/s | tok/s vs aggregated | two-engine requests | errors |"
	echo "|${sweep_name:+---:|}---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	jq -r --arg sweep "$sweep_name" "$jq_fmt"'
		def msv: if . == null then "n/a" else (fixed(1)) + " ms" end;
		def ratio: if . == null then "n/a" else "×" + fixed(2) end;
		.rows[] | "| \(if $sweep == "" then "" else .point + " | " end)\(.config) | \(.short_ttft_p50_ms | msv) | \(.short_ttft_p99_ms | msv) | \(.short_itl_p99_ms | msv) | \(.short_itl_p99_vs_aggregated | ratio) | \(.long_ttft_p50_ms | msv) | \(.long_ttft_p99_ms | msv) | \(.requests_per_s | fixed(2)) | \(.output_tokens_per_s | fixed(0)) | \(.output_tokens_per_s_vs_aggregated | ratio) | \(.two_engine_requests) | \(.failed) of \(.requests) |"' "$RESULTS/rows.json"
	echo
	echo '```sh'
	echo "$reproduce"
	echo '```'
	if [[ -n "$skipped" ]]; then
		echo
		echo "Not run: disaggregated (this gateway does not know $skipped)."
	fi
} | tee "$RESULTS/table.md"
echo >&2
echo "rows: ${RESULTS#"$root"/}/rows.json, table: ${RESULTS#"$root"/}/table.md, logs and loadgen reports: ${RESULTS#"$root"/}/${sweep_name:+<value>/}<config>/" >&2
if ((${#failed[@]} > 0)); then
	echo "run.sh: failed: ${failed[*]}" >&2
	exit 1
fi
