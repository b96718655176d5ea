//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
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
// renders its NOTES.txt with a client-side dry-run install: the rollout
// command, the console's port-forward and address, and a curl that sends
// an API key exactly when keys are on (all-values: auth.required).
func TestHelmLint(t *testing.T) {
	const curlKey = `curl -s localhost:8080/v1/models -H "Authorization: Bearer $API_KEY"`
	for _, tc := range []struct {
		args    []string
		withKey bool
	}{{nil, false}, {[]string{"-f", allValuesFile}, true}} {
		args := tc.args
		out, stderr, err := helm(t, append([]string{"lint", "--strict", chartDir}, args...)...)
		if err != nil {
			t.Errorf("helm lint --strict %v: %v\n%s%s", args, err, out, stderr)
		}
		out, stderr, err = helm(t, append([]string{"install", "switchboard", chartDir, "--namespace", "gw", "--dry-run=client"}, args...)...)
		_, notes, _ := strings.Cut(out, "NOTES:")
		if err != nil {
			t.Errorf("helm install --dry-run=client %v: %v\n%s", args, err, stderr)
		}
		for _, want := range []string{
			"kubectl -n gw rollout status deployment/switchboard",
			"kubectl -n gw port-forward svc/switchboard-admin 9464:9464",
			"open http://127.0.0.1:9464/console/",
		} {
			if !strings.Contains(notes, want) {
				t.Errorf("helm install --dry-run=client %v: NOTES without %q:\n%s", args, want, notes)
			}
		}
		if strings.Contains(notes, curlKey) != tc.withKey {
			t.Errorf("helm install --dry-run=client %v: NOTES with %q is %v, want %v:\n%s", args, curlKey, !tc.withKey, tc.withKey, notes)
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
		{"typo under discovery.kubernetes", "discovery:\n  kubernetes:\n    servce: vllm\n", "'servce' not allowed"},
		{"redis IPv6 address without brackets", "redis:\n  address: \"::1:6379\"\n", "at '/redis/address'"},
		{"admin token key ..data", "adminToken:\n  key: ..data\n", "at '/adminToken/key'"},
		{"admin token key with a slash", "adminToken:\n  key: a/tokens\n", "at '/adminToken/key'"},
		{"read token key ..2026_12_05", "adminReadToken:\n  key: ..2026_12_05\n", "at '/adminReadToken/key'"},
		{"read token key with a slash", "adminReadToken:\n  key: ../tokens\n", "at '/adminReadToken/key'"},
		{"short read token", "adminReadToken:\n  create: true\n  tokens: [short]\n", "at '/adminReadToken/tokens/0'"},
		{"unknown adminReadToken key", "adminReadToken:\n  secret: x\n", "'secret' not allowed"},
		{"ServiceMonitor authorization without a key", "serviceMonitor:\n  authorization:\n    name: metrics-token\n", "at '/serviceMonitor/authorization'"},
		{"ServiceMonitor authorization type", "serviceMonitor:\n  authorization:\n    type: Basic\n", "'type' not allowed"},
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
	// Not a schema matter: create without tokens, or with existingSecret
	// too (one would be ignored), fails with the chart's message.
	for _, v := range []string{"adminToken", "adminReadToken"} {
		_, stderr, err := helm(t, "template", "switchboard", chartDir, "--set", v+".create=true")
		if err == nil || !strings.Contains(stderr, v+".tokens is empty") {
			t.Errorf("helm template with %s.create and no tokens: %v, want the chart's message:\n%s", v, err, stderr)
		}
		_, stderr, err = helm(t, "template", "switchboard", chartDir, "--set", v+".create=true",
			"--set", v+".tokens[0]=it-both-token-0123456789abcdef", "--set", v+".existingSecret=ops-tokens")
		if want := v + ".existingSecret (ops-tokens) and " + v + ".create are both set"; err == nil || !strings.Contains(stderr, want) {
			t.Errorf("helm template with %s.create and %s.existingSecret: %v, want the chart's message %q:\n%s", v, v, err, want, stderr)
		}
	}
}

// TestHelmSchemaAccepts: values the schema must let through render into
// the config as given: Redis at a bracketed IPv6 address, token keys
// with a single leading dot, and every discovery.kubernetes key the
// gateway has.
func TestHelmSchemaAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		key  string // the config key the first --set value lands in
		want any
	}{
		{"redis IPv6 loopback", []string{"redis.address=[::1]:6379"}, "limits.redis.address", "[::1]:6379"},
		{"redis IPv6", []string{"redis.address=[fd00:10:96::a]:6380"}, "limits.redis.address", "[fd00:10:96::a]:6380"},
		{"redis IPv4", []string{"redis.address=10.0.0.7:6379"}, "limits.redis.address", "10.0.0.7:6379"},
		{"admin token key with a dot", []string{"adminToken.existingSecret=ops", "adminToken.key=.tokens"}, "admin.auth.tokens_file", "/etc/switchboard-admin/.tokens"},
		{"read token key", []string{"adminReadToken.existingSecret=ops-read", "adminReadToken.key=read.tokens"}, "admin.auth.read_tokens_file", "/etc/switchboard-admin-read/read.tokens"},
		{"discovery.kubernetes models_label", []string{"discovery.kubernetes.models_label=example.com/model"}, "discovery.kubernetes.models_label", "example.com/model"},
		{"discovery.kubernetes kv_events_port", []string{"discovery.kubernetes.kv_events_port=zmq"}, "discovery.kubernetes.kv_events_port", "zmq"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			for _, kv := range tc.set {
				args = append(args, "--set", kv)
			}
			cfg := chartConfig(t, rendered(helmTemplate(t, "switchboard", "gw", args...)))
			if got := lookup(cfg, tc.key); got != tc.want {
				t.Errorf("with %v, config %s = %v, want %v", tc.set, tc.key, got, tc.want)
			}
		})
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
	ctx, dyn, mapper, warns := dryRunClients(t)

	for _, tc := range []struct {
		name  string
		args  []string
		kinds []string // what the rendering must hold, sorted
		check func(t *testing.T, r renderedObjects)
	}{
		{"defaults", nil, []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "Service", "ServiceAccount"}, nil},
		{"all", []string{"-f", allValuesFile}, []string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "Secret", "Service", "Service", "ServiceAccount", "ServiceMonitor"}, checkAllValues},
		{"fsGroup", []string{"--set", "podSecurityContext.fsGroup=65532", "--set", "adminToken.existingSecret=" + existingAdminSecret},
			[]string{"ConfigMap", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "Service", "ServiceAccount"}, nil},
		{"no discovery, existing admin Secret", []string{"--set", "discovery.enabled=false", "--set", "podDisruptionBudget.enabled=false",
			"--set", "config.engines[0].name=vllm-0", "--set", "config.engines[0].url=http://vllm-0.vllm:8000",
			"--set", "adminToken.existingSecret=" + existingAdminSecret},
			[]string{"ConfigMap", "Deployment", "Service", "Service", "ServiceAccount"}, nil},
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
			if tc.check != nil {
				tc.check(t, r)
			}
			checkPodAdmission(ctx, t, dyn, warns, ns, r, created)
		})
	}
}

// checkAllValues checks, in the rendering of ci/all-values.yaml, what
// checkChartWiring checks in general, by value: the read-only tokens'
// Secret the chart creates holds the listed token, is mounted (mode 0444)
// as /etc/switchboard-admin-read, apart from the config and the write
// tokens, and named in admin.auth.read_tokens_file; and the
// ServiceMonitor's endpoint sends it as a bearer token.
func checkAllValues(t *testing.T, r renderedObjects) {
	t.Helper()
	const secret, dir = "switchboard-admin-read-token", "/etc/switchboard-admin-read"
	var s *unstructured.Unstructured
	for _, o := range r["Secret"] {
		if o.GetName() == secret {
			s = o
		}
	}
	if s == nil {
		t.Fatalf("the rendering has no Secret %s", secret)
	}
	if got, want := secretValue(t, s, "tokens"), "it-read-token-0123456789abcdef"; got != want { // the token alone, as the ServiceMonitor sends it
		t.Errorf("Secret %s's tokens = %q, want %q", secret, got, want)
	}
	gw := chartConfig(t, r)
	for key, want := range map[string]any{
		"admin.auth.read_tokens_file": dir + "/tokens",
		"admin.auth.tokens_file":      "/etc/switchboard-admin/tokens",
		"admin.auth.reads":            "token",
		"auth.required":               true, // the keys API keeps its keys in Redis only with it
	} {
		if got := lookup(gw, key); got != want {
			t.Errorf("config %s = %v, want %v", key, got, want)
		}
	}
	var mount, vol map[string]any
	vms, _, _ := unstructured.NestedSlice(gatewayContainer(t, r), "volumeMounts")
	for _, m := range vms {
		if m := m.(map[string]any); m["mountPath"] == dir {
			mount = m
		}
	}
	vols, _, _ := unstructured.NestedSlice(r.one(t, "Deployment").Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		if v := v.(map[string]any); mount != nil && v["name"] == mount["name"] {
			vol = v
		}
	}
	wantVol := map[string]any{"name": "admin-read-token", "secret": map[string]any{
		"secretName": secret, "defaultMode": int64(0o444),
		"items": []any{map[string]any{"key": "tokens", "path": "tokens"}},
	}}
	if mount == nil || mount["readOnly"] != true || !reflect.DeepEqual(vol, wantVol) {
		t.Errorf("the read-only tokens are mounted at %s as %v from volume %v, want a read-only mount of %v", dir, mount, vol, wantVol)
	}
	eps, _, _ := unstructured.NestedSlice(r.one(t, "ServiceMonitor").Object, "spec", "endpoints")
	wantAuth := map[string]any{"type": "Bearer", "credentials": map[string]any{"name": secret, "key": "tokens"}}
	if len(eps) != 1 || !reflect.DeepEqual(eps[0].(map[string]any)["authorization"], wantAuth) {
		t.Errorf("the ServiceMonitor's endpoints are %v, want one with authorization %v", eps, wantAuth)
	}
}

// existingAdminSecret is the admin tokens Secret TestHelmDryRun names in
// adminToken.existingSecret: the chart mounts it without rendering it.
const existingAdminSecret = "ops-admin-tokens"

// checkChartWiring checks the references between the chart's objects and
// into the gateway's config: every $(VAR) in the environment is defined
// before it; the ConfigMap, the ServiceAccount, the Role and the Secrets
// the pods mount are the rendered ones (or existingAdminSecret); the
// RoleBinding binds the pods' account in NS; the token is mounted exactly
// when discovery is on; the config's listeners are the container's ports;
// its admin.auth.tokens_file and read_tokens_file are the files of two
// different mounted Secrets, each a directory of its own with the mode
// the pod's fsGroup calls for, and every rendered Secret is one of them;
// its limits.redis.password_env is a variable the container has; the
// Services, the PodDisruptionBudget and the ServiceMonitor select what
// they should; and the ServiceMonitor sends a bearer token when reads need
// one, never of the write tokens' Secret, and, when it is a rendered
// Secret, one token alone.
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
	secretFiles := map[string]string{} // mounted file -> its Secret
	wantMode := int64(0o444)           // no fsGroup: the files are root's, 0440 would hide them from uid 65532
	if psc, _, _ := unstructured.NestedMap(pod, "securityContext"); psc["fsGroup"] != nil {
		wantMode = 0o440
	}
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
			dir := mounts[v["name"].(string)]
			for other := range maps.Values(mounts) {
				if other != dir && (strings.HasPrefix(dir, other+"/") || strings.HasPrefix(other, dir+"/")) {
					t.Errorf("Secret %s is mounted at %s, nested with the mount %s: each is a directory of its own", name, dir, other)
				}
			}
			if mode, _, _ := unstructured.NestedInt64(v, "secret", "defaultMode"); mode != wantMode {
				t.Errorf("Secret %s's volume has defaultMode %#o, want %#o", name, mode, wantMode)
			}
			items, _, _ := unstructured.NestedSlice(v, "secret", "items")
			for _, it := range items {
				secretFiles[dir+"/"+it.(map[string]any)["path"].(string)] = name
			}
		}
	}
	// Each admin tokens file in the config is a mounted Secret's file, each
	// mounted file is one of them, and the two are different Secrets.
	named := map[string]string{} // Secret -> the config key naming its file
	for _, key := range []string{"admin.auth.tokens_file", "admin.auth.read_tokens_file"} {
		got, _ := lookup(gw, key).(string)
		if got == "" {
			continue
		}
		secret, ok := secretFiles[got]
		if !ok {
			t.Errorf("config %s = %q, not a mounted Secret's file (those are %v)", key, got, secretFiles)
			continue
		}
		if other, dup := named[secret]; dup {
			t.Errorf("config %s and %s both name Secret %s's file", other, key, secret)
		}
		named[secret] = key
	}
	if len(named) != len(secretFiles) {
		t.Errorf("the mounted Secrets' files %v, the config names %v", secretFiles, named)
	}
	for _, s := range r["Secret"] {
		if _, ok := named[s.GetName()]; !ok {
			t.Errorf("Secret %s is rendered but not mounted as an admin tokens file", s.GetName())
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
	checkBindingsAndSelectors(t, r, ns, sa, podLabels)
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
		// With reads behind a token the scrape sends one: a read-only one,
		// the whole value of its Secret key.
		for _, ep := range eps {
			auth, hasAuth, _ := unstructured.NestedMap(ep.(map[string]any), "authorization")
			if lookup(gw, "admin.auth.reads") == "token" && !hasAuth {
				t.Errorf("ServiceMonitor %s scrapes without authorization, but admin.auth.reads is token", sm.GetName())
			}
			if !hasAuth {
				continue
			}
			secret, _, _ := unstructured.NestedString(auth, "credentials", "name")
			key, _, _ := unstructured.NestedString(auth, "credentials", "key")
			if auth["type"] != "Bearer" || secret == "" || key == "" {
				t.Errorf("ServiceMonitor %s's authorization is %v, want type Bearer and credentials {name, key}", sm.GetName(), auth)
			}
			if named[secret] == "admin.auth.tokens_file" {
				t.Errorf("ServiceMonitor %s sends a token of Secret %s, the write tokens: want a read-only one", sm.GetName(), secret)
			}
			for _, s := range r["Secret"] {
				if s.GetName() != secret {
					continue
				}
				if named[secret] != "admin.auth.read_tokens_file" {
					t.Errorf("ServiceMonitor %s sends Secret %s, which is not the read-only tokens file's", sm.GetName(), secret)
				}
				if v := secretValue(t, s, key); len(strings.Fields(v)) != 1 || strings.TrimSpace(v) != v {
					t.Errorf("ServiceMonitor %s sends Secret %s's key %s, %q: want exactly one token and nothing around it (the header carries the whole value)", sm.GetName(), secret, key, v)
				}
			}
		}
	}
}

// secretValue is the decoded value of a rendered Secret's key ("" when it
// has none).
func secretValue(t *testing.T, s *unstructured.Unstructured, key string) string {
	t.Helper()
	enc, _, _ := unstructured.NestedString(s.Object, "data", key)
	b, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Errorf("Secret %s's %s is not base64: %v", s.GetName(), key, err)
	}
	return string(b)
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

// TestHelmGatewayStartsOnConfig starts the gateway binary (IT_GATEWAY_BIN,
// else a fresh build) on the gateway.yaml the chart renders, with its
// defaults and with ci/all-values.yaml, and waits for /ready: the
// gateway's own loader accepts the rendering as it is, every key and
// value, where TestHelmDryRun only shows the API server takes the
// ConfigMap. What the pod would have is made here: the Secrets' files
// are written out and named by their config keys' variables, Redis is a
// local one (internal/redistest) with the password in the variable
// limits.redis.password_env names, and the listeners are overridden by
// --listen and --admin-listen. With no API server, discovery is turned
// off and one simulated engine serves instead. Through the admin
// listener it then checks the tokens took effect: with all-values,
// reads need a token and the read-only one reads but may not write (403
// admin_token_read_only), the admin one may; with the defaults, reads
// are open and writes refused (no token configured). On the public
// listener: with the defaults (no key) /v1/models is open; with
// all-values (auth.required, Redis) it is 401 without a key, and a key
// the keys API creates with the admin token serves. SIGTERM ends it
// with status 0.
func TestHelmGatewayStartsOnConfig(t *testing.T) {
	helmBin(t)
	bin := build(t, t.TempDir(), "./cmd/gateway")
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"defaults", nil},
		{"all", []string{"-f", allValuesFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rendered(helmTemplate(t, "switchboard", "gw", tc.args...))
			dir := t.TempDir()
			text, _, _ := unstructured.NestedString(r.one(t, "ConfigMap").Object, "data", "gateway.yaml")
			cfgPath := filepath.Join(dir, "gateway.yaml")
			if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			gw := chartConfig(t, r)
			env := []string{
				"OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_EXPORTER=none", "OTEL_LOGS_EXPORTER=none",
				"SWITCHBOARD_DISCOVERY__KUBERNETES__ENABLED=false", "SWITCHBOARD_SIMULATE__ENGINES=1",
				"SWITCHBOARD_SERVER__DRAIN_DELAY=0s",
			}
			files, tokens := writeSecretFiles(t, r, dir)
			for key, name := range map[string]string{
				"admin.auth.tokens_file":      "SWITCHBOARD_ADMIN__AUTH__TOKENS_FILE",
				"admin.auth.read_tokens_file": "SWITCHBOARD_ADMIN__AUTH__READ_TOKENS_FILE",
			} {
				if f, _ := lookup(gw, key).(string); f != "" {
					local, ok := files[f]
					if !ok {
						t.Fatalf("config %s = %s, which no rendered Secret's file is (%v)", key, f, files)
					}
					env = append(env, name+"="+local)
				}
			}
			if lookup(gw, "limits.redis.address") != nil {
				rd := redistest.Start(t)
				env = append(env, "SWITCHBOARD_LIMITS__REDIS__ADDRESS="+rd.Addr())
				if pwEnv, _ := lookup(gw, "limits.redis.password_env").(string); pwEnv != "" {
					const pw = "it-helm-redis-password"
					c := redis.NewClient(&redis.Options{Addr: rd.Addr()})
					err := c.ConfigSet(context.Background(), "requirepass", pw).Err()
					_ = c.Close()
					if err != nil {
						t.Fatalf("redis CONFIG SET requirepass: %v", err)
					}
					env = append(env, pwEnv+"="+pw)
				}
			}
			public, admin := freePort(t), freePort(t)
			p := start(t, env, bin, "--config", cfgPath, "--listen", public, "--admin-listen", admin)
			waitHTTP(t, "http://"+public+"/ready", http.StatusOK)

			// call sends method to path on the listener at addr, with a
			// bearer token unless token is "", and the body, if any.
			call := func(addr, method, path, token, body string) (int, string) {
				t.Helper()
				req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
				return resp.StatusCode, string(b)
			}
			type want struct {
				method, path, token string
				status              int
				body                string // a part of the body, "" for any
			}
			var wants []want
			if lookup(gw, "admin.auth.reads") == "token" {
				read, write := tokens[lookup(gw, "admin.auth.read_tokens_file").(string)], tokens[lookup(gw, "admin.auth.tokens_file").(string)]
				wants = []want{
					{"GET", "/metrics", "", http.StatusUnauthorized, "missing_admin_token"},
					{"GET", "/metrics", read, http.StatusOK, "switchboard_"},
					{"POST", "/admin/reload", read, http.StatusForbidden, "admin_token_read_only"},
					{"POST", "/admin/reload", write, http.StatusOK, `"result"`},
				}
			} else {
				wants = []want{
					{"GET", "/metrics", "", http.StatusOK, "switchboard_"},
					{"POST", "/admin/reload", "", http.StatusForbidden, ""},
				}
			}
			for _, w := range wants {
				if status, body := call(admin, w.method, w.path, w.token, ""); status != w.status || !strings.Contains(body, w.body) {
					t.Errorf("%s %s with token %q: %d, want %d with %q:\n%.500s", w.method, w.path, w.token, status, w.status, w.body, body)
				}
			}

			// The public API: open with no key and auth.required off (the
			// defaults); with auth.required and Redis (all-values), no key
			// is 401 until the keys API creates one in Redis, which then
			// serves.
			if lookup(gw, "auth.required") == true {
				if status, body := call(public, "GET", "/v1/models", "", ""); status != http.StatusUnauthorized {
					t.Errorf("GET /v1/models without a key under auth.required: %d, want 401:\n%.500s", status, body)
				}
				write := tokens[lookup(gw, "admin.auth.tokens_file").(string)]
				status, body := call(admin, "POST", "/admin/keys", write, `{"name":"it-helm","models":["*"]}`)
				var created struct{ Key, Source string }
				if err := json.Unmarshal([]byte(body), &created); status != http.StatusCreated || err != nil || !strings.HasPrefix(created.Key, "sk-sb-") || created.Source != "api" {
					t.Fatalf("POST /admin/keys: %d (%v), want 201 with an sk-sb- key from source api:\n%.500s", status, err, body)
				}
				if status, body := call(public, "GET", "/v1/models", created.Key, ""); status != http.StatusOK || !strings.Contains(body, `"object":"list"`) {
					t.Errorf("GET /v1/models with the keys API's key: %d, want 200 with the model list:\n%.500s", status, body)
				}
			} else if status, body := call(public, "GET", "/v1/models", "", ""); status != http.StatusOK || !strings.Contains(body, `"object":"list"`) {
				t.Errorf("GET /v1/models with no key configured: %d, want 200 with the model list:\n%.500s", status, body)
			}

			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- p.cmd.Wait() }()
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("the gateway ended with %v after SIGTERM, want status 0", err)
				}
			case <-time.After(time.Minute):
				t.Fatal("the gateway did not exit within a minute of SIGTERM")
			}
		})
	}
}

// writeSecretFiles writes, under dir, the file of each rendered Secret the
// Deployment mounts, where the pod would have it (dir + the mount path +
// the item's path). It returns the pod's path of each file -> the local
// one, and the pod's path -> the file's first token.
func writeSecretFiles(t *testing.T, r renderedObjects, dir string) (files, first map[string]string) {
	t.Helper()
	files, first = map[string]string{}, map[string]string{}
	mounts := map[string]string{}
	vms, _, _ := unstructured.NestedSlice(gatewayContainer(t, r), "volumeMounts")
	for _, m := range vms {
		m := m.(map[string]any)
		mounts[m["name"].(string)] = m["mountPath"].(string)
	}
	vols, _, _ := unstructured.NestedSlice(r.one(t, "Deployment").Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		v := v.(map[string]any)
		name, ok, _ := unstructured.NestedString(v, "secret", "secretName")
		if !ok {
			continue
		}
		for _, s := range r["Secret"] {
			if s.GetName() != name {
				continue
			}
			items, _, _ := unstructured.NestedSlice(v, "secret", "items")
			for _, it := range items {
				it := it.(map[string]any)
				pod := mounts[v["name"].(string)] + "/" + it["path"].(string)
				local := filepath.Join(dir, filepath.FromSlash(pod))
				value := secretValue(t, s, it["key"].(string))
				if err := os.MkdirAll(filepath.Dir(local), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(local, []byte(value), 0o400); err != nil {
					t.Fatal(err)
				}
				files[pod] = local
				if f := strings.Fields(value); len(f) > 0 {
					first[pod] = f[0]
				}
			}
		}
	}
	return files, first
}
