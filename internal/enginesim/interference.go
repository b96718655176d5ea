package enginesim

import (
	"sync"
	"time"
)

// interference models prefill interference under continuous batching with chunked prefill
// (Config.PrefillInterference; see the package documentation): while a sequence's prompt is
// prefilled in chunks, each decode step of the other running sequences carries that
// step's chunk and is stretched by its compute time.
//
// It keeps no clock and starts no goroutine: a prefill is a job of chunks, and each decoding
// sequence passes through the chunks of every job it takes part in one per decode step (one
// inter-token wait), so every decoder sees the same run of stretched steps whatever its
// own wait times. It is safe for concurrent use; a nil *interference is the model off.
type interference struct {
	budget   int           // Config.MaxNumBatchedTokens
	perToken time.Duration // Config.TTFTPerPromptToken: one prompt token's compute

	mu       sync.Mutex
	decoders map[*decoder]struct{} // sequences past their prefill, running
	jobs     []*prefillJob
	// busyUntil is when the prompt compute reserved so far is done: the engine computes
	// prompts within one step budget, so prefills that overlap share it, in arrival order
	// (queuePrefill).
	busyUntil time.Time
}

// queuePrefill reserves the compute of uncached prompt tokens (TTFTPerPromptToken each)
// after the prompts reserved before it, and returns how long this prefill waits for those
// first: 0 on an engine computing no other prompt. vLLM's scheduler admits waiting
// prefills first come, first served into each step's token budget
// (vllm/v1/core/sched/scheduler.py), so concurrent prefills on one engine take turns rather
// than each running at full speed. A prefill cut short keeps its reservation (the next ones
// wait a little more than they would). now is the engine's clock; nil (the model off)
// returns 0.
func (in *interference) queuePrefill(uncached int, now time.Time) time.Duration {
	if in == nil || uncached <= 0 {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	start := now
	if in.busyUntil.After(now) {
		start = in.busyUntil
	}
	in.busyUntil = start.Add(time.Duration(uncached) * in.perToken)
	return start.Sub(now)
}

// decoder is one decoding sequence's identity in the model.
type decoder struct{ _ byte } // not zero-size, so that every decoder has its own address

// prefillJob is one sequence's prefill: uncached prompt tokens in chunks of at most left
// tokens, one chunk per engine step.
type prefillJob struct {
	uncached, left int
	// open while the prefilling sequence waits its prefill: sequences that start
	// decoding meanwhile join at step.
	open bool
	// cursors holds each decoder still to be stretched by the job: the index of its next
	// chunk.
	cursors map[*decoder]int
	// step is the furthest any decoder has got through the chunks.
	step int
}

// steps returns the number of chunks (engine steps) of the prefill.
func (j *prefillJob) steps() int { return (j.uncached + j.left - 1) / j.left }

// chunk returns the number of prompt tokens in chunk k.
func (j *prefillJob) chunk(k int) int { return min(j.left, j.uncached-k*j.left) }

// newInterference returns the model for cfg (defaults applied), nil when it is off.
func newInterference(cfg *Config) *interference {
	if !cfg.PrefillInterference {
		return nil
	}
	return &interference{budget: cfg.MaxNumBatchedTokens, perToken: cfg.TTFTPerPromptToken, decoders: make(map[*decoder]struct{})}
}

// startPrefill starts the prefill of uncached prompt tokens: its chunks take the step
// budget left after one token for each decoding sequence (at least 1), and those sequences
// take part. It returns nil (nothing to do) when the model is off or nothing is computed.
func (in *interference) startPrefill(uncached int) *prefillJob {
	if in == nil || uncached <= 0 {
		return nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	j := &prefillJob{
		uncached: uncached,
		left:     max(in.budget-len(in.decoders), 1),
		open:     true,
		cursors:  make(map[*decoder]int, len(in.decoders)),
	}
	for d := range in.decoders {
		j.cursors[d] = 0
	}
	in.jobs = append(in.jobs, j)
	return j
}

// endPrefill ends j's prefill wait: no decoder joins it any more; those taking part go on
// through its remaining chunks, unless the prefill was cut (the client left), which ends
// the job for all. A nil j is a no-op.
func (in *interference) endPrefill(j *prefillJob, cut bool) {
	if j == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	j.open = false
	if cut {
		clear(j.cursors)
	}
	in.pruneLocked()
}

// startDecode registers a sequence that has finished its prefill (or pulled its KV) and
// decodes from now on; it joins the prefills still waiting, at their current step. It
// returns nil when the model is off.
func (in *interference) startDecode() *decoder {
	if in == nil {
		return nil
	}
	d := &decoder{}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.decoders[d] = struct{}{}
	for _, j := range in.jobs {
		if j.open && j.step < j.steps() {
			j.cursors[d] = j.step
		}
	}
	return d
}

// endDecode unregisters d (nil: no-op).
func (in *interference) endDecode(d *decoder) {
	if in == nil || d == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.decoders, d)
	for _, j := range in.jobs {
		delete(j.cursors, d)
	}
	in.pruneLocked()
}

// stretch returns the prefill compute in d's next decode step (the tokens of the chunk of
// every prefill d takes part in, times the per-token compute) and moves d one step on.
func (in *interference) stretch(d *decoder) time.Duration {
	if in == nil || d == nil {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	// One step's prompt tokens: the chunks of the prefills in arrival order, as many as the
	// step's budget holds (prompts take turns at the engine's compute, queuePrefill), so a
	// later prefill stretches the step only once the ones before it are done.
	tokens, room := 0, max(in.budget-len(in.decoders), 1)
	for _, j := range in.jobs {
		k, ok := j.cursors[d]
		if !ok {
			continue
		}
		c := j.chunk(k)
		if tokens > 0 && c > room {
			break // the step is full: this chunk waits for a later one
		}
		tokens += c
		room -= c
		k++
		j.step = max(j.step, k)
		if k == j.steps() {
			delete(j.cursors, d)
		} else {
			j.cursors[d] = k
		}
	}
	in.pruneLocked()
	return time.Duration(tokens) * in.perToken
}

// pruneLocked drops the jobs that can stretch nobody any more.
func (in *interference) pruneLocked() {
	live := in.jobs[:0]
	for _, j := range in.jobs {
		if len(j.cursors) > 0 || (j.open && j.step < j.steps()) {
			live = append(live, j)
		}
	}
	clear(in.jobs[len(live):])
	in.jobs = live
}
