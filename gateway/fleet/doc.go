// Package fleet is Switchboard's engine fleet: the engines behind the
// gateway, their incarnations and state, health probes and model
// discovery, stats scraping, outlier detection, the engine admin actions
// (drain, sleep and wake, LoRA adapters), reloads and discovery sources.
// It knows nothing of HTTP requests: the gateway's request path sees it
// through a routing [Snapshot], a model lookup ([Fleet.Lookup]) and the
// outcome of each engine attempt ([Fleet.Report], [Fleet.MarkFailed]).
//
// # Snapshot
//
// The request path reads one immutable [Snapshot] through an atomic
// pointer ([Fleet.Snapshot]): per model a [Route], the routable engines'
// routing.Endpoints in fleet order with their engines; the route of
// every routable engine (a request naming no model); the model aliases
// with their replacement bytes; the GET /v1/models cards and body. Every
// change (a health or stats verdict, an ejection, an admin action, a
// reload, a discovery batch, Add, Remove) builds a new one; nothing on the
// request path takes the fleet's lock. A lookup's errors are sentinels
// wrapped with the model's name: routing.ErrNoEndpoint (known, nothing
// routable), [ErrModelPending] (an engine has not reported its models
// yet), [ErrModelNotFound].
//
// # Incarnations and state
//
// An [Engine] is one incarnation of a configured engine: removed and added
// again, or replaced by a reload (another URL, key or provider), an engine
// is a new incarnation with its own routing.Endpoint, so every slot is
// released where it was taken, and the old one drains its requests in
// flight, reported until it has. An incarnation's state is decided in one
// place from routing's verdicts, one per writer: removal, discovery and
// the admin drain (draining), the probes (unhealthy), outlier detection
// (ejected), the admin API and the engine's stats (sleeping). That state
// is what GET /admin/engines and switchboard.engine.state show
// ([Fleet.Status], [Fleet.ObserveState]), and only a ready engine is
// routed to.
//
// # Health probes and model discovery
//
// Every HealthConfig.Interval each engine is asked GET /health, and an
// engine configured without models GET /v1/models every
// HealthConfig.DiscoveryInterval (its LoRA adapters included); an engine
// put to sleep through the admin API is asked /is_sleeping until it says
// it is awake. An engine's first verdict is taken at once, later ones
// after HealthConfig.UnhealthyAfter failures in a row. Probes never touch
// the in-flight counters.
//
// # Engine stats
//
// With EngineStatsConfig.Enabled (the default) the fleet scrapes every
// engine's Prometheus text exposition (EngineStatsConfig.Path, /metrics,
// with the engine's credentials) every EngineStatsConfig.Interval,
// concurrently and off the request path, each scrape bounded by its
// timeout and a 4 MiB body. It reads vLLM's names: vllm:num_requests_running
// and vllm:num_requests_waiting summed over the served models,
// vllm:kv_cache_usage_perc (or the older vllm:gpu_cache_usage_perc), the
// prefix cache counters (a hit ratio from their growth between two
// scrapes, restarted when they fall), vllm:engine_sleep_state (its
// sleep_state="awake" series at 0, or a sleep level series above 0: the
// engine sleeps) and, under vLLM fault tolerance, vllm:engine_healthy. The
// result, with the gateway's own in-flight count at that moment, is stored
// as the engine's routing.Stats for the policies, trusted for
// EngineStatsConfig.MaxAge. A failed scrape leaves the last stats to expire
// and is logged at debug level; it never changes the health verdict, which
// belongs to the health probe. An engine whose fresh stats say it sleeps or
// is unhealthy gets no new requests (its requests in flight finish); when
// it wakes, or its stats expire, it is routable again. The stats are also
// exported as the switchboard.engine.queue_depth, kv_cache_usage,
// prefix_cache_hit_ratio and accounting_drift gauges (see package
// telemetry, [Fleet.ObserveStats]) and shown on GET /admin/engines
// ([EngineStatsStatus]).
//
// # Outlier detection
//
// Passive health after Envoy's outlier detection (Config.Outlier,
// routing.OutlierConfig). When an attempt ends the request path reports
// its outcome ([Fleet.Report]) and it is counted on its engine: engine 5xx answers and engines failing mid-response
// (engine_disconnect, stream_error), failed connections, and the
// per-attempt timeouts (header, first token, idle, attempt) each have a
// streak; a success ends them all; 4xx (429 included), clients that cancel
// or stall, the shutdown and the whole-request timeout count for nothing,
// and so does every attempt on a light route (tokenize, detokenize,
// count_tokens, stored-response lookups), whose success says nothing of
// the engine's generations. A streak at its threshold ejects the engine
// for base_ejection_time × its ejections (capped at max_ejection_time,
// forgiven one per base_ejection_time back in routing), unless more than
// max_ejection_percent of a model's engines would then be ejected (so the
// only engine of a model is never ejected at the default 50%), or it is
// the last ready engine of a model it serves (the others drained,
// unhealthy, sleeping or ejected; at any max_ejection_percent, 100
// included: Envoy's panic threshold exists for the same reason, and the
// engine's own answers beat a 503 for every request). A refused ejection
// is logged once per base_ejection_time per engine. The routing snapshot
// is rebuilt without it at once; when its ejection time ends a timer
// probes it, and it returns at that probe or any later one that passes.
// Its in-flight requests finish and release their slots as usual. The
// ejection reads the settings under the fleet's lock, so turning detection
// off (a reload) while a streak trips ejects nothing.
//
// A refused or timed-out connection also probes its engine at once, with
// outlier detection on or off ([Fleet.MarkFailed]): one probe at a time per engine and at most
// one per health.timeout, judged by the probes' own rule
// (health.unhealthy_after), so a dead engine leaves routing without
// waiting for the next round. A model's last ready engine is not probed
// early (its requests have nowhere else to go; the rounds take it out). An engine's state (GET /admin/engines, switchboard.engine.state)
// combines one verdict per writer: removal (draining), the probes
// (unhealthy), outlier detection (ejected, with ejected_until and
// ejections), the admin API and the engine's stats (sleeping); only a
// ready engine is routed to.
//
// # Admin actions
//
// [Fleet.SetDrained] drains an engine (no new requests, its requests in
// flight finish; it stays probed) or undrains it. [Fleet.Forward] sends an
// engine one of vLLM's admin calls ([LookupAction]: sleep, wake_up,
// is_sleeping, reset_prefix_cache, load_lora_adapter,
// unload_lora_adapter) with the engine's credentials and applies its
// effect before it returns: a sleeping engine leaves routing and comes
// back when woken, a loaded adapter is routed to at once.
//
// # Reloads and discovery
//
// [Fleet.SetConfigured] (a reload) and [Fleet.SetDiscovered] (a discovery
// source such as Kubernetes EndpointSlices) apply the whole engine set as
// one batch, in one new snapshot: the configured engines, then each
// source's. New incarnations are probed before they take traffic; an
// engine whose max_in_flight or configured models alone changed keeps its
// incarnation; a discovered engine its source reports unready stays,
// draining, and serves again at once when it is ready. [Changes] says
// what changed.
//
// # Prefill/decode roles
//
// Each engine has a [Role] (EngineConfig.Role: [RoleBoth] by default,
// [RolePrefill] or [RoleDecode]) and an optional pairing group
// (EngineConfig.Group), fixed for an incarnation: a reload or discovery
// changing them makes a new one. Every [Route] of a snapshot carries, built
// with it, [Route.Decode] (the endpoints a whole generation may go to: no
// prefill engine, unless every engine of the route is one),
// [Route.Prefill] (prefill and both engines) and [Route.Disaggregable]
// (at least one routable prefill and one routable decode engine). The
// role shows on /admin/engines, on the engine span
// (switchboard.engine.role) and on switchboard.engine.state.
//
// # Concurrency
//
// Every method of [Fleet] and [Engine] is safe for concurrent use.
// [Fleet.Start] runs the first probe round (and scrape) synchronously and
// then the periodic ones on their own goroutines, which [Fleet.Close]
// stops and waits for.
package fleet
