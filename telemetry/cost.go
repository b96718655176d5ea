package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// RequestCostName is the cost of engine exchanges computed from their
// usage and the configured prices (the gateway's pricing list), unit
// {USD} (US dollars; UCUM has no currency unit, so an annotation), by
// engine (AttrEngine), model (AttrModel) and API key (AttrKeyName; absent
// without auth). Recorded once per exchange that has a price, when it
// ends: a request that was retried, continued or disaggregated adds one
// value per engine it used.
const RequestCostName = "switchboard.request.cost"

type costInstruments struct {
	cost metric.Float64Counter
}

func (c *costInstruments) init(meter metric.Meter) []error {
	var err error
	if c.cost, err = meter.Float64Counter(RequestCostName, metric.WithUnit("{USD}"),
		metric.WithDescription("Cost of engine exchanges from their usage and the configured prices, in US dollars.")); err != nil {
		c.cost, _ = noop.NewMeterProvider().Meter("").Float64Counter(RequestCostName)
		return []error{err}
	}
	return nil
}

// RecordCost adds one exchange's cost, in USD, for engine e serving
// model, with the API key's name (key "" when the request had none).
func (m *Metrics) RecordCost(ctx context.Context, e *Engine, model, key string, usd float64) {
	if key == "" {
		m.cost.cost.Add(ctx, usd, metric.WithAttributes(AttrEngine.String(e.name), AttrModel.String(model)))
		return
	}
	m.cost.cost.Add(ctx, usd, metric.WithAttributes(AttrEngine.String(e.name), AttrModel.String(model), AttrKeyName.String(key)))
}
