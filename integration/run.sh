#!/usr/bin/env bash
# Runs the black-box integration tests: builds (once, cached in .tools/) the
# OpenTelemetry Collector distribution in integration/tools/otelcol and the
# Jaeger release pinned in integration/tools/jaeger, both from the Go module
# proxy, then runs `go test -tags integration ./integration/` with them.
# The first run builds for a few minutes; later runs reuse the binaries.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.tools/bin"
mkdir -p "$bin"

build() { # name dir package
	local out="$bin/$1" stamp="$bin/$1.stamp" sum
	sum="$(cat "$2/go.mod" "$2/go.sum" $(find "$2" -name '*.go') | sha256sum | cut -d' ' -f1)"
	if [[ -x "$out" && -f "$stamp" && "$(cat "$stamp")" == "$sum" ]]; then
		return
	fi
	echo "building $1 (cached in .tools/bin afterwards)..."
	(cd "$2" && go build -o "$out" "$3")
	echo "$sum" >"$stamp"
}
build otelcol "$root/integration/tools/otelcol" .
build jaeger "$root/integration/tools/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger

# The Node client test (TestNodeOpenAIClient) needs the pinned openai
# package; install it once from package-lock.json.
if [[ ! -d "$root/integration/node/node_modules" ]] && command -v npm >/dev/null; then
	echo "installing integration/node packages (npm ci)..."
	(cd "$root/integration/node" && npm ci --no-audit --no-fund)
fi

export IT_OTELCOL_BIN="$bin/otelcol"
export IT_JAEGER_BIN="$bin/jaeger"
cd "$root"
exec go test -count=1 -tags integration "$@" ./integration/
