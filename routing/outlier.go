package routing

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Outlier detection is passive health checking: the outcomes of real
// traffic take an engine out of routing for a while, the way Envoy's
// outlier detection does (envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/outlier
// and the config.cluster.v3.OutlierDetection reference). This file holds
// what routing decides: the settings, the outcome classes, the per-endpoint
// tracker and the engine state machine. The gateway feeds the outcomes in,
// applies the max_ejection_percent cap over a model's engines (and keeps a
// model's last ready engine), and runs the probe that ends an ejection.

// OutlierConfig configures outlier detection (the `server.outlier` section
// of the gateway's YAML file). The zero value is not valid: start from
// [DefaultOutlierConfig].
//
// A streak counts the failures of one kind since the engine's last success;
// failures of another kind and neutral outcomes (see [Outcome]) leave it
// where it is. When a streak reaches its threshold the engine is ejected
// for BaseEjectionTime × the number of times it has been ejected, capped at
// MaxEjectionTime, unless that would eject more than MaxEjectionPercent of
// the engines of a model it serves, or leave such a model without a ready
// engine. When the ejection time has passed the engine returns only after a
// passing health probe.
type OutlierConfig struct {
	// Enabled turns outlier detection on. Default true. Off, traffic never
	// ejects an engine (the probes alone decide), and turning it off at
	// run time returns every ejected engine at once.
	Enabled bool `koanf:"enabled"`
	// Consecutive5xx ejects an engine after this many server errors in a
	// row: engine 5xx answers and engines failing mid-response (the
	// connection dropped, an error event in the stream, a stream that
	// cannot be read). Default 5 (Envoy's consecutive_5xx): vLLM answers
	// 500 to some single bad requests, so one 500 says little about the
	// engine, five in a row do. 0 disables this detector.
	Consecutive5xx int `koanf:"consecutive_5xx"`
	// ConsecutiveConnectFailures ejects an engine after this many failed
	// connections in a row (refused, or the connect timeout). Default 3,
	// below Envoy's 5 for local-origin failures: a refused connection is
	// never caused by the request, a GPU engine that stopped listening is
	// restarting (minutes of weight loading), and every failed dial costs
	// the client a retry. 0 disables this detector.
	ConsecutiveConnectFailures int `koanf:"consecutive_connect_failures"`
	// ConsecutiveTimeouts ejects an engine after this many attempts in a
	// row cut by the gateway's own per-attempt timeouts (response_header,
	// first_token, idle, attempt; not the whole-request timeout, which
	// also counts time spent elsewhere). Default 3: each one held a client
	// and a GPU slot for up to minutes. 0 disables this detector.
	ConsecutiveTimeouts int `koanf:"consecutive_timeouts"`
	// BaseEjectionTime is the first ejection's length; the n-th ejection
	// lasts n times as long (capped at MaxEjectionTime). It is also the
	// decay step: every BaseEjectionTime an engine spends back in routing
	// without being ejected forgives one earlier ejection. Default 30 s
	// (Envoy's base_ejection_time). Must be > 0.
	BaseEjectionTime time.Duration `koanf:"base_ejection_time"`
	// MaxEjectionTime caps one ejection. Default 5 min (Envoy's
	// max_ejection_time). Must be >= BaseEjectionTime.
	MaxEjectionTime time.Duration `koanf:"max_ejection_time"`
	// MaxEjectionPercent caps the share of a model's engines (the engines
	// in the pool serving it, whatever their state) that may be ejected at
	// once, 0..100: an engine is ejected only if, for every model it
	// serves, the ejected engines would then be at most
	// floor(engines × MaxEjectionPercent / 100). Default 50, not Envoy's
	// 10: GPU fleets serve a model from a handful of engines, where 10%
	// rounds down to none, and ejecting more than half would push the
	// survivors (each with a hard max_num_seqs and KV cache) into overload
	// too. So a model served by one engine never has it ejected (there is
	// nowhere else to send its traffic; the probes still take a dead
	// engine out), two engines may lose one, four may lose two. Current
	// Envoy enforces the cap the same way (always_eject_one_host is off by
	// default). Whatever the cap allows, 100 included, an engine is never
	// ejected while it is the last ready engine of a model it serves (the
	// others drained, unhealthy, sleeping or ejected), for the reason of
	// Envoy's panic threshold: its answers, some of which may succeed, beat
	// a 503 for every request.
	MaxEjectionPercent int `koanf:"max_ejection_percent"`
}

// DefaultOutlierConfig returns the defaults documented on [OutlierConfig].
func DefaultOutlierConfig() OutlierConfig {
	return OutlierConfig{
		Enabled:                    true,
		Consecutive5xx:             5,
		ConsecutiveConnectFailures: 3,
		ConsecutiveTimeouts:        3,
		BaseEjectionTime:           30 * time.Second,
		MaxEjectionTime:            5 * time.Minute,
		MaxEjectionPercent:         50,
	}
}

// ErrInvalidOutlierConfig is wrapped by every error of
// [OutlierConfig.Validate] (errors.Is finds it; the messages start with the
// key instead of repeating it).
var ErrInvalidOutlierConfig = errors.New("invalid outlier detection config")

// outlierConfigError is one problem of an [OutlierConfig]: its message
// names the key, and it wraps [ErrInvalidOutlierConfig].
type outlierConfigError struct{ msg string }

func (e *outlierConfigError) Error() string { return e.msg }
func (e *outlierConfigError) Unwrap() error { return ErrInvalidOutlierConfig }

// Validate reports every problem with c, joined; each wraps
// [ErrInvalidOutlierConfig] and its message starts with its key under
// `outlier.` (the caller adds the section the config is mounted in, e.g.
// "outlier.max_ejection_percent must be 0..100, got 150"). Every key is
// checked even when c is disabled, so enabling it later cannot reveal an
// old mistake.
func (c OutlierConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, &outlierConfigError{msg: fmt.Sprintf(format, a...)})
	}
	for _, t := range []struct {
		key string
		n   int
	}{{"consecutive_5xx", c.Consecutive5xx}, {"consecutive_connect_failures", c.ConsecutiveConnectFailures}, {"consecutive_timeouts", c.ConsecutiveTimeouts}} {
		if t.n < 0 {
			bad("outlier.%s must be >= 0 (0 disables it), got %d", t.key, t.n)
		}
	}
	if c.BaseEjectionTime <= 0 {
		bad("outlier.base_ejection_time must be > 0, got %s", c.BaseEjectionTime)
	}
	if c.MaxEjectionTime < c.BaseEjectionTime {
		bad("outlier.max_ejection_time (%s) must be >= outlier.base_ejection_time (%s)", c.MaxEjectionTime, c.BaseEjectionTime)
	}
	if c.MaxEjectionPercent < 0 || c.MaxEjectionPercent > 100 {
		bad("outlier.max_ejection_percent must be 0..100, got %d", c.MaxEjectionPercent)
	}
	return errors.Join(errs...)
}

// threshold returns the streak length that ejects for failure kind k, 0
// when that detector is off.
func (c *OutlierConfig) threshold(k Outcome) int {
	switch k {
	case OutcomeServerError:
		return c.Consecutive5xx
	case OutcomeConnectFailure:
		return c.ConsecutiveConnectFailures
	case OutcomeTimeout:
		return c.ConsecutiveTimeouts
	}
	return 0
}

// ejectionTime returns how long the n-th ejection (n >= 1) lasts:
// BaseEjectionTime × n, capped at MaxEjectionTime.
func (c *OutlierConfig) ejectionTime(n int) time.Duration {
	if time.Duration(n) > c.MaxEjectionTime/c.BaseEjectionTime {
		return c.MaxEjectionTime
	}
	return c.BaseEjectionTime * time.Duration(n)
}

// maxMultiplier is the ejection count past which ejections no longer get
// longer: ceil(MaxEjectionTime / BaseEjectionTime). The count is capped
// there, so an engine that failed for hours is forgiven in at most that
// many decay steps once it behaves.
func (c *OutlierConfig) maxMultiplier() int {
	return int((c.MaxEjectionTime + c.BaseEjectionTime - 1) / c.BaseEjectionTime)
}

// MaxEjected returns how many of a model's n engines may be ejected at
// once: floor(n × MaxEjectionPercent / 100).
func (c *OutlierConfig) MaxEjected(n int) int { return n * c.MaxEjectionPercent / 100 }

// Outcome is the class of one engine attempt's end, as outlier detection
// counts it.
type Outcome uint8

const (
	// OutcomeSuccess is an attempt the engine completed: it ends every
	// streak.
	OutcomeSuccess Outcome = iota
	// OutcomeNeutral says nothing about the engine: the client's own
	// errors (4xx), 429 (the engine shedding load: retries and circuit
	// breaking deal with overload, and ejecting overloaded engines would
	// pile their load on the rest), the client leaving or not reading,
	// the gateway shutting down, the whole-request timeout, the gateway's
	// own faults. It neither counts nor ends a streak.
	OutcomeNeutral
	// OutcomeServerError is an engine 5xx or an engine failing mid-response
	// (engine_disconnect, stream_error).
	OutcomeServerError
	// OutcomeConnectFailure is a connection to the engine that could not
	// be made.
	OutcomeConnectFailure
	// OutcomeTimeout is an attempt cut by a per-attempt timeout (header,
	// first token, idle, attempt).
	OutcomeTimeout
)

// String returns the outcome's name: success, neutral, 5xx,
// connect_failure or timeout.
func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case OutcomeNeutral:
		return "neutral"
	case OutcomeServerError:
		return "5xx"
	case OutcomeConnectFailure:
		return "connect_failure"
	case OutcomeTimeout:
		return "timeout"
	}
	return "unknown"
}

// Outlier is one endpoint's outlier detection state: its failure streaks
// and its ejections. It is written by traffic outcomes ([Outlier.Record],
// [Outlier.Eject]) and by the end of an ejection ([Outlier.Return]) and
// read by the state machine. Every method takes the endpoint's own mutex
// and allocates nothing; none touches another endpoint, so outcomes on
// different engines never contend. The zero value is ready, never
// ejected. All methods are safe for concurrent use.
type Outlier struct {
	mu sync.Mutex
	// streak counts the failures of each kind since the last success,
	// indexed by Outcome - OutcomeServerError.
	streak [3]int
	// ejected is set from Eject until Return: past until the engine
	// stays out until a probe passes.
	ejected bool
	until   time.Time
	// ejections is the ejection multiplier as of returned, the time the
	// last ejection ended (decay counts from it).
	ejections int
	returned  time.Time
	total     uint64 // ejections since the endpoint was created
}

// Record counts one attempt's outcome. It reports the failure kind whose
// streak has just reached its threshold (trip true): the caller then
// decides on the ejection ([Outlier.Eject]). The streak that tripped starts
// again from 0, whether or not the caller ejects, so a refused ejection is
// tried again only after another full streak. While the endpoint is
// ejected outcomes are ignored: they belong to attempts started before the
// ejection.
func (t *Outlier) Record(c *OutlierConfig, o Outcome) (kind Outcome, trip bool) {
	if o == OutcomeNeutral {
		return o, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ejected {
		return o, false
	}
	if o == OutcomeSuccess {
		t.streak = [3]int{}
		return o, false
	}
	i := int(o - OutcomeServerError)
	if i < 0 || i >= len(t.streak) {
		return o, false
	}
	t.streak[i]++
	if n := c.threshold(o); n > 0 && t.streak[i] >= n {
		t.streak[i] = 0
		return o, true
	}
	return o, false
}

// decayedLocked returns the ejection multiplier at now: one earlier
// ejection forgiven per BaseEjectionTime spent back in routing.
func (t *Outlier) decayedLocked(c *OutlierConfig, now time.Time) int {
	n := t.ejections
	if n == 0 || t.ejected {
		return n
	}
	if healthy := now.Sub(t.returned); healthy > 0 {
		n -= int(min(healthy/c.BaseEjectionTime, time.Duration(n)))
	}
	return n
}

// Eject ejects the endpoint at now: until now + BaseEjectionTime × n,
// capped at MaxEjectionTime, where n is its earlier ejections (less the
// decay) plus this one. It reports false, changing nothing, when the
// endpoint is already ejected. Every streak starts again from 0.
func (t *Outlier) Eject(c *OutlierConfig, now time.Time) (until time.Time, n int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ejected {
		return t.until, t.ejections, false
	}
	n = min(t.decayedLocked(c, now)+1, c.maxMultiplier())
	t.ejections = n
	t.ejected = true
	t.until = now.Add(c.ejectionTime(n))
	t.streak = [3]int{}
	t.total++
	return t.until, n, true
}

// Return ends the ejection if its time has passed at now; the caller has
// just seen the endpoint pass a health probe. It reports whether the
// endpoint returned. Decay starts from now.
func (t *Outlier) Return(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ejected || now.Before(t.until) {
		return false
	}
	t.ejected = false
	t.returned = now
	t.streak = [3]int{}
	return true
}

// Forgive ends any ejection at once and forgets the streaks and the
// multiplier (outlier detection was turned off). It reports whether the
// endpoint was ejected.
func (t *Outlier) Forgive() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.ejected
	t.ejected = false
	t.streak = [3]int{}
	t.ejections = 0
	t.returned = time.Time{}
	return was
}

// Ejected reports whether the endpoint is ejected: from its ejection until
// it returns, which is after its until time and a passing probe.
func (t *Outlier) Ejected() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ejected
}

// OutlierStatus is a snapshot of an endpoint's outlier state.
type OutlierStatus struct {
	// Ejected is set from the ejection until the endpoint returns.
	Ejected bool
	// Until is when the current ejection's time ends (zero when not
	// ejected); the endpoint returns at its first passing probe after it.
	Until time.Time
	// Ejections is the ejection multiplier at the time asked (after
	// decay): the next ejection lasts BaseEjectionTime × (Ejections+1),
	// capped.
	Ejections int
	// Total counts the endpoint's ejections since it was created.
	Total uint64
	// Streaks are the current failure streaks: 5xx, connect failures,
	// timeouts.
	Streak5xx, StreakConnect, StreakTimeout int
}

// Status returns the endpoint's outlier state at now.
func (t *Outlier) Status(c *OutlierConfig, now time.Time) OutlierStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := OutlierStatus{Ejected: t.ejected, Ejections: t.decayedLocked(c, now), Total: t.total,
		Streak5xx: t.streak[0], StreakConnect: t.streak[1], StreakTimeout: t.streak[2]}
	if t.ejected {
		s.Until = t.until
	}
	return s
}

// State is an engine's place in routing. Each state has one writer, and
// only a ready engine is a routing candidate:
//
//   - unhealthy: the health probes (active health);
//   - ejected: traffic outcomes (outlier detection, passive health), until
//     the ejection time has passed and a probe passes;
//   - sleeping: the admin API (sleep, wake_up), or the engine's own fresh
//     stats saying it sleeps or is unhealthy;
//   - draining: removal from the pool (its in-flight requests finish);
//   - ready: none of these.
//
// The values are the indexes of telemetry.EngineStates, the values of the
// switchboard.engine.state gauge's state attribute.
type State uint8

const (
	// StateReady receives traffic.
	StateReady State = iota
	// StateUnhealthy failed its health probes.
	StateUnhealthy
	// StateSleeping was put to sleep or reports itself asleep or unhealthy.
	StateSleeping
	// StateDraining was removed from the pool and finishes its requests.
	StateDraining
	// StateEjected was ejected by outlier detection.
	StateEjected
)

// String returns the state's name: ready, unhealthy, sleeping, draining or
// ejected.
func (s State) String() string {
	switch s {
	case StateReady:
		return "ready"
	case StateUnhealthy:
		return "unhealthy"
	case StateSleeping:
		return "sleeping"
	case StateDraining:
		return "draining"
	case StateEjected:
		return "ejected"
	}
	return "unknown"
}

// Verdicts are the inputs of the engine state machine, one per writer.
type Verdicts struct {
	Draining  bool // removal: out of the pool, finishing its requests
	Unhealthy bool // the health probes
	Ejected   bool // outlier detection
	Sleeping  bool // the admin API, or the engine's own fresh stats
}

// State combines the verdicts into one state, the most severe first:
// draining, unhealthy (the engine does not answer its probes, whatever
// traffic said), ejected (it answers, but fails traffic), sleeping, ready.
func (v Verdicts) State() State {
	switch {
	case v.Draining:
		return StateDraining
	case v.Unhealthy:
		return StateUnhealthy
	case v.Ejected:
		return StateEjected
	case v.Sleeping:
		return StateSleeping
	}
	return StateReady
}
