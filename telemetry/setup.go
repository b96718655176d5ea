package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/switchboard-gw/switchboard/internal/loglimit"
)

// Config is the `telemetry` section of the gateway configuration. OTLP
// endpoints, protocols, headers and the sampler are not here: they come from
// the standard OTEL_* environment variables.
type Config struct {
	// ServiceName is the default service.name resource attribute;
	// OTEL_SERVICE_NAME overrides it. Default "switchboard".
	ServiceName string `koanf:"service_name"`
	// CardinalityLimit caps the attribute sets kept per instrument (a
	// backstop against unbounded labels). Default 2000.
	CardinalityLimit int `koanf:"cardinality_limit"`
	// SeriesLinger is how long the series of an engine gone and drained
	// keep being exported before they are dropped ([WithSeriesLinger]).
	// Default [DefaultSeriesLinger] (5 min).
	SeriesLinger time.Duration `koanf:"series_linger"`
}

// DefaultConfig returns the telemetry defaults.
func DefaultConfig() Config {
	return Config{ServiceName: "switchboard", CardinalityLimit: 2000, SeriesLinger: DefaultSeriesLinger}
}

// Validate reports every problem with c, joined.
func (c Config) Validate() error {
	var errs []error
	if c.ServiceName == "" {
		errs = append(errs, errors.New("telemetry.service_name must not be empty"))
	}
	if c.CardinalityLimit < 0 {
		errs = append(errs, fmt.Errorf("telemetry.cardinality_limit must be >= 0, got %d", c.CardinalityLimit))
	}
	if c.SeriesLinger <= 0 {
		errs = append(errs, fmt.Errorf("telemetry.series_linger must be > 0, got %s", c.SeriesLinger))
	}
	return errors.Join(errs...)
}

// Providers are the OpenTelemetry providers built by [Setup].
type Providers struct {
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
	// Propagator is W3C trace context plus baggage.
	Propagator propagation.TextMapPropagator
	// Prometheus serves the OTel metrics in the Prometheus exposition
	// format, plus Go runtime and process collectors.
	Prometheus http.Handler
	// OTLPTraces and OTLPMetrics report whether an OTLP (or other
	// autoexport) exporter was configured from the environment.
	OTLPTraces, OTLPMetrics bool

	// Events are the per-event histograms ([EventHistograms]), with a
	// producer on every reader of MeterProvider: pass them to
	// [NewMetrics] with [WithEventHistograms]. nil when a reader could
	// not take them (an OTLP exporter with another histogram
	// aggregation, or a non-OTLP OTEL_METRICS_EXPORTER): the SDK then
	// records those instruments too.
	Events *EventHistograms

	// series drops gone engines' series from the Prometheus handler and
	// the OTLP metric exporter ([Providers.SetEngineLive]).
	series *seriesFilter
}

// Setup builds the tracer and meter providers from cfg and the OTEL_*
// environment. It returns a shutdown function that flushes and stops every
// exporter (join its error), or an error if an exporter is misconfigured
// (for example an unknown OTEL_EXPORTER_OTLP_PROTOCOL). With no OTLP
// variables set it logs one line saying metrics are served on Prometheus
// only.
func Setup(ctx context.Context, cfg Config, log *slog.Logger) (*Providers, func(context.Context) error, error) {
	if log == nil {
		log = slog.Default()
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(cfg.ServiceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil && res == nil {
		return nil, nil, fmt.Errorf("telemetry resource: %w", err)
	}

	// Exporter and SDK errors (a collector that is down, say) go to the
	// gateway's structured log instead of the standard logger.
	// At a bounded rate: a collector that is down fails every export.
	errLog := newErrorLog(log, ErrorLogInterval, time.Now)
	otel.SetErrorHandler(errLog)
	disabled := strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true")

	p := &Providers{Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), series: newSeriesFilter()}
	var shutdowns []func(context.Context) error
	shutdown := func(ctx context.Context) error {
		var errs []error
		for i := len(shutdowns) - 1; i >= 0; i-- {
			errs = append(errs, shutdowns[i](ctx))
		}
		errLog.flush() // the errors no line has counted yet
		return errors.Join(errs...)
	}

	// Traces. The SDK reads OTEL_TRACES_SAMPLER(_ARG) itself.
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if disabled {
		// OTEL_SDK_DISABLED: no spans, no OTLP. The Prometheus endpoint
		// stays: it is the gateway's own metrics surface.
		tpOpts = append(tpOpts, sdktrace.WithSampler(sdktrace.NeverSample()))
	} else if signalConfigured("TRACES") {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("trace exporter: %w", err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			// The batch processor drops spans when its queue is full
			// rather than blocking the request path.
			tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
			p.OTLPTraces = true
		}
	}
	p.TracerProvider = sdktrace.NewTracerProvider(tpOpts...)
	shutdowns = append(shutdowns, p.TracerProvider.Shutdown)

	// Metrics: always the Prometheus reader; OTLP when configured. The
	// per-event histograms (EventHistograms) go to both through
	// producers, unless the OTLP reader cannot take them: then the SDK
	// records them, for every reader.
	events := NewEventHistograms(cfg.CardinalityLimit)
	var otlpReader sdkmetric.Reader
	if os.Getenv("OTEL_METRICS_EXPORTER") == "prometheus" {
		log.Info("OTEL_METRICS_EXPORTER=prometheus: metrics are already served on the admin listener's /metrics; no second Prometheus server started")
	} else if !disabled && signalConfigured("METRICS") {
		// autoexport's reader, but for OTLP with the exporter wrapped so
		// gone engines' points are left out (SetEngineLive).
		r, eventsOK, err := newMetricReader(ctx, p.series, events)
		if err != nil {
			_ = shutdown(ctx)
			return nil, nil, fmt.Errorf("metric reader: %w", err)
		}
		if !eventsOK {
			events = nil
		}
		if !autoexport.IsNoneMetricReader(r) {
			otlpReader = r
			p.OTLPMetrics = true
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	promOpts := []promexporter.Option{promexporter.WithRegisterer(reg), promexporter.WithoutScopeInfo()}
	if events != nil {
		promOpts = append(promOpts, promexporter.WithProducer(events.Producer(metricdata.CumulativeTemporality, false)))
	}
	promExp, err := promexporter.New(promOpts...)
	if err != nil {
		if otlpReader != nil {
			_ = otlpReader.Shutdown(ctx)
		}
		_ = shutdown(ctx)
		return nil, nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	// OpenMetrics when the scraper asks for it (Prometheus does): it is
	// the text format that carries exemplars, each histogram sample's
	// trace id. The gatherer leaves out gone engines' samples
	// (SetEngineLive).
	p.Prometheus = promhttp.HandlerFor(seriesGatherer{reg, p.series}, promhttp.HandlerOpts{EnableOpenMetrics: true})
	mpOpts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(promExp)}
	if otlpReader != nil {
		mpOpts = append(mpOpts, sdkmetric.WithReader(otlpReader))
	}
	if cfg.CardinalityLimit > 0 {
		mpOpts = append(mpOpts, sdkmetric.WithCardinalityLimit(cfg.CardinalityLimit))
	}
	p.Events = events
	p.MeterProvider = sdkmetric.NewMeterProvider(mpOpts...)
	shutdowns = append(shutdowns, p.MeterProvider.Shutdown)

	if disabled {
		log.Info("OTEL_SDK_DISABLED=true: no spans and no OTLP export; metrics are served on the admin /metrics endpoint only")
	} else if !p.OTLPTraces && !p.OTLPMetrics {
		log.Info("no OTLP exporter configured (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces and metrics); metrics are served on the admin /metrics endpoint only")
	} else {
		log.Info("telemetry export configured", "traces", p.OTLPTraces, "metrics", p.OTLPMetrics)
	}
	return p, shutdown, nil
}

// ErrorLogInterval is the least time between two log lines for
// OpenTelemetry export and SDK errors; the errors in between are counted
// and the count is logged with the next line.
const ErrorLogInterval = 10 * time.Second

// errorLog is the OpenTelemetry error handler: it logs the first error,
// then at most one line per interval, each with the number of errors
// suppressed since the last line. It never blocks an exporter for long:
// one mutex and a log call. Safe for concurrent use.
type errorLog struct {
	log   *slog.Logger
	now   func() time.Time
	limit loglimit.Limiter
}

func newErrorLog(log *slog.Logger, interval time.Duration, now func() time.Time) *errorLog {
	return &errorLog{log: log, now: now, limit: loglimit.Limiter{Interval: interval}}
}

// Handle implements otel.ErrorHandler.
func (l *errorLog) Handle(err error) {
	if n, ok := l.limit.Allow(l.now()); ok {
		l.log.Warn("opentelemetry export error", "error", err, "suppressed", n)
	}
}

// flush logs the number of errors suppressed since the last line, if any.
func (l *errorLog) flush() {
	if n := l.limit.Flush(); n > 0 {
		l.log.Warn("opentelemetry export errors not logged", "suppressed", n)
	}
}

// signalConfigured reports whether the environment asks for an exporter for
// signal ("TRACES" or "METRICS"): OTEL_<SIGNAL>_EXPORTER, or an OTLP
// endpoint (general or per signal). Without one, autoexport would default to
// OTLP on localhost and log export errors forever; we export nothing instead.
func signalConfigured(signal string) bool {
	for _, k := range []string{"OTEL_" + signal + "_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_" + signal + "_ENDPOINT"} {
		if os.Getenv(k) != "" {
			return true
		}
	}
	return false
}
