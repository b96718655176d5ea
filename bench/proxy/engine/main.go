// Command engine is the fast vLLM-shaped engine of bench/proxy/run.sh: the
// proxies are measured in front of it, so it must cost as little as possible
// per request. Every response body is computed once at start; a request costs
// reading its body, one scan for "stream": true, and the writes.
//
//	POST /v1/chat/completions  a chat.completion of --tokens tokens (with usage and
//	                           Content-Length), or with "stream": true an SSE stream:
//	                           a role chunk, --tokens content chunks, a finish chunk, a
//	                           usage chunk and data: [DONE], each event flushed
//	GET  /v1/models            the model (--model), as vLLM lists it
//	GET  /health               200, empty
//	GET  /metrics              vLLM's scheduler gauges (the gateway scrapes them)
//
// The bodies are recorded once from internal/enginesim at start, so their
// shapes are the simulator's (and vLLM's). Any other request
// gets a 404. It logs one line, msg="bench engine listening" addr=HOST:PORT,
// once it listens (--listen 127.0.0.1:0 picks a free port), and stops on
// SIGTERM or SIGINT.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (host:port; port 0 picks a free one)")
	model := flag.String("model", "bench", "served model name")
	tokens := flag.Int("tokens", 16, "tokens per response")
	flag.Parse()

	e, err := newEngine(*model, *tokens)
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(os.Stderr, "", 0)}
	fmt.Fprintf(os.Stderr, "msg=\"bench engine listening\" addr=%s model=%s tokens=%d\n", ln.Addr(), *model, *tokens)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}

// engine holds the precomputed responses.
type engine struct {
	full    []byte   // the non-streaming chat.completion
	fullLen []string // its Content-Length
	events  [][]byte // the stream's events, "data: ...\n\n" each
	models  []byte
	running atomic.Int64
}

// Header values shared by every response (net/http only reads them).
var (
	ctJSON     = []string{"application/json"}
	ctSSE      = []string{"text/event-stream"}
	noCache    = []string{"no-cache"}
	uvicorn    = []string{"uvicorn"}
	ctText     = []string{"text/plain; version=0.0.4; charset=utf-8"}
	bufs       = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	streamKey  = []byte(`"stream"`)
	trueLitera = []byte("true")
)

// newEngine records the responses once from internal/enginesim, the
// project's vLLM simulator, so their shapes are the simulator's (and
// vLLM's) without a second copy of its types: a non-streaming chat
// completion, a stream with usage split into its events, and GET
// /v1/models. It fails if the simulator does not answer 200.
func newEngine(model string, tokens int) (*engine, error) {
	sim, err := enginesim.New(enginesim.Config{Models: []string{model}, OutputTokens: tokens, MaxOutputTokens: tokens,
		TTFT: time.Microsecond, ITL: time.Microsecond})
	if err != nil {
		return nil, err
	}
	record := func(method, path, body string) ([]byte, error) {
		rec := httptest.NewRecorder()
		sim.Handler().ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
		if rec.Code != http.StatusOK {
			return nil, fmt.Errorf("enginesim %s %s: status %d: %s", method, path, rec.Code, rec.Body.Bytes())
		}
		return rec.Body.Bytes(), nil
	}
	req := `{"model":` + strconv.Quote(model) + `,"max_tokens":` + strconv.Itoa(tokens) + `,"messages":[{"role":"user","content":"bench"}]`
	full, err := record(http.MethodPost, "/v1/chat/completions", req+"}")
	if err != nil {
		return nil, err
	}
	stream, err := record(http.MethodPost, "/v1/chat/completions", req+`,"stream":true,"stream_options":{"include_usage":true}}`)
	if err != nil {
		return nil, err
	}
	models, err := record(http.MethodGet, "/v1/models", "")
	if err != nil {
		return nil, err
	}
	var events [][]byte
	for ev := range bytes.SplitAfterSeq(stream, []byte("\n\n")) {
		events = append(events, ev)
	}
	return &engine{full: full, fullLen: []string{strconv.Itoa(len(full))}, events: events, models: models}, nil
}

func (e *engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/v1/chat/completions" && r.Method == http.MethodPost:
		e.chat(w, r)
	case r.URL.Path == "/health" && r.Method == http.MethodGet:
		w.Header()["Server"] = uvicorn
		w.Header()["Content-Length"] = []string{"0"}
		w.WriteHeader(http.StatusOK)
	case r.URL.Path == "/v1/models" && r.Method == http.MethodGet:
		h := w.Header()
		h["Server"], h["Content-Type"] = uvicorn, ctJSON
		_, _ = w.Write(e.models)
	case r.URL.Path == "/metrics" && r.Method == http.MethodGet:
		w.Header()["Content-Type"] = ctText
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=%q} %d\nvllm:num_requests_waiting{model_name=%q} 0\nvllm:kv_cache_usage_perc{model_name=%q} 0\n",
			"bench", e.running.Load(), "bench", "bench")
	default:
		http.NotFound(w, r)
	}
}

func (e *engine) chat(w http.ResponseWriter, r *http.Request) {
	buf := bufs.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(io.LimitReader(r.Body, 1<<20))
	stream := err == nil && isStream(buf.Bytes())
	bufs.Put(buf)
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	e.running.Add(1)
	defer e.running.Add(-1)
	h := w.Header()
	h["Server"] = uvicorn
	if !stream {
		h["Content-Type"], h["Content-Length"] = ctJSON, e.fullLen
		_, _ = w.Write(e.full)
		return
	}
	h["Content-Type"], h["Cache-Control"] = ctSSE, noCache
	w.WriteHeader(http.StatusOK)
	f := w.(http.Flusher)
	for _, ev := range e.events {
		if _, err := w.Write(ev); err != nil {
			return
		}
		f.Flush()
	}
}

// isStream reports whether a JSON request body has "stream": true at any
// level (the benchmark's bodies have it at the top or not at all).
func isStream(b []byte) bool {
	for {
		i := bytes.Index(b, streamKey)
		if i < 0 {
			return false
		}
		b = b[i+len(streamKey):]
		j := 0
		for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
			j++
		}
		if j < len(b) && b[j] == ':' {
			j++
			for j < len(b) && (b[j] == ' ' || b[j] == '\t' || b[j] == '\n' || b[j] == '\r') {
				j++
			}
			return bytes.HasPrefix(b[j:], trueLitera)
		}
	}
}
