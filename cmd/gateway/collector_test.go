package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// collectorConfig is the part of an OpenTelemetry Collector configuration
// the test checks.
type collectorConfig struct {
	Receivers  map[string]map[string]any `yaml:"receivers"`
	Processors map[string]map[string]any `yaml:"processors"`
	Exporters  map[string]map[string]any `yaml:"exporters"`
	Extensions map[string]map[string]any `yaml:"extensions"`
	Service    struct {
		Extensions []string       `yaml:"extensions"`
		Telemetry  map[string]any `yaml:"telemetry"`
		Pipelines  map[string]struct {
			Receivers  []string `yaml:"receivers"`
			Processors []string `yaml:"processors"`
			Exporters  []string `yaml:"exporters"`
		} `yaml:"pipelines"`
	} `yaml:"service"`
}

// lookup walks nested YAML maps along path ("a.b.c").
func lookup(m map[string]any, path string) any {
	var cur any = m
	for _, k := range strings.Split(path, ".") {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[k]
	}
	return cur
}

// TestCollectorConfig checks the repository's otel-collector.yaml: it
// parses, every component a pipeline names is defined (the collector
// refuses to start otherwise), and the endpoints operators rely on are
// the documented ones.
func TestCollectorConfig(t *testing.T) {
	b, err := os.ReadFile("../../otel-collector.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg collectorConfig
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true) // a misspelt top-level section fails
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("otel-collector.yaml: %v", err)
	}

	// Component IDs are type[/name]; these are the types the contrib
	// distribution provides that this file may use.
	knownTypes := map[string][]string{
		"receiver":  {"otlp"},
		"processor": {"memory_limiter", "batch"},
		"exporter":  {"otlp", "otlp_grpc", "otlp_http", "prometheus", "debug"},
	}
	for kind, defs := range map[string]map[string]map[string]any{"receiver": cfg.Receivers, "processor": cfg.Processors, "exporter": cfg.Exporters} {
		for id := range defs {
			typ, _, _ := strings.Cut(id, "/")
			if !slices.Contains(knownTypes[kind], typ) {
				t.Errorf("%s %q: unexpected component type %q", kind, id, typ)
			}
		}
	}

	check := func(pipeline, kind string, ids []string, defs map[string]map[string]any) {
		if kind != "processor" && len(ids) == 0 {
			t.Errorf("pipeline %s has no %ss", pipeline, kind)
		}
		for _, id := range ids {
			if _, ok := defs[id]; !ok {
				t.Errorf("pipeline %s uses %s %q, which is not defined", pipeline, kind, id)
			}
		}
	}
	type want struct{ receivers, processors, exporters []string }
	wantPipelines := map[string]want{
		"traces":  {[]string{"otlp"}, []string{"memory_limiter", "batch"}, []string{"otlp_grpc/jaeger"}},
		"metrics": {[]string{"otlp"}, []string{"memory_limiter", "batch"}, []string{"prometheus", "otlp_http/prometheus"}},
	}
	if len(cfg.Service.Pipelines) != len(wantPipelines) {
		t.Errorf("pipelines %v, want traces and metrics", cfg.Service.Pipelines)
	}
	for name, w := range wantPipelines {
		p, ok := cfg.Service.Pipelines[name]
		if !ok {
			t.Errorf("no %s pipeline", name)
			continue
		}
		check(name, "receiver", p.Receivers, cfg.Receivers)
		check(name, "processor", p.Processors, cfg.Processors)
		check(name, "exporter", p.Exporters, cfg.Exporters)
		if !slices.Equal(p.Receivers, w.receivers) || !slices.Equal(p.Processors, w.processors) || !slices.Equal(p.Exporters, w.exporters) {
			t.Errorf("pipeline %s = %+v, want %+v", name, p, w)
		}
	}
	for _, id := range cfg.Service.Extensions {
		if _, ok := cfg.Extensions[id]; !ok {
			t.Errorf("service uses extension %q, which is not defined", id)
		}
	}

	values := []struct {
		path string
		got  any
		want any
	}{
		{"receivers.otlp.protocols.grpc.endpoint", lookup(cfg.Receivers["otlp"], "protocols.grpc.endpoint"), "${env:OTLP_GRPC_ENDPOINT:-0.0.0.0:4317}"},
		{"receivers.otlp.protocols.http.endpoint", lookup(cfg.Receivers["otlp"], "protocols.http.endpoint"), "${env:OTLP_HTTP_ENDPOINT:-0.0.0.0:4318}"},
		{"exporters.otlp_grpc/jaeger.endpoint", lookup(cfg.Exporters["otlp_grpc/jaeger"], "endpoint"), "${env:JAEGER_OTLP_ENDPOINT:-127.0.0.1:14317}"},
		{"exporters.otlp_grpc/jaeger.tls.insecure", lookup(cfg.Exporters["otlp_grpc/jaeger"], "tls.insecure"), true},
		{"exporters.prometheus.endpoint", lookup(cfg.Exporters["prometheus"], "endpoint"), "${env:PROMETHEUS_EXPORTER_ENDPOINT:-0.0.0.0:8889}"},
		{"exporters.otlp_http/prometheus.endpoint", lookup(cfg.Exporters["otlp_http/prometheus"], "endpoint"), "${env:PROMETHEUS_OTLP_ENDPOINT:-http://127.0.0.1:9090/api/v1/otlp}"},
		{"exporters.prometheus.metric_expiration", lookup(cfg.Exporters["prometheus"], "metric_expiration"), "5m"},
	}
	for _, v := range values {
		if v.got != v.want {
			t.Errorf("%s = %#v, want %#v", v.path, v.got, v.want)
		}
	}
	if _, ok := cfg.Exporters["debug"]; !ok {
		t.Error("no debug exporter defined")
	}
}
