package fleet

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/routing"
)

// Outlier detection (passive health, Envoy's model; routing/outlier.go
// holds the streaks, the back-off and the state machine): every attempt's
// outcome is counted on its engine's routing.Outlier when the attempt ends
// (Report; light routes count for nothing); a streak at its
// threshold ejects the engine, if every model it serves keeps another
// ready engine and the max_ejection_percent bound over its models allows,
// and the routing snapshot is rebuilt without it (once per ejection, never
// per request). A timer at the end of the ejection time probes the engine
// right then; it returns at that probe or at any later one that passes
// (ProbeNow).
//
// A refused connection is passive health too, with or without outlier
// detection: MarkFailed probes the engine at once (probeOnConnectFailure)
// rather than at the next round, health.interval away, while every request
// sent to a dead engine pays a failed connection (up to the connect
// timeout) before its retry.

// outliers is the fleet's passive health state: outlier detection, and the
// probes started by refused connections.
type outliers struct {
	cfg atomic.Pointer[routing.OutlierConfig]
	// after starts a timer running f after d and returns its stop
	// function; time.AfterFunc unless a test injects its clock.
	after func(d time.Duration, f func()) (stop func() bool)

	// Guarded by Fleet.mu: the return timers of ejected engines, and
	// closed (set by Close; neither a timer nor a refused connection
	// starts a probe after it).
	timers map[*Engine]returnTimer
	seq    uint64 // numbers the return timers
	closed bool
	wg     sync.WaitGroup // return probes in progress
	// refused is, per engine, when a refused ejection was last logged and
	// how many were refused since (one line per base_ejection_time, not
	// one per streak: a lone engine answering 500s at 1k QPS trips a
	// streak every 5 ms). Guarded by Fleet.mu.
	refused map[*Engine]refusal
	// connProbes is, per engine, its last probe started by a refused
	// connection. Guarded by Fleet.mu.
	connProbes map[*Engine]connProbe

	// tripped, when set (tests only), runs after a streak has tripped and
	// before its ejection takes the fleet's lock.
	tripped func(*Engine)
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
	o.timers = map[*Engine]returnTimer{}
	o.refused = map[*Engine]refusal{}
	o.connProbes = map[*Engine]connProbe{}
	o.after = func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
}

// Report counts the outcome of an engine attempt on e when the attempt
// ends (the request path's single release path; a light route's attempt
// is not reported). It counts on the engine's own outlier state (an atomic
// load and the endpoint's mutex, no allocation) and takes the fleet's lock
// only when a streak reaches its threshold, to eject the engine.
func (f *Fleet) Report(e *Engine, o routing.Outcome) {
	c := f.out.cfg.Load()
	if !c.Enabled {
		return
	}
	if kind, trip := e.ep.Outlier().Record(c, o); trip {
		if f.out.tripped != nil {
			f.out.tripped(e)
		}
		f.eject(e, kind)
	}
}

// OutlierConfig returns the outlier detection settings in force.
func (f *Fleet) OutlierConfig() routing.OutlierConfig { return *f.out.cfg.Load() }

// SetOutlier swaps the outlier detection settings at run time (config
// reload); c must be valid. New streak thresholds apply from the next
// outcome, new ejection times from the next ejection. Turning detection
// off returns every ejected engine at once.
func (f *Fleet) SetOutlier(c routing.OutlierConfig) {
	f.out.cfg.Store(&c)
	if c.Enabled {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	changed := false
	for _, e := range f.engines {
		if e.ep.Outlier().Forgive() {
			changed = true
		}
	}
	for e, t := range f.out.timers {
		t.stop()
		delete(f.out.timers, e)
	}
	clear(f.out.refused)
	if changed {
		f.log.Info("outlier detection off: every ejected engine returned")
		f.rebuildLocked()
	}
}

// eject takes e out of routing after a streak of kind, unless detection
// is off by now, e left the fleet or ejectionAllowedLocked forbids it, and
// arms the timer that probes it when its ejection time ends.
func (f *Fleet) eject(e *Engine, kind routing.Outcome) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// The settings are read again under the lock, not taken from the
	// outcome that tripped: a SetOutlier turning detection off stores its
	// settings before it takes the lock to return every ejected engine,
	// so either it runs after this ejection and returns the engine, or
	// this sees detection off. Without this, an ejection waiting for the
	// lock while detection was turned off would happen after the return,
	// under the old settings, with a return timer armed.
	c := f.out.cfg.Load()
	if !c.Enabled || f.out.closed || !slices.Contains(f.engines, e) {
		return
	}
	now := f.now()
	if m, why, ok := f.ejectionAllowedLocked(e, c); !ok {
		f.refusedLocked(e, c, now, kind, m, why)
		return
	}
	until, n, ok := e.ep.Outlier().Eject(c, now)
	if !ok {
		return
	}
	delete(f.out.refused, e)
	f.log.Warn("engine ejected", "engine", e.cfg.Name, "reason", kind.String(), "ejection", n, "for", until.Sub(now).String())
	f.rebuildLocked()
	if t, ok := f.out.timers[e]; ok {
		t.stop()
	}
	f.out.seq++
	seq := f.out.seq
	f.out.timers[e] = returnTimer{stop: f.out.after(until.Sub(now), func() { f.returnProbe(e, seq) }), seq: seq}
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
//     plus e stay within MaxEjected of all the engines in the fleet serving
//     it, whatever their state.
//
// An engine whose models are not known yet serves no route and may be
// ejected.
func (f *Fleet) ejectionAllowedLocked(e *Engine, c *routing.OutlierConfig) (model, why string, ok bool) {
	if m, last := f.lastReadyLocked(e); last {
		return m, "it is its model's last ready engine", false
	}
	for _, m := range e.knownModels() {
		n, ejected := 0, 1 // e itself
		for _, o := range f.engines {
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
// engine in the fleet serves, if there is one.
func (f *Fleet) lastReadyLocked(e *Engine) (string, bool) {
	for _, m := range e.knownModels() {
		if !slices.ContainsFunc(f.engines, func(o *Engine) bool {
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
func (f *Fleet) refusedLocked(e *Engine, c *routing.OutlierConfig, now time.Time, kind routing.Outcome, model, why string) {
	r, seen := f.out.refused[e]
	r.since++
	if seen && now.Sub(r.logged) < c.BaseEjectionTime {
		f.out.refused[e] = r
		return
	}
	f.log.Warn("engine not ejected: "+why, "engine", e.cfg.Name, "reason", kind.String(), "model", model,
		"max_ejection_percent", c.MaxEjectionPercent, "refused", r.since, "since", c.BaseEjectionTime.String())
	f.out.refused[e] = refusal{logged: now}
	// Forget the engines that left the fleet (rarely more than a few).
	for o := range f.out.refused {
		if !slices.Contains(f.engines, o) {
			delete(f.out.refused, o)
		}
	}
}

// returnProbe runs when e's ejection time has ended: it probes e at once
// (the probe is the only writer of health) and returns e to routing if the
// probe passes. If it fails, e stays out until a later probe passes.
func (f *Fleet) returnProbe(e *Engine, seq uint64) {
	f.mu.Lock()
	if t, ok := f.out.timers[e]; ok && t.seq == seq {
		delete(f.out.timers, e)
	}
	if f.out.closed || !slices.Contains(f.engines, e) {
		f.mu.Unlock()
		return
	}
	f.out.wg.Add(1)
	f.mu.Unlock()
	defer f.out.wg.Done()
	f.probeMu.Lock()
	ok := f.probe(f.ctx, e)
	f.probeMu.Unlock()
	if ok && f.returnEjected(e) {
		f.rebuild()
	}
}

// returnEjected ends e's ejection if its time has passed; the caller has
// just seen e pass a probe and rebuilds the snapshot when it reports true.
func (f *Fleet) returnEjected(e *Engine) bool {
	if !e.ep.Outlier().Return(f.now()) {
		return false
	}
	f.log.Info("engine returned from ejection", "engine", e.cfg.Name)
	return true
}

// probeOnConnectFailure probes e at once, on its own goroutine, after a
// connection to it was refused or timed out (MarkFailed), so a dead engine
// leaves routing without waiting for the next probe round. The probe is an
// ordinary one (probeMu held, the verdict by its rules: the first probe of
// an engine never probed decides at once, later ones after
// health.unhealthy_after failures in a row; a pass also ends an ejection
// whose time has passed), and the snapshot is rebuilt after it. Debounced
// per engine: none while one is running (the refused connections of a
// burst share it) nor within health.timeout of the last one's start, so a
// dead engine at unhealthy_after 2 leaves after about health.timeout, and
// a live engine refusing the odd connection gets one extra probe per
// health.timeout at most. The goroutine is counted by the fleet's WaitGroup
// and none starts after Close (closed is set under mu before Close waits).
//
// The last ready engine of one of its models is not probed early, for the
// reason it is never ejected (ejectionAllowedLocked): there is nowhere
// else to send that model's requests, so taking it out sooner only turns
// the engine's own failure (502 engine_unreachable, 504 on a connect
// timeout; the request's retry asks it again) into 503 no_healthy_engine.
// The probe rounds still take it out.
func (f *Fleet) probeOnConnectFailure(e *Engine) {
	f.mu.Lock()
	now := f.now()
	last := f.out.connProbes[e]
	if f.out.closed || last.running || (!last.started.IsZero() && now.Sub(last.started) < f.health.Timeout) || !slices.Contains(f.engines, e) {
		f.mu.Unlock()
		return
	}
	if _, sole := f.lastReadyLocked(e); sole {
		f.mu.Unlock()
		return
	}
	f.out.connProbes[e] = connProbe{started: now, running: true}
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		f.probeMu.Lock()
		if f.ctx.Err() == nil && f.probe(f.ctx, e) { // closed while waiting for the lock: no probe
			f.returnEjected(e)
		}
		f.probeMu.Unlock()
		f.mu.Lock()
		defer f.mu.Unlock()
		f.out.connProbes[e] = connProbe{started: now}
		// Forget the engines that left the fleet (rarely more than a few).
		for o := range f.out.connProbes {
			if !slices.Contains(f.engines, o) {
				delete(f.out.connProbes, o)
			}
		}
		f.rebuildLocked()
	}()
}

// closeOutliers stops the return timers and waits for return probes in
// progress (Close).
func (f *Fleet) closeOutliers() {
	f.mu.Lock()
	f.out.closed = true
	for e, t := range f.out.timers {
		t.stop()
		delete(f.out.timers, e)
	}
	f.mu.Unlock()
	f.out.wg.Wait()
}

// outlierStatus returns what /admin/engines shows of e's outlier state:
// when its ejection time ends (nil unless ejected) and its ejection
// multiplier after decay.
func (f *Fleet) outlierStatus(e *Engine, now time.Time) (*time.Time, int) {
	s := e.ep.Outlier().Status(f.out.cfg.Load(), now)
	if !s.Ejected {
		return nil, s.Ejections
	}
	u := s.Until
	return &u, s.Ejections
}
