// Package routing decides which engine serves a request.
//
// It holds the [Endpoint] (one per configured engine, with its atomic
// in-flight counters), the [Policy] interface and the built-in policies. It
// has no HTTP server code and no OpenTelemetry SDK: the gateway builds the
// endpoints, parses each request into a [Request] and asks a policy to pick.
//
// # In-flight counters
//
// Each [Endpoint] counts the requests it is serving in two phases: prefill
// (admitted, no generated token seen yet) and decode (at least one generated
// token seen). The counters are the single source of truth: the policies read
// them and the gateway exports them as the
// switchboard.engine.active_requests gauge. They are moved only through a
// [Slot], which releases exactly once from the phase it is in.
//
// # Policies
//
// A policy is one method, [Policy.Pick]. [NewPolicy] builds the policy
// [Config] names from a registry of name -> factory, filled in one explicit
// function, registerInTreePolicies (no init()). Every Pick is
// allocation-free (BenchmarkPick, at 4 and 64 candidates).
//
//   - [RoundRobin] (round-robin): in turn.
//   - [LeastLoaded] (least-loaded): the lowest gateway in-flight score,
//     prefill*PrefillWeight + decode.
//   - [PowerOfTwo] (power-of-two): the less loaded of two random candidates.
//   - [SessionAffinity] (session-affinity): consistent hashing with bounded
//     loads over engine names, keyed by a session header or the body's user.
//   - [PrefixAware] (prefix-aware): the engine most recently sent the
//     prompt's longest prefix ([PrefixIndex]), unless it is overloaded.
//   - [Scorer] (scorer): a weighted sum of queue depth, KV-cache usage,
//     prefix match and in-flight scores.
//
// # Adding a policy
//
// A policy is one file that owns everything about it: its type, with an
// interface guard; its config name as a constant next to it
// (const RoundRobinName = "round-robin"); its settings, if it has any, as a
// koanf-tagged XConfig with its documented defaults (defaultXConfig) and a
// Validate method whose messages start with the key; and a factory
// function (xFactory) returning its registry entry: how it is built from
// [Config], and how its section is defaulted and validated. Then:
//
//   - one line in registerInTreePolicies: r.register(XName, xFactory());
//   - for a policy with settings, its section field in [Config] (the
//     routing.x key of the YAML file), documented in configs/gateway.yaml
//     as every key is.
//
// [DefaultConfig] and [Config.Validate] reach every registered section
// through the registry, so neither changes. Settings several policies share
// (routing.policy, routing.prefill_weight, routing.prefix) are Config's own.
//
// Policies that need more than [Request]'s basic fields say so by optional
// interfaces the gateway finds by type assertion: [PrefixHasher] (hash the
// prompt into blocks) and [SessionKeyed] (read the session key from a
// header).
//
// # Engine stats
//
// The gateway scrapes each engine's own view of its load (queue, KV cache,
// prefix cache, sleep state) into [Stats] on its [Endpoint]. Stats carry an
// expiry; a policy trusts them only while [Stats.Fresh], and otherwise falls
// back to the gateway's own counters, so a stalled scrape can never steer
// traffic by stale numbers.
//
// # Outlier detection and engine state
//
// Passive health, after Envoy's outlier detection: each [Endpoint] has an
// [Outlier] that counts the outcomes of real traffic ([Outcome]) in
// streaks of consecutive 5xx, connect failures and timeouts. A streak at
// its threshold ([OutlierConfig]) ejects the engine for
// base_ejection_time × its ejections, capped at max_ejection_time, never
// more than max_ejection_percent of a model's engines at once; past its
// ejection time it returns at its first passing probe. An engine's
// [State] (ready, unhealthy, ejected, sleeping, draining) combines the
// [Verdicts] of its writers, one each: probes, traffic, the admin API and
// the engine's own stats, removal. Only ready engines are candidates.
package routing
