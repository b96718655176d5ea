package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
)

func TestRecordReload(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	m, err := NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m.RecordReload(ctx, ReloadApplied)
	m.RecordReload(ctx, ReloadApplied)
	m.RecordReload(ctx, ReloadRejected)
	m.RecordReload(ctx, ReloadUnchanged)
	m.RecordReload(ctx, ReloadResult(7)) // not a result: not recorded
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	var got metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		for _, mm := range sm.Metrics {
			if mm.Name == ConfigReloadsName {
				got = mm
			}
		}
	}
	point := func(result string, n int64) metricdata.DataPoint[int64] {
		return metricdata.DataPoint[int64]{Attributes: attribute.NewSet(AttrResult.String(result)), Value: n}
	}
	want := metricdata.Metrics{
		Name:        ConfigReloadsName,
		Description: "Configuration reloads (a watched file changed, SIGHUP, or POST /admin/reload), by result: applied, rejected or unchanged.",
		Unit:        "{reload}",
		Data: metricdata.Sum[int64]{
			Temporality: metricdata.CumulativeTemporality,
			IsMonotonic: true,
			DataPoints:  []metricdata.DataPoint[int64]{point("applied", 2), point("rejected", 1), point("unchanged", 1)},
		},
	}
	metricdatatest.AssertEqual(t, want, got, metricdatatest.IgnoreTimestamp())
	if s := ReloadResult(7).String(); s != "unknown" {
		t.Errorf("String of an undefined result = %q", s)
	}
}
