package gateway

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// TestAdminReload: POST /admin/reload answers 501 without a reloader, the
// reloader's result, or 422 config_rejected with its error on one line;
// GET is not allowed.
func TestAdminReload(t *testing.T) {
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}}))
	if st, _, body := adminDo(h, http.MethodPost, "/admin/reload", ""); st != http.StatusNotImplemented || !strings.Contains(body, "reload_unavailable") {
		t.Errorf("without a reloader: %d %s, want 501 reload_unavailable", st, body)
	}
	var triggers []string
	result, fail := "applied", error(nil)
	h.gw.SetReloader(func(trigger string) (string, error) {
		triggers = append(triggers, trigger)
		return result, fail
	})
	if st, _, body := adminDo(h, http.MethodPost, "/admin/reload", ""); st != http.StatusOK || strings.TrimSpace(body) != `{"result":"applied"}` {
		t.Errorf("applied: %d %s", st, body)
	}
	fail = errors.New("engines[1].url: not a url\nengines[1].name: empty")
	if st, _, body := adminDo(h, http.MethodPost, "/admin/reload", ""); st != http.StatusUnprocessableEntity || !strings.Contains(body, "config_rejected") ||
		!strings.Contains(body, "not a url; engines[1].name: empty") {
		t.Errorf("rejected: %d %s, want 422 config_rejected with the reasons on one line", st, body)
	}
	if st, _, _ := adminDo(h, http.MethodGet, "/admin/reload", ""); st != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", st)
	}
	if strings.Join(triggers, ",") != "admin,admin" {
		t.Errorf("triggers %v, want admin twice", triggers)
	}
	h.gw.SetReloader(nil)
	if st, _, _ := adminDo(h, http.MethodPost, "/admin/reload", ""); st != http.StatusNotImplemented {
		t.Errorf("after SetReloader(nil): %d, want 501", st)
	}
}
