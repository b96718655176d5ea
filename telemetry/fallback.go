package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// FallbacksName counts the requests sent to a fallback model
// (models.fallbacks, models.context_fallbacks), unit {request}, by
// AttrModel (the model the client asked for), AttrFallback (the model it
// was sent to instead) and AttrFallbackReason. A request that moves down
// its list twice counts twice. Both model names come from the
// configuration's fallback lists, so the attribute sets are bounded.
const FallbacksName = "switchboard.request.fallbacks"

// AttrFallback is the model a request was sent to instead of the one it
// named (a configured fallback model name).
const AttrFallback = attribute.Key("fallback")

// AttrFallbackReason is why a request went to a fallback model:
// "unavailable" (no engine of the model could take it), "failed" (every
// engine tried failed before anything reached the client), "context"
// (too long for the model's max_model_len) or "continuation" (a
// generation broken after its first tokens reached the client, with no
// engine of its model left, continued on the fallback from its text).
const AttrFallbackReason = attribute.Key("reason")

// EventFallback, on the server span, marks a request sent to a fallback
// model, with AttrFallbackModel, the model it named (AttrSpanModel) and
// AttrFallbackReason.
const EventFallback = "fallback"

// Span attributes of EventFallback.
const (
	// AttrFallbackModel is switchboard.fallback: the model sent to.
	AttrFallbackModel = attribute.Key("switchboard.fallback")
	// AttrSpanModel is switchboard.model: the model the client named.
	AttrSpanModel = attribute.Key("switchboard.model")
)

type fallbackInstruments struct {
	fallbacks metric.Int64Counter
}

func (f *fallbackInstruments) init(meter metric.Meter) []error {
	var err error
	if f.fallbacks, err = meter.Int64Counter(FallbacksName, metric.WithUnit("{request}"),
		metric.WithDescription("Requests sent to a fallback model, by the model asked for, the fallback and the reason.")); err != nil {
		f.fallbacks, _ = noop.NewMeterProvider().Meter("").Int64Counter(FallbacksName)
		return []error{err}
	}
	return nil
}

// RecordFallback counts one request sent from model to fallback for
// reason; model and fallback must be configured names (bounded), reason
// one of AttrFallbackReason's values.
func (m *Metrics) RecordFallback(ctx context.Context, model, fallback, reason string) {
	m.fallback.fallbacks.Add(ctx, 1, metric.WithAttributes(AttrModel.String(model), AttrFallback.String(fallback), AttrFallbackReason.String(reason)))
}
