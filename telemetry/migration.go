package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names of generation continuation (gateway.MigrationConfig):
// a generation broken after its first tokens reached the client,
// continued on another engine from its prompt and generated token ids.
const (
	// MigrationsName counts continuation decisions, unit {continuation},
	// by AttrMigrationReason (what broke the generation) and
	// AttrMigrationOutcome: one per continuation leg when it ends
	// (rescued: it finished the answer; failed: it broke too; cancelled:
	// the client left during it), and one when none could start
	// (limit: migration.limit reached; no_engine: no other engine serves
	// the model). NVIDIA Dynamo's dynamo_frontend_model_migration_total is
	// the peer.
	MigrationsName = "switchboard.request.migrations"
	// MigrationExclusionsName counts broken generations that were not
	// continued because the request is of a kind a continuation cannot
	// reproduce, unit {request}, by AttrMigrationExclusion; each ended as
	// without continuation, with the explicit error event.
	MigrationExclusionsName = "switchboard.request.migration_exclusions"
	// MigrationGapName is the gap at a continuation's seam, unit s: from
	// the last content the client got before the break to the
	// continuation's first content (the continuation's re-prefill and
	// queue included). The client's TTFT is recorded once, by the first
	// leg; this is the second wait it saw.
	MigrationGapName = "switchboard.request.migration_gap"
)

// Attribute keys of the continuation instruments.
const (
	// AttrMigrationReason is what broke the generation: engine_disconnect
	// (EOF or reset before the end), idle_timeout, stream_error (the
	// engine's in-band error event), engine_abort (finish_reason "abort":
	// the engine aborted it, as vLLM does at shutdown) or
	// first_token_timeout.
	AttrMigrationReason = attribute.Key("reason")
	// AttrMigrationOutcome is rescued, failed, cancelled, limit or
	// no_engine (MigrationsName).
	AttrMigrationOutcome = attribute.Key("outcome")
	// AttrMigrationExclusion is why a broken generation could not be
	// continued: structured_output, tools, reasoning, n, logprobs, echo,
	// stop, multimodal, max_tokens or no_token_ids.
	AttrMigrationExclusion = attribute.Key("exclusion")
)

// migrationGapBuckets span 1 ms to 60 s, as TTFT's: the seam is a
// re-prefill of prompt and generated tokens plus any queueing.
var migrationGapBuckets = ttftBuckets

type migrationInstruments struct {
	migrations, exclusions metric.Int64Counter
	gap                    metric.Float64Histogram
}

func (r *migrationInstruments) init(meter metric.Meter) []error {
	var errs []error
	var err error
	if r.migrations, err = meter.Int64Counter(MigrationsName, metric.WithUnit("{continuation}"),
		metric.WithDescription("Broken generations continued on another engine, or not for want of one, by reason and outcome.")); err != nil {
		errs = append(errs, err)
		r.migrations, _ = noop.NewMeterProvider().Meter("").Int64Counter(MigrationsName)
	}
	if r.exclusions, err = meter.Int64Counter(MigrationExclusionsName, metric.WithUnit("{request}"),
		metric.WithDescription("Broken generations not continued because the request is of a kind a continuation cannot reproduce, by exclusion.")); err != nil {
		errs = append(errs, err)
		r.exclusions, _ = noop.NewMeterProvider().Meter("").Int64Counter(MigrationExclusionsName)
	}
	if r.gap, err = meter.Float64Histogram(MigrationGapName, metric.WithUnit("s"),
		metric.WithDescription("Time from the last content before a break to a continuation's first content."),
		metric.WithExplicitBucketBoundaries(migrationGapBuckets...)); err != nil {
		errs = append(errs, err)
		r.gap, _ = noop.NewMeterProvider().Meter("").Float64Histogram(MigrationGapName)
	}
	return errs
}

// RecordMigration counts one continuation decision (bounded values: see
// AttrMigrationReason and AttrMigrationOutcome).
func (m *Metrics) RecordMigration(ctx context.Context, reason, outcome string) {
	m.migration.migrations.Add(ctx, 1, metric.WithAttributes(AttrMigrationReason.String(reason), AttrMigrationOutcome.String(outcome)))
}

// RecordMigrationExclusion counts one broken generation not continued for
// exclusion (a bounded value: see AttrMigrationExclusion).
func (m *Metrics) RecordMigrationExclusion(ctx context.Context, exclusion string) {
	m.migration.exclusions.Add(ctx, 1, metric.WithAttributes(AttrMigrationExclusion.String(exclusion)))
}

// RecordMigrationGap records the gap at one continuation's seam, in
// seconds, with the attributes of the engine that continued.
func (m *Metrics) RecordMigrationGap(ctx context.Context, a *Attrs, seconds float64) {
	m.migration.gap.Record(ctx, seconds, a.engineModelRec...)
}
