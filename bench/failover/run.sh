#!/usr/bin/env bash
# Broken streams rescued: CONCURRENCY streaming chat clients (default 48)
# through one gateway in front of ENGINES simulated engines (default 4),
# while every INTERVAL (default 2s) the next engine, in turn, is killed
# (SIGKILL, restarted on the same port), stalled (SIGSTOP, SIGCONT), made
# to send vLLM's in-band error event, or drained (finish_reason "abort",
# then SIGTERM and a restart): the four in turn, the last two through the
# simulator's POST /admin/fault. The same load and fault schedule runs
# twice, with migration.limit 0 (continuation off: the baseline) and 1.
# loadgen --expect-canonical checks every answer is the simulator's
# canonical "tok0 ... tok<n-1> " with a finish_reason and [DONE]. Prints
# two markdown tables: per run, requests, streams broken after their
# first bytes (from switchboard.request.migrations; with limit 0, the
# client's lost answers), rescued, the rescue rate as the client checked
# it, failed requests by class, the seam gap p50/p99
# (switchboard.request.migration_gap) and the engines' ITL p50/p99
# (switchboard.engine.inter_token_latency); per fault kind, the
# continuations' outcomes and seam gaps (split by the chaos loop's scrapes
# of /metrics). Histogram quantiles are given as the bucket that holds
# them. A measurement, not a test: it exits 0 whatever it finds, but says
# LOUDLY on stderr when an answer ended cleanly yet was not the canonical
# one (BUG:) and when a continued run lost answers (NOT RESCUED:).
# README.md beside this script explains the setup and every parameter.
#
#   bench/failover/run.sh
#   DURATION=20s CONCURRENCY=32 bench/failover/run.sh
#   bench/failover/run.sh --help
#
# Needs go, jq, curl and bc. Every process is stopped by its PID on exit.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env

params=(
	"ENGINES=4"
	"CONCURRENCY=48"
	"MAX_TOKENS=64"
	"PROMPT_WORDS=32"
	"TTFT=20ms"
	"ITL=15ms"
	"DURATION=40s"
	"INTERVAL=2s"
	"KILL_PAUSE=1s"
	"STALL=3s"
	"FAULT_WINDOW=500ms"
	"BREAK_AT=16"
	"IDLE=500ms"
	"FIRST_TOKEN=2s"
	"RESULTS="
)
usage() {
	sed -n '2,29s/^# \{0,1\}//p' "$0"
	echo
	echo "Parameters (environment variables; defaults shown):"
	for p in "${params[@]}"; do echo "  $p"; done
}
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
read_params
RESULTS="${RESULTS:-$root/bench/failover/results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$RESULTS"
# secs DUR: a duration as Go writes it (2s, 1.5s, 500ms, 250us) in seconds,
# for sleep.
secs() {
	case "$1" in
	*ms) echo "scale=3; ${1%ms} / 1000" | bc ;;
	*us) echo "scale=6; ${1%us} / 1000000" | bc ;;
	*s) echo "${1%s}" ;;
	*) echo "secs: want a duration such as 2s or 500ms, got $1" >&2; exit 1 ;;
	esac
}

bin="$root/.tools/bench-failover"
mkdir -p "$bin"
(cd "$root" && go build -o "$bin/gateway" ./cmd/gateway && go build -o "$bin/enginesim" ./cmd/enginesim && go build -o "$bin/loadgen" ./cmd/loadgen)

pids=()    # gateway, loadgen, chaos loop
run_dir="" # the phase's directory: engine PID files live there
stop_engines() {
	[[ -n "$run_dir" ]] || return 0
	local f p
	for f in "$run_dir"/engine*.pid; do
		[[ -e "$f" ]] || continue
		p="$(cat "$f")"
		kill -CONT "$p" 2>/dev/null || true
		kill "$p" 2>/dev/null || true
	done
	for f in "$run_dir"/engine*.pid; do
		[[ -e "$f" ]] || continue
		p="$(cat "$f")"
		for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
		kill -9 "$p" 2>/dev/null || true
		rm -f "$f"
	done
}
stop_pids() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
cleanup() { stop_pids; stop_engines; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_engine I: engine I on its port, its PID in engineI.pid (appending
# to its log across restarts).
start_engine() {
	"$bin/enginesim" --listen "127.0.0.1:${ports[$1]}" --name "e$1" --model bench --ttft "$TTFT" --itl "$ITL" \
		--max-num-seqs 256 --max-output-tokens "$MAX_TOKENS" >>"$run_dir/engine$1.log" 2>&1 &
	echo $! >"$run_dir/engine$1.pid"
	disown $! # no "Killed" job notice when the chaos loop kills it
}

# The chaos loop's actions, in turn (turn % 4).
kinds=(kill stall error drain)

# admin_fault I SPEC: engine I's default fault becomes SPEC (POST
# /admin/fault; "" clears it).
admin_fault() { curl -fsS -o /dev/null --data-binary "$2" "http://127.0.0.1:${ports[$1]}/admin/fault" || true; }

# stop_engine I SIGNAL: send SIGNAL to engine I and wait (up to 6 s, then
# SIGKILL) until it is gone.
stop_engine() {
	local p
	p="$(cat "$run_dir/engine$1.pid")"
	kill "-$2" "$p" 2>/dev/null || true
	for _ in $(seq 120); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.05; done
	kill -9 "$p" 2>/dev/null || true
}

# chaos: every INTERVAL the next engine, round robin, gets the next action
# of kinds, until the loop is killed itself; each action is logged.
#   kill:  SIGKILL; restarted on the same port after KILL_PAUSE.
#   stall: SIGSTOP for STALL, then SIGCONT (the engine says nothing at all).
#   error: its requests starting within FAULT_WINDOW get error-after=BREAK_AT
#          (vLLM's in-band error event after BREAK_AT tokens).
#   drain: its requests starting within FAULT_WINDOW get drain-after=BREAK_AT
#          (the engine drains at the first one's BREAK_AT-th token: those
#          end with finish_reason "abort", new requests get 503); then it is
#          stopped with SIGTERM (in-flight streams finish) and restarted,
#          as a drained vLLM is.
chaos() {
	local turn=0 i kind sp=""
	# A pause is a background sleep waited for, so TERM ends the loop at once.
	pause() { sleep "$(secs "$1")" & sp=$!; wait "$sp"; }
	trap '[[ -z "$sp" ]] || kill "$sp" 2>/dev/null; exit 0' TERM
	while :; do
		pause "$INTERVAL"
		i=$((turn % ENGINES))
		kind="${kinds[turn % 4]}"
		# The seams an action causes are the histogram's growth up to the
		# next action's scrape (the last one's: to metrics.txt).
		curl -fsS -o "$run_dir/scrape-$turn.txt" "$metrics_url" || true
		echo "$(date +%T.%N | cut -c1-12) $kind e$i" >>"$run_dir/chaos.log"
		case "$kind" in
		kill)
			stop_engine "$i" 9
			pause "$KILL_PAUSE"
			start_engine "$i"
			;;
		stall)
			kill -STOP "$(cat "$run_dir/engine$i.pid")" 2>/dev/null || true
			pause "$STALL"
			kill -CONT "$(cat "$run_dir/engine$i.pid")" 2>/dev/null || true
			;;
		error | drain)
			admin_fault "$i" "$kind-after=$BREAK_AT"
			pause "$FAULT_WINDOW"
			admin_fault "$i" ""
			if [[ "$kind" == drain ]]; then
				pause "$KILL_PAUSE"
				stop_engine "$i" TERM
				start_engine "$i"
			fi
			;;
		esac
		turn=$((turn + 1))
	done
}


# next_scrape DIR T: the scrape that ends chaos turn T's window.
next_scrape() { if [[ -e "$1/scrape-$(($2 + 1)).txt" ]]; then echo "$1/scrape-$(($2 + 1)).txt"; else echo "$1/metrics.txt"; fi; }
# seam_buckets DIR FROM: the seam gap histogram's growth over the chaos
# turns FROM, FROM+4, ... (one kind of action), as "le count" lines.
seam_buckets() {
	local t
	for ((t = $2; ; t += 4)); do
		[[ -e "$1/scrape-$t.txt" ]] || break
		awk 'FILENAME == ARGV[1] { a[$1] = $2; next } { print $1, $2 - a[$1] }' <(buckets "$1/scrape-$t.txt" "$gap") <(buckets "$(next_scrape "$1" $t)" "$gap")
	done | awk '{ n[$1] += $2 } END { for (le in n) print le, n[le] }' | sort -g
}
# window_count DIR FROM NAME FILTER: the growth of counter NAME (series
# matching FILTER) over the chaos turns FROM, FROM+4, ...
window_count() {
	local t n=0
	for ((t = $2; ; t += 4)); do
		[[ -e "$1/scrape-$t.txt" ]] || break
		n=$((n + $(counter "$(next_scrape "$1" $t)" "$3" "$4") - $(counter "$1/scrape-$t.txt" "$3" "$4")))
	done
	echo "$n"
}
gap=switchboard_request_migration_gap_seconds
itl=switchboard_engine_inter_token_latency_seconds

# counter METRICS NAME FILTER: the sum of NAME's series whose labels match
# the regexp FILTER.
counter() { awk -v name="$2" -v f="$3" 'index($0, name) == 1 && $0 ~ f { s += $NF } END { print s + 0 }' "$1"; }

# phase NAME LIMIT: one measured run with migration.limit LIMIT.
phase() {
	local name="$1" limit="$2" gw adm i
	run_dir="$RESULTS/$name"
	mkdir -p "$run_dir"
	ports=()
	for ((i = 0; i < ENGINES; i++)); do
		ports[i]="$(free_port)"
		start_engine "$i"
	done
	gw="$(free_port)"
	adm="$(free_port)"
	{
		cat <<YAML
server:
  listen: "127.0.0.1:$gw"
  max_attempts: 3
  retry: {on: [connect-failure, reset, header-timeout, "503", "429"], within: 10s, budget_ratio: 1}
  timeouts: {connect: 1s, response_header: 1s, first_token: $FIRST_TOKEN, idle: $IDLE}
  health: {interval: 500ms, timeout: 250ms, unhealthy_after: 2}
  outlier: {base_ejection_time: 2s}
admin: {listen: "127.0.0.1:$adm"}
log: {access: false}
migration: {limit: $limit, on: [engine_disconnect, idle_timeout, stream_error, engine_abort, first_token_timeout]}
engines:
YAML
		for ((i = 0; i < ENGINES; i++)); do echo "  - {name: e$i, url: \"http://127.0.0.1:${ports[i]}\", models: [bench]}"; done
	} >"$run_dir/gateway.yaml"
	for ((i = 0; i < ENGINES; i++)); do wait_http "http://127.0.0.1:${ports[i]}/health"; done
	"$bin/gateway" --config "$run_dir/gateway.yaml" >"$run_dir/gateway.log" 2>&1 &
	pids+=($!)
	wait_http "http://127.0.0.1:$gw/ready"
	metrics_url="http://127.0.0.1:$adm/metrics"
	chaos &
	local chaos_pid=$! lg
	pids+=("$chaos_pid")
	"$bin/loadgen" --url "http://127.0.0.1:$gw" --model bench --stream --expect-canonical --max-error-rate 1 \
		--max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" --concurrency "$CONCURRENCY" --duration "$DURATION" \
		--timeout 30s --json "$run_dir/loadgen.json" >"$run_dir/loadgen.txt" 2>"$run_dir/loadgen.err" &
	lg=$!
	pids+=("$lg")
	wait "$lg" || true # in the background, so a TERM to this script is handled at once
	# The chaos loop ends first: no fault or scrape after the last one below.
	kill "$chaos_pid" 2>/dev/null || true
	wait "$chaos_pid" 2>/dev/null || true
	curl -fsS "http://127.0.0.1:$adm/metrics" >"$run_dir/metrics.txt"
	stop_pids
	stop_engines
}

phase baseline 0
phase continuation 1

# pq "LE COUNT lines": "p50 / p99" in ms.
pq() { echo "$(quantile 0.5 <<<"$1") / $(quantile 0.99 <<<"$1")"; }

# row NAME LIMIT: the table row of one phase.
row() {
	local d="$RESULTS/$1"
	local m="$d/metrics.txt" j="$d/loadgen.json" mig=switchboard_request_migrations
	local rescued cancelled limit noeng excl eligible broken wrong reqs errs rate
	rescued="$(counter "$m" $mig 'outcome="rescued"')"
	cancelled="$(counter "$m" $mig 'outcome="cancelled"')"
	limit="$(counter "$m" $mig 'outcome="limit"')"
	noeng="$(counter "$m" $mig 'outcome="no_engine"')"
	excl="$(counter "$m" switchboard_request_migration_exclusions '')"
	# Every first break ends as one of these; a failed leg's next break
	# is counted again (limit, no_engine, another leg), not a new stream.
	eligible=$((rescued + cancelled + limit + noeng + excl))
	reqs="$(jq .requests "$j")"
	# An answer lost mid-stream: an error event, no [DONE], a timeout, or
	# a clean end with the wrong text (wrong_answer).
	broken="$(jq '[.errors | to_entries[] | select(.key | IN("stream_error_event", "stream_no_done", "wrong_answer", "timeout")) | .value] | add // 0' "$j")"
	wrong="$(jq '.errors.wrong_answer // 0' "$j")"
	errs="$(jq -r '[.errors | to_entries[] | "\(.key) \(.value)"] | join(", ") | if . == "" then "none" else . end' "$j")"
	if ((limit + noeng + excl + rescued + cancelled == 0)) && [[ "$2" == 0 ]]; then
		# limit 0 tracks nothing: every break is a lost answer.
		eligible="$broken (client)"
		rate="0%"
	elif ((eligible > 0)); then
		rate="$(echo "scale=1; 100 * ($eligible - $broken) / $eligible" | bc)%"
	else
		rate="-"
	fi
	printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "migration.limit $2" "$reqs" "$eligible" "$rescued" "$rate" "$errs" \
		"$(pq "$(buckets "$m" $gap)")" "$(pq "$(buckets "$m" $itl)")"
	if ((wrong > 0)) && [[ "$2" == 0 ]]; then
		# Continuation off: a drained engine's own end (finish_reason
		# "abort", then [DONE]) reaches the client as the engine sent it.
		echo "note: $wrong answers with migration.limit 0 ended cleanly but short (a drained engine's finish_reason \"abort\" is forwarded as is); first: $(jq -r '.error_samples.wrong_answer' "$j")" >&2
	elif ((wrong > 0)); then
		echo "BUG: $wrong answers with migration.limit $2 ended cleanly ([DONE]) but were not the canonical answer: $(jq -r '.error_samples.wrong_answer' "$j")" >&2
	fi
	if [[ "$2" != 0 ]] && ((broken > 0)); then
		echo "NOT RESCUED: $broken of $eligible broken streams with migration.limit $2 lost their answer" >&2
	fi
}
# kind_row K: the continuation run's row for action kind K (turns K, K+4, ...).
kind_row() {
	local d="$RESULTS/continuation" mig=switchboard_request_migrations o out=()
	for o in rescued failed cancelled limit no_engine; do
		out+=("$(window_count "$d" "$1" $mig "outcome=\"$o\"")")
	done
	printf '| %s | %s | %s | %s | %s |\n' "${kinds[$1]}" "$(grep -c " ${kinds[$1]} " "$d/chaos.log")" "${out[0]}" \
		"${out[1]} / ${out[2]} / ${out[3]} / ${out[4]}" "$(pq "$(seam_buckets "$d" "$1")")"
}
cmd="${overrides[*]:+${overrides[*]} }bench/failover/run.sh"
{
	echo "| run | requests | broken mid-stream | rescued (gateway) | rescue rate (client-checked) | failed requests by class | seam gap p50 / p99 ms | engine ITL p50 / p99 ms |"
	echo "|---|---|---|---|---|---|---|---|"
	row baseline 0
	row continuation 1
	echo
	echo "| fault (migration.limit 1) | times | rescued | failed / cancelled / limit / no_engine | seam gap p50 / p99 ms |"
	echo "|---|---|---|---|---|"
	for k in 0 1 2 3; do kind_row $k; done
	echo
	for ph in baseline continuation; do
		echo "$ph: client ITL p50 $(jq .itl.p50_ms "$RESULTS/$ph/loadgen.json") ms, p99 $(jq .itl.p99_ms "$RESULTS/$ph/loadgen.json") ms, largest gap $(jq .itl.max_ms "$RESULTS/$ph/loadgen.json") ms (exact)"
	done
	echo "continuations by reason and outcome: $(awk -F'[{}]' '/^switchboard_request_migrations/ { r = $2; sub(/.*reason="/, "", r); sub(/".*/, "", r); o = $2; sub(/.*outcome="/, "", o); sub(/".*/, "", o); n[r " " o] += $3 } END { for (k in n) printf "%s%s %d", (i++ ? ", " : ""), k, n[k] }' "$RESULTS/continuation/metrics.txt")"
	echo "seam gaps and ITL are the gateway histogram's bucket holding the quantile; the client's figures are exact"
	echo "command: $cmd (commit $(git -C "$root" rev-parse --short HEAD))"
} | tee "$RESULTS/table.md"
