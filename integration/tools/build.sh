# build_tool NAME DIR PACKAGE [LDFLAGS]: go build PACKAGE in the tools module
# DIR into $bin/NAME ($bin must be set, e.g. .tools/bin), once: the binary is
# kept until the module's go.mod, go.sum, Go files or LDFLAGS change (a hash
# of them in $bin/NAME.stamp). Sourced by integration/run.sh and the
# bench/*/run.sh scripts, so they share one stamp per tool and never rebuild
# each other's binaries.
build_tool() {
	local out="$bin/$1" stamp="$bin/$1.stamp" sum
	mkdir -p "$bin"
	sum="$({ cat "$2/go.mod" "$2/go.sum" $(find "$2" -name '*.go'); printf '%s' "${4:-}"; } | sha256sum | cut -d' ' -f1)"
	if [[ -x "$out" && -f "$stamp" && "$(cat "$stamp")" == "$sum" ]]; then
		return
	fi
	echo "building $1 (once, cached in .tools/bin; minutes on 2 cores)..." >&2
	(cd "$2" && go build -trimpath -ldflags "${4:-}" -o "$out.tmp.$$" "$3")
	mv -f "$out.tmp.$$" "$out" # atomic: a concurrent run never sees half a binary
	echo "$sum" >"$stamp"
}
