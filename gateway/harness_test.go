package gateway

import (
	"context"
	"encoding/json"
	"io"
	stdlog "log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/enginetest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestMain checks that no test leaves a goroutine behind. The one ignored
// is the writer of the simulated engines' KV-events PUB sockets: zmq4
// v0.17.0 starts it in NewPub and its Close never stops it (as in
// internal/enginesim's and internal/kvevents' TestMain).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// harness is a gateway under test with a manual metric reader and a span
// recorder, served on a real loopback listener.
type harness struct {
	t       testing.TB
	gw      *Server
	srv     *httptest.Server
	reader  *sdkmetric.ManualReader
	spans   *tracetest.SpanRecorder
	metrics *telemetry.Metrics
	client  *http.Client
	// serverLog collects what net/http logs about the gateway's handler.
	serverLog serverLog
}

// serverLog counts the lines net/http logs about the gateway's handler and
// keeps the first few: it is safe for concurrent writers and bounded, so a
// soak of a million requests can use it too.
type serverLog struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 5 {
		l.first = append(l.first, strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// lines returns how many lines were logged and the first few.
func (l *serverLog) lines() (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n, append([]string(nil), l.first...)
}

// String returns the first lines, joined.
func (l *serverLog) String() string {
	_, first := l.lines()
	return strings.Join(first, "\n")
}

type harnessOpts struct {
	sampler sdktrace.Sampler
	policy  routing.Policy
	noStart bool
	spans   sdktrace.SpanProcessor // replaces the span recorder (h.spans is then nil)
}

type harnessOpt func(*harnessOpts)

func withSampler(s sdktrace.Sampler) harnessOpt { return func(o *harnessOpts) { o.sampler = s } }
func withPolicy(p routing.Policy) harnessOpt    { return func(o *harnessOpts) { o.policy = p } }
func withoutStart() harnessOpt                  { return func(o *harnessOpts) { o.noStart = true } }

// withSpanProcessor replaces the span recorder, which keeps every ended
// span (a soak must not).
func withSpanProcessor(sp sdktrace.SpanProcessor) harnessOpt {
	return func(o *harnessOpts) { o.spans = sp }
}

// testConfig returns a gateway config for tests: fast health checks, given
// engines.
func testConfig(engines ...fleet.EngineConfig) Config {
	cfg := DefaultConfig()
	cfg.Engines = engines
	cfg.Health.Interval = time.Hour // tests call ProbeNow when they need a probe
	cfg.Health.Timeout = time.Second
	cfg.Health.UnhealthyAfter = 1
	cfg.Timeouts.Connect = time.Second
	// No background scraping: fake engines would see GET /metrics every
	// second. Stats tests turn it on or call ScrapeNow.
	cfg.EngineStats.Enabled = false
	// Admin write actions without a token, as before admin tokens (the
	// admin auth tests set their own).
	cfg.AdminAuth.OpenWrites = true
	cfg.AdminAuth.AllowedHosts = []string{"example.com"} // httptest.NewRequest's Host
	return cfg
}

func newHarness(t testing.TB, cfg Config, opts ...harnessOpt) *harness {
	t.Helper()
	return newHarnessWith(t, cfg, nil, opts...)
}

// newHarnessWith is newHarness with extra gateway options.
func newHarnessWith(t testing.TB, cfg Config, gwOpts []Option, opts ...harnessOpt) *harness {
	t.Helper()
	o := harnessOpts{sampler: sdktrace.AlwaysSample(), policy: routing.NewRoundRobin()}
	for _, f := range opts {
		f(&o)
	}
	// The per-event histograms as the binary records them (telemetry.Setup):
	// outside the SDK, through a producer on the reader.
	events := telemetry.NewEventHistograms(0)
	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(events.Producer(metricdata.CumulativeTemporality, false)))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var spans *tracetest.SpanRecorder
	sp := o.spans
	if sp == nil {
		spans = tracetest.NewSpanRecorder()
		sp = spans
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp), sdktrace.WithSampler(o.sampler))
	m, err := telemetry.NewMetrics(mp, telemetry.WithEventHistograms(events))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw, err := New(cfg, o.policy, m, append([]Option{WithTracerProvider(tp), WithLogger(log)}, gwOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !o.noStart {
		gw.Start()
	}
	h := &harness{t: t, gw: gw, reader: reader, spans: spans, metrics: m}
	h.srv = httptest.NewUnstartedServer(gw.Handler())
	h.srv.Config.BaseContext = gw.BaseContext
	// net/http's own complaints (such as "superfluous response.WriteHeader
	// call") are kept so tests can assert there are none (docs/cases.md L05).
	h.srv.Config.ErrorLog = stdlog.New(&h.serverLog, "", 0)
	h.srv.Start()
	h.client = h.srv.Client()
	t.Cleanup(func() {
		h.srv.CloseClientConnections()
		h.srv.Close()
		_ = gw.Close()
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	return h
}

// sim starts a simulated engine (enginetest.Fast's timings unless cfg
// sets its own) on a loopback listener.
func sim(t testing.TB, cfg enginesim.Config) (*enginesim.Engine, *httptest.Server) {
	t.Helper()
	return enginetest.Start(t, enginetest.Fast(cfg))
}

// newSim builds a simulated engine with enginetest.Fast's timings.
func newSim(t testing.TB, cfg enginesim.Config) *enginesim.Engine {
	t.Helper()
	e, err := enginesim.New(enginetest.Fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// waitAborted waits up to 2 s for the engine to have counted want aborted
// requests (the gateway cancelled them, or their client left), and fails the
// test if it has not.
func waitAborted(t testing.TB, e *enginesim.Engine, want int64) {
	t.Helper()
	testutil.Poll(2*time.Second, func() bool { return e.Stats().Aborted == want })
	if n := e.Stats().Aborted; n != want {
		t.Errorf("engine aborted %d requests, want %d", n, want)
	}
}

func (h *harness) collect() metricdata.ResourceMetrics {
	h.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
		h.t.Fatal(err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// gauges returns switchboard.engine.active_requests per "engine/phase".
func (h *harness) gauges() map[string]int64 {
	h.t.Helper()
	return gaugesOf(h.collect())
}

// gaugesOf returns switchboard.engine.active_requests per "engine/phase"
// from one collection.
func gaugesOf(rm metricdata.ResourceMetrics) map[string]int64 {
	out := map[string]int64{}
	m, ok := findMetric(rm, telemetry.ActiveRequestsName)
	if !ok {
		return out
	}
	sum, _ := m.Data.(metricdata.Sum[int64])
	for _, dp := range sum.DataPoints {
		e, _ := dp.Attributes.Value(telemetry.AttrEngine)
		p, _ := dp.Attributes.Value(telemetry.AttrPhase)
		out[e.AsString()+"/"+p.AsString()] = dp.Value
	}
	return out
}

// assertIdle fails unless every gauge reads exactly 0 and no attempt is live.
func (h *harness) assertIdle() {
	h.t.Helper()
	for k, v := range h.gauges() {
		if v != 0 {
			h.t.Errorf("gauge %s = %d, want 0", k, v)
		}
	}
	if n := h.gw.LiveAttempts(); n != 0 {
		h.t.Errorf("live attempts = %d, want 0", n)
	}
}

// waitIdle waits (bounded) for in-flight requests to settle, then asserts.
func (h *harness) waitIdle() {
	h.t.Helper()
	testutil.Poll(3*time.Second, func() bool { return h.gw.LiveAttempts() == 0 })
	h.assertIdle()
}

// hist sums the count and the sum of histogram name over the data points
// whose attributes include every kv in match.
func (h *harness) hist(name string, match ...attribute.KeyValue) (count uint64, sum float64) {
	h.t.Helper()
	m, ok := findMetric(h.collect(), name)
	if !ok {
		return 0, 0
	}
	switch hd := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range hd.DataPoints {
			if hasAll(dp.Attributes, match) {
				count += dp.Count
				sum += dp.Sum
			}
		}
	case metricdata.Histogram[int64]:
		for _, dp := range hd.DataPoints {
			if hasAll(dp.Attributes, match) {
				count += dp.Count
				sum += float64(dp.Sum)
			}
		}
	default:
		h.t.Fatalf("%s is %T", name, m.Data)
	}
	return count, sum
}

// histCount is the count part of hist.
func (h *harness) histCount(name string, match ...attribute.KeyValue) uint64 {
	h.t.Helper()
	n, _ := h.hist(name, match...)
	return n
}

// histSum is the sum part of hist.
func (h *harness) histSum(name string, match ...attribute.KeyValue) float64 {
	h.t.Helper()
	_, s := h.hist(name, match...)
	return s
}

// counter returns the total of an Int64 counter over its data points
// with every kv of match (all of them when match is empty).
func (h *harness) counter(name string, match ...attribute.KeyValue) int64 {
	h.t.Helper()
	m, ok := findMetric(h.collect(), name)
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if hasAll(dp.Attributes, match) {
			n += dp.Value
		}
	}
	return n
}

// errorTypes returns the request.duration count per error.type ("" for
// success).
func (h *harness) errorTypes() map[string]uint64 {
	h.t.Helper()
	return errorTypesOf(h.collect(), telemetry.RequestDurationName)
}

// errorTypesOf returns the count of histogram name per error.type ("" for
// success) from one collection.
func errorTypesOf(rm metricdata.ResourceMetrics, name string) map[string]uint64 {
	out := map[string]uint64{}
	m, ok := findMetric(rm, name)
	if !ok {
		return out
	}
	hist, _ := m.Data.(metricdata.Histogram[float64])
	for _, dp := range hist.DataPoints {
		v, _ := dp.Attributes.Value(telemetry.AttrErrorType)
		out[v.AsString()] += dp.Count
	}
	return out
}

func hasAll(set attribute.Set, match []attribute.KeyValue) bool {
	for _, kv := range match {
		v, ok := set.Value(kv.Key)
		if !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// post sends a JSON body to path on the gateway.
func (h *harness) post(path, body string, hdr ...string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

// apiErr is the decoded OpenAI error object.
type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    any     `json:"code"` // a string from the gateway; vLLM sends its status as a number
	} `json:"error"`
}

// code returns the error code as a string ("" when null).
func (e apiErr) code() string {
	switch c := e.Error.Code.(type) {
	case string:
		return c
	case float64:
		return strconv.Itoa(int(c))
	}
	return ""
}

func decodeErr(t *testing.T, resp *http.Response) apiErr {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e apiErr
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
		t.Fatalf("body %q is not an OpenAI error object: %v", b, err)
	}
	return e
}

// fakeEngine is an httptest server with a handler the test writes; it
// also answers /health and /v1/models for the given models.
func fakeEngine(t *testing.T, models []string, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		var data []map[string]string
		for _, m := range models {
			data = append(data, map[string]string{"id": m, "object": "model"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	})
	mux.HandleFunc("/v1/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// recorder collects what a fake engine received.
type recorder struct {
	mu   sync.Mutex
	reqs []*http.Request
	body []string
}

func (r *recorder) add(req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, req)
	r.body = append(r.body, string(b))
}

func (r *recorder) last() *http.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}

// sseWriter writes SSE events with a flush after each.
type sseWriter struct {
	w http.ResponseWriter
	f *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sseWriter {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, f: http.NewResponseController(w)}
	_ = s.f.Flush()
	return s
}

func (s *sseWriter) raw(str string) {
	_, _ = io.WriteString(s.w, str)
	_ = s.f.Flush()
}

func (s *sseWriter) data(str string) { s.raw("data: " + str + "\n\n") }

// opNamed returns the operation-table row called name.
func opNamed(t testing.TB, name string) *operation {
	t.Helper()
	for _, op := range operations {
		if op.name == name {
			return op
		}
	}
	t.Fatalf("no operation %q", name)
	return nil
}

// recordedSim starts a simulated engine behind a bodyRecorder.
func recordedSim(t testing.TB, cfg enginesim.Config) (*enginesim.Engine, *bodyRecorder, *httptest.Server) {
	t.Helper()
	e := newSim(t, cfg)
	rec := &bodyRecorder{next: e.Handler()}
	return e, rec, enginetest.Serve(t, rec)
}

// do sends method path with body and returns the status, the Content-Type
// and the body.
func (h *harness) do(method, path, body string, hdr ...string) (int, http.Header, []byte) {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.srv.URL+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// engineStates reads switchboard.engine.state: the state each engine is
// in (the one value at 1), by engine.
func (h *harness) engineStates() map[string]string {
	h.t.Helper()
	m, ok := findMetric(h.collect(), telemetry.EngineStateName)
	if !ok {
		return nil
	}
	out := map[string]string{}
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		if dp.Value == 1 {
			e, _ := dp.Attributes.Value(telemetry.AttrEngine)
			s, _ := dp.Attributes.Value(telemetry.AttrState)
			out[e.AsString()] = s.AsString()
		}
	}
	return out
}
