package gateway

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
)

// Outlier detection (passive health, Envoy's model; routing/outlier.go
// holds the streaks, the back-off and the state machine): every attempt's
// outcome is counted on its engine's routing.Outlier when the attempt ends
// (observeOutcome; light routes count for nothing); a streak at its
// threshold ejects the engine, if every model it serves keeps another
// ready engine and the max_ejection_percent bound over its models allows,
// and the routing snapshot is rebuilt without it (once per ejection, never
// per request). A timer at the end of the ejection time probes the engine
// right then; it returns at that probe or at any later one that passes
// (ProbeNow).
//
// A refused connection is passive health too, with or without outlier
// detection: markFailed probes the engine at once (probeOnConnectFailure)
// rather than at the next round, health.interval away, while every request
// sent to a dead engine pays a failed connection (up to the connect
// timeout) before its retry.

// outliers is the pool's passive health state: outlier detection, and the
// probes started by refused connections.
type outliers struct {
	cfg atomic.Pointer[routing.OutlierConfig]
	// after starts a timer running f after d and returns its stop
	// function; time.AfterFunc unless a test injects its clock.
	after func(d time.Duration, f func()) (stop func() bool)

	// Guarded by Pool.mu: the return timers of ejected engines, and
	// closed (set by Close; neither a timer nor a refused connection
	// starts a probe after it).
	timers map[*engine]returnTimer
	seq    uint64 // numbers the return timers
	closed bool
	wg     sync.WaitGroup // return probes in progress
	// refused is, per engine, when a refused ejection was last logged and
	// how many were refused since (one line per base_ejection_time, not
	// one per streak: a lone engine answering 500s at 1k QPS trips a
	// streak every 5 ms). Guarded by Pool.mu.
	refused map[*engine]refusal
	// connProbes is, per engine, its last probe started by a refused
	// connection. Guarded by Pool.mu.
	connProbes map[*engine]connProbe

	// tripped, when set (tests only), runs after a streak has tripped and
	// before its ejection takes the pool's lock.
	tripped func(*engine)
}

// refusal is an engine's refused ejections since the last one logged.
type refusal struct {
	logged time.Time
	since  int
}

// connProbe is an engine's last probe started by a refused connection:
// when it started and whether it is still running.
type connProbe struct {
	started time.Time
	running bool
}

// returnTimer is an ejected engine's timer: its stop function and its
// number, so a timer that fired late never forgets a newer one.
type returnTimer struct {
	stop func() bool
	seq  uint64
}

func (o *outliers) init(c routing.OutlierConfig) {
	o.cfg.Store(&c)
	o.timers = map[*engine]returnTimer{}
	o.refused = map[*engine]refusal{}
	o.connProbes = map[*engine]connProbe{}
	o.after = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
}

// outlierConfigErrors puts each of routing's outlier config errors under
// the server section, wrapping ErrInvalidConfig.
func outlierConfigErrors(err error) []error {
	if err == nil {
		return nil
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			errs = append(errs, fmt.Errorf("%w: server.%w", ErrInvalidConfig, e))
		}
		return errs
	}
	return []error{fmt.Errorf("%w: server.%w", ErrInvalidConfig, err)}
}

// outcomeOf classifies an attempt's end for outlier detection (see
// routing.Outcome): status is the engine's response status (0 before
// headers), errType the attempt's error.type ("" for success, an ErrType*
// value, or the engine's status in decimal). Allocation-free.
func outcomeOf(status int, errType string) routing.Outcome {
	switch errType {
	case "":
		return routing.OutcomeSuccess
	case ErrTypeConnect:
		return routing.OutcomeConnectFailure
	case ErrTypeHeaderTimeout, ErrTypeFirstToken, ErrTypeIdleTimeout, ErrTypeAttemptTimeout:
		return routing.OutcomeTimeout
	case ErrTypeEngineDisconnect, ErrTypeStreamError:
		return routing.OutcomeServerError
	}
	// The engine's own error status: 5xx counts; 4xx (429 included: the
	// engine shedding load is overload, for retries and circuit breaking)
	// says nothing about the engine.
	if status >= 500 && status <= 599 && isStatus(errType, status) {
		return routing.OutcomeServerError
	}
	// client_cancelled, client_stalled, server_shutdown, request_timeout
	// (the whole request's budget, spent partly elsewhere), panic and
	// _OTHER (the gateway's own faults), 4xx.
	return routing.OutcomeNeutral
}

// isStatus reports whether s is the three-digit decimal status.
func isStatus(s string, status int) bool {
	return len(s) == 3 && s[0] == byte('0'+status/100) && s[1] == byte('0'+status/10%10) && s[2] == byte('0'+status%10)
}

// observeOutcome is told the outcome of every engine attempt when it ends
// (attempt.end, the single release path): the engine, the engine's
// response status (0 when no response headers arrived) and the attempt's
// error type ("" for success; the ErrType* values or an engine status).
// It counts the outcome on the engine's own outlier state (an atomic load
// and the endpoint's mutex, no allocation) and takes the pool's lock only
// when a streak reaches its threshold.
func (p *Pool) observeOutcome(e *engine, status int, errType string) {
	c := p.out.cfg.Load()
	if !c.Enabled {
		return
	}
	if kind, trip := e.ep.Outlier().Record(c, outcomeOf(status, errType)); trip {
		if p.out.tripped != nil {
			p.out.tripped(e)
		}
		p.eject(e, kind)
	}
}

// setOutlier swaps the outlier detection settings at run time (config
// reload); c must be valid. New streak thresholds apply from the next
// outcome, new ejection times from the next ejection. Turning detection
// off returns every ejected engine at once.
func (p *Pool) setOutlier(c routing.OutlierConfig) {
	p.out.cfg.Store(&c)
	if c.Enabled {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for _, e := range p.engines {
		if e.ep.Outlier().Forgive() {
			changed = true
		}
	}
	for e, t := range p.out.timers {
		t.stop()
		delete(p.out.timers, e)
	}
	clear(p.out.refused)
	if changed {
		p.log.Info("outlier detection off: every ejected engine returned")
		p.rebuildLocked()
	}
}

// eject takes e out of routing after a streak of kind, unless detection
// is off by now, e left the pool or ejectionAllowedLocked forbids it, and
// arms the timer that probes it when its ejection time ends.
func (p *Pool) eject(e *engine, kind routing.Outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The settings are read again under the lock, not taken from the
	// outcome that tripped: a setOutlier turning detection off stores its
	// settings before it takes the lock to return every ejected engine,
	// so either it runs after this ejection and returns the engine, or
	// this sees detection off. Without this, an ejection waiting for the
	// lock while detection was turned off would happen after the return,
	// under the old settings, with a return timer armed.
	c := p.out.cfg.Load()
	if !c.Enabled || p.out.closed || !slices.Contains(p.engines, e) {
		return
	}
	now := p.now()
	if m, why, ok := p.ejectionAllowedLocked(e, c); !ok {
		p.refusedLocked(e, c, now, kind, m, why)
		return
	}
	until, n, ok := e.ep.Outlier().Eject(c, now)
	if !ok {
		return
	}
	delete(p.out.refused, e)
	p.log.Warn("engine ejected", "engine", e.cfg.Name, "reason", kind.String(), "ejection", n, "for", until.Sub(now).String())
	p.rebuildLocked()
	if t, ok := p.out.timers[e]; ok {
		t.stop()
	}
	p.out.seq++
	seq := p.out.seq
	p.out.timers[e] = returnTimer{stop: p.out.after(until.Sub(now), func() { p.returnProbe(e, seq) }), seq: seq}
}

// ejectionAllowedLocked reports whether e may be ejected; if not, the
// model that forbids it and why (a log message's end). For every model e
// serves:
//
//   - another engine of the model must be ready (routable): an ejection
//     never leaves a model with nothing to route to, whatever the cap
//     allows, for Envoy's panic threshold's reason. Traffic on the last
//     ready engine gets that engine's answers, some of which may succeed,
//     instead of a 503 for every request; a dead engine is still taken
//     out by the probes (and probed at once on a refused connection:
//     probeOnConnectFailure). The other engines may be out for any reason
//     (drained, unhealthy, sleeping, ejected);
//   - max_ejection_percent: the engines of the model already ejected
//     plus e stay within MaxEjected of all the engines in the pool serving
//     it, whatever their state.
//
// An engine whose models are not known yet serves no route and may be
// ejected.
func (p *Pool) ejectionAllowedLocked(e *engine, c *routing.OutlierConfig) (model, why string, ok bool) {
	if m, last := p.lastReadyLocked(e); last {
		return m, "it is its model's last ready engine", false
	}
	for _, m := range e.knownModels() {
		n, ejected := 0, 1 // e itself
		for _, o := range p.engines {
			if !slices.Contains(o.knownModels(), m) {
				continue
			}
			n++
			if o != e && o.ep.Outlier().Ejected() {
				ejected++
			}
		}
		if ejected > c.MaxEjected(n) {
			return m, "too many engines of its model are ejected already", false
		}
	}
	return "", "", true
}

// lastReadyLocked returns a model e serves that no other ready (routable)
// engine in the pool serves, if there is one.
func (p *Pool) lastReadyLocked(e *engine) (string, bool) {
	for _, m := range e.knownModels() {
		if !slices.ContainsFunc(p.engines, func(o *engine) bool {
			return o != e && o.routable() && slices.Contains(o.knownModels(), m)
		}) {
			return m, true
		}
	}
	return "", false
}

// refusedLocked logs that e was not ejected (see ejectionAllowedLocked)
// at most once per base_ejection_time per engine, with the number of
// refusals since the last line: a refusal comes again at every streak.
func (p *Pool) refusedLocked(e *engine, c *routing.OutlierConfig, now time.Time, kind routing.Outcome, model, why string) {
	r, seen := p.out.refused[e]
	r.since++
	if seen && now.Sub(r.logged) < c.BaseEjectionTime {
		p.out.refused[e] = r
		return
	}
	p.log.Warn("engine not ejected: "+why, "engine", e.cfg.Name, "reason", kind.String(), "model", model,
		"max_ejection_percent", c.MaxEjectionPercent, "refused", r.since, "since", c.BaseEjectionTime.String())
	p.out.refused[e] = refusal{logged: now}
	// Forget the engines that left the pool (rarely more than a few).
	for o := range p.out.refused {
		if !slices.Contains(p.engines, o) {
			delete(p.out.refused, o)
		}
	}
}

// returnProbe runs when e's ejection time has ended: it probes e at once
// (the probe is the only writer of health) and returns e to routing if the
// probe passes. If it fails, e stays out until a later probe passes.
func (p *Pool) returnProbe(e *engine, seq uint64) {
	p.mu.Lock()
	if t, ok := p.out.timers[e]; ok && t.seq == seq {
		delete(p.out.timers, e)
	}
	if p.out.closed || !slices.Contains(p.engines, e) {
		p.mu.Unlock()
		return
	}
	p.out.wg.Add(1)
	p.mu.Unlock()
	defer p.out.wg.Done()
	p.probeMu.Lock()
	ok := p.probe(p.ctx, e)
	p.probeMu.Unlock()
	if ok && p.returnEjected(e) {
		p.rebuild()
	}
}

// returnEjected ends e's ejection if its time has passed; the caller has
// just seen e pass a probe and rebuilds the snapshot when it reports true.
func (p *Pool) returnEjected(e *engine) bool {
	if !e.ep.Outlier().Return(p.now()) {
		return false
	}
	p.log.Info("engine returned from ejection", "engine", e.cfg.Name)
	return true
}

// probeOnConnectFailure probes e at once, on its own goroutine, after a
// connection to it was refused or timed out (markFailed), so a dead engine
// leaves routing without waiting for the next probe round. The probe is an
// ordinary one (probeMu held, the verdict by its rules: the first probe of
// an engine never probed decides at once, later ones after
// health.unhealthy_after failures in a row; a pass also ends an ejection
// whose time has passed), and the snapshot is rebuilt after it. Debounced
// per engine: none while one is running (the refused connections of a
// burst share it) nor within health.timeout of the last one's start, so a
// dead engine at unhealthy_after 2 leaves after about health.timeout, and
// a live engine refusing the odd connection gets one extra probe per
// health.timeout at most. The goroutine is counted by the pool's WaitGroup
// and none starts after Close (closed is set under mu before Close waits).
//
// The last ready engine of one of its models is not probed early, for the
// reason it is never ejected (ejectionAllowedLocked): there is nowhere
// else to send that model's requests, so taking it out sooner only turns
// the engine's own failure (502 engine_unreachable, 504 on a connect
// timeout; the request's retry asks it again) into 503 no_healthy_engine.
// The probe rounds still take it out.
func (p *Pool) probeOnConnectFailure(e *engine) {
	p.mu.Lock()
	now := p.now()
	last := p.out.connProbes[e]
	if p.out.closed || last.running || (!last.started.IsZero() && now.Sub(last.started) < p.cfg.Timeout) || !slices.Contains(p.engines, e) {
		p.mu.Unlock()
		return
	}
	if _, sole := p.lastReadyLocked(e); sole {
		p.mu.Unlock()
		return
	}
	p.out.connProbes[e] = connProbe{started: now, running: true}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		p.probeMu.Lock()
		if p.ctx.Err() == nil && p.probe(p.ctx, e) { // closed while waiting for the lock: no probe
			p.returnEjected(e)
		}
		p.probeMu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.out.connProbes[e] = connProbe{started: now}
		// Forget the engines that left the pool (rarely more than a few).
		for o := range p.out.connProbes {
			if !slices.Contains(p.engines, o) {
				delete(p.out.connProbes, o)
			}
		}
		p.rebuildLocked()
	}()
}

// closeOutliers stops the return timers and waits for return probes in
// progress (Close).
func (p *Pool) closeOutliers() {
	p.mu.Lock()
	p.out.closed = true
	for e, t := range p.out.timers {
		t.stop()
		delete(p.out.timers, e)
	}
	p.mu.Unlock()
	p.out.wg.Wait()
}

// outlierStatus returns what /admin/engines shows of e's outlier state:
// when its ejection time ends (nil unless ejected) and its ejection
// multiplier after decay.
func (p *Pool) outlierStatus(e *engine, now time.Time) (*time.Time, int) {
	s := e.ep.Outlier().Status(p.out.cfg.Load(), now)
	if !s.Ejected {
		return nil, s.Ejections
	}
	u := s.Until
	return &u, s.Ejections
}
