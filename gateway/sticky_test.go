package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// TestStickyIndexBounded fills the index past its capacity: it keeps the
// newest ids only, forgets the oldest first, and holds nothing before the
// first id.
func TestStickyIndexBounded(t *testing.T) {
	x := newStickyIndex(4)
	if cap(x.ring) != 0 || len(x.m) != 0 {
		t.Fatalf("an empty index holds %d ring slots, %d entries", cap(x.ring), len(x.m))
	}
	for i := range 10 {
		x.put("resp_"+strconv.Itoa(i), "e"+strconv.Itoa(i%2))
	}
	if len(x.m) != 4 || len(x.ring) != 4 {
		t.Fatalf("holds %d entries, %d ring slots, want 4", len(x.m), len(x.ring))
	}
	for i := range 10 {
		e, ok := x.get("resp_" + strconv.Itoa(i))
		if want := i >= 6; ok != want || ok && e != "e"+strconv.Itoa(i%2) {
			t.Errorf("resp_%d: %q %v, want present=%v", i, e, ok, want)
		}
	}
	x.put("resp_9", "e7") // an update does not evict
	if e, _ := x.get("resp_6"); e != "e0" {
		t.Errorf("resp_6 evicted by an update")
	}
	if e, _ := x.get("resp_9"); e != "e7" {
		t.Errorf("resp_9 = %q after update", e)
	}
}

// TestResponsesSticky creates stored responses through the gateway and
// reads and cancels them: the request goes to the engine that created the
// response (remembered by the gateway), and a gateway that never saw the
// creation (another replica, or a restart) still finds it by asking each
// engine; an unknown id is a 404 after every engine said so, and an id
// that is not a plain token is refused before any engine is asked.
func TestResponsesSticky(t *testing.T) {
	// Background responses that run for seconds, so they can be cancelled.
	_, rec1, srv1 := recordedSim(t, enginesim.Config{Models: []string{"m"}, ITL: 20 * time.Millisecond})
	_, rec2, srv2 := recordedSim(t, enginesim.Config{Models: []string{"m"}, ITL: 20 * time.Millisecond})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: srv2.URL, Models: []string{"m"}})
	h := newHarness(t, cfg)

	ids := map[string]string{} // response id -> engine that made it
	for range 4 {
		st, hdr, b := h.do(http.MethodPost, "/v1/responses", `{"model":"m","input":"hi","background":true,"max_output_tokens":500}`)
		if st != 200 {
			t.Fatalf("create: %d %s", st, b)
		}
		var r struct{ ID string }
		_ = json.Unmarshal(b, &r)
		ids[r.ID] = hdr.Get("X-Switchboard-Engine")
	}
	if len(ids) != 4 {
		t.Fatalf("ids %v", ids)
	}
	count := func(rec *bodyRecorder, prefix string) int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, g := range rec.got {
			if strings.HasPrefix(g.path, prefix) {
				n++
			}
		}
		return n
	}
	for id, engine := range ids {
		st, hdr, b := h.do(http.MethodGet, "/v1/responses/"+id, "")
		if st != 200 || hdr.Get("X-Switchboard-Engine") != engine || !strings.Contains(string(b), id) {
			t.Errorf("GET %s: %d from %q, want 200 from %s: %.200s", id, st, hdr.Get("X-Switchboard-Engine"), engine, b)
		}
	}
	// Remembered: each GET asked one engine only.
	if n := count(rec1, "/v1/responses/") + count(rec2, "/v1/responses/"); n != len(ids) {
		t.Errorf("engines were asked %d times for %d stored responses", n, len(ids))
	}

	// A replica that did not create them finds them by asking around.
	other := newHarness(t, cfg)
	for id, engine := range ids {
		st, hdr, _ := other.do(http.MethodPost, "/v1/responses/"+id+"/cancel", "")
		if st != 200 || hdr.Get("X-Switchboard-Engine") != engine {
			t.Errorf("cancel %s via another gateway: %d from %q, want 200 from %s", id, st, hdr.Get("X-Switchboard-Engine"), engine)
		}
	}
	st, _, b := h.do(http.MethodGet, "/v1/responses/resp_unknown", "")
	if st != 404 {
		t.Errorf("unknown id: %d %s, want 404", st, b)
	}
	before := count(rec1, "/v1/responses/") + count(rec2, "/v1/responses/")
	st, _, _ = h.do(http.MethodGet, "/v1/responses/a%2F..%2Fsleep", "")
	if st != 400 {
		t.Errorf("an id with a slash: %d, want 400", st)
	}
	if after := count(rec1, "/v1/responses/") + count(rec2, "/v1/responses/"); after != before {
		t.Errorf("an invalid id reached an engine")
	}
	h.waitIdle()
	other.waitIdle()
}

// TestStickyMissIsNotAnEngineError: a sticky lookup that asks an engine
// which does not hold the id (404, then found on the next engine) must not
// record the miss as a failed engine attempt (error.type "404") in
// switchboard.engine.request.duration: the request succeeded and no engine
// misbehaved.
func TestStickyMissIsNotAnEngineError(t *testing.T) {
	mk := func(has bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !has || !strings.HasSuffix(r.URL.Path, "/resp_x") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(404)
				_, _ = io.WriteString(w, `{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":404}}`)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"resp_x","object":"response","status":"completed"}`)
		}
	}
	e1 := fakeEngine(t, []string{"m"}, mk(false))
	e2 := fakeEngine(t, []string{"m"}, mk(true))
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: e1.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: e2.URL, Models: []string{"m"}}))
	st, _, b := h.do(http.MethodGet, "/v1/responses/resp_x", "")
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	// An id no engine holds: 404 to the client, and still no engine error
	// (on the last engine asked either).
	if st, _, b := h.do(http.MethodGet, "/v1/responses/resp_gone", ""); st != 404 {
		t.Fatalf("unknown id: %d %s", st, b)
	}
	h.waitIdle()
	if et := h.errorTypes(); et["404"] != 0 || et[""] != 4 {
		t.Errorf("sticky misses counted as engine failures: error types %v, want 4 attempts without error", et)
	}
}
