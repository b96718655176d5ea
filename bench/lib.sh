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
