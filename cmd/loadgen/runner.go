package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Runner drives a Workload through a Client, closed or open loop, and
// collects the results. A Runner runs once.
type Runner struct {
	cfg    *Config
	wl     Workload
	client *Client

	issued atomic.Int64 // tickets handed out, warmup included

	mu       sync.Mutex
	results  []*Result // measured results, in completion order
	warmup   int       // completed warmup requests
	inflight atomic.Int64
	done     atomic.Int64 // measured requests finished
	failed   atomic.Int64

	// beforeMeasured runs once between the warmup and the measured
	// requests; measured reopens the gate after it.
	beforeMeasured func()
	measured       chan struct{} // closed once measured requests may start
	warmEnded      int           // warmup requests ended, any outcome; under mu
}

// NewRunner returns a Runner for cfg.
func NewRunner(cfg *Config, wl Workload, client *Client) *Runner {
	r := &Runner{cfg: cfg, wl: wl, client: client}
	if cfg.Requests > 0 {
		r.results = make([]*Result, 0, cfg.Requests)
	}
	return r
}

// BeforeMeasured makes Run call f once, after every warmup request has ended
// and before the first measured request is sent (at the start when there is
// no warmup), with no request in flight: a snapshot taken by f, such as the
// engines' counters, then separates the warmup from the measured requests
// exactly. Call it before Run.
func (r *Runner) BeforeMeasured(f func()) { r.beforeMeasured = f }

// openMeasured calls the BeforeMeasured hook and lets measured requests
// start.
func (r *Runner) openMeasured() {
	if r.beforeMeasured != nil {
		r.beforeMeasured()
	}
	close(r.measured)
}

// ticket reserves the next request; warm says it is a warmup request, ok
// false means the request budget is spent.
func (r *Runner) ticket() (warm, ok bool) {
	n := int(r.issued.Add(1)) - 1
	if r.cfg.Requests > 0 && n >= r.cfg.Warmup+r.cfg.Requests {
		return false, false
	}
	return n < r.cfg.Warmup, true
}

// Run sends requests until the budget is spent, Duration has passed or ctx
// ends, waits for those in flight and returns the measured results and the
// wall time from the start of the first measured request to the end of the
// last one. Results of requests interrupted by ctx are dropped. Run must be
// called once.
//
// Measured requests start only once every warmup request has ended; in the
// open loop the arrival process starts again from there.
func (r *Runner) Run(ctx context.Context) ([]*Result, time.Duration) {
	r.measured = make(chan struct{})
	if r.cfg.Warmup == 0 {
		r.openMeasured()
	}
	// issue bounds when requests may start; requests themselves run under
	// ctx so that those in flight at the end of Duration finish.
	issue, cancel := ctx, context.CancelFunc(func() {})
	if r.cfg.Duration > 0 {
		issue, cancel = context.WithTimeout(ctx, r.cfg.Duration)
	}
	defer cancel()
	var wg sync.WaitGroup
	if r.cfg.OpenLoop() {
		r.openLoop(ctx, issue, &wg)
	} else {
		for range r.cfg.Concurrency {
			wg.Go(func() {
				for r.one(ctx, issue) {
				}
			})
		}
	}
	wg.Wait()
	return r.results, window(r.results)
}

// openLoop starts requests at Poisson arrival times: the gaps are
// exponential with mean 1/Rate, drawn from a source seeded with Seed. Each
// target time is absolute, so a slow scheduler does not lower the rate.
func (r *Runner) openLoop(ctx, issue context.Context, wg *sync.WaitGroup) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x6c6f616467656e)) // "loadgen"
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	waited := false
	for {
		warm, ok := r.ticket()
		if !ok {
			return
		}
		if !warm && !waited {
			// Measured arrivals begin once the warmup has ended, as if
			// the run started there.
			select {
			case <-issue.Done():
				return
			case <-r.measured:
			}
			waited, next = true, time.Now()
		}
		next = next.Add(time.Duration(rng.ExpFloat64() / r.cfg.Rate * float64(time.Second)))
		timer.Reset(time.Until(next))
		select {
		case <-issue.Done():
			return
		case <-timer.C:
		}
		wg.Go(func() { r.send(ctx, issue, warm) })
	}
}

// one takes a ticket and sends one request; false means stop.
func (r *Runner) one(ctx, issue context.Context) bool {
	if issue.Err() != nil {
		return false
	}
	warm, ok := r.ticket()
	if !ok {
		return false
	}
	return r.send(ctx, issue, warm)
}

// send gets a request from the workload and sends it; false means the
// workload could not produce one before issue ended.
func (r *Runner) send(ctx, issue context.Context, warm bool) bool {
	if !warm {
		select {
		case <-issue.Done():
			return false
		case <-r.measured:
		}
	}
	req, err := r.wl.Next(issue)
	if err != nil {
		return false
	}
	r.inflight.Add(1)
	res := r.client.Do(ctx, req)
	r.inflight.Add(-1)
	r.wl.Complete(req, res)
	res.text = "" // only the workload needs it
	if warm {
		r.endWarm(res)
		return !res.Canceled
	}
	if res.Canceled {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results = append(r.results, res)
	r.done.Add(1)
	if !res.OK() {
		r.failed.Add(1)
	}
	return true
}

// endWarm accounts for an ended warmup request; the last one to end lets the
// measured requests start.
func (r *Runner) endWarm(res *Result) {
	r.mu.Lock()
	if !res.Canceled {
		r.warmup++
	}
	r.warmEnded++
	last := r.warmEnded == r.cfg.Warmup
	r.mu.Unlock()
	if last {
		r.openMeasured()
	}
}

// Warmup returns the number of warmup requests that completed.
func (r *Runner) Warmup() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.warmup
}

// window is the span from the first start to the last end among results.
func window(results []*Result) time.Duration {
	var first, last time.Time
	for i, res := range results {
		end := res.Start.Add(res.Latency)
		if i == 0 || res.Start.Before(first) {
			first = res.Start
		}
		if i == 0 || end.After(last) {
			last = end
		}
	}
	return last.Sub(first)
}
