package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// This file holds the hostile-client and hostile-engine tests: class 1
// (memory follows the bytes that arrived, not what a client declares) and
// class 2 (client credentials never reach an engine; engine identity and
// engine credentials never reach a client).

// hostileAdmin is the decoded GET /admin/engines answer, with its raw JSON.
type hostileAdmin struct {
	Engines       []fleet.EngineStatus `json:"engines"`
	LiveAttempts  int64                `json:"live_attempts"`
	Requests      int64                `json:"requests_in_flight"`
	BufferedBytes int64                `json:"buffered_bytes"`
	raw           []byte
}

// hostileAdminServer serves h's admin handler on a loopback listener and
// returns a function that fetches and decodes /admin/engines.
func hostileAdminServer(t *testing.T, h *harness) func() hostileAdmin {
	t.Helper()
	srv := httptest.NewServer(h.gw.AdminHandler(nil))
	t.Cleanup(srv.Close)
	client := srv.Client()
	return func() hostileAdmin {
		t.Helper()
		resp, err := client.Get(srv.URL + "/admin/engines")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /admin/engines: %d %v %q", resp.StatusCode, err, b)
		}
		var a hostileAdmin
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("GET /admin/engines: %v in %q", err, b)
		}
		a.raw = b
		return a
	}
}

// hostileEventually polls cond (testutil.Poll) until it holds or d has
// passed, and fails the test with what (and the last state, from last) if
// it never held.
func hostileEventually(t *testing.T, d time.Duration, what string, cond func() bool, last func() string) {
	t.Helper()
	if !testutil.Poll(d, cond) {
		t.Fatalf("after %s: %s never happened; last state: %s", d, what, last())
	}
}

// hostileDial opens a raw TCP connection to the gateway, closed at cleanup.
func hostileDial(t *testing.T, h *harness) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", h.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// hostileChatHead is the request head of a chat completion declaring a
// body of n bytes.
func hostileChatHead(n int) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
}

// hostileChatBody returns a valid non-streaming chat body for model of
// exactly n bytes (n must leave room for the JSON around the content).
func hostileChatBody(model string, n int) string {
	head := `{"model":"` + model + `","max_tokens":2,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// TestBodyBufferFollowsArrival proves that the memory a request body holds
// follows the bytes that arrived, never the Content-Length the client
// declared: a client declaring 15 MB and sending 1 byte holds one initial
// buffer (16 KiB); after 100 KiB more it holds less than twice what arrived
// plus that buffer; when it leaves, the gateway holds nothing, no request is
// in flight and no engine was contacted.
func TestBodyBufferFollowsArrival(t *testing.T) {
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}))
	admin := hostileAdminServer(t, h)
	state := func() string { a := admin(); return string(a.raw) }

	conn := hostileDial(t, h)
	if _, err := io.WriteString(conn, hostileChatHead(15_000_000)+"{"); err != nil {
		t.Fatal(err)
	}
	var a hostileAdmin
	hostileEventually(t, 3*time.Second, "the handler holding the first byte", func() bool {
		a = admin()
		return a.Requests == 1 && a.BufferedBytes > 0
	}, state)
	if a.BufferedBytes > initialBodyBuf {
		t.Errorf("after 1 byte of a declared 15 MB body: buffered_bytes = %d, want <= %d", a.BufferedBytes, initialBodyBuf)
	}
	if a.LiveAttempts != 0 {
		t.Errorf("live_attempts = %d while the body is incomplete, want 0", a.LiveAttempts)
	}

	const more = 100 << 10
	if _, err := conn.Write(bytes.Repeat([]byte{'a'}, more)); err != nil {
		t.Fatal(err)
	}
	arrived := int64(1 + more)
	// Capacity covers every byte read into the buffer: once it is at least
	// what was sent, the gateway has read it all.
	hostileEventually(t, 3*time.Second, "the buffer growing to hold what arrived", func() bool {
		a = admin()
		return a.BufferedBytes >= arrived
	}, state)
	if limit := 2*arrived + initialBodyBuf; a.BufferedBytes >= limit {
		t.Errorf("after %d bytes arrived: buffered_bytes = %d, want < %d", arrived, a.BufferedBytes, limit)
	}
	if a.Requests != 1 {
		t.Errorf("requests_in_flight = %d, want 1", a.Requests)
	}

	_ = conn.Close()
	hostileEventually(t, 3*time.Second, "buffered_bytes and requests_in_flight returning to 0", func() bool {
		a = admin()
		return a.BufferedBytes == 0 && a.Requests == 0
	}, state)
	if n := eng.Stats().Received; n != 0 {
		t.Errorf("engine received %d requests, want 0", n)
	}
	h.waitIdle()
}

// TestBodyReadDeadline proves that a client that stalls or trickles its
// body cannot hold a handler past Config.BodyReadTimeout: within a bounded
// time it reads 408 with an OpenAI error object (body_read_timeout,
// timeout_error) and Connection: close, and the connection is closed. No
// engine slot is taken, no attempt is recorded and the engine never hears
// of the request.
func TestBodyReadDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.BodyReadTimeout = timeout
	h := newHarness(t, cfg)

	// check reads the 408 from conn and asserts it came in time.
	check := func(t *testing.T, br *bufio.Reader, sent time.Time) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no response: %v", err)
		}
		elapsed := time.Since(sent)
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("status %d, want 408", resp.StatusCode)
		}
		if elapsed < timeout-20*time.Millisecond || elapsed > 3*time.Second {
			t.Errorf("408 after %s, want about %s", elapsed, timeout)
		}
		// ReadResponse moves "Connection: close" from the header to Close.
		if !resp.Close {
			t.Errorf("no Connection: close (header %q)", resp.Header.Get("Connection"))
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q, want application/json", ct)
		}
		e := decodeErr(t, resp)
		if e.code() != "body_read_timeout" || e.Error.Type != TypeTimeout {
			t.Errorf("error code %q type %q, want body_read_timeout timeout_error", e.code(), e.Error.Type)
		}
	}

	t.Run("stalled", func(t *testing.T) {
		conn := hostileDial(t, h)
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, hostileChatHead(100)+`{"model":"m`); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		br := bufio.NewReader(conn)
		check(t, br, sent)
		if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Errorf("after the 408: read %d bytes, %v; want the connection closed (EOF)", n, err)
		}
	})

	t.Run("trickling", func(t *testing.T) {
		conn := hostileDial(t, h)
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, hostileChatHead(100)); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				if _, err := conn.Write([]byte{' '}); err != nil {
					return
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		br := bufio.NewReader(conn)
		check(t, br, sent)
		close(stop)
		<-done
		// The server may reset rather than end the connection, since the
		// trickled bytes after the deadline were never read: either way no
		// further response comes.
		if n, err := br.Read(make([]byte, 1)); n != 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
			t.Errorf("after the 408: read %d bytes, %v; want the connection closed", n, err)
		}
	})

	h.waitIdle()
	if et := h.errorTypes(); len(et) != 0 {
		t.Errorf("attempts recorded %v, want none", et)
	}
	if n := eng.Stats().Received; n != 0 {
		t.Errorf("engine received %d requests, want 0", n)
	}
	if n := h.gw.InFlight(); n != 0 {
		t.Errorf("requests in flight %d, want 0", n)
	}
}

// TestConcurrencyBudget proves Config.MaxConcurrentRequests: with two
// requests held at the engine, a third is answered 503 gateway_overloaded
// with Retry-After without reaching the engine; once the two are gone a new
// request succeeds, and every gauge is back to 0.
func TestConcurrencyBudget(t *testing.T) {
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.MaxConcurrentRequests = 2
	h := newHarness(t, cfg)

	stream := `{"model":"m","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(stream))
			if err != nil {
				errs <- err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(enginesim.FaultHeader, "stall-before-headers")
			resp, err := h.client.Do(req)
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("held request answered %d", resp.StatusCode)
			}
			errs <- err
		}()
	}
	hostileEventually(t, 3*time.Second, "two requests held at the engine", func() bool {
		return eng.Stats().Received == 2 && h.gw.InFlight() == 2 && h.gw.LiveAttempts() == 2
	}, func() string {
		return fmt.Sprintf("received %d, in flight %d, live %d", eng.Stats().Received, h.gw.InFlight(), h.gw.LiveAttempts())
	})

	resp := h.post("/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("third request: status %d, want 503", resp.StatusCode)
	}
	if ra := resp.Header.Get("Retry-After"); ra == "" {
		t.Error("third request: no Retry-After")
	}
	if e := decodeErr(t, resp); e.code() != ErrTypeOverloaded || e.Error.Type != TypeUnavailable {
		t.Errorf("third request: code %q type %q, want %s %s", e.code(), e.Error.Type, ErrTypeOverloaded, TypeUnavailable)
	}
	if n := eng.Stats().Received; n != 2 {
		t.Errorf("engine received %d requests, want 2 (the third must not reach it)", n)
	}

	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("held request ended with %v, want context.Canceled", err)
		}
	}
	hostileEventually(t, 3*time.Second, "the held requests ending", func() bool {
		return h.gw.InFlight() == 0 && h.gw.LiveAttempts() == 0
	}, func() string { return fmt.Sprintf("in flight %d, live %d", h.gw.InFlight(), h.gw.LiveAttempts()) })

	resp = h.post("/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"chat.completion"`) {
		t.Errorf("after the held requests ended: %d %q, want a 200 completion", resp.StatusCode, b)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[""] != 1 || et[ErrTypeClientCancelled] != 2 || len(et) != 2 {
		t.Errorf("attempts %v, want 1 success and 2 client_cancelled (the rejected request makes no attempt)", et)
	}
}

// TestBufferedBytesBudget proves Config.MaxBufferedBytes: while one client
// holds a partly sent body that fills the budget, another client's body is
// answered 503 gateway_overloaded with Retry-After without reaching the
// engine; once the first leaves the budget is empty again and the second
// succeeds. A body over MaxBodyBytes gets 413, declared or not; one exactly
// at it is accepted.
func TestBufferedBytesBudget(t *testing.T) {
	const limit = 64 << 10
	eng, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}})
	cfg.MaxBufferedBytes = limit
	cfg.MaxBodyBytes = limit
	cfg.MaxFormBytes = limit
	cfg.MaxResponseBufferBytes = 32 << 10
	// Not observed: an observed answer is held in the same budget, which a
	// body of exactly MaxBufferedBytes fills ("at the limit").
	cfg.Migration.Limit = 0
	h := newHarness(t, cfg)
	admin := hostileAdminServer(t, h)
	state := func() string { return string(admin().raw) }

	hog := hostileDial(t, h)
	if _, err := io.WriteString(hog, hostileChatHead(limit)+"{"+strings.Repeat(" ", 60<<10)); err != nil {
		t.Fatal(err)
	}
	// 60 KiB arrived: the buffer has doubled to the whole declared 64 KiB.
	hostileEventually(t, 3*time.Second, "the partial body filling the budget", func() bool {
		a := admin()
		return a.BufferedBytes == limit && a.Requests == 1
	}, state)

	body := hostileChatBody("m", 20<<10)
	resp := h.post("/v1/chat/completions", body)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("second client while the budget is full: status %d, want 503", resp.StatusCode)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	if e := decodeErr(t, resp); e.code() != ErrTypeOverloaded || e.Error.Type != TypeUnavailable {
		t.Errorf("code %q type %q, want %s %s", e.code(), e.Error.Type, ErrTypeOverloaded, TypeUnavailable)
	}
	if n := eng.Stats().Received; n != 0 {
		t.Errorf("engine received %d requests, want 0", n)
	}
	if a := admin(); a.BufferedBytes != limit {
		t.Errorf("after the rejected request: buffered_bytes = %d, want %d (it must reserve nothing)", a.BufferedBytes, limit)
	}

	_ = hog.Close()
	hostileEventually(t, 3*time.Second, "the budget emptying after the first client left", func() bool {
		a := admin()
		return a.BufferedBytes == 0 && a.Requests == 0
	}, state)
	resp = h.post("/v1/chat/completions", body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"chat.completion"`) {
		t.Fatalf("second client after the first left: %d %q, want a 200 completion", resp.StatusCode, b)
	}
	if n := eng.Stats().Received; n != 1 {
		t.Errorf("engine received %d requests, want 1", n)
	}

	t.Run("at the limit", func(t *testing.T) {
		resp := h.post("/v1/chat/completions", hostileChatBody("m", limit))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("a body of exactly MaxBodyBytes: %d %q, want 200", resp.StatusCode, b)
		}
	})
	tooLarge := hostileChatBody("m", limit+1)
	for _, tc := range []struct {
		name string
		body func() io.Reader
	}{
		{"declared", func() io.Reader { return strings.NewReader(tooLarge) }},
		// io.MultiReader hides the length: the body is sent chunked and the
		// limit is found while reading.
		{"chunked", func() io.Reader { return io.MultiReader(strings.NewReader(tooLarge)) }},
	} {
		t.Run("too large "+tc.name, func(t *testing.T) {
			received := eng.Stats().Received
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", tc.body())
			req.Header.Set("Content-Type", "application/json")
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("status %d, want 413", resp.StatusCode)
			}
			if e := decodeErr(t, resp); e.code() != "request_too_large" || e.Error.Type != TypeInvalidRequest {
				t.Errorf("code %q type %q, want request_too_large invalid_request_error", e.code(), e.Error.Type)
			}
			if n := eng.Stats().Received; n != received {
				t.Errorf("engine received %d more requests, want 0", n-received)
			}
		})
	}
	h.waitIdle()
	hostileEventually(t, 3*time.Second, "the budget emptying", func() bool { return admin().BufferedBytes == 0 }, state)
}

// TestUsageInjectionNoCopy proves that outgoing builds the engine body from
// slices of the client's body (no copy, no mutation) and that its reader,
// read twice as a re-send would, yields the same bytes, n long.
func TestUsageInjectionNoCopy(t *testing.T) {
	m, err := telemetry.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := New(testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}}), routing.NewRoundRobin(), m)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	const msgs = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, body string
		injected   bool
		insert     []byte // parts[1]
		tailAt     int    // where parts[2] starts in the body; -1 = no tail
	}{
		{"not a stream", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, false, nil, -1},
		{"asked for usage", msgs + `,"stream_options":{"include_usage":true}}`, false, nil, -1},
		{"no stream_options", msgs + "}\n", true, usageOption, -1},
		{"other stream options", msgs + `,"stream_options":{"continuous_usage_stats":false}}`, true, usageMember,
			len(msgs + `,"stream_options":{"continuous_usage_stats":false`)},
		{"empty stream_options", msgs + `,"stream_options":{}}`, true, usageMemberAlone, len(msgs + `,"stream_options":{`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			orig := slices.Clone(body)
			req, err := oai.ParseRequest(oai.SchemaChat, body)
			if err != nil {
				t.Fatal(err)
			}
			out := gw.outgoing(opNamed(t, "chat"), &inbound{set: gw.set.Load(), body: body, req: req}, false)
			if out.injected != tc.injected {
				t.Errorf("injected = %v, want %v", out.injected, tc.injected)
			}
			if len(out.parts[0]) == 0 || &out.parts[0][0] != &body[0] {
				t.Error("parts[0] does not alias the client's body")
			}
			if !tc.injected && (len(out.parts[0]) != len(body) || out.parts[1] != nil || out.parts[2] != nil) {
				t.Errorf("unchanged body split into %d+%d+%d bytes, want the whole body in parts[0]", len(out.parts[0]), len(out.parts[1]), len(out.parts[2]))
			}
			if tc.injected && !bytes.Equal(out.parts[1], tc.insert) {
				t.Errorf("inserted %q, want %q", out.parts[1], tc.insert)
			}
			if tc.tailAt >= 0 {
				if len(out.parts[0]) != tc.tailAt || len(out.parts[2]) == 0 || &out.parts[2][0] != &body[tc.tailAt] {
					t.Errorf("parts[0] is %d bytes and parts[2] does not alias body[%d:]", len(out.parts[0]), tc.tailAt)
				}
			}
			first, _ := io.ReadAll(out.reader())
			second, _ := io.ReadAll(out.reader())
			if int64(len(first)) != out.n || !bytes.Equal(first, second) {
				t.Errorf("reader gave %d then %d bytes (equal %v), n = %d", len(first), len(second), bytes.Equal(first, second), out.n)
			}
			if !bytes.Equal(body, orig) {
				t.Errorf("outgoing changed the client's body to %q", body)
			}
		})
	}
}

// TestCredentialsNeverReachEngine proves that none of the client's
// credentials (the built-in list, and a header named in
// Config.StripRequestHeaders in lower case) reach an engine, whatever the
// case the client wrote them in; the engine gets its own configured key
// when it has one, and unrelated end-to-end headers still pass.
func TestCredentialsNeverReachEngine(t *testing.T) {
	var rec recorder
	handler := func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"r1","object":"chat.completion","choices":[]}`)
	}
	keyed := fakeEngine(t, []string{"keyed"}, handler)
	open := fakeEngine(t, []string{"open"}, handler)
	cfg := testConfig(
		fleet.EngineConfig{Name: "keyed", URL: keyed.URL, APIKey: "engine-key"},
		fleet.EngineConfig{Name: "open", URL: open.URL},
	)
	cfg.StripRequestHeaders = []string{"x-tenant-secret"}
	h := newHarness(t, cfg)
	// Keys as the client writes them on the wire (net/http's client keeps
	// a non-canonical key as it is).
	secrets := map[string][]string{
		"authorization":       {"Bearer SECRET-client-key"},
		"PROXY-AUTHORIZATION": {"Basic SECRET-proxy"},
		"Cookie":              {"session=SECRET-1", "other=SECRET-2"},
		"x-api-key":           {"SECRET-x-api-key"},
		"Api-Key":             {"SECRET-api-key"},
		"openai-organization": {"SECRET-org"},
		"OpenAI-Project":      {"SECRET-project"},
		"X-TENANT-SECRET":     {"SECRET-tenant"},
	}
	for _, tc := range []struct{ model, wantAuth string }{{"keyed", "Bearer engine-key"}, {"open", ""}} {
		t.Run(tc.model, func(t *testing.T) {
			body := `{"model":"` + tc.model + `","messages":[{"role":"user","content":"hi"}]}`
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Custom", "kept")
			for k, v := range secrets {
				req.Header[k] = v
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := rec.last()
			for k, vv := range got.Header {
				for _, v := range vv {
					if strings.Contains(v, "SECRET") {
						t.Errorf("engine saw a client credential: %s: %q", k, v)
					}
				}
			}
			for _, k := range []string{"Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key", "Openai-Organization", "Openai-Project", "X-Tenant-Secret"} {
				if v, ok := got.Header[k]; ok {
					t.Errorf("engine saw %s: %q", k, v)
				}
			}
			var wantAuth []string
			if tc.wantAuth != "" {
				wantAuth = []string{tc.wantAuth}
			}
			if a := got.Header.Values("Authorization"); !slices.Equal(a, wantAuth) {
				t.Errorf("engine saw Authorization %q, want %q", a, wantAuth)
			}
			if v := got.Header.Get("X-Custom"); v != "kept" {
				t.Errorf("X-Custom = %q, want kept", v)
			}
		})
	}
	h.waitIdle()
}

// TestForwardedHeaders proves the Envoy/Caddy forwarding rules: a peer
// that is not a trusted proxy cannot forge its origin (its X-Forwarded-*,
// Forwarded and X-Real-Ip are replaced or dropped; X-Forwarded-For is the
// peer alone); a trusted proxy (by address or CIDR) has its
// X-Forwarded-For lines joined in order and extended with the peer, and its
// proto and host kept. A trusted_proxies entry that is not an address or
// CIDR makes New fail naming it.
func TestForwardedHeaders(t *testing.T) {
	forged := [][2]string{
		{"X-Forwarded-For", "1.2.3.4"},
		{"X-Forwarded-Proto", "https"},
		{"X-Forwarded-Host", "evil.example"},
		{"Forwarded", "for=5.6.7.8;proto=https"},
		{"X-Real-Ip", "5.6.7.8"},
	}
	multi := [][2]string{
		{"X-Forwarded-For", "1.2.3.4"},
		{"X-Forwarded-For", "5.6.7.8, 9.9.9.9"},
	}
	const gwHost = "" // replaced by the gateway's host:port
	tests := []struct {
		name    string
		trusted []string
		send    [][2]string
		xff     []string
		proto   string
		host    string   // gwHost = the gateway's own host
		kept    []string // Forwarded, X-Real-Ip as the engine sees them ("" = absent)
	}{
		{"untrusted peer", nil, forged, []string{"127.0.0.1"}, "http", gwHost, []string{"", ""}},
		{"peer outside the trusted proxies", []string{"10.0.0.0/8", "192.0.2.7"}, forged, []string{"127.0.0.1"}, "http", gwHost, []string{"", ""}},
		{"untrusted peer, several lines", nil, multi, []string{"127.0.0.1"}, "http", gwHost, []string{"", ""}},
		{"trusted address", []string{"127.0.0.1"}, forged, []string{"1.2.3.4, 127.0.0.1"}, "https", "evil.example", []string{"for=5.6.7.8;proto=https", "5.6.7.8"}},
		{"trusted CIDR", []string{"127.0.0.0/8"}, forged, []string{"1.2.3.4, 127.0.0.1"}, "https", "evil.example", []string{"for=5.6.7.8;proto=https", "5.6.7.8"}},
		{"trusted, nothing forwarded", []string{"127.0.0.1"}, nil, []string{"127.0.0.1"}, "http", gwHost, []string{"", ""}},
		{"trusted, several lines joined in order", []string{"127.0.0.0/8"}, multi, []string{"1.2.3.4, 5.6.7.8, 9.9.9.9, 127.0.0.1"}, "http", gwHost, []string{"", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rec recorder
			eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
				rec.add(r)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{}`)
			})
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL, Models: []string{"m"}})
			cfg.TrustedProxies = tc.trusted
			h := newHarness(t, cfg)
			req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Content-Type", "application/json")
			for _, kv := range tc.send {
				req.Header.Add(kv[0], kv[1])
			}
			resp, err := h.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := rec.last().Header
			if v := got.Values("X-Forwarded-For"); !slices.Equal(v, tc.xff) {
				t.Errorf("X-Forwarded-For %q, want %q", v, tc.xff)
			}
			if v := got.Values("X-Forwarded-Proto"); !slices.Equal(v, []string{tc.proto}) {
				t.Errorf("X-Forwarded-Proto %q, want %q", v, tc.proto)
			}
			host := tc.host
			if host == gwHost {
				host = h.srv.Listener.Addr().String()
			}
			if v := got.Values("X-Forwarded-Host"); !slices.Equal(v, []string{host}) {
				t.Errorf("X-Forwarded-Host %q, want %q", v, host)
			}
			for i, k := range []string{"Forwarded", "X-Real-Ip"} {
				var want []string
				if tc.kept[i] != "" {
					want = []string{tc.kept[i]}
				}
				if v := got.Values(k); !slices.Equal(v, want) {
					t.Errorf("%s %q, want %q", k, v, want)
				}
			}
			h.waitIdle()
		})
	}

	t.Run("config", func(t *testing.T) {
		m, _ := telemetry.NewMetrics(nil)
		for _, bad := range []string{"nope", "10.0.0.0/33", "1.2.3.4.5", "example.com"} {
			cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
			cfg.TrustedProxies = []string{"127.0.0.1", bad}
			gw, err := New(cfg, routing.NewRoundRobin(), m)
			if err == nil {
				_ = gw.Close()
				t.Errorf("trusted_proxies %q accepted", bad)
				continue
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), strconv.Quote(bad)) || !strings.Contains(err.Error(), "trusted_proxies") {
				t.Errorf("trusted_proxies %q: %v, want an ErrInvalidConfig naming the key and the entry", bad, err)
			}
		}
		cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
		cfg.TrustedProxies = []string{" 10.1.2.3 ", "::1", "fd00::/8"}
		gw, err := New(cfg, routing.NewRoundRobin(), m)
		if err != nil {
			t.Fatalf("valid trusted_proxies rejected: %v", err)
		}
		_ = gw.Close()
	})
}

// TestEngineIdentityHidden proves that the engine's software never shows
// through the gateway: the simulator's "Server: uvicorn" and, with the
// powered-by fault, "X-Powered-By: enginesim" reach no client, on a 200
// stream, a 200 JSON body, a JSON error and a non-JSON error, and the
// engine's echo of X-Request-Id does not duplicate the gateway's.
func TestEngineIdentityHidden(t *testing.T) {
	_, simSrv := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: simSrv.URL, Models: []string{"m"}}))
	const chat = `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	const stream = `{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`

	// The premise: the engine itself does identify itself.
	req, _ := http.NewRequest(http.MethodPost, simSrv.URL+"/v1/chat/completions", strings.NewReader(chat))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(enginesim.FaultHeader, "powered-by")
	req.Header.Set("X-Request-Id", "direct")
	resp, err := simSrv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Server") != "uvicorn" || resp.Header.Get("X-Powered-By") != "enginesim" || resp.Header.Get("X-Request-Id") != "direct" {
		t.Fatalf("the simulator sent Server %q X-Powered-By %q X-Request-Id %q; the test needs uvicorn, enginesim, direct",
			resp.Header.Get("Server"), resp.Header.Get("X-Powered-By"), resp.Header.Get("X-Request-Id"))
	}

	for _, tc := range []struct {
		name, body, fault string
		status            int
		ct                string
	}{
		{"stream", stream, "powered-by", 200, "text/event-stream"},
		{"json", chat, "powered-by", 200, "application/json"},
		{"json error", chat, "powered-by,status=400", 400, "application/json"},
		{"html error", chat, "powered-by,status=502,error-body=html", 502, "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "hostile-" + strings.ReplaceAll(tc.name, " ", "-")
			resp := h.post("/v1/chat/completions", tc.body, enginesim.FaultHeader, tc.fault, "X-Request-Id", id)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.ct) {
				t.Fatalf("status %d Content-Type %q, want %d %s: %q", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, tc.ct, b)
			}
			for _, k := range []string{"Server", "X-Powered-By"} {
				if v, ok := resp.Header[k]; ok {
					t.Errorf("client got %s: %q", k, v)
				}
			}
			if v := resp.Header.Values("X-Request-Id"); !slices.Equal(v, []string{id}) {
				t.Errorf("client got X-Request-Id %q, want exactly [%s]", v, id)
			}
			for _, leak := range []string{"uvicorn", enginesim.InternalPath} {
				if strings.Contains(string(b), leak) {
					t.Errorf("body shows %q: %q", leak, b)
				}
			}
		})
	}
	h.waitIdle()
}

// TestEngineURLUserinfoRedacted proves that credentials in an engine URL
// are used and never shown: the engine gets them as Authorization: Basic on
// proxied requests, health probes and model discovery (replacing the
// client's Authorization, with the plain host:port as Host); /admin/engines,
// Pool.String and the logs show the URL with its userinfo as xxxxx and
// neither user name nor password, also for an engine whose probes fail; and
// config errors about a bad URL with credentials do not echo the password.
func TestEngineURLUserinfoRedacted(t *testing.T) {
	type seen struct{ path, auth, host string }
	var mu sync.Mutex
	var got []seen
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, seen{r.URL.Path, r.Header.Get("Authorization"), r.Host})
		mu.Unlock()
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"r1","object":"chat.completion","choices":[]}`)
		}
	})
	engSrv := httptest.NewServer(mux)
	t.Cleanup(func() {
		engSrv.CloseClientConnections()
		engSrv.Close()
	})
	addr := engSrv.Listener.Addr().String()
	// A port nothing listens on: that engine's probes fail and its error is
	// shown as last_error.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := l.Addr().String()
	_ = l.Close()

	var logs testutil.LockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHarnessWith(t, testConfig(
		fleet.EngineConfig{Name: "e1", URL: "http://user:s3cret@" + addr},
		fleet.EngineConfig{Name: "dead", URL: "http://deaduser:d3adpw@" + deadAddr + "/base", Models: []string{"other"}},
	), []Option{WithLogger(logger)})
	admin := hostileAdminServer(t, h)

	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer client-key")
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	h.gw.Fleet().ProbeNow(context.Background())
	h.waitIdle()

	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("user:s3cret"))
	counts := map[string]int{}
	mu.Lock()
	for _, s := range got {
		counts[s.path]++
		if s.auth != wantAuth {
			t.Errorf("engine got %s with Authorization %q, want %q", s.path, s.auth, wantAuth)
		}
		if s.host != addr {
			t.Errorf("engine got %s with Host %q, want %q", s.path, s.host, addr)
		}
	}
	mu.Unlock()
	if counts["/health"] < 2 || counts["/v1/models"] < 1 || counts["/v1/chat/completions"] != 1 {
		t.Errorf("engine requests by path %v, want >= 2 /health, >= 1 /v1/models, 1 /v1/chat/completions", counts)
	}

	secrets := []string{"user", "s3cret", "d3adpw"}
	a := admin()
	urls := map[string]string{}
	for _, e := range a.Engines {
		urls[e.Name] = e.URL
	}
	if urls["e1"] != "http://xxxxx@"+addr || urls["dead"] != "http://xxxxx@"+deadAddr+"/base" {
		t.Errorf("/admin/engines URLs %v, want userinfo shown as xxxxx", urls)
	}
	var dead fleet.EngineStatus
	for _, e := range a.Engines {
		if e.Name == "dead" {
			dead = e
		}
	}
	if dead.Healthy || dead.LastError == "" {
		t.Errorf("the dead engine: healthy %v, last_error %q; want an unhealthy engine with its error", dead.Healthy, dead.LastError)
	}
	pool := h.gw.Fleet().String()
	if !strings.Contains(pool, "http://xxxxx@"+addr) {
		t.Errorf("Pool.String() = %q, want the redacted URL", pool)
	}
	for _, where := range []struct{ name, text string }{{"/admin/engines", string(a.raw)}, {"Pool.String()", pool}, {"the logs", logs.String()}} {
		for _, s := range secrets {
			if strings.Contains(where.text, s) {
				t.Errorf("%s shows %q: %s", where.name, s, where.text)
			}
		}
	}

	t.Run("config errors", func(t *testing.T) {
		m, _ := telemetry.NewMetrics(nil)
		for _, u := range []string{
			"http://user:s3cret@host:badport",
			"http://user:s3cret@host:badport/v1",
			"http://user:s3cret@[::1",
			"http://user:s3cret@host/\x7f",
			"ftp://user:s3cret@host",
			"http://user:s3cret@",
		} {
			ec := fleet.EngineConfig{Name: "e", URL: u}
			err := ec.Validate()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%q: Validate() = %v, want ErrInvalidConfig", u, err)
				continue
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%q: Validate() echoes the password: %v", u, err)
			}
			gw, err := New(testConfig(ec), routing.NewRoundRobin(), m)
			if err == nil {
				_ = gw.Close()
				t.Errorf("%q: New accepted it", u)
			} else if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%q: New echoes the password: %v", u, err)
			}
		}
	})
}

// TestEarlyAnswerLingers: a body answered before it was read (here 413 for
// a declared length over the limit) is drained after the answer, so the
// connection closes cleanly (FIN) and a client that reads late still gets
// the answer. Closed with the client's bytes unread, the connection sends
// a TCP reset, which destroys an answer the client has not read yet:
// under load, clients got "write: broken pipe" instead of the 413. The
// client here reads after net/http's 500 ms reset-avoidance delay (the
// time it waits between half-closing and closing), the delay being the
// fault itself.
func TestEarlyAnswerLingers(t *testing.T) {
	const limit = 4 << 10
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: []string{"m"}})
	cfg.MaxBodyBytes = limit
	h := newHarness(t, cfg)
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	body := hostileChatBody("m", 64<<10) // 16 x the limit, well under net/http's 256 KiB drain
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond) // the slow client: past the 500 ms delay
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v (a reset destroyed it)", err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Fatalf("status %d, close %v; want 413 and Connection: close", resp.StatusCode, resp.Close)
	}
	if n, err := io.Copy(io.Discard, br); err != nil || n != 0 {
		t.Fatalf("after the answer: read %d bytes, err %v; want a clean close (EOF)", n, err)
	}
}
