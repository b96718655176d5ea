package gateway

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/quota"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// clientMode is what the test client does with its request.
type clientMode int

const (
	readAll            clientMode = iota
	cancelInPrefill               // go away once the engine's prefill gauge reads 1
	cancelAfterFirst              // go away after the first content event
	cancelMidStream               // go away after three content events
	slowReader                    // read 64 bytes every 5 ms
	shutdownInPrefill             // read all; the gateway aborts (shutdown deadline) once the prefill gauge reads 1
	shutdownAfterFirst            // read all; the gateway aborts after the first content event
)

// readsAll reports whether the client reads the whole response.
func (m clientMode) readsAll() bool {
	return m == readAll || m == slowReader || m == shutdownInPrefill || m == shutdownAfterFirst
}

// engineSetup is how the case's engine misbehaves at the transport level.
type engineSetup int

const (
	simEngine     engineSetup = iota
	deadEngine                // nothing listens: connection refused
	panicEngine               // the gateway's transport panics after the slot is taken
	blackholeDial             // the dial never completes: connect timeout
	unhealthy                 // the only engine for the model failed its probe
	// Provider engines only (faultOnProvider):
	wrongKey // the gateway holds a key the provider refuses: its 401
	rpmSpent // the provider's one request of the minute is spent: its 429
)

type faultCase struct {
	name      string
	stream    []bool // the modes the case runs in
	setup     engineSetup
	fault     string // X-Enginesim-Fault
	body      string // replaces the request body (bad input)
	maxTokens int
	client    clientMode

	// Expectations; per-mode values are indexed [non-stream, stream].
	status    [2]int // 0: not checked (the client left)
	errType   [2]string
	phase     [2]routing.Phase
	errEvent  bool // stream mode: ends with a data: {"error"} event, no [DONE]
	bodyErr   bool // non-stream mode: the body is cut (connection aborted)
	aborted   bool // the engine saw the request abort (within 1 s)
	observe   bool // the phase lasts long enough for the gauge watcher to see it
	parseErrs int64
	noSlot    bool // rejected before routing: no slot taken, no engine metric

	requestTimeout time.Duration // the gateway's total request timeout; default 5 s
	firstToken     time.Duration // Timeouts.FirstToken; default 1 s
	attempt        time.Duration // Timeouts.Attempt; default 0 (off)
	errCode        string        // the code of the error object or event the client gets, when checked
}

var both = []bool{false, true}
var streamOnly = []bool{true}

func idx(stream bool) int {
	if stream {
		return 1
	}
	return 0
}

// faultMatrix is every fault the gateway must account for exactly.
var faultMatrix = []faultCase{
	{name: "success", stream: both, status: [2]int{200, 200}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, observe: true},
	{name: "connection refused", stream: both, setup: deadEngine, status: [2]int{502, 502}, errType: [2]string{ErrTypeConnect, ErrTypeConnect}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}},
	{name: "connect timeout", stream: both, setup: blackholeDial, status: [2]int{504, 504}, errType: [2]string{ErrTypeConnect, ErrTypeConnect}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}, observe: true},
	{name: "engine 500", stream: both, fault: "status=500", status: [2]int{500, 500}, errType: [2]string{"500", "500"}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}},
	{name: "engine 429", stream: both, fault: "status=429", status: [2]int{429, 429}, errType: [2]string{"429", "429"}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}},
	{name: "close before headers", stream: both, fault: "close-before-headers", status: [2]int{502, 502}, errType: [2]string{ErrTypeEngineDisconnect, ErrTypeEngineDisconnect}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}},
	{name: "close after headers", stream: both, fault: "close-after-headers", status: [2]int{502, 502}, errType: [2]string{ErrTypeEngineDisconnect, ErrTypeEngineDisconnect}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}},
	// A non-streaming body is buffered: an engine that fails before its end
	// gets a 502/504, never a 200 with a cut body.
	{name: "close mid-stream", stream: both, fault: "close-after=3", status: [2]int{502, 200}, errType: [2]string{ErrTypeEngineDisconnect, ErrTypeEngineDisconnect}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, errEvent: true, observe: true},
	{name: "truncated body", stream: both, fault: "truncate", status: [2]int{502, 200}, errType: [2]string{ErrTypeEngineDisconnect, ErrTypeEngineDisconnect}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, errEvent: true, errCode: ErrTypeEngineDisconnect},
	{name: "engine html error", stream: both, fault: "status=502,error-body=html", status: [2]int{502, 502}, errType: [2]string{"502", "502"}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}, errCode: "502"},
	{name: "first token timeout", stream: streamOnly, fault: "stall-after=0", firstToken: 400 * time.Millisecond, status: [2]int{0, 200}, errType: [2]string{"", ErrTypeFirstToken}, phase: [2]routing.Phase{0, routing.PhasePrefill}, errEvent: true, aborted: true, observe: true, errCode: ErrTypeFirstToken},
	{name: "attempt timeout", stream: []bool{false}, fault: "stall-before-headers", attempt: 400 * time.Millisecond, status: [2]int{504}, errType: [2]string{ErrTypeAttemptTimeout}, phase: [2]routing.Phase{routing.PhasePrefill}, aborted: true, observe: true, errCode: ErrTypeAttemptTimeout},
	{name: "shutdown deadline", stream: both, maxTokens: 400, client: shutdownInPrefill, status: [2]int{503, 200}, errType: [2]string{ErrTypeShutdown, ErrTypeShutdown}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, errEvent: true, aborted: true, observe: true, errCode: ErrTypeShutdown},
	{name: "stall before headers", stream: both, fault: "stall-before-headers", requestTimeout: 1500 * time.Millisecond, status: [2]int{504, 504}, errType: [2]string{ErrTypeRequestTimeout, ErrTypeHeaderTimeout}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}, aborted: true, observe: true},
	{name: "stall mid-stream", stream: both, fault: "stall-after=2", status: [2]int{504, 200}, errType: [2]string{ErrTypeIdleTimeout, ErrTypeIdleTimeout}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, errEvent: true, aborted: true, observe: true},
	{name: "slow headers", stream: both, fault: "slow-headers=100ms", status: [2]int{200, 200}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, observe: true},
	{name: "malformed event", stream: streamOnly, fault: "malformed", status: [2]int{0, 200}, phase: [2]routing.Phase{0, routing.PhaseDecode}, parseErrs: 1},
	{name: "trickle", stream: both, fault: "trickle=200us", maxTokens: 3, firstToken: 5 * time.Second, status: [2]int{200, 200}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}, observe: true},
	{name: "keep-alive comments", stream: streamOnly, fault: "keepalive", status: [2]int{0, 200}, phase: [2]routing.Phase{0, routing.PhaseDecode}},
	{name: "client gone before engine headers", stream: both, fault: "stall-before-headers", client: cancelInPrefill, errType: [2]string{ErrTypeClientCancelled, ErrTypeClientCancelled}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}, aborted: true, observe: true},
	{name: "client gone while generating", stream: []bool{false}, maxTokens: 400, client: cancelInPrefill, errType: [2]string{ErrTypeClientCancelled}, phase: [2]routing.Phase{routing.PhasePrefill}, aborted: true, observe: true},
	{name: "client gone after first token", stream: streamOnly, maxTokens: 400, client: cancelAfterFirst, errType: [2]string{"", ErrTypeClientCancelled}, phase: [2]routing.Phase{0, routing.PhaseDecode}, aborted: true, observe: true},
	{name: "client gone mid-stream", stream: streamOnly, maxTokens: 400, client: cancelMidStream, errType: [2]string{"", ErrTypeClientCancelled}, phase: [2]routing.Phase{0, routing.PhaseDecode}, aborted: true, observe: true},
	{name: "slow reader", stream: both, maxTokens: 30, client: slowReader, status: [2]int{200, 200}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhaseDecode}},
	{name: "invalid json", stream: both, body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":%t, x}`, status: [2]int{400, 400}, noSlot: true},
	{name: "missing model", stream: both, body: `{"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, status: [2]int{400, 400}, noSlot: true},
	{name: "unknown model", stream: both, body: `{"model":"nope","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, status: [2]int{404, 404}, noSlot: true},
	{name: "no healthy engine", stream: both, setup: unhealthy, status: [2]int{503, 503}, noSlot: true},
	{name: "panic after slot taken", stream: both, setup: panicEngine, status: [2]int{500, 500}, errType: [2]string{ErrTypePanic, ErrTypePanic}, phase: [2]routing.Phase{routing.PhasePrefill, routing.PhasePrefill}},
}

// panicTransport panics on engine requests (after the attempt has taken its
// slot) and passes probes through.
type panicTransport struct{ next http.RoundTripper }

func (p panicTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost {
		panic("injected transport panic")
	}
	return p.next.RoundTrip(r)
}

// blackholeTransport's dials never complete before the connect timeout.
func blackholeTransport(timeout time.Duration) *http.Transport {
	t := NewTransport(timeout)
	real := t.DialContext
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ctx.Value(probeKey{}) != nil {
			return real(ctx, network, addr)
		}
		select {
		case <-time.After(timeout):
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return t
}

type probeKey struct{}

// faultFraming is a stream framing the fault matrix runs in: a route, its
// request body, and how its client tells content, a clean end and an
// error event apart.
type faultFraming struct {
	name, path string
	body       string // with %t (stream) and %d (max tokens)
	token      string // a content event's marker
	done       string // a clean stream ends with it
	errEvent   string // the final error event starts with it
	anthropic  bool   // errors in Anthropic's envelope
}

var (
	chatFraming = faultFraming{name: "chat", path: "/v1/chat/completions",
		body:  `{"model":"m","stream":%t,"max_tokens":%d,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b c"}]}`,
		token: `"content":"tok`, done: "data: [DONE]\n\n", errEvent: `data: {"error":`}
	responsesFraming = faultFraming{name: "responses", path: "/v1/responses",
		body:  `{"model":"m","stream":%t,"max_output_tokens":%d,"input":"a b c"}`,
		token: `"delta":"tok`, done: "\n\n", errEvent: "event: error\ndata: {\"type\":\"error\""}
	messagesFraming = faultFraming{name: "messages", path: "/v1/messages",
		body:  `{"model":"m","stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"a b c"}]}`,
		token: `"text":"tok`, done: "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", errEvent: "event: error\ndata: {\"type\":\"error\"", anthropic: true}
)

// TestFaultMatrix runs every fault, streaming and non-streaming, with the
// sampler on and off, on chat; and with the sampler on, on the Responses
// API and Anthropic Messages routes (their own stream framings and error
// envelopes; the bad-input cases, written for chat bodies, are left out). After each case: both phase gauges of every engine
// are exactly 0 and were never observed below 0; the slot was released from
// the phase the request was in (prefill before its first token, decode
// after), as observed on the gauges while it was in flight and as reported
// by the release; no attempt is live; goroutines are back to their baseline;
// and the duration histogram went up by exactly one, with the right
// error.type.
func TestFaultMatrix(t *testing.T) {
	run := func(prefix string, fc faultCase, sampler sdktrace.Sampler, fr faultFraming) {
		for _, stream := range fc.stream {
			mode := "non-stream"
			if stream {
				mode = "stream"
			}
			base := goleak.IgnoreCurrent()
			t.Run(prefix+"/"+fc.name+"/"+mode, func(t *testing.T) {
				runFaultCase(t, fc, stream, sampler, fr, noRetries)
			})
			if err := goleak.Find(base); err != nil {
				t.Errorf("%s/%s/%s: goroutines left behind: %v", prefix, fc.name, mode, err)
			}
		}
	}
	for _, sc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"sampled", sdktrace.AlwaysSample()}, {"sampler-off", sdktrace.NeverSample()}} {
		for _, fc := range faultMatrix {
			run(sc.name, fc, sc.sampler, chatFraming)
		}
	}
	for _, fr := range []faultFraming{responsesFraming, messagesFraming} {
		for _, fc := range faultMatrix {
			if fc.body != "" {
				continue
			}
			if fr == responsesFraming && fc.name == "trickle" {
				// The Responses prelude (response.created, in_progress, ...)
				// carries the whole response object, over a KiB per event:
				// one byte per timer tick takes longer than the case's
				// request timeout. The relay is the same as chat's.
				continue
			}
			run(fr.name, fc, sdktrace.AlwaysSample(), fr)
		}
	}
	// With continuation on (the default), a continuable non-streaming
	// request is observed: sent as a stream and reassembled. The same
	// faults on the routes that observe, with the observed expectations.
	// (chatFraming's stream_options would keep a non-streaming chat
	// request from being observed.)
	chat := chatFraming
	chat.body = `{"model":"m","stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"a b c"}]}`
	for _, fr := range []faultFraming{chat, messagesFraming} {
		for _, fc := range faultMatrix {
			ofc, ok := observedCase(fc)
			if !ok {
				continue
			}
			base := goleak.IgnoreCurrent()
			t.Run("observed/"+fr.name+"/"+fc.name, func(t *testing.T) {
				runFaultCase(t, ofc, false, sdktrace.AlwaysSample(), fr, observed)
			})
			if err := goleak.Find(base); err != nil {
				t.Errorf("observed/%s/%s: goroutines left behind: %v", fr.name, fc.name, err)
			}
		}
	}
}

// observedCase returns a fault case's expectations for an observed
// non-streaming request (the observed mode): the non-streaming status and
// error type (a break is not continued, the case's one engine having no
// other to go to: the client gets the break's error status), released from
// decode when content came before the end, as for the stream. ok is false
// for the cases without a non-streaming mode, with a body the case's own
// (bad input: never observed), and for the client or the gateway leaving
// "in prefill" of a generation that has content on its way (its phase at
// that moment is a race with the first token).
func observedCase(fc faultCase) (_ faultCase, ok bool) {
	if !slices.Contains(fc.stream, false) || fc.body != "" || fc.setup == unhealthy {
		return fc, false
	}
	if (fc.client == cancelInPrefill || fc.client == shutdownInPrefill) && fc.fault != "stall-before-headers" {
		return fc, false
	}
	if slices.Contains(fc.stream, true) && fc.phase[1] == routing.PhaseDecode && fc.client.readsAll() {
		fc.phase[0] = routing.PhaseDecode
	}
	return fc, true
}

// TestFaultMatrixWithRetries runs the chat fault matrix again with every
// retry condition on, three attempts allowed and the per-model pending
// count on (it must be back to 0 after every case) (one engine, so each retry
// goes to it again after a 1 ms back-off): a retryable fault makes three
// attempts, each releasing its own slot exactly once from the phase it was
// in and recording its own duration with the fault's error.type; every
// other fault makes exactly one; the client's answer is the same as
// without retries; and every gauge is back to 0.
//
// The "held" run adds first-token-timeout, so every stream is held until
// its first content: a stream that fails before it (no first token in
// time, headers then a dropped connection) has sent nothing and is retried
// too, and a first-token timeout ends in a real 504 instead of an error
// event.
func TestFaultMatrixWithRetries(t *testing.T) {
	for _, rm := range []retryMode{withRetries, withRetriesHeld} {
		for _, fc := range faultMatrix {
			for _, stream := range fc.stream {
				mode := "non-stream"
				if stream {
					mode = "stream"
				}
				name := map[retryMode]string{withRetries: "retries", withRetriesHeld: "held"}[rm] + "/" + fc.name + "/" + mode
				base := goleak.IgnoreCurrent()
				t.Run(name, func(t *testing.T) {
					runFaultCase(t, fc, stream, sdktrace.AlwaysSample(), chatFraming, rm)
				})
				if err := goleak.Find(base); err != nil {
					t.Errorf("%s: goroutines left behind: %v", name, err)
				}
			}
		}
	}
}

// TestFaultMatrixKeyed runs the fault matrix with a key whose limits are
// all set (one request at a time): every exit path gives its lease back
// and settles its reservation exactly once.
func TestFaultMatrixKeyed(t *testing.T) {
	for _, fc := range faultMatrix {
		for _, stream := range fc.stream {
			mode := map[bool]string{false: "non-stream", true: "stream"}[stream]
			base := goleak.IgnoreCurrent()
			t.Run(fc.name+"/"+mode, func(t *testing.T) {
				runFaultCase(t, fc, stream, sdktrace.AlwaysSample(), chatFraming, keyed)
			})
			if err := goleak.Find(base); err != nil {
				t.Errorf("keyed/%s/%s: goroutines left behind: %v", fc.name, mode, err)
			}
		}
	}
}

// assertKeyReleased fails unless key holds nothing: none in flight, and a
// one-at-a-time admission succeeds (the store holds no lease of it).
func assertKeyReleased(t *testing.T, h *harness, key string) {
	t.Helper()
	inFlight := func() int64 {
		for _, k := range h.gw.Keys() {
			if k.Name == key {
				return k.InFlight
			}
		}
		return -1
	}
	testutil.Poll(3*time.Second, func() bool { return inFlight() == 0 })
	if n := inFlight(); n != 0 {
		t.Errorf("key %s: %d in flight after the request ended, want 0", key, n)
	}
	d, err := h.gw.limits.store.Admit(context.Background(), quota.Ask{Key: key, Limits: quota.Limits{Concurrent: 1}, Lease: "check"})
	if err != nil || !d.Allowed {
		t.Errorf("key %s: a one-at-a-time admission after the request ended: %+v, %v; a lease leaked", key, d, err)
		return
	}
	_ = h.gw.limits.store.Release(context.Background(), quota.Release{Key: key, Limits: quota.Limits{Concurrent: 1}, Lease: "check"})
}

// retryMode is how a fault case runs: without retries (the fault matrix),
// with every retry condition on, or with first-token-timeout too (held
// streams).
type retryMode int

const (
	noRetries retryMode = iota
	withRetries
	withRetriesHeld
	// keyed is noRetries with the request sent with an API key that has
	// every limit (concurrency 1), so each exit path must give back its
	// lease and settle its tokens.
	keyed
	// observed is noRetries with continuation on (the default): a
	// non-streaming request is observed. In the other modes continuation
	// is off for a non-streaming request, which goes as it came (the
	// relay of the engine's body).
	observed
)

// retriedAttempts is how many attempts a fault case makes with every retry
// condition on and maxAttempts allowed: maxAttempts when the fault happens
// before the response is committed and is a retry condition (connect
// failure, the engine's 429/500/502, a reset before headers, no headers in
// time), else 1.
//
// On a provider engine: a refused key (the gateway's 502) is retried; a
// 429 backs the provider's only engine off, leaving none to retry on.
func retriedAttempts(fc faultCase, stream bool, maxAttempts int, rm retryMode, kind faultEngineKind) int {
	if fc.setup == wrongKey {
		return 1 // the only engine: its key would be refused again
	}
	if kind == faultOnProvider && fc.setup == rpmSpent {
		// The provider's Retry-After (the rest of its minute) is past
		// retry_after_cap: not retried. A 429 without one backs the
		// provider off for 1 s, which the retry waits out (plan.retry).
		return 1
	}
	switch fc.errType[idx(stream)] {
	case ErrTypeConnect, "429", "500", "502", "503", "504", ErrTypeHeaderTimeout:
		return maxAttempts
	}
	if fc.fault == "close-before-headers" {
		return maxAttempts
	}
	if rm == withRetriesHeld && stream && (fc.errType[1] == ErrTypeFirstToken || fc.fault == "close-after-headers") {
		return maxAttempts // nothing was sent: the stream was held
	}
	return 1
}

// faultEngineKind is the kind of engine a fault case's one engine is.
type faultEngineKind int

const (
	// faultOnSelfHosted: a self-hosted (vLLM) engine simulator over plain
	// HTTP/1.1.
	faultOnSelfHosted faultEngineKind = iota
	// faultOnProvider: an OpenAI provider simulator over TLS with HTTP/2
	// (faultProvider), configured as a provider engine.
	faultOnProvider
)

func runFaultCase(t *testing.T, fc faultCase, stream bool, sampler sdktrace.Sampler, fr faultFraming, rm retryMode) {
	runFaultCaseOn(t, fc, stream, sampler, fr, rm, faultOnSelfHosted)
}

// runFaultCaseOn runs a fault case in mode rm on an engine of kind.
func runFaultCaseOn(t *testing.T, fc faultCase, stream bool, sampler sdktrace.Sampler, fr faultFraming, rm retryMode, kind faultEngineKind) {
	retries := rm == withRetries || rm == withRetriesHeld
	if rm == withRetriesHeld && stream && fc.errType[1] == ErrTypeFirstToken {
		// Nothing reached the client: a real status, no error event.
		fc.status[1], fc.errEvent = http.StatusGatewayTimeout, false
	}
	i := idx(stream)
	simCfg := enginesim.Config{Models: []string{"m"}, TTFT: 30 * time.Millisecond, ITL: 15 * time.Millisecond, OutputTokens: 8}
	var simEng *enginesim.Engine
	var ec fleet.EngineConfig
	var opts []Option
	if kind == faultOnProvider {
		simEng, ec = faultProvider(t, fc, simCfg)
	} else {
		var simSrv *httptest.Server
		simEng, simSrv = sim(t, simCfg)
		url := simSrv.URL
		switch fc.setup {
		case deadEngine:
			url = testutil.RefusedURL
		case panicEngine:
			tr := NewTransport(time.Second)
			t.Cleanup(tr.CloseIdleConnections)
			opts = append(opts, WithTransport(panicTransport{tr}))
		case blackholeDial:
			tr := blackholeTransport(150 * time.Millisecond)
			t.Cleanup(tr.CloseIdleConnections)
			opts = append(opts, WithTransport(tr))
		case wrongKey, rpmSpent:
			t.Fatalf("case %q needs a provider engine", fc.name)
		}
		ec = fleet.EngineConfig{Name: "e1", URL: url, Models: []string{"m"}}
	}
	cfg := testConfig(ec)
	cfg.Timeouts.ResponseHeader = 300 * time.Millisecond
	cfg.Timeouts.Idle = 300 * time.Millisecond
	cfg.Timeouts.Request = 5 * time.Second
	if fc.requestTimeout > 0 {
		cfg.Timeouts.Request = fc.requestTimeout
	}
	cfg.Timeouts.FirstToken = cmp.Or(fc.firstToken, time.Second)
	cfg.Timeouts.Attempt = fc.attempt
	cfg.MaxAttempts = 1
	if !stream && rm != observed {
		cfg.Migration.Limit = 0 // not observed: the engine's body is relayed
	}
	attempts := 1
	if retries {
		cfg.MaxAttempts = 3
		cfg.Retry.On = []string{"connect-failure", "reset", "header-timeout", "429", "500", "502", "503", "504"}
		if rm == withRetriesHeld {
			cfg.Retry.On = append(cfg.Retry.On, "first-token-timeout")
		}
		cfg.Retry.Backoff = time.Millisecond
		cfg.MaxPendingPerModel = 1000 // counted on every path, never reached
		attempts = retriedAttempts(fc, stream, cfg.MaxAttempts, rm, kind)
	}
	if rm == keyed {
		cfg.Auth = AuthConfig{Keys: []KeyConfig{{Name: "team-1", SHA256: sha("k-1"), Models: []string{"*"},
			Limits: KeyLimits{RequestsPerMinute: 1000, TokensPerMinute: 1 << 20, Concurrent: 1}}}}
	}
	h := newHarnessWith(t, cfg, opts, withSampler(sampler), withoutStart())
	if fc.setup == unhealthy {
		simEng.SetHealthy(false)
		h.gw.Fleet().ProbeNow(context.Background())
	}

	var relMu sync.Mutex
	var released []routing.Phase
	h.gw.onRelease = func(_ string, p routing.Phase) {
		relMu.Lock()
		released = append(released, p)
		relMu.Unlock()
	}

	// The watcher reads the gauges through the ManualReader all along.
	var maxPrefill, maxDecode int64
	var negative []string
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopWatcher := func() { stopOnce.Do(func() { close(stop) }) }
	watched := make(chan struct{})
	// A case that fails early (t.Fatal) must not leave the watcher
	// reading the gauges after the test has ended.
	t.Cleanup(func() { stopWatcher(); <-watched })
	var gaugeMu sync.Mutex
	go func() {
		defer close(watched)
		for {
			g := h.gauges()
			gaugeMu.Lock()
			for k, v := range g {
				if v < 0 {
					negative = append(negative, fmt.Sprintf("%s=%d", k, v))
				}
			}
			maxPrefill = max(maxPrefill, g["e1/prefill"])
			maxDecode = max(maxDecode, g["e1/decode"])
			gaugeMu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	prefillSeen := func() bool {
		gaugeMu.Lock()
		defer gaugeMu.Unlock()
		return maxPrefill >= 1
	}

	maxTokens := fc.maxTokens
	if maxTokens == 0 {
		maxTokens = 6
	}
	body := fmt.Sprintf(fr.body, stream, maxTokens)
	if fc.body != "" {
		body = fmt.Sprintf(fc.body, stream)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+fr.path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if fc.fault != "" {
		req.Header.Set(enginesim.FaultHeader, fc.fault)
	}
	if rm == keyed {
		req.Header.Set("Authorization", "Bearer k-1")
	}
	abortedBefore := simEng.Stats().Aborted
	var cancelledAt time.Time
	goAway := func() {
		cancelledAt = time.Now()
		cancel()
	}
	shutdown := func() {
		cancelledAt = time.Now()
		h.gw.Abort()
	}
	inPrefill := map[clientMode]func(){cancelInPrefill: goAway, shutdownInPrefill: shutdown}[fc.client]
	if fc.client == shutdownInPrefill && stream {
		inPrefill = nil // a stream is aborted after its first token (readClient)
	}
	if inPrefill != nil {
		go func() {
			testutil.Poll(3*time.Second, prefillSeen)
			time.Sleep(20 * time.Millisecond)
			inPrefill()
		}()
	}
	resp, err := h.client.Do(req)
	var got bytes.Buffer
	var readErr error
	if err == nil {
		mode := fc.client
		if mode == shutdownInPrefill && stream {
			mode = shutdownAfterFirst
		}
		decodeSeen := func() {
			// Let the watcher see the decode phase before the client or
			// the gateway ends it (bounded: a case that never decodes
			// fails on its phase checks instead).
			testutil.Poll(time.Second, func() bool {
				gaugeMu.Lock()
				defer gaugeMu.Unlock()
				return maxDecode >= 1
			})
		}
		readErr = readClient(resp, mode, fr.token, &got, decodeSeen, goAway, shutdown)
		resp.Body.Close()
	}
	switch {
	case fc.client.readsAll():
		if err != nil {
			t.Fatalf("request failed: %v", err)
		}
		if resp.StatusCode != fc.status[i] {
			t.Fatalf("status %d, want %d (body %q)", resp.StatusCode, fc.status[i], got.String())
		}
	case err == nil && !errors.Is(readErr, context.Canceled) && fc.client != cancelInPrefill:
		t.Fatalf("client did not go away: read error %v", readErr)
	}

	// What the client saw.
	reads := fc.client.readsAll() && fc.client != slowReader
	if reads && stream && fc.status[i] == 200 {
		g := got.String()
		ends := strings.HasSuffix(g, fr.done)
		if fr == responsesFraming {
			ends = strings.Contains(g, "event: response.completed\n")
		}
		hasErr := strings.Contains(g, fr.errEvent)
		if fc.errEvent && (ends || !hasErr || !strings.HasSuffix(g, "}}\n\n")) {
			t.Errorf("want a final error event and no end event, got %q", tail(g))
		}
		if !fc.errEvent && (!ends || hasErr) {
			t.Errorf("want a clean stream ending in %q, got %q", fr.done, tail(g))
		}
	}
	if reads && !stream && fc.status[i] == 200 {
		if fc.bodyErr && readErr == nil {
			t.Errorf("non-stream body was cut but the client saw a clean end: %q", got.String())
		}
		if !fc.bodyErr && readErr != nil {
			t.Errorf("body read error %v", readErr)
		}
	}
	if reads && fc.status[i] >= 400 && fr.anthropic {
		var e anthropicErr
		if err := json.Unmarshal(got.Bytes(), &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
			t.Errorf("error body is not an Anthropic error object: %q", got.Bytes())
		}
	}
	if reads && fc.status[i] >= 400 && !fr.anthropic {
		var e apiErr
		if err := json.Unmarshal(got.Bytes(), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("error body is not an OpenAI error object: %q", got.Bytes())
		} else if fc.errCode != "" && fmt.Sprint(e.Error.Code) != fc.errCode {
			t.Errorf("error code %v, want %s", e.Error.Code, fc.errCode)
		}
	}
	if reads && stream && fc.status[i] == 200 && fc.errEvent && fc.errCode != "" && !fr.anthropic {
		last := got.String()
		last = last[strings.LastIndex(strings.TrimSuffix(last, "\n\n"), "\n\n")+2:]
		last = strings.TrimPrefix(last, "event: error\n")
		var e apiErr
		if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(last), "data: ")), &e); err != nil || fmt.Sprint(e.Error.Code) != fc.errCode {
			t.Errorf("final event %q, want an error event with code %s", last, fc.errCode)
		}
	}

	// The engine saw the request go away, within 1 s.
	if fc.aborted {
		testutil.Poll(2*time.Second, func() bool {
			n := simEng.Stats().Aborted
			return n != abortedBefore && n >= abortedBefore+int64(attempts)
		})
		if simEng.Stats().Aborted != abortedBefore+int64(attempts) {
			t.Errorf("engine aborted %d requests, want %d", simEng.Stats().Aborted-abortedBefore, attempts)
		} else if !cancelledAt.IsZero() {
			if d := time.Since(cancelledAt); d > time.Second {
				t.Errorf("engine saw the cancellation %v after the client left, want < 1s", d)
			}
		}
	}

	h.waitIdle()
	if rm == keyed {
		assertKeyReleased(t, h, "team-1")
	}
	stopWatcher()
	<-watched
	if len(negative) > 0 {
		t.Errorf("gauges observed below zero: %v", negative)
	}
	if fc.noSlot {
		relMu.Lock()
		defer relMu.Unlock()
		if len(released) != 0 || maxPrefill != 0 || maxDecode != 0 {
			t.Errorf("bad input took a slot: releases %v, max prefill %d, decode %d", released, maxPrefill, maxDecode)
		}
		if et := h.errorTypes(); len(et) != 0 {
			t.Errorf("bad input recorded engine durations %v", et)
		}
		if n := simEng.Stats().Received; n != 0 {
			t.Errorf("bad input reached the engine (%d requests)", n)
		}
		return
	}
	relMu.Lock()
	if len(released) != attempts || slices.ContainsFunc(released, func(p routing.Phase) bool { return p != fc.phase[i] }) {
		t.Errorf("released from %v, want exactly %d release(s), each from %v", released, attempts, fc.phase[i])
	}
	relMu.Unlock()
	if fc.observe {
		switch fc.phase[i] {
		case routing.PhasePrefill:
			if maxPrefill != 1 || maxDecode != 0 {
				t.Errorf("observed max prefill %d, decode %d; want 1 and 0", maxPrefill, maxDecode)
			}
		case routing.PhaseDecode:
			if maxDecode != 1 {
				t.Errorf("observed max decode %d, want 1", maxDecode)
			}
		}
	}
	et := h.errorTypes()
	if len(et) != 1 || et[fc.errType[i]] != uint64(attempts) {
		t.Errorf("request.duration by error.type %v, want exactly %d %q", et, attempts, fc.errType[i])
	}
	if retries {
		if n := h.gw.pendingFor("m").Load(); n != 0 {
			t.Errorf("pending count of m = %d after the request ended, want 0", n)
		}
		if n := h.counter(telemetry.RetriesName); n != int64(attempts-1) {
			t.Errorf("%s = %d, want %d", telemetry.RetriesName, n, attempts-1)
		}
	}
	if fc.parseErrs > 0 {
		if n := h.counter(telemetry.ParseErrorsName); n != fc.parseErrs {
			t.Errorf("parse errors %d, want %d", n, fc.parseErrs)
		}
	}
	if fc.errType[i] == ErrTypeClientCancelled && simEng.Stats().Received != 1 {
		t.Errorf("engine received %d requests, want 1 (no retry after the client left)", simEng.Stats().Received)
	}
}

// readClient reads the response as the case's client would; shutdown is
// the gateway's abort at the shutdown deadline.
func readClient(resp *http.Response, mode clientMode, token string, out *bytes.Buffer, decodeSeen, goAway, shutdown func()) error {
	switch mode {
	case shutdownAfterFirst:
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			out.WriteString(line)
			if strings.Contains(line, token) {
				decodeSeen()
				shutdown()
				_, err = io.Copy(out, br)
				return err
			}
			if err != nil {
				return err
			}
		}
	case cancelAfterFirst, cancelMidStream:
		want := 1
		if mode == cancelMidStream {
			want = 3
		}
		br := bufio.NewReader(resp.Body)
		seen := 0
		for {
			line, err := br.ReadString('\n')
			out.WriteString(line)
			if strings.Contains(line, token) {
				seen++
				if seen == want {
					decodeSeen()
					goAway()
					_, err = io.Copy(out, br)
					return err
				}
			}
			if err != nil {
				return err
			}
		}
	case slowReader:
		buf := make([]byte, 64)
		for {
			n, err := resp.Body.Read(buf)
			out.Write(buf[:n])
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	_, err := io.Copy(out, resp.Body)
	return err
}

func tail(s string) string {
	if len(s) > 300 {
		return "..." + s[len(s)-300:]
	}
	return s
}
