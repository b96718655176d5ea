package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// The soak (docs/cases.md L01): a million requests through the gateway with
// every fast fault mixed in, and the proof that nothing per request outlives
// the request: the gauges read 0, no attempt is live, every attempt was
// recorded once, and the heap after a forced GC does not grow with volume.

// soakOutcome is what the soak client saw for one request.
type soakOutcome int

const (
	outDone      soakOutcome = iota // 200 stream ending in data: [DONE]
	outErrEvent                     // 200 stream ending in a data: {"error":...} event
	outStreamCut                    // 200 stream ending otherwise (read error, bare EOF)
	outNotWhole                     // 200 stream ending in data: [DONE] without the whole answer (soakKind.answer)
	outOK                           // 200 non-stream, whole body
	outCut                          // 200 non-stream, body cut (read error)
	outCancelled                    // the client cancelled after the first content event
	out400
	out404
	out429
	out500
	out502
	out503
	out504
	outOtherStatus
	outTransportErr // the client got no response at all
	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	outDone: "200 [DONE]", outErrEvent: "200 error event", outStreamCut: "200 stream cut", outNotWhole: "200 [DONE], answer not whole",
	outOK: "200 body", outCut: "200 body cut", outCancelled: "client cancelled",
	out400: "400", out404: "404", out429: "429", out500: "500", out502: "502", out503: "503",
	out504: "504", outOtherStatus: "other status", outTransportErr: "transport error",
}

func statusOutcome(code int) soakOutcome {
	switch code {
	case 400:
		return out400
	case 404:
		return out404
	case 429:
		return out429
	case 500:
		return out500
	case 502:
		return out502
	case 503:
		return out503
	case 504:
		return out504
	}
	return outOtherStatus
}

// soakKind is one kind of request in the mix.
type soakKind struct {
	name     string
	weight   int    // in the schedule of sum(weight) slots
	path     string // "" = /v1/chat/completions
	stream   bool
	fault    string // X-Enginesim-Fault; "" sends no header
	body     string // "" = a generated body for path and stream
	cancel   bool   // the client cancels after the first content event
	want     soakOutcome
	errType  string // expected error.type on request.duration; noAttempt when no engine is reached
	parseErr bool   // one stream parse error expected
	// retry is the retry condition its every attempt ends with before
	// anything reached the client (retryNone: it fails after, or not at
	// all). The fault is sent again on every attempt, so a request whose
	// condition is in retry.on makes Config.MaxAttempts attempts, unless
	// the retry budget refuses its first retry (then one).
	retry retryReason
	// cont is the failure kind (MigrationConfig.On) of a break after the
	// first tokens reached the client, which the gateway continues on
	// another engine ("" for none): one continuation leg, one more
	// attempt, which carries the client's headers and so the same fault.
	// rescued: the leg finishes the answer (switchboard.request.migrations
	// {cont, rescued}; the leg's attempt succeeds); else it breaks the
	// same way, with errType, and migration.limit (1) ends the stream with
	// the error event (migrations {cont, failed} and {cont, limit}).
	cont    string
	rescued bool
	// answer, when set, is the number of content tokens of the whole
	// answer a stream ending in [DONE] must carry: tok0 .. tok<answer-1>
	// each once and in order, one finish_reason, the usage of that many
	// completion tokens (wholeAnswer); else it is outNotWhole.
	answer int
}

const noAttempt = "-"

// soakKinds is the request mix. Fast outcomes dominate; the faults that
// need a gateway timeout to fire (stall-*) are a few per thousand so the
// timeout paths are soaked without dominating the wall time. Every engine
// fault of the fault matrix that enginesim can inject per request is here;
// connection refused, connect timeout and the transport panic need a
// different engine setup and are covered by TestFaultMatrix. Continuation
// (on by default) is soaked both ways: a stream broken mid-answer by an
// -after fault (close-after, stall-after) is continued, and its leg,
// which carries the same fault, breaks again (failed, then limit: the
// error event); one broken by an -at fault (cut-at, reset-at, stall-at:
// at the answer's content token N, which a continuation resuming at N
// passes) is continued and rescued: the client gets the whole answer,
// which the soak checks (answer). A continuable non-streaming request is
// observed (read as a stream) and continued the same way; its client gets
// the error status when the continuation breaks too.
var soakKinds = []soakKind{
	{name: "chat stream ok", weight: 300, stream: true, want: outDone, answer: 4},
	{name: "chat non-stream ok", weight: 200, want: outOK},
	{name: "completions stream ok", weight: 40, path: "/v1/completions", stream: true, want: outDone, answer: 4},
	{name: "completions non-stream ok", weight: 30, path: "/v1/completions", want: outOK},
	{name: "embeddings ok", weight: 20, path: "/v1/embeddings", want: outOK},
	{name: "chat stream reasoning+tool-call", weight: 20, stream: true, fault: "reasoning=2,tool-call", want: outDone},
	{name: "status=500 stream", weight: 20, stream: true, fault: "status=500", want: out500, errType: "500", retry: retry500},
	{name: "status=500 non-stream", weight: 20, fault: "status=500", want: out500, errType: "500", retry: retry500},
	{name: "status=429 stream", weight: 15, stream: true, fault: "status=429", want: out429, errType: "429", retry: retry429},
	{name: "status=429 non-stream", weight: 15, fault: "status=429", want: out429, errType: "429", retry: retry429},
	{name: "close-before-headers stream", weight: 15, stream: true, fault: "close-before-headers", want: out502, errType: ErrTypeEngineDisconnect, retry: retryReset},
	{name: "close-before-headers non-stream", weight: 15, fault: "close-before-headers", want: out502, errType: ErrTypeEngineDisconnect, retry: retryReset},
	{name: "close-after-headers stream", weight: 15, stream: true, fault: "close-after-headers", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "close-after-headers non-stream", weight: 15, fault: "close-after-headers", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "close-after=2 stream", weight: 20, stream: true, fault: "close-after=2", want: outErrEvent, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect},
	{name: "close-after=2 non-stream", weight: 15, fault: "close-after=2", want: out502, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect},
	// The first leg breaks at content token 3 (2 for reset-at), the
	// continuation resumes there and passes: the client gets the whole
	// answer, rescued.
	{name: "cut-at=3 stream rescued", weight: 20, stream: true, fault: "cut-at=3", want: outDone, answer: 4, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect, rescued: true},
	{name: "reset-at=2 completions stream rescued", weight: 10, path: "/v1/completions", stream: true, fault: "reset-at=2", want: outDone, answer: 4, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect, rescued: true},
	// Non-streaming answers (read as a stream, so that they can be
	// continued) broken the same way: one whole body, on the routes whose
	// continuation goes through the new engine's /tokenize too.
	{name: "cut-at=3 non-stream rescued", weight: 10, fault: "cut-at=3", want: outOK, answer: 4, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect, rescued: true},
	{name: "cut-at=3 responses non-stream rescued", weight: 5, path: "/v1/responses", fault: "cut-at=3", want: outOK, answer: 4, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect, rescued: true},
	{name: "cut-at=3 messages non-stream rescued", weight: 5, path: "/v1/messages", fault: "cut-at=3", want: outOK, answer: 4, errType: ErrTypeEngineDisconnect, cont: migrateDisconnect, rescued: true},
	// The engine closes after the finish chunk, before [DONE]: the answer
	// is whole, not continued.
	{name: "truncate stream", weight: 10, stream: true, fault: "truncate", want: outErrEvent, errType: ErrTypeEngineDisconnect},
	{name: "truncate non-stream", weight: 10, fault: "truncate", want: out502, errType: ErrTypeEngineDisconnect},
	{name: "status=502 html non-stream", weight: 10, fault: "status=502,error-body=html", want: out502, errType: "502", retry: retry502},
	{name: "malformed stream", weight: 20, stream: true, fault: "malformed", want: outDone, parseErr: true},
	// Observed (a continuable non-streaming request is read as a stream):
	// the malformed event cannot be reassembled.
	{name: "malformed non-stream", weight: 10, fault: "malformed", want: out502, errType: ErrTypeStreamError, parseErr: true},
	{name: "keepalive stream", weight: 25, stream: true, fault: "keepalive", want: outDone, answer: 4},
	{name: "no-content stream", weight: 15, stream: true, fault: "no-content", want: outDone},
	{name: "no-content non-stream", weight: 10, fault: "no-content", want: outOK},
	{name: "trickle stream", weight: 10, stream: true, fault: "trickle=0s", want: outDone, answer: 4},
	{name: "slow-headers=1ms non-stream", weight: 10, fault: "slow-headers=1ms", want: outOK},
	{name: "client cancel after first token", weight: 10, stream: true, fault: "stall-after=1", cancel: true, want: outCancelled, errType: ErrTypeClientCancelled},
	{name: "bad JSON", weight: 20, body: `{"model":"m","messages":[`, want: out400, errType: noAttempt},
	{name: "unknown model", weight: 20, body: `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`, want: out404, errType: noAttempt},
	{name: "stall-before-headers stream", weight: 3, stream: true, fault: "stall-before-headers", want: out504, errType: ErrTypeHeaderTimeout, retry: retryHeaderTimeout},
	{name: "stall-before-headers non-stream", weight: 1, fault: "stall-before-headers", want: out504, errType: ErrTypeRequestTimeout},
	{name: "stall-after=2 stream", weight: 3, stream: true, fault: "stall-after=2", want: outErrEvent, errType: ErrTypeIdleTimeout, cont: migrateIdle},
	{name: "stall-at=3 stream rescued", weight: 3, stream: true, fault: "stall-at=3", want: outDone, answer: 4, errType: ErrTypeIdleTimeout, cont: migrateIdle, rescued: true},
	{name: "stall-after=2 non-stream", weight: 2, fault: "stall-after=2", want: out504, errType: ErrTypeIdleTimeout, cont: migrateIdle},
	{name: "stall-after=0 stream (no first token)", weight: 2, stream: true, fault: "stall-after=0", want: outErrEvent, errType: ErrTypeFirstToken, retry: retryFirstToken},
}

// soakBody returns the request body for k.
func soakBody(k *soakKind) []byte {
	if k.body != "" {
		return []byte(k.body)
	}
	switch k.path {
	case "/v1/embeddings":
		return []byte(`{"model":"m","input":"the quick brown fox"}`)
	case "/v1/completions":
		return fmt.Appendf(nil, `{"model":"m","prompt":"a b c d","max_tokens":4,"stream":%t,"stream_options":{"include_usage":%t}}`, k.stream, k.stream)
	case "/v1/responses":
		return fmt.Appendf(nil, `{"model":"m","input":"a b c d","max_output_tokens":4,"store":false,"stream":%t}`, k.stream)
	case "/v1/messages":
		return fmt.Appendf(nil, `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"a b c d"}],"stream":%t}`, k.stream)
	}
	so := ""
	if k.stream {
		so = `"stream_options":{"include_usage":true},`
	}
	return fmt.Appendf(nil, `{"model":"m","stream":%t,%s"max_tokens":4,"messages":[{"role":"user","content":"a b c d e f"}]}`, k.stream, so)
}

// soakTap stands in front of the simulated engines and counts the engine
// requests that arrive, by fault, so the soak can hold the engines' view
// against the gateway's attempts. A request that an engine closes before
// answering (close-before-headers) arrives more than once in one attempt
// when it was sent on a kept-alive connection: net/http sends it again on
// the next connection it gets (replayOnStaleConn), until one that was not
// reused fails too. The tap counts those attempts once, by the engine
// span ID of their traceparent (one per attempt, the same on every send).
type soakTap struct {
	arrivals map[string]*atomic.Int64 // by X-Enginesim-Fault; built before serving, then read-only
	other    atomic.Int64             // a fault the table does not have
	// tokenize counts the POST /tokenize calls: a Messages or Responses
	// continuation's two (its prompt, the text the client got), which are
	// not attempts and take no slot.
	tokenize atomic.Int64

	mu       sync.Mutex
	seen     map[uint64]struct{} // close-before-headers attempts since the last settle, by span ID
	attempts int64               // close-before-headers attempts settled
	badTrace int64               // close-before-headers requests without a readable traceparent
}

// replayFault is the only fault of the mix whose requests net/http sends
// again inside an attempt (see soakTap).
const replayFault = "close-before-headers"

func newSoakTap() *soakTap {
	t := &soakTap{arrivals: map[string]*atomic.Int64{}, seen: map[uint64]struct{}{}}
	for _, k := range soakKinds {
		if t.arrivals[k.fault] == nil {
			t.arrivals[k.fault] = new(atomic.Int64)
		}
	}
	return t
}

// wrap counts the engine requests (POSTs: the probes are GETs) before next
// handles them.
func (t *soakTap) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/tokenize" {
			t.tokenize.Add(1)
		} else if r.Method == http.MethodPost {
			f := r.Header.Get(enginesim.FaultHeader)
			if c := t.arrivals[f]; c != nil {
				c.Add(1)
			} else {
				t.other.Add(1)
			}
			if f == replayFault {
				// traceparent: 00-<32 hex trace ID>-<16 hex span ID>-<flags>
				tp := r.Header.Get("Traceparent")
				id, err := uint64(0), error(nil)
				if len(tp) == 55 {
					id, err = strconv.ParseUint(tp[36:52], 16, 64)
				}
				t.mu.Lock()
				if len(tp) != 55 || err != nil {
					t.badTrace++
				} else {
					t.seen[id] = struct{}{}
				}
				t.mu.Unlock()
			}
		}
		next.ServeHTTP(w, r)
	})
}

// settle adds the close-before-headers attempts seen so far and forgets
// their IDs (so the set does not grow with volume). Only between
// batches: no attempt is live.
func (t *soakTap) settle() {
	t.mu.Lock()
	t.attempts += int64(len(t.seen))
	t.seen = map[uint64]struct{}{}
	t.mu.Unlock()
}

// discardSpans is a span processor that keeps nothing. The soak samples a
// fraction of the requests (SOAK_SAMPLE, default 0.1) so that both the
// sampled path (recording spans with every attribute and event set, then
// ended) and the sampler-off path run a million times. The ended spans go
// to this processor and are dropped: a tracetest.SpanRecorder, as the unit
// tests use, keeps every ended span and would grow by ~100k spans per
// million requests, which would be the harness leaking, not the gateway,
// and would invalidate the heap measurement. An exporter pipeline
// (batcher) is not used either: its queue is bounded but its contents at a
// checkpoint would be noise.
type discardSpans struct{}

func (discardSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discardSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discardSpans) Shutdown(context.Context) error                  { return nil }
func (discardSpans) ForceFlush(context.Context) error                { return nil }

// seriesCount is the number of data points (attribute sets) of every
// instrument: it must stay bounded whatever the volume.
func seriesCount(rm metricdata.ResourceMetrics) int {
	n := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				n += len(d.DataPoints)
			case metricdata.Sum[float64]:
				n += len(d.DataPoints)
			case metricdata.Gauge[int64]:
				n += len(d.DataPoints)
			case metricdata.Gauge[float64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[float64]:
				n += len(d.DataPoints)
			case metricdata.Histogram[int64]:
				n += len(d.DataPoints)
			}
		}
	}
	return n
}

// waitLive waits (bounded) until no engine attempt is live.
func waitLive(h *harness, d time.Duration) int64 {
	testutil.Poll(d, func() bool { return h.gw.LiveAttempts() == 0 })
	return h.gw.LiveAttempts()
}

// memSample is the process's memory after a forced GC.
type memSample struct {
	heapInuse  uint64 // runtime.MemStats.HeapInuse
	heapAlloc  uint64 // runtime.MemStats.HeapAlloc (the live heap)
	stackInuse uint64 // runtime.MemStats.StackInuse (goroutine stacks are not heap)
	rss        uint64 // VmRSS, bytes
	goroutines int
}

// readMem forces a GC and reads the memory figures. Two collections: the
// first moves sync.Pool contents to the victim cache, the second frees
// them, so pooled buffers do not count.
func readMem() memSample {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, stackInuse: ms.StackInuse, rss: procStatus("VmRSS"), goroutines: runtime.NumGoroutine()}
}

// soakSample is one checkpoint.
type soakSample struct {
	requests int64
	// warm is measured as the process stands, keep-alive connections (and
	// their buffers and goroutines) included; quiet after every idle
	// connection was closed, which removes the connection-pool noise (how
	// many connections are idle depends on the fault mix's timing) and
	// leaves what requests may have left behind.
	warm, quiet memSample
	hwm         uint64 // VmHWM (peak RSS), bytes
	series      int    // metric data points across every instrument
	elapsed     time.Duration
}

// settleGoroutines waits (bounded) until the goroutine count stops falling
// (connection goroutines exit asynchronously after a close).
func settleGoroutines() {
	prev := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == prev {
			return
		}
		prev = n
	}
}

// procStatus returns a "VmXXX:" field of /proc/self/status in bytes (0 when
// unavailable).
func procStatus(field string) uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseUint(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func envInt(tb testing.TB, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(v, "_", ""), 10, 64)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// soakWorker is one client connection's worth of state, reused across its
// requests.
type soakWorker struct {
	client  *http.Client
	url     string
	buf     bytes.Buffer
	br      *bufio.Reader
	relayed *[600]atomic.Int64 // error answers that relay an engine's status, by status; nil = not counted
}

// engineAnswer reports whether an error answer relays an engine's status
// (passError: the engine's own error object, whose code is a number, or
// one naming the status) rather than being an error the gateway made
// (whose code is its error type, such as engine_disconnect).
func engineAnswer(body []byte, status int) bool {
	i := bytes.Index(body, []byte(`"code":`))
	if i < 0 {
		return false
	}
	v := bytes.TrimLeft(body[i+len(`"code":`):], " ")
	if len(v) > 0 && '0' <= v[0] && v[0] <= '9' {
		return true
	}
	var q [8]byte
	want := append(strconv.AppendInt(append(q[:0], '"'), int64(status), 10), '"')
	return bytes.HasPrefix(v, want)
}

var contentLine = []byte(`"content":"tok`)

// do sends one request of kind k (body pre-built) and classifies what came
// back.
func (w *soakWorker) do(k *soakKind, body []byte) soakOutcome {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := k.path
	if path == "" {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url+path, bytes.NewReader(body))
	if err != nil {
		return outTransportErr
	}
	req.Header.Set("Content-Type", "application/json")
	if k.fault != "" {
		req.Header.Set(enginesim.FaultHeader, k.fault)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return outTransportErr
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		w.buf.Reset()
		_, _ = w.buf.ReadFrom(resp.Body)
		if w.relayed != nil && resp.StatusCode < len(w.relayed) && engineAnswer(w.buf.Bytes(), resp.StatusCode) {
			w.relayed[resp.StatusCode].Add(1)
		}
		return statusOutcome(resp.StatusCode)
	}
	if k.cancel {
		// Read events until the first content token, then go away.
		w.br.Reset(resp.Body)
		for {
			line, err := w.br.ReadSlice('\n')
			if bytes.Contains(line, contentLine) {
				cancel()
				_, _ = io.Copy(io.Discard, w.br)
				return outCancelled
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			if err != nil {
				return outStreamCut
			}
		}
	}
	w.buf.Reset()
	_, err = w.buf.ReadFrom(resp.Body)
	got := w.buf.Bytes()
	switch {
	case !k.stream && err != nil:
		return outCut
	case !k.stream && k.answer > 0 && !tokensOnce(got, k.answer):
		return outNotWhole
	case !k.stream:
		return outOK
	case err == nil && bytes.HasSuffix(got, []byte("data: [DONE]\n\n")):
		if k.answer > 0 && !wholeAnswer(got, k.answer) {
			return outNotWhole
		}
		return outDone
	case bytes.HasSuffix(got, []byte("}}\n\n")) && bytes.HasPrefix(lastEvent(got), []byte(`data: {"error":`)):
		return outErrEvent
	}
	return outStreamCut
}

// tokenPats are the soak answers' content tokens as they appear in a
// chunk's content or text: "tok0 " and so on, quoted.
var tokenPats = func() (p [8][]byte) {
	for i := range p {
		p[i] = []byte(strconv.Quote(enginesim.ContentToken(i)))
	}
	return p
}()

// wholeAnswer reports whether a stream body carries the whole answer of
// n (at most 8) content tokens: each once and in order, one
// finish_reason, the usage of n completion tokens, no error.
func wholeAnswer(b []byte, n int) bool {
	at := 0
	for _, pat := range tokenPats[:n] {
		j := bytes.Index(b[at:], pat)
		if j < 0 || bytes.Contains(b[at+j+len(pat):], pat) {
			return false
		}
		at += j + len(pat)
	}
	var q [32]byte
	usage := strconv.AppendInt(append(q[:0], `"completion_tokens":`...), int64(n), 10)
	return bytes.Count(b, []byte(`"finish_reason":"`)) == 1 && bytes.Count(b, usage) == 1 && !bytes.Contains(b, []byte(`{"error":`))
}

// tokensOnce reports whether a non-streaming body carries the answer's n
// (at most 8) content tokens, each once and in order (in its text, of
// whatever route).
func tokensOnce(b []byte, n int) bool {
	at := 0
	for i := range n {
		pat := []byte(enginesim.ContentToken(i))
		j := bytes.Index(b[at:], pat)
		if j < 0 || bytes.Contains(b[at+j+len(pat):], pat) {
			return false
		}
		at += j + len(pat)
	}
	return true
}

// lastEvent returns the last SSE event of a stream body.
func lastEvent(b []byte) []byte {
	b = bytes.TrimSuffix(b, []byte("\n\n"))
	if i := bytes.LastIndex(b, []byte("\n\n")); i >= 0 {
		return b[i+2:]
	}
	return b
}

// BenchmarkSoak sends SOAK_REQUESTS (default 1,000,000) requests through an
// in-process gateway to three simulated engines, with SOAK_CONCURRENCY
// (default 32) keep-alive clients, mixing successes and every fast fault
// (soakKinds), and samples heap and RSS after a forced GC at 10k, 100k and
// 1M requests. The soak runs once whatever b.N is; run it alone with:
//
//	go test -run='^$' -bench='^BenchmarkSoak$' -benchtime=1x -timeout=60m ./gateway/
//
// CI (.ci/run) runs it at SOAK_REQUESTS=100000 after the unit tests, so
// the accounting below cannot go red unseen; the heap check needs the 1M
// checkpoint.
//
// It runs with the gateway's defaults but for timeouts and probes:
// continuation is on (migration.limit 1), so a stream broken after its
// first tokens gets a continuation leg, an attempt of its own on another
// engine, which carries the client's X-Enginesim-Fault like every other
// header: the kinds say which (soakKind.cont) and how it ends.
//
// It fails unless, at every checkpoint and at the end, every
// active_requests gauge reads 0 (and was never seen below 0), no attempt is
// live, every attempt, continuation legs included, is accounted for
// (soakAccount), and the heap in use
// after GC at 1M is within 10% of its value at 100k. BENCHMARKS.md records
// the figures.
func BenchmarkSoak(b *testing.B) {
	total := envInt(b, "SOAK_REQUESTS", 1_000_000)
	conc := int(envInt(b, "SOAK_CONCURRENCY", 32))
	sampleRatio := 0.1
	if v := os.Getenv("SOAK_SAMPLE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			b.Fatalf("SOAK_SAMPLE=%q: want a ratio in [0,1]", v)
		}
		sampleRatio = f
	}

	// Engines: instant prefill and decode so the soak measures the
	// gateway, not the simulated GPU.
	const nEngines = 3
	tap := newSoakTap()
	var sims []*enginesim.Engine
	var engines []fleet.EngineConfig
	for i := range nEngines {
		e, err := enginesim.New(enginesim.Config{Name: fmt.Sprintf("e%d", i+1), Models: []string{"m"},
			TTFT: time.Nanosecond, ITL: time.Nanosecond, OutputTokens: 4})
		if err != nil {
			b.Fatal(err)
		}
		srv := httptest.NewServer(tap.wrap(e.Handler()))
		b.Cleanup(func() {
			srv.CloseClientConnections()
			srv.Close()
		})
		sims = append(sims, e)
		engines = append(engines, fleet.EngineConfig{Name: fmt.Sprintf("e%d", i+1), URL: srv.URL, Models: []string{"m"}})
	}
	cfg := testConfig(engines...)
	// Small gateway timeouts so the stall-* kinds end quickly: the header
	// timeout (streams), the idle timeout and the request timeout (which
	// bounds the non-stream stall-before-headers kind). They are well above
	// the latency tail of a normal request with 32 clients on 2 busy cores
	// (a 50 ms header timeout and a 20 ms idle timeout fired on ~0.4% of
	// the healthy streams there).
	cfg.Timeouts.ResponseHeader = 250 * time.Millisecond
	cfg.Timeouts.FirstToken = 500 * time.Millisecond
	cfg.Timeouts.Idle = 100 * time.Millisecond
	cfg.Timeouts.Attempt = 0 // the request timeout bounds the non-stream stall-before-headers kind
	cfg.Timeouts.Request = time.Second
	// Probes every second (instead of the tests' hour) so the probe path is
	// soaked alongside, and a spurious failure could not keep an engine out
	// of routing for the rest of the run.
	cfg.Health.Interval = time.Second
	// Least-loaded routing reads the in-flight counters on every pick: a
	// leaked count would visibly skew traffic away from an engine.
	h := newHarness(b, cfg, withPolicy(routing.NewLeastLoaded(2)), withSampler(sdktrace.TraceIDRatioBased(sampleRatio)), withSpanProcessor(discardSpans{}))

	tr := h.srv.Client().Transport.(*http.Transport).Clone()
	tr.MaxIdleConns = 4 * conc
	tr.MaxIdleConnsPerHost = 2 * conc // every worker keeps its connection alive
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	schedule, bodies := soakSchedule(1, 2)
	counts := make([][numOutcomes]atomic.Int64, len(soakKinds))
	var relayed [600]atomic.Int64

	// The gauge watcher collects like a scraper, every 50 ms, and records
	// the lowest value any gauge ever had.
	var minGauge atomic.Int64
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopWatch:
				return
			case <-t.C:
			}
			var rm metricdata.ResourceMetrics
			if err := h.reader.Collect(context.Background(), &rm); err != nil {
				continue
			}
			for _, v := range gaugesOf(rm) {
				if v < minGauge.Load() {
					minGauge.Store(v)
				}
			}
		}
	}()
	stopWatcher := sync.OnceFunc(func() { close(stopWatch); <-watched })
	b.Cleanup(stopWatcher)

	var checkpoints []int64
	for _, c := range []int64{10_000, 100_000, 1_000_000} {
		if c < total {
			checkpoints = append(checkpoints, c)
		}
	}
	checkpoints = append(checkpoints, total)

	var samples []soakSample
	start := time.Now()
	b.ResetTimer()
	var next int64
	for _, cp := range checkpoints {
		var idx atomic.Int64
		idx.Store(next)
		var wg sync.WaitGroup
		for range conc {
			wg.Go(func() {
				w := &soakWorker{client: client, url: h.srv.URL, br: bufio.NewReaderSize(nil, 4096), relayed: &relayed}
				for {
					i := idx.Add(1) - 1
					if i >= cp {
						return
					}
					ki := schedule[i%int64(len(schedule))]
					o := w.do(&soakKinds[ki], bodies[ki])
					counts[ki][o].Add(1)
				}
			})
		}
		wg.Wait()
		next = cp
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, "soak: %d requests in %v\n", cp, time.Since(start).Round(time.Millisecond))
		}

		// Checkpoint: the clients are done; let the gateway's handlers end
		// (a cancelled client leaves before its handler does), then check
		// the gauges and measure.
		b.StopTimer()
		if n := waitLive(h, 5*time.Second); n != 0 {
			b.Fatalf("at %d requests: %d attempts still live", cp, n)
		}
		rm := h.collect()
		for k, v := range gaugesOf(rm) {
			if v != 0 {
				b.Fatalf("at %d requests: gauge %s = %d, want 0", cp, k, v)
			}
		}
		tap.settle()
		warm := readMem()
		tr.CloseIdleConnections()
		h.gw.client.CloseIdleConnections() // the engine transport (requests and probes)
		settleGoroutines()
		samples = append(samples, soakSample{requests: cp, warm: warm, quiet: readMem(),
			hwm: procStatus("VmHWM"), series: seriesCount(rm), elapsed: time.Since(start)})
		b.StartTimer()
	}
	wall := time.Since(start)
	b.StopTimer()
	stopWatcher()

	// The figures.
	mib := func(v uint64) string { return fmt.Sprintf("%.2f MiB", float64(v)/(1<<20)) }
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "soak: %d requests, %d workers, %d engines, sample ratio %g, wall %v (%.0f req/s), GOMAXPROCS %d\n",
		total, conc, nEngines, sampleRatio, wall.Round(time.Millisecond), float64(total)/wall.Seconds(), runtime.GOMAXPROCS(0))
	fmt.Fprintf(&tbl, "| requests | heap in use | heap alloc | RSS | goroutines | heap in use, conns closed | heap alloc, conns closed | RSS, conns closed | goroutines, conns closed | peak RSS | metric series | elapsed |\n")
	fmt.Fprintf(&tbl, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range samples {
		fmt.Fprintf(&tbl, "| %d | %s | %s | %s | %d | %s | %s | %s | %d | %s | %d | %v |\n", s.requests,
			mib(s.warm.heapInuse), mib(s.warm.heapAlloc), mib(s.warm.rss), s.warm.goroutines,
			mib(s.quiet.heapInuse), mib(s.quiet.heapAlloc), mib(s.quiet.rss), s.quiet.goroutines,
			mib(s.hwm), s.series, s.elapsed.Round(time.Millisecond))
	}

	// Every request accounted for, per kind and outcome.
	var sent, mismatched int64
	sc := soakCounts{kinds: make([]int64, len(soakKinds)), turned: make([]int64, len(soakKinds)), relayed: map[int]int64{}}
	outTotals := [numOutcomes]int64{}
	var wantParseErrs int64
	fmt.Fprintf(&tbl, "\n| kind | requests | outcomes (client view) | expected |\n|---|---:|---|---|\n")
	for i := range soakKinds {
		k := &soakKinds[i]
		var n int64
		var parts []string
		for o := range numOutcomes {
			c := counts[i][o].Load()
			if c == 0 {
				continue
			}
			n += c
			outTotals[o] += c
			parts = append(parts, fmt.Sprintf("%s: %d", outcomeNames[o], c))
			if o != k.want {
				mismatched += c
				sc.turned[i] += c
			}
		}
		sent += n
		sc.kinds[i] = n
		if k.parseErr {
			wantParseErrs += n
		}
		fmt.Fprintf(&tbl, "| %s | %d | %s | %s |\n", k.name, n, strings.Join(parts, ", "), outcomeNames[k.want])
	}
	var parts []string
	for o := range numOutcomes {
		if outTotals[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", outcomeNames[o], outTotals[o]))
		}
	}
	fmt.Fprintf(&tbl, "| **all** | %d | %s | %d unexpected |\n", sent, strings.Join(parts, ", "), mismatched)

	// The gateway's view (request.duration per error.type, the retry
	// counters) against the engines' and the clients'.
	rm := h.collect()
	sc.gotTypes = errorTypesOf(rm, telemetry.RequestDurationName)
	sc.retries = countsBy(rm, telemetry.RetriesName, telemetry.AttrRetryReason)
	sc.exhausted = counterTotal(rm, telemetry.RetryBudgetExhaustedName)
	for s := range relayed {
		if v := relayed[s].Load(); v > 0 {
			sc.relayed[s] = v
		}
	}
	var perEngine []string
	for i, e := range sims {
		st := e.Stats()
		sc.received += st.Received
		perEngine = append(perEngine, fmt.Sprintf("e%d received %d (completed %d, aborted %d, faulted %d)", i+1, st.Received, st.Completed, st.Aborted, st.Faulted))
	}
	tap.settle()
	sc.arrivals = map[string]int64{}
	for f, c := range tap.arrivals {
		sc.arrivals[f] = c.Load()
	}
	sc.other, sc.badTrace, sc.replayAttempts, sc.tokenize = tap.other.Load(), tap.badTrace, tap.attempts, tap.tokenize.Load()
	sc.migrations, sc.exclusions = h.migrations(), h.exclusions()
	problems := soakAccount(cfg, &sc, &tbl)
	parseErrs := counterTotal(rm, telemetry.ParseErrorsName)
	fmt.Fprintf(&tbl, "\nengines: %s\nparse errors %d (expected %d); lowest gauge seen %d\n",
		strings.Join(perEngine, "; "), parseErrs, wantParseErrs, minGauge.Load())
	nLog, firstLogs := h.serverLog.lines()
	fmt.Fprintf(&tbl, "net/http server log lines about the gateway: %d %q\n", nLog, firstLogs)
	b.Log("\n" + tbl.String())

	// The verdict.
	if sent != total {
		b.Fatalf("accounted %d requests, sent %d", sent, total)
	}
	if n := waitLive(h, 5*time.Second); n != 0 {
		b.Fatalf("%d attempts still live", n)
	}
	for k, v := range gaugesOf(h.collect()) {
		if v != 0 {
			b.Fatalf("gauge %s = %d, want 0", k, v)
		}
	}
	if nLog > 0 {
		b.Fatalf("net/http logged %d lines about the gateway's handler, first %q", nLog, firstLogs)
	}
	if m := minGauge.Load(); m < 0 {
		b.Fatalf("a gauge was observed at %d", m)
	}
	if len(problems) > 0 {
		b.Fatalf("the attempts do not add up:\n%s", strings.Join(problems, "\n"))
	}
	// Timing can legitimately turn a few requests (a gateway timeout firing
	// on a starved goroutine); more than 0.1% means the gateway misbehaves.
	if mismatched*1000 > total {
		b.Fatalf("%d requests had an unexpected outcome (over 0.1%%)", mismatched)
	}
	if mismatched > 0 {
		b.Logf("%d requests had an unexpected outcome (timing)", mismatched)
	}

	last := samples[len(samples)-1]
	b.ReportMetric(float64(last.warm.heapInuse), "heap-inuse-B")
	b.ReportMetric(float64(last.warm.heapAlloc), "heap-alloc-B")
	b.ReportMetric(float64(last.warm.rss), "rss-B")
	b.ReportMetric(float64(last.warm.goroutines), "goroutines")
	b.ReportMetric(float64(last.quiet.heapInuse), "heap-inuse-quiet-B")
	b.ReportMetric(float64(total)/wall.Seconds(), "req/s")
	var base *soakSample
	for i := range samples {
		if samples[i].requests == 100_000 {
			base = &samples[i]
		}
	}
	if base != nil {
		for _, s := range samples {
			if s.requests < 1_000_000 {
				continue
			}
			ratio := func(f func(m memSample) uint64) float64 { return float64(f(s.warm)) / float64(f(base.warm)) }
			qratio := func(f func(m memSample) uint64) float64 { return float64(f(s.quiet)) / float64(f(base.quiet)) }
			inuse := func(m memSample) uint64 { return m.heapInuse }
			alloc := func(m memSample) uint64 { return m.heapAlloc }
			b.ReportMetric(ratio(inuse), "heap-1M/100k")
			b.ReportMetric(qratio(inuse), "heap-quiet-1M/100k")
			b.Logf("at %d / at 100k: heap in use x%.3f, heap alloc x%.3f; with connections closed: heap in use x%.3f, heap alloc x%.3f",
				s.requests, ratio(inuse), ratio(alloc), qratio(inuse), qratio(alloc))
			if r := qratio(inuse); heapGrew(base.quiet.heapInuse, s.quiet.heapInuse) {
				b.Fatalf("heap in use after GC (connections closed) grew from %s at 100k to %s at %d (x%.3f; limit x%.2f and %s)",
					mib(base.quiet.heapInuse), mib(s.quiet.heapInuse), s.requests, r, soakHeapRatio, mib(soakHeapFloor))
			}
			if r := ratio(inuse); heapGrew(base.warm.heapInuse, s.warm.heapInuse) {
				b.Fatalf("heap in use after GC grew from %s at 100k to %s at %d (x%.3f; limit x%.2f and %s)",
					mib(base.warm.heapInuse), mib(s.warm.heapInuse), s.requests, r, soakHeapRatio, mib(soakHeapFloor))
			}
		}
	}
}

// The soak's heap-growth gate: the heap in use after a forced GC at 1M
// requests may exceed the one at 100k by at most soakHeapRatio, or by at
// most soakHeapFloor bytes, whichever is more. The floor keeps the gate
// from failing on the heap's run-to-run noise: a 5-8 MiB heap in use,
// whose idle connections, pools and span fragmentation move by about
// 1 MiB between runs (two 1M runs at one commit measured x1.158, +0.8
// MiB, and x1.006). A leak of 4 bytes per request grows the heap by 3.4
// MiB over the 900k requests between the samples, so the floor catches
// any per-request leak of 4 bytes or more, a pointer (8) with room.
const (
	soakHeapRatio = 1.10
	soakHeapFloor = 3 << 20
)

// heapGrew reports whether the heap grew from base to now past the gate.
func heapGrew(base, now uint64) bool {
	return float64(now) > float64(base)*soakHeapRatio && now > base+soakHeapFloor
}

// soakCounts is what a soak observed, for soakAccount.
type soakCounts struct {
	kinds    []int64           // requests per kind (soakKinds' order)
	turned   []int64           // per kind, requests with an unexpected outcome
	relayed  map[int]int64     // client answers relaying an engine's error status, by status
	gotTypes map[string]uint64 // request.duration count by error.type ("" = success)
	retries  map[string]int64  // switchboard.request.retries by reason
	// exhausted is switchboard.request.retry_budget_exhausted: first
	// retries the budget refused.
	exhausted int64
	received  int64            // the engines' Stats.Received, summed
	arrivals  map[string]int64 // engine requests by fault (soakTap)
	other     int64            // engine requests with a fault the table does not have
	badTrace  int64            // replayFault requests without a readable traceparent
	// replayAttempts is the number of distinct attempts among the
	// replayFault arrivals.
	replayAttempts int64
	// migrations is switchboard.request.migrations by "reason/outcome";
	// exclusions switchboard.request.migration_exclusions by exclusion.
	migrations map[string]int64
	exclusions map[string]int64
	// tokenize is the /tokenize calls the engines got (soakTap).
	tokenize int64
}

// migrationLegs are the outcomes of switchboard.request.migrations counted
// when a continuation leg ends (limit and no_engine start none).
var migrationLegs = []string{migrationRescued, migrationFailed, migrationCancelled}

// soakAccount checks that every attempt adds up, writes the accounting to
// tbl and returns what does not add up (nothing when all is well).
//
// The expectations come from the retry configuration the soak runs with
// (cfg.Retry.On, cfg.MaxAttempts, the budget): a kind whose attempts end
// with a condition of retry.on before anything reached the client makes
// MaxAttempts attempts (its fault is sent again on every attempt, there
// are as many engines as attempts so each retry goes to an engine not yet
// tried, and enginesim sends no Retry-After), unless the retry budget
// refuses its first retry: then one, and the refusal is counted in
// switchboard.request.retry_budget_exhausted. Any other kind makes one,
// plus its continuation leg when the gateway continues its broken stream
// (soakKind.cont: continuation is on, as by default, with
// migration.limit 1; the leg carries the client's headers, so the same
// fault, and the leg is an attempt of its own). How many retries the
// budget refuses depends on how many requests are being retried at once,
// so the refusals are read from that counter, and these hold exactly:
//
//   - attempts recorded (request.duration) = requests that reach an engine
//     plus retries (switchboard.request.retries, every reason) plus
//     continuation legs (switchboard.request.migrations with outcome
//     rescued, failed or cancelled);
//   - migrations by reason and outcome = the kinds' (cont, rescued):
//     {cont, rescued} per rescued request, {cont, failed} and {cont,
//     limit} per request whose leg breaks too; no exclusion;
//   - the requests the engines received = attempts recorded + the sends
//     net/http repeated inside an attempt (replayFault: see soakTap), and
//     the tap in front of the engines saw as many;
//   - for every engine status s (429, 500, 502, 503, 504), attempts with
//     error.type s = answers relaying s to a client + retries for reason
//     s: each such attempt was either retried or relayed;
//   - per fault, the attempts the engines saw = the kinds' requests x
//     their attempts (continuation legs included), minus (MaxAttempts-1)
//     per refused retry;
//   - retries = (MaxAttempts-1) x (requests of retryable kinds - refused),
//     all for reasons of retryable kinds.
//
// The first and the fourth hold whatever the timing, but for one thing: a
// stream that the idle timeout found silent on a starved goroutine is
// continued, and no outcome shows it (a healthy stream's client gets the
// whole answer; a cancelling client slower than the timeout leaves during
// the leg): such timed legs (idle_timeout migrations beyond the kinds')
// are reported and allowed as extra engine attempts of their fault, and
// a timed break after the answer's last token is finished
// without a leg (rescued, no attempt), so the first identity may fall
// short by at most the timed legs. The others assume
// the engines met every attempt, and every retryable request its fault on
// its first attempt. A gateway timeout firing on a starved goroutine (an
// unexpected outcome, which the soak bounds separately) can end an attempt
// before its request reached the engine, or a retryable request before
// its fault: so when a request had an unexpected outcome, the engines'
// view is held to what such timeouts allow instead (it may fall short of
// the attempts recorded by at most the attempts that ended in a gateway
// timeout or a connect error, never exceed them), and the retry counts,
// when the request was of a retryable kind, are reported, not checked.
func soakAccount(cfg Config, c *soakCounts, tbl *strings.Builder) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	on := cfg.Retry.mask()
	maxA := int64(cfg.MaxAttempts)

	// The model: attempts per fault and error type if no retry were
	// refused.
	var reach, retryable, turned, unexpected int64
	modelFault := map[string]int64{}
	retryFault := map[string]bool{}
	modelType := map[string]int64{}
	retryType := map[string]bool{}
	reasons := map[string]bool{}
	modelMig := map[string]int64{}
	var legsWant, tokenizeWant int64
	for i := range soakKinds {
		k := &soakKinds[i]
		n := c.kinds[i]
		unexpected += c.turned[i]
		if k.errType == noAttempt {
			continue
		}
		a := int64(1)
		if on.has(k.retry) {
			a = maxA
		}
		reach += n
		modelFault[k.fault] += n * a
		modelType[k.errType] += n * a
		if k.cont != "" {
			// One continuation leg per request, with the same fault;
			// on the routes without token ids, after two /tokenize calls.
			legsWant += n
			if k.path == "/v1/responses" || k.path == "/v1/messages" {
				tokenizeWant += 2 * n
			}
			modelFault[k.fault] += n
			if k.rescued {
				modelType[""] += n
				modelMig[k.cont+"/"+migrationRescued] += n
			} else {
				modelType[k.errType] += n
				modelMig[k.cont+"/"+migrationFailed] += n
				modelMig[k.cont+"/"+migrationLimit] += n
			}
		}
		if a > 1 {
			retryable += n
			turned += c.turned[i]
			retryFault[k.fault] = true
			retryType[k.errType] = true
			reasons[k.retry.String()] = true
		}
	}
	var retries, recorded, arrivals int64
	for _, v := range c.retries {
		retries += v
	}
	for _, v := range c.gotTypes {
		recorded += int64(v)
	}
	for _, v := range c.arrivals {
		arrivals += v
	}
	arrivals += c.other
	replays := c.arrivals[replayFault] - c.replayAttempts
	refusedAttempts := (maxA - 1) * c.exhausted

	// Continuation legs: every migration counted with a leg outcome ran
	// one, save a break after the answer's last token, which is finished
	// (rescued) without a leg. Beyond the model, a stream that a gateway
	// timer found idle on a starved goroutine (idle_timeout) may be
	// continued, its client none the wiser: a healthy one rescued, or the
	// client-cancel kind's (its client, slower than the idle timeout,
	// leaves during the leg, which breaks: failed, and no limit counted
	// for a client gone). Those are timed, not checked against the kinds,
	// and bound the legs that may have been finished without an attempt
	// and the extra engine attempts per fault. Any other difference needs
	// a request with an unexpected outcome.
	var legs, timedLegs int64
	// Every whole answer of a rescued kind was a rescue, whatever the
	// timing.
	whole := map[string]int64{}
	for i, k := range soakKinds {
		if k.rescued {
			whole[k.cont] += c.kinds[i] - c.turned[i]
		}
	}
	for _, r := range slices.Sorted(maps.Keys(whole)) {
		if got := c.migrations[r+"/"+migrationRescued]; got < whole[r] {
			fail("migrations %s/%s: %d, fewer than the %d whole answers of kinds rescued after %s", r, migrationRescued, got, whole[r], r)
		}
	}
	migKeys := map[string]bool{}
	for k := range c.migrations {
		migKeys[k] = true
	}
	for k := range modelMig {
		migKeys[k] = true
	}
	for _, key := range slices.Sorted(maps.Keys(migKeys)) {
		got, want := c.migrations[key], modelMig[key]
		reason, outcome, _ := strings.Cut(key, "/")
		leg := slices.Contains(migrationLegs, outcome)
		if leg {
			legs += got
		}
		switch {
		case got == want:
		case got > want && reason == migrateIdle:
			if leg {
				timedLegs += got - want
			}
		case unexpected > 0:
			if leg && got > want {
				timedLegs += got - want
			}
		default:
			fail("migrations %s: %d, want %d", key, got, want)
		}
	}

	fmt.Fprintf(tbl, "\nretry rules: retry.on %v, max_attempts %d, budget %g of the requests in flight (at least %d): %d requests of retryable kinds, %d retries refused by the budget; retries by reason %v\n",
		cfg.Retry.On, maxA, cfg.Retry.BudgetRatio, cfg.Retry.BudgetMin, retryable, c.exhausted, c.retries)
	fmt.Fprintf(tbl, "attempts recorded %d; requests that reach an engine %d + retries %d + continuation legs %d (%d by the kinds, %d timed) = %d\n",
		recorded, reach, retries, legs, legsWant, timedLegs, reach+retries+legs)
	fmt.Fprintf(tbl, "migrations (reason/outcome) %v, by the kinds %v; exclusions %v\n", c.migrations, modelMig, c.exclusions)
	fmt.Fprintf(tbl, "engines received %d (tap %d) = attempts %d + %d sends repeated by net/http inside %d %s attempts; %d requests had an unexpected outcome\n",
		c.received, arrivals, c.received-replays, replays, c.replayAttempts, replayFault, unexpected)

	if short := reach + retries + legs - recorded; short != 0 && (short < 0 || short > timedLegs) {
		fail("attempts recorded %d, want requests that reach an engine %d + retries %d + continuation legs %d = %d (less at most %d timed legs finished without an attempt)",
			recorded, reach, retries, legs, reach+retries+legs, timedLegs)
	}
	if len(c.exclusions) > 0 && unexpected == 0 && timedLegs == 0 {
		fail("migration exclusions %v: no kind of the mix breaks a request that cannot be continued", c.exclusions)
	}
	fmt.Fprintf(tbl, "/tokenize calls %d (2 per Messages or Responses continuation: %d)\n", c.tokenize, tokenizeWant)
	if c.tokenize != tokenizeWant && (unexpected == 0 && timedLegs == 0 || c.tokenize > tokenizeWant) {
		fail("/tokenize calls %d, want %d (two per Messages or Responses continuation)", c.tokenize, tokenizeWant)
	}
	if arrivals != c.received || c.other != 0 || c.badTrace != 0 {
		fail("the tap saw %d engine requests (%d with an unknown fault, %d %s without a traceparent), the engines counted %d", arrivals, c.other, c.badTrace, replayFault, c.received)
	}
	// Attempts that a gateway timer (or a failed dial) may have ended
	// before the engine saw them.
	var unseen int64
	for _, t := range []string{ErrTypeHeaderTimeout, ErrTypeFirstToken, ErrTypeAttemptTimeout, ErrTypeRequestTimeout, ErrTypeConnect} {
		unseen += int64(c.gotTypes[t])
	}
	if short := recorded - (c.received - replays); short != 0 && (unexpected == 0 || short < 0 || short > unseen) {
		fail("engines received %d - %d repeated sends = %d attempts, the gateway recorded %d (%d requests had an unexpected outcome, %d attempts ended in a gateway timeout or a connect error)",
			c.received, replays, c.received-replays, recorded, unexpected, unseen)
	}
	for _, s := range []int{429, 500, 502, 503, 504} {
		t := strconv.Itoa(s)
		if got, want := int64(c.gotTypes[t]), c.relayed[s]+c.retries[t]; got != want {
			fail("error.type %s on %d attempts, want %d relayed to clients + %d retried = %d", t, got, c.relayed[s], c.retries[t], want)
		}
	}
	faults := make([]string, 0, len(modelFault))
	for f := range modelFault {
		faults = append(faults, f)
	}
	sort.Strings(faults)
	var retryGot, retryWant int64
	for _, f := range faults {
		got := c.arrivals[f]
		if f == replayFault {
			got -= replays
		}
		if retryFault[f] {
			retryGot += got
			retryWant += modelFault[f]
			continue
		}
		if d := got - modelFault[f]; d != 0 && (d > timedLegs || d < 0 && unexpected == 0) {
			fail("fault %q: the engines saw %d attempts, want %d (one per request, and its continuation legs; %d timed legs)", f, got, modelFault[f], timedLegs)
		}
	}
	retryWant -= refusedAttempts
	if turned == 0 {
		if retryGot != retryWant {
			fail("retryable faults %v: the engines saw %d attempts, want %d (%d per request, minus %d for %d refused retries)", slices.Sorted(maps.Keys(retryFault)), retryGot, retryWant, maxA, refusedAttempts, c.exhausted)
		}
		if want := (maxA - 1) * (retryable - c.exhausted); retries != want {
			fail("%d retries, want %d x (%d requests of retryable kinds - %d refused) = %d", retries, maxA-1, retryable, c.exhausted, want)
		}
		for r := range c.retries {
			if !reasons[r] {
				fail("retries for reason %q, which no kind of the mix retries (%v)", r, slices.Sorted(maps.Keys(reasons)))
			}
		}
	} else {
		fmt.Fprintf(tbl, "not checked against the retry rules: %d requests of retryable kinds had an unexpected outcome (timing)\n", turned)
	}

	// Per error type: what was recorded against what the rules give when
	// every request meets its own fault (the refused retries are taken
	// off the one retryable type, when there is one).
	if len(retryType) == 1 {
		for t := range retryType {
			modelType[t] -= refusedAttempts
		}
	}
	keys := map[string]bool{}
	for k := range c.gotTypes {
		keys[k] = true
	}
	for k := range modelType {
		keys[k] = true
	}
	fmt.Fprintf(tbl, "\n| error.type | recorded | by the retry rules |\n|---|---:|---:|\n")
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		label := k
		if label == "" {
			label = "(success)"
		}
		fmt.Fprintf(tbl, "| %s | %d | %d |\n", label, c.gotTypes[k], modelType[k])
	}
	return bad
}

// countsBy returns an Int64 counter's values by one attribute.
func countsBy(rm metricdata.ResourceMetrics, name string, key attribute.Key) map[string]int64 {
	out := map[string]int64{}
	m, ok := findMetric(rm, name)
	if !ok {
		return out
	}
	if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
		for _, dp := range sum.DataPoints {
			v, _ := dp.Attributes.Value(key)
			out[v.AsString()] += dp.Value
		}
	}
	return out
}

// counterTotal returns the total of an Int64 counter.
func counterTotal(rm metricdata.ResourceMetrics, name string) int64 {
	m, ok := findMetric(rm, name)
	if !ok {
		return 0
	}
	var n int64
	if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
		for _, dp := range sum.DataPoints {
			n += dp.Value
		}
	}
	return n
}

// soakSchedule returns the soak's request schedule and each kind's body:
// sum(weight) slots, each kind as many times as its weight, shuffled with
// the fixed seed (seed1, seed2); request i is kind schedule[i mod len].
func soakSchedule(seed1, seed2 uint64) (schedule []int, bodies [][]byte) {
	for i, k := range soakKinds {
		for range k.weight {
			schedule = append(schedule, i)
		}
	}
	rand.New(rand.NewPCG(seed1, seed2)).Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	bodies = make([][]byte, len(soakKinds))
	for i := range soakKinds {
		bodies[i] = soakBody(&soakKinds[i])
	}
	return schedule, bodies
}

// TestSoakAccount holds soakAccount to the retry rules with counts made
// up from them (the default retry configuration: 429 retried once on
// another engine), allows an attempt a timeout ended before the engine saw
// it, and catches each way attempts can fail to add up: a retried 429 not
// counted as a retry, an engine request no attempt accounts for, an
// attempt the engines never saw when nothing timed out, a retry for a
// reason no kind of the mix has.
func TestSoakAccount(t *testing.T) {
	cfg := testConfig()
	consistent := func() *soakCounts {
		c := &soakCounts{kinds: make([]int64, len(soakKinds)), turned: make([]int64, len(soakKinds)),
			relayed: map[int]int64{}, gotTypes: map[string]uint64{}, retries: map[string]int64{}, arrivals: map[string]int64{},
			migrations: map[string]int64{}}
		const refused = 3
		c.exhausted = refused
		for i, k := range soakKinds {
			n := int64(k.weight * 10)
			c.kinds[i] = n
			if k.errType == noAttempt {
				continue
			}
			attempts := n
			if k.retry == retry429 { // the default retry.on's one condition in the mix
				attempts = 2 * n
			}
			c.gotTypes[k.errType] += uint64(attempts)
			c.arrivals[k.fault] += attempts
			if s, err := strconv.Atoi(k.errType); err == nil {
				c.relayed[s] += n
			}
			if k.cont != "" { // one continuation leg each
				c.arrivals[k.fault] += n
				if k.path == "/v1/responses" || k.path == "/v1/messages" {
					c.tokenize += 2 * n // its prompt and its text, tokenized first
				}
				if k.rescued {
					c.gotTypes[""] += uint64(n)
					c.migrations[k.cont+"/rescued"] += n
				} else {
					c.gotTypes[k.errType] += uint64(n)
					c.migrations[k.cont+"/failed"] += n
					c.migrations[k.cont+"/limit"] += n
				}
			}
		}
		n429 := c.arrivals["status=429"] / 2
		c.retries["429"] = n429 - refused
		c.gotTypes["429"] -= refused
		c.arrivals["status=429"] -= refused
		c.replayAttempts = c.arrivals[replayFault]
		c.arrivals[replayFault] += 7 // sends repeated on other kept-alive connections
		for _, v := range c.arrivals {
			c.received += v
		}
		return c
	}
	var tbl strings.Builder
	if bad := soakAccount(cfg, consistent(), &tbl); len(bad) != 0 {
		t.Fatalf("consistent counts: %q\n%s", bad, tbl.String())
	}
	// A header timeout that fired before the request reached the engine
	// (the client saw a 504 instead of its stream): the engines saw one
	// attempt fewer, which the timeout accounts for.
	timed := consistent()
	timed.turned[0]++
	timed.received--
	timed.arrivals[""]--
	timed.gotTypes[""]--
	timed.gotTypes[ErrTypeHeaderTimeout]++
	if bad := soakAccount(cfg, timed, &tbl); len(bad) != 0 {
		t.Errorf("an attempt a timeout ended before the engine: %q", bad)
	}
	// A healthy stream found idle on a starved goroutine, continued and
	// rescued (its client got the whole answer): a timed leg, with its
	// own attempt; or finished without a leg, the break having come
	// after its last token.
	idle := consistent()
	idle.migrations["idle_timeout/rescued"]++
	idle.gotTypes[""]--
	idle.gotTypes[ErrTypeIdleTimeout]++
	leg := *idle
	leg.gotTypes = maps.Clone(idle.gotTypes)
	leg.arrivals = maps.Clone(idle.arrivals)
	leg.gotTypes[""]++
	leg.arrivals[""]++
	leg.received++
	// The client-cancel kind's stream found idle before its client left:
	// continued, and the client leaves during the leg, which breaks.
	cancelled := consistent()
	cancelled.migrations["idle_timeout/failed"]++
	cancelled.gotTypes[ErrTypeClientCancelled]--
	cancelled.gotTypes[ErrTypeIdleTimeout] += 2
	cancelled.arrivals["stall-after=1"]++
	cancelled.received++
	for name, c := range map[string]*soakCounts{"without a leg": idle, "with a leg": &leg, "its client leaving during the leg": cancelled} {
		if bad := soakAccount(cfg, c, &tbl); len(bad) != 0 {
			t.Errorf("a timed continuation %s: %q", name, bad)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(c *soakCounts)
		want   string
	}{
		{"429 retries not counted", func(c *soakCounts) { c.retries["429"] = 0 }, "error.type 429 on"},
		{"an engine request no attempt accounts for", func(c *soakCounts) { c.received++; c.arrivals[""]++ }, "engines received"},
		{"an attempt the engines never saw, every outcome as expected", func(c *soakCounts) { c.received--; c.arrivals[""]-- }, "engines received"},
		{"a retry for a reason of no kind", func(c *soakCounts) {
			c.retries["connect_failure"]++
			c.gotTypes[ErrTypeConnect]++
		}, `retries for reason "connect_failure"`},
		{"a continuation leg not counted as a migration", func(c *soakCounts) {
			c.migrations["engine_disconnect/failed"]--
		}, "attempts recorded"},
		{"a continuation leg counted, no attempt recorded", func(c *soakCounts) {
			c.gotTypes[ErrTypeEngineDisconnect]--
			c.received--
			c.arrivals["close-after=2"]--
		}, "attempts recorded"},
		{"a continuation the kinds do not make", func(c *soakCounts) {
			c.migrations["engine_disconnect/rescued"]++
			c.gotTypes[""]++
			c.received++
			c.arrivals[""]++
		}, "migrations engine_disconnect/rescued"},
		{"a break not continued", func(c *soakCounts) {
			c.migrations["idle_timeout/limit"]--
		}, "migrations idle_timeout/limit"},
		{"a continuation after a disconnect the kinds do not make", func(c *soakCounts) {
			c.migrations["engine_disconnect/failed"]++
			c.gotTypes[ErrTypeEngineDisconnect]++
			c.received++
			c.arrivals["stall-after=1"]++
		}, "migrations engine_disconnect/failed"},
		{"a /tokenize call no continuation made", func(c *soakCounts) { c.tokenize++ }, "/tokenize calls"},
		{"a whole answer of a rescued kind not counted as rescued", func(c *soakCounts) {
			c.migrations["engine_disconnect/rescued"]--
			c.migrations["engine_disconnect/failed"]++
		}, "fewer than the"},
	} {
		c := consistent()
		tc.change(c)
		bad := soakAccount(cfg, c, &tbl)
		if !strings.Contains(strings.Join(bad, "\n"), tc.want) {
			t.Errorf("%s: problems %q, want one containing %q", tc.name, bad, tc.want)
		}
	}
}

// TestWholeAnswer holds the soak's body check to what a client must get:
// each token once and in order, one finish, the usage, no error event.
func TestWholeAnswer(t *testing.T) {
	chunk := func(tok string) string {
		return `data: {"id":"c","choices":[{"index":0,"delta":{"content":"` + tok + `"},"finish_reason":null}]}` + "\n\n"
	}
	finish := `data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n"
	usage := `data: {"id":"c","choices":[],"usage":{"prompt_tokens":6,"total_tokens":10,"completion_tokens":4}}` + "\n\n"
	done := "data: [DONE]\n\n"
	whole := chunk("tok0 ") + chunk("tok1 ") + chunk("tok2 ") + chunk("tok3 ") + finish + usage + done
	if !wholeAnswer([]byte(whole), 4) {
		t.Fatalf("the whole answer was not taken for whole: %s", whole)
	}
	for name, b := range map[string]string{
		"a token missing":    chunk("tok0 ") + chunk("tok1 ") + chunk("tok3 ") + finish + usage + done,
		"a token repeated":   chunk("tok0 ") + chunk("tok1 ") + chunk("tok2 ") + chunk("tok2 ") + chunk("tok3 ") + finish + usage + done,
		"out of order":       chunk("tok0 ") + chunk("tok2 ") + chunk("tok1 ") + chunk("tok3 ") + finish + usage + done,
		"two finish chunks":  chunk("tok0 ") + chunk("tok1 ") + chunk("tok2 ") + chunk("tok3 ") + finish + finish + usage + done,
		"two usage chunks":   chunk("tok0 ") + chunk("tok1 ") + chunk("tok2 ") + chunk("tok3 ") + finish + usage + usage + done,
		"an error event too": chunk("tok0 ") + chunk("tok1 ") + chunk("tok2 ") + chunk("tok3 ") + `data: {"error":{"message":"x"}}` + "\n\n" + finish + usage + done,
	} {
		if wholeAnswer([]byte(b), 4) {
			t.Errorf("%s: taken for the whole answer", name)
		}
	}
}
