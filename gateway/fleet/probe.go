package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"
)

// ProbeNow probes every engine once, concurrently, and rebuilds the
// snapshot. Health probes never touch the in-flight counters
// (docs/cases.md L02).
func (f *Fleet) ProbeNow(ctx context.Context) {
	f.probeMu.Lock()
	defer f.probeMu.Unlock()
	// A passing probe also ends an ejection whose time has passed.
	f.forEachEngine(func(e *Engine) {
		if f.probe(ctx, e) {
			f.returnEjected(e)
		}
	})
	f.rebuild()
}

// forEachEngine runs fn on every engine in the fleet, each on its own
// goroutine, and returns when all have returned.
func (f *Fleet) forEachEngine(fn func(*Engine)) {
	f.mu.Lock()
	engines := slices.Clone(f.engines)
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Go(func() { fn(e) })
	}
	wg.Wait()
}

// probe asks e's /health (and /v1/models, /is_sleeping when due) and
// records the verdict; it reports whether the probe passed. The caller
// holds probeMu.
func (f *Fleet) probe(ctx context.Context, e *Engine) bool {
	if e.prov != nil {
		// A provider's API is not probed: a probe would cost money, or
		// count against its rate limit. Its traffic is its health.
		return true
	}
	err := f.get(ctx, e, "/health", nil)
	if err == nil && (!e.static && (e.models.Load() == nil || time.Since(e.lastDiscover) >= f.health.DiscoveryInterval)) {
		err = f.discover(ctx, e)
	}
	if err == nil && e.sleeping.Load() {
		// Put to sleep through the gateway: back in routing once the
		// engine says it is awake, however it was woken, unless an admin
		// call came in meanwhile (its verdict is newer).
		gen := e.sleepGen.Load()
		var st struct {
			IsSleeping *bool `json:"is_sleeping"`
		}
		if f.get(ctx, e, "/is_sleeping", &st) == nil && st.IsSleeping != nil && !*st.IsSleeping && e.sleepGen.Load() == gen {
			e.sleeping.Store(false)
			f.log.Info("engine awake", "engine", e.cfg.Name)
		}
	}
	first := !e.probed.Load()
	defer e.probed.Store(true)
	if err != nil {
		msg := err.Error()
		e.lastErr.Store(&msg)
		e.fails++
		// The first verdict is taken at once: an engine that has never
		// answered is not presumed healthy for UnhealthyAfter rounds.
		if (first || e.fails >= f.health.UnhealthyAfter) && e.ep.Healthy() {
			e.ep.SetHealthy(false)
			f.log.Warn("engine unhealthy", "engine", e.cfg.Name, "error", err)
		}
		return false
	}
	e.fails = 0
	e.lastErr.Store(nil)
	if !e.ep.Healthy() {
		e.ep.SetHealthy(true)
		f.log.Info("engine healthy", "engine", e.cfg.Name)
	}
	return true
}

// discover reads the engine's /v1/models: the model ids it serves (LoRA
// adapters included: vLLM lists each loaded adapter with its base model as
// parent) and their cards.
func (f *Fleet) discover(ctx context.Context, e *Engine) error {
	var list struct {
		Data []ModelCard `json:"data"`
	}
	if err := f.get(ctx, e, "/v1/models", &list); err != nil {
		return err
	}
	ms := make([]string, 0, len(list.Data))
	cards := make(map[string]ModelCard, len(list.Data))
	for _, d := range list.Data {
		if d.ID != "" && !slices.Contains(ms, d.ID) {
			ms = append(ms, d.ID)
			d.Object = "model"
			cards[d.ID] = d
		}
	}
	sort.Strings(ms)
	e.cards.Store(&cards)
	e.models.Store(&ms)
	e.lastDiscover = time.Now()
	return nil
}

var errProbeStatus = errors.New("unexpected status")

func (f *Fleet) get(ctx context.Context, e *Engine, path string, into any) error {
	// JoinPath on a base with an empty path yields a relative path: go
	// through String, which restores the leading slash.
	resp, err := f.engineGet(ctx, f.client, e, e.ep.URL().JoinPath(path).String(), path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if into == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(into); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// engineGet sends GET url to engine e through c, with the engine's
// credentials and, when accept is not nil, that Accept header. It returns
// the response of a 200, whose body the caller closes; any other status is
// drained (up to 64 KiB), closed and returned as an error wrapping
// errProbeStatus that names path.
func (f *Fleet) engineGet(ctx context.Context, c *http.Client, e *Engine, url, path string, accept []string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if accept != nil {
		req.Header["Accept"] = accept
	}
	if auth := e.Auth(); auth != nil {
		req.Header["Authorization"] = auth
	}
	if e.rt != nil {
		// The engine's own TLS (its ca_file), with c's timeout and
		// redirect rule.
		c = &http.Client{Transport: e.rt, Timeout: c.Timeout, CheckRedirect: c.CheckRedirect}
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %w %d", path, errProbeStatus, resp.StatusCode)
	}
	return resp, nil
}
