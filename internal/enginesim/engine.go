package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBodyBytes caps request bodies; larger bodies are answered with 413.
const maxBodyBytes = 32 << 20

// Engine is one simulated vLLM engine. Create it with [New]; serve it with [Engine.Handler].
// All methods are safe for concurrent use. An Engine owns no goroutines of its own: every wait
// runs on the request's handler goroutine, so closing the HTTP server is enough to stop it.
type Engine struct {
	cfg     Config
	created int64 // unix seconds, reported by /v1/models

	reg    *prometheus.Registry
	models map[string]*modelState // read-only after New
	sched  *scheduler
	cache  *prefixCache

	fault     atomic.Pointer[faults]
	unhealthy atomic.Bool
	kvBlocks  atomic.Int64 // KV blocks held by running sequences

	received, completed, aborted, faulted atomic.Int64
	pcQueries, pcHits                     atomic.Int64

	handler http.Handler

	// onDelay, when set (by tests, before the first request), is called with every computed
	// prefill and inter-token wait, from the request's goroutine.
	onDelay func(delayKind, time.Duration)
}

// Stats is a point-in-time snapshot of an engine's counters. Every request that passes
// validation ends in exactly one of Completed, Aborted or Faulted; Received also counts
// requests rejected with 400/404/413.
type Stats struct {
	// Received counts requests on the generation endpoints (chat, completions, embeddings).
	Received int64
	// Running is the number of sequences running now (at most Config.MaxNumSeqs).
	Running int64
	// Waiting is the number of sequences queued for a running slot now.
	Waiting int64
	// Completed counts requests that finished normally.
	Completed int64
	// Aborted counts requests whose client disconnected or cancelled before the response
	// finished (vLLM's "Aborted request"), including those ended by a stall fault.
	Aborted int64
	// Faulted counts requests ended by an injected fault (status, close-*, truncate,
	// non-stream malformed).
	Faulted int64
	// PrefixCacheQueries counts prompt tokens looked up in the prefix cache, in tokens.
	PrefixCacheQueries int64
	// PrefixCacheHits counts prompt tokens found in the prefix cache, in tokens.
	PrefixCacheHits int64
}

// New returns an engine for cfg after applying defaults to zero fields. It returns the
// [Config.Validate] error if cfg is invalid.
func New(cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	f, _ := parseFaults(cfg.Fault) // validated above
	e := &Engine{
		cfg:     cfg,
		created: time.Now().Unix(),
		sched:   newScheduler(cfg.MaxNumSeqs),
		cache:   newPrefixCache(cfg.BlockSize, cfg.KVCacheBlocks),
	}
	e.fault.Store(f)
	e.reg, e.models = newMetrics(e)

	mux := http.NewServeMux()
	mux.Handle("/v1/chat/completions", allow(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
		e.serveGenerate(w, r, kindChat)
	}))
	mux.Handle("/v1/completions", allow(http.MethodPost, func(w http.ResponseWriter, r *http.Request) {
		e.serveGenerate(w, r, kindCompletion)
	}))
	mux.Handle("/v1/embeddings", allow(http.MethodPost, e.serveEmbeddings))
	mux.Handle("/v1/models", allow(http.MethodGet, e.serveModels))
	mux.Handle("/health", allow(http.MethodGet, e.serveHealth))
	mux.Handle("/metrics", allow(http.MethodGet, promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	e.handler = serverHeader(mux)
	return e, nil
}

// serverName is the Server header of every response: vLLM runs under uvicorn, which sends
// "server: uvicorn".
const serverName = "uvicorn"

// serverHeader sets the Server header that uvicorn sends on every response, then calls h.
func serverHeader(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", serverName)
		h.ServeHTTP(w, r)
	})
}

// allow restricts h to method (GET also allows HEAD), answering others with a 405 JSON error.
func allow(method string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead) {
			w.Header().Set("Allow", method)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed; use %s", r.Method, method))
			return
		}
		h(w, r)
	})
}

// Handler returns the engine's HTTP API: /v1/chat/completions, /v1/completions,
// /v1/embeddings, /v1/models, /health and /metrics. The same handler is returned on every call.
func (e *Engine) Handler() http.Handler { return e.handler }

// Stats returns a snapshot of the engine's counters. It is safe for concurrent use; the
// fields are read one by one, so they may be mutually inconsistent by a request in flight.
func (e *Engine) Stats() Stats {
	running, waiting := e.sched.counts()
	return Stats{
		Received:           e.received.Load(),
		Running:            running,
		Waiting:            waiting,
		Completed:          e.completed.Load(),
		Aborted:            e.aborted.Load(),
		Faulted:            e.faulted.Load(),
		PrefixCacheQueries: e.pcQueries.Load(),
		PrefixCacheHits:    e.pcHits.Load(),
	}
}

// SetFault atomically replaces the default fault spec used by requests without an
// X-Enginesim-Fault header; "" removes it. Requests already running keep their faults. An
// invalid spec returns an error wrapping [ErrBadFault] and leaves the default unchanged.
func (e *Engine) SetFault(spec string) error {
	f, err := parseFaults(spec)
	if err != nil {
		return err
	}
	e.fault.Store(f)
	return nil
}

// SetHealthy sets whether GET /health answers 200 (true, the initial state) or 503 (false).
// It does not affect the other endpoints.
func (e *Engine) SetHealthy(ok bool) { e.unhealthy.Store(!ok) }

// faultsFor returns the faults for r: its X-Enginesim-Fault header if present, else the
// engine default.
func (e *Engine) faultsFor(r *http.Request) (*faults, error) {
	if v, ok := r.Header[FaultHeader]; ok {
		spec := ""
		if len(v) > 0 {
			spec = v[0]
		}
		return parseFaults(spec)
	}
	return e.fault.Load(), nil
}

func (e *Engine) serveHealth(w http.ResponseWriter, _ *http.Request) {
	if e.unhealthy.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) serveModels(w http.ResponseWriter, _ *http.Request) {
	list := modelList{Object: "list", Data: make([]modelCard, 0, len(e.cfg.Models))}
	for _, m := range e.cfg.Models {
		list.Data = append(list.Data, modelCard{
			ID: m, Object: "model", Created: e.created, OwnedBy: "vllm", Root: m, MaxModelLen: MaxModelLen,
		})
	}
	writeJSON(w, list)
}

// writeJSON writes v as a complete 200 JSON response with Content-Length.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// model returns the state of the requested model; "" selects the first served model, as vLLM
// does when a request names no model.
func (e *Engine) model(name string) (*modelState, bool) {
	if name == "" {
		return e.models[e.cfg.Models[0]], true
	}
	m, ok := e.models[name]
	return m, ok
}

// modelNotFound returns vLLM's message for an unknown model.
func modelNotFound(name string) string {
	return fmt.Sprintf("The model `%s` does not exist.", name)
}
