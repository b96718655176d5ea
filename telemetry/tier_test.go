package telemetry

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// TestRecordTierLegAllocs: a leg's tier count allocates nothing once the
// tier has been seen (it is on every request's path).
func TestRecordTierLegAllocs(t *testing.T) {
	m, err := NewMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m.RecordTierLeg(ctx, 0)
	if a := testing.AllocsPerRun(100, func() { m.RecordTierLeg(ctx, 0) }); a != 0 {
		t.Errorf("RecordTierLeg allocates %v times, want 0", a)
	}
}
