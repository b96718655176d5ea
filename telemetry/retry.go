package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names of the retry policy (gateway.RetryConfig).
const (
	// RetriesName counts the attempts a request was tried again, unit
	// {retry}, by AttrRetryReason.
	RetriesName = "switchboard.request.retries"
	// RetryBudgetExhaustedName counts the retries not made because the
	// retry budget was spent (too many requests being retried at once),
	// unit {retry}.
	RetryBudgetExhaustedName = "switchboard.request.retry_budget_exhausted"
)

// AttrRetryReason is why a request was tried again: connect_failure,
// reset, header_timeout, first_token_timeout, or the engine status (429,
// 500, 502, 503, 504).
const AttrRetryReason = attribute.Key("reason")

type retryInstruments struct {
	retries, exhausted metric.Int64Counter
}

func (r *retryInstruments) init(meter metric.Meter) []error {
	var errs []error
	var err error
	if r.retries, err = meter.Int64Counter(RetriesName, metric.WithUnit("{retry}"),
		metric.WithDescription("Requests tried again on an engine before anything reached the client, by reason.")); err != nil {
		errs = append(errs, err)
		r.retries, _ = noop.NewMeterProvider().Meter("").Int64Counter(RetriesName)
	}
	if r.exhausted, err = meter.Int64Counter(RetryBudgetExhaustedName, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries not made because the retry budget was spent.")); err != nil {
		errs = append(errs, err)
		r.exhausted, _ = noop.NewMeterProvider().Meter("").Int64Counter(RetryBudgetExhaustedName)
	}
	return errs
}

// RecordRetry counts one retry for reason (a bounded value: see
// AttrRetryReason).
func (m *Metrics) RecordRetry(ctx context.Context, reason string) {
	m.retry.retries.Add(ctx, 1, metric.WithAttributes(AttrRetryReason.String(reason)))
}

// RecordRetryBudgetExhausted counts one retry refused by the retry budget.
func (m *Metrics) RecordRetryBudgetExhausted(ctx context.Context) {
	m.retry.exhausted.Add(ctx, 1)
}
