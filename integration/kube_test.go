//go:build integration

package integration

import (
	"bufio"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// kubeConfig is the admin client configuration of the control plane that
// integration/kube.sh starts (IT_KUBE_URL, IT_KUBE_TOKEN, IT_KUBE_CA); the
// test is skipped when they are not set.
func kubeConfig(t *testing.T) *rest.Config {
	t.Helper()
	url, token, ca := os.Getenv("IT_KUBE_URL"), os.Getenv("IT_KUBE_TOKEN"), os.Getenv("IT_KUBE_CA")
	if url == "" || token == "" || ca == "" {
		t.Skip("IT_KUBE_URL, IT_KUBE_TOKEN and IT_KUBE_CA are not all set: run the test under integration/kube.sh, " +
			"which starts a real etcd and kube-apiserver: integration/kube.sh run go test -tags integration -run TestKube ./integration/")
	}
	return &rest.Config{
		Host:            url,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: ca},
		QPS:             100,
		Burst:           200,
		Timeout:         30 * time.Second,
	}
}

// kubeNamespace creates a namespace of its own for the test (no namespace
// controller runs, so a deleted one stays Terminating: never reuse one).
func kubeNamespace(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "switchboard-it-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// pinnedKubeVersion is the k8s.io/kubernetes version integration/tools/kube
// builds kube-apiserver from.
func pinnedKubeVersion(t *testing.T) string {
	t.Helper()
	f, err := os.Open("tools/kube/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for s := bufio.NewScanner(f); s.Scan(); {
		if fields := strings.Fields(s.Text()); len(fields) >= 2 && fields[0] == "k8s.io/kubernetes" && strings.HasPrefix(fields[1], "v") {
			return fields[1]
		}
	}
	t.Fatal("tools/kube/go.mod does not require k8s.io/kubernetes")
	return ""
}

type sliceEvent struct {
	op    string // add, update, delete
	slice *discoveryv1.EndpointSlice
}

// TestKubeControlPlane checks the control plane itself: the apiserver is the
// pinned release, and EndpointSlices created, edited and deleted through it
// reach a label-filtered informer (the real server honours the selector,
// which client-go's fake clientset does not).
func TestKubeControlPlane(t *testing.T) {
	cfg := kubeConfig(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if want := pinnedKubeVersion(t); v.GitVersion != want {
		t.Errorf("server version %q (%s), want %q", v.GitVersion, v.GoVersion, want)
	}

	ns := kubeNamespace(t, cs)
	const service = "engines"
	selector := discoveryv1.LabelServiceName + "=" + service
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	events := make(chan sliceEvent, 100)
	informer := factory.Discovery().V1().EndpointSlices().Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { events <- sliceEvent{"add", obj.(*discoveryv1.EndpointSlice)} },
		UpdateFunc: func(_, obj any) { events <- sliceEvent{"update", obj.(*discoveryv1.EndpointSlice)} },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			events <- sliceEvent{"delete", obj.(*discoveryv1.EndpointSlice)}
		},
	}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the EndpointSlice informer did not sync")
	}

	next := func(op string) *discoveryv1.EndpointSlice {
		t.Helper()
		select {
		case e := <-events:
			if e.op != op {
				t.Fatalf("informer event %s %s, want %s", e.op, e.slice.Name, op)
			}
			return e.slice
		case <-time.After(20 * time.Second):
			t.Fatalf("no %s event from the informer within 20 s", op)
			return nil
		}
	}

	yes, no := true, false
	port, portName := int32(8000), "http"
	slice := func(name, svc, addr string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{addr},
				Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name + "-pod"},
			}},
			Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: &port}},
		}
	}
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	// A slice of another Service first: the selector must keep it out.
	if _, err := slices.Create(ctx, slice("other-abcde", "other", "10.0.0.9"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create EndpointSlice: %v", err)
	}
	if _, err := slices.Create(ctx, slice("engines-abcde", service, "10.0.0.1"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create EndpointSlice: %v", err)
	}
	got := next("add")
	if got.Name != "engines-abcde" || len(got.Endpoints) != 1 || got.Endpoints[0].Addresses[0] != "10.0.0.1" ||
		!*got.Endpoints[0].Conditions.Ready || *got.Ports[0].Name != "http" || *got.Ports[0].Port != 8000 {
		t.Fatalf("added slice %s: %+v %+v", got.Name, got.Endpoints, got.Ports)
	}

	// The endpoint turns terminating, as on a graceful scale-down.
	got.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
	if _, err := slices.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update EndpointSlice: %v", err)
	}
	if got = next("update"); *got.Endpoints[0].Conditions.Ready || !*got.Endpoints[0].Conditions.Terminating {
		t.Fatalf("updated slice conditions %+v, want not ready and terminating", got.Endpoints[0].Conditions)
	}

	if err := slices.Delete(ctx, got.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete EndpointSlice: %v", err)
	}
	if got = next("delete"); got.Name != "engines-abcde" {
		t.Fatalf("deleted slice %s, want engines-abcde", got.Name)
	}
	select {
	case e := <-events:
		t.Fatalf("unexpected informer event %s %s", e.op, e.slice.Name)
	case <-time.After(200 * time.Millisecond):
	}
	list, err := slices.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatalf("list EndpointSlices %s: %v", selector, err)
	}
	if len(list.Items) != 0 {
		t.Fatalf("list EndpointSlices %s: %d items after the delete, want none", selector, len(list.Items))
	}
}
