package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
)

// adminTimeout bounds one engine admin call: vLLM's sleep level 1 offloads
// the weights to CPU memory and wake-up reloads them, which takes seconds
// on a large model.
const adminTimeout = 2 * time.Minute

// maxAdminBody caps an admin request body (a LoRA load request).
const maxAdminBody = 64 << 10

// engineAction is one engine admin call forwarded to an engine:
// vLLM's dev-mode endpoints (VLLM_SERVER_DEV_MODE=1) and its runtime LoRA
// endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True).
type engineAction struct {
	method, path string
	// after runs once the engine answered 2xx, with the request body.
	after func(p *Pool, ctx context.Context, e *engine, body []byte)
}

// engineActions are the per-engine admin routes, by their last path
// segment: POST /admin/engines/{name}/{action}.
var engineActions = map[string]engineAction{
	"sleep": {http.MethodPost, "/sleep", func(p *Pool, _ context.Context, e *engine, _ []byte) {
		e.sleepGen.Add(1)
		e.sleeping.Store(true)
		p.log.Info("engine put to sleep", "engine", e.cfg.Name)
		p.rebuild()
	}},
	"wake_up": {http.MethodPost, "/wake_up", func(p *Pool, _ context.Context, e *engine, _ []byte) {
		e.sleepGen.Add(1)
		e.sleeping.Store(false)
		p.log.Info("engine woken up", "engine", e.cfg.Name)
		p.mu.Lock()
		// The last scraped stats still say asleep; the engine has just
		// said otherwise. They are forgotten (a failed next scrape must
		// not bring them back); the next scrape gives the new verdict.
		e.ep.SetStats(nil)
		e.blocked = false
		p.rebuildLocked()
		p.mu.Unlock()
	}},
	"is_sleeping":        {http.MethodGet, "/is_sleeping", nil},
	"reset_prefix_cache": {http.MethodPost, "/reset_prefix_cache", nil},
	"load_lora_adapter": {http.MethodPost, "/v1/load_lora_adapter", func(p *Pool, ctx context.Context, e *engine, body []byte) {
		p.loraChanged(ctx, e, body, true)
	}},
	"unload_lora_adapter": {http.MethodPost, "/v1/unload_lora_adapter", func(p *Pool, ctx context.Context, e *engine, body []byte) {
		p.loraChanged(ctx, e, body, false)
	}},
}

// actionResult is one engine's answer to an admin call.
type actionResult struct {
	Engine string          `json:"engine"`
	Status int             `json:"status"`          // the engine's HTTP status; 0 when it could not be reached
	Body   json.RawMessage `json:"body,omitempty"`  // the engine's answer when it is JSON
	Text   string          `json:"text,omitempty"`  // the engine's answer otherwise (capped)
	Error  string          `json:"error,omitempty"` // why it could not be reached
}

// mountEngineAdmin adds the engine admin routes to the admin router:
//
//	POST /admin/engines/{name}/sleep?level=1|2    put the engine to sleep; it leaves routing
//	POST /admin/engines/{name}/wake_up            wake it; it comes back
//	GET  /admin/engines/{name}/is_sleeping        the engine's own answer
//	POST /admin/engines/{name}/reset_prefix_cache
//	POST /admin/engines/{name}/load_lora_adapter  body {"lora_name","lora_path"}, as vLLM takes it
//	POST /admin/engines/{name}/unload_lora_adapter  body {"lora_name"}
//	POST /admin/models/load_lora_adapter?model=BASE    the same on every engine serving BASE
//	POST /admin/models/unload_lora_adapter?model=BASE
//	POST /admin/engines/{name}/drain              no new requests; in-flight ones finish (the gateway's own)
//	POST /admin/engines/{name}/undrain            back in routing (also .../resume)
//
// The query string and body go to the engine unchanged, with the engine's
// credentials. The answer is {"results":[actionResult...]}, 200 when every
// engine answered 2xx, else 502. The routing view is updated before the
// answer is written.
func (s *Server) mountEngineAdmin(r chi.Router) {
	// drain and resume are the gateway's own: the engine is not called.
	// The answer is the engine's status (GET /admin/engines' entry), whose
	// prefill and decode say how many requests are still finishing.
	drain := func(on bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				writeError(w, r, &APIError{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed", Message: "method " + r.Method + " is not allowed on " + r.URL.Path})
				return
			}
			st, ok := s.pool.setDrained(engineParam(r), on)
			if !ok {
				writeError(w, r, &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "engine_not_found", Message: "no engine named " + engineParam(r)})
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(st)
		}
	}
	r.HandleFunc("/admin/engines/{name}/drain", drain(true))
	r.HandleFunc("/admin/engines/{name}/undrain", drain(false))
	r.HandleFunc("/admin/engines/{name}/resume", drain(false))
	r.HandleFunc("/admin/engines/{name}/{action}", func(w http.ResponseWriter, r *http.Request) {
		act, ok := engineActions[chi.URLParam(r, "action")]
		if !ok {
			writeError(w, r, &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found", Message: "no admin action " + r.URL.Path})
			return
		}
		if r.Method != act.method {
			w.Header().Set("Allow", act.method)
			writeError(w, r, &APIError{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed", Message: "method " + r.Method + " is not allowed on " + r.URL.Path})
			return
		}
		e := s.pool.byName(engineParam(r))
		if e == nil {
			writeError(w, r, &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "engine_not_found", Message: "no engine named " + engineParam(r)})
			return
		}
		s.runAction(w, r, act, []*engine{e})
	})
	r.Post("/admin/models/{action}", func(w http.ResponseWriter, r *http.Request) {
		name := chi.URLParam(r, "action")
		act, ok := engineActions[name]
		if !ok || !strings.HasSuffix(name, "lora_adapter") {
			writeError(w, r, &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found", Message: "no admin action " + r.Method + " " + r.URL.Path})
			return
		}
		base := r.URL.Query().Get("model")
		engs := s.pool.serving(base)
		if len(engs) == 0 {
			writeError(w, r, errModelNotFound(base))
			return
		}
		s.runAction(w, r, act, engs)
	})
}

// runAction forwards one admin call to each engine, concurrently.
func (s *Server) runAction(w http.ResponseWriter, r *http.Request, act engineAction, engs []*engine) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil || len(body) > maxAdminBody {
		writeError(w, r, errBadRequest("", "admin request body unreadable or over 64 KiB"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	results := make([]actionResult, len(engs))
	done := make(chan struct{}, len(engs))
	for i, e := range engs {
		go func() {
			defer func() { done <- struct{}{} }()
			results[i] = s.pool.forward(ctx, e, act, r.URL.RawQuery, body, r.Header.Get("Content-Type"))
		}()
	}
	for range engs {
		<-done
	}
	status := http.StatusOK
	for _, res := range results {
		if res.Status < 200 || res.Status > 299 {
			status = http.StatusBadGateway
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Results []actionResult `json:"results"`
	}{results})
}

// forward sends one admin call to e and, on a 2xx answer, applies its
// effect on routing.
func (p *Pool) forward(ctx context.Context, e *engine, act engineAction, query string, body []byte, ct string) actionResult {
	res := actionResult{Engine: e.cfg.Name}
	url := e.base + act.path
	if query != "" {
		url += "?" + query
	}
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, act.method, url, rd)
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
	if e.auth != nil {
		req.Header["Authorization"] = e.auth
	}
	resp, err := p.statsClient.Do(req)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxAdminBody))
	res.Status = resp.StatusCode
	if json.Valid(b) && len(bytes.TrimSpace(b)) > 0 {
		res.Body = b
	} else {
		res.Text = strings.TrimSpace(string(b[:min(len(b), 2<<10)]))
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 && act.after != nil {
		act.after(p, ctx, e, body)
	}
	return res
}

// loraChanged updates the routing view after an adapter was loaded
// (loaded set) or unloaded on e: an engine whose models are discovered is
// asked for its /v1/models again at once; on an engine with configured
// models the adapter is added to or removed from them. Either way the
// snapshot is rebuilt before the admin call answers.
func (p *Pool) loraChanged(ctx context.Context, e *engine, body []byte, loaded bool) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	_ = json.Unmarshal(body, &req)
	if loaded {
		p.log.Info("LoRA adapter loaded", "engine", e.cfg.Name, "adapter", req.Name)
	} else {
		p.log.Info("LoRA adapter unloaded", "engine", e.cfg.Name, "adapter", req.Name)
	}
	if !e.static {
		p.probeMu.Lock()
		err := p.discover(ctx, e)
		p.probeMu.Unlock()
		if err == nil {
			p.rebuild()
			return
		}
		p.log.Warn("model discovery after a LoRA change failed", "engine", e.cfg.Name, "error", err)
	}
	if req.Name == "" {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ms := slices.Clone(e.knownModels())
	i := slices.Index(ms, req.Name)
	switch {
	case loaded && i < 0:
		ms = append(ms, req.Name)
		sort.Strings(ms)
		cards := map[string]modelObject{}
		if c := e.cards.Load(); c != nil {
			for k, v := range *c {
				cards[k] = v
			}
		}
		card := modelObject{ID: req.Name, Object: "model", Created: p.now().Unix(), OwnedBy: "vllm"}
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
	p.rebuildLocked()
}

// byName returns the engine in the pool called name, or nil.
func (p *Pool) byName(name string) *engine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byNameLocked(name)
}

// byNameLocked is byName with p.mu held.
func (p *Pool) byNameLocked(name string) *engine {
	for _, e := range p.engines {
		if e.cfg.Name == name {
			return e
		}
	}
	return nil
}

// serving returns the engines in the pool that serve model (healthy or
// not: an adapter is loaded wherever its base model is).
func (p *Pool) serving(model string) []*engine {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*engine
	for _, e := range p.engines {
		if model != "" && slices.Contains(e.knownModels(), model) {
			out = append(out, e)
		}
	}
	return out
}

// setDrained sets or clears (undrain) the admin drain of the named engine
// and rebuilds the routing snapshot; it returns the engine's status after
// the change, and false when no engine in the pool has that name. A
// drained engine stays in the pool (probed, its stats scraped) but takes no
// new requests. The flag is set under the pool's lock, so a reload that
// replaces the engine at the same moment carries it over to the new
// incarnation (Pool.apply), never leaves it on the old one alone.
func (p *Pool) setDrained(name string, on bool) (EngineStatus, bool) {
	p.mu.Lock()
	e := p.byNameLocked(name)
	if e == nil {
		p.mu.Unlock()
		return EngineStatus{}, false
	}
	changed := e.drained.Swap(on) != on
	p.rebuildLocked()
	p.mu.Unlock()
	if changed {
		if on {
			p.log.Info("engine drained: no new requests", "engine", name)
		} else {
			p.log.Info("engine undrained", "engine", name)
		}
	}
	for _, st := range p.Status() {
		if st.Name == name && !st.Retired {
			return st, true
		}
	}
	return EngineStatus{}, false
}

// engineParam is the {name} of an admin engine route, unescaped: a
// discovered engine's name may hold a "/" ("<namespace>/<pod>",
// "<slice>/<address>"), which a client sends as %2F and chi hands over
// still escaped.
func engineParam(r *http.Request) string {
	name := chi.URLParam(r, "name")
	if un, err := url.PathUnescape(name); err == nil {
		return un
	}
	return name
}
