// Package integration holds Switchboard's black-box tests (build tag
// `integration`): the real gateway and engine simulator binaries, run as
// separate processes, exporting over OTLP to a collector.
//
// By default the collector is an in-test OTLP/HTTP receiver that decodes
// what the gateway exports. Set IT_GATEWAY_ENV to extra
// KEY=VALUE pairs (comma-separated) to point the gateway somewhere else,
// for example at a real OpenTelemetry Collector running otel-collector.yaml.
//
//	go test -tags integration ./integration/
package integration
