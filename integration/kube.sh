#!/usr/bin/env bash
# A real Kubernetes control plane for tests: etcd and kube-apiserver, started
# the way controller-runtime's envtest does (no kubelet, no controller
# manager, no scheduler: nothing turns Services into EndpointSlices, so tests
# create and edit EndpointSlices themselves).
#
#   integration/kube.sh build             build both into .tools/bin (once)
#   integration/kube.sh run CMD [ARG...]  start, run CMD with the IT_KUBE_*
#                                         variables set, stop; CMD's status
#   eval "$(integration/kube.sh start)"   start, export IT_KUBE_* here
#   integration/kube.sh env [DIR]         print those exports again
#   integration/kube.sh restart [DIR]     restart kube-apiserver (same port,
#                                         certs and etcd; its PID changes)
#   integration/kube.sh stop [DIR]        stop both (kube-apiserver first),
#                                         remove DIR; DIR is $IT_KUBE_DIR
#
# For example
#
#   integration/kube.sh run go test -count=1 -tags integration -run TestKube ./integration/
#
# Both are built from the Go module proxy at the versions pinned in
# integration/tools/kube/go.mod (its own module; update.sh there regenerates
# it), into .tools/bin/etcd and .tools/bin/kube-apiserver with a stamp, so
# they are rebuilt only when that module changes. A cold build is about 900
# CPU-seconds at 2.4 GB peak RSS, kube-apiserver most of it: 9.5 minutes on 2
# cores with an empty Go build cache, 12.7 with empty build and module
# caches (560 MB of modules downloaded) on a busy machine; it leaves 2.8 GB
# in the build cache. The binaries are 24 MB (etcd) and 114 MB (stripped).
# Later starts take about 4 s; the two need about 320 MB of RSS.
#
# start makes a directory (DIR, default a new /tmp/switchboard-kube.XXXXXX,
# or $IT_KUBE_DIR when it is set and empty) holding everything: a CA and the
# apiserver's serving certificate (openssl), the service-account key pair,
# an admin token file (the token's user is in system:masters), a kubeconfig,
# etcd's data, the logs (etcd.log, kube-apiserver.log) and the PID files.
# etcd and kube-apiserver listen on free loopback ports (etcd over plain
# HTTP, the apiserver over HTTPS); start returns once /readyz answers ok
# (deadline $IT_KUBE_TIMEOUT seconds, default 60), so RBAC's bootstrap roles
# exist. It exports
#
#   IT_KUBE_URL         https://127.0.0.1:PORT of kube-apiserver
#   IT_KUBE_TOKEN       a bearer token with cluster-admin rights
#   IT_KUBE_CA          the CA file that verifies IT_KUBE_URL
#   IT_KUBE_CONFIG      a kubeconfig with all three (KUBECONFIG=$IT_KUBE_CONFIG)
#   IT_KUBE_ETCD_URL    http://127.0.0.1:PORT of etcd
#   IT_KUBE_DIR         DIR
#   IT_KUBE_SCRIPT      this script (tests call "$IT_KUBE_SCRIPT" restart)
#
# Service-account tokens work (TokenRequest, the ServiceAccount admission
# plugin is off: create ServiceAccounts yourself), so a test can act as a
# ServiceAccount bound to a Role. No garbage collector or namespace
# controller runs: a deleted namespace stays Terminating, so use a fresh
# namespace per test.
#
# Sourced (". integration/kube.sh"), it only defines kube_build, kube_start
# DIR, kube_stop DIR and kube_restart_apiserver DIR, which export the same
# variables in the calling shell; the processes are its children then.
#
# Needs Go, openssl and curl. Leaves the directory behind when start fails.

kube_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kube_bin="$kube_root/.tools/bin"
kube_mod="$kube_root/integration/tools/kube"

kube_log() { echo "kube.sh: $*" >&2; }

# The Kubernetes version pinned in the tools module (v1.37.2).
kube_version() {
	awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$kube_mod/go.mod"
}

kube_ldflags() { # the apiserver's version stamp (/version, kubectl version), stripped
	local v major minor
	v="$(kube_version)"
	major="${v#v}" && major="${major%%.*}"
	minor="${v#v*.}" && minor="${minor%%.*}"
	printf '%s' "-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=$major -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}

kube_build_one() { # name package [ldflags]: go build in the tools module, cached by a hash of it
	local out="$kube_bin/$1" stamp="$kube_bin/$1.stamp" sum start
	sum="$({ cat "$kube_mod/go.mod" "$kube_mod/go.sum"; printf '%s' "$2 ${3:-}"; } | sha256sum | cut -d' ' -f1)"
	if [[ -x "$out" && -f "$stamp" && "$(cat "$stamp")" == "$sum" ]]; then
		return
	fi
	kube_log "building $1 from $2 (cached in .tools/bin afterwards)..."
	start=$SECONDS
	mkdir -p "$kube_bin"
	(cd "$kube_mod" && go build -trimpath -ldflags "${3:-}" -o "$out.tmp.$$" "$2") || return
	mv -f "$out.tmp.$$" "$out" # atomic: a concurrent run never sees half a binary
	echo "$sum" >"$stamp"
	kube_log "built $1 in $((SECONDS - start)) s ($(du -m "$out" | cut -f1) MB)"
}

kube_build() { # both binaries, if the tools module changed since they were built
	local start=$SECONDS
	kube_build_one etcd go.etcd.io/etcd/server/v3 "-s -w" || return
	kube_build_one kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$(kube_ldflags)" || return
	if ((SECONDS - start > 1)); then
		kube_log "control plane built in $((SECONDS - start)) s"
	fi
}

declare -A kube_taken=()
kube_port() { # VAR: set VAR to a loopback port nothing listens on (and not handed out before)
	local p
	for _ in {1..500}; do
		# Below Linux's ephemeral range (32768+), so outgoing connections do not take it meanwhile.
		p=$((20000 + RANDOM % 12000))
		[[ -n "${kube_taken[$p]:-}" ]] && continue
		# run.sh's ports, when sourced there.
		[[ "$(declare -p taken 2>/dev/null)" == "declare -A"* ]] && [[ -n "${taken[$p]:-}" ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			kube_taken[$p]=1
			[[ "$(declare -p taken 2>/dev/null)" == "declare -A"* ]] && taken[$p]=1
			printf -v "$1" '%d' "$p"
			return
		fi
	done
	kube_log "no free port found"
	return 1
}

kube_alive() { # pid: running (not a zombie)
	local stat
	stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
	stat="${stat##*) }"
	[[ "${stat:0:1}" != Z ]]
}

kube_ours() { # dir name: the PID in DIR/name.pid, if that process is ours and alive
	local pid
	pid="$(cat "$1/$2.pid" 2>/dev/null)" || return 1
	[[ "$pid" =~ ^[0-9]+$ ]] && kube_alive "$pid" || return 1
	# Only a process started with this directory in its flags (never a reused PID).
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$1/" || return 1
	echo "$pid"
}

kube_kill() { # dir name seconds: SIGTERM the process, SIGKILL after seconds
	local pid i
	pid="$(kube_ours "$1" "$2")" || { rm -f "$1/$2.pid"; return 0; }
	kill -TERM "$pid" 2>/dev/null || true
	for ((i = 0; i < $3 * 10; i++)); do
		kube_alive "$pid" || break
		sleep 0.1
	done
	if kube_alive "$pid"; then
		kube_log "$2 (PID $pid) still running after $3 s: SIGKILL"
		kill -KILL "$pid" 2>/dev/null || true
		for ((i = 0; i < 20; i++)); do
			kube_alive "$pid" || break
			sleep 0.1
		done
	fi
	# No wait: kube_launch disowned it (a zombie counts as gone, bash reaps it).
	rm -f "$1/$2.pid"
}

kube_launch() { # dir name binary args...: start it in the background, log to DIR/name.log
	local dir=$1 name=$2
	shift 2
	"$@" </dev/null >>"$dir/$name.log" 2>&1 &
	echo $! >"$dir/$name.pid"
	# Not a job of this shell: bash still reaps it, but prints no "Killed"
	# notice when it dies of a signal (a SIGKILL from kube_kill, here or in
	# another kube.sh, such as "restart" run by a test under "run").
	disown $!
}

kube_wait() { # dir name deadline curl-args...: poll until curl succeeds while name runs
	local dir=$1 name=$2 deadline=$3 pid
	shift 3
	pid="$(cat "$dir/$name.pid")"
	until curl -sf -o /dev/null --max-time 2 "$@"; do
		if ! kube_alive "$pid"; then
			kube_log "$name exited before it was ready; last lines of $dir/$name.log:"
			tail -n 20 "$dir/$name.log" >&2
			return 1
		fi
		if ((SECONDS >= deadline)); then
			kube_log "$name not ready after ${IT_KUBE_TIMEOUT:-60} s; last lines of $dir/$name.log:"
			tail -n 20 "$dir/$name.log" >&2
			return 1
		fi
		sleep 0.1
	done
}

kube_pki() { # dir: CA, serving certificate, service-account keys, admin token
	local pki="$1/pki"
	mkdir -p "$pki" && chmod 700 "$pki"
	(
		set -e
		cd "$pki"
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
		openssl req -x509 -new -key ca.key -subj "/CN=switchboard-it-ca" -days 30 -out ca.crt \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out apiserver.key 2>/dev/null
		openssl req -new -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr 2>/dev/null
		printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
			"keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >apiserver.ext
		openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
			-extfile apiserver.ext -out apiserver.crt 2>/dev/null
		# The service-account token signing key pair (RSA, as the apiserver's default).
		openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
		openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null
		# token,user,uid,"groups": the admin is in system:masters (cluster-admin under RBAC).
		printf '%s,switchboard-it-admin,switchboard-it-admin,"system:masters"\n' "$(openssl rand -hex 32)" >tokens.csv
		rm -f apiserver.csr apiserver.ext ca.srl
	) || { kube_log "openssl failed making $pki"; return 1; }
}

kube_env_file() { # dir url etcd-url: write DIR/env (the exports) and DIR/kubeconfig
	local dir=$1 token
	token="$(cut -d, -f1 "$dir/pki/tokens.csv")"
	cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: switchboard-it
  cluster:
    server: $2
    certificate-authority: $dir/pki/ca.crt
users:
- name: switchboard-it-admin
  user:
    token: $token
contexts:
- name: switchboard-it
  context:
    cluster: switchboard-it
    user: switchboard-it-admin
current-context: switchboard-it
EOF
	cat >"$dir/env" <<EOF
export IT_KUBE_URL=$2
export IT_KUBE_TOKEN=$token
export IT_KUBE_CA=$dir/pki/ca.crt
export IT_KUBE_CONFIG=$dir/kubeconfig
export IT_KUBE_ETCD_URL=$3
export IT_KUBE_DIR=$dir
export IT_KUBE_SCRIPT=$kube_root/integration/kube.sh
EOF
}

kube_start_etcd() { # dir deadline: etcd on two free ports; sets DIR/etcd.url
	local dir=$1 client peer try
	for try in 1 2 3; do
		kube_port client && kube_port peer || return
		kube_launch "$dir" etcd "$kube_bin/etcd" \
			--name=switchboard-it \
			--data-dir="$dir/etcd" \
			--listen-client-urls="http://127.0.0.1:$client" \
			--advertise-client-urls="http://127.0.0.1:$client" \
			--listen-peer-urls="http://127.0.0.1:$peer" \
			--initial-advertise-peer-urls="http://127.0.0.1:$peer" \
			--initial-cluster="switchboard-it=http://127.0.0.1:$peer" \
			--initial-cluster-state=new \
			--unsafe-no-fsync \
			--log-level=warn
		if kube_wait "$dir" etcd "$2" "http://127.0.0.1:$client/health"; then
			echo "http://127.0.0.1:$client" >"$dir/etcd.url"
			return
		fi
		# A port taken between the probe and the bind: try others.
		kube_alive "$(cat "$dir/etcd.pid")" || ! grep -q "address already in use" "$dir/etcd.log" && return 1
		kube_log "etcd: a port was taken meanwhile; retrying ($try)"
		rm -rf "$dir/etcd"
	done
	return 1
}

kube_apiserver_args() { # dir port etcd-url: kube-apiserver's flags, one a line, into DIR/kube-apiserver.args
	local pki="$1/pki"
	# On SIGTERM the apiserver stops listening at once (--shutdown-delay-duration
	# is 0) and calls http.Server.Shutdown, which waits for every connection to
	# go idle, bounded by --request-timeout (60 s). An open watch never goes
	# idle: by default (--shutdown-watch-termination-grace-period=0) the watch
	# handlers are not told about the shutdown and run on until their
	# --min-request-timeout (30-60 min), so one informer held the apiserver
	# for the whole minute (kube_kill's SIGKILL after 15 s, in practice).
	# With a grace period the watch handlers return as soon as shutdown starts
	# (drained at 200/s at least; 2 s is only the upper bound): each watch
	# ends cleanly, so its client watches again (the informers reconnect to
	# the restarted apiserver), and the apiserver exits in about a second.
	printf '%s\n' \
		--etcd-servers="$3" \
		--etcd-prefix=/registry \
		--bind-address=127.0.0.1 \
		--advertise-address=127.0.0.1 \
		--secure-port="$2" \
		--cert-dir="$1/certs" \
		--tls-cert-file="$pki/apiserver.crt" \
		--tls-private-key-file="$pki/apiserver.key" \
		--client-ca-file="$pki/ca.crt" \
		--token-auth-file="$pki/tokens.csv" \
		--authorization-mode=RBAC \
		--service-cluster-ip-range=10.0.0.0/24 \
		--service-account-issuer="https://127.0.0.1:$2" \
		--service-account-key-file="$pki/sa.pub" \
		--service-account-signing-key-file="$pki/sa.key" \
		--endpoint-reconciler-type=none \
		--disable-admission-plugins=ServiceAccount \
		--allow-privileged=true \
		--profiling=false \
		--shutdown-watch-termination-grace-period=2s \
		>"$1/kube-apiserver.args"
}

kube_start_apiserver() { # dir deadline: the apiserver on DIR/kube-apiserver.args' port, until /readyz
	local dir=$1 url args=()
	mapfile -t args <"$dir/kube-apiserver.args"
	url="$(cat "$dir/kube-apiserver.url")"
	kube_launch "$dir" kube-apiserver "$kube_bin/kube-apiserver" "${args[@]}"
	kube_wait "$dir" kube-apiserver "$2" --cacert "$dir/pki/ca.crt" \
		-H "Authorization: Bearer $(cut -d, -f1 "$dir/pki/tokens.csv")" "$url/readyz"
}

kube_start() { # dir: build, start etcd and kube-apiserver, export IT_KUBE_*
	local dir=$1 start deadline port etcd try
	[[ -n "$dir" ]] || { kube_log "kube_start: no directory"; return 1; }
	command -v openssl >/dev/null && command -v curl >/dev/null || {
		kube_log "needs openssl and curl"
		return 1
	}
	kube_build || return
	mkdir -p "$dir" && dir="$(cd "$dir" && pwd)" || return
	kube_pki "$dir" || return
	start=$SECONDS
	deadline=$((SECONDS + ${IT_KUBE_TIMEOUT:-60}))
	kube_start_etcd "$dir" "$deadline" || { kube_stop_procs "$dir"; return 1; }
	etcd="$(cat "$dir/etcd.url")"
	for try in 1 2 3; do
		kube_port port || { kube_stop_procs "$dir"; return 1; }
		echo "https://127.0.0.1:$port" >"$dir/kube-apiserver.url"
		kube_apiserver_args "$dir" "$port" "$etcd"
		kube_start_apiserver "$dir" "$deadline" && break
		if kube_alive "$(cat "$dir/kube-apiserver.pid")" || ! grep -q "address already in use" "$dir/kube-apiserver.log" || ((try == 3)); then
			kube_stop_procs "$dir"
			return 1
		fi
		kube_log "kube-apiserver: port $port was taken meanwhile; retrying"
	done
	kube_env_file "$dir" "https://127.0.0.1:$port" "$etcd"
	# shellcheck disable=SC1091
	. "$dir/env"
	kube_log "kube-apiserver $(kube_version) ready at $IT_KUBE_URL in $((SECONDS - start)) s (etcd $etcd; logs, certs, kubeconfig in $dir)"
}

kube_restart_apiserver() { # dir: stop kube-apiserver and start it again with the same flags
	local dir=$1
	kube_kill "$dir" kube-apiserver 15
	kube_start_apiserver "$dir" $((SECONDS + ${IT_KUBE_TIMEOUT:-60}))
}

kube_stop_procs() { # dir: the apiserver first (it drains 1-3 s), then etcd
	kube_kill "$1" kube-apiserver 15
	kube_kill "$1" etcd 10
}

kube_stop() { # dir: stop both and remove DIR
	local dir=$1
	[[ -d "$dir" && -f "$dir/pki/tokens.csv" ]] || { kube_log "kube_stop: $dir is not a kube.sh directory"; return 1; }
	kube_stop_procs "$dir"
	rm -rf "$dir"
}

# --- the command line ------------------------------------------------------

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
	return 0 # sourced: only the functions
fi
set -euo pipefail

kube_dir_arg() { # [DIR]: the directory, from the argument or $IT_KUBE_DIR
	local dir="${1:-${IT_KUBE_DIR:-}}"
	[[ -n "$dir" ]] || { kube_log "no directory: pass it or set IT_KUBE_DIR (eval \"\$(integration/kube.sh start)\" sets it)"; exit 2; }
	echo "$dir"
}

kube_new_dir() {
	if [[ -n "${IT_KUBE_DIR:-}" && ! -e "$IT_KUBE_DIR/pki" ]]; then
		echo "$IT_KUBE_DIR"
	else
		mktemp -d "${TMPDIR:-/tmp}/switchboard-kube.XXXXXX"
	fi
}

case "${1:-}" in
build)
	kube_build
	;;
start)
	dir="$(kube_new_dir)"
	kube_start "$dir"
	cat "$dir/env"
	kube_log "stop with: integration/kube.sh stop $dir"
	;;
env)
	dir="$(kube_dir_arg "${2:-}")"
	cat "$dir/env"
	;;
restart)
	dir="$(kube_dir_arg "${2:-}")"
	kube_restart_apiserver "$dir"
	;;
stop)
	dir="$(kube_dir_arg "${2:-}")"
	kube_stop "$dir"
	;;
run)
	shift
	[[ $# -gt 0 ]] || { kube_log "run: no command"; exit 2; }
	dir="$(kube_new_dir)"
	trap 'rc=$?; trap - EXIT; if ((rc == 0)) || [[ ! -d "$dir" ]]; then kube_stop "$dir" 2>/dev/null || true; else kube_stop_procs "$dir"; kube_log "failed ($rc): directory kept: $dir"; fi; exit $rc' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	kube_start "$dir"
	"$@"
	;;
*)
	sed -n '2,/^$/{s/^# \{0,1\}//;p}' "$0" | sed -n '1,16p' >&2
	exit 2
	;;
esac
