package k8s

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Engine names ([Config.Names]).
const (
	// NamesPod names an engine after its pod (the endpoint's targetRef),
	// "<namespace>/<pod>" when several namespaces are watched; an endpoint
	// without a pod reference falls back to NamesSliceAddress.
	NamesPod = "pod"
	// NamesSliceAddress names an engine "<slice>/<address>". The name
	// changes when the EndpointSlice controller moves the endpoint to
	// another slice.
	NamesSliceAddress = "slice-address"
	// NamesServiceAddress names an engine "<service>/<address>", the
	// service from the slice's kubernetes.io/service-name label: stable
	// across slices, changes with the pod's IP.
	NamesServiceAddress = "service-address"
)

// Address types ([Config.AddressType]), spelled as discovery.k8s.io/v1
// spells a slice's addressType.
const (
	AddressTypeIPv4 = string(discoveryv1.AddressTypeIPv4)
	AddressTypeIPv6 = string(discoveryv1.AddressTypeIPv6)
	AddressTypeFQDN = string(discoveryv1.AddressTypeFQDN)
)

// Config is the discovery.kubernetes section: which EndpointSlices hold
// the engines, and how each endpoint becomes an engine. configs/gateway.yaml
// documents every key with its default.
type Config struct {
	// Enabled turns discovery on. Default false.
	Enabled bool `koanf:"enabled"`
	// Kubeconfig is a kubeconfig file to reach the API server with. Empty
	// (the default): the pod's service account (in-cluster), else
	// $KUBECONFIG or ~/.kube/config.
	Kubeconfig string `koanf:"kubeconfig"`
	// Namespaces are the namespaces whose EndpointSlices are watched, one
	// informer each. Empty (the default): the gateway's own namespace. In
	// a cluster that is the service account's (its namespace file), else
	// the namespace of the kubeconfig's current context, else "default";
	// [Start] logs which one it chose and why.
	Namespaces []string `koanf:"namespaces"`
	// Service selects the slices of one Service (the
	// kubernetes.io/service-name label); Selector is a label selector on
	// the slices (the EndpointSlice controller copies the Service's labels
	// to them). Set either or both (then both must match); at least one.
	Service  string `koanf:"service"`
	Selector string `koanf:"selector"`
	// Port is the name of the engines' port in the slices (the Service
	// port's name). Empty: the slices must have exactly one port besides
	// the KV-event ports below.
	Port string `koanf:"port"`
	// KVEventsPort is the name of the port of the engines' KV-cache
	// events publisher (vLLM's --kv-events-config endpoint, tcp://*:5557
	// by default) in the slices: an endpoint of a slice with it gets
	// engines[].kv_events tcp://address:port, and the gateway subscribes.
	// Default DefaultKVEventsPort ("kv-events"); a slice without it has
	// no subscription. Empty: never.
	KVEventsPort string `koanf:"kv_events_port"`
	// KVReplayPort is the name of the port of the engines' replay socket
	// (vLLM's replay_endpoint), engines[].kv_events_replay. Default
	// DefaultKVReplayPort ("kv-replay"). Empty: never.
	KVReplayPort string `koanf:"kv_replay_port"`
	// AddressType is the address family of the slices whose endpoints
	// become engines: AddressTypeIPv4 ("IPv4", the default),
	// AddressTypeIPv6 ("IPv6") or AddressTypeFQDN ("FQDN"). Slices of
	// another type are ignored, silently: a dual-stack Service has an
	// IPv4 and an IPv6 slice for the same pods, and taking both would
	// make each pod's engine depend on which slice sorts first.
	AddressType string `koanf:"address_type"`
	// Scheme is the engines' URL scheme, http (default) or https.
	Scheme string `koanf:"scheme"`
	// Names is how engines are named (the `engine` attribute of every
	// metric): NamesPod (default), NamesSliceAddress or
	// NamesServiceAddress. With NamesPod an endpoint that has no pod
	// targetRef (a slice written by hand or by another controller) is
	// named "<slice>/<address>" all the same.
	Names string `koanf:"names"`
	// Models, when set, are the models every discovered engine serves.
	// Else ModelsAnnotation, else ModelsLabel, else each engine's GET
	// /v1/models, refreshed every server.health.discovery_interval. Set at
	// most one of the three.
	Models []string `koanf:"models"`
	// ModelsAnnotation is an annotation key (a qualified name, such as
	// switchboard.io/models) of the slice holding a comma-separated list
	// of its engines' models. The EndpointSlice controller copies a
	// Service's labels to its slices but not its annotations: this works
	// on slices you manage yourself, or that a mirroring controller
	// annotates, not by annotating the Service.
	ModelsAnnotation string `koanf:"models_annotation"`
	// ModelsLabel is a label key (a qualified name) of the slice holding
	// its engines' one model; the EndpointSlice controller copies it from
	// the Service. A label value cannot hold "/" (63 characters at most,
	// alphanumerics, '-', '_' and '.'), so a Hugging Face id such as
	// meta-llama/Llama-3.1-8B does not fit a label: use the model's
	// served name (vllm --served-model-name), Models or /v1/models.
	ModelsLabel string `koanf:"models_label"`
	// MaxInFlight, APIKeyEnv and ProviderName are every discovered
	// engine's engines[].max_in_flight, api_key_env and provider_name
	// (its gen_ai.provider.name; discovered engines are self-hosted). [Start] fails
	// when APIKeyEnv names a variable that is unset or empty, as the
	// gateway does for a configured engine.
	MaxInFlight  int    `koanf:"max_in_flight"`
	APIKeyEnv    string `koanf:"api_key_env"`
	ProviderName string `koanf:"provider_name"`
	// RoleLabel is the pod label key (a qualified name) holding each
	// engine's prefill/decode role, engines[].role: "prefill", "decode",
	// "prefill-decode" or "both" (fleet.ParseRole). Default
	// DefaultRoleLabel, llm-d's "llm-d.ai/role". A pod without the label,
	// an endpoint without a pod targetRef, and a pod not (yet) in the
	// informer's cache are "both"; an unknown value is "both" too, warned
	// about once per pod. EndpointSlices do not carry pod labels, so with
	// RoleLabel or GroupLabel set discovery also watches the pods of each
	// watched namespace (list and watch on pods, [Config.Rules]; it keeps
	// only their name and these two labels). Empty: every engine is
	// "both" and pods are not read.
	RoleLabel string `koanf:"role_label"`
	// GroupLabel is the pod label key holding each engine's pairing group,
	// engines[].group (a prefill engine with a group pairs only with
	// decode engines of its group). Default empty: no group.
	GroupLabel string `koanf:"group_label"`
	// SyncTimeout bounds how long /ready waits for the informers' first
	// complete list; after it the gateway serves with the engines it has
	// (the configured ones, and what was listed) and logs it. Default 30 s.
	SyncTimeout time.Duration `koanf:"sync_timeout"`
	// Batch is how long discovery collects EndpointSlice changes before
	// applying them as one routing snapshot. Default 100 ms.
	Batch time.Duration `koanf:"batch"`
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{Namespaces: []string{}, Models: []string{}, AddressType: AddressTypeIPv4, Scheme: "http", Names: NamesPod,
		RoleLabel: DefaultRoleLabel, SyncTimeout: 30 * time.Second, Batch: 100 * time.Millisecond,
		KVEventsPort: DefaultKVEventsPort, KVReplayPort: DefaultKVReplayPort}
}

// DefaultKVEventsPort and DefaultKVReplayPort are the default
// [Config.KVEventsPort] and [Config.KVReplayPort]: the names of a Service's
// ports for vLLM's KV-cache events publisher and its replay socket.
const (
	DefaultKVEventsPort = "kv-events"
	DefaultKVReplayPort = "kv-replay"
)

// DefaultRoleLabel is the default [Config.RoleLabel]: the pod label llm-d
// sets on its model servers, "prefill", "decode" or "prefill-decode".
const DefaultRoleLabel = "llm-d.ai/role"

// readsPods reports whether discovery needs the pods' labels: RoleLabel
// or GroupLabel is set.
func (c Config) readsPods() bool { return c.RoleLabel != "" || c.GroupLabel != "" }

// ServiceNameLabel is the label the EndpointSlice controller sets on every
// slice to its Service's name (discovery.k8s.io/v1, LabelServiceName).
const ServiceNameLabel = "kubernetes.io/service-name"

// selector returns the slices' label selector: Selector and Service.
func (c Config) selector() (labels.Selector, error) {
	s := c.Selector
	if c.Service != "" {
		if s != "" {
			s += ","
		}
		s += ServiceNameLabel + "=" + c.Service
	}
	return labels.Parse(s)
}

// Validate reports every problem with an enabled c, joined.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("discovery.kubernetes."+format, a...))
	}
	if c.Service == "" && c.Selector == "" {
		bad("service or selector must be set (all slices of a namespace are not all engines)")
	} else if _, err := c.selector(); err != nil {
		bad("selector: %v", err)
	}
	if c.KVEventsPort != "" && (c.KVEventsPort == c.Port || c.KVEventsPort == c.KVReplayPort) {
		bad("kv_events_port %q must differ from port and kv_replay_port", c.KVEventsPort)
	}
	if c.KVReplayPort != "" && c.KVReplayPort == c.Port {
		bad("kv_replay_port %q must differ from port", c.KVReplayPort)
	}
	if c.Service != "" {
		if msgs := validation.IsDNS1035Label(c.Service); len(msgs) > 0 {
			bad("service %q: %s", c.Service, strings.Join(msgs, "; "))
		}
	}
	for _, ns := range c.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			bad("namespaces: %q: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if n := len(c.Namespaces); n != len(slices.Compact(slices.Sorted(slices.Values(c.Namespaces)))) {
		bad("namespaces: a namespace is listed twice")
	}
	switch c.AddressType {
	case AddressTypeIPv4, AddressTypeIPv6, AddressTypeFQDN:
	default:
		bad("address_type must be %s, %s or %s, got %q", AddressTypeIPv4, AddressTypeIPv6, AddressTypeFQDN, c.AddressType)
	}
	if c.Scheme != "http" && c.Scheme != "https" {
		bad("scheme must be http or https, got %q", c.Scheme)
	}
	switch c.Names {
	case NamesPod, NamesSliceAddress, NamesServiceAddress:
	default:
		bad("names must be %s, %s or %s, got %q", NamesPod, NamesSliceAddress, NamesServiceAddress, c.Names)
	}
	sources := 0
	for _, set := range []bool{len(c.Models) > 0, c.ModelsAnnotation != "", c.ModelsLabel != ""} {
		if set {
			sources++
		}
	}
	if sources > 1 {
		bad("models, models_annotation and models_label: set only one of them")
	}
	if c.ModelsAnnotation != "" {
		if msgs := validation.IsQualifiedName(c.ModelsAnnotation); len(msgs) > 0 {
			bad("models_annotation %q is not an annotation key: %s", c.ModelsAnnotation, strings.Join(msgs, "; "))
		}
	}
	if c.ModelsLabel != "" {
		if msgs := validation.IsQualifiedName(c.ModelsLabel); len(msgs) > 0 {
			bad("models_label %q is not a label key: %s", c.ModelsLabel, strings.Join(msgs, "; "))
		}
	}
	for _, m := range c.Models {
		if strings.TrimSpace(m) == "" {
			bad("models: empty model name")
		}
	}
	for _, l := range [...]struct{ key, v string }{{"role_label", c.RoleLabel}, {"group_label", c.GroupLabel}} {
		if l.v == "" {
			continue
		}
		if msgs := validation.IsQualifiedName(l.v); len(msgs) > 0 {
			bad("%s %q is not a label key: %s", l.key, l.v, strings.Join(msgs, "; "))
		}
	}
	if c.RoleLabel != "" && c.RoleLabel == c.GroupLabel {
		bad("role_label and group_label are both %q: a label holds one of them", c.RoleLabel)
	}
	if c.MaxInFlight < 0 {
		bad("max_in_flight must be >= 0, got %d", c.MaxInFlight)
	}
	if c.SyncTimeout <= 0 {
		bad("sync_timeout must be > 0, got %s", c.SyncTimeout)
	}
	if c.Batch < 0 {
		bad("batch must be >= 0, got %s", c.Batch)
	}
	return errors.Join(errs...)
}
