package telemetry

import (
	"context"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names of prefill/decode disaggregation
// (gateway.DisaggregationConfig): a request whose prompt is computed on a
// prefill engine, whose KV cache a decode engine then pulls (vLLM's
// NixlConnector) to generate the answer.
const (
	// DisaggRequestsName counts the disaggregation decision of each
	// generative request to a model whose engines have both roles, unit
	// {request}, by AttrDisaggMode: disaggregated (a prefill leg, then a
	// decode leg with its kv_transfer_params), aggregated (one engine does
	// it all: a short uncached prompt, n > 1, client kv_transfer_params)
	// and recompute (the prefill leg answered without kv_transfer_params,
	// so the decode engine computes the prompt again, on purpose and
	// counted). llm-d's pd-profile-handler makes the same decision.
	DisaggRequestsName = "switchboard.disaggregation.requests"
	// DisaggPrefillDurationName is the prefill leg's duration, unit s, by
	// the prefill engine (AttrEngine) and model: from sending it to its
	// reply read whole, retries on other prefill engines not included.
	DisaggPrefillDurationName = "switchboard.disaggregation.prefill.duration"
	// DisaggHandoverName is the handover, unit s, by the decode engine
	// and model: from the prefill leg's reply to the first event of the
	// decode engine's stream (its queue and the KV pull, which vLLM does
	// before it sends a stream's first event; the headers come before
	// both). Recorded for a decode leg sent the params and streamed by
	// its engine (a client's stream, or a request read as one); not for a
	// body the engine answers whole, whose first byte comes after the
	// whole generation.
	DisaggHandoverName = "switchboard.disaggregation.handover.duration"
	// DisaggKVFailuresName counts KV transfers that did not happen, unit
	// {request}, by AttrDisaggKVFailure: missing_params (the prefill
	// leg's 2xx reply had no kv_transfer_params object) and
	// not_transferred (the decode engine's usage reports fewer cached
	// prompt tokens than the prompt less one block: it recomputed the
	// prompt, vLLM's kv_load_failure_policy "recompute"), and abandoned
	// (the prefill engine answered with params that no decode engine was
	// sent: the client left between the legs, the decode engines could not
	// be reached, or a retry went without them; vLLM's prefill engine then
	// holds the prompt's blocks until its abort timeout,
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by default).
	DisaggKVFailuresName = "switchboard.disaggregation.kv_transfer.failures"
)

// Attribute keys of the disaggregation instruments.
const (
	// AttrDisaggMode is disaggregated, aggregated or recompute.
	AttrDisaggMode = attribute.Key("mode")
	// AttrDisaggKVFailure is missing_params, not_transferred or abandoned.
	AttrDisaggKVFailure = attribute.Key("reason")
	// AttrLeg is the kind of an engine span's leg on a disaggregated
	// request: prefill or decode (absent on other requests).
	AttrLeg = attribute.Key("switchboard.leg")
)

// The values of AttrDisaggMode and AttrDisaggKVFailure.
const (
	DisaggModeDisaggregated = "disaggregated"
	DisaggModeAggregated    = "aggregated"
	DisaggModeRecompute     = "recompute"

	KVFailureMissingParams  = "missing_params"
	KVFailureNotTransferred = "not_transferred"
	KVFailureAbandoned      = "abandoned"
)

type disaggInstruments struct {
	requests, kvFailures metric.Int64Counter
	prefill, handover    metric.Float64Histogram
	// modes and failures are the attribute options of each value of
	// disaggModes and kvFailures, index for index.
	modes    [len(disaggModes)][]metric.AddOption
	failures [len(kvFailures)][]metric.AddOption
}

// The bounded values of AttrDisaggMode and AttrDisaggKVFailure.
var (
	disaggModes = [...]string{DisaggModeDisaggregated, DisaggModeAggregated, DisaggModeRecompute}
	kvFailures  = [...]string{KVFailureMissingParams, KVFailureNotTransferred, KVFailureAbandoned}
)

func (r *disaggInstruments) init(meter metric.Meter) []error {
	var errs []error
	var err error
	nm := noop.NewMeterProvider().Meter("")
	if r.requests, err = meter.Int64Counter(DisaggRequestsName, metric.WithUnit("{request}"),
		metric.WithDescription("Disaggregation decisions of generative requests to models served by prefill and decode engines, by mode.")); err != nil {
		errs = append(errs, err)
		r.requests, _ = nm.Int64Counter(DisaggRequestsName)
	}
	if r.kvFailures, err = meter.Int64Counter(DisaggKVFailuresName, metric.WithUnit("{request}"),
		metric.WithDescription("Disaggregated requests whose KV cache was not transferred from the prefill engine, by reason.")); err != nil {
		errs = append(errs, err)
		r.kvFailures, _ = nm.Int64Counter(DisaggKVFailuresName)
	}
	if r.prefill, err = meter.Float64Histogram(DisaggPrefillDurationName, metric.WithUnit("s"),
		metric.WithDescription("Duration of the prefill leg of disaggregated requests, by prefill engine."),
		metric.WithExplicitBucketBoundaries(ttftBuckets...)); err != nil {
		errs = append(errs, err)
		r.prefill, _ = nm.Float64Histogram(DisaggPrefillDurationName)
	}
	if r.handover, err = meter.Float64Histogram(DisaggHandoverName, metric.WithUnit("s"),
		metric.WithDescription("Time from a prefill leg's reply to the decode engine's first event, by decode engine."),
		metric.WithExplicitBucketBoundaries(ttftBuckets...)); err != nil {
		errs = append(errs, err)
		r.handover, _ = nm.Float64Histogram(DisaggHandoverName)
	}
	for i, v := range disaggModes {
		r.modes[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrDisaggMode.String(v)))}
	}
	for i, v := range kvFailures {
		r.failures[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrDisaggKVFailure.String(v)))}
	}
	return errs
}

// RecordDisaggregation counts one disaggregation decision; mode is one of
// the DisaggMode values (any other is not recorded).
func (m *Metrics) RecordDisaggregation(ctx context.Context, mode string) {
	if i := slices.Index(disaggModes[:], mode); i >= 0 {
		m.disagg.requests.Add(ctx, 1, m.disagg.modes[i]...)
	}
}

// RecordKVTransferFailure counts one KV transfer that did not happen;
// reason is one of the KVFailure values (any other is not recorded).
func (m *Metrics) RecordKVTransferFailure(ctx context.Context, reason string) {
	if i := slices.Index(kvFailures[:], reason); i >= 0 {
		m.disagg.kvFailures.Add(ctx, 1, m.disagg.failures[i]...)
	}
}

// RecordPrefill records one prefill leg's duration, in seconds, with the
// prefill engine's attributes (engine, model, operation).
func (m *Metrics) RecordPrefill(ctx context.Context, a *Attrs, seconds float64) {
	m.disagg.prefill.Record(ctx, seconds, a.engineModelRec...)
}

// RecordHandover records one handover, in seconds, with the decode
// engine's attributes (engine, model, operation).
func (m *Metrics) RecordHandover(ctx context.Context, a *Attrs, seconds float64) {
	m.disagg.handover.Record(ctx, seconds, a.engineModelRec...)
}
