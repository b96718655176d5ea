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
// A policy is one method, [Policy.Pick]. Built-in policies are registered by
// name in [NewPolicy]; adding one is a new file with its type, its name
// constant and one line in registerPolicies.
package routing
