package enginesim

import (
	"container/list"
	"sync"
	"sync/atomic"
)

// modelCounts holds the running and waiting sequence counts of one model. They are written
// only under scheduler.mu and read atomically by the metrics collector.
type modelCounts struct {
	running atomic.Int64
	waiting atomic.Int64
}

// scheduler admits at most max sequences at a time; the others wait in FIFO order. It is safe
// for concurrent use.
type scheduler struct {
	max int

	mu      sync.Mutex
	running int
	queue   list.List // of *ticket
}

// ticket is one sequence's place in the scheduler. ready is closed once the sequence runs.
type ticket struct {
	ready   chan struct{}
	granted bool // under scheduler.mu
	elem    *list.Element
	m       *modelCounts
}

func newScheduler(maxNumSeqs int) *scheduler {
	return &scheduler{max: maxNumSeqs}
}

// enqueue registers a sequence for model m. The returned ticket's ready channel is already
// closed when a slot was free and nobody was waiting. Every ticket must end with exactly one
// call to done.
func (s *scheduler) enqueue(m *modelCounts) *ticket {
	t := &ticket{ready: make(chan struct{}), m: m}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running < s.max && s.queue.Len() == 0 {
		s.grantLocked(t)
		return t
	}
	t.elem = s.queue.PushBack(t)
	m.waiting.Add(1)
	return t
}

// grantLocked moves t to running.
func (s *scheduler) grantLocked(t *ticket) {
	s.running++
	t.m.running.Add(1)
	t.granted = true
	close(t.ready)
}

// done ends t: a running sequence frees its slot (handing it to the head of the queue), a
// waiting one leaves the queue. It reports whether t had been running.
func (s *scheduler) done(t *ticket) (wasRunning bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !t.granted {
		s.queue.Remove(t.elem)
		t.m.waiting.Add(-1)
		return false
	}
	s.running--
	t.m.running.Add(-1)
	for s.running < s.max && s.queue.Len() > 0 {
		next := s.queue.Remove(s.queue.Front()).(*ticket)
		next.m.waiting.Add(-1)
		s.grantLocked(next)
	}
	return true
}

// numRunning returns the number of running sequences, all models together.
func (s *scheduler) numRunning() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// counts returns the running and waiting sequence totals.
func (s *scheduler) counts() (running, waiting int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(s.running), int64(s.queue.Len())
}
