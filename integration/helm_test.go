//go:build integration

package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
)

// chartDir is the Helm chart; its ci/all-values.yaml turns every optional
// part on.
const (
	chartDir      = "../deploy/helm/switchboard"
	allValuesFile = chartDir + "/ci/all-values.yaml"
)

// helmBin is the Helm binary integration/run.sh builds from
// integration/tools/helm (IT_HELM_BIN); the test is skipped without it.
func helmBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("IT_HELM_BIN")
	if bin == "" {
		t.Skip("IT_HELM_BIN is not set: integration/run.sh builds Helm from integration/tools/helm into .tools/bin/helm and sets it")
	}
	return bin
}

// helm runs the Helm binary with args and returns its stdout, stderr and
// error. HELM_* locations point into a temporary directory, so no user
// configuration or cache is read or written.
func helm(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, helmBin(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"))
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// helmTemplate renders the chart as release RELEASE in namespace NS with
// the values files and --set pairs in args (after the chart), and decodes
// every object.
func helmTemplate(t *testing.T, release, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, stderr, err := helm(t, append([]string{"template", release, chartDir, "--namespace", ns}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr)
	}
	objs := decodeObjects(t, []byte(out))
	if len(objs) == 0 {
		t.Fatalf("helm template %v rendered nothing", args)
	}
	return objs
}

// TestHelmLint runs helm lint --strict on the chart with its defaults and
// with every optional part on (a warning fails it, as an error does), and
// renders its NOTES.txt with a client-side dry-run install.
func TestHelmLint(t *testing.T) {
	for _, args := range [][]string{nil, {"-f", allValuesFile}} {
		out, stderr, err := helm(t, append([]string{"lint", "--strict", chartDir}, args...)...)
		if err != nil {
			t.Errorf("helm lint --strict %v: %v\n%s%s", args, err, out, stderr)
		}
		out, stderr, err = helm(t, append([]string{"install", "switchboard", chartDir, "--namespace", "gw", "--dry-run=client"}, args...)...)
		_, notes, _ := strings.Cut(out, "NOTES:")
		if err != nil || !strings.Contains(notes, "kubectl -n gw rollout status deployment/switchboard") {
			t.Errorf("helm install --dry-run=client %v: %v, want NOTES with the rollout command:\n%s%s", args, err, notes, stderr)
		}
	}
}

// TestHelmSchemaRejects: values.schema.json refuses each of these values
// files, and helm names the offending value in its message.
func TestHelmSchemaRejects(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"unknown top-level key", "replicas: 3\n", "'replicas' not allowed"},
		{"negative replicas", "replicaCount: -1\n", "at '/replicaCount'"},
		{"replicas as a string", "replicaCount: \"2\"\n", "at '/replicaCount'"},
		{"pull policy", "image:\n  pullPolicy: Sometimes\n", "at '/image/pullPolicy'"},
		{"port out of range", "containerPorts:\n  http: 70000\n", "at '/containerPorts/http'"},
		{"short admin token", "adminToken:\n  create: true\n  tokens: [short]\n", "at '/adminToken/tokens/0'"},
		{"redis address without a port", "redis:\n  address: redis\n", "at '/redis/address'"},
		{"enabled under discovery.kubernetes", "discovery:\n  kubernetes:\n    enabled: false\n", "at '/discovery/kubernetes/enabled'"},
		{"unknown serviceMonitor key", "serviceMonitor:\n  enable: true\n", "'enable' not allowed"},
		{"service type", "service:\n  type: ExternalName\n", "at '/service/type'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(tc.values), 0o600); err != nil {
				t.Fatal(err)
			}
			_, stderr, err := helm(t, "template", "switchboard", chartDir, "-f", f)
			if err == nil {
				t.Fatalf("helm template accepted %q", tc.values)
			}
			if !strings.Contains(stderr, "values don't meet the specifications of the schema") || !strings.Contains(stderr, tc.want) {
				t.Errorf("helm template with %q: the error does not say the schema refused %s:\n%s", tc.values, tc.want, stderr)
			}
		})
	}
	// Not a schema matter: create without tokens fails with the chart's message.
	_, stderr, err := helm(t, "template", "switchboard", chartDir, "--set", "adminToken.create=true")
	if err == nil || !strings.Contains(stderr, "adminToken.tokens is empty") {
		t.Errorf("helm template with adminToken.create and no tokens: %v, want the chart's message:\n%s", err, stderr)
	}
}

// TestHelmDryRun renders the chart with its defaults and with every
// optional part on (ci/all-values.yaml), each into a fresh namespace held
// to the restricted Pod Security Standard (Helm installs into an existing
// namespace), and creates every rendered object on kube.sh's
// kube-apiserver with server-side dry-run and strict field validation,
// as TestKubeManifestsDryRun does for deploy/kubernetes (createChecked:
// no refusal, no warning, no field dropped), with the Prometheus
// operator's real ServiceMonitor CRD installed. It then checks the
// rendering's wiring and that the Deployment's pod is admitted.
func TestHelmDryRun(t *testing.T) {
	helmBin(t)
	cfg := kubeConfig(t)
	warns := &warningRecorder{}
	cfg.WarningHandlerWithContext = warns
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	installCRD(ctx, t, dyn, promOperatorCRD(ctx, t, serviceMonitorCRD))
	mapper := restMapper(ctx, t, dc, schema.GroupKind{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"})

	for _, tc := range []struct {
		name  string
		args  []string
		kinds []string // what the rendering must hold, sorted
	}{
		{"defaults", nil, []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "Service", "ServiceAccount"}},
		{"all", []string{"-f", allValuesFile}, []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Service", "Service", "ServiceAccount", "ServiceMonitor"}},
		{"no discovery, existing admin Secret", []string{"--set", "discovery.enabled=false", "--set", "podDisruptionBudget.enabled=false",
			"--set", "config.engines[0].name=vllm-0", "--set", "config.engines[0].url=http://vllm-0.vllm:8000",
			"--set", "adminToken.existingSecret=" + existingAdminSecret},
			[]string{"ConfigMap", "Deployment", "Service", "Service", "ServiceAccount"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := "switchboard-it-" + utilrand.String(6)
			nsObj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Namespace",
				"metadata": map[string]any{"name": ns, "labels": map[string]any{
					"pod-security.kubernetes.io/enforce": "restricted",
					"pod-security.kubernetes.io/warn":    "restricted",
					"pod-security.kubernetes.io/audit":   "restricted",
				}},
			}}
			got := createChecked(ctx, t, dyn, mapper, warns, nsObj, false)
			if got == nil {
				t.FailNow()
			}
			t.Cleanup(func() {
				_ = dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Delete(context.Background(), ns, metav1.DeleteOptions{})
			})
			created := map[string]*unstructured.Unstructured{"Namespace/" + ns: got}

			objs := helmTemplate(t, "switchboard", ns, tc.args...)
			var kinds []string
			for _, o := range objs {
				kinds = append(kinds, o.GetKind())
				if o.GetKind() == "Namespace" {
					t.Errorf("the chart renders Namespace %s: Helm installs into an existing namespace", o.GetName())
					continue
				}
				if o.GetNamespace() == "" {
					// helm template leaves namespaced objects without one; helm install sets --namespace.
					o.SetNamespace(ns)
				}
				if c := createChecked(ctx, t, dyn, mapper, warns, o, true); c != nil {
					created[objKey(o)] = c
				}
			}
			slices.Sort(kinds)
			if !slices.Equal(kinds, tc.kinds) {
				t.Errorf("the chart renders %v, want %v", kinds, tc.kinds)
			}
			r := rendered(objs)
			checkChartWiring(t, ns, r)
			checkPodAdmission(ctx, t, dyn, warns, ns, r, created)
		})
	}
}

// existingAdminSecret is the admin tokens Secret TestHelmDryRun names in
// adminToken.existingSecret: the chart mounts it without rendering it.
const existingAdminSecret = "ops-admin-tokens"

// checkChartWiring checks the references between the chart's objects and
// into the gateway's config: every $(VAR) in the environment is defined
// before it; the ConfigMap, the ServiceAccount, the Role and the Secrets
// the pods mount are the rendered ones (or existingAdminSecret); the RoleBinding binds the pods' account in NS;
// the token is mounted exactly when discovery is on; the config's
// listeners are the container's ports, its admin.auth.tokens_file is the
// mounted Secret's file and its limits.redis.password_env a variable the
// container has; and the Services, the PodDisruptionBudget and the
// ServiceMonitor select what they should.
func checkChartWiring(t *testing.T, ns string, r renderedObjects) {
	t.Helper()
	dep := r.one(t, "Deployment")
	c := gatewayContainer(t, r)
	pod, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")

	defined := map[string]bool{}
	for _, e := range gatewayEnv(t, r) {
		for _, m := range envRef.FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				t.Errorf("env %s=%q refers to $(%s), which is not defined before it", e.Name, e.Value, m[1])
			}
		}
		defined[e.Name] = true
	}

	gw := chartConfig(t, r)
	ports := map[string]int64{}
	cports, _, _ := unstructured.NestedSlice(c, "ports")
	for _, p := range cports {
		p := p.(map[string]any)
		ports[p["name"].(string)] = p["containerPort"].(int64)
	}
	for key, port := range map[string]string{"server.listen": "http", "admin.listen": "admin"} {
		if got, want := lookup(gw, key), ":"+strconv.FormatInt(ports[port], 10); got != want {
			t.Errorf("config %s = %v, want %q (the container's %s port)", key, got, want, port)
		}
	}

	mounts := map[string]string{} // volume -> mount path
	vms, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	for _, m := range vms {
		m := m.(map[string]any)
		mounts[m["name"].(string)] = m["mountPath"].(string)
	}
	vols, _, _ := unstructured.NestedSlice(pod, "volumes")
	var tokensFile string
	for _, v := range vols {
		v := v.(map[string]any)
		if name, ok, _ := unstructured.NestedString(v, "configMap", "name"); ok {
			if !r.has("ConfigMap", name) {
				t.Errorf("volume %v mounts ConfigMap %s, which the rendering does not have", v["name"], name)
			}
			if mounts[v["name"].(string)] != "/etc/switchboard" {
				t.Errorf("ConfigMap %s is mounted at %q, want /etc/switchboard (the image's --config directory)", name, mounts[v["name"].(string)])
			}
		}
		if name, ok, _ := unstructured.NestedString(v, "secret", "secretName"); ok {
			if !r.has("Secret", name) && name != existingAdminSecret {
				t.Errorf("volume %v mounts Secret %s, which the rendering does not have", v["name"], name)
			}
			items, _, _ := unstructured.NestedSlice(v, "secret", "items")
			for _, it := range items {
				tokensFile = mounts[v["name"].(string)] + "/" + it.(map[string]any)["path"].(string)
			}
		}
	}
	if got := lookup(gw, "admin.auth.tokens_file"); (got != nil || tokensFile != "") && got != tokensFile {
		t.Errorf("config admin.auth.tokens_file = %v, the mounted Secret's file is %q", got, tokensFile)
	}
	for _, s := range r["Secret"] {
		if tokensFile == "" {
			t.Errorf("Secret %s is rendered but not mounted", s.GetName())
		}
	}
	if pw := lookup(gw, "limits.redis.password_env"); pw != nil {
		env, _, _ := unstructured.NestedSlice(c, "env")
		if !slices.ContainsFunc(env, func(v any) bool {
			e := v.(map[string]any)
			_, fromSecret, _ := unstructured.NestedString(e, "valueFrom", "secretKeyRef", "name")
			return e["name"] == pw && fromSecret
		}) {
			t.Errorf("config limits.redis.password_env = %v, which the container does not take from a Secret", pw)
		}
		if strings.HasPrefix(pw.(string), "SWITCHBOARD_") {
			t.Errorf("limits.redis.password_env = %v: the gateway reads SWITCHBOARD_* variables as config keys", pw)
		}
	}

	sa, _ := pod["serviceAccountName"].(string)
	if !r.has("ServiceAccount", sa) {
		t.Errorf("the Deployment runs as ServiceAccount %q, which the rendering does not have", sa)
	}
	discoveryOn := lookup(gw, "discovery.kubernetes.enabled") == true
	if automount, _ := pod["automountServiceAccountToken"].(bool); automount != discoveryOn {
		t.Errorf("automountServiceAccountToken %v with discovery.kubernetes.enabled %v: want the token exactly when discovery reads the API", automount, discoveryOn)
	}
	if discoveryOn != (len(r["Role"]) == 1 && len(r["RoleBinding"]) == 1) {
		t.Errorf("discovery.kubernetes.enabled %v, %d Roles and %d RoleBindings: want one each exactly with discovery", discoveryOn, len(r["Role"]), len(r["RoleBinding"]))
	}
	for _, rb := range r["RoleBinding"] {
		if ref, _, _ := unstructured.NestedString(rb.Object, "roleRef", "name"); !r.has("Role", ref) {
			t.Errorf("RoleBinding %s refers to Role %s, which the rendering does not have", rb.GetName(), ref)
		}
		subjects, _, _ := unstructured.NestedSlice(rb.Object, "subjects")
		for _, s := range subjects {
			s := s.(map[string]any)
			if s["kind"] == "ServiceAccount" && (s["name"] != sa || s["namespace"] != ns) {
				t.Errorf("RoleBinding %s binds ServiceAccount %v/%v; the gateway runs as %s/%s", rb.GetName(), s["namespace"], s["name"], ns, sa)
			}
		}
	}

	for _, svc := range r["Service"] {
		if sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector"); !testutil.Selects(sel, podLabels) {
			t.Errorf("Service %s selects %v, not the gateway's pods %v", svc.GetName(), sel, podLabels)
		}
	}
	for _, pdb := range r["PodDisruptionBudget"] {
		if sel, _, _ := unstructured.NestedStringMap(pdb.Object, "spec", "selector", "matchLabels"); !testutil.Selects(sel, podLabels) {
			t.Errorf("PodDisruptionBudget %s selects %v, not the gateway's pods %v", pdb.GetName(), sel, podLabels)
		}
	}
	for _, sm := range r["ServiceMonitor"] {
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		var scraped []string
		for _, svc := range r["Service"] {
			if !testutil.Selects(sel, svc.GetLabels()) {
				continue
			}
			ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			for _, ep := range eps {
				for _, p := range ports {
					if ep.(map[string]any)["port"] == p.(map[string]any)["name"] {
						scraped = append(scraped, svc.GetName())
					}
				}
			}
		}
		if want := dep.GetName() + "-admin"; !slices.Equal(scraped, []string{want}) {
			t.Errorf("ServiceMonitor %s scrapes the Services %v, want only %s", sm.GetName(), scraped, want)
		}
	}
}

// chartConfig is the gateway's config in the rendered ConfigMap, decoded
// with go.yaml.in/yaml/v3 as the gateway's koanf parser decodes it (so an
// integer stays an int, not a float).
func chartConfig(t *testing.T, r renderedObjects) map[string]any {
	t.Helper()
	return gatewayYAML(t, r.one(t, "ConfigMap"))
}

func gatewayYAML(t *testing.T, cm *unstructured.Unstructured) map[string]any {
	t.Helper()
	text, ok, _ := unstructured.NestedString(cm.Object, "data", "gateway.yaml")
	if !ok {
		t.Fatalf("ConfigMap %s has no gateway.yaml", cm.GetName())
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(text), &cfg); err != nil {
		t.Fatalf("ConfigMap %s gateway.yaml: %v\n%s", cm.GetName(), err, text)
	}
	return cfg
}

// lookup is the value at the dotted key in a decoded config; nil when
// absent.
func lookup(cfg map[string]any, key string) any {
	var v any = cfg
	for _, k := range strings.Split(key, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// TestHelmAgreesWithKustomize: the chart with its defaults, released as
// "switchboard", renders what deploy/kubernetes/base does (less the
// Namespace) with the same hardening. Compared as parsed objects: the
// Deployment's probes, pod and container security contexts, preStop,
// grace period, resources, environment, ports, mounts and rollout
// strategy; the Role's rules; the gateway's config in the ConfigMap; and
// the objects' kinds and names. Only Helm is needed (the base is rendered
// with kustomize's library), no apiserver.
func TestHelmAgreesWithKustomize(t *testing.T) {
	helmBin(t)
	const ns = "switchboard"
	chart := rendered(helmTemplate(t, "switchboard", ns))
	base := rendered(renderInto(t, "base", ns))

	names := func(r renderedObjects) []string {
		var out []string
		for kind, objs := range r {
			if kind == "Namespace" {
				continue
			}
			for _, o := range objs {
				out = append(out, objKey(o))
			}
		}
		slices.Sort(out)
		return out
	}
	if c, b := names(chart), names(base); !slices.Equal(c, b) {
		t.Errorf("the chart renders %v, the base %v", c, b)
	}

	same := func(what string, c, b any) {
		t.Helper()
		if !reflect.DeepEqual(c, b) {
			t.Errorf("%s differ:\n\tchart: %v\n\tbase:  %v", what, c, b)
		}
	}
	field := func(r renderedObjects, kind string, path ...string) any {
		t.Helper()
		v, ok, err := unstructured.NestedFieldNoCopy(r.one(t, kind).Object, path...)
		if !ok || err != nil {
			t.Errorf("%s has no %s (%v)", kind, strings.Join(path, "."), err)
		}
		return v
	}
	cc, bc := gatewayContainer(t, chart), gatewayContainer(t, base)
	for _, k := range []string{"startupProbe", "livenessProbe", "readinessProbe", "securityContext", "lifecycle", "resources", "env", "ports", "volumeMounts"} {
		if bc[k] == nil {
			t.Errorf("the base's container has no %s", k)
		}
		same("the containers' "+k, cc[k], bc[k])
	}
	for _, k := range []string{"securityContext", "terminationGracePeriodSeconds", "enableServiceLinks", "automountServiceAccountToken"} {
		same("the pods' "+k, field(chart, "Deployment", "spec", "template", "spec", k), field(base, "Deployment", "spec", "template", "spec", k))
	}
	for _, k := range []string{"replicas", "strategy", "revisionHistoryLimit"} {
		same("the Deployments' "+k, field(chart, "Deployment", "spec", k), field(base, "Deployment", "spec", k))
	}
	same("the Roles' rules", field(chart, "Role", "rules"), field(base, "Role", "rules"))
	same("the PodDisruptionBudgets' policies",
		[]any{field(chart, "PodDisruptionBudget", "spec", "maxUnavailable"), field(chart, "PodDisruptionBudget", "spec", "unhealthyPodEvictionPolicy")},
		[]any{field(base, "PodDisruptionBudget", "spec", "maxUnavailable"), field(base, "PodDisruptionBudget", "spec", "unhealthyPodEvictionPolicy")})
	for _, svc := range []string{"switchboard", "switchboard-admin"} {
		find := func(r renderedObjects) map[string]any {
			for _, o := range r["Service"] {
				if o.GetName() == svc {
					spec, _, _ := unstructured.NestedMap(o.Object, "spec")
					delete(spec, "selector") // the chart's adds the release's instance label
					return spec
				}
			}
			return nil
		}
		same("Service "+svc+"'s spec (but the selector)", find(chart), find(base))
	}
	same("the gateway configs", chartConfig(t, chart), gatewayYAML(t, base.one(t, "ConfigMap")))

	// The Role follows discovery: without the pod labels, no pods rule
	// (what the base's role.yaml says an operator may drop).
	noPods := rendered(helmTemplate(t, "switchboard", ns, "--set", "discovery.kubernetes.role_label="))
	rules, _, _ := unstructured.NestedSlice(noPods.one(t, "Role").Object, "rules")
	if len(rules) != 1 || !reflect.DeepEqual(rules[0], field(base, "Role", "rules").([]any)[0]) {
		t.Errorf("with role_label \"\" the Role's rules are %v, want only the base's endpointslices rule", rules)
	}
}
