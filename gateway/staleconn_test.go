package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// closingEngine is a raw HTTP/1.1 engine on a loopback listener. Each
// connection serves its first request; a connection's second request is
// read in full and the connection closed unanswered when closeSecond is
// set (the FIN of an engine closing an idle kept-alive connection crossing
// the gateway's next request on it: the keep-alive race), or when
// closeFirst is set its first request already. It records every request
// it read as raw bytes, and which connection read it.
type closingEngine struct {
	ln          net.Listener
	closeFirst  bool
	closeSecond bool
	// closeAll, once set, closes every request's connection unanswered,
	// after reading it; hold, while open, keeps answers waiting (so
	// concurrent requests open connections of their own).
	closeAll atomic.Bool
	hold     chan struct{}

	mu    sync.Mutex
	reqs  []string // each request as it came off the wire
	conns []int    // the connection number of each
	wg    sync.WaitGroup
}

func newClosingEngine(t *testing.T, closeFirst, closeSecond bool) *closingEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &closingEngine{ln: ln, closeFirst: closeFirst, closeSecond: closeSecond}
	e.wg.Add(1)
	go e.accept()
	t.Cleanup(func() {
		ln.Close()
		e.wg.Wait()
	})
	return e
}

func (e *closingEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *closingEngine) accept() {
	defer e.wg.Done()
	for n := 1; ; n++ {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.wg.Add(1)
		go e.serve(c, n)
	}
}

func (e *closingEngine) serve(c net.Conn, n int) {
	defer e.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 1; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		raw, _ := httputil.DumpRequest(req, true)
		e.mu.Lock()
		e.reqs = append(e.reqs, string(raw))
		e.conns = append(e.conns, n)
		e.mu.Unlock()
		if (i == 1 && e.closeFirst) || (i == 2 && e.closeSecond) || e.closeAll.Load() {
			return
		}
		if e.hold != nil {
			<-e.hold
		}
		body := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}`
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
}

// seen returns the requests read so far and their connection numbers.
func (e *closingEngine) seen() ([]string, []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.reqs...), append([]int(nil), e.conns...)
}

const embedBody = `{"model":"m","input":"hi"}`

// staleConnHarness is a gateway with no retries at all in front of e, so
// whatever is sent again is net/http's replay, not the retry machinery.
func staleConnHarness(t *testing.T, e *closingEngine) *harness {
	t.Helper()
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: e.url(), Models: []string{"m"}})
	cfg.Retry.On = nil
	cfg.MaxAttempts = 1
	cfg.Outlier.Enabled = false
	return newHarness(t, cfg, withoutStart())
}

// TestStaleKeepAliveConnectionReplayed: a request on a kept-alive engine
// connection that the engine closes before answering a byte (the
// keep-alive race) is sent again on a new connection inside the same
// attempt, even with retries off: the client gets the engine's 200, one
// attempt is counted, no retry, and the gauges return to 0.
func TestStaleKeepAliveConnectionReplayed(t *testing.T) {
	e := newClosingEngine(t, false, true)
	h := staleConnHarness(t, e)
	for i := range 2 {
		resp := h.post("/v1/embeddings", embedBody)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"embedding":[0.5]`) {
			t.Fatalf("request %d: status %d, body %s; want the engine's 200", i+1, resp.StatusCode, b)
		}
	}
	reqs, conns := e.seen()
	if want := []int{1, 1, 2}; fmt.Sprint(conns) != fmt.Sprint(want) {
		t.Fatalf("the engine read requests on connections %v, want %v (the second sent again on a new connection)", conns, want)
	}
	if reqs[1] != reqs[2] {
		t.Errorf("the replayed request differs from the one the closed connection read:\n%s\n---\n%s", reqs[1], reqs[2])
	}
	for i, r := range reqs {
		if strings.Contains(strings.ToLower(r), "idempotency-key") {
			t.Errorf("request %d on the wire has an Idempotency-Key the client did not send:\n%s", i+1, r)
		}
	}
	if got := h.errorTypes(); got[""] != 2 || len(got) != 1 {
		t.Errorf("engine request outcomes by error.type %v, want 2 successes and nothing else", got)
	}
	if n := h.counter(telemetry.RetriesName); n != 0 {
		t.Errorf("%s = %d, want 0: the replay is not a retry", telemetry.RetriesName, n)
	}
	h.waitIdle()
}

// TestFreshConnectionCloseNotReplayed: an engine that reads a request on a
// new connection and closes it unanswered did get the request; that is
// its failure (502 engine_disconnect, the "reset" condition when retries
// allow it), never sent again by the transport.
func TestFreshConnectionCloseNotReplayed(t *testing.T) {
	e := newClosingEngine(t, true, false)
	h := staleConnHarness(t, e)
	resp := h.post("/v1/embeddings", embedBody)
	ae := decodeErr(t, resp)
	if resp.StatusCode != http.StatusBadGateway || ae.code() != ErrTypeEngineDisconnect {
		t.Fatalf("status %d code %q, want 502 %s", resp.StatusCode, ae.code(), ErrTypeEngineDisconnect)
	}
	if reqs, _ := e.seen(); len(reqs) != 1 {
		t.Errorf("the engine read the request %d times, want once", len(reqs))
	}
	h.waitIdle()
}

// TestClientIdempotencyKeyForwarded: a client's Idempotency-Key (and
// X-Idempotency-Key) reaches the engine with its value.
func TestClientIdempotencyKeyForwarded(t *testing.T) {
	for _, k := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		t.Run(k, func(t *testing.T) {
			e := newClosingEngine(t, false, false)
			h := staleConnHarness(t, e)
			resp := h.post("/v1/embeddings", embedBody, k, "key-abc")
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			reqs, _ := e.seen()
			if resp.StatusCode != http.StatusOK || len(reqs) != 1 || !strings.Contains(reqs[0], "\r\n"+k+": key-abc\r\n") {
				t.Fatalf("status %d; the engine read %q; want one request with %s: key-abc", resp.StatusCode, reqs, k)
			}
		})
	}
}

// TestReplayCappedAtOne: an engine that reads a request and closes the
// connection unanswered (a close before headers, an engine that dies on
// that request) gets it at most twice per attempt (the request and one
// re-send on another connection), however many idle connections to it the
// pool holds: net/http alone would send it through every one of them.
func TestReplayCappedAtOne(t *testing.T) {
	const idle = 6
	e := newClosingEngine(t, false, false)
	e.hold = make(chan struct{})
	h := staleConnHarness(t, e)
	// idle concurrent requests, held by the engine until all arrived, so
	// each has a connection of its own; answered, they stay in the pool.
	var wg sync.WaitGroup
	for range idle {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := h.post("/v1/embeddings", embedBody)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	testutil.Eventually(t, 5*time.Second, func() bool { reqs, _ := e.seen(); return len(reqs) == idle }, "the warm-up requests to arrive")
	close(e.hold)
	wg.Wait()
	_, conns := e.seen()
	if n := len(slices.Compact(slices.Sorted(slices.Values(conns)))); n != idle {
		t.Fatalf("warm-up used %d connections, want %d", n, idle)
	}
	e.closeAll.Store(true)
	resp := h.post("/v1/embeddings", embedBody)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502", resp.StatusCode)
	}
	reqs, _ := e.seen()
	if got := len(reqs) - idle; got != 1+maxReplays {
		t.Errorf("the engine read the failing request %d times, want %d (once, and one re-send)", got, 1+maxReplays)
	}
	h.waitIdle()
	if et := h.errorTypes(); et[ErrTypeEngineDisconnect] != 1 {
		t.Errorf("error types %v, want one engine_disconnect", et)
	}
}
