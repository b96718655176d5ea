package k8s

import (
	"net"
	"slices"
	"strconv"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// PodLabels returns the labels of the pod name in namespace ns, and false
// when the pod is not known. The map is the caller's to read only.
type PodLabels func(ns, name string) (map[string]string, bool)

// Engines returns the engines the slices describe under c, sorted by name,
// with one line per slice or endpoint left out saying why (no usable port,
// a name seen twice with another URL).
//
// Each engine's role and group (fleet.EngineConfig.Role and Group) come
// from the labels c.RoleLabel and c.GroupLabel of its endpoint's pod (the
// targetRef), looked up with pods: "prefill" or "decode" as the label
// says, "" (both) when the endpoint has no pod targetRef, pods is nil or
// does not know the pod, the label is missing, or its value is "both",
// "prefill-decode" or unknown. badRoles maps each pod ("<namespace>/<pod>")
// whose role label holds an unknown value to that value, for the caller to
// warn about.
//
// Only the slices of c.AddressType count; the others are skipped without a
// line (a dual-stack Service's other family). Every endpoint with an
// address is an engine. One that is ready (conditions.ready true or unset,
// which the API defines as ready) and not terminating takes requests; one
// that is not ready, or terminating, is Unready: it stays in the pool,
// draining (no new request; its requests in flight finish on it), and
// keeps its incarnation, so a readiness flap does not make a new one. An
// engine leaves the set only when its endpoint leaves the slice or the
// slice goes.
//
// The same endpoint in two slices (the EndpointSlice controller moving it)
// is one engine: a ready copy wins over an unready one, else the first
// slice by namespace and name. prefixNS names pods "<namespace>/<pod>"
// (several namespaces are watched). The result depends only on the
// slices' contents, never on their order, so every gateway replica builds
// the same list.
func Engines(c Config, list []*discoveryv1.EndpointSlice, prefixNS bool, pods PodLabels) (engines []fleet.DiscoveredEngine, skipped []string, badRoles map[string]string) {
	type candidate struct {
		de    fleet.DiscoveredEngine
		slice string // namespace/name
	}
	byName := map[string][]candidate{}
	var names []string
	sorted := slices.Clone(list)
	slices.SortFunc(sorted, func(a, b *discoveryv1.EndpointSlice) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, s := range sorted {
		if string(s.AddressType) != c.AddressType {
			continue
		}
		port, why := slicePort(c, s)
		if why != "" {
			if len(s.Endpoints) > 0 {
				skipped = append(skipped, "EndpointSlice "+s.Namespace+"/"+s.Name+" "+why+": its endpoints are left out")
			}
			continue
		}
		models := sliceModels(c, s)
		kvPort, replayPort := namedPort(s, c.KVEventsPort), namedPort(s, c.KVReplayPort)
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			addr := ep.Addresses[0] // the others are the same endpoint's (the API uses only the first)
			name := engineName(c, s, ep, addr, prefixNS)
			role, group, bad := podRole(c, s, ep, pods)
			if bad != "" {
				if badRoles == nil {
					badRoles = map[string]string{}
				}
				badRoles[podKey(s, ep)] = bad
			}
			de := fleet.DiscoveredEngine{
				EngineConfig: fleet.EngineConfig{
					Name:         name,
					URL:          c.Scheme + "://" + net.JoinHostPort(addr, strconv.Itoa(int(port))),
					Models:       models,
					APIKeyEnv:    c.APIKeyEnv,
					ProviderName: c.ProviderName,
					MaxInFlight:  c.MaxInFlight,
					Role:         role,
					Group:        group,
				},
				Unready: !usable(ep),
			}
			if kvPort > 0 {
				de.KVEvents = "tcp://" + net.JoinHostPort(addr, strconv.Itoa(int(kvPort)))
				if replayPort > 0 {
					de.KVEventsReplay = "tcp://" + net.JoinHostPort(addr, strconv.Itoa(int(replayPort)))
				}
			}
			if _, seen := byName[name]; !seen {
				names = append(names, name)
			}
			byName[name] = append(byName[name], candidate{de: de, slice: s.Namespace + "/" + s.Name})
		}
	}
	slices.Sort(names)
	engines = make([]fleet.DiscoveredEngine, 0, len(names))
	for _, name := range names {
		cands := byName[name] // in slice order
		win := 0
		if i := slices.IndexFunc(cands, func(c candidate) bool { return !c.de.Unready }); i >= 0 {
			win = i
		}
		w := cands[win]
		engines = append(engines, w.de)
		for i, o := range cands {
			if i == win || o.de.URL == w.de.URL {
				continue
			}
			state := ""
			if !w.de.Unready && o.de.Unready {
				state = " ready"
			}
			skipped = append(skipped, "endpoint "+name+" at "+o.de.URL+" in EndpointSlice "+o.slice+
				" left out: EndpointSlice "+w.slice+" has it"+state+" at "+w.de.URL)
		}
	}
	return engines, skipped, badRoles
}

// podKey is "<namespace>/<pod>" of ep's pod targetRef (its namespace, else
// the slice's).
func podKey(s *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint) string {
	ns := ep.TargetRef.Namespace
	if ns == "" {
		ns = s.Namespace
	}
	return ns + "/" + ep.TargetRef.Name
}

// podRole returns the role and group of endpoint ep of slice s, from its
// pod's labels: role "prefill" or "decode", or "" for both (see
// [Engines]); bad is the role label's value when it names no role.
func podRole(c Config, s *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint, pods PodLabels) (role, group, bad string) {
	if pods == nil || !c.readsPods() || ep.TargetRef == nil || ep.TargetRef.Kind != "Pod" || ep.TargetRef.Name == "" {
		return "", "", ""
	}
	ns := ep.TargetRef.Namespace
	if ns == "" {
		ns = s.Namespace
	}
	ls, ok := pods(ns, ep.TargetRef.Name)
	if !ok {
		return "", "", ""
	}
	if c.GroupLabel != "" {
		group = ls[c.GroupLabel]
	}
	if c.RoleLabel == "" {
		return "", group, ""
	}
	v, set := ls[c.RoleLabel]
	if !set {
		return "", group, ""
	}
	r, err := fleet.ParseRole(v)
	switch {
	case err != nil:
		return "", group, v
	case r == fleet.RoleBoth:
		return "", group, ""
	}
	return r.String(), group, ""
}

// usable reports whether an endpoint may receive new requests: ready (nil
// means ready, discovery.k8s.io/v1 EndpointConditions) and not terminating.
func usable(ep discoveryv1.Endpoint) bool {
	c := ep.Conditions
	return (c.Ready == nil || *c.Ready) && (c.Terminating == nil || !*c.Terminating)
}

// slicePort returns the slice's engine port: the one named c.Port, or its
// only port when c.Port is empty; else why there is none, naming the
// ports the slice has.
func slicePort(c Config, s *discoveryv1.EndpointSlice) (int32, string) {
	var found *discoveryv1.EndpointPort
	for i := range s.Ports {
		p := &s.Ports[i]
		if c.Port == "" && p.Name != nil && *p.Name != "" && (*p.Name == c.KVEventsPort || *p.Name == c.KVReplayPort) {
			continue // the KV-event ports are not the engine's
		}
		if c.Port == "" {
			if found != nil {
				return 0, "has " + strconv.Itoa(len(s.Ports)) + " ports (" + describePorts(s.Ports) +
					") and discovery.kubernetes.port does not name one"
			}
			found = p
			continue
		}
		if p.Name != nil && *p.Name == c.Port {
			found = p
			break
		}
	}
	switch {
	case found == nil && c.Port == "":
		return 0, "has no port"
	case found == nil:
		if len(s.Ports) == 0 {
			return 0, "has no port named " + strconv.Quote(c.Port) + " (it has no ports)"
		}
		return 0, "has no port named " + strconv.Quote(c.Port) + " (its ports: " + describePorts(s.Ports) + ")"
	case found.Port == nil || *found.Port <= 0:
		return 0, "has no port number for port " + describePorts([]discoveryv1.EndpointPort{*found})
	}
	return *found.Port, ""
}

// namedPort returns the number of the slice's port called name, 0 when
// name is empty or the slice has no such port with a number.
func namedPort(s *discoveryv1.EndpointSlice, name string) int32 {
	if name == "" {
		return 0
	}
	for _, p := range s.Ports {
		if p.Name != nil && *p.Name == name && p.Port != nil && *p.Port > 0 {
			return *p.Port
		}
	}
	return 0
}

// describePorts lists ports for an operator: "http" 8000, unnamed 9090.
func describePorts(ports []discoveryv1.EndpointPort) string {
	out := make([]string, 0, len(ports))
	for _, p := range ports {
		d := "unnamed"
		if p.Name != nil && *p.Name != "" {
			d = strconv.Quote(*p.Name)
		}
		if p.Port != nil {
			d += " " + strconv.Itoa(int(*p.Port))
		}
		out = append(out, d)
	}
	return strings.Join(out, ", ")
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
