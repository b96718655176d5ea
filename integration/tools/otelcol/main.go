// Command otelcol is a minimal OpenTelemetry Collector distribution with
// exactly the components ../../../otel-collector.yaml uses (the OTLP
// receiver, the memory_limiter and batch processors, the OTLP (gRPC and
// HTTP), debug and Prometheus exporters), built from the Go module proxy so the integration
// tests run the shipped collector configuration for real. It is its own
// module so the collector's dependencies stay out of the gateway's go.mod.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/prometheusexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/otlpexporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/processor/memorylimiterprocessor"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func main() {
	factories := func() (otelcol.Factories, error) {
		var f otelcol.Factories
		var err error
		if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
			return f, err
		}
		if f.Processors, err = otelcol.MakeFactoryMap[processor.Factory](batchprocessor.NewFactory(), memorylimiterprocessor.NewFactory()); err != nil {
			return f, err
		}
		if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](otlpexporter.NewFactory(), otlphttpexporter.NewFactory(), debugexporter.NewFactory(), prometheusexporter.NewFactory()); err != nil {
			return f, err
		}
		f.Telemetry = otelconftelemetry.NewFactory()
		return f, nil
	}
	info := component.BuildInfo{Command: "otelcol-switchboard", Description: "Switchboard integration-test collector", Version: "0.165.0"}
	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory(), envprovider.NewFactory()},
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
