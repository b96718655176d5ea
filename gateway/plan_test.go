package gateway

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestPlanNext is the planner's decision table: what follows a leg's
// outcome, for every retry condition, stage, budget and route kind.
func TestPlanNext(t *testing.T) {
	m, err := telemetry.NewMetrics(noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	resp := func(status int, retryAfter string) *http.Response {
		h := http.Header{}
		if retryAfter != "" {
			h.Set("Retry-After", retryAfter)
		}
		return &http.Response{StatusCode: status, Header: h}
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	connErr := &APIError{Status: http.StatusBadGateway, Code: "engine_unreachable"}
	firstErr := &APIError{Status: http.StatusGatewayTimeout, Code: ErrTypeFirstToken}

	type setup struct {
		on       []string      // RetryConfig.On; nil = the defaults
		backoff  time.Duration // RetryConfig.Backoff (0 keeps waits exact)
		legs     int           // legs run, the current one included
		max      int           // MaxAttempts (default 3)
		others   bool          // another candidate is left
		sticky   bool
		deadline time.Duration // from now; 0 = none
		gone     bool          // the client has gone
		budget   int           // BudgetMin (default 3); -1 = spent
	}
	tests := []struct {
		name string
		s    setup
		o    outcome
		want nextLeg
		// wantLast: the plan keeps the leg's error for "no engine left".
		wantLast *APIError
	}{
		{"2xx is committed", setup{others: true}, outcome{resp: resp(200, "")}, nextLeg{}, nil},
		{"400 is committed", setup{others: true}, outcome{resp: resp(400, ""), errType: "400"}, nextLeg{}, nil},
		{"503 goes to another engine", setup{others: true}, outcome{resp: resp(503, ""), errType: "503"},
			nextLeg{kind: legRetry, reason: retry503}, nil},
		{"429 goes to another engine", setup{others: true}, outcome{resp: resp(429, ""), errType: "429"},
			nextLeg{kind: legRetry, reason: retry429}, nil},
		{"500 is not retried by default", setup{others: true}, outcome{resp: resp(500, ""), errType: "500"}, nextLeg{}, nil},
		{"500 retried when on", setup{on: []string{"500"}, others: true}, outcome{resp: resp(500, ""), errType: "500"},
			nextLeg{kind: legRetry, reason: retry500}, nil},
		{"connect failure goes elsewhere, keeping its error", setup{others: true}, outcome{connFailed: true, err: connErr, errType: ErrTypeConnect},
			nextLeg{kind: legRetry, reason: retryConnect}, connErr},
		{"reset is opt-in", setup{others: true}, outcome{err: connErr, errType: ErrTypeEngineDisconnect}, nextLeg{}, nil},
		{"reset retried when on", setup{on: []string{"reset"}, others: true}, outcome{err: connErr, errType: ErrTypeEngineDisconnect},
			nextLeg{kind: legRetry, reason: retryReset}, connErr},
		{"the only engine: its Retry-After is waited out", setup{}, outcome{resp: resp(503, "1"), errType: "503"},
			nextLeg{kind: legRetry, reason: retry503, same: true, wait: time.Second}, nil},
		{"the only engine: a Retry-After over the cap is passed on", setup{}, outcome{resp: resp(429, "2"), errType: "429"}, nextLeg{}, nil},
		{"the only engine without Retry-After: no back-off base, no wait", setup{}, outcome{resp: resp(503, ""), errType: "503"},
			nextLeg{kind: legRetry, reason: retry503, same: true}, nil},
		{"the last leg allowed", setup{legs: 3, others: true}, outcome{resp: resp(503, ""), errType: "503"}, nextLeg{}, nil},
		{"the client has gone", setup{gone: true, others: true}, outcome{resp: resp(503, ""), errType: "503"}, nextLeg{}, nil},
		{"past the time budget", setup{deadline: 500 * time.Millisecond}, outcome{resp: resp(503, "1"), errType: "503"}, nextLeg{}, nil},
		{"the retry budget is spent", setup{budget: -1, others: true}, outcome{resp: resp(503, ""), errType: "503"}, nextLeg{}, nil},
		{"a held stream's first-token timeout goes elsewhere", setup{on: []string{"first-token-timeout"}, others: true},
			outcome{stage: stageRelay, err: firstErr, errType: ErrTypeFirstToken, held: true},
			nextLeg{kind: legRetry, reason: retryFirstToken}, firstErr},
		{"a held stream's reset before content goes elsewhere", setup{on: []string{"first-token-timeout", "reset"}, others: true},
			outcome{stage: stageRelay, err: connErr, errType: ErrTypeEngineDisconnect, held: true},
			nextLeg{kind: legRetry, reason: retryReset}, connErr},
		{"a relay not held is final", setup{on: []string{"reset"}, others: true},
			outcome{stage: stageRelay, err: connErr, errType: ErrTypeEngineDisconnect}, nextLeg{}, nil},
		{"sticky: a 404 asks the next engine (not a retry)", setup{sticky: true, others: true},
			outcome{resp: resp(404, "")}, nextLeg{kind: legRetry}, nil},
		{"sticky: an unreachable engine is counted as a retry", setup{sticky: true, others: true},
			outcome{connFailed: true, err: connErr, errType: ErrTypeConnect}, nextLeg{kind: legRetry, reason: retryConnect}, nil},
		{"sticky: the last engine's 404 is the answer", setup{sticky: true},
			outcome{resp: resp(404, "")}, nextLeg{}, nil},
		{"sticky: a 503 is the answer", setup{sticky: true, others: true},
			outcome{resp: resp(503, ""), errType: "503"}, nextLeg{}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.s.on != nil {
				cfg.Retry.On = tc.s.on
			}
			cfg.Retry.Backoff = tc.s.backoff
			if tc.s.budget != 0 {
				cfg.Retry.BudgetMin = max(tc.s.budget, 0)
				cfg.Retry.BudgetRatio = 0
			}
			set := newSettings(cfg, nil)
			var inflight atomic.Int64
			p := plan{set: set, ctx: context.Background(), sticky: tc.s.sticky, max: 3, legs: max(tc.s.legs, 1), others: tc.s.others,
				budget: &retryBudget{inflight: &inflight}, metrics: m, now: func() time.Time { return now }}
			if tc.s.max > 0 {
				p.max = tc.s.max
			}
			if tc.s.gone {
				p.ctx = gone
			}
			if tc.s.deadline > 0 {
				p.deadline = now.Add(tc.s.deadline)
			}
			o := tc.o
			got := p.next(&o)
			if got != tc.want {
				t.Errorf("next = %+v, want %+v", got, tc.want)
			}
			if p.lastErr != tc.wantLast {
				t.Errorf("lastErr = %v, want %v", p.lastErr, tc.wantLast)
			}
			// A retry holds one share of the budget until the request ends.
			wantHeld := int64(0)
			if got.kind == legRetry && !tc.s.sticky {
				wantHeld = 1
			}
			if n := p.budget.retrying.Load(); n != wantHeld {
				t.Errorf("budget shares held = %d, want %d", n, wantHeld)
			}
			p.done()
			if n := p.budget.retrying.Load(); n != 0 {
				t.Errorf("after done: budget shares held = %d, want 0", n)
			}
		})
	}
}

// TestPlanBudgetShareOncePerRequest: a request that retries twice holds
// one share of the retry budget, not two.
func TestPlanBudgetShareOncePerRequest(t *testing.T) {
	m, _ := telemetry.NewMetrics(noop.NewMeterProvider())
	cfg := DefaultConfig()
	cfg.Retry.BudgetMin, cfg.Retry.BudgetRatio = 1, 0
	var inflight atomic.Int64
	b := &retryBudget{inflight: &inflight}
	p := plan{set: newSettings(cfg, nil), ctx: context.Background(), max: 3, others: true, budget: b, metrics: m, now: time.Now}
	o := outcome{resp: &http.Response{StatusCode: 503, Header: http.Header{}}, errType: "503"}
	for leg := 1; leg <= 2; leg++ {
		p.legs = leg
		if got := p.next(&o); got.kind != legRetry {
			t.Fatalf("leg %d: next = %+v, want a retry", leg, got)
		}
	}
	if n := b.retrying.Load(); n != 1 {
		t.Errorf("shares held = %d, want 1", n)
	}
	// Another request finds the budget (of 1) spent.
	q := plan{set: p.set, ctx: context.Background(), max: 3, legs: 1, others: true, budget: b, metrics: m, now: time.Now}
	if got := q.next(&o); got.kind != legNone {
		t.Errorf("second request: next = %+v, want none (budget spent)", got)
	}
	p.done()
	q.done()
	if n := b.retrying.Load(); n != 0 {
		t.Errorf("after done: shares held = %d, want 0", n)
	}
}
