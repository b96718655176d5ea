#!/usr/bin/env bash
# Runs the black-box integration tests against a whole local stack:
#
#   two simulated engines (cmd/enginesim, vLLM's llm_request spans over OTLP)
#     <- a gateway (cmd/gateway, OTLP traces and metrics)
#     -> the OpenTelemetry Collector running the shipped otel-collector.yaml
#        -> Jaeger (traces)      -> Prometheus 3 (metrics, OTLP receiver;
#                                   it also scrapes the gateway's admin /metrics)
#
# and beside it a Kubernetes control plane, etcd and kube-apiserver, started
# by integration/kube.sh the way envtest does (no kubelet or controllers).
#
# It builds the collector distribution (integration/tools/otelcol), Jaeger
# (integration/tools/jaeger), Prometheus (integration/tools/prometheus), Helm
# (integration/tools/helm, for the chart's tests) and etcd and kube-apiserver
# (integration/tools/kube) from the Go module proxy
# once, cached in .tools/bin (rebuilt only when their tools module changes),
# and the gateway and the simulator from this tree into the run directory.
# The first run takes about 10 minutes for the collector, Jaeger and
# Prometheus, about 10 for Helm (below) and another 10 to 13 for
# kube-apiserver and etcd on 2 cores
# (2.4 GB peak RSS; kube.sh's header has the measurements); with
# everything in .tools/bin the builds cost nothing and the control plane
# starts in about 4 s (kube.sh needs openssl and curl). Every listener gets a free loopback port, so two runs
# on one machine do not clash. It then runs
#
#   go test -count=1 -tags integration "$@" ./integration/
#
# with the stack described by the IT_* variables below, and stops everything
# it started when it exits (also on failure or Ctrl-C; kube-apiserver before
# etcd), printing the end of each log when something failed.
#
#   IT_JAEGER_URL, IT_PROM_URL, IT_GATEWAY_URL, IT_GATEWAY_ADMIN_URL,
#   IT_OTLP_HTTP_URL   http://127.0.0.1:PORT of Jaeger's query API, Prometheus'
#                      API, the gateway's public and admin listeners, the
#                      collector's OTLP/HTTP receiver
#   IT_SERVICE         the gateway's OTEL_SERVICE_NAME (its Prometheus job)
#   IT_ENGINE_SERVICE  the simulators' OTEL_SERVICE_NAME
#   IT_ENGINE_URLS     the simulators' base URLs, comma-separated
#   IT_MODEL           the model they serve (it-model)
#   IT_GATEWAY_BIN, IT_ENGINESIM_BIN, IT_OTELCOL_BIN, IT_JAEGER_BIN,
#   IT_PROM_BIN, IT_HELM_BIN
#                      the binaries
#   IT_ARTIFACTS       where a failed test leaves files to look at (the
#                      console test's screenshots): $run/artifacts
#   IT_CHROMIUM        (optional) the browser for the console test; else
#                      chromium on PATH (Debian's chromium package)
#   IT_KUBE_URL, IT_KUBE_TOKEN, IT_KUBE_CA, IT_KUBE_CONFIG, IT_KUBE_ETCD_URL,
#   IT_KUBE_DIR, IT_KUBE_SCRIPT
#                      the control plane, as integration/kube.sh describes
#                      them: the apiserver's https URL, an admin token, its
#                      CA, a kubeconfig, etcd's URL, its directory (under
#                      the run directory: kube/) and kube.sh itself
#
# Set IT_KEEP=1 to keep the run directory (logs, configs, Prometheus data)
# after a successful run; it is always kept after a failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.tools/bin"
mkdir -p "$bin"

# The stack's children see only the telemetry settings given here.
while read -r v; do unset "$v"; done < <(compgen -e | grep -E '^(OTEL_|SWITCHBOARD_)' || true)

# The Prometheus release pinned in integration/tools/prometheus/go.mod
# (module v0.316.0 is Prometheus 3.16.0), stamped into the binary.
prom_version=3.16.0
prom_ldflags="-X github.com/prometheus/common/version.Version=$prom_version -X github.com/prometheus/common/version.Revision=v0.316.0 -X github.com/prometheus/common/version.Branch=HEAD"

# shellcheck source=tools/build.sh
. "$root/integration/tools/build.sh"
build_tool otelcol "$root/integration/tools/otelcol" .
build_tool jaeger "$root/integration/tools/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger
build_tool prometheus "$root/integration/tools/prometheus" github.com/prometheus/prometheus/cmd/prometheus "$prom_ldflags"
# Helm, for helm_test.go (the chart in deploy/helm); the release pinned in
# integration/tools/helm/go.mod, stamped into `helm version`. A cold build
# (empty Go build cache, modules downloaded) took 9 m 54 s on 2 cores shared
# with other builds (480 CPU-seconds; 1.2 GB left in the build cache); the
# binary is 120 MB.
helm_version="$(awk '$1 == "helm.sh/helm/v4" { print $2; exit }' "$root/integration/tools/helm/go.mod")"
build_tool helm "$root/integration/tools/helm" helm.sh/helm/v4/cmd/helm "-X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
# etcd and kube-apiserver (kube_build, kube_start, kube_stop_procs: the
# processes are this shell's children, their PIDs in $run/kube/*.pid).
# shellcheck source=kube.sh
. "$root/integration/kube.sh"
kube_build

# The Node client test (TestNodeOpenAIClient) needs the pinned openai
# package; install it once from package-lock.json.
if [[ ! -d "$root/integration/node/node_modules" ]] && command -v npm >/dev/null; then
	echo "installing integration/node packages (npm ci)..."
	(cd "$root/integration/node" && npm ci --no-audit --no-fund)
fi

run="$(mktemp -d "${TMPDIR:-/tmp}/switchboard-it.XXXXXX")"
echo "run directory (logs, configs): $run"
(cd "$root" && go build -o "$run/gateway" ./cmd/gateway && go build -o "$run/enginesim" ./cmd/enginesim)

# --- processes -------------------------------------------------------------

names=() pids=()
launch() { # name command...: start it in the background, output to $run/name.log
	local name=$1
	shift
	"$@" >"$run/$name.log" 2>&1 &
	names+=("$name")
	pids+=($!)
}

cleanup() {
	local rc=$? i pid
	trap - EXIT INT TERM
	# The control plane first (started last): kube-apiserver, then etcd.
	if [[ -d "$run/kube" ]]; then
		kube_stop_procs "$run/kube"
	fi
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do # the gateway first, Jaeger last
		kill -TERM "${pids[i]}" 2>/dev/null || true
		for _ in {1..50}; do
			kill -0 "${pids[i]}" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "${pids[i]}" 2>/dev/null || true
		wait "${pids[i]}" 2>/dev/null || true
	done
	if ((rc != 0)); then
		for name in "${names[@]}"; do
			echo "--- $name: last 30 lines of $run/$name.log"
			tail -n 30 "$run/$name.log" || true
		done
		for name in etcd kube-apiserver; do
			[[ -f "$run/kube/$name.log" ]] || continue
			echo "--- $name: last 30 lines of $run/kube/$name.log"
			tail -n 30 "$run/kube/$name.log" || true
		done
		echo "run directory kept: $run"
	elif [[ "${IT_KEEP:-}" == 1 ]]; then
		echo "run directory kept: $run"
	else
		rm -rf "$run"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- free ports ------------------------------------------------------------

declare -A taken=()
port() { # VAR: set VAR to a loopback port nothing listens on and this run has not used
	local p
	for _ in {1..500}; do
		# Below Linux's ephemeral range (32768+), so outgoing connections do not take it meanwhile.
		p=$((20000 + RANDOM % 12000))
		[[ -n "${taken[$p]:-}" ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			taken[$p]=1
			printf -v "$1" '%d' "$p"
			return
		fi
	done
	echo "run.sh: no free port found" >&2
	return 1
}
for v in jaeger_otlp jaeger_http jaeger_grpc otlp_grpc otlp_http col_prom col_telemetry prom sim_a sim_b gw gw_admin; do
	port "$v"
done

# --- readiness -------------------------------------------------------------

ready() { # name url [ok]: poll url until it answers (2xx with ok), while name runs; 60 s at most
	local name=$1 url=$2 flags=(-s -o /dev/null --max-time 2) i pid=
	[[ "${3:-}" == ok ]] && flags+=(-f)
	for i in "${!names[@]}"; do [[ "${names[i]}" == "$name" ]] && pid=${pids[i]}; done
	local deadline=$((SECONDS + 60))
	until curl "${flags[@]}" "$url"; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "run.sh: $name exited before it was ready ($url)" >&2
			return 1
		fi
		if ((SECONDS >= deadline)); then
			echo "run.sh: $name not ready at $url after 60 s" >&2
			return 1
		fi
		sleep 0.1
	done
}

# --- the stack -------------------------------------------------------------

runid="$(date +%s)-$$"
service="switchboard-it-$runid"
engine_service="enginesim-it-$runid"
model=it-model

launch jaeger env \
	JAEGER_OTLP_ENDPOINT="127.0.0.1:$jaeger_otlp" \
	JAEGER_QUERY_HTTP_ENDPOINT="127.0.0.1:$jaeger_http" \
	JAEGER_QUERY_GRPC_ENDPOINT="127.0.0.1:$jaeger_grpc" \
	"$bin/jaeger" --config "$root/integration/jaeger.yaml"

sed "s/@GATEWAY_ADMIN_ADDR@/127.0.0.1:$gw_admin/" "$root/integration/prometheus.yml" >"$run/prometheus.yml"
launch prometheus "$bin/prometheus" \
	--config.file="$run/prometheus.yml" \
	--storage.tsdb.path="$run/prometheus" \
	--storage.tsdb.retention.time=1h \
	--web.listen-address="127.0.0.1:$prom" \
	--web.enable-otlp-receiver \
	--enable-feature=exemplar-storage \
	--log.level=warn

# The collector once its backends listen (it would only retry meanwhile).
ready jaeger "http://127.0.0.1:$jaeger_http/api/services" ok
ready prometheus "http://127.0.0.1:$prom/-/ready" ok
launch otelcol env \
	OTLP_GRPC_ENDPOINT="127.0.0.1:$otlp_grpc" \
	OTLP_HTTP_ENDPOINT="127.0.0.1:$otlp_http" \
	PROMETHEUS_EXPORTER_ENDPOINT="127.0.0.1:$col_prom" \
	OTELCOL_TELEMETRY_HOST=127.0.0.1 \
	OTELCOL_TELEMETRY_PORT="$col_telemetry" \
	JAEGER_OTLP_ENDPOINT="127.0.0.1:$jaeger_otlp" \
	PROMETHEUS_OTLP_ENDPOINT="http://127.0.0.1:$prom/api/v1/otlp" \
	"$bin/otelcol" --config "$root/otel-collector.yaml"

# The simulators export like vLLM: sim-a over OTLP/gRPC (vLLM's default),
# sim-b over OTLP/HTTP (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf).
launch sim-a env OTEL_SERVICE_NAME="$engine_service" OTEL_BSP_SCHEDULE_DELAY=200 \
	"$run/enginesim" --listen "127.0.0.1:$sim_a" --name sim-a --model "$model" --ttft 10ms --itl 5ms \
	--otlp-traces-endpoint "http://127.0.0.1:$otlp_grpc"
launch sim-b env OTEL_SERVICE_NAME="$engine_service" OTEL_BSP_SCHEDULE_DELAY=200 \
	OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf \
	"$run/enginesim" --listen "127.0.0.1:$sim_b" --name sim-b --model "$model" --ttft 10ms --itl 5ms \
	--otlp-traces-endpoint "http://127.0.0.1:$otlp_http/v1/traces"

cat >"$run/gateway.yaml" <<EOF
server:
  listen: "127.0.0.1:$gw"
  shutdown_timeout: 5s
admin:
  listen: "127.0.0.1:$gw_admin"
routing:
  policy: round-robin
engines:
  - name: sim-a
    url: http://127.0.0.1:$sim_a
    models: [$model]
  - name: sim-b
    url: http://127.0.0.1:$sim_b
    models: [$model]
EOF

ready otelcol "http://127.0.0.1:$col_prom/metrics" ok
ready otelcol "http://127.0.0.1:$otlp_http/" # any answer: the receiver listens
ready sim-a "http://127.0.0.1:$sim_a/health" ok
ready sim-b "http://127.0.0.1:$sim_b/health" ok

launch gateway env \
	OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$otlp_http" \
	OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
	OTEL_METRIC_EXPORT_INTERVAL=500 \
	OTEL_BSP_SCHEDULE_DELAY=200 \
	OTEL_SERVICE_NAME="$service" \
	OTEL_RESOURCE_ATTRIBUTES="service.instance.id=$service-0" \
	"$run/gateway" --config "$run/gateway.yaml"
ready gateway "http://127.0.0.1:$gw/ready" ok
ready gateway "http://127.0.0.1:$gw_admin/metrics" ok

# The control plane, once the stack is up: kube_start waits for /readyz and
# exports IT_KUBE_* here (its ports avoid the ones taken above).
kube_start "$run/kube"

export IT_JAEGER_URL="http://127.0.0.1:$jaeger_http"
export IT_PROM_URL="http://127.0.0.1:$prom"
export IT_GATEWAY_URL="http://127.0.0.1:$gw"
export IT_GATEWAY_ADMIN_URL="http://127.0.0.1:$gw_admin"
export IT_OTLP_HTTP_URL="http://127.0.0.1:$otlp_http"
export IT_SERVICE="$service"
export IT_ENGINE_SERVICE="$engine_service"
export IT_ENGINE_URLS="http://127.0.0.1:$sim_a,http://127.0.0.1:$sim_b"
export IT_MODEL="$model"
export IT_GATEWAY_BIN="$run/gateway"
export IT_ENGINESIM_BIN="$run/enginesim"
export IT_OTELCOL_BIN="$bin/otelcol"
export IT_JAEGER_BIN="$bin/jaeger"
export IT_PROM_BIN="$bin/prometheus"
export IT_HELM_BIN="$bin/helm"
export IT_ARTIFACTS="$run/artifacts" # screenshots of a failed browser test (the run directory is kept on failure)
echo "stack ready: gateway $IT_GATEWAY_URL (admin $IT_GATEWAY_ADMIN_URL), Jaeger $IT_JAEGER_URL, Prometheus $IT_PROM_URL, kube-apiserver $IT_KUBE_URL"

cd "$root"
go test -count=1 -tags integration "$@" ./integration/
