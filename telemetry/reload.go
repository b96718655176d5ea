package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// ConfigReloadsName counts configuration reloads (the config file changed,
// SIGHUP or POST /admin/reload), unit {reload}, by AttrResult.
const ConfigReloadsName = "switchboard.config.reloads"

// AttrResult is the outcome of a configuration reload: "applied",
// "rejected" or "unchanged" ([ReloadResult]).
const AttrResult = attribute.Key("result")

// ReloadResult is the outcome of one configuration reload.
type ReloadResult int

const (
	// ReloadApplied: the new configuration is in force (at least one
	// engine, the policy or a setting changed).
	ReloadApplied ReloadResult = iota
	// ReloadRejected: the new configuration could not be read or failed
	// validation; the running one is kept whole.
	ReloadRejected
	// ReloadUnchanged: the new configuration is valid and changes nothing
	// that can change at run time (settings that need a restart may
	// differ).
	ReloadUnchanged
	numReloadResults
)

var reloadResultNames = [numReloadResults]string{"applied", "rejected", "unchanged"}

// String returns the result's AttrResult value.
func (r ReloadResult) String() string {
	if r < 0 || r >= numReloadResults {
		return "unknown"
	}
	return reloadResultNames[r]
}

type reloadInstruments struct {
	reloads metric.Int64Counter
	add     [numReloadResults][]metric.AddOption // pre-built per result
}

func (r *reloadInstruments) init(meter metric.Meter) []error {
	var errs []error
	var err error
	if r.reloads, err = meter.Int64Counter(ConfigReloadsName, metric.WithUnit("{reload}"),
		metric.WithDescription("Configuration reloads (a watched file changed, SIGHUP, or POST /admin/reload), by result: applied, rejected or unchanged.")); err != nil {
		errs = append(errs, err)
		r.reloads, _ = noop.NewMeterProvider().Meter("").Int64Counter(ConfigReloadsName)
	}
	for i, name := range reloadResultNames {
		r.add[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(AttrResult.String(name)))}
	}
	return errs
}

// RecordReload counts one configuration reload with its result. A result
// outside the defined ones is not recorded.
func (m *Metrics) RecordReload(ctx context.Context, r ReloadResult) {
	if r < 0 || r >= numReloadResults || m.reload.reloads == nil {
		return
	}
	m.reload.reloads.Add(ctx, 1, m.reload.add[r]...)
}
