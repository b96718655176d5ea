package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// The memory a gateway holds for connections that do nothing: the product
// target is under 64 MiB of heap above the idle gateway for 1,000 of them,
// whether they declared a large body and stalled or are idle keep-alive
// connections. BENCHMARKS.md records the figures.

const (
	heldConns       = 1000
	heldDeclaredLen = 15_000_000 // under MaxBodyBytes (16 MiB), so the request is admitted
	heldHeapTarget  = 64 << 20   // bytes of heap in use above idle, for heldConns connections
)

// heldSmallBody is the tiny request of the idle-keepalive case (and of the
// warm-up): non-streaming, one output token.
const heldSmallBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`

// heldReadMem is readMem (the soak's reading) after the freed pages have
// been returned to the OS (debug.FreeOSMemory), so the RSS figure is the
// memory the process keeps, not what the scavenger has not got round to
// releasing yet (the first case would otherwise inflate the second case's
// baseline).
func heldReadMem() memSample {
	debug.FreeOSMemory()
	return readMem()
}

// heldResult is one measurement of heldConns open connections.
type heldResult struct {
	conns       int // connections established (and, for the declared case, in flight)
	idle, held  memSample
	bufferedEnd int64 // h.gw.buffered.used with the connections open
}

func (r heldResult) delta(f func(memSample) uint64) float64 {
	return float64(int64(f(r.held)) - int64(f(r.idle)))
}

// BenchmarkHeldConnections measures the memory held by 1,000 connections
// that make the gateway wait, above the idle gateway (harness started,
// warmed up by one request):
//
//   - declared-15MB-sent-1B: each connection sends the headers of a chat
//     completion declaring Content-Length: 15000000, then one body byte
//     ("{"), and stalls. All 1,000 requests are in flight, each in readBody
//     with its first body buffer (initialBodyBuf, 16 KiB) reserved; the body
//     read deadline is set to 10 minutes so it does not fire while measuring.
//   - idle-keepalive: each connection completes one small non-streaming chat
//     completion (HTTP/1.1 keep-alive) and then sits idle.
//
// Heap in use (after two forced GCs) and RSS are measured once before the
// connections are opened and once with them open. The process measured also
// holds the client side of every connection (the connections are dialed
// from this process): the figures overstate the gateway's share, which is
// the conservative direction. It fails when the heap in use above idle
// reaches 64 MiB in either case, or when fewer than 1,000 connections were
// established (and, for the declared case, in flight). Run it with:
//
//	go test -run='^$' -bench='^BenchmarkHeldConnections$' -benchtime=1x -benchmem -v ./gateway/
//
// Each case logs a BENCHMARKS.md table row:
//
//	| case | connections | heap in use above idle | heap per connection | RSS above idle | buffered bytes (budget) | goroutines above idle | stacks above idle |
func BenchmarkHeldConnections(b *testing.B) {
	b.Run("declared-15MB-sent-1B", func(b *testing.B) { benchHeld(b, "declared-15MB-sent-1B", openDeclared) })
	b.Run("idle-keepalive", func(b *testing.B) { benchHeld(b, "idle-keepalive", openIdle) })
}

// heldOpener opens heldConns connections to addr and returns them once they
// are in the state to measure; on failure it returns what it opened (to be
// closed) and the reason.
type heldOpener func(b *testing.B, h *harness, addr string) ([]net.Conn, error)

func benchHeld(b *testing.B, name string, open heldOpener) {
	_, esrv := sim(b, enginesim.Config{Name: "e1", Models: []string{"m"},
		TTFT: time.Nanosecond, ITL: time.Nanosecond, OutputTokens: 1})
	cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: esrv.URL, Models: []string{"m"}})
	cfg.BodyReadTimeout = 10 * time.Minute
	// Spans are sampled (a live request holds its server span) but dropped
	// when they end: the span recorder would keep them all.
	h := newHarness(b, cfg, withSpanProcessor(discardSpans{}))
	addr := h.srv.Listener.Addr().String()

	// Warm-up: one request through the whole path, so what the first
	// request initialises once (instruments, pools, the engine transport)
	// is in the idle baseline.
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	if err := heldRoundTrip(c); err != nil {
		c.Close()
		b.Fatalf("warm-up request: %v", err)
	}
	c.Close()

	var res heldResult
	b.ResetTimer()
	for range b.N {
		res = heldOnce(b, h, addr, open)
	}
	b.StopTimer()

	const mib = 1 << 20
	dHeap := res.delta(func(m memSample) uint64 { return m.heapInuse })
	dRSS := res.delta(func(m memSample) uint64 { return m.rss })
	dStack := res.delta(func(m memSample) uint64 { return m.stackInuse })
	dG := res.held.goroutines - res.idle.goroutines
	b.ReportMetric(dHeap/mib, "heap-MiB-above-idle")
	b.ReportMetric(dRSS/mib, "rss-MiB-above-idle")
	b.ReportMetric(dHeap/1024/float64(res.conns), "heap-KiB/conn")
	b.ReportMetric(float64(res.bufferedEnd)/mib, "buffered-MiB")
	b.Logf("idle: heap in use %.2f MiB, RSS %.2f MiB, %d goroutines; with %d connections: heap in use %.2f MiB, RSS %.2f MiB, %d goroutines",
		float64(res.idle.heapInuse)/mib, float64(res.idle.rss)/mib, res.idle.goroutines,
		res.conns, float64(res.held.heapInuse)/mib, float64(res.held.rss)/mib, res.held.goroutines)
	b.Logf("| %s | %d | %.2f MiB | %.1f KiB | %.2f MiB | %.2f MiB | %d | %.2f MiB |",
		name, res.conns, dHeap/mib, dHeap/1024/float64(res.conns), dRSS/mib,
		float64(res.bufferedEnd)/mib, dG, dStack/mib)
	if dHeap >= heldHeapTarget {
		b.Fatalf("%s: heap in use above idle is %.2f MiB for %d connections, target < %d MiB",
			name, dHeap/mib, res.conns, heldHeapTarget/mib)
	}
}

// heldOnce measures the idle gateway, opens the connections, measures
// again, then closes them and waits for every handler to return.
func heldOnce(b *testing.B, h *harness, addr string, open heldOpener) heldResult {
	// The engine connections left by earlier requests are closed before
	// each measurement, so neither counts them.
	h.gw.client.CloseIdleConnections()
	settleGoroutines()
	var res heldResult
	res.idle = heldReadMem()

	conns, err := open(b, h, addr)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for h.gw.InFlight() != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := h.gw.InFlight(); n != 0 {
			b.Errorf("%d requests still in flight 30 s after their connections closed", n)
		}
		// A handler that did not read its whole body leaves its connection
		// goroutine in net/http's closeWriteAndWait for 500 ms (the RST
		// avoidance delay) after it returns: wait for the goroutines to be
		// back to the idle count, so a next iteration's baseline (and
		// goleak) does not see them.
		for runtime.NumGoroutine() > res.idle.goroutines && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		settleGoroutines()
	}()
	for _, c := range conns {
		if c != nil {
			res.conns++
		}
	}
	if err != nil {
		b.Fatalf("%d of %d connections ready: %v", res.conns, heldConns, err)
	}
	if res.conns < heldConns {
		b.Fatalf("%d of %d connections ready", res.conns, heldConns)
	}
	h.gw.client.CloseIdleConnections()
	settleGoroutines()
	res.held = heldReadMem()
	res.bufferedEnd = h.gw.buffered.used.Load()
	return res
}

// openDeclared dials heldConns connections, each sending the headers of a
// chat completion declaring a 15,000,000-byte body and one body byte, and
// waits until the gateway has every request in flight (and, softly, every
// first body buffer reserved).
func openDeclared(b *testing.B, h *harness, addr string) ([]net.Conn, error) {
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(heldDeclaredLen) + "\r\n\r\n{"
	conns := make([]net.Conn, 0, heldConns)
	for range heldConns {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return conns, err
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, head); err != nil {
			return conns, err
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for h.gw.InFlight() != heldConns && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.gw.InFlight(); n != heldConns {
		return conns, fmt.Errorf("%d requests in flight, want %d", n, heldConns)
	}
	// Every handler is admitted; give them the time to reach their first
	// body read (the 16 KiB buffer reserved in the budget).
	for h.gw.buffered.used.Load() < heldConns*initialBodyBuf && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return conns, nil
}

// openIdle dials heldConns connections, 8 at a time, each completing one
// small chat completion with keep-alive, and returns them idle.
func openIdle(b *testing.B, h *harness, addr string) ([]net.Conn, error) {
	conns := make([]net.Conn, heldConns)
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= heldConns {
					return
				}
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err == nil {
					conns[i] = c
					err = heldRoundTrip(c)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("connection %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	// The handlers return just after the response is written.
	deadline := time.Now().Add(10 * time.Second)
	for h.gw.InFlight() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return conns, firstErr
}

// heldRoundTrip sends the small chat completion on c and reads the whole
// response, leaving c open and idle (keep-alive).
func heldRoundTrip(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return err
	}
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(heldSmallBody)) + "\r\n\r\n" + heldSmallBody
	if _, err := io.WriteString(c, req); err != nil {
		return err
	}
	// The reader is dropped after the response: nothing is buffered past
	// its end (the response has a Content-Length and nothing follows).
	br := bufio.NewReaderSize(c, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	if resp.Close {
		return fmt.Errorf("the gateway closes the connection after the response")
	}
	if n := br.Buffered(); n != 0 {
		return fmt.Errorf("%d bytes after the response", n)
	}
	return c.SetDeadline(time.Time{})
}
