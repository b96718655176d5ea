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
// The shapes are those internal/enginesim (and vLLM) emit. Any other request
// gets a 404. It logs one line, msg="bench engine listening" addr=HOST:PORT,
// once it listens (--listen 127.0.0.1:0 picks a free port), and stops on
// SIGTERM or SIGINT.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (host:port; port 0 picks a free one)")
	model := flag.String("model", "bench", "served model name")
	tokens := flag.Int("tokens", 16, "tokens per response")
	flag.Parse()

	e := newEngine(*model, *tokens)
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

func newEngine(model string, tokens int) *engine {
	created := time.Now().Unix()
	id := "chatcmpl-0123456789abcdef0123456789abcdef"
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return b
	}
	var content strings.Builder
	for i := 0; i < tokens; i++ {
		fmt.Fprintf(&content, "tok%d ", i)
	}
	// Field order as vLLM (and enginesim) writes them: ordered structs, not maps.
	type message struct {
		Role             string `json:"role"`
		Content          string `json:"content"`
		Refusal          any    `json:"refusal"`
		Annotations      any    `json:"annotations"`
		Audio            any    `json:"audio"`
		FunctionCall     any    `json:"function_call"`
		ToolCalls        []any  `json:"tool_calls"`
		ReasoningContent any    `json:"reasoning_content"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Message      message `json:"message"`
		Logprobs     any     `json:"logprobs"`
		FinishReason string  `json:"finish_reason"`
		StopReason   any     `json:"stop_reason"`
	}
	type fullUsage struct {
		PromptTokens        int `json:"prompt_tokens"`
		TotalTokens         int `json:"total_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails any `json:"prompt_tokens_details"`
	}
	full := mustJSON(struct {
		ID                string    `json:"id"`
		Object            string    `json:"object"`
		Created           int64     `json:"created"`
		Model             string    `json:"model"`
		Choices           []choice  `json:"choices"`
		ServiceTier       any       `json:"service_tier"`
		SystemFingerprint any       `json:"system_fingerprint"`
		Usage             fullUsage `json:"usage"`
		PromptLogprobs    any       `json:"prompt_logprobs"`
		KVTransferParams  any       `json:"kv_transfer_params"`
	}{
		ID: id, Object: "chat.completion", Created: created, Model: model,
		Choices: []choice{{Message: message{Role: "assistant", Content: content.String(), ToolCalls: []any{}}, FinishReason: "length"}},
		Usage:   fullUsage{PromptTokens: 1, TotalTokens: 1 + tokens, CompletionTokens: tokens},
	})

	type delta struct {
		Role    string  `json:"role,omitempty"`
		Content *string `json:"content,omitempty"`
	}
	type chunkChoice struct {
		Index        int   `json:"index"`
		Delta        delta `json:"delta"`
		Logprobs     any   `json:"logprobs"`
		FinishReason any   `json:"finish_reason"`
		StopReason   *any  `json:"stop_reason,omitempty"` // on the finish chunk only
	}
	type chunk struct {
		ID      string        `json:"id"`
		Object  string        `json:"object"`
		Created int64         `json:"created"`
		Model   string        `json:"model"`
		Choices []chunkChoice `json:"choices"`
		Usage   *streamUsage  `json:"usage,omitempty"`
	}
	event := func(c chunk) []byte {
		c.ID, c.Object, c.Created, c.Model = id, "chat.completion.chunk", created, model
		return append(append([]byte("data: "), mustJSON(c)...), "\n\n"...)
	}
	empty := ""
	events := [][]byte{event(chunk{Choices: []chunkChoice{{Delta: delta{Role: "assistant", Content: &empty}}}})}
	for i := 0; i < tokens; i++ {
		s := "tok" + strconv.Itoa(i) + " "
		events = append(events, event(chunk{Choices: []chunkChoice{{Delta: delta{Content: &s}}}}))
	}
	var null any
	events = append(events,
		event(chunk{Choices: []chunkChoice{{FinishReason: "length", StopReason: &null}}}),
		event(chunk{Choices: []chunkChoice{}, Usage: &streamUsage{PromptTokens: 1, TotalTokens: 1 + tokens, CompletionTokens: tokens}}),
		[]byte("data: [DONE]\n\n"))

	type permission struct {
		ID                 string `json:"id"`
		Object             string `json:"object"`
		Created            int64  `json:"created"`
		AllowCreateEngine  bool   `json:"allow_create_engine"`
		AllowSampling      bool   `json:"allow_sampling"`
		AllowLogprobs      bool   `json:"allow_logprobs"`
		AllowSearchIndices bool   `json:"allow_search_indices"`
		AllowView          bool   `json:"allow_view"`
		AllowFineTuning    bool   `json:"allow_fine_tuning"`
		Organization       string `json:"organization"`
		Group              any    `json:"group"`
		IsBlocking         bool   `json:"is_blocking"`
	}
	type card struct {
		ID          string       `json:"id"`
		Object      string       `json:"object"`
		Created     int64        `json:"created"`
		OwnedBy     string       `json:"owned_by"`
		Root        string       `json:"root"`
		Parent      any          `json:"parent"`
		MaxModelLen int          `json:"max_model_len"`
		Permission  []permission `json:"permission"`
	}
	models := mustJSON(struct {
		Object string `json:"object"`
		Data   []card `json:"data"`
	}{"list", []card{{
		ID: model, Object: "model", Created: created, OwnedBy: "vllm", Root: model, MaxModelLen: 8192,
		Permission: []permission{{ID: "modelperm-0123456789abcdef0123456789abcdef", Object: "model_permission",
			Created: created, AllowSampling: true, AllowLogprobs: true, AllowView: true, Organization: "*"}},
	}}})

	return &engine{full: full, fullLen: []string{strconv.Itoa(len(full))}, events: events, models: models}
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

// streamUsage is the usage chunk's object, in vLLM's field order.
type streamUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}
