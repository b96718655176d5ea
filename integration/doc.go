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
//
// kvevents_test.go runs two gateway replicas over two simulators that
// publish vLLM's KV-cache events: a prefix sent through one replica is
// routed to the same engine by the other, which learned it from the
// engine's events alone (precise-prefix; prefix-aware for contrast).
//
// The API keys' limits tests (limits_test.go: two gateway processes
// sharing one Redis, and Redis stopped or hung mid-run) also need Debian's
// redis-server on PATH: internal/redistest starts a private one per test
// and fails the test, rather than skipping it, without it.
//
// console_test.go opens the operator console in headless Chromium
// (Debian's chromium, or IT_CHROMIUM; driven by chromedp) on two gateway
// replicas over the stack's simulators and a private Redis, and fails
// without a browser; a failing run leaves screenshots in IT_ARTIFACTS.
//
// # A real Kubernetes control plane for tests
//
// integration/kube.sh builds etcd and kube-apiserver from the Go module proxy
// at the versions pinned in integration/tools/kube/go.mod (a module of its
// own; update.sh there regenerates it), caches them in .tools/bin (rebuilt
// only when that module changes; the first build takes several minutes and
// about 2.4 GB of RAM, see kube.sh), and starts them the way
// controller-runtime's envtest does: on free loopback ports, with a CA, a
// serving certificate, service-account keys and an admin token made with
// openssl in a temporary directory, RBAC on, and no kubelet, controller
// manager or scheduler. Tests create and edit EndpointSlices themselves, and
// each makes its own namespace (a deleted one stays Terminating). kube.sh
// waits for /readyz, describes the server with IT_KUBE_URL, IT_KUBE_TOKEN,
// IT_KUBE_CA and IT_KUBE_CONFIG (a kubeconfig), and stops the processes by
// PID, kube-apiserver before etcd:
//
//	integration/kube.sh run go test -count=1 -tags integration -run TestKube ./integration/
//
//	eval "$(integration/kube.sh start)"  # or, for a shell session
//	go test -count=1 -tags integration -run TestKube ./integration/
//	integration/kube.sh restart          # kube-apiserver only, same port
//	integration/kube.sh stop
//
// run.sh starts it for the whole suite. The tests on it (kube_test.go,
// kube_discovery_test.go: EndpointSlice discovery with the gateway binary
// under the shipped Role, the KV-event ports of the slices included; manifests_test.go: server-side dry-run of
// deploy/kubernetes; helm_test.go: the same for the Helm chart
// deploy/helm/switchboard, rendered by the Helm that run.sh builds from
// integration/tools/helm, IT_HELM_BIN) skip when those variables are not
// set. helm_test.go's lint, schema and agreement tests (the chart's
// defaults against deploy/kubernetes/base) need only IT_HELM_BIN.
package integration
