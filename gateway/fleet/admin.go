package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
)

// maxAdminAnswer caps an engine's answer to an admin call that is kept.
const maxAdminAnswer = 64 << 10

// Action is one engine admin call the fleet forwards to an engine
// ([Fleet.Forward]): vLLM's dev-mode endpoints (VLLM_SERVER_DEV_MODE=1)
// and its runtime LoRA endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
// Find one with [LookupAction].
type Action struct {
	// Method is the call's HTTP method, on the admin API and on the engine.
	Method string
	path   string
	// after runs once the engine answered 2xx, with the request body.
	after func(f *Fleet, ctx context.Context, e *Engine, body []byte)
}

// LookupAction returns the engine admin action named name (the last path
// segment of the admin route: sleep, wake_up, is_sleeping,
// reset_prefix_cache, load_lora_adapter, unload_lora_adapter), and whether
// there is one.
func LookupAction(name string) (Action, bool) {
	a, ok := actions[name]
	return a, ok
}

// actions are the engine admin actions, by name.
var actions = map[string]Action{
	"sleep": {http.MethodPost, "/sleep", func(f *Fleet, _ context.Context, e *Engine, _ []byte) {
		e.sleepGen.Add(1)
		e.sleeping.Store(true)
		f.log.Info("engine put to sleep", "engine", e.cfg.Name)
		f.rebuild()
	}},
	"wake_up": {http.MethodPost, "/wake_up", func(f *Fleet, _ context.Context, e *Engine, _ []byte) {
		e.sleepGen.Add(1)
		e.sleeping.Store(false)
		f.log.Info("engine woken up", "engine", e.cfg.Name)
		f.mu.Lock()
		// The last scraped stats still say asleep; the engine has just
		// said otherwise. They are forgotten (a failed next scrape must
		// not bring them back); the next scrape gives the new verdict.
		e.ep.SetStats(nil)
		e.blocked = false
		f.rebuildLocked()
		f.mu.Unlock()
	}},
	"is_sleeping":        {http.MethodGet, "/is_sleeping", nil},
	"reset_prefix_cache": {http.MethodPost, "/reset_prefix_cache", nil},
	"load_lora_adapter": {http.MethodPost, "/v1/load_lora_adapter", func(f *Fleet, ctx context.Context, e *Engine, body []byte) {
		f.loraChanged(ctx, e, body, true)
	}},
	"unload_lora_adapter": {http.MethodPost, "/v1/unload_lora_adapter", func(f *Fleet, ctx context.Context, e *Engine, body []byte) {
		f.loraChanged(ctx, e, body, false)
	}},
}

// ActionResult is one engine's answer to an admin call, as the admin API
// shows it.
type ActionResult struct {
	Engine string          `json:"engine"`
	Status int             `json:"status"`          // the engine's HTTP status; 0 when it could not be reached
	Body   json.RawMessage `json:"body,omitempty"`  // the engine's answer when it is JSON
	Text   string          `json:"text,omitempty"`  // the engine's answer otherwise (capped)
	Error  string          `json:"error,omitempty"` // why it could not be reached
}

// Forward sends one admin call to e, with query (a raw query string, ""
// for none), body and its content type (application/json when ct is
// empty), and the engine's credentials; on a 2xx answer it applies the
// call's effect on routing before it returns: asleep or awake, an adapter
// loaded or unloaded. The engine's answer is kept up to 64 KiB; ctx bounds
// the call.
func (f *Fleet) Forward(ctx context.Context, e *Engine, act Action, query string, body []byte, ct string) ActionResult {
	res := ActionResult{Engine: e.cfg.Name}
	url := e.base + act.path
	if query != "" {
		url += "?" + query
	}
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, act.Method, url, rd)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	if len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
	}
	if auth := e.Auth(); auth != nil {
		req.Header["Authorization"] = auth
	}
	resp, err := f.statsClient.Do(req)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxAdminAnswer))
	res.Status = resp.StatusCode
	if json.Valid(b) && len(bytes.TrimSpace(b)) > 0 {
		res.Body = b
	} else {
		res.Text = strings.TrimSpace(string(b[:min(len(b), 2<<10)]))
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 && act.after != nil {
		act.after(f, ctx, e, body)
	}
	return res
}

// loraChanged updates the routing view after an adapter was loaded
// (loaded set) or unloaded on e: an engine whose models are discovered is
// asked for its /v1/models again at once; on an engine with configured
// models the adapter is added to or removed from them. Either way the
// snapshot is rebuilt before the admin call answers.
func (f *Fleet) loraChanged(ctx context.Context, e *Engine, body []byte, loaded bool) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	_ = json.Unmarshal(body, &req)
	if loaded {
		f.log.Info("LoRA adapter loaded", "engine", e.cfg.Name, "adapter", req.Name)
	} else {
		f.log.Info("LoRA adapter unloaded", "engine", e.cfg.Name, "adapter", req.Name)
	}
	if !e.static {
		f.probeMu.Lock()
		err := f.discover(ctx, e)
		f.probeMu.Unlock()
		if err == nil {
			f.rebuild()
			return
		}
		f.log.Warn("model discovery after a LoRA change failed", "engine", e.cfg.Name, "error", err)
	}
	if req.Name == "" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	ms := slices.Clone(e.knownModels())
	i := slices.Index(ms, req.Name)
	switch {
	case loaded && i < 0:
		ms = append(ms, req.Name)
		sort.Strings(ms)
		cards := map[string]ModelCard{}
		if c := e.cards.Load(); c != nil {
			for k, v := range *c {
				cards[k] = v
			}
		}
		card := ModelCard{ID: req.Name, Object: "model", Created: f.now().Unix(), OwnedBy: "vllm"}
		if req.Path != "" {
			card.Root = &req.Path
		}
		if len(e.cfg.Models) > 0 {
			parent := e.cfg.Models[0]
			card.Parent = &parent
		}
		cards[req.Name] = card
		e.cards.Store(&cards)
	case !loaded && i >= 0 && !slices.Contains(e.cfg.Models, req.Name):
		ms = slices.Delete(ms, i, i+1)
	default:
		return
	}
	e.models.Store(&ms)
	f.rebuildLocked()
}

// Engine returns the engine in the fleet called name, or nil.
func (f *Fleet) Engine(name string) *Engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byNameLocked(name)
}

// byNameLocked is Engine with f.mu held.
func (f *Fleet) byNameLocked(name string) *Engine {
	for _, e := range f.engines {
		if e.cfg.Name == name {
			return e
		}
	}
	return nil
}

// Serving returns the engines in the fleet that serve model (healthy or
// not: an adapter is loaded wherever its base model is); none for "".
func (f *Fleet) Serving(model string) []*Engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Engine
	for _, e := range f.engines {
		if model != "" && slices.Contains(e.knownModels(), model) {
			out = append(out, e)
		}
	}
	return out
}

// SetDrained sets or clears (undrain) the admin drain of the named engine
// and rebuilds the routing snapshot; it returns the engine's status after
// the change, and false when no engine in the fleet has that name. A
// drained engine stays in the fleet (probed, its stats scraped) but takes no
// new requests. The flag is set under the fleet's lock, so a reload that
// replaces the engine at the same moment carries it over to the new
// incarnation (Fleet.apply), never leaves it on the old one alone.
func (f *Fleet) SetDrained(name string, on bool) (EngineStatus, bool) {
	f.mu.Lock()
	e := f.byNameLocked(name)
	if e == nil {
		f.mu.Unlock()
		return EngineStatus{}, false
	}
	changed := e.drained.Swap(on) != on
	f.rebuildLocked()
	f.mu.Unlock()
	if changed {
		if on {
			f.log.Info("engine drained: no new requests", "engine", name)
		} else {
			f.log.Info("engine undrained", "engine", name)
		}
	}
	for _, st := range f.Status() {
		if st.Name == name && !st.Retired {
			return st, true
		}
	}
	return EngineStatus{}, false
}
