package k8s

import (
	"net"
	"slices"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/switchboard-gw/switchboard/gateway"
)

// Engines returns the engines the slices describe under c, sorted by name,
// with one line per endpoint left out saying why (no usable port, a name
// seen twice with another URL). An endpoint is an engine when it is ready
// (conditions.ready true or unset, which the API defines as ready) and not
// terminating; a not-ready or terminating endpoint, or one whose slice is
// gone, is not, and the pool drains it: it takes no new request and its
// requests in flight finish on it. The same endpoint in two slices (the
// EndpointSlice controller moving it) is one engine. prefixNS names pods
// "<namespace>/<pod>" (several namespaces are watched). The result
// depends only on the slices' contents, never on their order, so every
// gateway replica builds the same list.
func Engines(c Config, list []*discoveryv1.EndpointSlice, prefixNS bool) (engines []gateway.EngineConfig, skipped []string) {
	byName := map[string]gateway.EngineConfig{}
	sorted := slices.Clone(list)
	slices.SortFunc(sorted, func(a, b *discoveryv1.EndpointSlice) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, s := range sorted {
		port, ok := slicePort(c, s)
		if !ok {
			if len(s.Endpoints) > 0 {
				why := "does not have exactly one port"
				if c.Port != "" {
					why = "has no port named " + strconv.Quote(c.Port)
				}
				skipped = append(skipped, "EndpointSlice "+s.Namespace+"/"+s.Name+" "+why+": its endpoints are left out")
			}
			continue
		}
		models := sliceModels(c, s)
		for _, ep := range s.Endpoints {
			if !usable(ep) || len(ep.Addresses) == 0 {
				continue
			}
			addr := ep.Addresses[0] // the others are the same endpoint's (the API uses only the first)
			name := engineName(c, s, ep, addr, prefixNS)
			ec := gateway.EngineConfig{
				Name:        name,
				URL:         c.Scheme + "://" + net.JoinHostPort(addr, strconv.Itoa(int(port))),
				Models:      models,
				APIKeyEnv:   c.APIKeyEnv,
				Provider:    c.Provider,
				MaxInFlight: c.MaxInFlight,
			}
			if prev, dup := byName[name]; dup {
				if prev.URL != ec.URL {
					skipped = append(skipped, "endpoint "+name+" at "+ec.URL+" in EndpointSlice "+s.Namespace+"/"+s.Name+
						" left out: another slice has it at "+prev.URL)
				}
				continue
			}
			byName[name] = ec
		}
	}
	engines = make([]gateway.EngineConfig, 0, len(byName))
	for _, ec := range byName {
		engines = append(engines, ec)
	}
	slices.SortFunc(engines, func(a, b gateway.EngineConfig) int { return strings.Compare(a.Name, b.Name) })
	return engines, skipped
}

// usable reports whether an endpoint may receive new requests: ready (nil
// means ready, discovery.k8s.io/v1 EndpointConditions) and not terminating.
func usable(ep discoveryv1.Endpoint) bool {
	c := ep.Conditions
	return (c.Ready == nil || *c.Ready) && (c.Terminating == nil || !*c.Terminating)
}

// slicePort returns the slice's engine port: the one named c.Port, or its
// only port when c.Port is empty.
func slicePort(c Config, s *discoveryv1.EndpointSlice) (int32, bool) {
	var found *discoveryv1.EndpointPort
	for i := range s.Ports {
		p := &s.Ports[i]
		if c.Port == "" {
			if found != nil {
				return 0, false // several ports and none named
			}
			found = p
			continue
		}
		if p.Name != nil && *p.Name == c.Port {
			found = p
			break
		}
	}
	if found == nil || found.Port == nil || *found.Port <= 0 {
		return 0, false
	}
	return *found.Port, true
}

// sliceModels returns the models c gives every engine of s, nil when they
// are to be learned from each engine's /v1/models.
func sliceModels(c Config, s *discoveryv1.EndpointSlice) []string {
	var raw string
	switch {
	case len(c.Models) > 0:
		return slices.Clone(c.Models)
	case c.ModelsAnnotation != "":
		raw = s.Annotations[c.ModelsAnnotation]
	case c.ModelsLabel != "":
		raw = s.Labels[c.ModelsLabel]
	}
	var ms []string
	for m := range strings.SplitSeq(raw, ",") {
		if m = strings.TrimSpace(m); m != "" && !slices.Contains(ms, m) {
			ms = append(ms, m)
		}
	}
	return ms
}

// engineName names the engine of endpoint ep (address addr) of slice s.
func engineName(c Config, s *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint, addr string, prefixNS bool) string {
	ns := ""
	if prefixNS {
		ns = s.Namespace + "/"
	}
	switch {
	case c.Names == NamesPod && ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" && ep.TargetRef.Name != "":
		return ns + ep.TargetRef.Name
	case c.Names == NamesServiceAddress && s.Labels[ServiceNameLabel] != "":
		return ns + s.Labels[ServiceNameLabel] + "/" + addr
	}
	return ns + s.Name + "/" + addr
}
