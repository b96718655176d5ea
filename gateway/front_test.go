package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// histPoint is one data point of a histogram: its attributes, count and
// sum.
type histPoint struct {
	set   attribute.Set
	count uint64
	sum   float64
}

// httpPoints returns the data points of the int64 or float64 histogram
// name, by attribute set.
func httpPoints(t *testing.T, h *harness, name string) map[attribute.Distinct]histPoint {
	t.Helper()
	out := map[attribute.Distinct]histPoint{}
	m, ok := findMetric(h.collect(), name)
	if !ok {
		return out
	}
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out[dp.Attributes.Equivalent()] = histPoint{dp.Attributes, dp.Count, dp.Sum}
		}
	case metricdata.Histogram[int64]:
		for _, dp := range d.DataPoints {
			out[dp.Attributes.Equivalent()] = histPoint{dp.Attributes, dp.Count, float64(dp.Sum)}
		}
	default:
		t.Fatalf("%s is %T", name, m.Data)
	}
	return out
}

func attrOf(set attribute.Set, k string) string {
	v, ok := set.Value(attribute.Key(k))
	if !ok {
		return ""
	}
	return v.Emit()
}

// TestHTTPServerMetrics: every request of the public listener but the
// probes is one http.server.request.duration sample with semconv's
// attributes (method, scheme, protocol, status, route; error.type on a
// 5xx; an unknown method as _OTHER), and its body sizes are the bytes that
// crossed the wire.
func TestHTTPServerMetrics(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}))
	const body = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	status, _, chat := h.do(http.MethodPost, "/v1/chat/completions", body)
	if status != 200 {
		t.Fatalf("chat: %d %s", status, chat)
	}
	if status, _, _ := h.do(http.MethodGet, "/health", ""); status != 200 {
		t.Fatalf("health: %d", status)
	}
	status, _, nf := h.do(http.MethodPost, "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	if status != 404 {
		t.Fatalf("unknown model: %d %s", status, nf)
	}
	if status, _, _ := h.do("BREW", "/v1/chat/completions", body); status != http.StatusMethodNotAllowed {
		t.Fatalf("BREW: %d", status)
	}
	// A 5xx: every engine gone.
	simSrv.Close()
	h.gw.Fleet().ProbeNow(context.Background())
	status, _, unavailable := h.do(http.MethodPost, "/v1/chat/completions", body)
	if status < 500 {
		t.Fatalf("with the engine gone: %d %s", status, unavailable)
	}

	type want struct {
		method, status, route, errType string
		reqBytes, respBytes            int
	}
	wants := []want{
		{"POST", "200", "/v1/chat/completions", "", len(body), len(chat)},
		{"POST", "404", "/v1/chat/completions", "", len(`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`), len(nf)},
		// The body of a refused method is never read: 0 bytes crossed.
		{"_OTHER", "405", "", "", 0, -1},
		{"POST", itoa(status), "/v1/chat/completions", itoa(status), len(body), len(unavailable)},
	}
	dur := httpPoints(t, h, telemetry.HTTPServerRequestDurationName)
	reqs := httpPoints(t, h, telemetry.HTTPServerRequestBodySizeName)
	resps := httpPoints(t, h, telemetry.HTTPServerResponseBodySizeName)
	if len(dur) != len(wants) {
		for _, p := range dur {
			t.Logf("point %v", p.set.Encoded(attribute.DefaultEncoder()))
		}
		t.Fatalf("%d duration points, want %d (the probe is not one)", len(dur), len(wants))
	}
	for _, w := range wants {
		found := false
		for k, p := range dur {
			s := p.set
			if attrOf(s, "http.request.method") != w.method || attrOf(s, "http.response.status_code") != w.status ||
				attrOf(s, "http.route") != w.route || attrOf(s, "error.type") != w.errType {
				continue
			}
			found = true
			if p.count != 1 || p.sum <= 0 {
				t.Errorf("%v: count %d sum %v, want one positive sample", w, p.count, p.sum)
			}
			if attrOf(s, "url.scheme") != "http" || attrOf(s, "network.protocol.name") != "http" || attrOf(s, "network.protocol.version") != "1.1" {
				t.Errorf("%v: attributes %s", w, s.Encoded(attribute.DefaultEncoder()))
			}
			if _, ok := s.Value("server.address"); ok {
				t.Errorf("%v: server.address (opt-in, from the client's Host) on a metric", w)
			}
			if got := reqs[k]; got.count != 1 || int(got.sum) != w.reqBytes {
				t.Errorf("%v: request body size %v over %d samples, want %d", w, got.sum, got.count, w.reqBytes)
			}
			if got := resps[k]; got.count != 1 || (w.respBytes >= 0 && int(got.sum) != w.respBytes) {
				t.Errorf("%v: response body size %v over %d samples, want %d", w, got.sum, got.count, w.respBytes)
			}
		}
		if !found {
			t.Errorf("no duration point for %+v", w)
		}
	}
}

// TestServerSpan: the server span of a proxied request is named by its
// route, carries semconv's request and response attributes and the request
// id, and is a child of the client's trace; a 5xx sets its status to Error
// with error.type.
func TestServerSpan(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}))
	const body = `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	status, _, resp := h.do(http.MethodPost, "/v1/chat/completions", body, "traceparent", parent, "X-Request-Id", "req-1", "User-Agent", "ua/1")
	if status != 200 {
		t.Fatalf("%d %s", status, resp)
	}
	simSrv.Close()
	h.gw.Fleet().ProbeNow(context.Background())
	status5, _, _ := h.do(http.MethodPost, "/v1/chat/completions", body, "X-Request-Id", "req-2")

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range h.spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			spans[attrValue(s.Attributes(), "switchboard.request_id")] = s
		}
	}
	ok := spans["req-1"]
	if ok == nil {
		t.Fatalf("no server span for req-1; server spans: %d", len(spans))
	}
	if ok.Name() != "POST /v1/chat/completions" || ok.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || !ok.Parent().IsRemote() {
		t.Errorf("span %q, parent %v", ok.Name(), ok.Parent())
	}
	for k, v := range map[string]string{
		"http.request.method": "POST", "http.route": "/v1/chat/completions", "http.response.status_code": "200",
		"url.path": "/v1/chat/completions", "url.scheme": "http", "network.protocol.version": "1.1",
		"server.address": "127.0.0.1", "network.peer.address": "127.0.0.1", "user_agent.original": "ua/1",
		"http.request.body.size": itoa(len(body)), "http.response.body.size": itoa(len(resp)),
	} {
		if got := attrValue(ok.Attributes(), k); got != v {
			t.Errorf("req-1 %s = %q, want %q", k, got, v)
		}
	}
	if ok.Status().Code == codes.Error {
		t.Errorf("a 200's span has status %v", ok.Status())
	}
	bad := spans["req-2"]
	if bad == nil {
		t.Fatal("no server span for req-2")
	}
	if bad.Status().Code != codes.Error || attrValue(bad.Attributes(), "error.type") == "" ||
		attrValue(bad.Attributes(), "http.response.status_code") != itoa(status5) {
		t.Errorf("a %d's span: status %v, error.type %q, status code %q", status5, bad.Status(),
			attrValue(bad.Attributes(), "error.type"), attrValue(bad.Attributes(), "http.response.status_code"))
	}
}

// flushErrWriter is a ResponseWriter whose FlushError fails.
type flushErrWriter struct {
	*httptest.ResponseRecorder
	err error
}

func (w flushErrWriter) FlushError() error { return w.err }

// TestRespWriter: the front's writer counts the body, keeps the first
// final status (not a 1xx), takes a flush before any write as net/http's
// implicit 200, passes FlushError's error through, and unwraps.
func TestRespWriter(t *testing.T) {
	w := &respWriter{ResponseWriter: httptest.NewRecorder()}
	w.WriteHeader(http.StatusEarlyHints)
	if w.status != 0 {
		t.Errorf("status %d after a 103, want none yet", w.status)
	}
	rec := httptest.NewRecorder()
	w = &respWriter{ResponseWriter: rec}
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, "hello")
	_, _ = io.WriteString(w, ", world")
	if w.status != http.StatusCreated || w.bytes != int64(len("hello, world")) || rec.Body.String() != "hello, world" {
		t.Errorf("status %d bytes %d body %q", w.status, w.bytes, rec.Body)
	}
	if http.NewResponseController(w).Flush() != nil || !rec.Flushed {
		t.Error("flush did not reach the recorder")
	}

	w = &respWriter{ResponseWriter: httptest.NewRecorder()}
	_ = w.FlushError()
	if w.status != http.StatusOK {
		t.Errorf("status after a first flush %d, want 200", w.status)
	}

	boom := errors.New("write deadline")
	w = &respWriter{ResponseWriter: flushErrWriter{httptest.NewRecorder(), boom}}
	if err := http.NewResponseController(w).Flush(); !errors.Is(err, boom) {
		t.Errorf("Flush = %v, want the connection's error", err)
	}
	if w.Unwrap() == nil {
		t.Error("Unwrap = nil")
	}
	if !strings.Contains(spanMethod("BREW")+spanMethod("GET"), "HTTPGET") {
		t.Errorf("spanMethod: %q %q", spanMethod("BREW"), spanMethod("GET"))
	}
}

// TestPanicAfterResponseStarted: a handler that panics after its first
// write has its connection aborted (the recoverer re-panics
// http.ErrAbortHandler through front), and front still ends its span, with
// error.type panic and status Error, records its one metric sample with
// the 200 that was sent, and logs it once.
func TestPanicAfterResponseStarted(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	var logs testutil.LockedBuffer
	h := newHarnessWith(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}),
		[]Option{WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))})
	srv := httptest.NewServer(h.gw.front(h.gw.recoverer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "partial")
		http.NewResponseController(w).Flush()
		panic("boom")
	}))))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/x")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Error("the client read a whole response: the connection was not aborted")
	}
	var server sdktrace.ReadOnlySpan
	for _, s := range h.spans.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			if server != nil {
				t.Fatal("two server spans")
			}
			server = s
		}
	}
	if server == nil {
		t.Fatal("no server span ended")
	}
	if attrValue(server.Attributes(), "error.type") != ErrTypePanic || server.Status().Code != codes.Error ||
		attrValue(server.Attributes(), "http.response.status_code") != "200" {
		t.Errorf("server span: error.type %q, status %v, status code %q", attrValue(server.Attributes(), "error.type"),
			server.Status(), attrValue(server.Attributes(), "http.response.status_code"))
	}
	dur := httpPoints(t, h, telemetry.HTTPServerRequestDurationName)
	if len(dur) != 1 {
		t.Fatalf("%d duration points, want 1", len(dur))
	}
	for _, p := range dur {
		if p.count != 1 || attrOf(p.set, "http.response.status_code") != "200" {
			t.Errorf("duration point %s count %d", p.set.Encoded(attribute.DefaultEncoder()), p.count)
		}
	}
	if n := strings.Count(logs.String(), "msg=request "); n != 1 || !strings.Contains(logs.String(), "error.type=panic") {
		t.Errorf("%d access-log lines, want 1 with error.type=panic:\n%s", n, logs.String())
	}
}

// TestClientAddress: client.address is the first X-Forwarded-For entry
// only when the peer is a trusted proxy; otherwise the peer, whatever the
// header claims.
func TestClientAddress(t *testing.T) {
	trusted, err := parseTrustedProxies([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		peer, xff, want string
	}{
		{"10.1.2.3:5000", "203.0.113.7, 10.9.9.9", "203.0.113.7"},
		{"10.1.2.3:5000", "", "10.1.2.3"},
		{"198.51.100.1:5000", "203.0.113.7", "198.51.100.1"},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		r.RemoteAddr = c.peer
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		got := ""
		for _, kv := range requestSpanAttrs(r, "id", trusted) {
			if kv.Key == "client.address" {
				got = kv.Value.AsString()
			}
		}
		if got != c.want {
			t.Errorf("peer %s, X-Forwarded-For %q: client.address %q, want %q", c.peer, c.xff, got, c.want)
		}
	}
}
