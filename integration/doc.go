// Package integration holds Switchboard's black-box tests (build tag
// `integration`): the real gateway and engine simulator binaries, run as
// separate processes, exporting over OTLP.
//
// integration/run.sh starts a whole stack and runs them all: two engine
// simulators (with vLLM's llm_request spans), a gateway, the OpenTelemetry
// Collector running the repository's otel-collector.yaml, Jaeger and
// Prometheus 3, each on a free loopback port, described to the tests by
// IT_* variables (see run.sh). The tests on that stack (collector_test.go,
// dashboard_test.go) read traces back from Jaeger's query API and metrics
// from Prometheus' HTTP API, and skip when the variables are not set.
//
//	./integration/run.sh                 # everything
//	./integration/run.sh -run TestTrace  # go test flags are passed on
//
// The other tests need only the binaries (built from the tree, or taken
// from IT_GATEWAY_BIN and IT_ENGINESIM_BIN) and an in-test OTLP/HTTP
// receiver that decodes what the gateway exports, so a plain
//
//	go test -tags integration ./integration/
//
// runs them too. Set IT_GATEWAY_ENV to extra KEY=VALUE pairs
// (comma-separated) to add to their gateway's environment.
package integration
