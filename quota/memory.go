package quota

import (
	"context"
	"slices"
	"strconv"
	"sync"
)

// sweepMin is the number of keys below which Memory never sweeps.
const sweepMin = 64

// Memory is the per-process [Store]: each key's buckets and leases in a
// map under one mutex. A fleet of N replicas each with its own Memory
// admits up to N times each limit; [Redis] shares them.
//
// Admit and Release never block on anything but the mutex, never fail
// for the store's sake (ErrUnavailable is never returned) and allocate
// nothing once a key is in use (its entry, and its lease set, are made on
// its first Ask).
//
// A key's entry is dropped when its buckets are full again, it holds no
// lease and keeps no spend window (a window is kept a day past its end),
// by a sweep that runs when a new key is added and the map has doubled
// since the last one. Keys are configured names, so the map is
// bounded anyway; the sweep is what lets a key a reload removed go. A
// dropped key starts again full, which it was.
//
// Memory is safe for concurrent use. The zero value is not usable: use
// [NewMemory].
type Memory struct {
	clock clock

	mu      sync.Mutex
	keys    map[string]*entry
	sweepAt int // sweep when a new key makes len(keys) reach this
}

var _ Store = (*Memory)(nil)

// entry is one key's state.
type entry struct {
	req, tok         bucket
	reqRate, tokRate cachedRate
	leases           map[string]struct{} // the leases held (Concurrent)
	// days and months are the spend windows kept: the current one and
	// those ended less than spendGrace ago (a handful at most).
	days, months []spendWindow
}

// spendWindow is one spend window's total (spent + reserved, nano-USD).
type spendWindow struct {
	id, end int64  // YYYYMMDD or YYYYMM; its end, Unix µs
	name    string // id formatted, for Decision.SpendWindow
	total   int64
}

// find returns the index of window id in ws, or -1.
func find(ws []spendWindow, id int64) int {
	for i := range ws {
		if ws[i].id == id {
			return i
		}
	}
	return -1
}

// total is window id's total in ws (0 when not kept).
func total(ws []spendWindow, id int64) int64 {
	if i := find(ws, id); i >= 0 {
		return ws[i].total
	}
	return 0
}

// addTo puts delta into window id (ending at end) of ws, keeping it if it is
// not (unless there is nothing to put in), never below 0; it returns ws
// and the window's name ("" when not kept).
func addTo(ws []spendWindow, id, end, delta int64) ([]spendWindow, string) {
	i := find(ws, id)
	if i < 0 {
		if delta <= 0 {
			return ws, ""
		}
		ws = append(ws, spendWindow{id: id, end: end, name: strconv.FormatInt(id, 10)})
		i = len(ws) - 1
	}
	ws[i].total = settleSpend(ws[i].total, delta)
	return ws, ws[i].name
}

// prune drops the windows of ws that ended spendGrace or more before now.
func prune(ws []spendWindow, now int64) []spendWindow {
	return slices.DeleteFunc(ws, func(w spendWindow) bool { return now >= w.end+spendGrace.Microseconds() })
}

// cachedRate keeps the rate of the last limit asked for, so a key's Admit
// does not recompute it.
type cachedRate struct {
	limit int64
	r     rate
}

func (c *cachedRate) get(limit int64) rate {
	if limit != c.limit {
		c.limit, c.r = limit, newRate(limit)
	}
	return c.r
}

// NewMemory returns an empty Memory. It takes [WithClock]; other options
// are ignored.
func NewMemory(opts ...Option) *Memory {
	c := newConfig(opts)
	return &Memory{clock: newClock(c.now), keys: make(map[string]*entry), sweepAt: sweepMin}
}

// Admit takes, if every limit of a.Limits allows, one request, a.Tokens
// tokens, a.Spend (in the current UTC day and month of the store's clock)
// and a.Lease from a.Key's state, or nothing. Its only error is
// ErrInvalidAsk (a Concurrent limit without a Lease). ctx is not used: it
// never waits. A lease already held is held once (not counted twice):
// leases must be unique among the requests in flight.
func (m *Memory) Admit(_ context.Context, a Ask) (Decision, error) {
	if err := a.check(); err != nil {
		return Decision{}, err
	}
	l := a.Limits
	if l.RequestsPerMinute <= 0 && l.TokensPerMinute <= 0 && l.Concurrent <= 0 && !l.spend() {
		return Decision{Allowed: true}, nil
	}
	now := m.clock.micros()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.keys[a.Key]
	if e == nil {
		e = m.add(a.Key, now)
	}
	rr, tr := e.reqRate.get(l.RequestsPerMinute), e.tokRate.get(l.TokensPerMinute)
	e.req.rebase(now)
	e.tok.rebase(now)
	var (
		w     windows
		sp    spendVerdict
		spent SpendState
	)
	if l.spend() {
		w = windowsAt(now)
		e.days, e.months = prune(e.days, now), prune(e.months, now)
		if l.SpendPerDay > 0 {
			spent.Day = total(e.days, w.day)
		}
		if l.SpendPerMonth > 0 {
			spent.Month = total(e.months, w.month)
		}
		sp = checkSpend(l, a.Spend, spent.Day, spent.Month, w, now)
	}
	d, req, tok := decide(l, a.Tokens, rr, tr, e.req, e.tok, sp, int64(len(e.leases)), now)
	d.Spend = spent
	if !d.Allowed {
		return d, nil
	}
	e.req, e.tok = req, tok
	if l.spend() {
		n := max(a.Spend, 0)
		if l.SpendPerDay > 0 {
			e.days, d.SpendWindow.Day = addTo(e.days, w.day, w.dayEnd, n)
			d.Spend.Day = addSpend(d.Spend.Day, n)
			if d.SpendWindow.Day == "" { // nothing reserved: no window kept
				d.SpendWindow.Day = strconv.FormatInt(w.day, 10)
			}
		}
		if l.SpendPerMonth > 0 {
			e.months, d.SpendWindow.Month = addTo(e.months, w.month, w.monthEnd, n)
			d.Spend.Month = addSpend(d.Spend.Month, n)
			if d.SpendWindow.Month == "" {
				d.SpendWindow.Month = strconv.FormatInt(w.month, 10)
			}
		}
	}
	if l.Concurrent > 0 {
		if e.leases == nil {
			e.leases = make(map[string]struct{}, min(l.Concurrent, 64))
		}
		e.leases[a.Lease] = struct{}{}
		d.InFlight = int64(len(e.leases))
	}
	return d, nil
}

// Release gives back r.Lease, if r.Key holds it (a second Release of the
// same lease, or of one never admitted, changes nothing for concurrency),
// and settles the tokens bucket by r.Used-r.Reserved when r.Limits has a
// TokensPerMinute limit: an overrun is taken (the bucket may go into
// debt, refusing until it is repaid), an unused reservation given back
// (never past full). It settles the spend windows r.SpendDay and
// r.SpendMonth (the current ones when "" or malformed) by
// r.UsedSpend-r.ReservedSpend for each spend limit of r.Limits, never
// below 0; a window ended spendGrace (a day) or more ago is gone and
// settles nothing. It never fails.
func (m *Memory) Release(_ context.Context, r Release) error {
	dt := delta(r.Used, r.Reserved)
	settle := r.Limits.TokensPerMinute > 0 && dt != 0
	ds := delta(r.UsedSpend, r.ReservedSpend)
	spend := r.Limits.spend() && ds != 0
	if r.Lease == "" && !settle && !spend {
		return nil
	}
	now := m.clock.micros()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.keys[r.Key]
	if e == nil {
		// A dropped (full) entry: giving back changes nothing, an overrun
		// is still owed.
		if (!settle || dt < 0) && (!spend || ds < 0) {
			return nil
		}
		e = m.add(r.Key, now)
	}
	if r.Lease != "" {
		delete(e.leases, r.Lease)
	}
	if settle {
		tr := e.tokRate.get(r.Limits.TokensPerMinute)
		e.tok.rebase(now)
		e.tok = e.tok.settled(tr, dt, now)
	}
	if spend {
		w := windowsAt(now)
		grace := spendGrace.Microseconds()
		e.days, e.months = prune(e.days, now), prune(e.months, now)
		if r.Limits.SpendPerDay > 0 {
			id, end, ok := parseDay(r.SpendDay)
			if !ok {
				id, end = w.day, w.dayEnd
			}
			if now < end+grace {
				e.days, _ = addTo(e.days, id, end, ds)
			}
		}
		if r.Limits.SpendPerMonth > 0 {
			id, end, ok := parseMonth(r.SpendMonth)
			if !ok {
				id, end = w.month, w.monthEnd
			}
			if now < end+grace {
				e.months, _ = addTo(e.months, id, end, ds)
			}
		}
	}
	return nil
}

// Close does nothing: Memory has no background work. It returns nil.
func (m *Memory) Close() error { return nil }

// add makes key's entry, sweeping first when the map has doubled; m.mu is
// held.
func (m *Memory) add(key string, now int64) *entry {
	if len(m.keys)+1 >= m.sweepAt {
		for k, e := range m.keys {
			e.days, e.months = prune(e.days, now), prune(e.months, now)
			if len(e.leases) == 0 && e.req.full(now) && e.tok.full(now) && len(e.days) == 0 && len(e.months) == 0 {
				delete(m.keys, k)
			}
		}
		m.sweepAt = max(sweepMin, 2*(len(m.keys)+1))
	}
	e := new(entry)
	m.keys[key] = e
	return e
}

// len is the number of keys with an entry (for tests).
func (m *Memory) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}
