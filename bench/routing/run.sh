#!/usr/bin/env bash
# Compares the gateway's routing policies on the shared-prefix conversation
# workload over simulated engines, and prints one markdown table row per
# policy: prefix cache hit rate (from the engines' own metrics), TTFT mean
# and p99, throughput, the busiest engine's share and errors. README.md
# beside this script explains every parameter.
#
#   bench/routing/run.sh                             # every policy
#   bench/routing/run.sh round-robin prefix-aware    # only these
#   POLICIES="round-robin least-loaded" DURATION=10s bench/routing/run.sh
#
# Each policy gets fresh engines (cold caches) and a fresh gateway. Nothing
# is left running: every process is stopped by its PID on exit, Ctrl-C
# included.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"

# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env

# name=default pairs; each can be overridden from the environment.
params=(
	"POLICIES=round-robin least-loaded power-of-two session-affinity prefix-aware precise-prefix scorer"
	"ENGINES=4"
	"REPLICAS=1"
	# enginesim
	"TTFT=5ms"
	"TTFT_PER_TOKEN=50us"
	"TTFT_PER_RUNNING=2ms"
	"ITL=10ms"
	"ITL_PER_RUNNING=1ms"
	"MAX_NUM_SEQS=16"
	"KV_CACHE_BLOCKS=5120"
	"BLOCK_SIZE=16"
	"KV_EVENTS=1"
	# loadgen
	"SYSTEM_PROMPTS=4"
	"SYSTEM_PROMPT_WORDS=100"
	"CONVERSATIONS=64"
	"TURNS=16"
	"STAGGER=true"
	"PROMPT_WORDS=400"
	"MAX_TOKENS=32"
	"CONCURRENCY=32"
	"WARMUP=64"
	"DURATION=30s"
	"SEED=1"
	# gateway
	"ENGINE_STATS_INTERVAL=250ms"
	"ENGINE_STATS_MAX_AGE=2s"
	"ROUTING_EXTRA="
	"RESULTS="
)
usage() {
	sed -n '2,15s/^# \{0,1\}//p' "$0"
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
	POLICIES="$*"
fi
RESULTS="${RESULTS:-$root/bench/routing/results/$(date -u +%Y%m%dT%H%M%SZ)}"
model=bench-model

for tool in go jq ps curl; do
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

bin="$root/.tools/bench-routing" # .tools/ is git-ignored
mkdir -p "$bin" "$RESULTS"
echo "building gateway, enginesim and loadgen into ${bin#"$root"/}/ ..." >&2
(cd "$root" && go build -o "$bin/" ./cmd/gateway ./cmd/enginesim ./cmd/loadgen)
commit="$(bench_commit "$root" bench/routing)"

# --- one policy ---------------------------------------------------------------

# gateway_config POLICY STATS URL...: the gateway configuration, on stdout.
# STATS=1 adds server.engine_stats (only gateways that know the key accept
# it; run_policy falls back without it).
gateway_config() {
	local policy="$1" stats="$2" i=0 u
	shift 2
	cat <<-EOF
		server:
		  listen: "127.0.0.1:0"
		  shutdown_timeout: 5s
		  engine_header: true
	EOF
	if ((stats)); then
		cat <<-EOF
			  engine_stats:
			    enabled: true
			    interval: $ENGINE_STATS_INTERVAL
			    timeout: $ENGINE_STATS_INTERVAL
			    max_age: $ENGINE_STATS_MAX_AGE
		EOF
	fi
	cat <<-EOF
		admin:
		  listen: "127.0.0.1:0"
		log:
		  level: info
		  access: false
		routing:
		  policy: $policy
	EOF
	if [[ -n "$ROUTING_EXTRA" ]]; then
		printf '%s\n' "$ROUTING_EXTRA" | sed 's/^/  /'
	fi
	if ((KV_EVENTS)); then
		printf 'kv_events:\n  block_size: %s\n' "$BLOCK_SIZE"
	fi
	echo "engines:"
	for u in "$@"; do
		i=$((i + 1))
		printf '  - name: e%d\n    url: %s\n    models: [%s]\n' "$i" "${u%%|*}" "$model"
		if [[ "$u" == *"|"* ]]; then
			printf '    kv_events: %s\n' "${u#*|}"
		fi
	done
}

engine_stats=1 # cleared once a gateway refuses server.engine_stats
ran=()         # policies with a result
failed=()

# run_policy POLICY: fresh engines and gateway, one loadgen run. Returns 2
# when the gateway refuses the policy, 1 on any other failure.
run_policy() {
	local policy="$1" dir="$RESULTS/$1" i r addr gw reason
	local urls=() metrics=() gws=() admins=() kv_flags=()
	if ((KV_EVENTS)); then
		kv_flags=(--kv-events-endpoint tcp://127.0.0.1:0)
	fi
	mkdir -p "$dir"
	for ((i = 1; i <= ENGINES; i++)); do
		start "$dir/engine-e$i.log" "$bin/enginesim" --listen 127.0.0.1:0 --name "e$i" --model "$model" \
			--ttft "$TTFT" --ttft-per-token "$TTFT_PER_TOKEN" --ttft-per-running "$TTFT_PER_RUNNING" \
			--itl "$ITL" --itl-per-running "$ITL_PER_RUNNING" --max-num-seqs "$MAX_NUM_SEQS" \
			--kv-cache-blocks "$KV_CACHE_BLOCKS" --block-size "$BLOCK_SIZE" --enable-prompt-tokens-details \
			"${kv_flags[@]}"
		if ! addr="$(await_addr "$started" "$dir/engine-e$i.log" "enginesim listening")"; then
			echo "run.sh: engine e$i did not start:" >&2
			cat "$dir/engine-e$i.log" >&2
			return 1
		fi
		if ((KV_EVENTS)); then
			# The engine's KV-cache events publisher (ZMQ PUB) for every gateway replica.
			urls+=("http://$addr|$(sed -n 's/.*msg="enginesim listening".* kv_events=\(tcp:[^ ]*\).*/\1/p' "$dir/engine-e$i.log" | head -n1)")
		else
			urls+=("http://$addr")
		fi
		metrics+=("http://$addr/metrics")
	done
	# REPLICAS gateways over the same engines, each with its own state
	# (prefix indexes): loadgen sends each request to the next in turn.
	for ((r = 1; r <= REPLICAS; r++)); do
		local glog="$dir/gateway-$r.log"
		while :; do
			gateway_config "$policy" "$engine_stats" "${urls[@]}" >"$dir/gateway.yaml"
			start "$glog" "$bin/gateway" --config "$dir/gateway.yaml"
			if gw="$(await_addr "$started" "$glog" "switchboard listening")"; then
				gws+=("http://$gw")
				admins+=("$(await_addr "$started" "$glog" "admin listening")")
				break
			fi
			if alive "$started"; then
				echo "run.sh: the gateway did not start listening in 20 s; see $glog" >&2
				return 1
			fi
			wait "$started" 2>/dev/null || true
			reaped "$started"
			if ((engine_stats)) && grep -q 'engine_stats[^ ]*: unknown key' "$glog"; then
				echo "note: this gateway does not know server.engine_stats; running without it:" >&2
				grep 'engine_stats[^ ]*: unknown key' "$glog" | head -n1 | sed 's/^/  /' >&2
				engine_stats=0
				continue
			fi
			if grep -q 'routing.policy\|kv_events' "$glog"; then
				reason="$(grep -m1 'routing.policy\|kv_events' "$glog")"
				echo "skipping $policy: the gateway refuses it: $reason" >&2
				return 2
			fi
			echo "run.sh: the gateway exited:" >&2
			cat "$glog" >&2
			return 1
		done
	done
	gw="$(
		IFS=,
		echo "${gws[*]}"
	)"
	local lg=("$bin/loadgen" --url "$gw" --model "$model" --stream --max-error-rate 1
		--workload conversations --system-prompts "$SYSTEM_PROMPTS" --system-prompt-words "$SYSTEM_PROMPT_WORDS"
		--conversations "$CONVERSATIONS" --turns "$TURNS" --stagger="$STAGGER" --prompt-words "$PROMPT_WORDS" --max-tokens "$MAX_TOKENS"
		--concurrency "$CONCURRENCY" --warmup "$WARMUP" --duration "$DURATION" --seed "$SEED"
		--engine-metrics "$(
			IFS=,
			echo "${metrics[*]}"
		)" --json "$dir/loadgen.json")
	printf '%q ' "${lg[@]}" >"$dir/loadgen.cmd"
	echo >>"$dir/loadgen.cmd"
	echo "== $policy: $ENGINES engines, gateway on $gw, loadgen for $DURATION, $WARMUP warm-up requests included" >&2
	# In the background, and waited for: a trapped signal interrupts wait
	# at once, where a foreground command would be waited for to the end.
	start "$dir/loadgen.txt" "${lg[@]}"
	local lg_pid="$started" lg_rc=0
	wait "$lg_pid" || lg_rc=$?
	reaped "$lg_pid"
	if ((lg_rc != 0)); then
		echo "run.sh: loadgen failed for $policy:" >&2
		cat "$dir/loadgen.txt" >&2
		return 1
	fi
	# Each replica's admin view at the end: the precise index's memory
	# (blocks held by every engine, the speculative table and the token
	# cache) and its predictions checked against the engines' reports.
	for ((r = 0; r < ${#admins[@]}; r++)); do
		curl -fsS "http://${admins[r]}/admin/engines" >"$dir/admin-$((r + 1)).json" 2>/dev/null || echo '{}' >"$dir/admin-$((r + 1)).json"
		curl -fsS "http://${admins[r]}/metrics" >"$dir/metrics-$((r + 1)).txt" 2>/dev/null || : >"$dir/metrics-$((r + 1)).txt"
	done
	jq -r "$jq_fmt"'"   hit rate \(.prefix_cache.hit_rate * 100 | fixed(1))%, TTFT mean \(.ttft.mean_ms | fixed(1)) ms, \(.requests_per_s | fixed(1)) req/s, busiest/mean \(.busiest_engine_share | fixed(2)), \(.failed) failed"' \
		"$dir/loadgen.json" >&2
	return 0
}

for policy in $POLICIES; do
	rc=0
	run_policy "$policy" || rc=$?
	stop_all
	case $rc in
	0) ran+=("$policy") ;;
	2) ;;
	*) failed+=("$policy") ;;
	esac
done

# tokenization_summary METRICS...: one line on what tokenization added to
# precise-prefix's routing decisions, summed over the replicas' /metrics:
# the token cache's results and the p50/p99 of switchboard_tokenize_wait
# (the upper bound of the histogram bucket they fall in), and the
# predictions checked against the engines' cached tokens.
tokenization_summary() {
	awk '
		/^switchboard_tokenize_cache_total/ { match($0, /result="[a-z]+"/); r = substr($0, RSTART + 8, RLENGTH - 9); cache[r] += $NF; n += $NF }
		/^switchboard_tokenize_wait_seconds_bucket/ { match($0, /le="[^"]+"/); le = substr($0, RSTART + 4, RLENGTH - 5); b[le] += $NF; if (!(le in seen)) { seen[le] = 1; order[++k] = le } }
		/^switchboard_tokenize_wait_seconds_count/ { total += $NF }
		/^switchboard_kv_index_predicted_tokens_total/ { ptok += $NF }
		/^switchboard_kv_index_reported_tokens_total/ { rtok += $NF }
		/^switchboard_kv_index_predictions_total/ { match($0, /outcome="[a-z]+"/); o = substr($0, RSTART + 9, RLENGTH - 10); pred[o] += $NF; np += $NF }
		function q(f,   i) { for (i = 1; i <= k; i++) if (b[order[i]] >= f * total) return order[i]; return "+Inf" }
		END {
			if (n == 0) { print "Tokenization: no lookups."; exit }
			printf "Tokenization for precise-prefix (all replicas): %d look-ups, %.1f%% hit, %.1f%% partial, %.1f%% miss; added to routing p50 <= %s s, p99 <= %s s (bucket bounds)", n, 100 * cache["hit"] / n, 100 * cache["partial"] / n, 100 * cache["miss"] / n, q(0.5), q(0.99)
			if (np > 0) printf "; cached tokens of %d checked requests: predicted exactly for %.1f%% (over %.1f%%, under %.1f%%), predicted/reported tokens %.2f", np, 100 * pred["exact"] / np, 100 * pred["over"] / np, 100 * pred["under"] / np, (rtok > 0 ? ptok / rtok : 0)
			print "."
		}' "$@"
}

# --- table --------------------------------------------------------------------

{
	for policy in "${ran[@]}"; do
		jq --arg policy "$policy" '{
			policy: $policy,
			hit_rate: .prefix_cache.hit_rate,
			hit_tokens: .prefix_cache.hit_tokens,
			queried_tokens: .prefix_cache.queried_tokens,
			ttft_mean_ms: .ttft.mean_ms,
			ttft_p99_ms: .ttft.p99_ms,
			e2e_mean_ms: .e2e.mean_ms,
			requests_per_s: .requests_per_s,
			requests: .requests,
			failed: .failed,
			busiest_engine_share: .busiest_engine_share,
			engine_requests: .engine_requests
		}' "$RESULTS/$policy/loadgen.json" |
			jq --slurpfile admin "$RESULTS/$policy/admin-1.json" \
				'. + {index_bytes: ($admin[0].kv_index.bytes // null), index_blocks: ($admin[0].kv_index.blocks // null),
				      token_cache_blocks: ($admin[0].kv_index.token_cache.blocks // null)}'

	done
} | jq -s --arg commit "$commit" --arg engine_stats "$engine_stats" \
	--argjson params "$(for p in "${params[@]}"; do n="${p%%=*}"; [[ $n == RESULTS ]] || jq -n --arg k "$n" --arg v "${!n}" '{($k): $v}'; done | jq -s add)" '
	(map(select(.policy == "round-robin")) | first) as $rr
	| {commit: $commit, engine_stats: ($engine_stats == "1"), params: $params,
	   rows: map(. + {
		hit_rate_vs_round_robin: (if $rr and $rr.hit_rate > 0 then .hit_rate / $rr.hit_rate else null end),
		ttft_mean_vs_round_robin: (if $rr and $rr.ttft_mean_ms > 0 then .ttft_mean_ms / $rr.ttft_mean_ms - 1 else null end)
	   })}' >"$RESULTS/rows.json"

reproduce="bench/routing/run.sh"
if ((${#overrides[@]} > 0)); then
	reproduce="${overrides[*]} $reproduce"
fi
if (($# > 0)); then
	reproduce="$reproduce $*"
fi
{
	echo "Shared-prefix conversations over $ENGINES simulated engines ($KV_CACHE_BLOCKS KV blocks each) through $REPLICAS gateway replica(s), commit $commit$( ((engine_stats)) || echo ", no engine_stats"):"
	echo
	echo "| policy | hit rate | hit rate vs round-robin | TTFT mean | TTFT p99 | vs round-robin TTFT | throughput req/s | busiest engine share (max/mean) | errors | precise index memory (replica 1) |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	jq -r "$jq_fmt"'
		def pct: (. * 100 | fixed(1)) + "%";
		def vs_pct: if . == null then "n/a" else (if . > 0 then "+" else "" end) + pct end;
		.rows[] | "| \(.policy) | \(.hit_rate | pct) | \(if .hit_rate_vs_round_robin == null then "n/a" else "×" + (.hit_rate_vs_round_robin | fixed(2)) end) | \(.ttft_mean_ms | fixed(1)) ms | \(.ttft_p99_ms | fixed(1)) ms | \(.ttft_mean_vs_round_robin | vs_pct) | \(.requests_per_s | fixed(1)) | \(.busiest_engine_share | fixed(2)) | \(.failed) of \(.requests) | \(if .policy == "precise-prefix" and .index_bytes != null then "\(.index_bytes / 1048576 | fixed(1)) MiB (\(.index_blocks) blocks)" else "" end) |"' "$RESULTS/rows.json"
	echo
	echo '```sh'
	echo "$reproduce"
	echo '```'
	if [[ -f "$RESULTS/precise-prefix/metrics-1.txt" ]]; then
		echo
		tokenization_summary "$RESULTS"/precise-prefix/metrics-*.txt
	fi
} | tee "$RESULTS/table.md"
echo >&2
echo "rows: ${RESULTS#"$root"/}/rows.json, table: ${RESULTS#"$root"/}/table.md, logs and loadgen reports: ${RESULTS#"$root"/}/<policy>/" >&2
if ((${#failed[@]} > 0)); then
	echo "run.sh: failed: ${failed[*]}" >&2
	exit 1
fi
