//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// deployDir holds the kustomizations the dry-run renders: the base and each
// overlay (and through the example overlay the servicemonitor component).
const deployDir = "../deploy/kubernetes"

// The Prometheus operator's ServiceMonitor CRD, from the release module
// pinned in tools/crds/go.mod.
const (
	promOperatorModule = "github.com/prometheus-operator/prometheus-operator"
	serviceMonitorCRD  = "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// TestKubeManifestsDryRun renders deploy/kubernetes/base and every overlay
// with kustomize's Go library (what kubectl apply -k runs), each into a
// fresh namespace, and creates every rendered object on kube.sh's
// kube-apiserver: the Namespace for real, the rest with server-side dry-run
// and strict field validation. So the apiserver's own validation, defaulting,
// admission (Pod Security among them) and, for the ServiceMonitor, the
// Prometheus operator's real CRD schema judge the manifests. An object fails
// the test when the server rejects it, warns about it (a Pod Security
// violation of the namespace's warn level, a deprecated API), or drops or
// changes a field it was sent (the server silently drops a field whose
// feature gate is off).
// It then checks what kustomize must keep wired for the gateway (the image,
// the patched environment, the references between the objects) and that the
// Deployment's pods would be admitted in their namespace.
// dryRunClients returns what a server-side dry-run test needs against
// kube.sh's kube-apiserver: a context ended with the test (2 minutes at
// most), a dynamic client recording the server's warnings in warns, and a
// REST mapper that knows the Prometheus operator's ServiceMonitor, whose
// real CRD it installs.
func dryRunClients(t *testing.T) (context.Context, dynamic.Interface, meta.RESTMapper, *warningRecorder) {
	t.Helper()
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
	t.Cleanup(cancel)
	installCRD(ctx, t, dyn, promOperatorCRD(ctx, t, serviceMonitorCRD))
	return ctx, dyn, restMapper(ctx, t, dc, schema.GroupKind{Group: "monitoring.coreos.com", Kind: "ServiceMonitor"}), warns
}

func TestKubeManifestsDryRun(t *testing.T) {
	ctx, dyn, mapper, warns := dryRunClients(t)

	dirs := []string{"base"}
	overlays, err := filepath.Glob(filepath.Join(deployDir, "overlays", "*", "kustomization.yaml"))
	if err != nil || len(overlays) == 0 {
		t.Fatalf("no overlays under %s/overlays (%v)", deployDir, err)
	}
	for _, o := range overlays {
		rel, _ := filepath.Rel(deployDir, filepath.Dir(o))
		dirs = append(dirs, filepath.ToSlash(rel))
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			ns := "switchboard-it-" + utilrand.String(6)
			objs := renderInto(t, dir, ns)
			created := dryRunAll(ctx, t, dyn, mapper, warns, ns, objs)
			r := rendered(objs)
			checkWiring(t, dir, ns, r)
			if dir != "base" {
				// An overlay's patches add to the base's environment.
				env := gatewayEnv(t, r)
				for _, want := range gatewayEnv(t, rendered(renderInto(t, "base", ns))) {
					if !slices.Contains(env, want) {
						t.Errorf("the gateway's env lacks the base's %s=%q after %s's patches: %v", want.Name, want.Value, dir, env)
					}
				}
			}
			checkPodAdmission(ctx, t, dyn, warns, ns, r, created)
		})
	}
}

// renderInto builds deploy/kubernetes/DIR with krusty through a kustomization of
// its own that sets namespace NS, the way an overlay on top of DIR would.
// deploy/kubernetes is copied into an in-memory file system (the
// kustomizations refer to each other by relative paths within it), so
// nothing is written to disk and the real files are what is rendered.
func renderInto(t *testing.T, dir, ns string) []*unstructured.Unstructured {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	const root = "/deploy/kubernetes"
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(deployDir, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(root, filepath.ToSlash(rel)), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	wrapper := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - ..%s/%s\n", ns, root, dir)
	if err := mem.WriteFile("/it/kustomization.yaml", []byte(wrapper)); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/it")
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objs := decodeObjects(t, out)
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return objs
}

// decodeObjects decodes a multi-document YAML stream the way the API
// machinery decodes a response (JSON numbers as int64), so what was sent
// and what the server returns compare field by field.
func decodeObjects(t *testing.T, yml []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(yml)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := utilyaml.ToJSON(doc)
		if err != nil {
			t.Fatal(err)
		}
		if string(js) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("decode %s: %v", doc, err)
		}
		objs = append(objs, u)
	}
}

// dryRunAll creates the rendered Namespaces for real (the other objects need
// theirs to exist; each is deleted when the test ends and then stays
// Terminating, no namespace controller runs) and every other object with
// server-side dry-run. It returns what the server answered, by kind/name.
func dryRunAll(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, warns *warningRecorder, ns string, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	t.Helper()
	created := map[string]*unstructured.Unstructured{}
	// Namespaces first, for real.
	var sawNS bool
	for _, o := range objs {
		if o.GroupVersionKind() != (schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}) {
			continue
		}
		sawNS = sawNS || o.GetName() == ns
		got := createChecked(ctx, t, dyn, mapper, warns, o, false)
		if got == nil {
			t.FailNow() // nothing else can be created
		}
		name := o.GetName()
		t.Cleanup(func() {
			_ = dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		created[objKey(o)] = got
	}
	if !sawNS {
		t.Fatalf("the rendering has no Namespace %s, the namespace of its objects: kubectl apply -k on a fresh cluster would fail", ns)
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1" {
			continue
		}
		if o.GetNamespace() != "" && o.GetNamespace() != ns {
			t.Errorf("%s: in namespace %s, not the kustomization's %s", objKey(o), o.GetNamespace(), ns)
		}
		if got := createChecked(ctx, t, dyn, mapper, warns, o, true); got != nil {
			created[objKey(o)] = got
		}
	}
	return created
}

// createChecked creates o (with dry-run: the server validates, defaults and
// admits it, and stores nothing) with strict field validation, and checks
// that the server answered without a warning and kept every field it was
// sent. It reports a failure and returns nil when the server refused o.
func createChecked(ctx context.Context, t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, warns *warningRecorder, o *unstructured.Unstructured, dryRun bool) *unstructured.Unstructured {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Errorf("%s: the apiserver does not serve %s: %v", objKey(o), gvk, err)
		return nil
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if o.GetNamespace() == "" {
			t.Errorf("%s: namespaced, but kustomize left it without a namespace", objKey(o))
			return nil
		}
		ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	} else if o.GetNamespace() != "" {
		t.Errorf("%s: cluster-scoped, but has namespace %s", objKey(o), o.GetNamespace())
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict, FieldManager: "switchboard-it"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	warns.reset()
	got, err := ri.Create(ctx, o, opts)
	if err != nil {
		t.Errorf("%s: the apiserver refused it: %v", objKey(o), err)
		return nil
	}
	for _, w := range warns.take() {
		t.Errorf("%s: the apiserver warned: %s", objKey(o), w)
	}
	if diffs := lost("", o.Object, got.Object); len(diffs) > 0 {
		t.Errorf("%s: the apiserver did not keep what it was sent (a field behind a disabled feature gate, or one it normalizes):\n\t%s",
			objKey(o), strings.Join(diffs, "\n\t"))
	}
	return got
}

// lost lists the fields of sent that got lacks or has with another value;
// what the server adds (defaults, metadata) is fine.
func lost(at string, sent, got any) []string {
	switch s := sent.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return []string{fmt.Sprintf("%s: sent an object, the server has %v", at, got)}
		}
		var out []string
		for _, k := range slices.Sorted(maps.Keys(s)) {
			gv, ok := g[k]
			if !ok {
				out = append(out, fmt.Sprintf("%s.%s: dropped (sent %v)", at, k, s[k]))
				continue
			}
			out = append(out, lost(at+"."+k, s[k], gv)...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(s) {
			return []string{fmt.Sprintf("%s: sent %v, the server has %v", at, s, got)}
		}
		var out []string
		for i := range s {
			out = append(out, lost(fmt.Sprintf("%s[%d]", at, i), s[i], g[i])...)
		}
		return out
	default:
		if !reflect.DeepEqual(sent, got) {
			return []string{fmt.Sprintf("%s: sent %v, the server has %v", at, sent, got)}
		}
		return nil
	}
}

func objKey(o *unstructured.Unstructured) string { return o.GetKind() + "/" + o.GetName() }

// warningRecorder collects the apiserver's Warning headers of one request
// at a time (the test's requests are sequential).
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeaderWithContext(_ context.Context, code int, _, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) reset() { w.take() }

func (w *warningRecorder) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.msgs
	w.msgs = nil
	return m
}

// promOperatorCRD reads a CRD manifest from the Prometheus operator release
// pinned in tools/crds/go.mod: go mod download there fetches the module zip
// once (4 MB, verified against that go.sum) into the module cache.
func promOperatorCRD(ctx context.Context, t *testing.T, file string) *unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", promOperatorModule)
	cmd.Dir = "tools/crds"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var mod struct{ Version, Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); err != nil || jerr != nil || mod.Error != "" {
		t.Fatalf("go mod download %s in tools/crds: %v %v %s\n%s", promOperatorModule, err, jerr, mod.Error, stderr.Bytes())
	}
	b, err := os.ReadFile(filepath.Join(mod.Dir, filepath.FromSlash(file)))
	if err != nil {
		t.Fatalf("%s@%s: %v", promOperatorModule, mod.Version, err)
	}
	objs := decodeObjects(t, b)
	if len(objs) != 1 || objs[0].GetKind() != "CustomResourceDefinition" {
		t.Fatalf("%s@%s %s: want one CustomResourceDefinition, got %d objects", promOperatorModule, mod.Version, file, len(objs))
	}
	t.Logf("CRD %s from %s@%s", objs[0].GetName(), promOperatorModule, mod.Version)
	return objs[0]
}

// installCRD applies crd for real (server-side apply: a rerun on the same
// control plane updates it) and waits until it is Established. It stays
// installed: CRDs are cluster-wide, and the next run applies it again.
func installCRD(ctx context.Context, t *testing.T, dyn dynamic.Interface, crd *unstructured.Unstructured) {
	t.Helper()
	crds := dyn.Resource(crdGVR)
	if _, err := crds.Apply(ctx, crd.GetName(), crd, metav1.ApplyOptions{FieldManager: "switchboard-it", Force: true}); err != nil {
		t.Fatalf("apply CRD %s: %v", crd.GetName(), err)
	}
	for {
		got, err := crds.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get CRD %s: %v", crd.GetName(), err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if c, ok := c.(map[string]any); ok && c["type"] == "Established" && c["status"] == "True" {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("CRD %s not Established: %v", crd.GetName(), conds)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restMapper maps kinds to resources from the apiserver's discovery, once
// discovery lists the kind want (a CRD just established may take a moment).
func restMapper(ctx context.Context, t *testing.T, dc discovery.DiscoveryInterface, want schema.GroupKind) meta.RESTMapper {
	t.Helper()
	for {
		groups, err := restmapper.GetAPIGroupResources(dc)
		if err != nil {
			t.Fatalf("discovery: %v", err)
		}
		m := restmapper.NewDiscoveryRESTMapper(groups)
		if _, err = m.RESTMapping(want); err == nil {
			return m
		}
		select {
		case <-ctx.Done():
			t.Fatalf("discovery does not list %s: %v", want, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// renderedObjects is a rendering, by kind.
type renderedObjects map[string][]*unstructured.Unstructured

func rendered(objs []*unstructured.Unstructured) renderedObjects {
	r := renderedObjects{}
	for _, o := range objs {
		r[o.GetKind()] = append(r[o.GetKind()], o)
	}
	return r
}

func (r renderedObjects) one(t *testing.T, kind string) *unstructured.Unstructured {
	t.Helper()
	if len(r[kind]) != 1 {
		t.Fatalf("the rendering has %d %s objects, want 1", len(r[kind]), kind)
	}
	return r[kind][0]
}

func (r renderedObjects) has(kind, name string) bool {
	return slices.ContainsFunc(r[kind], func(o *unstructured.Unstructured) bool { return o.GetName() == name })
}

// gatewayContainer is the Deployment's only container, as rendered.
func gatewayContainer(t *testing.T, r renderedObjects) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(r.one(t, "Deployment").Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("the Deployment has %d containers, want 1", len(cs))
	}
	return cs[0].(map[string]any)
}

type envVar struct{ Name, Value string }

// gatewayEnv is the gateway container's environment in order (valueFrom
// entries with an empty value).
func gatewayEnv(t *testing.T, r renderedObjects) []envVar {
	t.Helper()
	list, _, _ := unstructured.NestedSlice(gatewayContainer(t, r), "env")
	var env []envVar
	for _, e := range list {
		e := e.(map[string]any)
		v, _ := e["value"].(string)
		env = append(env, envVar{e["name"].(string), v})
	}
	return env
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// checkWiring checks what kustomize rewrites and the gateway depends on,
// in the rendering of DIR (cmd/gateway/deploy_test.go checks the files
// themselves): the image is the one DIR's kustomization sets; every $(VAR)
// in the environment refers to a variable defined before it (Kubernetes
// expands only those: a patch that reorders or drops one leaves the
// literal text); the config volume, the ServiceAccount and the Role are
// the rendered objects' names; the RoleBinding binds the ServiceAccount in
// the namespace the gateway runs in; and the Services, the
// PodDisruptionBudget and any ServiceMonitor select what they should.
func checkWiring(t *testing.T, dir, ns string, r renderedObjects) {
	t.Helper()
	dep := r.one(t, "Deployment")
	c := gatewayContainer(t, r)

	raw, err := os.ReadFile(filepath.Join(deployDir, dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k types.Kustomization
	if err := k.Unmarshal(raw); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if len(k.Images) > 0 {
		var want []string
		for _, img := range k.Images {
			switch {
			case img.Digest != "":
				want = append(want, img.NewName+"@"+img.Digest)
			case img.NewTag != "":
				want = append(want, img.NewName+":"+img.NewTag)
			}
		}
		if img, _ := c["image"].(string); !slices.Contains(want, img) {
			t.Errorf("the gateway's image is %q, want one %s/kustomization.yaml sets: %q (an images entry whose name matches no image as the base renders it does nothing)", img, dir, want)
		}
	}

	defined := map[string]bool{}
	for _, e := range gatewayEnv(t, r) {
		for _, m := range envRef.FindAllStringSubmatch(e.Value, -1) {
			if !defined[m[1]] {
				t.Errorf("env %s=%q refers to $(%s), which is not defined before it", e.Name, e.Value, m[1])
			}
		}
		defined[e.Name] = true
	}

	pod, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	vols, _, _ := unstructured.NestedSlice(pod, "volumes")
	var cms int
	for _, v := range vols {
		if name, ok, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name"); ok {
			cms++
			if !r.has("ConfigMap", name) {
				t.Errorf("volume %v mounts ConfigMap %s, which the rendering does not have", v.(map[string]any)["name"], name)
			}
		}
	}
	if cms == 0 {
		t.Error("the Deployment mounts no ConfigMap (the gateway's config)")
	}
	sa, _ := pod["serviceAccountName"].(string)
	if !r.has("ServiceAccount", sa) {
		t.Errorf("the Deployment runs as ServiceAccount %q, which the rendering does not have", sa)
	}
	checkBindingsAndSelectors(t, r, ns, sa, podLabels)
	for _, sm := range r["ServiceMonitor"] {
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		var scraped bool
		for _, svc := range r["Service"] {
			if svc.GetNamespace() != sm.GetNamespace() || !testutil.Selects(sel, svc.GetLabels()) {
				continue
			}
			ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			for _, ep := range eps {
				for _, p := range ports {
					if ep.(map[string]any)["port"] == p.(map[string]any)["name"] {
						scraped = true
					}
				}
			}
		}
		if !scraped {
			t.Errorf("ServiceMonitor %s selects no port of a Service in its namespace %s", sm.GetName(), sm.GetNamespace())
		}
	}
}

// checkPodAdmission creates, with dry-run, the Pod the Deployment's
// ReplicaSet would create from the template the server returned: Pod
// Security enforcement applies to Pods only (on a Deployment it merely
// warns), so this is what shows that the gateway's pods start in their
// namespace. A copy with hostNetwork, which every enforced level refuses,
// shows the enforcement is on.
// checkBindingsAndSelectors checks that every RoleBinding of r refers to
// a Role r has and binds only the gateway's ServiceAccount ns/sa, and that
// every Service and PodDisruptionBudget selects the gateway's pods
// (podLabels).
func checkBindingsAndSelectors(t *testing.T, r renderedObjects, ns, sa string, podLabels map[string]string) {
	t.Helper()
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
}

func checkPodAdmission(ctx context.Context, t *testing.T, dyn dynamic.Interface, warns *warningRecorder, ns string, r renderedObjects, created map[string]*unstructured.Unstructured) {
	t.Helper()
	dep, ns0 := created[objKey(r.one(t, "Deployment"))], created["Namespace/"+ns]
	if dep == nil || ns0 == nil {
		return // refused above
	}
	level := ns0.GetLabels()["pod-security.kubernetes.io/enforce"]
	if level == "" || level == "privileged" {
		t.Errorf("namespace %s enforces Pod Security level %q: want baseline or restricted (the gateway needs no privileges)", ns, level)
		return
	}
	tmpl, _, _ := unstructured.NestedMap(dep.Object, "spec", "template")
	pod := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": tmpl["metadata"], "spec": tmpl["spec"]}}
	pod.SetName(dep.GetName() + "-dry-run")
	pod.SetNamespace(ns)
	pods := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Namespace(ns)
	opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
	warns.reset()
	if _, err := pods.Create(ctx, pod, opts); err != nil {
		t.Errorf("the Deployment's pod is not admitted in namespace %s (Pod Security %s): %v", ns, level, err)
	}
	for _, w := range warns.take() {
		t.Errorf("the Deployment's pod: the apiserver warned: %s", w)
	}

	bad := pod.DeepCopy()
	if err := unstructured.SetNestedField(bad.Object, true, "spec", "hostNetwork"); err != nil {
		t.Fatal(err)
	}
	_, err := pods.Create(ctx, bad, opts)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
		t.Errorf("a pod with hostNetwork in namespace %s (Pod Security %s): %v, want refused by PodSecurity", ns, level, err)
	}
	warns.reset()
}
