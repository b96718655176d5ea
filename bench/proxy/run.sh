#!/usr/bin/env bash
# Side-by-side proxy benchmark: one fast vLLM-shaped engine, then in front of
# it, one at a time, nginx (the reference), a bare Go ReverseProxy (Go's
# floor) and Switchboard (as shipped, with OTLP metrics, with 10% sampled
# tracing, without the access log), all driven by wrk with the same load:
# non-streaming and 16-token streaming chat completions at 1 and 64
# connections, each after a warm-up. Prints a markdown table of throughput,
# p50/p90/p99 latency and each proxy's CPU per request, with the ratios to
# nginx and the latency added over the engine alone; writes it as JSON too.
#
#   bench/proxy/run.sh                              # every target, about 6 minutes
#   bench/proxy/run.sh direct nginx switchboard-default   # only these
#   DURATION=20s CONNECTIONS="1 16 64" bench/proxy/run.sh
#   ROUNDS=3 bench/proxy/run.sh                     # medians of 3 rounds, about 18 minutes
#   PIN=1 bench/proxy/run.sh                        # the proxy on CPU 1, engine and wrk on CPU 0
#
# Installs nginx-light and wrk with apt-get when run as root, or says what to
# install. Every process is stopped by its PID on exit, Ctrl-C included.
# README.md beside this script explains every parameter and every column.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/bench/proxy"

# shellcheck source=../lib.sh
. "$root/bench/lib.sh"
clear_gateway_env

all_targets="direct nginx go-proxy go-proxy-lean fasthttp net-http-fasthttp-client switchboard-default switchboard-net-http switchboard-bodies-as-sent switchboard-metrics-otlp switchboard-tracing-10pct switchboard-no-access-log"
# name=default pairs; each can be overridden from the environment.
params=(
	"TARGETS=$all_targets"
	"MODES=non-stream stream"
	"CONNECTIONS=1 64"
	"WARMUP=2s"
	"DURATION=10s"
	"ROUNDS=1"
	"TOKENS=16"
	"ENGINE=bench"
	"MAX_LOAD=1.0"
	"LOAD_WAIT=0"
	"RESULTS="
	"PIN=0"
)
usage() {
	sed -n '2,18s/^# \{0,1\}//p' "$0"
	echo
	echo "Parameters (environment variables; defaults shown):"
	for p in "${params[@]}"; do echo "  $p"; done
	echo
	echo "Targets: $all_targets"
}

read_params
case "${1:-}" in -h | --help)
	usage
	exit 0
	;;
esac
if (($# > 0)); then
	TARGETS="$*"
fi
for t in $TARGETS; do
	[[ " $all_targets " == *" $t "* ]] || {
		echo "run.sh: unknown target $t (known: $all_targets)" >&2
		exit 2
	}
done
for m in $MODES; do
	[[ "$m" == non-stream || "$m" == stream ]] || {
		echo "run.sh: unknown mode $m (non-stream, stream)" >&2
		exit 2
	}
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || {
	echo "run.sh: ROUNDS is a positive integer, not $ROUNDS" >&2
	exit 2
}
[[ "$ENGINE" == bench || "$ENGINE" == enginesim ]] || {
	echo "run.sh: ENGINE is bench or enginesim, not $ENGINE" >&2
	exit 2
}
RESULTS="${RESULTS:-$here/results/$(date -u +%Y%m%dT%H%M%SZ)}"
model=bench

# --- what it needs ------------------------------------------------------------

# nginx lives in /usr/sbin, which a user's PATH may not have.
PATH="$PATH:/usr/sbin:/sbin"
apt_missing=()
command -v nginx >/dev/null || apt_missing+=(nginx-light)
command -v wrk >/dev/null || apt_missing+=(wrk)
command -v jq >/dev/null || apt_missing+=(jq)
command -v curl >/dev/null || apt_missing+=(curl)
command -v ps >/dev/null || apt_missing+=(procps)
if ((${#apt_missing[@]} > 0)); then
	if ((EUID == 0)) && command -v apt-get >/dev/null; then
		echo "installing ${apt_missing[*]} (apt-get install -y) ..." >&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -q --no-install-recommends --no-upgrade "${apt_missing[@]}" >&2 ||
			{ apt-get update -q >&2 && apt-get install -y -q --no-install-recommends --no-upgrade "${apt_missing[@]}" >&2; }
	else
		echo "run.sh: missing: ${apt_missing[*]}" >&2
		echo "  not running as root, so not installing them; on Debian or Ubuntu:" >&2
		echo "  sudo apt-get install -y ${apt_missing[*]}" >&2
		exit 1
	fi
fi
for tool in go nginx wrk jq curl ps getconf; do
	command -v "$tool" >/dev/null || {
		echo "run.sh: $tool is required but missing$([[ $tool == go ]] && echo " (Go 1.26, see README.md, Set up)")" >&2
		exit 1
	}
done
clk_tck="$(getconf CLK_TCK)"

# --- processes ----------------------------------------------------------------

pids=()

# stop PID [SIGNAL]: SIGNAL (default TERM) to PID, SIGKILL if it is still
# there 10 s later, then reap it and forget it.
stop() {
	local pid="$1" sig="${2:-TERM}" deadline=$((SECONDS + 10))
	kill -"$sig" "$pid" 2>/dev/null || true
	while alive "$pid" && ((SECONDS < deadline)); do sleep 0.05; done
	kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	reaped "$pid"
}

# stop_all: every process still recorded, last started first (the proxies
# before the engine), then nginx workers orphaned by a killed master.
stop_all() {
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		stop "${pids[i]}"
	done
	stop_orphans
}
trap stop_all EXIT
trap 'echo "run.sh: interrupted" >&2; exit 130' INT TERM

# nginx_workers: the workers of the running nginx master, by PID (ppid is
# the master and the command line says so), for stop_orphans.
nginx_workers=()
stop_orphans() {
	local w
	for w in "${nginx_workers[@]}"; do
		if [[ "$(tr '\0' ' ' 2>/dev/null <"/proc/$w/cmdline")" == "nginx: worker"* ]]; then
			kill -KILL "$w" 2>/dev/null || true
		fi
	done
	nginx_workers=()
}

# port: a free loopback port (for nginx and the collector, which cannot pick
# their own and say which).
port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		(echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || {
			echo "$p"
			return
		}
	done
}

# wait_http URL [SECONDS]: until URL answers 2xx.
wait_http() {
	local deadline=$((SECONDS + ${2:-20}))
	while ((SECONDS < deadline)); do
		curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null && return 0
		sleep 0.05
	done
	echo "run.sh: timed out waiting for $1" >&2
	return 1
}

# --- CPU accounting -----------------------------------------------------------

# ticks PID: utime+stime of PID (every thread), in clock ticks; 0 if gone.
ticks() {
	local s a
	read -r s 2>/dev/null <"/proc/$1/stat" || {
		echo 0
		return
	}
	read -ra a <<<"${s##*) }" # fields from 3 (state) on: comm may hold spaces
	echo $((a[11] + a[12]))
}

# tree_ticks PID: utime+stime of PID and of its children (an nginx master
# and its workers), in clock ticks.
tree_ticks() {
	local root="$1" total f s a
	total="$(ticks "$root")"
	for f in /proc/[0-9]*/stat; do
		read -r s 2>/dev/null <"$f" || continue
		read -ra a <<<"${s##*) }"
		if [[ "${a[1]}" == "$root" ]]; then
			total=$((total + a[11] + a[12]))
		fi
	done
	echo "$total"
}

# children_ms VAR: sets VAR to the CPU of this shell's waited-for children
# (wrk, curl), user + system, in milliseconds, from the builtin times. Not
# in a command substitution: a forked subshell starts with no children's
# times.
children_ms() {
	local line u s
	times >"$RESULTS/.times"
	line="$(sed -n 2p "$RESULTS/.times")" # "0m1.234s 0m0.567s"
	u="${line%% *}"
	s="${line##* }"
	printf -v "$1" '%d' $(($(ms "$u") + $(ms "$s")))
}
ms() { # 1m2.345s -> 62345
	local v="${1%s}" m sec
	m="${v%%m*}"
	sec="${v#*m}"
	awk -v m="$m" -v s="$sec" 'BEGIN { printf "%d", (m * 60 + s) * 1000 + 0.5 }'
}

# machine_ticks: "IDLE STEAL" of all CPUs from /proc/stat, in clock ticks:
# idle (with iowait) and the time the hypervisor gave to other guests. The
# rest of the wall time is busy. (Idle, not /proc/stat's busy columns: on
# this kind of VM the busy columns, sampled at ticks, come out lower than the
# processes' own precise run time, by up to 0.1 core.)
machine_ticks() {
	local cpu user nice system idle iowait irq softirq steal rest
	read -r cpu user nice system idle iowait irq softirq steal rest </proc/stat
	echo "$((idle + iowait)) $steal"
}

load1() { cut -d' ' -f1 /proc/loadavg; }

# --- build --------------------------------------------------------------------

bin="$root/.tools/bench-proxy" # .tools/ is git-ignored
mkdir -p "$bin" "$RESULTS"
echo "building gateway, engine, goproxy and fastproxy into ${bin#"$root"/}/ ..." >&2
(cd "$root" && go build -o "$bin/" ./cmd/gateway ./bench/proxy/engine ./bench/proxy/goproxy)
# fastproxy is its own module (the gateway's go.mod does not depend on fasthttp).
(cd "$here/fastproxy" && go build -o "$bin/fastproxy" .)
if [[ "$ENGINE" == enginesim ]]; then
	(cd "$root" && go build -o "$bin/" ./cmd/enginesim)
fi
if [[ " $TARGETS " == *" switchboard-metrics-otlp "* || " $TARGETS " == *" switchboard-tracing-10pct "* ]]; then
	# The integration tests' collector, built once into .tools/bin.
	tools="$root/.tools/bin"
	# shellcheck source=../../integration/tools/build.sh
	. "$root/integration/tools/build.sh"
	bin="$tools" build_tool otelcol "$root/integration/tools/otelcol" .
fi
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain -- cmd gateway routing internal telemetry bench/proxy 2>/dev/null)" ]]; then
	commit="$commit+dirty"
fi

# --- the machine ----------------------------------------------------------------

load_start="$(load1)"
if awk -v l="$load_start" -v m="$MAX_LOAD" 'BEGIN { exit !(l > m) }'; then
	wait_s="${LOAD_WAIT%s}"
	if ((wait_s > 0)); then
		echo "load average $load_start is above $MAX_LOAD: waiting up to ${wait_s}s for it to drop ..." >&2
		deadline=$((SECONDS + wait_s))
		while ((SECONDS < deadline)) && awk -v l="$(load1)" -v m="$MAX_LOAD" 'BEGIN { exit !(l > m) }'; do sleep 5; done
		load_start="$(load1)"
	fi
	if awk -v l="$load_start" -v m="$MAX_LOAD" 'BEGIN { exit !(l > m) }'; then
		echo "warning: load average $load_start is above $MAX_LOAD: something else is using this machine's $(nproc) cores; the 'other CPU' column shows how much, per row" >&2
	fi
fi

# --- the engine -------------------------------------------------------------------

# PIN=1: the proxy under test gets CPU 1 to itself; the engine, wrk and
# the collector share CPU 0. Unpinned, the three compete for both CPUs and
# a one-connection row's CPU per request moves by 20% or more between
# rounds with where the scheduler put them; pinned, it holds within a few
# percent (BENCHMARKS.md). Needs taskset (util-linux) and two CPUs.
pin_load=() pin_proxy=()
if [[ "$PIN" == 1 ]]; then
	if ! command -v taskset >/dev/null || (($(getconf _NPROCESSORS_ONLN) < 2)); then
		echo "run.sh: PIN=1 needs taskset and at least two CPUs" >&2
		exit 2
	fi
	pin_load=(taskset -c 0) pin_proxy=(taskset -c 1)
fi

mkdir -p "$RESULTS/engine"
if [[ "$ENGINE" == bench ]]; then
	start "$RESULTS/engine/engine.log" "${pin_load[@]}" "$bin/engine" --listen 127.0.0.1:0 --model "$model" --tokens "$TOKENS"
	engine_msg="bench engine listening"
else
	start "$RESULTS/engine/engine.log" "${pin_load[@]}" "$bin/enginesim" --listen 127.0.0.1:0 --model "$model" --ttft 1ns --itl 1ns \
		--output-tokens "$TOKENS" --max-num-seqs 1024
	engine_msg="enginesim listening"
fi
engine_pid="$started"
engine_addr="$(await_addr "$engine_pid" "$RESULTS/engine/engine.log" "$engine_msg")" || {
	echo "run.sh: the engine did not start:" >&2
	cat "$RESULTS/engine/engine.log" >&2
	exit 1
}
wait_http "http://$engine_addr/health"
echo "engine ($ENGINE) on $engine_addr" >&2

# --- targets ----------------------------------------------------------------------

# Set by start_target: the URL to load, the PID whose CPU is the proxy's
# ("" for direct), whether its children count (nginx), the process to
# stop afterwards, the access log to empty between runs, the collector.
url="" proxy_pid="" proxy_tree=0 access_log="" collector_pid="" collector_port=""

start_collector() {
	local dir="$1"
	collector_port="$(port)"
	start "$dir/collector.log" "${pin_load[@]}" env OTLP_HTTP_ENDPOINT="127.0.0.1:$collector_port" \
		"$root/.tools/bin/otelcol" --config "$root/bench/telemetry/collector.yaml"
	collector_pid="$started"
	local deadline=$((SECONDS + 20))
	until (echo >"/dev/tcp/127.0.0.1/$collector_port") 2>/dev/null; do
		alive "$collector_pid" && ((SECONDS < deadline)) || {
			echo "run.sh: the collector did not start:" >&2
			cat "$dir/collector.log" >&2
			return 1
		}
		sleep 0.05
	done
}

# gateway_config EXTRA: one static engine, listeners on free ports, the rest
# as shipped (log level info, access log on).
gateway_config() {
	cat <<-EOF
		server:
		  listen: "127.0.0.1:0"
		admin:
		  listen: "127.0.0.1:0"
		engines:
		  - name: e1
		    url: http://$engine_addr
		    models: [$model]
	EOF
	[[ -z "${1:-}" ]] || printf '%s\n' "$1"
}

start_target() {
	local target="$1" dir="$rdir/$1" addr p
	mkdir -p "$dir"
	url="" proxy_pid="" proxy_tree=0 access_log="" collector_pid=""
	case "$target" in
	direct)
		url="http://$engine_addr"
		;;
	nginx)
		p="$(port)"
		mkdir -p "$dir/nginx-tmp"
		local user_line="# not root: the workers run as the current user"
		((EUID == 0)) && user_line="user $(id -un) $(id -gn);"
		sed -e "s|@USER_LINE@|$user_line|" -e "s|@RUN_DIR@|$dir|g" \
			-e "s|@ENGINE_PORT@|${engine_addr##*:}|" -e "s|@LISTEN_PORT@|$p|" \
			"$here/nginx.conf" >"$dir/nginx.conf"
		start "$dir/nginx.out" "${pin_proxy[@]}" nginx -p "$dir/" -e "$dir/nginx-error.log" -c "$dir/nginx.conf"
		proxy_pid="$started" proxy_tree=1
		url="http://127.0.0.1:$p"
		wait_http "$url/health" || {
			cat "$dir/nginx.out" "$dir/nginx-error.log" >&2
			return 1
		}
		local f s a
		nginx_workers=()
		for f in /proc/[0-9]*/stat; do
			read -r s 2>/dev/null <"$f" || continue
			read -ra a <<<"${s##*) }"
			[[ "${a[1]}" == "$proxy_pid" ]] && nginx_workers+=("$(basename "$(dirname "$f")")")
		done
		echo "  nginx master $proxy_pid, workers ${nginx_workers[*]}" >&2
		;;
	go-proxy | go-proxy-lean)
		local client=net/http
		[[ "$target" == go-proxy-lean ]] && client=lean
		start "$dir/goproxy.log" "${pin_proxy[@]}" "$bin/goproxy" --listen 127.0.0.1:0 --upstream "http://$engine_addr" --client "$client"
		proxy_pid="$started"
		addr="$(await_addr "$proxy_pid" "$dir/goproxy.log" "goproxy listening")" || {
			cat "$dir/goproxy.log" >&2
			return 1
		}
		url="http://$addr"
		;;
	fasthttp | net-http-fasthttp-client)
		local server=fasthttp
		[[ "$target" == net-http-fasthttp-client ]] && server=net/http
		start "$dir/fastproxy.log" "${pin_proxy[@]}" "$bin/fastproxy" --listen 127.0.0.1:0 --upstream "$engine_addr" --server "$server"
		proxy_pid="$started"
		addr="$(await_addr "$proxy_pid" "$dir/fastproxy.log" "fastproxy listening")" || {
			cat "$dir/fastproxy.log" >&2
			return 1
		}
		url="http://$addr"
		;;
	switchboard-*)
		local extra="" envs=()
		case "$target" in
		switchboard-default) ;;
		switchboard-net-http) envs=(SWITCHBOARD_SERVER__ENGINE_CLIENT=net/http) ;;
		switchboard-bodies-as-sent) envs=(SWITCHBOARD_MIGRATION__NON_STREAMING=false) ;;
		switchboard-no-access-log) extra="log: {access: false}" ;;
		switchboard-metrics-otlp | switchboard-tracing-10pct)
			start_collector "$dir" || return 1
			envs=(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$collector_port" OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf
				OTEL_METRIC_EXPORT_INTERVAL=1000)
			if [[ "$target" == switchboard-metrics-otlp ]]; then
				envs+=(OTEL_TRACES_EXPORTER=none)
			else
				envs+=(OTEL_TRACES_SAMPLER=traceidratio OTEL_TRACES_SAMPLER_ARG=0.1)
			fi
			;;
		esac
		# The config in a directory of its own: the gateway watches its
		# config's directory (reload.watch), and a log written there would
		# wake the watcher at every flush.
		mkdir -p "$dir/config"
		gateway_config "$extra" >"$dir/config/gateway.yaml"
		printf '%s\n' "${envs[@]}" >"$dir/gateway.env"
		start "$dir/gateway.log" "${pin_proxy[@]}" env "${envs[@]}" "$bin/gateway" --config "$dir/config/gateway.yaml"
		proxy_pid="$started"
		addr="$(await_addr "$proxy_pid" "$dir/gateway.log" "switchboard listening")" || {
			cat "$dir/gateway.log" >&2
			return 1
		}
		url="http://$addr"
		wait_http "$url/ready" || return 1
		cp "$dir/gateway.log" "$dir/gateway-start.log"
		access_log="$dir/gateway.log"
		;;
	esac
	check_target "$target" "$dir"
}

# check_target TARGET DIR: one request of each mode must come back whole, in
# the engine's shapes, before any load (a proxy that answers 502 fast would
# otherwise win).
check_target() {
	local target="$1" dir="$2" body events deadline=$((SECONDS + 15))
	body="{\"model\":\"$model\",\"max_tokens\":$TOKENS,\"messages\":[{\"role\":\"user\",\"content\":\"Say hello\"}]}"
	# The gateway's first health probe may still be on its way: retry 503s.
	while :; do
		curl -sS -o "$dir/check-non-stream.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" \
			"$url/v1/chat/completions" >"$dir/check-status" || true
		[[ "$(cat "$dir/check-status")" == 503 && $SECONDS -lt $deadline ]] || break
		sleep 0.2
	done
	if ! jq -e --argjson n "$TOKENS" '.object == "chat.completion" and .usage.completion_tokens == $n' \
		"$dir/check-non-stream.json" >/dev/null 2>&1; then
		echo "run.sh: $target: the non-streaming check failed (HTTP $(cat "$dir/check-status")):" >&2
		head -c 2000 "$dir/check-non-stream.json" >&2
		return 1
	fi
	body="{\"model\":\"$model\",\"max_tokens\":$TOKENS,\"stream\":true,\"stream_options\":{\"include_usage\":true},\"messages\":[{\"role\":\"user\",\"content\":\"Say hello\"}]}"
	curl -sSN -o "$dir/check-stream.txt" -H 'Content-Type: application/json' -d "$body" "$url/v1/chat/completions" || true
	events="$(grep -c '^data: ' "$dir/check-stream.txt" || true)"
	if [[ "$events" != $((TOKENS + 4)) || "$(grep '^data: ' "$dir/check-stream.txt" | tail -n1)" != "data: [DONE]" ]]; then
		echo "run.sh: $target: the streaming check failed: $events events (want $((TOKENS + 4)), the last [DONE]):" >&2
		head -c 2000 "$dir/check-stream.txt" >&2
		return 1
	fi
}

# stop_target TARGET: the proxy, then the collector.
stop_target() {
	if [[ -n "$proxy_pid" ]]; then
		if ((proxy_tree)); then
			stop "$proxy_pid" QUIT # nginx: graceful; the workers finish and exit
			stop_orphans
		else
			stop "$proxy_pid"
		fi
	fi
	if [[ -n "$collector_pid" ]]; then
		# What the receiver got (the gateway flushes its exports as it stops):
		# the spans sampled over every request of the target, warm-ups included.
		grep -o '"spans": [0-9]*' "$rdir/$1/collector.log" 2>/dev/null | awk '{s += $2} END {print s + 0}' >"$rdir/$1/spans-received" || true
		stop "$collector_pid"
	fi
	proxy_pid="" collector_pid=""
}

# --- one run ----------------------------------------------------------------------

# run_case TARGET MODE CONNECTIONS: warm-up, then the measured wrk run with
# CPU read before and after; one JSON row appended to rows.jsonl.
run_case() {
	local target="$1" mode="$2" c="$3" dir="$rdir/$1" threads=2 stream=0 name
	((c < 2)) && threads=1
	[[ "$mode" == stream ]] && stream=1
	name="$mode-c$c"
	local w=("${pin_load[@]}" wrk "-t$threads" "-c$c" --latency --timeout 10s -s "$here/chat.lua")
	# Warm-up: connections open, pools filled, the Go runtime's heap grown.
	start "$dir/warmup-$name.txt" env BENCH_STREAM=$stream BENCH_TOKENS=$TOKENS BENCH_MODEL=$model "${w[@]}" -d "$WARMUP" "$url/v1/chat/completions"
	local wpid="$started" rc=0
	wait "$wpid" || rc=$?
	reaped "$wpid"
	((rc == 0)) || {
		echo "run.sh: wrk (warm-up) failed for $target $name:" >&2
		cat "$dir/warmup-$name.txt" >&2
		return 1
	}
	[[ -z "$access_log" ]] || : >"$access_log"

	local p0=0 p1=0 e0 e1 k0 k1=0 c0=0 c1=0 idle0 steal0 idle1 steal1 wall0 wall1 load
	load="$(load1)"
	if [[ -n "$proxy_pid" ]]; then
		if ((proxy_tree)); then p0="$(tree_ticks "$proxy_pid")"; else p0="$(ticks "$proxy_pid")"; fi
	fi
	[[ -z "$collector_pid" ]] || c0="$(ticks "$collector_pid")"
	e0="$(ticks "$engine_pid")"
	children_ms k0
	read -r idle0 steal0 <<<"$(machine_ticks)"
	wall0="$EPOCHREALTIME"

	printf '%q ' env BENCH_STREAM=$stream BENCH_TOKENS=$TOKENS BENCH_MODEL=$model "${w[@]}" -d "$DURATION" "$url/v1/chat/completions" >"$dir/wrk-$name.cmd"
	echo >>"$dir/wrk-$name.cmd"
	start "$dir/wrk-$name.txt" env BENCH_STREAM=$stream BENCH_TOKENS=$TOKENS BENCH_MODEL=$model "${w[@]}" -d "$DURATION" "$url/v1/chat/completions"
	wpid="$started"
	rc=0
	wait "$wpid" || rc=$?
	reaped "$wpid"

	wall1="$EPOCHREALTIME"
	read -r idle1 steal1 <<<"$(machine_ticks)"
	children_ms k1
	e1="$(ticks "$engine_pid")"
	[[ -z "$collector_pid" ]] || c1="$(ticks "$collector_pid")"
	if [[ -n "$proxy_pid" ]]; then
		if ((proxy_tree)); then p1="$(tree_ticks "$proxy_pid")"; else p1="$(ticks "$proxy_pid")"; fi
	fi
	((rc == 0)) || {
		echo "run.sh: wrk failed for $target $name:" >&2
		cat "$dir/wrk-$name.txt" >&2
		return 1
	}
	local result log_lines=null
	result="$(sed -n 's/^BENCH_RESULT //p' "$dir/wrk-$name.txt")"
	[[ -n "$result" ]] || {
		echo "run.sh: no BENCH_RESULT line from wrk for $target $name:" >&2
		cat "$dir/wrk-$name.txt" >&2
		return 1
	}
	if [[ -n "$access_log" ]]; then
		log_lines="$(wc -l <"$access_log")"
		head -n 3 "$access_log" >"$dir/access-sample-$name.log"
		: >"$access_log"
	fi
	jq -c --arg target "$target" --arg mode "$mode" --argjson c "$c" --argjson threads "$threads" --argjson round "$round" \
		--argjson proxied "$([[ -n "$proxy_pid" ]] && echo true || echo false)" \
		--argjson proxy_ticks "$((p1 - p0))" --argjson engine_ticks "$((e1 - e0))" \
		--argjson collector "$([[ -n "$collector_pid" ]] && echo true || echo false)" \
		--argjson collector_ticks "$((c1 - c0))" --argjson wrk_ms "$((k1 - k0))" \
		--argjson idle "$((idle1 - idle0))" --argjson steal "$((steal1 - steal0))" --argjson wall "$(awk -v a="$wall0" -v b="$wall1" 'BEGIN { print b - a }')" --argjson ncpu "$(nproc)" \
		--argjson tck "$clk_tck" --argjson load "$load" --argjson log_lines "$log_lines" '
		def per_req($t): if .requests > 0 then $t / $tck * 1e6 / .requests else null end;
		(.duration_us / 1e6) as $secs
		| . + {target: $target, mode: $mode, connections: $c, threads: $threads, round: $round,
			requests_per_s: (.requests / $secs),
			proxy_cpu_ticks: (if $proxied then $proxy_ticks else null end),
			proxy_cpu_us_per_req: (if $proxied then per_req($proxy_ticks) else null end),
			proxy_cpu_cores: (if $proxied then $proxy_ticks / $tck / $secs else null end),
			engine_cpu_us_per_req: per_req($engine_ticks),
			collector_cpu_us_per_req: (if $collector then per_req($collector_ticks) else null end),
			wrk_cpu_us_per_req: (if .requests > 0 then $wrk_ms * 1000 / .requests else null end),
			# CPU of everything else on the machine during the run, in cores:
			# the busy time of all CPUs (wall time less idle and steal) less
			# that of the processes of this run.
			other_cpu_cores: (($ncpu - (($idle + $steal) / $tck / $wall))
				- ((($proxy_ticks + $engine_ticks + $collector_ticks) / $tck + $wrk_ms / 1000) / $wall)),
			machine_idle_cores: ($idle / $tck / $wall),
			steal_cores: ($steal / $tck / $wall),
			load1_before: $load,
			access_log_lines: $log_lines}' <<<"$result" >>"$RESULTS/rows.jsonl" || return 1
	jq -r '"    \(.target) \(.mode) c=\(.connections): \(.requests_per_s | floor) req/s, p50 \(.latency_us.p50) µs, p99 \(.latency_us.p99) µs, proxy CPU \(if .proxy_cpu_us_per_req then (.proxy_cpu_us_per_req * 10 | round / 10 | tostring) + " µs/req" else "-" end), errors \(.errors | add), other CPU \(.other_cpu_cores * 100 | round / 100) cores"' \
		<<<"$(tail -n1 "$RESULTS/rows.jsonl")" >&2
}

: >"$RESULTS/rows.jsonl"
t0=$SECONDS
failed=()
n_targets="$(wc -w <<<"$TARGETS")"
n_cases=$((ROUNDS * n_targets * $(wc -w <<<"$MODES") * $(wc -w <<<"$CONNECTIONS")))
echo "$ROUNDS round(s): $n_cases wrk runs of $WARMUP + $DURATION, about $(awk -v n="$n_cases" -v w="${WARMUP%s}" -v d="${DURATION%s}" -v t="$((ROUNDS * n_targets))" 'BEGIN { m = (n * (w + d + 0.3) + t * 1.5) / 60; printf "%.0f minute%s", m, (m >= 1.5 ? "s" : "") }')" >&2
for ((round = 1; round <= ROUNDS; round++)); do
	# One directory per round when there are several; every other round
	# runs the targets in reverse, so a drift of the machine over the run
	# does not always favour the same ones.
	rdir="$RESULTS"
	order="$TARGETS"
	if ((ROUNDS > 1)); then
		rdir="$RESULTS/round-$round"
		((round % 2 == 1)) || order="$(tr ' ' '\n' <<<"$TARGETS" | grep . | tac | tr '\n' ' ')"
	fi
	for target in $order; do
		echo "== $target$( ((ROUNDS == 1)) || echo ", round $round of $ROUNDS") ($((SECONDS - t0)) s)" >&2
		if ! start_target "$target"; then
			failed+=("$target")
			stop_target "$target"
			continue
		fi
		for mode in $MODES; do
			for c in $CONNECTIONS; do
				run_case "$target" "$mode" "$c" || failed+=("$target/$mode/c$c")
			done
		done
		stop_target "$target"
	done
done
load_end="$(load1)"
stop_all
rm -f "$RESULTS/.times"

# --- table --------------------------------------------------------------------

# fixed(d): a number with exactly d decimals, as a string (jq 1.6 has no
# printf).
# shellcheck disable=SC2016 # jq code, not shell expansions
jq_fmt='def fixed($d): if . == null then "–" else pow(10; $d) as $m | (. * $m | round) as $n | ($n | fabs) as $a
	| (if $n < 0 then "-" else "" end) + ($a / $m | floor | tostring)
	+ (if $d > 0 then "." + (($a % $m) | tostring | (if length < $d then ("0" * ($d - length)) else "" end) + .) else "" end) end;'

reproduce="bench/proxy/run.sh"
if ((${#overrides[@]} > 0)); then
	reproduce="${overrides[*]} $reproduce"
fi
if (($# > 0)); then
	reproduce="$reproduce $*"
fi
# Spans the collector received per target, summed over the rounds.
spans_json="$(for t in $TARGETS; do
	for f in "$RESULTS/$t/spans-received" "$RESULTS"/round-*/"$t/spans-received"; do
		if [[ -f "$f" ]]; then jq -n --arg t "$t" --argjson n "$(cat "$f")" '{target: $t, n: $n}'; fi
	done
done | jq -s 'group_by(.target) | map({(.[0].target): (map(.n) | add)}) | add // {}')"
jq -s --arg commit "$commit" --arg command "$reproduce" --arg engine "$ENGINE" \
	--arg nginx_version "$(nginx -v 2>&1 | sed 's/^nginx version: //')" --arg wrk_version "$(wrk -v 2>&1 | head -n1 | cut -d' ' -f2)" \
	--arg go_version "$(go env GOVERSION)" --argjson nproc "$(nproc)" --argjson tck "$clk_tck" --argjson rounds "$ROUNDS" \
	--argjson load_start "$load_start" --argjson load_end "$load_end" --argjson spans "$spans_json" \
	--argjson params "$(for p in "${params[@]}"; do n="${p%%=*}"; [[ $n == RESULTS ]] || jq -n --arg k "$n" --arg v "${!n}" '{($k): $v}'; done | jq -s add)" '
	def key: "\(.mode)/\(.connections)";
	def ratio($a; $b): if $a == null or $b == null or $b == 0 then null else $a / $b end;
	def median: sort | if length == 0 then null elif length % 2 == 1 then .[(length - 1) / 2]
		else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def med(f): map(f) | map(select(. != null)) | median;
	# One row per target, mode and connection count, in the order they first
	# ran: each figure the median of its rounds (the rounds are kept).
	(reduce .[] as $r ([]; ("\($r.target)/\($r | key)") as $k | if any(.[]; . == $k) then . else . + [$k] end)) as $order
	| (group_by("\(.target)/\(key)") | map({key: ("\(.[0].target)/\(.[0] | key)"), value: .}) | from_entries) as $groups
	| [$order[] | $groups[.] | . as $g | {
		target: .[0].target, mode: .[0].mode, connections: .[0].connections, threads: .[0].threads,
		rounds: length,
		requests: (map(.requests) | add),
		errors: (map(.errors) | reduce .[] as $e ({}; reduce ($e | keys[]) as $k (.; .[$k] += $e[$k]))),
		requests_per_s: med(.requests_per_s),
		requests_per_s_range: [(map(.requests_per_s) | min), (map(.requests_per_s) | max)],
		latency_us: {min: (map(.latency_us.min) | min), mean: med(.latency_us.mean),
			p50: med(.latency_us.p50), p75: med(.latency_us.p75), p90: med(.latency_us.p90),
			p99: med(.latency_us.p99), p999: med(.latency_us.p999), max: (map(.latency_us.max) | max)},
		bytes_per_request: med(if .requests > 0 then .bytes / .requests else null end),
		proxy_cpu_us_per_req: med(.proxy_cpu_us_per_req),
		proxy_cpu_cores: med(.proxy_cpu_cores),
		engine_cpu_us_per_req: med(.engine_cpu_us_per_req),
		collector_cpu_us_per_req: med(.collector_cpu_us_per_req),
		wrk_cpu_us_per_req: med(.wrk_cpu_us_per_req),
		other_cpu_cores: (map(.other_cpu_cores) | max),
		steal_cores: (map(.steal_cores) | max),
		access_log_lines: (map(.access_log_lines) | if all(. == null) then null else add end),
		per_round: $g}]
	| (map(select(.target == "nginx")) | map({(key): .}) | add // {}) as $nginx
	| (map(select(.target == "go-proxy")) | map({(key): .}) | add // {}) as $go
	| (map(select(.target == "direct")) | map({(key): .}) | add // {}) as $direct
	| {commit: $commit, command: $command, engine: $engine, params: $params, rounds: $rounds,
	 machine: {cpus: $nproc, clk_tck: $tck, load1_start: $load_start, load1_end: $load_end,
		nginx: $nginx_version, wrk: $wrk_version, go: $go_version},
	 spans_received: $spans,
	 rows: map(. as $r | $nginx[$r | key] as $n | $go[$r | key] as $g | $direct[$r | key] as $d
		| . + {vs_nginx: {requests_per_s: ratio(.requests_per_s; $n.requests_per_s),
				p99: ratio(.latency_us.p99; $n.latency_us.p99),
				cpu_per_req: ratio(.proxy_cpu_us_per_req; $n.proxy_cpu_us_per_req)},
			vs_go_proxy: {requests_per_s: ratio(.requests_per_s; $g.requests_per_s),
				p99: ratio(.latency_us.p99; $g.latency_us.p99),
				cpu_per_req: ratio(.proxy_cpu_us_per_req; $g.proxy_cpu_us_per_req)},
			added_over_direct_us: (if $d == null or .target == "direct" then null
				else {p50: (.latency_us.p50 - $d.latency_us.p50), p99: (.latency_us.p99 - $d.latency_us.p99)} end)})}' \
	"$RESULTS/rows.jsonl" >"$RESULTS/results.json"

{
	echo "Proxies side by side in front of one engine ($ENGINE, $TOKENS tokens per response), wrk for $DURATION after $WARMUP of warm-up per row$( ((ROUNDS == 1)) || echo ", medians of $ROUNDS rounds (other CPU: the largest)"), $(if [[ "$PIN" == 1 ]]; then echo "the proxy alone on CPU 1, wrk and the engine on CPU 0 (PIN=1)"; else echo "on $(nproc) CPUs shared by wrk, the proxy and the engine"; fi); commit $commit; load average $load_start at start, $load_end at end."
	echo
	echo "| target | mode | conns | req/s | p50 µs | p90 µs | p99 µs | CPU µs/req | req/s ÷ nginx | p99 ÷ nginx | CPU ÷ nginx | added p50 µs | added p99 µs | engine CPU µs/req | other CPU cores | errors |"
	echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	jq -r "$jq_fmt"'
		def x: if . == null then "–" else "×" + fixed(2) end;
		.rows[] | "| \(.target) | \(.mode) | \(.connections) | \(.requests_per_s | fixed(0)) | \(.latency_us.p50 | fixed(0)) | \(.latency_us.p90 | fixed(0)) | \(.latency_us.p99 | fixed(0)) | \(.proxy_cpu_us_per_req | fixed(1)) | \(.vs_nginx.requests_per_s | x) | \(.vs_nginx.p99 | x) | \(.vs_nginx.cpu_per_req | x) | \(if .connections == 1 then (.added_over_direct_us.p50 | fixed(0)) else "" end) | \(if .connections == 1 then (.added_over_direct_us.p99 | fixed(0)) else "" end) | \(.engine_cpu_us_per_req | fixed(1)) | \(.other_cpu_cores | fixed(2)) | \(.errors | add) of \(.requests) |"' "$RESULTS/results.json"
	echo
	echo '```sh'
	echo "$reproduce"
	echo '```'
} | tee "$RESULTS/table.md"
echo >&2
echo "results: ${RESULTS#"$root"/}/results.json, table: ${RESULTS#"$root"/}/table.md, logs and wrk output: ${RESULTS#"$root"/}/$( ((ROUNDS == 1)) || echo "round-N/")<target>/ ($((SECONDS - t0)) s)" >&2
if ((${#failed[@]} > 0)); then
	echo "run.sh: failed: ${failed[*]}" >&2
	exit 1
fi
