package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// sleepState is the engine's sleep mode (vLLM's --enable-sleep-mode): which parts are
// asleep and the level of the last POST /sleep.
type sleepState struct {
	level   int  // 1: weights offloaded to CPU; 2: weights discarded
	weights bool // the weights are asleep
	kvCache bool // the KV cache is asleep
}

// sleeping reports whether any part is asleep; the engine serves nothing until all are awake.
func (s sleepState) sleeping() bool { return s.weights || s.kvCache }

// Sleep states, the sleep_state label values of vllm:engine_sleep_state.
const (
	sleepAwake            = "awake"
	sleepWeightsOffloaded = "weights_offloaded"
	sleepDiscardAll       = "discard_all"
)

// sleepGauges returns the values of vllm:engine_sleep_state for each sleep_state: awake is
// 1 when nothing sleeps; weights_offloaded (level 1) or discard_all (level 2) is 1 while
// the engine sleeps.
func (e *Engine) sleepGauges() map[string]float64 {
	e.sleepMu.Lock()
	s := e.sleep
	e.sleepMu.Unlock()
	g := map[string]float64{sleepAwake: 1, sleepWeightsOffloaded: 0, sleepDiscardAll: 0}
	if s.sleeping() {
		g[sleepAwake] = 0
		if s.level == 2 {
			g[sleepDiscardAll] = 1
		} else {
			g[sleepWeightsOffloaded] = 1
		}
	}
	return g
}

// serveSleep serves POST /sleep?level=1|2 (default 1): the engine sleeps, answering
// generation and pooling requests with 503 until woken, and its prefix cache is emptied
// (both levels discard the KV cache). Requests already running finish normally. 200 with an
// empty body.
func (e *Engine) serveSleep(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	level := 1
	switch v := r.URL.Query().Get("level"); v {
	case "", "1":
	case "2":
		level = 2
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("level must be 1 or 2, got %q", v))
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("", func() ([]byte, error) {
		e.sleepMu.Lock()
		e.sleep = sleepState{level: level, weights: true, kvCache: true}
		e.asleep.Store(true)
		e.sleepMu.Unlock()
		e.cache.reset()
		return nil, nil
	})
}

// serveWakeUp serves POST /wake_up[?tags=weights&tags=kv_cache]: the named parts wake (all
// without tags); the engine serves again once every part is awake. 200 with an empty body.
func (e *Engine) serveWakeUp(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	tags := r.URL.Query()["tags"]
	for _, t := range tags {
		if t != "weights" && t != "kv_cache" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown wake_up tag %q; use weights or kv_cache", t))
			return
		}
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("", func() ([]byte, error) {
		e.sleepMu.Lock()
		defer e.sleepMu.Unlock()
		if len(tags) == 0 {
			tags = []string{"weights", "kv_cache"}
		}
		for _, t := range tags {
			if t == "weights" {
				e.sleep.weights = false
			} else {
				e.sleep.kvCache = false
			}
		}
		e.asleep.Store(e.sleep.sleeping())
		return nil, nil
	})
}

// serveIsSleeping serves GET /is_sleeping: {"is_sleeping": bool}.
func (e *Engine) serveIsSleeping(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("application/json", func() ([]byte, error) {
		return json.Marshal(struct {
			IsSleeping bool `json:"is_sleeping"`
		}{e.asleep.Load()})
	})
}

// serveResetPrefixCache serves POST /reset_prefix_cache: the prefix cache forgets every
// block (running sequences keep their KV blocks). 200 with an empty body.
func (e *Engine) serveResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("", func() ([]byte, error) {
		e.cache.reset()
		return nil, nil
	})
}

// maxFaultSpec bounds the body of POST /admin/fault.
const maxFaultSpec = 4 << 10

// serveAdminFault serves POST /admin/fault, the simulator's own route (not vLLM's): the
// body, a fault spec as in the X-Enginesim-Fault header, becomes the engine's default
// fault ([Engine.SetFault]), so a benchmark can break a running engine process from
// outside; an empty body removes it. Requests already running keep their faults. 400 with
// the parse error for an invalid spec (the default is then unchanged), 200 with an empty
// body otherwise. Faults never act on this route.
func (e *Engine) serveAdminFault(w http.ResponseWriter, r *http.Request) {
	spec, err := io.ReadAll(io.LimitReader(r.Body, maxFaultSpec+1))
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the fault spec: %v", err))
		return
	case len(spec) > maxFaultSpec:
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("fault spec over %d bytes", maxFaultSpec))
		return
	}
	if err := e.SetFault(strings.TrimSpace(string(spec))); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

// The KV-events admin actions without a body.
type kvAdminAction int

const (
	kvAdminStop kvAdminAction = iota
	kvAdminResume
	kvAdminRestart
)

// serveKVEventsDrop serves POST /admin/kv-events/drop, the simulator's own route: the body,
// a drop range "N" or "N-M" as in Config.KVEventsDrop, becomes the KV-events drop fault
// ([Engine.SetKVEventsDrop]); an empty body removes it. 400 with the parse error for a bad
// range (the fault is then unchanged), 409 when KV events are off, 200 with an empty body
// otherwise.
func (e *Engine) serveKVEventsDrop(w http.ResponseWriter, r *http.Request) {
	spec, err := io.ReadAll(io.LimitReader(r.Body, maxFaultSpec+1))
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the drop range: %v", err))
		return
	case len(spec) > maxFaultSpec:
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("drop range over %d bytes", maxFaultSpec))
		return
	}
	writeKVAdminResult(w, e.SetKVEventsDrop(string(spec)))
}

// serveKVEventsAdmin serves POST /admin/kv-events/stop, /resume and /restart, the
// simulator's own routes ([Engine.SetKVEventsStopped], [Engine.RestartKVEvents]): 409 when
// KV events are off, 200 with an empty body otherwise.
func (e *Engine) serveKVEventsAdmin(w http.ResponseWriter, _ *http.Request, a kvAdminAction) {
	var err error
	switch a {
	case kvAdminStop:
		err = e.SetKVEventsStopped(true)
	case kvAdminResume:
		err = e.SetKVEventsStopped(false)
	case kvAdminRestart:
		err = e.RestartKVEvents()
	}
	writeKVAdminResult(w, err)
}

// writeKVAdminResult answers a KV-events admin request that ended with err.
func writeKVAdminResult(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrKVEventsOff):
		writeError(w, http.StatusConflict, err.Error()+" (start the engine with a kv events endpoint)")
	case err != nil:
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		w.WriteHeader(http.StatusOK)
	}
}
