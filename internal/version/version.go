// Package version holds Switchboard's version: what `switchboard
// --version` prints, the version of the telemetry's instrumentation scope
// and the one in the User-Agent of Kubernetes discovery.
package version

// Version is Switchboard's version, without a leading "v": "0.1.0". It is
// a variable so that a release build can stamp it:
//
//	go build -ldflags "-X github.com/switchboard-gw/switchboard/internal/version.Version=0.2.0" ./cmd/gateway
var Version = "0.1.0"
