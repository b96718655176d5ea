# Shell helpers shared by the bench/*/run.sh scripts; source it.

# clear_gateway_env unsets every SWITCHBOARD_* and OTEL_* variable: the
# environment beats the gateway's config file and OTEL_* turns on export,
# so one left exported in the caller's shell would silently change every
# row. The scripts call it first.
clear_gateway_env() {
	local name
	while IFS='=' read -r name _; do
		case "$name" in SWITCHBOARD_* | OTEL_*) unset "$name" ;; esac
	done < <(env)
}

# free_port prints a loopback TCP port nothing listens on (20000-31999,
# below the ephemeral range).
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 12000))
		(echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}

# wait_http URL polls URL until it answers 2xx, for up to 10 s, or exits.
wait_http() {
	for _ in $(seq 200); do curl -fsS -o /dev/null "$1" 2>/dev/null && return; sleep 0.05; done
	echo "timed out waiting for $1" >&2
	exit 1
}

# read_params sets each NAME of the params array ("NAME=default" entries)
# to its default unless the environment gives it another value, and lists
# those other values in the overrides array as NAME=value (shell-quoted), so
# a run can print the exact command that reproduces it; RESULTS (where the
# results go) does not change them and is not listed.
read_params() {
	overrides=()
	local p name default
	for p in "${params[@]}"; do
		name="${p%%=*}"
		default="${p#*=}"
		if [[ -n "${!name+set}" && "${!name}" != "$default" ]]; then
			[[ "$name" == RESULTS ]] || overrides+=("$name=$(printf '%q' "${!name}")")
		else
			printf -v "$name" '%s' "$default"
		fi
	done
}

# --- processes: start, stop by PID ----------------------------------------------
#
# A benchmark script starts its processes with start and calls trap_stop_all
# once: every process is then stopped by its PID when the script exits.

pids=()

# alive PID: the process exists and is not a zombie waiting to be reaped.
alive() {
	local st
	st="$(ps -o stat= -p "$1" 2>/dev/null)" && [[ "$st" != Z* ]]
}

# stop_all: SIGTERM to every process started, SIGKILL to any still there
# 10 s later, then reap them all.
stop_all() {
	((${#pids[@]} > 0)) || return 0
	local pid deadline=$((SECONDS + 10))
	kill -TERM "${pids[@]}" 2>/dev/null || true
	for pid in "${pids[@]}"; do
		while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	pids=()
}

# start LOG CMD...: runs CMD in the background, output to LOG; its PID is
# recorded for stop_all and left in $started.
#
# Each command gets a process group of its own (set -m), so a Ctrl-C on the
# terminal reaches this script only: Go programs catch SIGINT even when
# started with it ignored, and engines that stopped on their own would fail
# loadgen's last scrape. The trap above then stops everything by PID.
start() {
	local log="$1"
	shift
	: >"$log" # exists before await_addr reads it
	set -m
	"$@" >>"$log" 2>&1 &
	started=$!
	set +m
	pids+=("$started")
}

# reaped PID: forget a process this script has waited for, so the exit trap
# never signals its PID (which the system may have given to another).
reaped() {
	local keep=() p
	for p in "${pids[@]}"; do
		[[ "$p" == "$1" ]] || keep+=("$p")
	done
	pids=("${keep[@]}")
}

# await_addr PID LOG MSG: prints the address the process logged with
# msg="MSG" addr=HOST:PORT (both commands listen on port 0), or fails when
# the process exits first or 20 s pass.
await_addr() {
	local pid="$1" log="$2" msg="$3" addr deadline=$((SECONDS + 20))
	while ((SECONDS < deadline)); do
		addr="$(sed -n "s/.*msg=\"$msg\".* addr=\([0-9.]*:[0-9]*\).*/\1/p" "$log" | head -n1)"
		if [[ -n "$addr" ]]; then
			echo "$addr"
			return 0
		fi
		alive "$pid" || return 1
		sleep 0.05
	done
	return 1
}

# trap_stop_all stops every process started when the script exits, and makes
# Ctrl-C and SIGTERM exit it (130).
trap_stop_all() {
	trap stop_all EXIT
	trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM
}

# bench_commit ROOT DIR: the short commit of ROOT, "+dirty" when the code a
# benchmark measures (cmd, gateway, routing, internal, telemetry) or its
# own DIR has uncommitted changes.
bench_commit() {
	local commit
	commit="$(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown)"
	if [[ -n "$(git -C "$1" status --porcelain -- cmd gateway routing internal telemetry "$2" 2>/dev/null)" ]]; then
		commit="$commit+dirty"
	fi
	echo "$commit"
}

# fixed(d): a number with exactly d decimals, as a string (jq 1.6 has no
# printf).
# shellcheck disable=SC2016,SC2034 # jq code, not shell expansions; used by the scripts that source this file
jq_fmt='def fixed($d): pow(10; $d) as $m | (. * $m | round) as $n | ($n | fabs) as $a
	| (if $n < 0 then "-" else "" end) + ($a / $m | floor | tostring)
	+ (if $d > 0 then "." + (($a % $m) | tostring | (if length < $d then ("0" * ($d - length)) else "" end) + .) else "" end);'

# buckets METRICS NAME [FILTER]: histogram NAME's cumulative buckets in the
# Prometheus text file METRICS, the series whose labels match the regexp
# FILTER (default: every series) summed, as "le count" lines in le order
# (+Inf as inf, last).
buckets() {
	awk -v name="${2}_bucket" -v f="${3:-}" 'index($0, name "{") == 1 && $0 ~ f {
		match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
		n[le == "+Inf" ? "inf" : le] += $NF
	} END { for (le in n) print le, n[le] }' "$1" | sort -g
}

# quantile Q: the bucket of the "le count" lines on stdin that holds the Q
# quantile, as "LO-HI" in ms (the histogram says no more); "-" without
# samples, ">LO" past the last finite bucket.
quantile() {
	awk -v q="$1" '
		NF { les[++n] = $1; c[n] = $2 }
		END {
			total = c[n]
			if (n == 0 || total == 0) { print "-"; exit }
			rank = q * total; prev = 0
			for (j = 1; j < n; j++) {
				if (c[j] >= rank) { printf "%g-%g\n", 1000 * prev, 1000 * les[j]; exit }
				prev = les[j]
			}
			printf ">%g\n", 1000 * prev
		}'
}
