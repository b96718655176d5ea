//go:build integration

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/switchboard-gw/switchboard/gateway/k8s"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// The engines' Service, port name and model in these tests.
const (
	kubeService = "vllm"
	kubePort    = "http"
	kubeModel   = "it-kube-model"
)

// kubeEnv is one test's namespace on the real control plane, with the
// gateway's ServiceAccount bound to deploy/kubernetes/base/role.yaml (or a
// variant) and a kubeconfig holding that account's token.
type kubeEnv struct {
	t          *testing.T
	cs         kubernetes.Interface // admin: the test's own edits
	ns         string
	kubeconfig string // the ServiceAccount's
	ip         string // the address the engines listen on (not loopback: the API refuses it in a slice)
}

// newKubeEnv makes a fresh namespace with the switchboard ServiceAccount,
// the Role of role.yaml with its verbs changed by verbs (nil: as shipped)
// and its RoleBinding, and writes a kubeconfig with a token of that
// account (TokenRequest), so the gateway runs with exactly what the
// manifests grant it.
func newKubeEnv(t *testing.T, verbs func([]string) []string) *kubeEnv {
	t.Helper()
	return newKubeEnvRole(t, func(role *rbacv1.Role) {
		if verbs != nil {
			for i := range role.Rules {
				role.Rules[i].Verbs = verbs(role.Rules[i].Verbs)
			}
		}
	})
}

// newKubeEnvRole is newKubeEnv with the shipped Role changed by edit.
func newKubeEnvRole(t *testing.T, edit func(*rbacv1.Role)) *kubeEnv {
	t.Helper()
	rc := kubeConfig(t)
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := kubeNamespace(t, cs)
	role := shippedRole(t)
	role.Namespace = ns
	edit(role)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "switchboard", Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "switchboard", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: ns}},
	}
	if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest: %v", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["it"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthority: rc.TLSClientConfig.CAFile}
	kc.AuthInfos["switchboard"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["it"] = &clientcmdapi.Context{Cluster: "it", AuthInfo: "switchboard", Namespace: ns}
	kc.CurrentContext = "it"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return &kubeEnv{t: t, cs: cs, ns: ns, kubeconfig: path, ip: engineIP(t)}
}

// shippedRole is deploy/kubernetes/base/role.yaml.
func shippedRole(t *testing.T) *rbacv1.Role {
	t.Helper()
	b, err := os.ReadFile("../deploy/kubernetes/base/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var r rbacv1.Role
	if err := yaml.UnmarshalStrict(b, &r); err != nil {
		t.Fatalf("role.yaml: %v", err)
	}
	return &r
}

// engineIP is an address of this machine the engines can listen on and an
// EndpointSlice may hold: the API server refuses loopback, link-local and
// unspecified addresses in a slice.
func engineIP(t *testing.T) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	t.Fatal("no non-loopback IPv4 address on this machine: EndpointSlices cannot point at loopback engines")
	return ""
}

// kubeEngine is a simulated engine serving on the test's engine address,
// named as its pod.
type kubeEngine struct {
	pod  string
	port int32
	sim  *enginesim.Engine
	srv  *http.Server
}

func (k *kubeEnv) engine(pod string) *kubeEngine {
	k.t.Helper()
	sim, err := enginesim.New(enginesim.Config{Name: pod, Models: []string{kubeModel}, TTFT: 5 * time.Millisecond, ITL: 5 * time.Millisecond})
	if err != nil {
		k.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(k.ip, "0"))
	if err != nil {
		k.t.Fatal(err)
	}
	e := &kubeEngine{pod: pod, port: int32(ln.Addr().(*net.TCPAddr).Port), sim: sim, srv: &http.Server{Handler: sim.Handler()}}
	go func() { _ = e.srv.Serve(ln) }()
	k.t.Cleanup(func() { _ = e.srv.Close() })
	return e
}

// slice is the EndpointSlice of one engine (each engine has its own port,
// so its own slice: the machine has one address), in the engines' Service.
func (k *kubeEnv) slice(e *kubeEngine, ready, terminating bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      kubeService + "-" + e.pod,
			Namespace: k.ns,
			Labels:    map[string]string{discoveryv1.LabelServiceName: kubeService, discoveryv1.LabelManagedBy: "switchboard-it"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new(kubePort), Port: new(e.port), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{k.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: new(ready), Serving: new(ready || terminating), Terminating: new(terminating)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: k.ns, Name: e.pod},
		}},
	}
}

func (k *kubeEnv) create(e *kubeEngine) {
	k.t.Helper()
	if _, err := k.cs.DiscoveryV1().EndpointSlices(k.ns).Create(context.Background(), k.slice(e, true, false), metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

func (k *kubeEnv) terminate(e *kubeEngine) {
	k.t.Helper()
	api := k.cs.DiscoveryV1().EndpointSlices(k.ns)
	cur, err := api.Get(context.Background(), kubeService+"-"+e.pod, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	next := k.slice(e, false, true)
	next.ResourceVersion = cur.ResourceVersion
	if _, err := api.Update(context.Background(), next, metav1.UpdateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

func (k *kubeEnv) remove(e *kubeEngine) {
	k.t.Helper()
	if err := k.cs.DiscoveryV1().EndpointSlices(k.ns).Delete(context.Background(), kubeService+"-"+e.pod, metav1.DeleteOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// twoOfThree starts three engines, vllm-0 to vllm-2, with slices for the
// first two only, and a round-robin gateway on them; it returns once the
// gateway is ready with both routable.
func (k *kubeEnv) twoOfThree() (g *kubeGateway, e0, e1, e2 *kubeEngine) {
	k.t.Helper()
	e0, e1, e2 = k.engine("vllm-0"), k.engine("vllm-1"), k.engine("vllm-2")
	k.create(e0)
	k.create(e1)
	g = k.startGateway(k.gatewayConfig("round-robin"))
	waitHTTP(k.t, "http://"+g.public+"/ready", 200)
	g.waitRoutable("vllm-0", "vllm-1")
	return g, e0, e1, e2
}

// kubeGateway is a gateway process discovering the test's engines.
type kubeGateway struct {
	t             *testing.T
	proc          *proc
	public, admin string
}

// gatewayConfig is the discovery config of these tests: the Service's
// slices in the test's namespace, the named port, 50 ms batches.
func (k *kubeEnv) gatewayConfig(policy string) string {
	return fmt.Sprintf(`server:
  listen: %%q
  health:
    interval: 1s
admin:
  listen: %%q
routing:
  policy: %s
log:
  access: false
telemetry:
  series_linger: 1s
discovery:
  kubernetes:
    enabled: true
    kubeconfig: %q
    namespaces: [%s]
    service: %s
    port: %s
    batch: 50ms
`, policy, k.kubeconfig, k.ns, kubeService, kubePort)
}

// startGateway starts the gateway binary with cfg (gatewayConfig, whose
// two %q are filled with free loopback ports) and returns once it runs;
// it does not wait for readiness.
func (k *kubeEnv) startGateway(cfg string) *kubeGateway {
	k.t.Helper()
	g := &kubeGateway{t: k.t, public: freePort(k.t), admin: freePort(k.t)}
	path := filepath.Join(k.t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(cfg, g.public, g.admin)), 0o600); err != nil {
		k.t.Fatal(err)
	}
	g.proc = start(k.t, []string{"OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_EXPORTER=none"}, build(k.t, k.t.TempDir(), "./cmd/gateway"), "--config", path)
	return g
}

// adminEngines is GET /admin/engines.
type adminEngines struct {
	Engines []struct {
		Name     string `json:"name"`
		URL      string `json:"url"`
		Routable bool   `json:"routable"`
		State    string `json:"state"`
		Prefill  int64  `json:"prefill"`
		Decode   int64  `json:"decode"`
		Retired  bool   `json:"retired"`
		Unready  bool   `json:"unready"`
		Role     string `json:"role"`
		Group    string `json:"group"`
	} `json:"engines"`
	LiveAttempts int64 `json:"live_attempts"`
	Requests     int64 `json:"requests_in_flight"`
}

func (g *kubeGateway) engines() adminEngines {
	g.t.Helper()
	resp, err := http.Get("http://" + g.admin + "/admin/engines")
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var a adminEngines
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		g.t.Fatal(err)
	}
	return a
}

// routable returns the names of the routable engines, sorted.
func (g *kubeGateway) routable() []string {
	var names []string
	for _, e := range g.engines().Engines {
		if e.Routable {
			names = append(names, e.Name)
		}
	}
	slices.Sort(names)
	return names
}

// waitRoutable polls until the routable engines are want (within 10 s:
// the batch, a probe and the informer's watch latency are all well under).
func (g *kubeGateway) waitRoutable(want ...string) {
	g.t.Helper()
	g.waitRoutableWithin(10*time.Second, want...)
}

func (g *kubeGateway) waitRoutableWithin(d time.Duration, want ...string) {
	g.t.Helper()
	slices.Sort(want)
	var got []string
	if !testutil.Poll(d, func() bool { got = g.routable(); return slices.Equal(got, want) }) {
		g.t.Fatalf("routable engines %v, want %v", got, want)
	}
}

// waitIdle polls until no request is in flight and every engine's gauges
// and the gateway's live attempts are 0, with no retired incarnation left.
func (g *kubeGateway) waitIdle() {
	g.t.Helper()
	var a adminEngines
	ok := testutil.Poll(10*time.Second, func() bool {
		a = g.engines()
		if a.LiveAttempts != 0 || a.Requests != 0 {
			return false
		}
		for _, e := range a.Engines {
			if e.Prefill != 0 || e.Decode != 0 || e.Retired {
				return false
			}
		}
		return true
	})
	if !ok {
		g.t.Fatalf("not idle: %+v", a)
	}
}

// activeGauges returns switchboard_engine_active_requests from the admin
// /metrics, "engine/phase" -> value.
func (g *kubeGateway) activeGauges() map[string]float64 {
	g.t.Helper()
	return testutil.Samples(testutil.Scrape(g.t, http.DefaultClient, "http://"+g.admin+"/metrics"), "switchboard_engine_active_requests", "engine", "phase")
}

// seriesOf returns the /metrics sample lines of engine (its engine label)
// or of its address (a gen_ai_client series with its server_port).
func (g *kubeGateway) seriesOf(engine string, port int32) []string {
	g.t.Helper()
	resp, err := http.Get("http://" + g.admin + "/metrics")
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []string
	for s := bufio.NewScanner(resp.Body); s.Scan(); {
		line := s.Text()
		if strings.Contains(line, `engine="`+engine+`"`) ||
			strings.HasPrefix(line, "gen_ai_client") && strings.Contains(line, fmt.Sprintf(`server_port="%d"`, port)) {
			out = append(out, line)
		}
	}
	return out
}

// chatOnce sends one request (streaming or not) and returns the engine
// that served it, or an error for anything but a complete success: a
// non-200, a stream without [DONE], or an error event.
func (g *kubeGateway) chatOnce(ctx context.Context, stream bool, session string, maxTokens int) (string, error) {
	body := fmt.Sprintf(`{"model":%q,"stream":%t,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, kubeModel, stream, maxTokens)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.public+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	engine := resp.Header.Get("X-Switchboard-Engine")
	switch {
	case err != nil:
		return engine, err
	case resp.StatusCode != http.StatusOK:
		return engine, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	case stream && (!strings.Contains(string(b), "data: [DONE]") || strings.Contains(string(b), `"error"`)):
		return engine, fmt.Errorf("incomplete stream: %s", b)
	}
	return engine, nil
}

// load runs workers sending requests (streams and not, alternating) until
// stop is called, which returns the count sent and the failures.
func (g *kubeGateway) load(workers int) (stop func() (sent int64, failures []string)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var sent atomic.Int64
	var mu sync.Mutex
	var failures []string
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				engine, err := g.chatOnce(context.Background(), (w+i)%2 == 0, "", 8)
				sent.Add(1)
				if err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("on %q: %v", engine, err))
					mu.Unlock()
				}
			}
		})
	}
	return func() (int64, []string) {
		cancel()
		wg.Wait()
		return sent.Load(), failures
	}
}

// TestKubeDiscoveryScaleUpAndDown runs the gateway binary with the
// shipped Role's ServiceAccount and Kubernetes discovery against the real
// API server, under a steady load, while the test edits EndpointSlices as
// a rollout would: engines appear and take traffic, one turns terminating
// while a long stream runs on it (the stream completes, new requests stop
// going there), its slice is deleted and its server stopped only then. No
// request fails; the gauges end at exactly 0, and the engine that left no
// longer has a series.
func TestKubeDiscoveryScaleUpAndDown(t *testing.T) {
	k := newKubeEnv(t, nil)
	g, e0, e1, e2 := k.twoOfThree()
	for _, e := range g.engines().Engines {
		if want := fmt.Sprintf("http://%s:%d", k.ip, map[string]int32{"vllm-0": e0.port, "vllm-1": e1.port}[e.Name]); e.URL != want {
			t.Errorf("engine %s at %s, want %s", e.Name, e.URL, want)
		}
	}

	stop := g.load(4)
	// Scale up: vllm-2 appears and takes its share.
	k.create(e2)
	g.waitRoutable("vllm-0", "vllm-1", "vllm-2")
	if !testutil.Poll(10*time.Second, func() bool { return e2.sim.Stats().Received > 0 }) {
		t.Fatal("vllm-2 received no request after it became routable")
	}

	// A long stream held on vllm-2 (about 1 s: 200 tokens, 5 ms apart).
	type result struct {
		engine string
		err    error
	}
	long := make(chan result, 1)
	var longOn string
	for i := 0; longOn != "vllm-2"; i++ {
		if i == 20 {
			t.Fatal("no long stream landed on vllm-2 in 20 tries")
		}
		ch := make(chan result, 1)
		started := make(chan string, 1)
		go func() {
			engine, err := g.chatStarted(started, 200)
			ch <- result{engine, err}
		}()
		longOn = <-started
		if longOn == "vllm-2" {
			long = ch
		} else if r := <-ch; r.err != nil {
			t.Fatalf("a long stream on %s failed: %v", r.engine, r.err)
		}
	}

	// Scale down: vllm-2 terminates (ready false, serving, terminating).
	// It stays listed, draining, with exactly the long stream in flight
	// once the requests picked before the change have finished.
	k.terminate(e2)
	g.waitRoutable("vllm-0", "vllm-1")
	var st string
	if !testutil.Poll(10*time.Second, func() bool {
		for _, e := range g.engines().Engines {
			if e.Name == "vllm-2" {
				st = fmt.Sprintf("%+v", e)
				return e.State == "draining" && e.Unready && !e.Retired && e.Prefill == 0 && e.Decode == 1
			}
		}
		return false
	}) {
		t.Fatalf("vllm-2 while terminating with the long stream: %s, want draining, unready, decode 1", st)
	}
	if gauges := g.activeGauges(); gauges["vllm-2/decode"] != 1 || gauges["vllm-2/prefill"] != 0 {
		t.Errorf("vllm-2's gauges while it drains: decode %v prefill %v, want 1 and 0", gauges["vllm-2/decode"], gauges["vllm-2/prefill"])
	}
	// From here on (the load keeps running until stop) vllm-2 must receive
	// nothing.
	before := e2.sim.Stats().Received
	if r := <-long; r.err != nil || r.engine != "vllm-2" {
		t.Errorf("the stream in flight on the terminating engine: %v (on %s), want it complete", r.err, r.engine)
	}
	k.remove(e2)
	if !testutil.Poll(10*time.Second, func() bool {
		for _, e := range g.engines().Engines {
			if e.Name == "vllm-2" {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("vllm-2 still listed after its slice was deleted and its requests finished: %+v", g.engines())
	}
	_ = e2.srv.Close() // the pod is gone

	sent, failures := stop()
	if after := e2.sim.Stats().Received; after != before {
		t.Errorf("vllm-2 received %d requests after it turned terminating", after-before)
	}
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed during the scale-up and down, first: %s", len(failures), sent, failures[0])
	}
	if sent < 20 {
		t.Errorf("only %d requests under load", sent)
	}
	g.waitIdle()
	gauges := g.activeGauges()
	for _, name := range []string{"vllm-0/prefill", "vllm-0/decode", "vllm-1/prefill", "vllm-1/decode"} {
		if v, ok := gauges[name]; !ok || v != 0 {
			t.Errorf("gauge %s = %v (present %v), want 0", name, v, ok)
		}
	}
	// The drained incarnation reports a last 0 at the first collection
	// after its drain, then no series at all.
	gone := func() bool {
		for name := range g.activeGauges() {
			if strings.HasPrefix(name, "vllm-2/") {
				return false
			}
		}
		return true
	}
	if !testutil.Poll(10*time.Second, gone) {
		t.Errorf("the engine that left still has in-flight series: %v", g.activeGauges())
	}
	// Its latency histograms and the GenAI client series of its address
	// leave /metrics after telemetry.series_linger (1 s here).
	if !testutil.Poll(15*time.Second, func() bool { return len(g.seriesOf("vllm-2", e2.port)) == 0 }) {
		t.Errorf("series of the engine that left still on /metrics after the linger: %v", g.seriesOf("vllm-2", e2.port))
	}
	if len(g.seriesOf("vllm-0", e0.port)) == 0 {
		t.Error("no series of vllm-0 on /metrics: the check above cannot fail")
	}
}

// chatStarted sends a stream of maxTokens tokens and sends the engine
// serving it on started as soon as its headers arrive (before the
// stream ends); it returns like chatOnce.
func (g *kubeGateway) chatStarted(started chan<- string, maxTokens int) (string, error) {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"hello"}]}`, kubeModel, maxTokens)
	resp, err := http.Post("http://"+g.public+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		started <- ""
		return "", err
	}
	defer resp.Body.Close()
	engine := resp.Header.Get("X-Switchboard-Engine")
	started <- engine
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return engine, err
	case resp.StatusCode != http.StatusOK:
		return engine, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	case !strings.Contains(string(b), "data: [DONE]") || strings.Contains(string(b), `"error"`):
		return engine, fmt.Errorf("incomplete stream: %s", b)
	}
	return engine, nil
}

// TestKubeDiscoveryReplicasAgree runs two gateway replicas with
// session-affinity on the same API server. The first sees the engines
// arrive one by one, one of them leave and come back; the second starts
// after all that. Both route 1,000 session keys to the same engines.
func TestKubeDiscoveryReplicasAgree(t *testing.T) {
	k := newKubeEnv(t, nil)
	engines := []*kubeEngine{k.engine("vllm-3"), k.engine("vllm-1"), k.engine("vllm-0"), k.engine("vllm-2")}
	k.create(engines[0])
	a := k.startGateway(k.gatewayConfig("session-affinity"))
	waitHTTP(t, "http://"+a.public+"/ready", 200)
	for _, e := range engines[1:] {
		k.create(e)
	}
	k.remove(engines[2])
	a.waitRoutable("vllm-1", "vllm-2", "vllm-3")
	k.create(engines[2])
	a.waitRoutable("vllm-0", "vllm-1", "vllm-2", "vllm-3")

	b := k.startGateway(k.gatewayConfig("session-affinity"))
	waitHTTP(t, "http://"+b.public+"/ready", 200)
	b.waitRoutable("vllm-0", "vllm-1", "vllm-2", "vllm-3")

	ctx := context.Background()
	perEngine := map[string]int{}
	var differ []string
	for i := range 1000 {
		key := fmt.Sprintf("session-%04d", i)
		ea, err := a.chatOnce(ctx, false, key, 1)
		if err != nil {
			t.Fatalf("replica a, %s: %v", key, err)
		}
		eb, err := b.chatOnce(ctx, false, key, 1)
		if err != nil {
			t.Fatalf("replica b, %s: %v", key, err)
		}
		perEngine[ea]++
		if ea != eb {
			differ = append(differ, fmt.Sprintf("%s: %s vs %s", key, ea, eb))
		}
	}
	if len(differ) > 0 {
		t.Errorf("%d of 1000 session keys routed differently by the two replicas, first: %s", len(differ), differ[0])
	}
	if len(perEngine) != 4 {
		t.Errorf("sessions per engine %v, want all 4 engines used", perEngine)
	}
	a.waitIdle()
	b.waitIdle()
}

// TestKubeDiscoveryRoleMissingVerb: for each verb the shipped Role
// grants, the gateway whose Role lacks it refuses to start, saying which
// permission is missing in which namespace, for which account, and where
// the Role is. With the other tests, which run with the whole Role, this
// proves the Role grants what discovery uses and nothing more.
func TestKubeDiscoveryRoleMissingVerb(t *testing.T) {
	for _, verb := range shippedRole(t).Rules[0].Verbs {
		t.Run(verb, func(t *testing.T) {
			k := newKubeEnv(t, func(v []string) []string {
				return slices.DeleteFunc(slices.Clone(v), func(s string) bool { return s == verb })
			})
			g := k.startGateway(k.gatewayConfig("round-robin"))
			done := make(chan error, 1)
			go func() { done <- g.proc.cmd.Wait() }()
			select {
			case err := <-done:
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() == 0 {
					t.Fatalf("the gateway exited with %v, want a failure", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the gateway without %s permission still runs after 30 s", verb)
			}
			out := g.proc.output()
			for _, want := range []string{"may not " + verb + " endpointslices.discovery.k8s.io", fmt.Sprintf("namespace %q", k.ns), "role.yaml", "system:serviceaccount:" + k.ns + ":switchboard"} {
				if !strings.Contains(out, want) {
					t.Errorf("the gateway's output does not say %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestKubeRoleIsWhatDiscoveryUses: the shipped Role grants exactly
// k8s.Rules, what the discovery code uses (the positive side, that it is
// enough, is every test above, which runs with it).
func TestKubeRoleIsWhatDiscoveryUses(t *testing.T) {
	role := shippedRole(t)
	var got []k8s.Rule
	for _, r := range role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v names resources or URLs", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got = append(got, k8s.Rule{APIGroup: g, Resource: res, Verbs: slices.Sorted(slices.Values(r.Verbs))})
			}
		}
	}
	want := slices.Clone(k8s.Rules)
	for i := range want {
		want[i].Verbs = slices.Sorted(slices.Values(want[i].Verbs))
	}
	if !slices.EqualFunc(got, want, func(a, b k8s.Rule) bool {
		return a.APIGroup == b.APIGroup && a.Resource == b.Resource && slices.Equal(a.Verbs, b.Verbs)
	}) {
		t.Errorf("role.yaml grants %+v, discovery uses %+v", got, want)
	}
}

// TestKubeDiscoveryAPIServerRestart restarts kube-apiserver under load:
// the known engines keep serving throughout (no request fails), and once
// it is back the informers resume: a slice created afterwards is seen.
func TestKubeDiscoveryAPIServerRestart(t *testing.T) {
	script, dir := os.Getenv("IT_KUBE_SCRIPT"), os.Getenv("IT_KUBE_DIR")
	k := newKubeEnv(t, nil)
	if script == "" || dir == "" {
		t.Skip("IT_KUBE_SCRIPT and IT_KUBE_DIR are not set")
	}
	g, e0, e1, e2 := k.twoOfThree()

	stop := g.load(2)
	cmd := exec.Command(script, "restart", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		stop()
		t.Fatalf("kube.sh restart: %v\n%s", err, out)
	}
	// Some load on the restarted control plane's watch too.
	served := func() int64 { return e0.sim.Stats().Received + e1.sim.Stats().Received }
	mark := served()
	if !testutil.Poll(10*time.Second, func() bool { return served() >= mark+20 }) {
		t.Error("the load stalled after the API server restart")
	}
	sent, failures := stop()
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed across the API server restart, first: %s", len(failures), sent, failures[0])
	}
	if r := g.routable(); !slices.Equal(r, []string{"vllm-0", "vllm-1"}) {
		t.Errorf("routable engines after the restart %v, want both kept", r)
	}
	if resp, err := http.Get("http://" + g.public + "/ready"); err != nil || resp.StatusCode != 200 {
		t.Errorf("/ready after the restart: %v %v", resp, err)
	}
	k.create(e2) // the admin client reconnects on its own
	// The informer's next watch may wait out a back-off step (0.8 s
	// doubling, jittered) begun while the API server was down.
	g.waitRoutableWithin(30*time.Second, "vllm-0", "vllm-1", "vllm-2")
	g.waitIdle()
}

// pod creates the pod of engine e with labels: a pod the API server
// stores (nothing schedules or runs it here), so discovery can read its
// labels.
func (k *kubeEnv) pod(e *kubeEngine, labels map[string]string) {
	k.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: e.pod, Namespace: k.ns, Labels: labels},
		Spec: corev1.PodSpec{
			ServiceAccountName:           "switchboard",
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}},
		},
	}
	if _, err := k.cs.CoreV1().Pods(k.ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// roles returns each engine's "role/group" on /admin/engines, the
// retired incarnations left out.
func (g *kubeGateway) roles() map[string]string {
	out := map[string]string{}
	for _, e := range g.engines().Engines {
		if !e.Retired {
			out[e.Name] = e.Role + "/" + e.Group
		}
	}
	return out
}

// waitRoles polls until roles is want (within 10 s).
func (g *kubeGateway) waitRoles(want map[string]string) {
	g.t.Helper()
	var got map[string]string
	if !testutil.Poll(10*time.Second, func() bool { got = g.roles(); return maps.Equal(got, want) }) {
		g.t.Fatalf("engine roles %v, want %v", got, want)
	}
}

// TestKubeDiscoveryPodRoles: against the real API server, with the
// shipped Role, the engines' prefill/decode roles come from their pods'
// llm-d.ai/role label (and the group from group_label): prefill, decode,
// prefill-decode (both), none (both), an unknown value (both, warned);
// relabelling a running pod changes its engine's role.
func TestKubeDiscoveryPodRoles(t *testing.T) {
	k := newKubeEnv(t, nil)
	e0, e1, e2, e3 := k.engine("vllm-0"), k.engine("vllm-1"), k.engine("vllm-2"), k.engine("vllm-3")
	k.pod(e0, map[string]string{"llm-d.ai/role": "prefill", "rack": "r1"})
	k.pod(e1, map[string]string{"llm-d.ai/role": "decode", "rack": "r1"})
	k.pod(e2, map[string]string{"llm-d.ai/role": "prefill-decode"})
	k.pod(e3, map[string]string{"llm-d.ai/role": "encoder"})
	for _, e := range []*kubeEngine{e0, e1, e2, e3} {
		k.create(e)
	}
	g := k.startGateway(k.gatewayConfig("round-robin") + "    group_label: rack\n")
	waitHTTP(t, "http://"+g.public+"/ready", 200)
	g.waitRoutable("vllm-0", "vllm-1", "vllm-2", "vllm-3")
	g.waitRoles(map[string]string{"vllm-0": "prefill/r1", "vllm-1": "decode/r1", "vllm-2": "both/", "vllm-3": "both/"})
	warned := func() bool {
		out := g.proc.output()
		return strings.Contains(out, "role label names no role") && strings.Contains(out, k.ns+"/vllm-3")
	}
	if !testutil.Poll(5*time.Second, warned) {
		t.Errorf("no warning about vllm-3's role label value:\n%s", g.proc.output())
	}

	// Relabel a running pod: its engine takes the new role.
	patch := []byte(`{"metadata":{"labels":{"llm-d.ai/role":"decode","rack":"r2"}}}`)
	if _, err := k.cs.CoreV1().Pods(k.ns).Patch(context.Background(), "vllm-2", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	g.waitRoles(map[string]string{"vllm-0": "prefill/r1", "vllm-1": "decode/r1", "vllm-2": "decode/r2", "vllm-3": "both/"})
	g.waitRoutable("vllm-0", "vllm-1", "vllm-2", "vllm-3")
	if _, err := g.chatOnce(context.Background(), true, "", 4); err != nil {
		t.Errorf("a chat request with prefill and decode engines: %v", err)
	}
	g.waitIdle()
}

// TestKubeDiscoveryRoleWithoutPods: a Role without the pods rule stops the
// gateway at start, saying what to grant or how to read no pods; with
// role_label "" the same Role is enough (every engine both).
func TestKubeDiscoveryRoleWithoutPods(t *testing.T) {
	k := newKubeEnvRole(t, func(r *rbacv1.Role) {
		r.Rules = slices.DeleteFunc(r.Rules, func(pr rbacv1.PolicyRule) bool { return slices.Contains(pr.Resources, "pods") })
	})
	g := k.startGateway(k.gatewayConfig("round-robin"))
	done := make(chan error, 1)
	go func() { done <- g.proc.cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Fatalf("the gateway exited with %v, want a failure", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway without permission on pods still runs after 30 s")
	}
	out := g.proc.output()
	for _, want := range []string{"may not list pods", fmt.Sprintf("namespace %q", k.ns), "role.yaml", "role_label and group_label"} {
		if !strings.Contains(out, want) {
			t.Errorf("the gateway's output does not say %q:\n%s", want, out)
		}
	}

	e0 := k.engine("vllm-0")
	k.create(e0)
	g = k.startGateway(k.gatewayConfig("round-robin") + "    role_label: \"\"\n")
	waitHTTP(t, "http://"+g.public+"/ready", 200)
	g.waitRoutable("vllm-0")
	g.waitRoles(map[string]string{"vllm-0": "both/"})
}

// kvEngine is engine with vLLM's KV-cache events on, as with
// --kv-events-config and --enable-prompt-tokens-details: the simulator's
// PUB and replay sockets bound on the test's engine address at free ports.
func (k *kubeEnv) kvEngine(pod string) *kubeEngine {
	k.t.Helper()
	free := "tcp://" + net.JoinHostPort(k.ip, "0")
	sim, err := enginesim.New(enginesim.Config{Name: pod, Models: []string{kubeModel}, TTFT: 5 * time.Millisecond, ITL: 5 * time.Millisecond,
		KVEvents: free, KVEventsReplay: free, PromptTokensDetails: true})
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { _ = sim.Close() }) // after the server's Close, registered below
	ln, err := net.Listen("tcp", net.JoinHostPort(k.ip, "0"))
	if err != nil {
		k.t.Fatal(err)
	}
	e := &kubeEngine{pod: pod, port: int32(ln.Addr().(*net.TCPAddr).Port), sim: sim, srv: &http.Server{Handler: sim.Handler()}}
	go func() { _ = e.srv.Serve(ln) }()
	k.t.Cleanup(func() { _ = e.srv.Close() })
	return e
}

// createKV creates e's slice with the named ports kv-events and kv-replay
// (the Service's ports for vLLM's publisher and replay socket) beside http.
func (k *kubeEnv) createKV(e *kubeEngine) {
	k.t.Helper()
	s := k.slice(e, true, false)
	for _, p := range []struct {
		name, endpoint string
	}{{k8s.DefaultKVEventsPort, e.sim.KVEventsAddr()}, {k8s.DefaultKVReplayPort, e.sim.KVReplayAddr()}} {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: new(p.name), Port: new(endpointPort(k.t, p.endpoint)), Protocol: new(corev1.ProtocolTCP)})
	}
	if _, err := k.cs.DiscoveryV1().EndpointSlices(k.ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// TestKubeDiscoveryKVEventsPort: engines discovered from EndpointSlices
// whose ports include kv-events and kv-replay are subscribed to at
// tcp://<endpoint address>:<port>, and precise-prefix routes on what they
// publish: after a long prompt, the engine that served it holds its blocks
// in the gateway's index (the other none), and a prompt extending it goes
// to that engine, which reports the prefix cached; so do prompts
// extending ones the gateway never saw, sent to an engine directly.
func TestKubeDiscoveryKVEventsPort(t *testing.T) {
	k := newKubeEnv(t, nil)
	e0, e1 := k.kvEngine("vllm-0"), k.kvEngine("vllm-1")
	k.createKV(e0)
	k.createKV(e1)
	g := k.startGateway(k.gatewayConfig("precise-prefix") + "kv_events:\n  tokenize:\n    max_wait: 1s\n")
	waitHTTP(t, "http://"+g.public+"/ready", 200)
	g.waitRoutable("vllm-0", "vllm-1")

	want := map[string]string{}
	for _, e := range []*kubeEngine{e0, e1} {
		want[e.pod] = fmt.Sprintf("%s %s connected", e.sim.KVEventsAddr(), e.sim.KVReplayAddr())
		if !strings.HasPrefix(e.sim.KVEventsAddr(), "tcp://"+k.ip+":") {
			t.Fatalf("%s publishes on %s, want the engine address %s", e.pod, e.sim.KVEventsAddr(), k.ip)
		}
	}
	var got map[string]string
	if !testutil.Poll(10*time.Second, func() bool {
		got = map[string]string{}
		for _, e := range kvAdminEngines(t, g.admin).Engines {
			if kv := e.KVEvents; kv != nil && !e.Retired {
				got[e.Name] = fmt.Sprintf("%s %s %s", kv.Endpoint, kv.Replay, map[bool]string{true: "connected", false: "disconnected"}[kv.Connected])
			}
		}
		return maps.Equal(got, want)
	}) {
		t.Fatalf("the engines' KV-event subscriptions %v, want %v", got, want)
	}

	doc := kvDocument("kube-system-prompt", kvDocWords)
	first := kvChat(t, g.public, kubeModel, doc+" first question")
	served, other := first.engine, map[string]string{"vllm-0": "vllm-1", "vllm-1": "vllm-0"}[first.engine]
	if other == "" {
		t.Fatalf("served by %q, want vllm-0 or vllm-1", served)
	}
	var blocks map[string]int
	if !testutil.Poll(10*time.Second, func() bool {
		blocks = kvAdminEngines(t, g.admin).blocks()
		return blocks[served] > 0
	}) {
		t.Fatalf("KV-event blocks %v after a %d-word prompt on %s, want some for it", blocks, kvDocWords, served)
	}
	if minBlocks := kvDocWords/16 - 1; blocks[served] < minBlocks || blocks[other] != 0 {
		t.Errorf("KV-event blocks %v after a %d-word prompt on %s, want at least %d for it and none for %s", blocks, kvDocWords, served, minBlocks, other)
	}
	next := kvChat(t, g.public, kubeModel, doc+" second question")
	t.Logf("subscriptions %v; blocks %v after the first prompt (on %s); the next went to %s with %d of %d prompt tokens cached",
		got, blocks, served, next.engine, next.cachedTokens, next.promptTokens)
	if next.engine != served {
		t.Errorf("the prompt extending it went to %s, want %s (which holds its prefix)", next.engine, served)
	}
	if want := (kvDocWords/16 - 2) * 16; next.cachedTokens < want {
		t.Errorf("the prompt extending it: %d of %d prompt tokens cached on %s, want at least %d", next.cachedTokens, next.promptTokens, next.engine, want)
	}

	// Prompts sent to an engine directly, never through the gateway: it
	// learns them from the engine's events alone, and routes their
	// extensions there (by chance, all four would be 1 in 16).
	for i := range 4 {
		e := []*kubeEngine{e1, e0}[i%2]
		before := kvAdminEngines(t, g.admin).blocks()[e.pod]
		doc := kvDocument(fmt.Sprintf("kube-direct-%d", i), kvDocWords)
		kvPost(t, net.JoinHostPort(k.ip, fmt.Sprint(e.port)), kubeModel, doc+" asked of the engine")
		if !testutil.Poll(10*time.Second, func() bool {
			blocks = kvAdminEngines(t, g.admin).blocks()
			return blocks[e.pod] > before
		}) {
			t.Fatalf("KV-event blocks %v after a prompt sent to %s directly, want more than %d for it", blocks, e.pod, before)
		}
		if r := kvChat(t, g.public, kubeModel, doc+" asked through the gateway"); r.engine != e.pod || r.cachedTokens == 0 {
			t.Errorf("a prompt extending one sent to %s directly went to %s with %d tokens cached, want %s, cached", e.pod, r.engine, r.cachedTokens, e.pod)
		}
	}
	g.waitIdle()
}
