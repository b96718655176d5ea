package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// TestCaseL01FailedRequestsReleaseFromPrefill: 1,000 requests (half
// streaming) that fail before their first token (engine 500, connection
// closed before headers, connection refused) leave both gauges at 0, are
// released from prefill, are recorded with their error type, and leave no
// per-request state; successes afterwards are routed normally.
func TestCaseL01FailedRequestsReleaseFromPrefill(t *testing.T) {
	engA, sA := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Nanosecond, ITL: time.Nanosecond})
	deadURL := testutil.RefusedURL
	cfg := testConfig(fleet.EngineConfig{Name: "A", URL: sA.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "dead", URL: deadURL, Models: []string{"gone"}})
	cfg.MaxAttempts = 1
	h := newHarness(t, cfg, withoutStart())
	var mu sync.Mutex
	released := map[routing.Phase]int{}
	h.gw.onRelease = func(_ string, p routing.Phase) {
		mu.Lock()
		released[p]++
		mu.Unlock()
	}
	faults := []string{"status=500", "close-before-headers"}
	const n = 1000
	const refused = 100 // sent one at a time: each refusal takes the engine out of routing
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	send := func(i int, model, fault string) {
		resp := h.post("/v1/chat/completions", fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":"x"}]}`, model, i%2 == 0), enginesim.FaultHeader, fault)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for i := range n - refused {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			send(i, "m", faults[(i/2)%2])
		}()
	}
	wg.Wait()
	for i := range refused {
		// The engine died after its last probe: it stays in routing (the
		// last ready engine of its model is neither probed early nor
		// ejected).
		send(i, "gone", "")
	}
	h.waitIdle()
	mu.Lock()
	if released[routing.PhaseDecode] != 0 || released[routing.PhasePrefill] == 0 {
		t.Errorf("released %v, want every failure released from prefill", released)
	}
	mu.Unlock()
	et := h.errorTypes()
	var total uint64
	for _, c := range et {
		total += c
	}
	if total != n || et[""] != 0 || et["500"] == 0 || et[ErrTypeEngineDisconnect] == 0 || et[ErrTypeConnect] == 0 {
		t.Errorf("error types %v (total %d), want %d failures split over 500, engine_disconnect, connect_error", et, total, n)
	}
	// Engine A is not left looking busy: least-loaded would still pick it.
	for range 200 {
		resp := h.post("/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("success after failures: status %d", resp.StatusCode)
		}
	}
	h.waitIdle()
	if got := engA.Stats().Completed; got != 200 {
		t.Errorf("engine A completed %d, want 200", got)
	}
}

// TestCaseL02DisconnectsBeforeHeadersRelease: clients that hang up while the
// engine has not sent headers release their slot within about 1 s each; a
// health probe succeeding meanwhile never resets the gauges; least-loaded
// keeps spreading afterwards.
func TestCaseL02DisconnectsBeforeHeadersRelease(t *testing.T) {
	engB, sB := sim(t, enginesim.Config{Models: []string{"b-only", "m"}})
	// B is the only engine for "b-only": every request waits on B. Both
	// serve "m", for the spreading check afterwards.
	_, sC := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: time.Nanosecond, ITL: time.Nanosecond})
	cfg := testConfig(fleet.EngineConfig{Name: "B", URL: sB.URL, Models: []string{"b-only", "m"}}, fleet.EngineConfig{Name: "C", URL: sC.URL, Models: []string{"m"}})
	h := newHarness(t, cfg, withPolicy(routing.NewLeastLoaded(2)))
	const n = 50
	var wg sync.WaitGroup
	// The clients hang up when the test says so, after the probe check:
	// a timeout of their own could expire while a slow machine probes.
	hangUp, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(hangUp, http.MethodPost, h.srv.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"b-only","stream":true,"messages":[{"role":"user","content":"x"}]}`))
			req.Header.Set(enginesim.FaultHeader, "stall-before-headers")
			resp, err := h.client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	// While all 50 wait on B's headers: the gauge says 50, and a
	// successful health probe leaves it alone (vllm-project/router #197).
	testutil.Poll(2*time.Second, func() bool { return h.gauges()["B/prefill"] == n })
	if g := h.gauges()["B/prefill"]; g != n {
		t.Fatalf("B prefill gauge %d with %d requests waiting, want %d", g, n, n)
	}
	h.gw.fleet.ProbeNow(context.Background())
	if g := h.gauges()["B/prefill"]; g != n {
		t.Fatalf("after a health probe the B gauge reads %d, want %d", g, n)
	}
	cancel()
	wg.Wait()
	released := time.Now()
	testutil.Poll(time.Second, func() bool { return h.gw.LiveAttempts() == 0 })
	if d := time.Since(released); d >= time.Second {
		t.Fatalf("gauges not released within 1 s of the disconnects (%v)", d)
	}
	h.assertIdle()
	waitAborted(t, engB, n)
	if et := h.errorTypes(); et[ErrTypeClientCancelled] != n || len(et) != 1 {
		t.Errorf("error types %v, want %d client_cancelled", et, n)
	}
	// B is not left looking busy: least-loaded still spreads "m" over both
	// (with equal load every pick is a fair coin).
	servedBy := map[string]int{}
	for range 40 {
		resp := h.post("/v1/completions", `{"model":"m","prompt":"a","max_tokens":1}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		servedBy[resp.Header.Get("X-Switchboard-Engine")]++
	}
	if servedBy["B"] < 8 || servedBy["C"] < 8 {
		t.Errorf("least-loaded split %v after the disconnects, want both engines used", servedBy)
	}
}

// TestCaseL03EngineFlap: an engine removed while a stream is in flight and
// re-added under the same name: the old request releases the slot it took,
// the gauge never goes below 0 and ends at 0.
func TestCaseL03EngineFlap(t *testing.T) {
	_, sE := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 5 * time.Millisecond, ITL: 30 * time.Millisecond})
	ecfg := fleet.EngineConfig{Name: "E", URL: sE.URL, Models: []string{"m"}}
	h := newHarness(t, testConfig(ecfg))

	stream := func(tokens int) (func() error, error) {
		resp := h.post("/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"x"}]}`, tokens))
		if resp.StatusCode != 200 {
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		return func() error {
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				err = fmt.Errorf("stream did not complete: %q", tail(string(b)))
			}
			return err
		}, nil
	}
	var negative []string
	check := func(when string) {
		for k, v := range h.gauges() {
			if v < 0 {
				negative = append(negative, when+": "+k)
			}
		}
	}
	finishR1, err := stream(20) // about 600 ms
	if err != nil {
		t.Fatal(err)
	}
	testutil.Poll(2*time.Second, func() bool { return h.gauges()["E/decode"] == 1 })
	check("R1 streaming")
	if !h.gw.Fleet().Remove("E") {
		t.Fatal("Remove(E) = false")
	}
	check("E removed")
	if g := h.gauges()["E/decode"]; g != 1 {
		t.Errorf("removed engine's gauge %d while R1 streams, want 1 (kept until drained)", g)
	}
	if err := h.gw.Fleet().Add(ecfg); err != nil {
		t.Fatal(err)
	}
	finishR2, err := stream(40) // outlives R1
	if err != nil {
		t.Fatal(err)
	}
	testutil.Poll(2*time.Second, func() bool { return h.gauges()["E/decode"] == 2 })
	if g := h.gauges()["E/decode"]; g != 2 {
		t.Errorf("E decode gauge %d with R1 (old incarnation) and R2 (new) streaming, want 2", g)
	}
	if err := finishR1(); err != nil {
		t.Fatal(err)
	}
	check("R1 done")
	if g := h.gauges()["E/decode"]; g != 1 {
		t.Errorf("after R1 ends E decode gauge %d, want 1 (R2)", g)
	}
	if err := finishR2(); err != nil {
		t.Fatal(err)
	}
	h.waitIdle()
	if len(negative) > 0 {
		t.Errorf("gauge below zero: %v", negative)
	}
	// Removed for good: the series drains to 0, then is deleted.
	h.gw.Fleet().Remove("E")
	if g, ok := h.gauges()["E/decode"]; !ok || g != 0 {
		t.Errorf("E/decode after final removal = %d (present %v), want a last 0", g, ok)
	}
	if _, ok := h.gauges()["E/decode"]; ok {
		t.Errorf("E series still reported after it drained and was removed")
	}
}

// TestRetryOnConnectFailure: a connection refused by the picked engine fails
// over to another before anything is sent; every attempt's slot is
// released once, and the failed engine leaves routing (outlier detection
// set to eject at the first connect failure; TestOutlierEjectsAfterStreak
// has the default streak).
func TestRetryOnConnectFailure(t *testing.T) {
	live, sLive := sim(t, enginesim.Config{Models: []string{"m"}})
	deadURL := testutil.RefusedURL
	cfg := testConfig(fleet.EngineConfig{Name: "dead", URL: deadURL, Models: []string{"m"}}, fleet.EngineConfig{Name: "live", URL: sLive.URL, Models: []string{"m"}})
	cfg.Outlier.ConsecutiveConnectFailures = 1
	h := newHarness(t, cfg, withoutStart()) // no probe: "dead" starts healthy
	var mu sync.Mutex
	released := map[string]int{}
	h.gw.onRelease = func(e string, _ routing.Phase) {
		mu.Lock()
		released[e]++
		mu.Unlock()
	}
	for i := range 4 {
		resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchboard-Engine") != "live" || !strings.HasSuffix(string(b), "[DONE]\n\n") {
			t.Fatalf("request %d: status %d engine %q", i, resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"))
		}
	}
	h.waitIdle()
	if released["dead"] != 1 || released["live"] != 4 {
		t.Errorf("releases %v, want dead:1 live:4", released)
	}
	if et := h.errorTypes(); et[ErrTypeConnect] != 1 || et[""] != 4 {
		t.Errorf("error types %v, want 1 connect_error and 4 successes", et)
	}
	if live.Stats().Completed != 4 {
		t.Errorf("live completed %d, want 4", live.Stats().Completed)
	}
}

// TestCaseL07SplitEventsByteIdentical: events split inside the JSON, between
// the two newlines, in one write, inside a UTF-8 character, or with CRLF
// reach the client byte-identical, with no injected error and a correct
// TTFT.
func TestCaseL07SplitEventsByteIdentical(t *testing.T) {
	const ev = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello ✓\"}}]}\n\n"
	variants := map[string][]string{
		"split inside json":   {ev[:30], ev[30:]},
		"split between \\n":   {ev[:len(ev)-1], ev[len(ev)-1:]},
		"two events one read": {ev + ev},
		"utf-8 split":         {ev[:strings.Index(ev, "✓")+1], ev[strings.Index(ev, "✓")+1:]},
		"crlf":                {strings.ReplaceAll(ev, "\n", "\r\n")[:40], strings.ReplaceAll(ev, "\n", "\r\n")[40:]},
	}
	for name, writes := range variants {
		t.Run(name, func(t *testing.T) {
			want := strings.Join(writes, "") + "data: [DONE]\n\n"
			eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
				s := newSSE(w)
				for _, part := range writes {
					s.raw(part)
					time.Sleep(50 * time.Millisecond)
				}
				s.raw("data: [DONE]\n\n")
			})
			h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
			resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(b) != want {
				t.Fatalf("client got %q (err %v), want %q", b, err, want)
			}
			h.waitIdle()
			if n := h.histCount(telemetry.TimeToFirstTokenName); n != 1 {
				t.Errorf("TTFT samples %d, want 1", n)
			}
			if n := h.counter(telemetry.ParseErrorsName); n != 0 {
				t.Errorf("parse errors %d, want 0", n)
			}
		})
	}
}

// TestCaseL08KeepAliveComments: comments are forwarded as comments, never
// wrapped as data; event:/id:/retry: lines and multi-line data pass as sent;
// comments never start TTFT.
func TestCaseL08KeepAliveComments(t *testing.T) {
	const content = `{"id":"c1","choices":[{"index":0,"delta":{"content":"A"}}]}`
	stream := ": keep-alive\n\n" + ": keep-alive\n\n" + ": keep-alive\n\n" +
		"event: message\nid: 7\nretry: 100\ndata: " + content + "\n\n" +
		"data:" + content + "\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\n" + "data: \"delta\":{\"content\":\"B\"}}]}\n\n" +
		"data: [DONE]\n\n"
	eng := fakeEngine(t, []string{"m"}, func(w http.ResponseWriter, r *http.Request) {
		s := newSSE(w)
		parts := strings.SplitAfter(stream, "\n\n")
		for i, p := range parts {
			s.raw(p)
			if i < 3 {
				time.Sleep(100 * time.Millisecond)
			}
		}
	})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: eng.URL}))
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	br := bufio.NewReader(resp.Body)
	var got strings.Builder
	_, _ = io.Copy(&got, br)
	resp.Body.Close()
	if got.String() != stream {
		t.Fatalf("client got %q, want the engine's bytes %q", got.String(), stream)
	}
	if strings.Contains(got.String(), "data: :") {
		t.Error("a comment was wrapped as data")
	}
	h.waitIdle()
	ttft := h.histSum(telemetry.TimeToFirstTokenName)
	if n := h.histCount(telemetry.TimeToFirstTokenName); n != 1 || ttft < 0.29 {
		t.Errorf("TTFT samples %d sum %.3fs, want 1 sample >= 0.3s (after the keep-alives)", n, ttft)
	}
	// Three content events (one multi-line): two ITL samples.
	if n := h.histCount(telemetry.InterTokenLatencyName); n != 2 {
		t.Errorf("ITL samples %d, want 2", n)
	}
}

// TestCaseL09ClientCancelPropagates: a client that gives up on a
// non-streaming request cancels the engine's generation within 1 s; the
// request is recorded as client_cancelled, not 200 or 5xx, and not retried.
func TestCaseL09ClientCancelPropagates(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			eng, s := sim(t, enginesim.Config{Models: []string{"m"}, TTFT: 10 * time.Millisecond, ITL: 50 * time.Millisecond})
			_, s2 := sim(t, enginesim.Config{Models: []string{"m"}})
			h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s.URL, Models: []string{"m"}}, fleet.EngineConfig{Name: "e2", URL: s2.URL, Models: []string{"other"}}))
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"m","stream":%t,"max_tokens":4000,"messages":[{"role":"user","content":"x"}]}`, stream)))
			resp, err := h.client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			gone := time.Now()
			testutil.Poll(2*time.Second, func() bool { return eng.Stats().Aborted != 0 })
			if d := time.Since(gone); eng.Stats().Aborted != 1 || d > time.Second {
				t.Fatalf("engine aborted %d after %v, want 1 within 1 s", eng.Stats().Aborted, d)
			}
			h.waitIdle()
			if et := h.errorTypes(); et[ErrTypeClientCancelled] != 1 || len(et) != 1 {
				t.Errorf("error types %v, want one client_cancelled", et)
			}
			if eng.Stats().Received != 1 {
				t.Errorf("engine received %d, want 1 (not retried)", eng.Stats().Received)
			}
			if !stream {
				// The client left before any byte: the server span says 499,
				// not 200.
				var status string
				for _, sp := range h.spans.Ended() {
					if sp.SpanKind() == trace.SpanKindServer {
						status = attrValue(sp.Attributes(), "http.response.status_code")
					}
				}
				if status != "499" {
					t.Errorf("server span status %q, want 499", status)
				}
			}
		})
	}
}
