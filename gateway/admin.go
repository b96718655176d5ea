package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// adminTimeout bounds one engine admin call: vLLM's sleep level 1 offloads
// the weights to CPU memory and wake-up reloads them, which takes seconds
// on a large model.
const adminTimeout = 2 * time.Minute

// maxAdminBody caps an admin request body (a LoRA load request).
const maxAdminBody = 64 << 10

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
// credentials. The answer is {"results":[fleet.ActionResult...]}, 200 when every
// engine answered 2xx, else 502. The routing view is updated before the
// answer is written.
func (s *Server) mountEngineAdmin(r chi.Router) {
	// drain and resume are the gateway's own: the engine is not called.
	// The answer is the engine's status (GET /admin/engines' entry), whose
	// prefill and decode say how many requests are still finishing.
	drain := func(on bool) http.HandlerFunc {
		return door(func(w http.ResponseWriter, r *http.Request) error {
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				return &APIError{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed", Message: "method " + r.Method + " is not allowed on " + r.URL.Path}
			}
			st, ok := s.fleet.SetDrained(engineParam(r), on)
			if !ok {
				return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "engine_not_found", Message: "no engine named " + engineParam(r)}
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(st)
			return nil
		})
	}
	r.HandleFunc("/admin/engines/{name}/drain", drain(true))
	r.HandleFunc("/admin/engines/{name}/undrain", drain(false))
	r.HandleFunc("/admin/engines/{name}/resume", drain(false))
	r.HandleFunc("/admin/engines/{name}/{action}", door(func(w http.ResponseWriter, r *http.Request) error {
		act, ok := fleet.LookupAction(chi.URLParam(r, "action"))
		if !ok {
			return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found", Message: "no admin action " + r.URL.Path}
		}
		if r.Method != act.Method {
			w.Header().Set("Allow", act.Method)
			return &APIError{Status: http.StatusMethodNotAllowed, Type: TypeInvalidRequest, Code: "method_not_allowed", Message: "method " + r.Method + " is not allowed on " + r.URL.Path}
		}
		e := s.fleet.Engine(engineParam(r))
		if e == nil {
			return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "engine_not_found", Message: "no engine named " + engineParam(r)}
		}
		return s.runAction(w, r, act, []*fleet.Engine{e})
	}))
	r.Post("/admin/models/{action}", door(func(w http.ResponseWriter, r *http.Request) error {
		name := chi.URLParam(r, "action")
		act, ok := fleet.LookupAction(name)
		if !ok || !strings.HasSuffix(name, "lora_adapter") {
			return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: "not_found", Message: "no admin action " + r.Method + " " + r.URL.Path}
		}
		base := r.URL.Query().Get("model")
		engs := s.fleet.Serving(base)
		if len(engs) == 0 {
			return errModelNotFound(base)
		}
		return s.runAction(w, r, act, engs)
	}))
}

// runAction forwards one admin call to each engine, concurrently.
func (s *Server) runAction(w http.ResponseWriter, r *http.Request, act fleet.Action, engs []*fleet.Engine) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil || len(body) > maxAdminBody {
		return errBadRequest("", "admin request body unreadable or over 64 KiB")
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	results := make([]fleet.ActionResult, len(engs))
	done := make(chan struct{}, len(engs))
	for i, e := range engs {
		go func() {
			defer func() { done <- struct{}{} }()
			results[i] = s.fleet.Forward(ctx, e, act, r.URL.RawQuery, body, r.Header.Get("Content-Type"))
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
		Results []fleet.ActionResult `json:"results"`
	}{results})
	return nil
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
