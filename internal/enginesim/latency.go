package enginesim

import "time"

// delayKind names a computed wait, for the test hook Engine.onDelay.
type delayKind int

const (
	delayTTFT       delayKind = iota // a prefill wait (time to first token, embeddings' one wait)
	delayITL                         // one inter-token wait
	delayKVTransfer                  // a decode leg's KV pull, in place of the prefill wait
)

// ttftFor returns the prefill wait of a sequence with uncached uncached prompt tokens that
// starts its prefill while running sequences run on the engine, itself included: TTFT +
// TTFTPerPromptToken*uncached + TTFTPerRunning*(running-1).
func (e *Engine) ttftFor(uncached, running int) time.Duration {
	cfg := &e.cfg
	return cfg.TTFT + time.Duration(uncached)*cfg.TTFTPerPromptToken + time.Duration(others(running))*cfg.TTFTPerRunning
}

// itlFor returns the wait before a token while running sequences run on the engine, the
// generating one included: ITL + ITLPerRunning*(running-1).
func (e *Engine) itlFor(running int) time.Duration {
	return e.cfg.ITL + time.Duration(others(running))*e.cfg.ITLPerRunning
}

// others returns the number of sequences running besides the caller's own, never negative.
func others(running int) int { return max(running-1, 0) }

// prefillDelay returns the prefill wait of the (running) sequence for uncached prompt
// tokens, from the engine's load now.
func (c *call) prefillDelay(uncached int) time.Duration {
	d := c.e.ttftFor(uncached, c.e.sched.numRunning())
	c.e.observeDelay(delayTTFT, d)
	return d
}

// itlDelay returns the wait before the (running) sequence's next token, from the engine's
// load now, plus the compute of the prefill chunks in this decode step (see
// [interference]).
func (c *call) itlDelay() time.Duration {
	d := c.e.itlFor(c.e.sched.numRunning()) + c.e.interf.stretch(c.dec)
	c.e.observeDelay(delayITL, d)
	return d
}

// observeDelay reports a computed wait to the test hook, if one is set.
func (e *Engine) observeDelay(k delayKind, d time.Duration) {
	if e.onDelay != nil {
		e.onDelay(k, d)
	}
}
