package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// defaultServiceName is the service.name of the engine's spans when OTEL_SERVICE_NAME is not
// set. vLLM leaves it to the OpenTelemetry Python SDK ("unknown_service"); its tracing
// example sets OTEL_SERVICE_NAME=vllm-server, which the simulator takes as its default.
const defaultServiceName = "vllm-server"

// instrumentingModule is the vllm.instrumenting_module_name resource attribute vLLM's
// init_tracer sets for the API server's tracer.
const instrumentingModule = "vllm.llm_engine"

// newTracerProvider returns a provider exporting spans to endpoint in batches, the way vLLM's
// --otlp-traces-endpoint does: over OTLP/gRPC (plaintext unless the URL is https://) unless
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is http/protobuf, in which case endpoint is the full
// URL spans are posted to (http://host:4318/v1/traces; a URL without a path gets /v1/traces).
// The resource has service.name from OTEL_SERVICE_NAME (default [defaultServiceName]),
// OTEL_RESOURCE_ATTRIBUTES, and vLLM's vllm.instrumenting_module_name and vllm.process_id.
// The other OTEL_EXPORTER_OTLP_* variables (headers, timeout, ...) apply as the SDK defines.
func newTracerProvider(ctx context.Context, endpoint string) (*sdktrace.TracerProvider, error) {
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = "grpc" // vLLM's default
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case "grpc":
		host, secure, perr := grpcTarget(endpoint)
		if perr != nil {
			return nil, perr
		}
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(host)}
		if !secure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	case "http/protobuf":
		u, perr := url.Parse(endpoint)
		if perr != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("--otlp-traces-endpoint %q: want an http:// or https:// URL with http/protobuf", endpoint)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/traces"
		}
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	default:
		return nil, fmt.Errorf("unsupported OTLP protocol %q in OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (want grpc or http/protobuf)", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(
			semconv.ServiceName(defaultServiceName),
			attribute.String("vllm.instrumenting_module_name", instrumentingModule),
			attribute.String("vllm.process_id", strconv.Itoa(os.Getpid())),
		),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
	)
	if err != nil && res == nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp)), nil
}

// grpcTarget returns the host:port of a gRPC endpoint given as host:port or as a URL
// (http://, https:// or grpc://, as in vLLM's examples), and whether it uses TLS (https).
func grpcTarget(endpoint string) (host string, secure bool, err error) {
	if !strings.Contains(endpoint, "://") {
		if endpoint == "" {
			return "", false, fmt.Errorf("--otlp-traces-endpoint is empty")
		}
		return endpoint, false, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", false, fmt.Errorf("--otlp-traces-endpoint %q: not a URL or host:port", endpoint)
	}
	switch u.Scheme {
	case "http", "grpc":
		return u.Host, false, nil
	case "https":
		return u.Host, true, nil
	}
	return "", false, fmt.Errorf("--otlp-traces-endpoint %q: scheme %q, want http, https or grpc", endpoint, u.Scheme)
}
