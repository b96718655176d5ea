// Package k8s discovers engines from Kubernetes EndpointSlices.
//
// [Start] runs one client-go informer per namespace on the slices that
// Config's service name or label selector picks (of Config's address
// type: a dual-stack Service's slices of the other family are ignored),
// and keeps a [Sink]'s (the gateway's) discovered engines equal to the
// slices' endpoints, each change batch applied as one routing snapshot.
//
// # Readiness
//
// A ready, not terminating endpoint takes requests. One that turns not
// ready or terminating stays in the engine set, Unready: it takes no new
// request, its requests in flight finish on it, and it keeps its
// incarnation (health, outlier state, stats), so a ready, not ready, ready
// flap serves again at once without a new one. An endpoint leaves the set
// only when it leaves its slice, or its slice is deleted: the pool retires
// it, and its requests in flight finish and release their slots on its own
// incarnation.
//
// # Names
//
// Engines are named after their pod (Config.Names "pod", the default; an
// endpoint without a pod targetRef falls back to "<slice>/<address>"), or
// "<slice>/<address>", or "<service>/<address>". The names, not the order
// of events, determine the engine list (sorted by name), so every gateway
// replica watching the same slices has the same engines in the same order,
// and session affinity maps a session to the same engine on each.
//
// # Permissions
//
// Discovery needs exactly [Config.Rules] in each watched namespace: list
// and watch on EndpointSlices, and on pods while it reads their role or
// group label (the default, [Rules]), nothing else; [Start] checks them in
// every namespace at once before it starts, and fails with ErrForbidden
// and what to grant otherwise.
//
// # Roles
//
// Each engine's prefill/decode role (fleet.EngineConfig.Role) is its pod's
// Config.RoleLabel label, llm-d's llm-d.ai/role by default: "prefill",
// "decode", or "prefill-decode" (or "both") for an engine doing whole
// generations; its pairing group is the Config.GroupLabel label, when one
// is set. An EndpointSlice does not carry its pods' labels: discovery runs
// a pod informer per namespace beside the slices' one, keeping only each
// pod's name and these two labels, and a pod added, deleted or relabelled
// re-triggers the engine set (a role change is a new incarnation of the
// engine). A missing label, a pod not (yet) in the cache or an endpoint
// without a pod targetRef is "both"; so is an unknown value, warned about
// once per pod. Discovery never fails on a label.
package k8s
