package gateway

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The operator console's in-process history (console.go serves it): the
// last requests, each model's latency and rate series over the last 15
// minutes, and the reloads. Every structure here has a fixed size, so the
// console costs the same memory whatever the traffic, and recording into
// it is a few atomic operations or one short critical section on the
// request path, with no allocation (BenchmarkConsoleRecord).

// consoleState is the console's history, one per Server.
type consoleState struct {
	requests requestRing
	models   modelTable
	reloads  reloadHistory
	// config is the configuration shown instead of the gateway's own
	// section (SetConsoleConfig); nil: the gateway's.
	config atomic.Pointer[any]
}

// requestRingSize is how many requests the console keeps (the last ones).
const requestRingSize = 500

// maxLoggedModel caps the model name kept per request, in bytes: the name
// is the client's, and the ring keeps it.
const maxLoggedModel = 256

// requestEntry is one finished request as the console lists it: what its
// access-log line says. Its strings are the request state's own (engine
// and key names from the configuration, the request id, the model the
// client named), held without a copy.
type requestEntry struct {
	at        int64 // end time, Unix nanoseconds
	id        string
	route     string
	operation string
	key       string
	model     string
	fallback  string
	errType   string
	engines   [maxLoggedEngines]string
	attempts  int32 // engine attempts (may exceed len(engines))
	continued int32 // continuation legs
	status    int32
	dur, ttft time.Duration
	// inTok and outTok are the usage; -1 when unknown.
	inTok, outTok int64
	costNano      int64
}

// requestRing keeps the last requestRingSize requests. add is O(1) and
// allocation-free: it copies the entry into its slot under a mutex held
// for that copy only.
type requestRing struct {
	mu   sync.Mutex
	next uint64 // requests added so far; the next slot is next % size
	buf  [requestRingSize]requestEntry
}

// add records e, overwriting the oldest entry when the ring is full.
func (r *requestRing) add(e *requestEntry) {
	r.mu.Lock()
	r.buf[r.next%requestRingSize] = *e
	r.next++
	r.mu.Unlock()
}

// last returns up to limit entries, newest first, whose key name is key
// (when key is not "") and whose model contains model (when model is not
// "").
func (r *requestRing) last(limit int, key, model string) []requestEntry {
	out := make([]requestEntry, 0, min(limit, requestRingSize))
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(r.next, requestRingSize)
	for i := uint64(0); i < n && len(out) < limit; i++ {
		e := &r.buf[(r.next-1-i)%requestRingSize]
		if key != "" && e.key != key || model != "" && !strings.Contains(e.model, model) {
			continue
		}
		out = append(out, *e)
	}
	return out
}

// recordRequest puts the request whose state is st in the console's ring
// and its model's counters. now is its end.
func (s *Server) recordRequest(st *reqState, route string, status int, now time.Time) {
	e := requestEntry{at: now.UnixNano(), id: st.id, route: route, key: "", model: st.model, fallback: st.fallback,
		errType: st.errType, engines: st.tried, attempts: int32(st.attempts), continued: int32(st.continued),
		status: int32(status), dur: now.Sub(st.start), ttft: st.ttft, inTok: st.inTok, outTok: st.outTok, costNano: st.costNano}
	if len(e.model) > maxLoggedModel {
		e.model = strings.Clone(e.model[:maxLoggedModel]) // not the client's whole string
	}
	if st.op != nil {
		e.operation = st.op.name
	}
	if st.key != nil {
		e.key = st.key.name
	}
	s.console.requests.add(&e)
	// The model's row: the one its first attempt found, else (refused
	// before any engine: a limit, no engine up) the row of the model it
	// named, which counts it but not its latency; none for a listing or
	// an unknown model.
	ms, measured := st.console, st.console != nil
	if ms == nil && st.model != "" {
		ms = s.console.models.lookup(st.model)
	}
	if ms == nil {
		return
	}
	s.console.models.maybeAdvance(now)
	ms.requests.Add(1)
	if requestFailed(status, st.errType) {
		ms.errors.Add(1)
	}
	if !measured {
		return
	}
	ms.e2e.observe(e.dur.Seconds())
	if st.ttft > 0 {
		ms.ttft.observe(st.ttft.Seconds())
	}
}

// requestFailed reports whether a request counts as an error on the
// console's models panel: answered 5xx, or cut after a successful start
// for a reason other than its client going away. A 4xx is the client's
// mistake (or its limit), not the model's.
func requestFailed(status int, errType string) bool {
	if status >= 500 {
		return true
	}
	return status < 400 && errType != "" && errType != ErrTypeClientCancelled && errType != ErrTypeClientStalled
}

// Latency histograms: fixed log-spaced buckets, 8 per doubling (each
// about 9% wide) from 0.5 ms to about 15 minutes, plus one for longer.
const (
	histBuckets  = 168
	histMin      = 0.0005 // seconds: the first bucket's upper bound
	histPerOctet = 8
)

// histBounds are the buckets' upper bounds, in seconds.
var histBounds = func() [histBuckets]float64 {
	var b [histBuckets]float64
	for i := range b {
		b[i] = histMin * math.Exp2(float64(i)/histPerOctet)
	}
	return b
}()

// latHist counts latencies in histBounds' buckets (the last counts the
// values above every bound). Safe for concurrent use; observe is a binary
// search and one atomic add.
type latHist struct {
	counts [histBuckets + 1]atomic.Uint64
}

// bucketOf returns the index of the bucket v (seconds) falls in: the
// first whose upper bound is at least v.
func bucketOf(v float64) int {
	lo, hi := 0, histBuckets
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if histBounds[mid] < v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (h *latHist) observe(seconds float64) {
	if seconds < 0 || math.IsNaN(seconds) {
		return
	}
	h.counts[bucketOf(seconds)].Add(1)
}

// histCounts are a latHist's counts at one moment.
type histCounts [histBuckets + 1]uint64

func (h *latHist) load(into *histCounts) {
	for i := range h.counts {
		into[i] = h.counts[i].Load()
	}
}

// quantile returns the q quantile (0..1) of the values counted in delta
// (now minus before), interpolated linearly inside its bucket; NaN when
// delta counts none. A value in the last (unbounded) bucket is reported
// as the last bound.
func quantile(q float64, now, before *histCounts) float64 {
	var total uint64
	for i := range now {
		total += now[i] - before[i]
	}
	if total == 0 {
		return math.NaN()
	}
	rank := q * float64(total)
	var cum uint64
	for i := range now {
		c := now[i] - before[i]
		if c == 0 {
			continue
		}
		if float64(cum+c) >= rank {
			if i == histBuckets {
				return histBounds[histBuckets-1]
			}
			lo := 0.0
			if i > 0 {
				lo = histBounds[i-1]
			}
			return lo + (histBounds[i]-lo)*(rank-float64(cum))/float64(c)
		}
		cum += c
	}
	return histBounds[histBuckets-1]
}

// The models panel's series: one point per period, periods points.
const (
	modelPeriod  = 10 * time.Second
	modelPeriods = 90 // 15 minutes
	// maxConsoleModels caps the models given a row of their own; the
	// others share the row otherModel.
	maxConsoleModels = 32
	otherModel       = "other"
)

// modelStats is one model's counters (cumulative, atomic: the request path
// adds to them) and its series (under modelTable.mu).
type modelStats struct {
	name             string
	ttft, itl, e2e   latHist
	requests, errors atomic.Uint64

	// The counters when the last point was taken.
	prevTTFT, prevITL, prevE2E histCounts
	prevReq, prevErr           uint64
	// points is a ring of modelPeriods points, the newest at
	// modelTable.head-1.
	points [modelPeriods]modelPoint
}

// modelPoint is one period of one model: its request and error rates (per
// second) and its latency quantiles (seconds; NaN when the period had no
// sample).
type modelPoint struct {
	at                                         int64 // end of the period, Unix milliseconds; 0: no point
	reqRate, errRate                           float64
	ttft50, ttft99, itl50, itl99, e2e50, e2e99 float64
}

// modelTable holds the models' counters and series. Rows are created for
// the models an engine was found for (a bounded set: configured or
// discovered), up to maxConsoleModels, and never removed; the request path
// finds a row with one atomic load and a map lookup.
type modelTable struct {
	rows  atomic.Pointer[map[string]*modelStats]
	other modelStats
	// next is when the current period ends (Unix nanoseconds; 0 before
	// the first advance).
	next atomic.Int64

	mu    sync.Mutex // creating rows, advancing the series
	order []*modelStats
	head  int   // the next point's slot
	end   int64 // the current period's end, Unix nanoseconds; 0: not started
	// scratch is advance's copy of one histogram.
	scratch histCounts
	// otherNamed: other.name is set; full: the table has
	// maxConsoleModels rows (both only ever turn true, under mu).
	otherNamed, full atomic.Bool
}

// lookup returns model's row, nil when it has none.
func (t *modelTable) lookup(model string) *modelStats {
	if m := t.rows.Load(); m != nil {
		return (*m)[model]
	}
	return nil
}

// row returns model's row, creating it when there is room, else the
// shared row of the other models.
func (t *modelTable) row(model string) *modelStats {
	if ms := t.lookup(model); ms != nil {
		return ms
	}
	// A full table's misses, and requests naming no model, go to the
	// shared row without the lock, which series and advance hold while
	// they compute: no request waits on a console read.
	if t.otherNamed.Load() && (model == "" || t.full.Load()) {
		return &t.other
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := t.rows.Load()
	if cur != nil {
		if ms := (*cur)[model]; ms != nil {
			return ms
		}
	}
	if t.other.name == "" {
		t.other.name = otherModel
		t.otherNamed.Store(true)
	}
	if cur != nil && len(*cur) >= maxConsoleModels || model == "" {
		if model != "" {
			t.full.Store(true)
		}
		return &t.other
	}
	next := make(map[string]*modelStats, 1+lenOf(cur))
	if cur != nil {
		for k, v := range *cur {
			next[k] = v
		}
	}
	ms := &modelStats{name: model}
	// Started at the table's current point, so its first point holds
	// only what it recorded.
	ms.points = t.other.points
	for i := range ms.points {
		if ms.points[i].at != 0 {
			ms.points[i] = modelPoint{at: ms.points[i].at, ttft50: math.NaN(), ttft99: math.NaN(), itl50: math.NaN(),
				itl99: math.NaN(), e2e50: math.NaN(), e2e99: math.NaN()}
		}
	}
	next[model] = ms
	t.order = append(t.order, ms)
	t.rows.Store(&next)
	return ms
}

func lenOf(m *map[string]*modelStats) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// maybeAdvance closes the periods that have ended by now, unless another
// goroutine is doing it: the request path calls it, with a cost of one
// atomic load until a period ends.
func (t *modelTable) maybeAdvance(now time.Time) {
	if n := t.next.Load(); n != 0 && now.UnixNano() < n {
		return
	}
	if t.mu.TryLock() {
		t.advanceLocked(now)
		t.mu.Unlock()
	}
}

// advance closes the periods that have ended by now.
func (t *modelTable) advance(now time.Time) {
	t.mu.Lock()
	t.advanceLocked(now)
	t.mu.Unlock()
}

// advanceLocked closes the periods ended by now: the first gets what was
// recorded since the last point (recording advances the table, so it was
// recorded in that period, but for inter-token gaps of a stream still
// running), the others get no sample. Periods are aligned on multiples of
// modelPeriod.
func (t *modelTable) advanceLocked(now time.Time) {
	ns := now.UnixNano()
	if t.end == 0 {
		t.end = now.Truncate(modelPeriod).Add(modelPeriod).UnixNano()
		t.next.Store(t.end)
		return
	}
	if ns < t.end {
		return
	}
	periods := (ns-t.end)/int64(modelPeriod) + 1
	if periods > modelPeriods {
		// Only the last modelPeriods periods are kept: skip to them,
		// the first of those taking what was recorded.
		t.end += (periods - modelPeriods) * int64(modelPeriod)
		periods = modelPeriods
	}
	for p := int64(0); p < periods; p++ {
		t.point(t.end, p == 0)
		t.end += int64(modelPeriod)
	}
	t.next.Store(t.end)
}

// point writes the point of the period ending at end (Unix nanoseconds)
// for every row; take says it gets the counts recorded since the last.
func (t *modelTable) point(end int64, take bool) {
	secs := modelPeriod.Seconds()
	for _, ms := range t.rowsLocked() {
		p := modelPoint{at: end / int64(time.Millisecond), ttft50: math.NaN(), ttft99: math.NaN(), itl50: math.NaN(),
			itl99: math.NaN(), e2e50: math.NaN(), e2e99: math.NaN()}
		if take {
			req, errs := ms.requests.Load(), ms.errors.Load()
			p.reqRate, p.errRate = float64(req-ms.prevReq)/secs, float64(errs-ms.prevErr)/secs
			ms.prevReq, ms.prevErr = req, errs
			p.ttft50, p.ttft99 = t.quantiles(&ms.ttft, &ms.prevTTFT)
			p.itl50, p.itl99 = t.quantiles(&ms.itl, &ms.prevITL)
			p.e2e50, p.e2e99 = t.quantiles(&ms.e2e, &ms.prevE2E)
		}
		ms.points[t.head] = p
	}
	t.head = (t.head + 1) % modelPeriods
}

// quantiles returns h's p50 and p99 since prev, and makes prev its counts
// now.
func (t *modelTable) quantiles(h *latHist, prev *histCounts) (p50, p99 float64) {
	h.load(&t.scratch)
	p50, p99 = quantile(0.5, &t.scratch, prev), quantile(0.99, &t.scratch, prev)
	*prev = t.scratch
	return p50, p99
}

// rowsLocked returns the rows in creation order, the other models' last.
func (t *modelTable) rowsLocked() []*modelStats {
	out := make([]*modelStats, 0, len(t.order)+1)
	out = append(out, t.order...)
	if t.other.name == "" {
		t.other.name = otherModel
	}
	return append(out, &t.other)
}

// modelSeries is one model's points, oldest first.
type modelSeries struct {
	name   string
	points []modelPoint
}

// series advances the table to now and returns every row's points, oldest
// first; the other models' row only when it has had a request.
func (t *modelTable) series(now time.Time) []modelSeries {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.advanceLocked(now)
	var out []modelSeries
	for _, ms := range t.rowsLocked() {
		if ms == &t.other && ms.requests.Load() == 0 {
			continue
		}
		s := modelSeries{name: ms.name, points: make([]modelPoint, 0, modelPeriods)}
		for i := 0; i < modelPeriods; i++ {
			if p := ms.points[(t.head+i)%modelPeriods]; p.at != 0 {
				s.points = append(s.points, p)
			}
		}
		out = append(out, s)
	}
	return out
}

// reloadHistorySize is how many reloads the console lists (the last ones).
const reloadHistorySize = 32

// reloadEntry is one Server.Reload: when, whether it was applied, what it
// changed (or would have needed a restart for), and its error.
type reloadEntry struct {
	at       time.Time
	ok       bool
	changed  []string
	restart  []string
	errorMsg string
}

// reloadHistory keeps the last reloadHistorySize reloads.
type reloadHistory struct {
	mu   sync.Mutex
	next int
	buf  [reloadHistorySize]reloadEntry
}

// note records one reload's result.
func (h *reloadHistory) note(at time.Time, rep ReloadReport, err error) {
	e := reloadEntry{at: at.UTC(), ok: err == nil}
	if err != nil {
		e.errorMsg = err.Error()
	} else {
		for _, n := range rep.Added {
			e.changed = append(e.changed, "engine added: "+n)
		}
		for _, n := range rep.Removed {
			e.changed = append(e.changed, "engine removed: "+n)
		}
		for _, n := range rep.Changed {
			e.changed = append(e.changed, "engine changed: "+n)
		}
		if rep.PolicyChanged {
			e.changed = append(e.changed, "routing policy")
		}
		e.changed = append(e.changed, rep.Settings...)
		e.restart = rep.Restart
	}
	h.mu.Lock()
	h.buf[h.next%reloadHistorySize] = e
	h.next++
	h.mu.Unlock()
}

// list returns the reloads kept, newest first.
func (h *reloadHistory) list() []reloadEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := min(h.next, reloadHistorySize)
	out := make([]reloadEntry, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, h.buf[(h.next-1-i)%reloadHistorySize])
	}
	return out
}
