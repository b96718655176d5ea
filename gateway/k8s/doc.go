// Package k8s discovers engines from Kubernetes EndpointSlices.
//
// [Start] runs one client-go informer per namespace on the slices that
// Config's service name or label selector picks, and keeps a [Sink]'s
// (the gateway's) discovered engines equal to the slices' ready, not
// terminating endpoints, each change batch applied as one routing
// snapshot. An endpoint that turns terminating or not ready, or whose slice
// is deleted, leaves the engine set: the pool retires it, so it takes no
// new request and its requests in flight finish and release their slots on
// its own incarnation.
//
// # Names
//
// Engines are named after their pod (Config.Names "pod", the default), or
// "<slice>/<address>", or "<service>/<address>". The names, not the order
// of events, determine the engine list (sorted by name), so every gateway
// replica watching the same slices has the same engines in the same order,
// and session affinity maps a session to the same engine on each.
//
// # Permissions
//
// Discovery needs exactly [Rules] (get, list, watch on EndpointSlices) in
// each watched namespace; [Start] checks list and watch before it starts
// and fails with ErrForbidden and what to grant otherwise.
package k8s
