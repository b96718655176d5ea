package k8s

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// roleEng returns eng(name, url) with role and group.
func roleEng(name, url, role, group string) fleet.DiscoveredEngine {
	de := eng(name, url)
	de.Role, de.Group = role, group
	return de
}

// pod returns pod ns/name with labels (key, value, key, value, ...).
func pod(ns, name string, kv ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}}}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Labels[kv[i]] = kv[i+1]
	}
	return p
}

func TestEnginesRoles(t *testing.T) {
	const role, group = "llm-d.ai/role", "example.com/rack"
	known := map[string]map[string]string{
		"default/p":     {role: "prefill", group: "r1"},
		"default/d":     {role: "decode"},
		"default/pd":    {role: "prefill-decode", group: "r2"},
		"default/both":  {role: "both"},
		"default/none":  {"app": "vllm"},
		"default/bogus": {role: "Prefill"},
		"default/empty": {role: ""},
		"other/x":       {role: "decode"},
	}
	lookup := func(ns, name string) (map[string]string, bool) {
		ls, ok := known[ns+"/"+name]
		return ls, ok
	}
	withNS := func(ep discoveryv1.Endpoint, ns string) discoveryv1.Endpoint {
		ep.TargetRef.Namespace = ns
		return ep
	}
	noRef := discoveryv1.Endpoint{Addresses: []string{"10.0.0.9"}}
	tests := []struct {
		name     string
		cfg      func(*Config)
		ep       discoveryv1.Endpoint
		noLookup bool // Engines gets no pod label lookup
		want     fleet.DiscoveredEngine
		badRoles map[string]string
	}{
		{name: "prefill with a group", ep: podEP("p", "10.0.0.1"), want: roleEng("p", "http://10.0.0.1:8000", "prefill", "r1")},
		{name: "decode", ep: podEP("d", "10.0.0.1"), want: roleEng("d", "http://10.0.0.1:8000", "decode", "")},
		{name: "prefill-decode is both", ep: podEP("pd", "10.0.0.1"), want: roleEng("pd", "http://10.0.0.1:8000", "", "r2")},
		{name: "both", ep: podEP("both", "10.0.0.1"), want: roleEng("both", "http://10.0.0.1:8000", "", "")},
		{name: "no role label", ep: podEP("none", "10.0.0.1"), want: roleEng("none", "http://10.0.0.1:8000", "", "")},
		{name: "empty role label", ep: podEP("empty", "10.0.0.1"), want: roleEng("empty", "http://10.0.0.1:8000", "", "")},
		{name: "unknown value is both, reported", ep: podEP("bogus", "10.0.0.1"),
			want: roleEng("bogus", "http://10.0.0.1:8000", "", ""), badRoles: map[string]string{"default/bogus": "Prefill"}},
		{name: "pod not known", ep: podEP("new", "10.0.0.1"), want: roleEng("new", "http://10.0.0.1:8000", "", "")},
		{name: "no pod targetRef", ep: noRef, want: roleEng("vllm-a/10.0.0.9", "http://10.0.0.9:8000", "", "")},
		{name: "targetRef namespace", ep: withNS(podEP("x", "10.0.0.1"), "other"), want: roleEng("x", "http://10.0.0.1:8000", "decode", "")},
		{name: "no lookup", ep: podEP("p", "10.0.0.1"), noLookup: true, want: roleEng("p", "http://10.0.0.1:8000", "", "")},
		{name: "role label off", cfg: func(c *Config) { c.RoleLabel = "" }, ep: podEP("p", "10.0.0.1"),
			want: roleEng("p", "http://10.0.0.1:8000", "", "r1")},
		{name: "group label off", cfg: func(c *Config) { c.GroupLabel = "" }, ep: podEP("p", "10.0.0.1"),
			want: roleEng("p", "http://10.0.0.1:8000", "prefill", "")},
		{name: "both labels off", cfg: func(c *Config) { c.RoleLabel, c.GroupLabel = "", "" }, ep: podEP("bogus", "10.0.0.1"),
			want: roleEng("bogus", "http://10.0.0.1:8000", "", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.GroupLabel = group
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			pods := lookup
			if tt.noLookup {
				pods = nil
			}
			got, skipped, bad := Engines(cfg, []*discoveryv1.EndpointSlice{eslice("default", "vllm-a", "vllm", http8000(), tt.ep)}, false, pods)
			if len(skipped) > 0 {
				t.Errorf("skipped %q", skipped)
			}
			if !sameEngines(got, []fleet.DiscoveredEngine{tt.want}) {
				t.Errorf("engines %+v, want %+v", got, tt.want)
			}
			if !reflect.DeepEqual(bad, tt.badRoles) {
				t.Errorf("badRoles %v, want %v", bad, tt.badRoles)
			}
			for _, de := range got {
				if err := de.Validate(); err != nil {
					t.Errorf("engine %s: %v", de.Name, err)
				}
			}
		})
	}
}

// TestDiscoveryPodRoles: the engines' roles and groups come from their
// pods' labels; a label change on a running pod, and the pod's deletion,
// change its engine's role; an unknown value is warned about once per pod.
func TestDiscoveryPodRoles(t *testing.T) {
	ctx := t.Context()
	cs := fake.NewClientset(
		pod("default", "vllm-0", DefaultRoleLabel, "prefill", "rack", "r1"),
		pod("default", "vllm-1", DefaultRoleLabel, "decode", "rack", "r1"),
		pod("default", "vllm-2", DefaultRoleLabel, "encode"),
		eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2"),
			podEP("vllm-2", "10.0.0.3"), podEP("vllm-3", "10.0.0.4")),
	)
	podAPI := cs.CoreV1().Pods("default")
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.GroupLabel = "rack"
	start(t, cfg, cs, sink)
	const bad = "role label names no role"
	// The first apply has the roles: the pods are listed before it.
	sink.waitReleased(t)
	if calls, _ := sink.snapshot(); len(calls) != 1 {
		t.Fatalf("%d SetDiscovered calls by the sync, want 1: %+v", len(calls), calls)
	}
	sink.waitEngines(t,
		roleEng("vllm-0", "http://10.0.0.1:8000", "prefill", "r1"),
		roleEng("vllm-1", "http://10.0.0.2:8000", "decode", "r1"),
		roleEng("vllm-2", "http://10.0.0.3:8000", "", ""),
		roleEng("vllm-3", "http://10.0.0.4:8000", "", ""))
	sink.waitLogged(t, bad)

	// A label change on a running pod.
	if _, err := podAPI.Update(ctx, pod("default", "vllm-1", DefaultRoleLabel, "prefill-decode", "rack", "r2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t,
		roleEng("vllm-0", "http://10.0.0.1:8000", "prefill", "r1"),
		roleEng("vllm-1", "http://10.0.0.2:8000", "", "r2"),
		roleEng("vllm-2", "http://10.0.0.3:8000", "", ""),
		roleEng("vllm-3", "http://10.0.0.4:8000", "", ""))
	// The pod of an endpoint appears.
	if _, err := podAPI.Create(ctx, pod("default", "vllm-3", DefaultRoleLabel, "decode"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// And one goes: its engine is both until its endpoint leaves.
	if err := podAPI.Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t,
		roleEng("vllm-0", "http://10.0.0.1:8000", "", ""),
		roleEng("vllm-1", "http://10.0.0.2:8000", "", "r2"),
		roleEng("vllm-2", "http://10.0.0.3:8000", "", ""),
		roleEng("vllm-3", "http://10.0.0.4:8000", "decode", ""))
	if n := sink.countLogged(bad); n != 1 {
		t.Errorf("the unknown role of vllm-2 warned %d times over several batches, want once", n)
	}
	sink.mu.Lock()
	for _, l := range sink.logs {
		if strings.Contains(l, bad) && !(strings.Contains(l, "default/vllm-2") && strings.Contains(l, "encode") && strings.Contains(l, DefaultRoleLabel)) {
			t.Errorf("warning %q does not name the pod, the label and its value", l)
		}
	}
	sink.mu.Unlock()
}

// TestDiscoveryWithoutPodLabels: with role_label and group_label empty,
// discovery reads no pods (it needs no permission on them) and every
// engine is both.
func TestDiscoveryWithoutPodLabels(t *testing.T) {
	cs := fake.NewClientset(
		pod("default", "vllm-0", DefaultRoleLabel, "prefill"),
		eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")),
	)
	cs.PrependReactor("*", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(pods, "", errors.New("cannot read pods"))
	})
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.RoleLabel = ""
	start(t, cfg, cs, sink)
	sink.waitEngines(t, eng("vllm-0", "http://10.0.0.1:8000"))
	for _, a := range cs.Actions() {
		if a.GetResource().Resource == "pods" {
			t.Errorf("pods read: %v", a)
		}
	}
}

func TestPodTransform(t *testing.T) {
	p := pod("default", "vllm-0", DefaultRoleLabel, "prefill", "rack", "r1", "app", "vllm")
	p.UID, p.ResourceVersion = "u1", "42"
	p.Annotations = map[string]string{"big": "annotation"}
	p.Spec.Containers = []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}
	p.Status.PodIP = "10.0.0.1"
	tests := []struct {
		name        string
		role, group string
		labels      map[string]string
	}{
		{name: "role and group", role: DefaultRoleLabel, group: "rack", labels: map[string]string{DefaultRoleLabel: "prefill", "rack": "r1"}},
		{name: "role only", role: DefaultRoleLabel, labels: map[string]string{DefaultRoleLabel: "prefill"}},
		{name: "labels the pod lacks", role: "x/role", group: "x/group"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := podTransform(tt.role, tt.group)(p.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm-0", UID: "u1", ResourceVersion: "42", Labels: tt.labels}}
			if !reflect.DeepEqual(out, want) {
				t.Errorf("got %+v, want %+v", out, want)
			}
		})
	}
	other := "not a pod"
	if out, err := podTransform(DefaultRoleLabel, "")(other); out != other || err != nil {
		t.Errorf("a non-pod: %v, %v", out, err)
	}
}

func TestConfigRules(t *testing.T) {
	slicesOnly := []Rule{{APIGroup: "discovery.k8s.io", Resource: "endpointslices", Verbs: []string{"list", "watch"}}}
	withPods := append(slices.Clone(slicesOnly), Rule{APIGroup: "", Resource: "pods", Verbs: []string{"list", "watch"}})
	tests := []struct {
		name string
		cfg  func(*Config)
		want []Rule
	}{
		{name: "defaults", want: withPods},
		{name: "group label only", cfg: func(c *Config) { c.RoleLabel, c.GroupLabel = "", "rack" }, want: withPods},
		{name: "no pod labels", cfg: func(c *Config) { c.RoleLabel = "" }, want: slicesOnly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			if got := c.Rules(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Rules() = %+v, want %+v", got, tt.want)
			}
		})
	}
	if !reflect.DeepEqual(Rules, withPods) {
		t.Errorf("Rules = %+v, want the defaults' %+v", Rules, withPods)
	}
}
