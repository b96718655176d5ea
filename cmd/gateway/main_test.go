package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// gatewayProc is run executing in a goroutine.
type gatewayProc struct {
	public, admin string
	cancel        context.CancelFunc
	done          chan error
	logs          *testutil.LockedBuffer
}

// startRun starts run with args and env and waits until it reports its
// listeners. The test's cleanup stops it if the test has not.
func startRun(t *testing.T, args, env []string) *gatewayProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &gatewayProc{cancel: cancel, done: make(chan error, 1), logs: &testutil.LockedBuffer{}}
	addrs := make(chan [2]string, 1)
	go func() {
		p.done <- run(ctx, args, environ(env...), p.logs, func(public, admin string) { addrs <- [2]string{public, admin} })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			t.Error("run did not return after cancel")
		}
	})
	select {
	case a := <-addrs:
		p.public, p.admin = "http://"+a[0], "http://"+a[1]
	case err := <-p.done:
		p.done <- err // for the cleanup
		t.Fatalf("run returned before it was ready: %v\nlogs:\n%s", err, p.logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("run not ready after 20s; logs:\n%s", p.logs)
	}
	return p
}

// logsWith returns the gateway's logs once they hold every one of want,
// failing the test if they do not within 5 s. Info lines are buffered
// (log.buffer_bytes) up to log.flush_interval; warnings and errors are
// written at once.
func (p *gatewayProc) logsWith(t *testing.T, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		logs := p.logs.String()
		missing := ""
		for _, w := range want {
			if !strings.Contains(logs, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return logs
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs lack %q after 5s:\n%s", missing, logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop cancels run's context and returns run's result, failing the test if
// it does not return within limit.
func (p *gatewayProc) stop(t *testing.T, limit time.Duration) error {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(limit):
		t.Fatalf("run did not return within %s of cancel; logs:\n%s", limit, p.logs)
		return nil
	}
}

// sseEvent is one SSE event as the client saw it.
type sseEvent struct {
	data string
	at   time.Time
}

// readSSE reads data-only SSE events until EOF, timestamping each when its
// terminating blank line arrives. onEvent, if not nil, sees each event as
// soon as it is complete.
func readSSE(r io.Reader, onEvent func(sseEvent)) ([]sseEvent, error) {
	var (
		out  []sseEvent
		data []string
	)
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && line == "" && len(data) == 0 {
				return out, nil
			}
			return out, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if len(data) > 0 {
				ev := sseEvent{data: strings.Join(data, "\n"), at: time.Now()}
				out = append(out, ev)
				if onEvent != nil {
					onEvent(ev)
				}
				data = data[:0]
			}
		case strings.HasPrefix(line, ":"): // comment / keep-alive
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		default:
			return out, errors.New("unexpected SSE line: " + line)
		}
	}
}

// chunk is the part of an OpenAI chat.completion.chunk the tests read.
type chunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// checkStream checks a complete chat completion stream: JSON chunks, the
// content split over at least minContent events, a usage chunk reporting
// wantTokens, and `data: [DONE]` last. It returns the content events.
func checkStream(t *testing.T, evs []sseEvent, minContent, wantTokens int) []sseEvent {
	t.Helper()
	if len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with data: [DONE]: %v", evs)
	}
	var content []sseEvent
	usage := -1
	for _, ev := range evs[:len(evs)-1] {
		var c chunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("event %q: %v", ev.data, err)
		}
		if c.Error != nil {
			t.Fatalf("error event in stream: %s", ev.data)
		}
		if c.Object != "chat.completion.chunk" {
			t.Errorf("object = %q, want chat.completion.chunk", c.Object)
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			content = append(content, ev)
		}
		if c.Usage != nil {
			usage = c.Usage.CompletionTokens
		}
	}
	if len(content) < minContent {
		t.Errorf("%d content events, want >= %d (events merged or lost?)", len(content), minContent)
	}
	if usage != wantTokens {
		t.Errorf("usage.completion_tokens = %d, want %d", usage, wantTokens)
	}
	return content
}

func postChat(t *testing.T, client *http.Client, base string, maxTokens int) *http.Response {
	t.Helper()
	body := `{"model":"demo-model","stream":true,"stream_options":{"include_usage":true},"max_tokens":` +
		strconv.Itoa(maxTokens) +
		`,"messages":[{"role":"user","content":"Say hello"}]}`
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type = %q, want text/event-stream", ct)
	}
	return resp
}

func getJSON(t *testing.T, client *http.Client, url string, into any) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// activeRequests returns switchboard_engine_active_requests by
// "engine/phase".
func activeRequests(mfs map[string]*dto.MetricFamily) map[string]float64 {
	return testutil.Samples(mfs, "switchboard_engine_active_requests", "engine", "phase")
}

// demoArgs run configs/demo.yaml on ephemeral ports.
var demoArgs = []string{"--config", "../../configs/demo.yaml", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}

// TestRunSmoke drives the whole binary path: config file + env, telemetry,
// two simulated engines, the public and admin listeners, and a graceful
// drain when the context is cancelled.
func TestRunSmoke(t *testing.T) {
	testutil.UnsetOTEL(t)
	const (
		itl       = 20 * time.Millisecond
		maxTokens = 8
	)
	p := startRun(t, demoArgs, []string{
		"SWITCHBOARD_SIMULATE__TTFT=20ms",
		"SWITCHBOARD_SIMULATE__ITL=" + itl.String(),
		"SWITCHBOARD_SERVER__SHUTDOWN_TIMEOUT=5s",
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	t.Run("stream", func(t *testing.T) {
		resp := postChat(t, client, p.public, maxTokens)
		defer resp.Body.Close()
		if e := resp.Header.Get("X-Switchboard-Engine"); e != "sim-1" && e != "sim-2" {
			t.Errorf("X-Switchboard-Engine = %q, want sim-1 or sim-2", e)
		}
		evs, err := readSSE(resp.Body, nil)
		if err != nil {
			t.Fatal(err)
		}
		content := checkStream(t, evs, maxTokens, maxTokens)
		// Streamed, not buffered: the events arrived spread over the
		// generation time (maxTokens-1 inter-token gaps), not in one read.
		if len(content) > 0 {
			spread := evs[len(evs)-1].at.Sub(content[0].at)
			if min := (maxTokens - 2) * itl; spread < min {
				t.Errorf("events arrived within %s of each other, want >= %s: the stream was buffered", spread, min)
			}
		}
	})

	t.Run("models", func(t *testing.T) {
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		getJSON(t, client, p.public+"/v1/models", &list)
		var ids []string
		for _, d := range list.Data {
			ids = append(ids, d.ID)
		}
		if list.Object != "list" || !slices.Equal(ids, []string{"demo-model"}) {
			t.Errorf("GET /v1/models = %+v, want object list with [demo-model]", list)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// The client can read [DONE] a moment before the handler's
		// deferred span end releases the slot: poll briefly.
		want := map[string]float64{"sim-1/prefill": 0, "sim-1/decode": 0, "sim-2/prefill": 0, "sim-2/decode": 0}
		var mfs map[string]*dto.MetricFamily
		var got map[string]float64
		if !testutil.Poll(3*time.Second, func() bool {
			mfs = testutil.Scrape(t, client, p.admin+"/metrics")
			got = activeRequests(mfs)
			return mapsEqual(got, want)
		}) {
			t.Fatalf("switchboard_engine_active_requests = %v, want %v", got, want)
		}
		ttft := mfs["switchboard_engine_time_to_first_token_seconds"]
		if ttft.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("switchboard_engine_time_to_first_token_seconds: type %v, want histogram", ttft.GetType())
		}
		var count uint64
		for _, m := range ttft.GetMetric() {
			if testutil.Label(m, "model") != "demo-model" {
				t.Errorf("TTFT series with model %q", testutil.Label(m, "model"))
			}
			count += m.GetHistogram().GetSampleCount()
		}
		if count < 1 {
			t.Errorf("TTFT histogram count = %d, want >= 1", count)
		}
	})

	t.Run("admin engines", func(t *testing.T) {
		var st struct {
			Engines []struct {
				Name    string   `json:"name"`
				Healthy bool     `json:"healthy"`
				Models  []string `json:"models"`
				Prefill int64    `json:"prefill"`
				Decode  int64    `json:"decode"`
			} `json:"engines"`
			LiveAttempts int64 `json:"live_attempts"`
		}
		getJSON(t, client, p.admin+"/admin/engines", &st)
		if len(st.Engines) != 2 {
			t.Fatalf("%d engines, want 2: %+v", len(st.Engines), st)
		}
		for i, e := range st.Engines {
			if wantName := "sim-" + strconv.Itoa(i+1); e.Name != wantName || !e.Healthy || !slices.Equal(e.Models, []string{"demo-model"}) ||
				e.Prefill != 0 || e.Decode != 0 {
				t.Errorf("engine %d = %+v, want %s healthy with [demo-model] and nothing in flight", i, e, wantName)
			}
		}
		if st.LiveAttempts != 0 {
			t.Errorf("live_attempts = %d, want 0", st.LiveAttempts)
		}
	})

	t.Run("graceful drain", func(t *testing.T) {
		// A stream long enough to be cut off if shutdown did not drain it.
		const drainTokens = 20
		resp := postChat(t, client, p.public, drainTokens)
		defer resp.Body.Close()
		first := make(chan struct{})
		var once sync.Once
		type result struct {
			evs []sseEvent
			err error
		}
		got := make(chan result, 1)
		go func() {
			evs, err := readSSE(resp.Body, func(sseEvent) { once.Do(func() { close(first) }) })
			got <- result{evs, err}
		}()
		select {
		case <-first:
		case <-time.After(5 * time.Second):
			t.Fatal("no first event")
		}
		start := time.Now()
		if err := p.stop(t, 5*time.Second+2*time.Second); err != nil {
			t.Errorf("run returned %v after a clean drain, want nil", err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("in-flight stream broken by shutdown: %v", r.err)
		}
		checkStream(t, r.evs, drainTokens, drainTokens)
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Errorf("shutdown took %s, longer than server.shutdown_timeout", elapsed)
		}
		// The listeners are gone.
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(p.public, "http://"), time.Second); err == nil {
			c.Close()
			t.Error("public listener still accepts connections after run returned")
		}
	})

	if n := strings.Count(p.logs.String(), "no OTLP exporter configured"); n != 1 {
		t.Errorf("%d log lines say %q, want exactly 1; logs:\n%s", n, "no OTLP exporter configured", p.logs)
	}
}

func mapsEqual(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRunNoOTLPLogLine checks that, with no OTEL_* variable set, run says
// exactly once that nothing is exported over OTLP.
func TestRunNoOTLPLogLine(t *testing.T) {
	testutil.UnsetOTEL(t)
	p := startRun(t, []string{"--listen", "127.0.0.1:0", "--admin-listen", ""},
		[]string{"SWITCHBOARD_SIMULATE__ENGINES=1", "SWITCHBOARD_LOG__FORMAT=json"})
	if p.admin != "http://" {
		t.Errorf("admin address %q reported with the admin listener disabled", p.admin)
	}
	if err := p.stop(t, 10*time.Second); err != nil {
		t.Fatalf("run: %v", err)
	}
	var lines []string
	for _, l := range strings.Split(p.logs.String(), "\n") {
		if strings.Contains(l, "no OTLP exporter configured") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d lines mention %q, want 1:\n%s", len(lines), "no OTLP exporter configured", p.logs)
	}
	var rec struct {
		Level string `json:"level"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec.Level != "INFO" {
		t.Errorf("line %q: level %q (%v), want a JSON INFO record", lines[0], rec.Level, err)
	}
}

func TestRunErrors(t *testing.T) {
	testutil.UnsetOTEL(t)
	t.Run("config", func(t *testing.T) {
		err := run(context.Background(), []string{"--policy", "nope"}, environ(), io.Discard, func(string, string) {
			t.Error("ready called for an invalid config")
		})
		if err == nil || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("run = %v, want the unknown policy reported", err)
		}
	})
	t.Run("listen address in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		for _, flag := range []string{"--listen", "--admin-listen"} {
			args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", flag, ln.Addr().String()}
			err := run(context.Background(), args, environ("SWITCHBOARD_SIMULATE__ENGINES=1"), io.Discard, func(string, string) {
				t.Errorf("%s: ready called though a listener failed", flag)
			})
			var op *net.OpError
			if !errors.As(err, &op) || op.Op != "listen" {
				t.Errorf("%s in use: run = %v, want a listen error", flag, err)
			}
		}
	})
}

// TestRunDrainDelay: after the signal, /ready answers 503 while requests are
// still served for server.drain_delay; then the listener closes.
func TestRunDrainDelay(t *testing.T) {
	testutil.UnsetOTEL(t)
	p := startRun(t, demoArgs, []string{
		"SWITCHBOARD_SIMULATE__TTFT=1ms",
		"SWITCHBOARD_SIMULATE__ITL=1ms",
		"SWITCHBOARD_SERVER__DRAIN_DELAY=1500ms",
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	status := func(path string) int {
		resp, err := client.Get(p.public + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := status("/ready"); s != http.StatusOK {
		t.Fatalf("/ready before the signal: %d", s)
	}
	done := make(chan error, 1)
	go func() { done <- p.stop(t, 10*time.Second) }()
	testutil.Poll(time.Second, func() bool { return status("/ready") == http.StatusServiceUnavailable })
	if s := status("/ready"); s != http.StatusServiceUnavailable {
		t.Fatalf("/ready during the drain delay: %d, want 503", s)
	}
	resp := postChat(t, client, p.public, 3)
	evs, err := readSSE(resp.Body, nil)
	resp.Body.Close()
	if err != nil || len(evs) == 0 || evs[len(evs)-1].data != "[DONE]" {
		t.Errorf("a request during the drain delay was not served: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("run = %v", err)
	}
	if s := status("/ready"); s != 0 {
		t.Errorf("listener still answering after the drain: %d", s)
	}
}
