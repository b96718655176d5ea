package gateway_test

import (
	"log"
	"net/http"

	"github.com/switchboard-gw/switchboard/gateway"
	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// ExampleNew wires a gateway in front of two engines with no-op telemetry
// (cmd/gateway does the same with OTLP and Prometheus providers).
func ExampleNew() {
	cfg := gateway.DefaultConfig()
	cfg.Engines = []fleet.EngineConfig{
		{Name: "gpu-a", URL: "http://10.0.0.5:8000", Models: []string{"llama-3.1-8b"}},
		{Name: "gpu-b", URL: "http://10.0.0.6:8000"}, // models discovered from GET /v1/models
	}
	metrics, err := telemetry.NewMetrics(nil)
	if err != nil {
		log.Fatal(err)
	}
	gw, err := gateway.New(cfg, routing.NewLeastLoaded(2), metrics)
	if err != nil {
		log.Fatal(err)
	}
	defer gw.Close()
	gw.Start()
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:9464", gw.AdminHandler(nil))) }()
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", gw.Handler()))
}
