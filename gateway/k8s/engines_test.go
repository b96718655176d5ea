package k8s

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// testConfig is an enabled, valid Config picking the slices of Service
// "vllm", with the defaults.
func testConfig() Config {
	c := DefaultConfig()
	c.Enabled = true
	c.Service = "vllm"
	return c
}

// eslice returns the EndpointSlice ns/name of Service service ("" for no
// service label) with ports and endpoints.
func eslice(ns, name, service string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
	if service != "" {
		s.Labels[ServiceNameLabel] = service
	}
	return s
}

// port returns an EndpointPort; name "" leaves it unnamed.
func port(name string, n int32) discoveryv1.EndpointPort {
	p := discoveryv1.EndpointPort{Port: new(n)}
	if name != "" {
		p.Name = new(name)
	}
	return p
}

// http8000 is the usual one port of the slices: "http" 8000.
func http8000() []discoveryv1.EndpointPort { return []discoveryv1.EndpointPort{port("http", 8000)} }

// podEP returns an endpoint of pod at addrs, conditions unset (ready).
func podEP(pod string, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod}}
}

// withConditions returns ep with conditions c.
func withConditions(ep discoveryv1.Endpoint, c discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	ep.Conditions = c
	return ep
}

// eng returns the ready engine the defaults of testConfig give name at
// url.
func eng(name, url string, models ...string) fleet.DiscoveredEngine {
	return fleet.DiscoveredEngine{EngineConfig: fleet.EngineConfig{Name: name, URL: url, Models: models}}
}

// unready returns de marked Unready.
func unready(de fleet.DiscoveredEngine) fleet.DiscoveredEngine {
	de.Unready = true
	return de
}

// family returns s with address type t.
func family(s *discoveryv1.EndpointSlice, t discoveryv1.AddressType) *discoveryv1.EndpointSlice {
	s.AddressType = t
	return s
}

// sameEngines reports whether got and want are equal, nil and empty alike.
func sameEngines(got, want []fleet.DiscoveredEngine) bool {
	if len(got) == 0 && len(want) == 0 {
		return true
	}
	return reflect.DeepEqual(got, want)
}

func TestEngines(t *testing.T) {
	const ns = "default"
	tests := []struct {
		name     string
		cfg      func(*Config) // applied to testConfig; nil: as is
		slices   []*discoveryv1.EndpointSlice
		prefixNS bool
		want     []fleet.DiscoveredEngine
		// skipped are the left-out lines, each given by substrings it
		// must contain.
		skipped [][]string
	}{
		{
			name:   "ready unset is ready",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))},
			want:   []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000")},
		},
		{
			name: "ready true is ready, ready false is unready",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(),
				withConditions(podEP("vllm-0", "10.0.0.1"), discoveryv1.EndpointConditions{Ready: new(true)}),
				withConditions(podEP("vllm-1", "10.0.0.2"), discoveryv1.EndpointConditions{Ready: new(false)}),
				withConditions(podEP("vllm-2", "10.0.0.3"), discoveryv1.EndpointConditions{Ready: new(false), Serving: new(true)}),
			)},
			want: []fleet.DiscoveredEngine{
				eng("vllm-0", "http://10.0.0.1:8000"),
				unready(eng("vllm-1", "http://10.0.0.2:8000")),
				unready(eng("vllm-2", "http://10.0.0.3:8000")),
			},
		},
		{
			name: "terminating is unready, whether ready or serving",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(),
				withConditions(podEP("vllm-0", "10.0.0.1"), discoveryv1.EndpointConditions{Ready: new(false), Terminating: new(true)}),
				withConditions(podEP("vllm-1", "10.0.0.2"), discoveryv1.EndpointConditions{Serving: new(true), Terminating: new(true)}),
				withConditions(podEP("vllm-2", "10.0.0.3"), discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(true)}),
				withConditions(podEP("vllm-3", "10.0.0.4"), discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)}),
			)},
			want: []fleet.DiscoveredEngine{
				unready(eng("vllm-0", "http://10.0.0.1:8000")),
				unready(eng("vllm-1", "http://10.0.0.2:8000")),
				unready(eng("vllm-2", "http://10.0.0.3:8000")),
				eng("vllm-3", "http://10.0.0.4:8000"),
			},
		},
		{
			name: "an endpoint without addresses is left out silently",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(),
				podEP("vllm-0"), podEP("vllm-1", "10.0.0.2"))},
			want: []fleet.DiscoveredEngine{eng("vllm-1", "http://10.0.0.2:8000")},
		},
		{
			name:   "several addresses: the first",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.7", "10.0.0.8"))},
			want:   []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.7:8000")},
		},
		{
			name:   "IPv6 address in brackets",
			cfg:    func(c *Config) { c.Names = NamesSliceAddress; c.AddressType = AddressTypeIPv6 },
			slices: []*discoveryv1.EndpointSlice{family(eslice(ns, "vllm-v6", "vllm", http8000(), podEP("vllm-0", "fd00::1")), discoveryv1.AddressTypeIPv6)},
			want:   []fleet.DiscoveredEngine{eng("vllm-v6/fd00::1", "http://[fd00::1]:8000")},
		},
		{
			// The IPv6 slice sorts first: taking both families, the
			// first slice by name would win.
			name: "dual stack: IPv4 by default, the IPv6 slice ignored silently",
			slices: []*discoveryv1.EndpointSlice{
				family(eslice(ns, "vllm-a6", "vllm", http8000(), podEP("vllm-0", "fd00::1"), podEP("vllm-1", "fd00::2")), discoveryv1.AddressTypeIPv6),
				eslice(ns, "vllm-b4", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000"), eng("vllm-1", "http://10.0.0.2:8000")},
		},
		{
			name: "dual stack: address_type IPv6 takes the IPv6 slice",
			cfg:  func(c *Config) { c.AddressType = AddressTypeIPv6 },
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-a4", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2")),
				family(eslice(ns, "vllm-b6", "vllm", http8000(), podEP("vllm-0", "fd00::1"), podEP("vllm-1", "fd00::2")), discoveryv1.AddressTypeIPv6),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://[fd00::1]:8000"), eng("vllm-1", "http://[fd00::2]:8000")},
		},
		{
			name: "address_type FQDN",
			cfg:  func(c *Config) { c.AddressType = AddressTypeFQDN },
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-a4", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
				family(eslice(ns, "vllm-ext", "vllm", http8000(), discoveryv1.Endpoint{Addresses: []string{"vllm.example.com"}}), discoveryv1.AddressTypeFQDN),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-ext/vllm.example.com", "http://vllm.example.com:8000")},
		},
		{
			name: "a slice of another address type says nothing, even without a usable port",
			slices: []*discoveryv1.EndpointSlice{
				family(eslice(ns, "vllm-a6", "vllm", []discoveryv1.EndpointPort{port("http", 8000), port("metrics", 9090)}, podEP("vllm-0", "fd00::1")), discoveryv1.AddressTypeIPv6),
			},
		},
		{
			name: "port by name among several",
			cfg:  func(c *Config) { c.Port = "http" },
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm",
				[]discoveryv1.EndpointPort{port("metrics", 9090), port("http", 8000), port("", 7000)},
				podEP("vllm-0", "10.0.0.1"))},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000")},
		},
		{
			name: "the only port, unnamed, no port configured",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm",
				[]discoveryv1.EndpointPort{port("", 8080)}, podEP("vllm-0", "10.0.0.1"))},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8080")},
		},
		{
			name: "several ports and no port configured: the slice is left out",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", []discoveryv1.EndpointPort{port("http", 8000), port("metrics", 9090)}, podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "vllm-2", "vllm", http8000(), podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-1", "http://10.0.0.2:8000")},
			skipped: [][]string{{"EndpointSlice default/vllm-1 has 2 ports", `"http" 8000, "metrics" 9090`,
				"discovery.kubernetes.port does not name one", "left out"}},
		},
		{
			name: "the named port is missing: the slice is left out, its ports listed",
			cfg:  func(c *Config) { c.Port = "http" },
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", []discoveryv1.EndpointPort{port("grpc", 9000), port("", 9090)}, podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "vllm-2", "vllm", nil, podEP("vllm-1", "10.0.0.2")),
			},
			skipped: [][]string{
				{"EndpointSlice default/vllm-1", `has no port named "http" (its ports: "grpc" 9000, unnamed 9090)`, "left out"},
				{"EndpointSlice default/vllm-2", `has no port named "http" (it has no ports)`, "left out"},
			},
		},
		{
			name: "no port at all and no port configured: the slice is left out",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", nil, podEP("vllm-0", "10.0.0.1")),
			},
			skipped: [][]string{{"EndpointSlice default/vllm-1 has no port", "left out"}},
		},
		{
			name: "no port number: the slice is left out",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", []discoveryv1.EndpointPort{{Name: new("http")}}, podEP("vllm-0", "10.0.0.1")),
			},
			skipped: [][]string{{"EndpointSlice default/vllm-1 has no port number for port \"http\"", "left out"}},
		},
		{
			name: "a slice without a usable port and without endpoints says nothing",
			cfg:  func(c *Config) { c.Port = "http" },
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", nil),
				eslice(ns, "vllm-2", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000")},
		},
		{
			name: "names pod; no pod reference or not a pod: slice-address",
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(),
				podEP("vllm-0", "10.0.0.1"),
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}},
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.3"}, TargetRef: &corev1.ObjectReference{Kind: "Node", Name: "node-1"}},
				discoveryv1.Endpoint{Addresses: []string{"10.0.0.4"}, TargetRef: &corev1.ObjectReference{Kind: "Pod"}},
			)},
			want: []fleet.DiscoveredEngine{
				eng("vllm-0", "http://10.0.0.1:8000"),
				eng("vllm-1/10.0.0.2", "http://10.0.0.2:8000"),
				eng("vllm-1/10.0.0.3", "http://10.0.0.3:8000"),
				eng("vllm-1/10.0.0.4", "http://10.0.0.4:8000"),
			},
		},
		{
			name:   "names slice-address",
			cfg:    func(c *Config) { c.Names = NamesSliceAddress },
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-abcde", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))},
			want:   []fleet.DiscoveredEngine{eng("vllm-abcde/10.0.0.1", "http://10.0.0.1:8000")},
		},
		{
			name: "names service-address; no service label: slice-address",
			cfg:  func(c *Config) { c.Names = NamesServiceAddress; c.Service = ""; c.Selector = "app=vllm" },
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-abcde", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "manual", "", http8000(), podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{
				eng("manual/10.0.0.2", "http://10.0.0.2:8000"),
				eng("vllm/10.0.0.1", "http://10.0.0.1:8000"),
			},
		},
		{
			name: "prefixNS",
			slices: []*discoveryv1.EndpointSlice{
				eslice("team-b", "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.1.1")),
				eslice("team-a", "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"), discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}}),
			},
			prefixNS: true,
			want: []fleet.DiscoveredEngine{
				eng("team-a/vllm-0", "http://10.0.0.1:8000"),
				eng("team-a/vllm-1/10.0.0.2", "http://10.0.0.2:8000"),
				eng("team-b/vllm-0", "http://10.0.1.1:8000"),
			},
		},
		{
			name: "prefixNS with service-address",
			cfg:  func(c *Config) { c.Names = NamesServiceAddress },
			slices: []*discoveryv1.EndpointSlice{
				eslice("team-a", "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
			},
			prefixNS: true,
			want:     []fleet.DiscoveredEngine{eng("team-a/vllm/10.0.0.1", "http://10.0.0.1:8000")},
		},
		{
			name: "models from the configuration",
			cfg:  func(c *Config) { c.Models = []string{"llama-3-8b", "qwen"} },
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(),
				podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2"))},
			want: []fleet.DiscoveredEngine{
				eng("vllm-0", "http://10.0.0.1:8000", "llama-3-8b", "qwen"),
				eng("vllm-1", "http://10.0.0.2:8000", "llama-3-8b", "qwen"),
			},
		},
		{
			name: "models from the annotation: trimmed, deduplicated, empty items dropped; absent: nil",
			cfg:  func(c *Config) { c.ModelsAnnotation = "switchboard.io/models" },
			slices: []*discoveryv1.EndpointSlice{
				func() *discoveryv1.EndpointSlice {
					s := eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))
					s.Annotations = map[string]string{"switchboard.io/models": " llama-3-8b, qwen ,,llama-3-8b, , mistral"}
					return s
				}(),
				eslice(ns, "vllm-2", "vllm", http8000(), podEP("vllm-1", "10.0.0.2")),
				func() *discoveryv1.EndpointSlice {
					s := eslice(ns, "vllm-3", "vllm", http8000(), podEP("vllm-2", "10.0.0.3"))
					s.Annotations = map[string]string{"switchboard.io/models": " , "}
					return s
				}(),
			},
			want: []fleet.DiscoveredEngine{
				eng("vllm-0", "http://10.0.0.1:8000", "llama-3-8b", "qwen", "mistral"),
				eng("vllm-1", "http://10.0.0.2:8000"),
				eng("vllm-2", "http://10.0.0.3:8000"),
			},
		},
		{
			name: "models from the label",
			cfg:  func(c *Config) { c.ModelsLabel = "switchboard.io/model" },
			slices: []*discoveryv1.EndpointSlice{
				func() *discoveryv1.EndpointSlice {
					s := eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))
					s.Labels["switchboard.io/model"] = "llama-3-8b"
					return s
				}(),
				eslice(ns, "vllm-2", "vllm", http8000(), podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{
				eng("vllm-0", "http://10.0.0.1:8000", "llama-3-8b"),
				eng("vllm-1", "http://10.0.0.2:8000"),
			},
		},
		{
			name: "the same endpoint in two slices at the same URL: one engine",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-2", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000"), eng("vllm-1", "http://10.0.0.2:8000")},
		},
		{
			name: "the same endpoint in two slices, unready in the first: the ready one",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-b", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "vllm-a", "vllm", http8000(), withConditions(podEP("vllm-0", "10.0.0.1"), discoveryv1.EndpointConditions{Ready: new(false)})),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000")},
		},
		{
			name: "the same endpoint unready in both slices: unready",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-b", "vllm", http8000(), withConditions(podEP("vllm-0", "10.0.0.1"), discoveryv1.EndpointConditions{Terminating: new(true)})),
				eslice(ns, "vllm-a", "vllm", http8000(), withConditions(podEP("vllm-0", "10.0.0.1"), discoveryv1.EndpointConditions{Ready: new(false)})),
			},
			want: []fleet.DiscoveredEngine{unready(eng("vllm-0", "http://10.0.0.1:8000"))},
		},
		{
			name: "the same name at another URL, unready in the first slice: the ready one wins",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-b", "vllm", http8000(), podEP("vllm-0", "10.0.0.9")),
				eslice(ns, "vllm-a", "vllm", http8000(), withConditions(podEP("vllm-0", "10.0.0.1"), discoveryv1.EndpointConditions{Terminating: new(true)})),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.9:8000")},
			skipped: [][]string{{"endpoint vllm-0 at http://10.0.0.1:8000 in EndpointSlice default/vllm-a left out",
				"EndpointSlice default/vllm-b has it ready at http://10.0.0.9:8000"}},
		},
		{
			name: "the same name in two slices at another URL: the first slice by name wins",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-b", "vllm", http8000(), podEP("vllm-0", "10.0.0.9")),
				eslice(ns, "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
			},
			want: []fleet.DiscoveredEngine{eng("vllm-0", "http://10.0.0.1:8000")},
			skipped: [][]string{{"endpoint vllm-0 at http://10.0.0.9:8000 in EndpointSlice default/vllm-b left out",
				"EndpointSlice default/vllm-a has it at http://10.0.0.1:8000"}},
		},
		{
			name: "sorted by name",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-c", "10.0.0.3"), podEP("vllm-a", "10.0.0.1")),
				eslice(ns, "vllm-0", "vllm", http8000(), podEP("vllm-d", "10.0.0.4"), podEP("vllm-b", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{
				eng("vllm-a", "http://10.0.0.1:8000"),
				eng("vllm-b", "http://10.0.0.2:8000"),
				eng("vllm-c", "http://10.0.0.3:8000"),
				eng("vllm-d", "http://10.0.0.4:8000"),
			},
		},
		{
			name: "engine settings carried",
			cfg: func(c *Config) {
				c.Scheme = "https"
				c.MaxInFlight = 32
				c.APIKeyEnv = "VLLM_API_KEY"
				c.ProviderName = "llm-d"
				c.Models = []string{"llama-3-8b"}
			},
			slices: []*discoveryv1.EndpointSlice{eslice(ns, "vllm-1", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))},
			want: []fleet.DiscoveredEngine{{EngineConfig: fleet.EngineConfig{Name: "vllm-0", URL: "https://10.0.0.1:8000",
				Models: []string{"llama-3-8b"}, APIKeyEnv: "VLLM_API_KEY", ProviderName: "llm-d", MaxInFlight: 32}}},
		},
		{
			name: "kv-events and kv-replay ports: the subscription endpoints, not the engine's port",
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", []discoveryv1.EndpointPort{port("kv-replay", 5558), port("http", 8000), port("kv-events", 5557)},
					podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "vllm-2", "vllm", []discoveryv1.EndpointPort{port("http", 8000), port("kv-events", 5557)},
					podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{
				{EngineConfig: fleet.EngineConfig{Name: "vllm-0", URL: "http://10.0.0.1:8000", KVEvents: "tcp://10.0.0.1:5557", KVEventsReplay: "tcp://10.0.0.1:5558"}},
				{EngineConfig: fleet.EngineConfig{Name: "vllm-1", URL: "http://10.0.0.2:8000", KVEvents: "tcp://10.0.0.2:5557"}},
			},
		},
		{
			name: "kv ports renamed; the default names then count as engine ports",
			cfg:  func(c *Config) { c.KVEventsPort, c.KVReplayPort = "zmq", "" },
			slices: []*discoveryv1.EndpointSlice{
				eslice(ns, "vllm-1", "vllm", []discoveryv1.EndpointPort{port("http", 8000), port("zmq", 6000)}, podEP("vllm-0", "10.0.0.1")),
				eslice(ns, "vllm-2", "vllm", []discoveryv1.EndpointPort{port("http", 8000), port("kv-replay", 5558)}, podEP("vllm-1", "10.0.0.2")),
			},
			want: []fleet.DiscoveredEngine{
				{EngineConfig: fleet.EngineConfig{Name: "vllm-0", URL: "http://10.0.0.1:8000", KVEvents: "tcp://10.0.0.1:6000"}},
			},
			skipped: [][]string{{"vllm-2", "has 2 ports", "does not name one"}},
		},
		{
			name: "no slices",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			in := slices.Clone(tt.slices)
			got, skipped, _ := Engines(cfg, in, tt.prefixNS, nil)
			if !sameEngines(got, tt.want) {
				t.Errorf("engines:\n got %+v\nwant %+v", got, tt.want)
			}
			if !slices.Equal(in, tt.slices) {
				t.Errorf("Engines reordered its input")
			}
			if len(skipped) != len(tt.skipped) {
				t.Fatalf("skipped %q, want %d lines", skipped, len(tt.skipped))
			}
			for i, line := range skipped {
				for _, sub := range tt.skipped[i] {
					if !strings.Contains(line, sub) {
						t.Errorf("skipped line %q does not contain %q", line, sub)
					}
				}
			}
		})
	}
}

// TestEnginesModelsNotShared checks that the engines do not alias
// Config.Models. (The engines of one slice share one list, which the
// gateway clones before keeping.)
func TestEnginesModelsNotShared(t *testing.T) {
	cfg := testConfig()
	cfg.Models = []string{"llama-3-8b"}
	got, _, _ := Engines(cfg, []*discoveryv1.EndpointSlice{eslice("default", "vllm-1", "vllm", http8000(),
		podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2"))}, false, nil)
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	got[0].Models[0] = "changed"
	if cfg.Models[0] != "llama-3-8b" {
		t.Errorf("Config.Models aliased: %q", cfg.Models)
	}
}

// TestEnginesOrderIndependent shuffles the slices: every gateway replica
// must build the same engines and the same left-out lines whatever order
// its informers list them in.
func TestEnginesOrderIndependent(t *testing.T) {
	cfg := testConfig()
	var in []*discoveryv1.EndpointSlice
	for i := range 8 {
		ns := []string{"team-a", "team-b"}[i%2]
		var eps []discoveryv1.Endpoint
		for j := range 4 {
			pod := fmt.Sprintf("vllm-%d", (i+j)%6) // pods shared between slices
			addr := fmt.Sprintf("10.0.%d.%d", (i+j)%6, i%3)
			ep := podEP(pod, addr)
			if j == 3 {
				ep.Conditions.Ready = new(i%2 == 0)
			}
			eps = append(eps, ep)
		}
		if i%2 == 1 {
			// A pod unready in every slice, at another address in each.
			eps = append(eps, withConditions(podEP("vllm-draining", fmt.Sprintf("10.1.0.%d", i)), discoveryv1.EndpointConditions{Terminating: new(true)}))
		}
		ports := http8000()
		if i == 5 {
			ports = append(ports, port("metrics", 9090))
		}
		in = append(in, eslice(ns, fmt.Sprintf("vllm-%c", 'a'+i), "vllm", ports, eps...))
		if i%3 == 0 {
			// A dual-stack twin of the same pods, at other addresses.
			v6 := slices.Clone(eps)
			for j := range v6 {
				v6[j].Addresses = []string{fmt.Sprintf("fd00::%d:%d", i, j)}
			}
			in = append(in, family(eslice(ns, fmt.Sprintf("vllm-%c6", 'a'+i), "vllm", ports, v6...), discoveryv1.AddressTypeIPv6))
		}
	}
	for _, prefixNS := range []bool{false, true} {
		want, wantSkipped, _ := Engines(cfg, in, prefixNS, nil)
		if len(want) == 0 || len(wantSkipped) == 0 {
			t.Fatalf("the input should give engines and left-out lines: %+v, %q", want, wantSkipped)
		}
		if !slices.ContainsFunc(want, func(de fleet.DiscoveredEngine) bool { return de.Unready }) ||
			!slices.ContainsFunc(want, func(de fleet.DiscoveredEngine) bool { return !de.Unready }) {
			t.Fatalf("the input should give ready and unready engines: %+v", want)
		}
		for _, de := range want {
			if strings.Contains(de.URL, "[") {
				t.Fatalf("an IPv6 engine with address_type IPv4: %+v", de)
			}
		}
		r := rand.New(rand.NewPCG(1, 2))
		for i := range 50 {
			shuffled := slices.Clone(in)
			r.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
			got, skipped, _ := Engines(cfg, shuffled, prefixNS, nil)
			if !reflect.DeepEqual(got, want) || !slices.Equal(skipped, wantSkipped) {
				t.Fatalf("prefixNS %v, shuffle %d: got %+v, %q; want %+v, %q", prefixNS, i, got, skipped, want, wantSkipped)
			}
		}
	}
}
