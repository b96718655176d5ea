package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// AdminAuthFailuresName counts the admin listener's refused
// authentications, unit {request}, by AttrAdminAuthReason.
const AdminAuthFailuresName = "switchboard.admin.auth_failures"

// AttrAdminAuthReason is why an admin request was refused: missing (no
// bearer token), invalid (not an admin token), rate_limited (the second's
// failures were spent, nothing was compared), read_only (a read-only token
// on a write action), cross_origin (a browser's write from a page of
// another origin) or host_not_allowed (under open writes, a Host that is
// not an address or an allowed name).
const AttrAdminAuthReason = attribute.Key("reason")

// The values of AttrAdminAuthReason.
const (
	AdminAuthMissing = "missing"
	AdminAuthInvalid = "invalid"
	AdminAuthLimited = "rate_limited"
	// AdminAuthReadOnly: a read-only token sent for a write action.
	AdminAuthReadOnly = "read_only"
	// AdminAuthCrossOrigin: a write a browser sent from another origin
	// (CSRF).
	AdminAuthCrossOrigin = "cross_origin"
	// AdminAuthHost: under open writes, a request to a host name not
	// allowed (DNS rebinding).
	AdminAuthHost = "host_not_allowed"
)

type adminInstruments struct {
	failures metric.Int64Counter
}

func (a *adminInstruments) init(meter metric.Meter) []error {
	var err error
	if a.failures, err = meter.Int64Counter(AdminAuthFailuresName, metric.WithUnit("{request}"),
		metric.WithDescription("Admin requests refused for their token, by reason.")); err != nil {
		a.failures, _ = noop.NewMeterProvider().Meter("").Int64Counter(AdminAuthFailuresName)
		return []error{err}
	}
	return nil
}

// RecordAdminAuthFailure counts one refused admin authentication for
// reason (one of the AdminAuth* values).
func (m *Metrics) RecordAdminAuthFailure(ctx context.Context, reason string) {
	m.admin.failures.Add(ctx, 1, metric.WithAttributes(AttrAdminAuthReason.String(reason)))
}
