package enginesim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBodyBytes caps request bodies; larger bodies are answered with 413.
const maxBodyBytes = 32 << 20

// Engine is one simulated vLLM engine. Create it with [New]; serve it with [Engine.Handler].
// All methods are safe for concurrent use. Every wait runs on the request's handler
// goroutine, so closing the HTTP server is enough to stop the requests; the engine owns
// goroutines of its own only with KV-cache events on (Config.KVEvents), and [Engine.Close]
// stops them.
type Engine struct {
	cfg     Config
	created int64 // unix seconds, reported by /v1/models

	reg    *prometheus.Registry
	models map[string]*modelState // read-only after New
	cards  []modelCard            // the base models' /v1/models cards, read-only after New
	sched  *scheduler
	cache  *prefixCache

	fault     atomic.Pointer[faults]
	unhealthy atomic.Bool
	draining  atomic.Bool  // the drain-after fault (or SetDraining) started a drain
	kvBlocks  atomic.Int64 // KV blocks held by running sequences

	received, completed, aborted, faulted atomic.Int64
	pcQueries, pcHits                     atomic.Int64

	loraMu sync.RWMutex
	loras  map[string]*lora // loaded adapters by name
	loraOf []*lora          // loaded adapters in load order, for /v1/models

	sleepMu sync.Mutex
	sleep   sleepState
	asleep  atomic.Bool // sleep.sleeping(), for the request path

	responses *responseStore // stored Responses API responses

	kv *kvState // prefill/decode KV transfers

	kvPub *kvPublisher // KV-cache events; nil when Config.KVEvents is empty

	interf *interference // prefill interference; nil when Config.PrefillInterference is off

	handler http.Handler

	// onDelay, when set (by tests, before the first request), is called with every computed
	// prefill and inter-token wait, from the request's goroutine.
	onDelay func(delayKind, time.Duration)
	// now is the clock of the Responses API (created_at, background generation time), of
	// adapter load times and of the KV holds' leases; tests replace it before the engine
	// serves.
	now func() time.Time
}

// Stats is a point-in-time snapshot of an engine's counters, over the generation and pooling
// routes (the light routes are not counted). Every request that passes validation ends in
// exactly one of Completed, Aborted or Faulted; Received also counts requests rejected with
// 400/404/413, and with 503 while the engine sleeps.
type Stats struct {
	// Received counts requests on the generation and pooling endpoints (chat, completions,
	// responses, messages, audio, images, embeddings, rerank, score, pooling, classify).
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
	// Faulted counts requests ended by an injected fault (status, close-*, reset-after,
	// error-after, drain-after, truncate, non-stream malformed).
	Faulted int64
	// PrefixCacheQueries counts prompt tokens looked up in the prefix cache, in tokens.
	PrefixCacheQueries int64
	// PrefixCacheHits counts prompt tokens found in the prefix cache, in tokens.
	PrefixCacheHits int64

	// Prefill and decode (see the package documentation). KVParamsSent counts prefill legs
	// answered with kv_transfer_params; KVHeld is the number of those whose blocks the engine
	// holds now for a decode engine; KVPullsServed counts holds freed by a decode engine's
	// pull, KVLeasesExpired those freed by the lease running out.
	KVParamsSent, KVHeld, KVPullsServed, KVLeasesExpired int64
	// KVPulled counts decode legs that pulled their prompt's KV; KVLoadFailures those whose
	// params were invalid or whose pull failed, KVRecomputed those of them that computed the
	// prompt themselves (the recompute policy).
	KVPulled, KVLoadFailures, KVRecomputed int64
}

// KVEventsStats is a point-in-time snapshot of the KV-cache events publisher's counters,
// in batches (all 0 when KV events are off).
type KVEventsStats struct {
	// Batches counts the batches given a sequence number, over restarts too.
	Batches int64
	// QueueDrops counts those dropped because the publisher's queue was full
	// (Config.KVEventsQueue).
	QueueDrops int64
	// Withheld counts those kept from the PUB socket by the drop or stop fault.
	Withheld int64
	// Sent counts those handed to the PUB socket.
	Sent int64
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
		cfg:       cfg,
		created:   time.Now().Unix(),
		sched:     newScheduler(cfg.MaxNumSeqs),
		cache:     newPrefixCache(cfg.BlockSize, cfg.KVCacheBlocks),
		loras:     make(map[string]*lora),
		responses: newResponseStore(responseStoreSize, responseStoreBytes),
		kv:        newKVState(),
		interf:    newInterference(&cfg),
		now:       time.Now,
	}
	e.fault.Store(f)
	e.reg, e.models = newMetrics(e)
	for _, m := range cfg.Models {
		e.cards = append(e.cards, e.baseCard(m))
	}
	for _, l := range cfg.LoRAs {
		e.addLoRA(l.Name, l.Path, e.models[l.Base])
	}
	e.cache.bases = make(map[string]bool, len(cfg.Models))
	for _, m := range cfg.Models {
		e.cache.bases[m] = true
	}
	if cfg.KVEvents != "" {
		p, err := newKVPublisher(&cfg)
		if err != nil {
			return nil, err
		}
		e.kvPub, e.cache.pub = p, p
	}
	e.handler = serverHeader(e.traced(cfg.TracerProvider, newProvider(cfg.Provider, func() time.Time { return e.now() }, e.routes())))
	return e, nil
}

// Close stops the goroutines and closes the sockets of the KV-cache events publisher
// (batches not yet sent are dropped); the engine then goes on serving without publishing.
// It does nothing for an engine without KV events. It returns the sockets' close errors;
// it is idempotent, and safe to call while requests run.
func (e *Engine) Close() error {
	if e.kvPub == nil {
		return nil
	}
	return e.kvPub.close()
}

// KVEventsAddr returns the endpoint the KV-events PUB socket is bound to, with the port
// it got when Config.KVEvents asked for port 0 ("tcp://127.0.0.1:41234"), or "" when KV
// events are off.
func (e *Engine) KVEventsAddr() string {
	if e.kvPub == nil {
		return ""
	}
	return kvAddr(e.kvPub.pub, e.cfg.KVEvents)
}

// KVReplayAddr returns the endpoint the KV-events replay ROUTER socket is bound to, as
// [Engine.KVEventsAddr] does, or "" when there is none.
func (e *Engine) KVReplayAddr() string {
	if e.kvPub == nil || e.kvPub.rep == nil {
		return ""
	}
	return kvAddr(e.kvPub.rep, e.cfg.KVEventsReplay)
}

// SetKVEventsDrop replaces the KV-events drop fault: spec "N" or "N-M" (inclusive) names
// the sequence numbers of batches that are then not sent on PUB (they still take their
// numbers and stay in the replay buffer, as a PUB high-water-mark drop would leave them);
// "" removes it. It returns an error wrapping [ErrBadKVEventsDrop] for a malformed spec
// (the fault is then unchanged) and [ErrKVEventsOff] when KV events are off.
func (e *Engine) SetKVEventsDrop(spec string) error {
	if e.kvPub == nil {
		return ErrKVEventsOff
	}
	r, err := parseKVDrop(spec)
	if err != nil {
		return err
	}
	e.kvPub.mu.Lock()
	e.kvPub.drop = r
	e.kvPub.mu.Unlock()
	return nil
}

// SetKVEventsStopped stops (true) or resumes (false) sending KV-events batches on PUB.
// While stopped the engine goes on numbering batches and keeping them for replay, so a
// subscriber sees silence, then a sequence gap at the first batch after the resume. It
// returns [ErrKVEventsOff] when KV events are off.
func (e *Engine) SetKVEventsStopped(stopped bool) error {
	if e.kvPub == nil {
		return ErrKVEventsOff
	}
	e.kvPub.mu.Lock()
	e.kvPub.stopped = stopped
	e.kvPub.mu.Unlock()
	return nil
}

// RestartKVEvents simulates a restart of the engine process as its KV-events subscribers
// see it: the prefix cache is emptied without an AllBlocksCleared event, the sequence
// starts over at 0, and the replay buffer and the batches not yet sent are dropped. The
// sockets stay bound, and the drop and stop faults stay as they are. It returns
// [ErrKVEventsOff] when KV events are off.
func (e *Engine) RestartKVEvents() error {
	if e.kvPub == nil {
		return ErrKVEventsOff
	}
	e.cache.restart()
	return nil
}

// routes returns the engine's mux. Every path answers wrong methods with a 405 JSON error and
// unknown paths with a 404, in the route's envelope.
func (e *Engine) routes() *http.ServeMux {
	mux := http.NewServeMux()
	post := func(path string, h http.HandlerFunc) { mux.Handle(path, allow(apiOpenAI, http.MethodPost, h)) }
	get := func(path string, h http.HandlerFunc) { mux.Handle(path, allow(apiOpenAI, http.MethodGet, h)) }

	// Generation.
	post("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.serveGenerate(w, r, kindChat) })
	post("/v1/completions", func(w http.ResponseWriter, r *http.Request) { e.serveGenerate(w, r, kindCompletion) })
	post("/v1/responses", e.serveResponses)
	get("/v1/responses/{id}", e.serveGetResponse)
	post("/v1/responses/{id}/cancel", e.serveCancelResponse)
	mux.Handle("/v1/messages", allow(apiAnthropic, http.MethodPost, e.serveMessages))
	mux.Handle("/v1/messages/count_tokens", allow(apiAnthropic, http.MethodPost, e.serveCountTokens))
	post("/v1/audio/transcriptions", func(w http.ResponseWriter, r *http.Request) { e.serveSpeechToText(w, r, taskTranscribe) })
	post("/v1/audio/translations", func(w http.ResponseWriter, r *http.Request) { e.serveSpeechToText(w, r, taskTranslate) })
	post("/v1/audio/speech", e.serveSpeech)
	post("/v1/images/generations", e.serveImages)

	// Pooling.
	post("/v1/embeddings", e.serveEmbeddings)
	for _, p := range []string{"/v1/rerank", "/v2/rerank", "/rerank"} {
		post(p, e.serveRerank)
	}
	post("/v1/score", e.serveScore)
	post("/score", e.serveScore)
	post("/pooling", e.servePooling)
	post("/classify", e.serveClassify)

	// Tokenizer, models, adapters, engine administration.
	post("/tokenize", e.serveTokenize)
	post("/detokenize", e.serveDetokenize)
	get("/v1/models", e.serveModels)
	post("/v1/load_lora_adapter", e.serveLoadLoRA)
	post("/v1/unload_lora_adapter", e.serveUnloadLoRA)
	post("/sleep", e.serveSleep)
	post("/wake_up", e.serveWakeUp)
	get("/is_sleeping", e.serveIsSleeping)
	post("/reset_prefix_cache", e.serveResetPrefixCache)
	get("/health", e.serveHealth)
	post("/admin/fault", e.serveAdminFault)
	post("/admin/kv-events/drop", e.serveKVEventsDrop)
	post("/admin/kv-events/stop", func(w http.ResponseWriter, r *http.Request) { e.serveKVEventsAdmin(w, r, kvAdminStop) })
	post("/admin/kv-events/resume", func(w http.ResponseWriter, r *http.Request) { e.serveKVEventsAdmin(w, r, kvAdminResume) })
	post("/admin/kv-events/restart", func(w http.ResponseWriter, r *http.Request) { e.serveKVEventsAdmin(w, r, kvAdminRestart) })
	post(kvPullPath, e.serveKVPull)
	metrics := promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{})
	get("/metrics", func(w http.ResponseWriter, r *http.Request) {
		e.sweepResponses() // background responses due by now are counted before the scrape
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
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

// allow restricts h to method (GET also allows HEAD), answering others with a 405 JSON error
// in the envelope a.
func allow(a api, method string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && (method != http.MethodGet || r.Method != http.MethodHead) {
			w.Header().Set("Allow", method)
			a.writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed; use %s", r.Method, method))
			return
		}
		h(w, r)
	})
}

// Handler returns the engine's HTTP API (see the package documentation for the routes). The
// same handler is returned on every call.
func (e *Engine) Handler() http.Handler { return e.handler }

// Stats returns a snapshot of the engine's counters. It is safe for concurrent use; the
// fields are read one by one, so they may be mutually inconsistent by a request in flight.
func (e *Engine) Stats() Stats {
	e.sweepResponses()
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
		KVParamsSent:       e.kv.paramsSent.Load(),
		KVHeld:             e.kvHeld(),
		KVPullsServed:      e.kv.pullsServed.Load(),
		KVLeasesExpired:    e.kv.leasesExpired.Load(),
		KVPulled:           e.kv.pulled.Load(),
		KVLoadFailures:     e.kv.loadFailures.Load(),
		KVRecomputed:       e.kv.recomputed.Load(),
	}
}

// KVEventsStats returns a snapshot of the KV-cache events publisher's counters; the fields
// are read one by one.
func (e *Engine) KVEventsStats() KVEventsStats {
	p := e.kvPub
	if p == nil {
		return KVEventsStats{}
	}
	return KVEventsStats{Batches: p.batches.Load(), QueueDrops: p.queueOut.Load(), Withheld: p.withheld.Load(), Sent: p.sent.Load()}
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

// SetDraining sets whether the engine drains, as vLLM does when it shuts down: while it
// drains GET /health answers 503 and new generation and pooling requests are refused with
// 503; requests already running go on (or are aborted by the drain-after fault that started
// the drain). The drain-after fault sets it; tests undrain with SetDraining(false).
func (e *Engine) SetDraining(on bool) { e.draining.Store(on) }

// Draining reports whether the engine drains (see [Engine.SetDraining]).
func (e *Engine) Draining() bool { return e.draining.Load() }

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
	if e.unhealthy.Load() || e.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) serveModels(w http.ResponseWriter, _ *http.Request) {
	list := modelList{Object: "list", Data: append([]modelCard(nil), e.cards...)}
	e.loraMu.RLock()
	for _, l := range e.loraOf {
		list.Data = append(list.Data, l.card)
	}
	e.loraMu.RUnlock()
	writeJSON(w, list)
}

// baseCard returns the /v1/models card of served model name: vLLM's ModelCard with the name
// as its root, no parent, the max_model_len and one default permission.
func (e *Engine) baseCard(name string) modelCard {
	maxLen := e.cfg.MaxModelLen
	return modelCard{
		ID: name, Object: "model", Created: e.created, OwnedBy: "vllm", Root: name, MaxModelLen: &maxLen,
		Permission: []modelPermission{newPermission(e.created)},
	}
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

// target returns the target of a request naming model: a served model, a loaded LoRA
// adapter (run on its base model), or, for "", the first served model, as vLLM does when a
// request names no model. In provider mode with a model map, only the map's names.
func (e *Engine) target(model string) (target, bool) {
	if model == "" && len(e.cfg.Provider.Models) == 0 {
		name := e.cfg.Models[0]
		return target{m: e.models[name], name: name}, true
	}
	if len(e.cfg.Provider.Models) > 0 {
		// Provider mode: only the provider's names, echoed as requested.
		served, ok := e.cfg.Provider.Models[model]
		if !ok {
			return target{}, false
		}
		return target{m: e.models[served], name: model}, true
	}
	if m, ok := e.models[model]; ok {
		return target{m: m, name: model}, true
	}
	e.loraMu.RLock()
	l, ok := e.loras[model]
	e.loraMu.RUnlock()
	if !ok {
		return target{}, false
	}
	return target{m: l.base, name: l.card.ID}, true
}

// modelNotFound returns vLLM's message for an unknown model.
func modelNotFound(name string) string {
	return fmt.Sprintf("The model `%s` does not exist.", name)
}
