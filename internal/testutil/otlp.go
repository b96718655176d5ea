package testutil

import (
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLPReceiver is an OTLP/HTTP receiver for tests: it decodes what the SDK
// exporters POST (protobuf, gzip or not) to /v1/traces and /v1/metrics and
// keeps every request. Serve it with httptest.NewServer and point
// OTEL_EXPORTER_OTLP_ENDPOINT at the server. Safe for concurrent use.
type OTLPReceiver struct {
	mu      sync.Mutex
	traces  []*coltracepb.ExportTraceServiceRequest
	metrics []*colmetricpb.ExportMetricsServiceRequest
	errs    []error
}

// Traces returns the trace export requests received so far, in order.
func (rc *OTLPReceiver) Traces() []*coltracepb.ExportTraceServiceRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.traces)
}

// Metrics returns the metric export requests received so far, in order.
func (rc *OTLPReceiver) Metrics() []*colmetricpb.ExportMetricsServiceRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.metrics)
}

// Errors returns the requests it could not decode, as errors.
func (rc *OTLPReceiver) Errors() []error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.errs)
}

// ServeHTTP decodes one export request and answers with the empty export
// response, or 400 for anything else (recorded in Errors).
func (rc *OTLPReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fail := func(err error) {
		rc.mu.Lock()
		rc.errs = append(rc.errs, err)
		rc.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
	}
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
		fail(errors.New("unexpected " + r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type")))
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			fail(err)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		fail(err)
		return
	}
	var resp proto.Message
	switch r.URL.Path {
	case "/v1/traces":
		req := &coltracepb.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			fail(err)
			return
		}
		rc.mu.Lock()
		rc.traces = append(rc.traces, req)
		rc.mu.Unlock()
		resp = &coltracepb.ExportTraceServiceResponse{}
	case "/v1/metrics":
		req := &colmetricpb.ExportMetricsServiceRequest{}
		if err := proto.Unmarshal(b, req); err != nil {
			fail(err)
			return
		}
		rc.mu.Lock()
		rc.metrics = append(rc.metrics, req)
		rc.mu.Unlock()
		resp = &colmetricpb.ExportMetricsServiceResponse{}
	default:
		fail(errors.New("unexpected path " + r.URL.Path))
		return
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}
