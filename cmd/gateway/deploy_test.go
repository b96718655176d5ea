package main

// The Kubernetes manifests under deploy/kubernetes and the Dockerfile are
// checked here against the gateway itself: the ConfigMap's config goes
// through loadConfig, and the probes, ports, grace period and mounts are
// compared with what that config and run do. Whether the API server accepts
// the manifests (server-side dry-run) is for the integration tests.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"github.com/switchboard-gw/switchboard/routing"
)

const (
	deployDir  = "../../deploy/kubernetes"
	dockerfile = "../../Dockerfile"
)

// k8sObject is one manifest, decoded into the fields the tests read; the
// rest of each document is ignored here.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data      map[string]string `yaml:"data"`      // ConfigMap
	Rules     []k8sRule         `yaml:"rules"`     // Role, ClusterRole
	RoleRef   k8sRoleRef        `yaml:"roleRef"`   // RoleBinding
	Subjects  []k8sSubject      `yaml:"subjects"`  // RoleBinding
	Resources []string          `yaml:"resources"` // Kustomization, Component
	Patches   []struct {
		Path string `yaml:"path"`
	} `yaml:"patches"`
	Components []string `yaml:"components"`
	Spec       k8sSpec  `yaml:"spec"`

	file string // relative to deployDir
}

type k8sRule struct {
	APIGroups       []string `yaml:"apiGroups"`
	Resources       []string `yaml:"resources"`
	Verbs           []string `yaml:"verbs"`
	ResourceNames   []string `yaml:"resourceNames"`
	NonResourceURLs []string `yaml:"nonResourceURLs"`
}

type k8sRoleRef struct {
	APIGroup string `yaml:"apiGroup"`
	Kind     string `yaml:"kind"`
	Name     string `yaml:"name"`
}

type k8sSubject struct {
	Kind      string `yaml:"kind"`
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
}

// k8sSpec is the union of the specs read: Deployment, Service,
// PodDisruptionBudget, ServiceMonitor.
type k8sSpec struct {
	Replicas       *int                 `yaml:"replicas"`
	Selector       k8sSelector          `yaml:"selector"` // matchLabels, or a Service's plain map
	Template       k8sPodTemplate       `yaml:"template"`
	Ports          []k8sServicePort     `yaml:"ports"`
	MaxUnavailable any                  `yaml:"maxUnavailable"`
	MinAvailable   any                  `yaml:"minAvailable"`
	Endpoints      []k8sMonitorEndpoint `yaml:"endpoints"`
}

type k8sSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
	flat        map[string]string // a Service's selector: a plain label map
}

// UnmarshalYAML takes both shapes of selector: {matchLabels: {...}} and a
// Service's plain map.
func (s *k8sSelector) UnmarshalYAML(n *yaml.Node) error {
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return err
	}
	if _, ok := m["matchLabels"]; ok {
		type plain k8sSelector
		return n.Decode((*plain)(s))
	}
	return n.Decode(&s.flat)
}

func (s k8sSelector) labels() map[string]string {
	if s.MatchLabels != nil {
		return s.MatchLabels
	}
	return s.flat
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

type k8sMonitorEndpoint struct {
	Port string `yaml:"port"`
	Path string `yaml:"path"`
}

type k8sPodTemplate struct {
	Metadata struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		ServiceAccountName            string         `yaml:"serviceAccountName"`
		EnableServiceLinks            *bool          `yaml:"enableServiceLinks"`
		AutomountServiceAccountToken  *bool          `yaml:"automountServiceAccountToken"`
		TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               k8sSecContext  `yaml:"securityContext"`
		Containers                    []k8sContainer `yaml:"containers"`
		Volumes                       []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name  string `yaml:"name"`
				Items []struct {
					Key  string `yaml:"key"`
					Path string `yaml:"path"`
				} `yaml:"items"`
			} `yaml:"configMap"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type k8sSecContext struct {
	RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	RunAsUser                *int  `yaml:"runAsUser"`
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
	Privileged               *bool `yaml:"privileged"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
		Add  []string `yaml:"add"`
	} `yaml:"capabilities"`
	SeccompProfile struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
			Exec    any `yaml:"exec"`
			HTTPGet any `yaml:"httpGet"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext k8sSecContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// loadManifests decodes every YAML document under deployDir, each file and
// each "---" document in it; a document without apiVersion or kind fails.
func loadManifests(t *testing.T) []k8sObject {
	t.Helper()
	var objs []k8sObject
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || (path.Ext(p) != ".yaml" && path.Ext(p) != ".yml") {
			return err
		}
		rel, _ := filepath.Rel(deployDir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for i := 0; ; i++ {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s, document %d: %w", rel, i, err)
			}
			if o.APIVersion == "" || o.Kind == "" {
				return fmt.Errorf("%s, document %d: no apiVersion or kind", rel, i)
			}
			o.file = filepath.ToSlash(rel)
			objs = append(objs, o)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		t.Fatalf("no manifests under %s", deployDir)
	}
	return objs
}

// base is the manifests of deploy/kubernetes/base, by kind (the
// kustomization excluded).
type base map[string][]k8sObject

func loadBase(t *testing.T) base {
	t.Helper()
	b := base{}
	for _, o := range loadManifests(t) {
		if strings.HasPrefix(o.file, "base/") && o.Kind != "Kustomization" {
			b[o.Kind] = append(b[o.Kind], o)
		}
	}
	return b
}

// one returns the only object of kind in the base.
func (b base) one(t *testing.T, kind string) k8sObject {
	t.Helper()
	if len(b[kind]) != 1 {
		t.Fatalf("base has %d %s objects, want 1", len(b[kind]), kind)
	}
	return b[kind][0]
}

// gateway returns the Deployment's gateway container.
func (b base) gateway(t *testing.T) k8sContainer {
	t.Helper()
	d := b.one(t, "Deployment")
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("the Deployment has %d containers, want 1", n)
	}
	return d.Spec.Template.Spec.Containers[0]
}

// imageEntrypoint is the Dockerfile's ENTRYPOINT, in exec form.
func imageEntrypoint(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ENTRYPOINT\s+(\[.*\])\s*$`).FindAllSubmatch(b, -1)
	if len(m) != 1 {
		t.Fatalf("Dockerfile: %d ENTRYPOINT lines in exec form, want 1", len(m))
	}
	var argv []string
	if err := json.Unmarshal(m[0][1], &argv); err != nil {
		t.Fatalf("Dockerfile ENTRYPOINT: %v", err)
	}
	return argv
}

// gatewayArgs is the gateway's command line in the pod, without the
// program: the container's command and args when set, else the image's
// entrypoint followed by the container's args.
func gatewayArgs(t *testing.T, c k8sContainer) []string {
	t.Helper()
	argv := c.Command
	if len(argv) == 0 {
		argv = imageEntrypoint(t)
	}
	argv = append(slices.Clone(argv), c.Args...)
	return argv[1:]
}

// deployedConfig loads the ConfigMap's config the way the pod does: the
// file at the --config path of the gateway's command line, with the
// container's literal environment variables, through loadConfig. It
// returns the config and the --config path in the pod.
func deployedConfig(t *testing.T, b base) (Config, string) {
	t.Helper()
	c := b.gateway(t)
	args := gatewayArgs(t, c)
	fset := newFlagSet()
	if err := fset.Parse(args); err != nil {
		t.Fatalf("gateway arguments %q: %v", args, err)
	}
	podPath, _ := fset.GetString("config")
	if podPath == "" {
		t.Fatalf("gateway arguments %q: no --config", args)
	}
	cm := b.one(t, "ConfigMap")
	body, ok := cm.Data[path.Base(podPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %q (the --config file %s)", cm.Metadata.Name, path.Base(podPath), podPath)
	}
	local := filepath.Join(t.TempDir(), path.Base(podPath))
	if err := os.WriteFile(local, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	localArgs := slices.Clone(args)
	for i, a := range localArgs {
		switch {
		case a == "--config" && i+1 < len(localArgs):
			localArgs[i+1] = local
		case strings.HasPrefix(a, "--config="):
			localArgs[i] = "--config=" + local
		}
	}
	cfg, err := loadConfig(localArgs, environ(env...))
	if err != nil {
		t.Fatalf("the ConfigMap's %s does not load: %v", path.Base(podPath), err)
	}
	return cfg, podPath
}

// listenPort is the port of a listen address, which must be reachable from
// outside the pod (all interfaces, not loopback).
func listenPort(t *testing.T, key, addr string) int {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", key, addr, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("%s %q listens on loopback: the kubelet's probes and the Services cannot reach it", key, addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n == 0 {
		t.Fatalf("%s %q: need a fixed port", key, addr)
	}
	return n
}

// containerPort resolves a probe's or a Service's port (a name or a
// number) to a container port number; 0 when a name is not declared.
func containerPort(c k8sContainer, port any) int {
	switch p := port.(type) {
	case int:
		return p
	case string:
		for _, cp := range c.Ports {
			if cp.Name == p {
				return cp.ContainerPort
			}
		}
	}
	return 0
}

// TestDeployManifests checks the base's invariants that need no cluster.
func TestDeployManifests(t *testing.T) {
	b := loadBase(t)
	cfg, podConfigPath := deployedConfig(t, b)
	dep := b.one(t, "Deployment")
	pod := dep.Spec.Template.Spec
	c := b.gateway(t)

	t.Run("config", func(t *testing.T) {
		// What run checks beyond loadConfig before it serves.
		gcfg := cfg.Server.Config
		gcfg.Engines = cfg.Engines
		validate := gcfg.Validate
		if cfg.Discovery.Kubernetes.Enabled {
			validate = gcfg.ValidateSettings // gateway.WithDynamicEngines: the engines may all be discovered
		}
		if err := validate(); err != nil {
			t.Errorf("gateway section: %v", err)
		}
		if _, err := routing.NewPolicy(cfg.Routing); err != nil {
			t.Error(err)
		}
		kube := cfg.Discovery.Kubernetes
		if len(cfg.Engines) == 0 && !kube.Enabled {
			t.Error("the ConfigMap lists no engines and discovery.kubernetes is off")
		}
		if kube.Enabled {
			if pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
				t.Error("discovery.kubernetes is on but the pod mounts no service account token: in-cluster discovery needs it")
			}
			if kube.Kubeconfig != "" {
				t.Errorf("discovery.kubernetes.kubeconfig = %q in the cluster, want the service account", kube.Kubeconfig)
			}
			// The Role is namespaced, in the gateway's namespace: discovery
			// must watch that one (namespaces empty) unless the overlay adds
			// a Role elsewhere.
			if len(kube.Namespaces) > 0 {
				t.Errorf("discovery.kubernetes.namespaces = %v; the base's Role grants only the gateway's own namespace", kube.Namespaces)
			}
		}
		if !cfg.Reload.Watch {
			t.Error("reload.watch is off: ConfigMap updates would need a SIGHUP or a restart")
		}
	})

	t.Run("probes", func(t *testing.T) {
		public := listenPort(t, "server.listen", cfg.Server.Listen)
		for _, p := range []struct {
			name  string
			probe *k8sProbe
			path  string
			must  bool
		}{
			{"readinessProbe", c.ReadinessProbe, "/ready", true},
			{"livenessProbe", c.LivenessProbe, "/health", true},
			{"startupProbe", c.StartupProbe, "/health", false},
		} {
			if p.probe == nil {
				if p.must {
					t.Errorf("no %s", p.name)
				}
				continue
			}
			if p.probe.HTTPGet == nil {
				t.Errorf("%s is not an httpGet probe", p.name)
				continue
			}
			if p.probe.HTTPGet.Path != p.path {
				t.Errorf("%s path %q, want %q", p.name, p.probe.HTTPGet.Path, p.path)
			}
			if got := containerPort(c, p.probe.HTTPGet.Port); got != public {
				t.Errorf("%s port %v is container port %d, but server.listen is %q (/ready and /health are on the public listener)",
					p.name, p.probe.HTTPGet.Port, got, cfg.Server.Listen)
			}
		}
	})

	t.Run("ports and services", func(t *testing.T) {
		public := listenPort(t, "server.listen", cfg.Server.Listen)
		if cfg.Admin.Listen == "" {
			t.Fatal("admin.listen is empty: no /metrics")
		}
		admin := listenPort(t, "admin.listen", cfg.Admin.Listen)
		if got := containerPort(c, "http"); got != public {
			t.Errorf("container port http = %d, server.listen %q", got, cfg.Server.Listen)
		}
		if got := containerPort(c, "admin"); got != admin {
			t.Errorf("container port admin = %d, admin.listen %q", got, cfg.Admin.Listen)
		}
		var sawPublic, sawAdmin bool
		for _, svc := range b["Service"] {
			if !testutil.Selects(svc.Spec.Selector.labels(), dep.Spec.Template.Metadata.Labels) {
				t.Errorf("Service %s selects %v, not the gateway pods (%v)", svc.Metadata.Name, svc.Spec.Selector.labels(), dep.Spec.Template.Metadata.Labels)
			}
			var targets []int
			for _, p := range svc.Spec.Ports {
				n := containerPort(c, p.TargetPort)
				if n == 0 {
					t.Errorf("Service %s port %s: targetPort %v is no container port", svc.Metadata.Name, p.Name, p.TargetPort)
				}
				targets = append(targets, n)
			}
			switch {
			case slices.Contains(targets, public) && slices.Contains(targets, admin):
				t.Errorf("Service %s exposes the public and the admin listener together", svc.Metadata.Name)
			case slices.Contains(targets, public):
				sawPublic = true
			case slices.Contains(targets, admin):
				sawAdmin = true
			}
		}
		if !sawPublic || !sawAdmin {
			t.Errorf("want a Service for the public listener (%v) and a separate one for the admin listener (%v)", sawPublic, sawAdmin)
		}
	})

	t.Run("termination", func(t *testing.T) {
		if pod.TerminationGracePeriodSeconds == nil {
			t.Fatal("no terminationGracePeriodSeconds (the default 30 s is shorter than the drain)")
		}
		grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
		var preStop time.Duration
		if ps := c.Lifecycle.PreStop; ps != nil {
			if ps.Exec != nil {
				t.Error("preStop exec: the distroless image has no shell or sleep binary; use the sleep action")
			}
			if ps.Sleep != nil {
				preStop = time.Duration(ps.Sleep.Seconds) * time.Second
			}
		}
		if preStop+cfg.Server.DrainDelay == 0 {
			t.Error("neither a preStop sleep nor server.drain_delay: new connections can arrive after the listener closed")
		}
		// What run may take after SIGTERM: the drain delay, the drain, and
		// past its deadline abortGrace for the streams' final events, 5 s for
		// handlers after their connections close and 5 s for the last
		// telemetry export.
		need := preStop + cfg.Server.DrainDelay + cfg.Server.ShutdownTimeout + abortGrace + 5*time.Second + 5*time.Second
		if grace < need {
			t.Errorf("terminationGracePeriodSeconds %s < preStop %s + drain_delay %s + shutdown_timeout %s + abort and export %s = %s",
				grace, preStop, cfg.Server.DrainDelay, cfg.Server.ShutdownTimeout, abortGrace+10*time.Second, need)
		}
		if grace < cfg.Server.DrainDelay+cfg.Server.ShutdownTimeout {
			t.Errorf("terminationGracePeriodSeconds %s < drain_delay + shutdown_timeout", grace)
		}
	})

	t.Run("config mount", func(t *testing.T) {
		dir := path.Dir(podConfigPath)
		var found bool
		for _, m := range c.VolumeMounts {
			if m.MountPath == podConfigPath && m.SubPath != "" {
				t.Errorf("volume %s is mounted with subPath: the file would never change on a ConfigMap update", m.Name)
			}
			if m.MountPath != dir {
				continue
			}
			found = true
			if m.SubPath != "" {
				t.Errorf("volume %s has subPath %q: ConfigMap updates do not reach subPath mounts", m.Name, m.SubPath)
			}
			var isCM bool
			for _, v := range pod.Volumes {
				if v.Name != m.Name || v.ConfigMap == nil {
					continue
				}
				isCM = true
				if cm := b.one(t, "ConfigMap"); v.ConfigMap.Name != cm.Metadata.Name {
					t.Errorf("volume %s mounts ConfigMap %q, want %q", v.Name, v.ConfigMap.Name, cm.Metadata.Name)
				}
				for _, it := range v.ConfigMap.Items {
					if it.Key == path.Base(podConfigPath) && it.Path != path.Base(podConfigPath) {
						t.Errorf("volume %s maps key %s to %s, but the gateway reads %s", v.Name, it.Key, it.Path, podConfigPath)
					}
				}
			}
			if !isCM {
				t.Errorf("%s is mounted from volume %s, which is not a ConfigMap", dir, m.Name)
			}
		}
		if !found {
			t.Errorf("no volume mounted at %s, the directory of --config %s", dir, podConfigPath)
		}
	})

	t.Run("service links", func(t *testing.T) {
		// A pod gets NAME_SERVICE_HOST, NAME_PORT, ... for each Service in
		// its namespace; for a Service named switchboard* they start with
		// SWITCHBOARD_, which the gateway reads as config keys.
		var vars []string
		for _, svc := range b["Service"] {
			name := strings.ToUpper(strings.ReplaceAll(svc.Metadata.Name, "-", "_"))
			vars = append(vars, name+"_SERVICE_HOST=10.96.0.10", name+"_PORT=tcp://10.96.0.10:80")
		}
		var clash []string
		for _, v := range vars {
			if strings.HasPrefix(v, envPrefix) {
				clash = append(clash, v)
			}
		}
		if len(clash) == 0 {
			return
		}
		if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
			t.Errorf("enableServiceLinks is not false, and the Services' link variables %v start with %s", clash, envPrefix)
		}
		// Why: with them the gateway does not start.
		if _, err := loadConfig(nil, environ(clash...)); err == nil {
			t.Errorf("loadConfig accepted %v: enableServiceLinks: false may no longer be needed", clash)
		}
	})

	t.Run("security context", func(t *testing.T) {
		psc, csc := pod.SecurityContext, c.SecurityContext
		if !isTrue(psc.RunAsNonRoot) && !isTrue(csc.RunAsNonRoot) {
			t.Error("runAsNonRoot is not set")
		}
		uid := psc.RunAsUser
		if csc.RunAsUser != nil {
			uid = csc.RunAsUser
		}
		// The image says USER nonroot, a name: the kubelet can only verify
		// runAsNonRoot against a numeric user.
		if uid == nil {
			t.Error("no runAsUser: want a numeric non-root user (distroless nonroot is 65532)")
		} else if *uid == 0 {
			t.Error("runAsUser 0 (root)")
		}
		if !isFalse(csc.AllowPrivilegeEscalation) {
			t.Error("allowPrivilegeEscalation is not false")
		}
		if !isTrue(csc.ReadOnlyRootFilesystem) {
			t.Error("readOnlyRootFilesystem is not true")
		}
		if isTrue(csc.Privileged) {
			t.Error("privileged")
		}
		if !slices.Contains(csc.Capabilities.Drop, "ALL") || len(csc.Capabilities.Add) > 0 {
			t.Errorf("capabilities drop %v add %v, want drop [ALL] and no add", csc.Capabilities.Drop, csc.Capabilities.Add)
		}
		if psc.SeccompProfile.Type != "RuntimeDefault" && csc.SeccompProfile.Type != "RuntimeDefault" {
			t.Error("seccompProfile is not RuntimeDefault (the restricted Pod Security Standard needs it)")
		}
		if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
			t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
		}
	})

	t.Run("rbac", func(t *testing.T) {
		for _, o := range loadManifests(t) {
			if o.Kind == "ClusterRole" || o.Kind == "ClusterRoleBinding" {
				t.Errorf("%s: %s %s: discovery needs a namespaced Role only", o.file, o.Kind, o.Metadata.Name)
			}
		}
		role := b.one(t, "Role")
		want := []k8sRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}
		got := slices.Clone(role.Rules)
		for i := range got {
			got[i].Verbs = slices.Sorted(slices.Values(got[i].Verbs))
		}
		if !slices.EqualFunc(got, want, func(a, b k8sRule) bool {
			return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) && slices.Equal(a.Verbs, b.Verbs) &&
				len(a.ResourceNames) == 0 && len(a.NonResourceURLs) == 0
		}) {
			t.Errorf("Role %s rules %+v, want exactly %+v", role.Metadata.Name, role.Rules, want)
		}
		rb := b.one(t, "RoleBinding")
		if rb.RoleRef != (k8sRoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Metadata.Name}) {
			t.Errorf("RoleBinding roleRef %+v, want the Role %s", rb.RoleRef, role.Metadata.Name)
		}
		sa := b.one(t, "ServiceAccount")
		if len(rb.Subjects) != 1 || rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != sa.Metadata.Name {
			t.Errorf("RoleBinding subjects %+v, want only the ServiceAccount %s", rb.Subjects, sa.Metadata.Name)
		}
		if pod.ServiceAccountName != sa.Metadata.Name {
			t.Errorf("the Deployment runs as ServiceAccount %q, want %q", pod.ServiceAccountName, sa.Metadata.Name)
		}
	})

	t.Run("availability", func(t *testing.T) {
		if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
			t.Errorf("replicas %v, want at least 2", dep.Spec.Replicas)
		}
		if !testutil.Selects(dep.Spec.Selector.labels(), dep.Spec.Template.Metadata.Labels) {
			t.Error("the Deployment's selector does not match its pod template")
		}
		pdb := b.one(t, "PodDisruptionBudget")
		if !testutil.Selects(pdb.Spec.Selector.labels(), dep.Spec.Template.Metadata.Labels) {
			t.Error("the PodDisruptionBudget does not select the gateway pods")
		}
		if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
			t.Error("the PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
		}
	})
}

// TestDeployComponents checks the manifests outside the base: the
// ServiceMonitor only in a component (the base applies without the
// Prometheus operator's CRDs), selecting the admin Service's port; and
// every kustomization lists files that exist, and every manifest beside it.
func TestDeployComponents(t *testing.T) {
	objs := loadManifests(t)
	b := loadBase(t)
	var monitors int
	for _, o := range objs {
		if !strings.HasPrefix(o.APIVersion, "monitoring.coreos.com/") {
			continue
		}
		monitors++
		if strings.HasPrefix(o.file, "base/") {
			t.Errorf("%s: %s in the base: it would not apply on a cluster without the Prometheus operator", o.file, o.Kind)
		}
		var ok bool
		for _, svc := range b["Service"] {
			if !testutil.Selects(o.Spec.Selector.labels(), svc.Metadata.Labels) {
				continue
			}
			for _, ep := range o.Spec.Endpoints {
				for _, p := range svc.Spec.Ports {
					if ep.Port == p.Name && ep.Path == "/metrics" && containerPort(b.gateway(t), p.TargetPort) == containerPort(b.gateway(t), "admin") {
						ok = true
					}
				}
			}
		}
		if !ok {
			t.Errorf("%s: %s %s does not scrape /metrics on the admin Service's port", o.file, o.Kind, o.Metadata.Name)
		}
	}
	if monitors == 0 {
		t.Error("no ServiceMonitor under deploy/kubernetes")
	}

	// Every kustomization's files exist, and each directory's manifests are
	// all listed (a file left out of resources is silently not applied).
	listed := map[string]bool{}
	for _, o := range objs {
		if o.Kind != "Kustomization" && o.Kind != "Component" {
			continue
		}
		dir := path.Dir(o.file)
		listed[o.file] = true
		refs := slices.Clone(o.Resources)
		refs = append(refs, o.Components...)
		for _, p := range o.Patches {
			refs = append(refs, p.Path)
		}
		for _, r := range refs {
			p := path.Join(dir, r)
			if _, err := os.Stat(filepath.Join(deployDir, filepath.FromSlash(p))); err != nil {
				t.Errorf("%s lists %s: %v", o.file, r, err)
			}
			listed[p] = true
		}
	}
	for _, o := range objs {
		if !listed[o.file] {
			t.Errorf("%s is in no kustomization", o.file)
		}
	}
}

// TestDeployKustomize renders the base and every overlay with kubectl's
// kustomize, when kubectl is installed: the layout builds, and an
// overlay's namespace reaches the RoleBinding's subject.
func TestDeployKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed")
	}
	dirs := []string{"base"}
	overlays, _ := filepath.Glob(filepath.Join(deployDir, "overlays", "*", "kustomization.yaml"))
	for _, o := range overlays {
		rel, _ := filepath.Rel(deployDir, filepath.Dir(o))
		dirs = append(dirs, filepath.ToSlash(rel))
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", filepath.Join(deployDir, dir)).Output()
			if err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, ee.Stderr)
				}
				t.Fatal(err)
			}
			var ns string
			var rbs []k8sObject
			dec := yaml.NewDecoder(bytes.NewReader(out))
			for {
				var o k8sObject
				if err := dec.Decode(&o); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatal(err)
				}
				switch o.Kind {
				case "Namespace":
					ns = o.Metadata.Name
				case "RoleBinding":
					rbs = append(rbs, o)
				}
			}
			for _, rb := range rbs {
				for _, s := range rb.Subjects {
					if s.Kind == "ServiceAccount" && (s.Namespace != rb.Metadata.Namespace || s.Namespace != ns) {
						t.Errorf("RoleBinding %s (namespace %s) binds ServiceAccount %s/%s; the gateway runs in %s",
							rb.Metadata.Name, rb.Metadata.Namespace, s.Namespace, s.Name, ns)
					}
				}
			}
		})
	}
}

// TestDockerfile checks what can be checked of the image without a Docker
// daemon: a static non-root final stage, the ports the ConfigMap's config
// listens on, and the config path the Deployment mounts.
func TestDockerfile(t *testing.T) {
	raw, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	df := string(raw)
	stages := regexp.MustCompile(`(?m)^FROM\s+(?:--platform=\S+\s+)?(\S+)`).FindAllStringSubmatch(df, -1)
	if len(stages) < 2 {
		t.Fatalf("%d FROM lines, want a multi-stage build", len(stages))
	}
	if final := stages[len(stages)-1][1]; !strings.HasPrefix(final, "gcr.io/distroless/static") || !strings.Contains(final, "nonroot") {
		t.Errorf("final stage %s, want gcr.io/distroless/static...:nonroot", final)
	}
	if users := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindAllStringSubmatch(df, -1); len(users) == 0 || users[len(users)-1][1] != "nonroot" {
		t.Errorf("USER lines %v, want the last to be nonroot", users)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w"`, "--mount=type=cache,target=/go/pkg/mod", "./cmd/gateway"} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	b := loadBase(t)
	cfg, podConfigPath := deployedConfig(t, b)
	entry := imageEntrypoint(t)
	if i := slices.Index(entry, "--config"); i < 0 || i+1 >= len(entry) || entry[i+1] != podConfigPath {
		t.Errorf("ENTRYPOINT %q: want --config %s", entry, podConfigPath)
	}
	var exposed []string
	for _, m := range regexp.MustCompile(`(?m)^EXPOSE\s+(.+)$`).FindAllStringSubmatch(df, -1) {
		exposed = append(exposed, strings.Fields(m[1])...)
	}
	for key, addr := range map[string]string{"server.listen": cfg.Server.Listen, "admin.listen": cfg.Admin.Listen} {
		if p := strconv.Itoa(listenPort(t, key, addr)); !slices.Contains(exposed, p) && !slices.Contains(exposed, p+"/tcp") {
			t.Errorf("EXPOSE %v lacks %s (%s)", exposed, p, key)
		}
	}
}

func isTrue(b *bool) bool  { return b != nil && *b }
func isFalse(b *bool) bool { return b != nil && !*b }
