# Shell helpers shared by the bench/*/run.sh scripts; source it.

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
