package gateway

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
)

// ReloadFunc reloads the whole configuration the way SIGHUP does (the
// process's own loader: defaults, file, environment, flags, keys file),
// for the trigger named ("admin"), and returns its result ("applied" or
// "unchanged", telemetry.ReloadResult's names) or why the configuration
// was rejected, the running one staying in force. Calls are serialized
// with the other reloads by the caller's loader.
type ReloadFunc func(trigger string) (result string, err error)

// SetReloader installs fn as what POST /admin/reload runs; nil removes it
// (the route then answers 501). cmd/gateway installs its reloader once
// the admin listener serves; a Server built without one has none. Safe
// for concurrent use.
func (s *Server) SetReloader(fn ReloadFunc) {
	if fn == nil {
		s.reloadFn.Store(nil)
		return
	}
	s.reloadFn.Store(&fn)
}

// mountAdminReload adds POST /admin/reload: the configuration loaded and
// applied again, as on SIGHUP, answered 200 {"result":"applied"|"unchanged"}
// or 422 config_rejected with the reasons (the running configuration
// stays). A write action: it needs an admin token (AdminAuthConfig).
func (s *Server) mountAdminReload(r chi.Router) {
	r.Post("/admin/reload", door(func(w http.ResponseWriter, r *http.Request) error {
		fn := s.reloadFn.Load()
		if fn == nil {
			return &APIError{Status: http.StatusNotImplemented, Type: TypeInvalidRequest, Code: "reload_unavailable",
				Message: "this gateway has no configuration loader to reload from"}
		}
		res, err := (*fn)("admin")
		if err != nil {
			return &APIError{Status: http.StatusUnprocessableEntity, Type: TypeInvalidRequest, Code: "config_rejected",
				Message: "the configuration was rejected and the running one is kept: " + strings.ReplaceAll(err.Error(), "\n", "; ")}
		}
		w.Header().Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(struct {
			Result string `json:"result"`
		}{res})
	}))
}
