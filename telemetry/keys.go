package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Instrument names of the API keys and their limits (gateway.AuthConfig,
// gateway.LimitsConfig).
const (
	// KeyRequestsName counts the requests presented with a configured key,
	// unit {request}, by AttrKeyName and AttrKeyResult.
	KeyRequestsName = "switchboard.key.requests"
	// KeyTokensName counts the tokens a key's requests used (their usage,
	// or the gateway's estimate when the engine reported none), unit
	// {token}, by AttrKeyName and gen_ai.token.type (input, output).
	KeyTokensName = "switchboard.key.tokens"
	// QuotaStoreErrorsName counts the admissions the limits' store could
	// not answer in time (Redis unreachable or slow), unit {request}, by
	// AttrKeyResult: admitted (fail open) or unavailable (fail closed).
	QuotaStoreErrorsName = "switchboard.quota.store_errors"
)

// AttrKeyName is the configured name of an API key on the key metrics
// (never the key itself): a bounded set.
const AttrKeyName = attribute.Key("key")

// AttrKeyResult is what became of a keyed request at admission: admitted,
// or refused by a limit (requests, tokens, concurrent, spend), or unavailable
// (the limits' store could not answer and the gateway fails closed).
const AttrKeyResult = attribute.Key("result")

// The values of AttrKeyResult.
const (
	KeyAdmitted    = "admitted"
	KeyUnavailable = "unavailable"
)

type keyInstruments struct {
	requests, tokens, storeErrors metric.Int64Counter
	storeAdmitted, storeRefused   metric.MeasurementOption
}

func (k *keyInstruments) init(meter metric.Meter) []error {
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		if err != nil {
			errs = append(errs, err)
			c, _ = noop.NewMeterProvider().Meter("").Int64Counter(name)
		}
		return c
	}
	k.requests = counter(KeyRequestsName, "{request}", "Requests presented with each API key, by what became of them at admission (admitted, or the limit that refused them).")
	k.tokens = counter(KeyTokensName, "{token}", "Tokens used by each API key's requests (the engines' usage, else the gateway's estimate), by token type.")
	k.storeErrors = counter(QuotaStoreErrorsName, "{request}", "Admissions the limits' store could not answer in time, by what the gateway did (admitted: fail open; unavailable: fail closed).")
	k.storeAdmitted = metric.WithAttributeSet(attribute.NewSet(AttrKeyResult.String(KeyAdmitted)))
	k.storeRefused = metric.WithAttributeSet(attribute.NewSet(AttrKeyResult.String(KeyUnavailable)))
	return errs
}

// KeyAttrs are one API key's precomputed attribute sets, built once per
// key when the key set is loaded so recording allocates nothing.
type KeyAttrs struct {
	admitted, unavailable metric.AddOption
	refused               map[string]metric.AddOption
	input, output         metric.AddOption
}

// KeyRefusals are the AttrKeyResult values of a refusal by a limit.
var KeyRefusals = []string{"requests", "tokens", "concurrent", "spend"}

// NewKeyAttrs returns the attribute sets of the key named name.
func NewKeyAttrs(name string) *KeyAttrs {
	key := AttrKeyName.String(name)
	set := func(kv attribute.KeyValue) metric.AddOption {
		return metric.WithAttributeSet(attribute.NewSet(key, kv))
	}
	a := &KeyAttrs{
		admitted:    set(AttrKeyResult.String(KeyAdmitted)),
		unavailable: set(AttrKeyResult.String(KeyUnavailable)),
		refused:     make(map[string]metric.AddOption, len(KeyRefusals)),
		input:       set(AttrGenAITokType.String("input")),
		output:      set(AttrGenAITokType.String("output")),
	}
	for _, r := range KeyRefusals {
		a.refused[r] = set(AttrKeyResult.String(r))
	}
	return a
}

// RecordKeyRequest counts one request of key a: result is KeyAdmitted,
// KeyUnavailable or one of KeyRefusals (anything else counts as
// unavailable).
func (m *Metrics) RecordKeyRequest(ctx context.Context, a *KeyAttrs, result string) {
	switch result {
	case KeyAdmitted:
		m.keys.requests.Add(ctx, 1, a.admitted)
	default:
		if o, ok := a.refused[result]; ok {
			m.keys.requests.Add(ctx, 1, o)
			return
		}
		m.keys.requests.Add(ctx, 1, a.unavailable)
	}
}

// RecordKeyTokens adds a key's request's tokens (in, out >= 0; a zero is
// not recorded).
func (m *Metrics) RecordKeyTokens(ctx context.Context, a *KeyAttrs, in, out int64) {
	if in > 0 {
		m.keys.tokens.Add(ctx, in, a.input)
	}
	if out > 0 {
		m.keys.tokens.Add(ctx, out, a.output)
	}
}

// RecordQuotaStoreError counts one admission the store could not answer;
// admitted says the gateway admitted it anyway (fail open).
func (m *Metrics) RecordQuotaStoreError(ctx context.Context, admitted bool) {
	if admitted {
		m.keys.storeErrors.Add(ctx, 1, m.keys.storeAdmitted)
		return
	}
	m.keys.storeErrors.Add(ctx, 1, m.keys.storeRefused)
}
