package telemetry

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// The HTTP server metrics of the public listener, by the OpenTelemetry
// semantic conventions for HTTP (semconv v1.43.0, "HTTP metrics": the
// names, units and attributes otelhttp records).
const (
	HTTPServerRequestDurationName  = "http.server.request.duration"
	HTTPServerRequestBodySizeName  = "http.server.request.body.size"
	HTTPServerResponseBodySizeName = "http.server.response.body.size"
)

var (
	// httpDurationBuckets: semconv's advice (5 ms to 10 s) below 10 s,
	// then up to 30 min like durationBuckets, for generations that run
	// for minutes; 1 ms first, for the light routes.
	httpDurationBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 60, 120, 300, 600, 1200, 1800}
	// bodySizeBuckets are powers of 4 from 64 B to 64 MiB, in bytes.
	bodySizeBuckets = []float64{64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
)

// maxHTTPSets caps the cached attribute sets of the HTTP server metrics.
// The key's parts are bounded (the router's patterns, the known methods,
// status codes 100-599, the protocol versions), so the cap is a backstop:
// past it a request's set is built for it alone, as otelhttp builds one
// for every request.
const maxHTTPSets = 4096

// HTTPRequest is what the HTTP server metrics of one request are keyed by.
// Every field must come from a bounded set: Route a pattern of the router
// ("" when none matched), Method the request's method (any other than the
// methods KnownHTTPMethod names is recorded as _OTHER), Status the status
// code sent (0: none).
type HTTPRequest struct {
	Route  string
	Method string
	Status int
	TLS    bool
	// ProtoMajor and ProtoMinor are the request's HTTP version.
	ProtoMajor, ProtoMinor int
}

// httpServer holds the HTTP server instruments and their attribute sets,
// one per HTTPRequest met, read without a lock (copy on write).
type httpServer struct {
	duration          metric.Float64Histogram
	reqSize, respSize metric.Int64Histogram
	mu                sync.Mutex
	sets              atomic.Pointer[map[HTTPRequest][]metric.RecordOption]
}

func (h *httpServer) init(m metric.Meter) []error {
	var errs []error
	var err error
	if h.duration, err = m.Float64Histogram(HTTPServerRequestDurationName, metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP server requests."), metric.WithExplicitBucketBoundaries(httpDurationBuckets...)); err != nil {
		errs = append(errs, err)
		h.duration, _ = noop.NewMeterProvider().Meter("").Float64Histogram(HTTPServerRequestDurationName)
	}
	ih := func(name, desc string) metric.Int64Histogram {
		i, err := m.Int64Histogram(name, metric.WithUnit("By"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bodySizeBuckets...))
		if err != nil {
			errs = append(errs, err)
			i, _ = noop.NewMeterProvider().Meter("").Int64Histogram(name)
		}
		return i
	}
	h.reqSize = ih(HTTPServerRequestBodySizeName, "Size of HTTP server request bodies.")
	h.respSize = ih(HTTPServerResponseBodySizeName, "Size of HTTP server response bodies.")
	empty := map[HTTPRequest][]metric.RecordOption{}
	h.sets.Store(&empty)
	return errs
}

// RecordHTTPServer records one request of the public listener: its
// duration in seconds and its request and response body sizes in bytes
// (http.server.request.duration, http.server.request.body.size,
// http.server.response.body.size). The attribute set of k is built once
// and cached: a request of a kind already seen allocates nothing.
func (m *Metrics) RecordHTTPServer(ctx context.Context, k HTTPRequest, seconds float64, reqBytes, respBytes int64) {
	h := &m.http
	if !KnownHTTPMethod(k.Method) {
		k.Method = "_OTHER"
	}
	opts, ok := (*h.sets.Load())[k]
	if !ok {
		opts = h.setFor(k)
	}
	h.duration.Record(ctx, seconds, opts...)
	h.reqSize.Record(ctx, reqBytes, opts...)
	h.respSize.Record(ctx, respBytes, opts...)
}

func (h *httpServer) setFor(k HTTPRequest) []metric.RecordOption {
	opts := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(httpAttrs(k)...))}
	h.mu.Lock()
	defer h.mu.Unlock()
	cur := *h.sets.Load()
	if o, ok := cur[k]; ok {
		return o
	}
	if len(cur) >= maxHTTPSets {
		return opts
	}
	next := make(map[HTTPRequest][]metric.RecordOption, len(cur)+1)
	for key, o := range cur {
		next[key] = o
	}
	next[k] = opts
	h.sets.Store(&next)
	return opts
}

// httpAttrs are semconv's attributes of the HTTP server metrics for k:
// http.request.method, url.scheme, network.protocol.name and .version,
// http.response.status_code when a status was sent, http.route when a
// route matched, and error.type (the status code) for a 5xx, as semconv
// asks of servers. server.address and server.port are opt-in there and
// left out: they come from the client's Host header, which is unbounded.
func httpAttrs(k HTTPRequest) []attribute.KeyValue {
	scheme := "http"
	if k.TLS {
		scheme = "https"
	}
	kvs := make([]attribute.KeyValue, 0, 7)
	kvs = append(kvs, semconv.HTTPRequestMethodKey.String(k.Method), semconv.URLScheme(scheme),
		semconv.NetworkProtocolName("http"), semconv.NetworkProtocolVersion(ProtocolVersion(k.ProtoMajor, k.ProtoMinor)))
	if k.Status > 0 {
		kvs = append(kvs, semconv.HTTPResponseStatusCode(k.Status))
	}
	if k.Route != "" {
		kvs = append(kvs, semconv.HTTPRoute(k.Route))
	}
	if k.Status >= 500 {
		kvs = append(kvs, semconv.ErrorTypeKey.String(strconv.Itoa(k.Status)))
	}
	return kvs
}

// ProtocolVersion is network.protocol.version for HTTP major.minor: "1.1",
// "1.0", "2", "3", as semconv spells them.
func ProtocolVersion(major, minor int) string {
	switch {
	case major == 1 && minor == 1:
		return "1.1"
	case major == 1 && minor == 0:
		return "1.0"
	case major >= 2 && minor == 0:
		return strconv.Itoa(major)
	}
	return strconv.Itoa(major) + "." + strconv.Itoa(minor)
}

// KnownHTTPMethod reports whether m is one of the methods semconv names
// for http.request.method (RFC 9110's eight, PATCH of RFC 5789 and QUERY,
// as semconv v1.43.0 lists them). Others
// are recorded as _OTHER, so a client cannot add series; a span names
// them "HTTP" and keeps the method in http.request.method_original.
func KnownHTTPMethod(m string) bool {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY":
		return true
	}
	return false
}
