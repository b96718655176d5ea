package gateway

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
)

// faultProviderKey is the key of the fault matrix's provider simulator.
const faultProviderKey = "sk-fault-matrix-5d2e90c1"

// providerFaultCases are the cases only a provider engine has: the
// provider refusing the gateway's key (its 401: the client gets the
// gateway's 502 provider_auth_failed, never the provider's body), and its
// requests-per-minute limit spent (its 429, passed through with its own
// body).
var providerFaultCases = []faultCase{
	{name: "provider 401", stream: both, setup: wrongKey, status: [2]int{502, 502}, errType: [2]string{"401", "401"}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}, errCode: "provider_auth_failed"},
	{name: "provider 429", stream: both, setup: rpmSpent, status: [2]int{429, 429}, errType: [2]string{"429", "429"}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}, errCode: "provider_rate_limited"},
}

// providerFaultMatrix is the fault matrix a provider engine runs: every
// case of faultMatrix but those whose setup a provider does not have (the
// gateway's shared transport, panicking or never dialling, is not the one
// a provider engine uses; a provider is never probed, so never
// unhealthy), and the provider's own cases.
func providerFaultMatrix() []faultCase {
	var out []faultCase
	for _, fc := range faultMatrix {
		switch fc.setup {
		case panicEngine, blackholeDial, unhealthy:
			continue
		}
		out = append(out, fc)
	}
	return append(out, providerFaultCases...)
}

// faultProvider starts the fault case's engine as a hosted provider: an
// OpenAI provider simulator with simCfg's timings, served over TLS with
// HTTP/2 (startProvider), and the provider engine "e1" that reaches it
// (base URL with /v1, its CA, its key, model m). The case's setup may
// break it: nothing listening (deadEngine), a key the provider refuses
// (wrongKey), or its one request of the minute spent by another client
// (rpmSpent).
func faultProvider(t *testing.T, fc faultCase, simCfg enginesim.Config) (*enginesim.Engine, fleet.EngineConfig) {
	t.Helper()
	rpm := 0
	if fc.setup == rpmSpent {
		rpm = 1
	}
	p := startProvider(t, enginesim.ProviderOpenAI, faultProviderKey, nil, rpm, func(c *enginesim.Config) {
		c.Models, c.TTFT, c.ITL, c.OutputTokens = simCfg.Models, simCfg.TTFT, simCfg.ITL, simCfg.OutputTokens
	})
	ec := p.openAI("e1", faultProviderKey)
	switch fc.setup {
	case deadEngine:
		ec.URL = "https://" + testutil.RefusedAddr + "/v1"
	case wrongKey:
		ec.APIKey = "sk-not-the-providers-key"
	case rpmSpent:
		p.spendMinute(t, faultProviderKey)
	case simEngine:
	default:
		t.Fatalf("case %q: setup %d has no provider form", fc.name, fc.setup)
	}
	return p.eng, ec
}

// providerFaultBugs are the provider matrix's subtests that fail on a
// gateway bug, by subtest name, with the bug; remove an entry with its fix.
var providerFaultBugs = map[string]string{}

// TestFaultMatrixProvider runs the fault matrix, streaming and not, on
// chat, with the case's one engine a hosted provider (an OpenAI provider
// simulator over TLS and HTTP/2, the fault sent in the client's
// X-Enginesim-Fault header, which reaches it), and the provider's own
// faults (its 401 and 429), once without retries and once with every
// retry condition on (retriedAttempts: a refused key is retried, a 429
// is not, its back-off leaving no engine): every leg releases its slot
// exactly once from the phase it was in, no gauge is ever seen below 0,
// all are 0 at the end with no attempt live, each leg records its
// duration with the fault's error.type, and the client gets the case's
// status and error envelope, as on a self-hosted engine.
func TestFaultMatrixProvider(t *testing.T) {
	for _, rm := range []retryMode{noRetries, withRetries} {
		for _, fc := range providerFaultMatrix() {
			for _, stream := range fc.stream {
				name := map[retryMode]string{noRetries: "once", withRetries: "retries"}[rm] + "/" + fc.name + "/" +
					map[bool]string{false: "non-stream", true: "stream"}[stream]
				base := goleak.IgnoreCurrent()
				t.Run(name, func(t *testing.T) {
					if bug, ok := providerFaultBugs[name]; ok {
						t.Skip("known gateway bug: " + bug)
					}
					runFaultCaseOn(t, fc, stream, sdktrace.AlwaysSample(), chatFraming, rm, faultOnProvider)
				})
				if err := goleak.Find(base); err != nil {
					t.Errorf("provider/%s: goroutines left behind: %v", name, err)
				}
			}
		}
	}
}
