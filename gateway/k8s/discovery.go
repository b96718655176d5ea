package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/loglimit"
	"github.com/switchboard-gw/switchboard/internal/version"
)

// Source is the discovery source name given to [Sink.SetDiscovered].
const Source = "kubernetes"

// Sink receives the discovered engines; the gateway's *Server is one.
// Implementations must be safe for concurrent use.
type Sink interface {
	// SetDiscovered replaces the engines of source with engines, applied
	// as one batch (fleet.Fleet.SetDiscovered); an Unready engine stays
	// in the fleet but takes no new requests.
	fleet.Sink
	// HoldReady holds readiness until release is called.
	HoldReady(reason string) (release func())
}

// Rule is one permission discovery needs, as a Role grants it.
type Rule struct {
	APIGroup, Resource string
	Verbs              []string
}

// Rules are every permission discovery uses with the default
// configuration, in each watched namespace: list and watch on
// EndpointSlices (list for the informer's first sync and the access check
// at start, watch for the changes), and list and watch on pods, for their
// role label (Config.RoleLabel; a slice does not carry its pods' labels).
// Nothing reads an object by name, so there is no get; nothing else is
// read (the models come from the configuration, a slice's annotation or
// label, or the engines' /v1/models). deploy/kubernetes/base/role.yaml
// grants exactly these, and a test checks it. [Config.Rules] gives what a
// configuration needs: without role and group labels, no pods.
var Rules = DefaultConfig().Rules()

var (
	sliceRule = Rule{APIGroup: discoveryv1.GroupName, Resource: "endpointslices", Verbs: []string{"list", "watch"}}
	podRule   = Rule{APIGroup: corev1.GroupName, Resource: "pods", Verbs: []string{"list", "watch"}}
)

// Rules returns the permissions discovery needs under c in each watched
// namespace: list and watch on EndpointSlices, and on pods when c reads
// pod labels (RoleLabel or GroupLabel set).
func (c Config) Rules() []Rule {
	if c.readsPods() {
		return []Rule{sliceRule, podRule}
	}
	return []Rule{sliceRule}
}

// ErrForbidden wraps the error Start returns when the API server refuses
// the gateway's credentials (401) or one of [Rules] (403).
var ErrForbidden = errors.New("kubernetes discovery is not allowed")

// accessTimeout bounds the access check at start, all namespaces
// together: the gateway opens its listener only after Start returns, and
// the Deployment's startupProbe must not run out while an API server that
// does not answer is waited for.
const accessTimeout = 10 * time.Second

type options struct {
	rest          *rest.Config
	cs            kubernetes.Interface
	accessTimeout time.Duration
}

// Option configures what a test injects into [Start].
type Option func(*options)

// WithRestConfig makes Start reach the API server with rc instead of
// Config.Kubeconfig or the in-cluster service account. A nil rc is
// ignored.
func WithRestConfig(rc *rest.Config) Option {
	return func(o *options) {
		if rc != nil {
			o.rest = rc
		}
	}
}

// WithClientset makes Start use cs (client-go's fake clientset in unit
// tests; it ignores label selectors). A nil cs is ignored.
func WithClientset(cs kubernetes.Interface) Option {
	return func(o *options) {
		if cs != nil {
			o.cs = cs
		}
	}
}

// withAccessTimeout replaces the access check's 10 s deadline (tests). A
// value <= 0 is ignored.
func withAccessTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.accessTimeout = d
		}
	}
}

// Discovery watches EndpointSlices and keeps a Sink's engines equal to the
// endpoints they list (see [Engines]: the not ready and terminating ones
// marked Unready). Start it with [Start]; stop it with Close. Its methods
// are safe for concurrent use.
type Discovery struct {
	cfg        Config
	sink       Sink
	log        *slog.Logger
	namespaces []string
	sel        labels.Selector
	informers  []cache.SharedIndexInformer
	// pods are the pod informers' stores by namespace, nil unless
	// Config.readsPods; podInformers the informers.
	pods         map[string]cache.Store
	podInformers []cache.SharedIndexInformer
	release      func()
	dirty        chan struct{}
	cancel       context.CancelFunc
	wg           sync.WaitGroup

	mu      sync.Mutex
	applied []fleet.DiscoveredEngine // the last list the sink took
	synced  bool
	skipped string // the last skipped lines logged, so a batch that changes nothing logs nothing
	failed  string // the last apply failure logged, "" after a success
	none    bool   // no slice matched after the sync, warned until one does
	// badRoles are the pods whose unknown role label value was warned
	// about ("<namespace>/<pod>" to the value): warned once per pod and
	// value, forgotten once the pod's endpoint or bad value is gone.
	badRoles map[string]string

	now func() time.Time // the log rate limits' clock (tests set it)
}

// Start checks that the gateway may list and watch the EndpointSlices of
// every namespace of cfg (enabled and valid), then starts one informer per
// namespace and returns at once. Until the informers have synced and their
// engines are applied to sink (or cfg.SyncTimeout has passed, then it
// serves with what it has and logs a warning), it holds the sink's
// readiness. Changes are collected for cfg.Batch and applied as one batch.
//
// The access check asks every namespace at once, all under one 10 s
// deadline, so an API server that does not answer delays the gateway's
// start by 10 s at most, however many namespaces are watched.
//
// Errors: cfg.APIKeyEnv names a variable that is unset or empty (the
// engines would have no key); the API server cannot be configured (no
// kubeconfig and not in a cluster, or in a cluster without the service
// account token); it refuses the credentials or a permission (wrapping
// ErrForbidden, with what the Role must grant); or it does not serve
// discovery.k8s.io/v1 EndpointSlices (Kubernetes before 1.21). An API
// server that cannot be reached is not an error: the informers retry with
// client-go's back-off (0.8 s doubling to 30 s, jittered) while readiness
// waits, and afterwards, when the API server goes away, the last known
// engines keep serving until it answers again and the informers list
// afresh.
func Start(ctx context.Context, cfg Config, sink Sink, log *slog.Logger, opts ...Option) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	o := options{accessTimeout: accessTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.APIKeyEnv != "" && os.Getenv(cfg.APIKeyEnv) == "" {
		// The pool would refuse every batch (it fails closed for a
		// configured engine too): say so now, not once a second forever.
		return nil, fmt.Errorf("kubernetes discovery: discovery.kubernetes.api_key_env is %s, but that variable is unset or empty: the discovered engines would have no key", cfg.APIKeyEnv)
	}
	namespaces := slices.Clone(cfg.Namespaces)
	ns, why := "default", "no API server configuration to take one from (a clientset given to Start)"
	cs := o.cs
	if cs == nil {
		rc, rns, rwhy, err := restConfig(cfg, o.rest)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		ns, why = rns, rwhy
		if rc.UserAgent == "" {
			rc.UserAgent = userAgent()
		}
		if cs, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
	}
	if len(namespaces) == 0 {
		namespaces = []string{ns}
		log.Info("kubernetes discovery: discovery.kubernetes.namespaces is empty: watching the gateway's own namespace",
			"namespace", ns, "why", why)
	}
	sel, _ := cfg.selector() // Validate parsed it
	if err := checkAccess(ctx, cs, namespaces, sel.String(), cfg.readsPods(), o.accessTimeout, log); err != nil {
		return nil, err
	}

	d := &Discovery{cfg: cfg, sink: sink, log: log.With("discovery", Source), namespaces: namespaces, sel: sel,
		dirty: make(chan struct{}, 1), now: time.Now}
	d.release = sink.HoldReady(fmt.Sprintf("kubernetes discovery to list the EndpointSlices (%s) in %s", sel, strings.Join(namespaces, ", ")))
	rctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = sel.String() }),
			informers.WithTransform(stripManagedFields))
		inf := f.Discovery().V1().EndpointSlices().Informer()
		mark := func(any) { d.mark() }
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: mark, UpdateFunc: func(_, n any) { d.mark() }, DeleteFunc: mark,
		}); err != nil {
			cancel()
			d.release()
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		_ = inf.SetWatchErrorHandlerWithContext(d.watchError(ns, sliceRule))
		d.informers = append(d.informers, inf)
		d.wg.Go(func() { inf.RunWithContext(rctx) })
		if cfg.readsPods() {
			pinf, err := d.podInformer(cs, ns)
			if err != nil {
				cancel()
				d.release()
				return nil, fmt.Errorf("kubernetes discovery: %w", err)
			}
			d.wg.Go(func() { pinf.RunWithContext(rctx) })
		}
	}
	d.wg.Go(func() { d.loop(rctx) })
	return d, nil
}

// podInformer builds the pod informer of namespace ns: every pod of the
// namespace (pods do not carry the slices' Service label, and the
// Service's own pod selector is not read), reduced by podTransform to its
// name and the role and group labels. An added or deleted pod, and one
// whose role or group label changed, wakes the loop: a label change on a
// running pod changes its engine's role (a new incarnation).
func (d *Discovery) podInformer(cs kubernetes.Interface, ns string) (cache.SharedIndexInformer, error) {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTransform(podTransform(d.cfg.RoleLabel, d.cfg.GroupLabel)))
	inf := f.Core().V1().Pods().Informer()
	mark := func(any) { d.mark() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: mark,
		UpdateFunc: func(o, n any) {
			op, ok1 := o.(*corev1.Pod)
			np, ok2 := n.(*corev1.Pod)
			if !ok1 || !ok2 || !maps.Equal(op.Labels, np.Labels) {
				d.mark()
			}
		},
		DeleteFunc: mark,
	}); err != nil {
		return nil, err
	}
	_ = inf.SetWatchErrorHandlerWithContext(d.watchError(ns, podRule))
	if d.pods == nil {
		d.pods = map[string]cache.Store{}
	}
	d.pods[ns] = inf.GetStore()
	d.podInformers = append(d.podInformers, inf)
	return inf, nil
}

// podTransform returns the pod informer's transform: it keeps of each pod
// only what discovery reads, its namespace, name, UID, resource version
// and the labels roleLabel and groupLabel, so the cache holds a few bytes
// per pod rather than whole pod specs and statuses. Objects it cannot read
// (a cache.DeletedFinalStateUnknown) pass unchanged.
func podTransform(roleLabel, groupLabel string) cache.TransformFunc {
	return func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}}
		for _, k := range [...]string{roleLabel, groupLabel} {
			if v, set := p.Labels[k]; k != "" && set {
				if out.Labels == nil {
					out.Labels = map[string]string{}
				}
				out.Labels[k] = v
			}
		}
		return out, nil
	}
}

// podLabels looks a pod up in the pod informers' stores.
func (d *Discovery) podLabels(ns, name string) (map[string]string, bool) {
	st := d.pods[ns]
	if st == nil {
		return nil, false
	}
	o, ok, err := st.GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return nil, false
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
		return nil, false
	}
	return p.Labels, true
}

// stripManagedFields is the informers' transform: it drops each slice's
// managedFields (server-side apply bookkeeping, often larger than the
// endpoints, and never read here) before the cache keeps it, which keeps
// memory down on a big fleet. client-go v0.37 has no such helper
// (cache.TransformStripManagedFields came later). Objects it cannot read
// (a cache.DeletedFinalStateUnknown) pass unchanged.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// userAgent is the User-Agent of discovery's requests, so that the API
// server's audit log and metrics tell the gateway apart:
// "switchboard/v0.1.0 (linux/amd64) gateway/k8s".
func userAgent() string {
	return "switchboard/v" + version.Version + " (" + runtime.GOOS + "/" + runtime.GOARCH + ") gateway/k8s"
}

// Close stops the informers; the engines discovered so far stay in the
// sink. Safe to call more than once.
func (d *Discovery) Close() {
	d.cancel()
	d.wg.Wait()
	d.release()
}

// Synced reports whether every informer has listed its namespace once and
// the sink has taken the engines of that view (it stays false while the
// first apply after the sync fails). Safe for concurrent use.
func (d *Discovery) Synced() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.synced
}

func (d *Discovery) mark() {
	select {
	case d.dirty <- struct{}{}:
	default:
	}
}

// loop waits for the first sync (or SyncTimeout), applies, then applies
// each batch of changes.
func (d *Discovery) loop(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, d.cfg.SyncTimeout)
	// The pods are listed before the first apply too, so the first
	// engine set has its roles.
	syncs := make([]cache.InformerSynced, 0, len(d.informers)+len(d.podInformers))
	for _, inf := range append(slices.Clone(d.informers), d.podInformers...) {
		syncs = append(syncs, inf.HasSynced)
	}
	listed := cache.WaitForCacheSync(sctx.Done(), syncs...)
	cancel()
	if ctx.Err() != nil {
		return
	}
	n := d.apply(listed)
	switch {
	case listed && n >= 0:
		d.setSynced(n)
	case listed:
		d.log.Warn("kubernetes discovery listed the EndpointSlices but its engines could not be applied: serving without them; retrying every second",
			"namespaces", strings.Join(d.namespaces, ","), "selector", d.sel.String())
	default:
		d.log.Warn("kubernetes discovery has not synced within sync_timeout: serving with the engines known so far; discovery keeps trying",
			"sync_timeout", d.cfg.SyncTimeout, "engines", n, "namespaces", strings.Join(d.namespaces, ","))
	}
	d.release()
	if !listed {
		// The informers may sync later with no event to wake the loop (a
		// namespace without slices), or their last event may wake it just
		// before HasSynced turns true: wake it once they have synced.
		d.wg.Go(func() {
			if cache.WaitForCacheSync(ctx.Done(), syncs...) {
				d.mark()
			}
		})
	}
	retry := time.NewTimer(0)
	retry.Stop()
	if n < 0 {
		retry.Reset(time.Second)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.dirty:
		case <-retry.C:
		}
		if !listed {
			listed = allSynced(syncs)
		}
		// Collect the changes of one batch window: a rollout's many
		// slice updates become one routing snapshot.
		if d.cfg.Batch > 0 {
			t := time.NewTimer(d.cfg.Batch)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		n := d.apply(listed)
		if n < 0 {
			retry.Reset(time.Second)
		} else if listed && !d.Synced() {
			d.setSynced(n)
		}
	}
}

// setSynced marks discovery synced and logs it, with n engines applied.
func (d *Discovery) setSynced(n int) {
	d.mu.Lock()
	d.synced = true
	d.mu.Unlock()
	d.log.Info("kubernetes discovery synced", "namespaces", strings.Join(d.namespaces, ","), "selector", d.sel.String(),
		"address_type", d.cfg.AddressType, "engines", n)
}

func allSynced(fs []cache.InformerSynced) bool {
	for _, f := range fs {
		if !f() {
			return false
		}
	}
	return true
}

// engines returns the engines the informers' caches describe now, the
// left-out lines, the pods with an unknown role label value (Engines),
// how many slices match the selector and address type, and how many match
// the selector but are of another address type.
func (d *Discovery) engines() (es []fleet.DiscoveredEngine, skipped []string, badRoles map[string]string, matched, otherType int) {
	var all []*discoveryv1.EndpointSlice
	for _, inf := range d.informers {
		for _, o := range inf.GetStore().List() {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok && d.sel.Matches(labels.Set(s.Labels)) {
				all = append(all, s)
				if string(s.AddressType) == d.cfg.AddressType {
					matched++
				} else {
					otherType++
				}
			}
		}
	}
	var pods PodLabels
	if d.pods != nil {
		pods = d.podLabels
	}
	es, skipped, badRoles = Engines(d.cfg, all, len(d.namespaces) > 1, pods)
	return es, skipped, badRoles, matched, otherType
}

// sameEngine reports whether the sink already has b as a: same name, URL,
// models, role, group and readiness (the other settings come from the
// configuration).
func sameEngine(a, b fleet.DiscoveredEngine) bool {
	return a.Name == b.Name && a.URL == b.URL && slices.Equal(a.Models, b.Models) && a.Role == b.Role && a.Group == b.Group &&
		a.Unready == b.Unready
}

// apply gives the sink the engines of the informers' caches when they
// differ from the last applied; it returns how many engines there are, or
// -1 when the sink could not take them (retried a second later). listed
// says the informers have synced: only then does a view without any
// matching slice mean there is none, and it is warned about (once each
// time the count drops to zero).
func (d *Discovery) apply(listed bool) int {
	es, skipped, badRoles, matched, otherType := d.engines()
	d.mu.Lock()
	same := slices.EqualFunc(es, d.applied, sameEngine)
	for _, pod := range slices.Sorted(maps.Keys(badRoles)) {
		if v := badRoles[pod]; d.badRoles[pod] != v {
			d.log.Warn("kubernetes discovery: a pod's role label names no role: its engine does whole generations (both)",
				"pod", pod, "label", d.cfg.RoleLabel, "value", v, "want", "prefill, decode, prefill-decode or both")
		}
	}
	d.badRoles = badRoles
	if msg := strings.Join(skipped, "; "); msg != d.skipped {
		d.skipped = msg
		if msg != "" {
			d.log.Warn("kubernetes discovery left endpoints out", "why", msg)
		}
	}
	warnNone := false
	if listed {
		none := matched == 0
		warnNone = none && !d.none
		d.none = none
	}
	d.mu.Unlock()
	if warnNone {
		d.log.Warn("kubernetes discovery: no EndpointSlice matches the selector and address type in any watched namespace, so it discovers no engine: check discovery.kubernetes.service, selector and address_type, and that the Service exists there",
			"selector", d.sel.String(), "address_type", d.cfg.AddressType, "namespaces", strings.Join(d.namespaces, ","),
			"slices_of_another_address_type", otherType)
	}
	if same {
		return len(es)
	}
	rep, err := d.sink.SetDiscovered(Source, es)
	if err != nil && !errors.Is(err, fleet.ErrEngineLeftOut) {
		d.mu.Lock()
		if msg := err.Error(); msg != d.failed {
			d.failed = msg
			d.log.Error("kubernetes discovery: engines not applied; retrying every second", "error", err)
		}
		d.mu.Unlock()
		return -1
	}
	if err != nil {
		d.log.Warn("kubernetes discovery: some engines left out", "error", err)
	}
	d.mu.Lock()
	d.applied, d.failed = es, ""
	d.mu.Unlock()
	if rep.Applied() {
		d.log.Info("kubernetes discovery applied", "engines", len(es), "added", rep.Added, "removed", rep.Removed,
			"changed", rep.Changed, "unready", rep.Unready, "ready", rep.Ready)
	}
	return len(es)
}

// watchError logs the list and watch failures of the informer of
// namespace ns; the reflector retries on its own back-off, and the known
// engines keep serving meanwhile. The cases are client-go's
// (cache.DefaultWatchErrorHandler):
//   - an expired resource version (410 Gone, "too old resource version")
//     and a watch the server closed (io.EOF, io.ErrUnexpectedEOF) are
//     routine, the informer lists or watches again: Debug;
//   - a refused permission or credentials (403, 401) needs the operator:
//     Error, saying what the Role must grant;
//   - anything else (the API server unreachable, 5xx): Warn.
//
// The Error and Warn lines are rate-limited apart (the first, then at most
// one a minute with the count in between), so an outage's warnings do not
// hide a permission revoked after it.
func (d *Discovery) watchError(ns string, r Rule) cache.WatchErrorHandlerWithContext {
	denied, failed := loglimit.Limiter{Interval: time.Minute}, loglimit.Limiter{Interval: time.Minute}
	return func(_ context.Context, _ *cache.Reflector, err error) {
		switch {
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			d.log.Debug("kubernetes discovery: the watch expired (too old resource version); the informer lists afresh", "namespace", ns, "error", err)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			d.log.Debug("kubernetes discovery: the API server closed the watch; the informer watches again", "namespace", ns, "error", err)
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			if n, ok := denied.Allow(d.now()); ok {
				d.log.Error("kubernetes discovery: the API server refuses the informer; the known engines keep serving, retrying with back-off",
					"namespace", ns, "resource", r.Resource, "error", accessError("list or watch", r, ns, err), "suppressed", n)
			}
		default:
			if n, ok := failed.Allow(d.now()); ok {
				d.log.Warn("kubernetes discovery: the API server is not answering the watch; the known engines keep serving, retrying with back-off",
					"namespace", ns, "error", err, "suppressed", n)
			}
		}
	}
}

// restConfig returns the API server configuration, the default namespace
// and why it is that one: explicit (tests), cfg.Kubeconfig, in-cluster, or
// the default kubeconfig loading rules ($KUBECONFIG, ~/.kube/config).
func restConfig(cfg Config, explicit *rest.Config) (rc *rest.Config, ns, why string, err error) {
	if explicit != nil {
		return rest.CopyConfig(explicit), "default", "a rest config given to Start names no namespace", nil
	}
	if cfg.Kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err == nil {
			b, err := os.ReadFile(serviceAccountDir + "/namespace")
			if ns := strings.TrimSpace(string(b)); err == nil && ns != "" {
				return rc, ns, "the service account's namespace (in a cluster)", nil
			}
			return rc, "default", "in a cluster, but the service account's namespace file cannot be read", nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, "", "", fmt.Errorf("in a cluster (KUBERNETES_SERVICE_HOST is set), but the service account token is not mounted (%w): is automountServiceAccountToken false? Discovery reads the API with it", err)
		}
		if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, "", "", err
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if cfg.Kubeconfig != "" {
		rules.ExplicitPath = cfg.Kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	if rc, err = cc.ClientConfig(); err != nil {
		return nil, "", "", fmt.Errorf("no API server: not in a cluster, and the kubeconfig: %w", err)
	}
	raw, err := cc.RawConfig()
	if err != nil {
		return rc, "default", "the kubeconfig's context cannot be read", nil
	}
	if c := raw.Contexts[raw.CurrentContext]; c != nil && c.Namespace != "" {
		return rc, c.Namespace, fmt.Sprintf("the namespace of the kubeconfig's current context %q", raw.CurrentContext), nil
	}
	return rc, "default", fmt.Sprintf("the kubeconfig's current context %q names no namespace", raw.CurrentContext), nil
}

// serviceAccountDir is where the kubelet mounts the pod's service account
// token and namespace (rest.InClusterConfig reads the token there).
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// errNotServed marks an API server without discovery.k8s.io/v1
// EndpointSlices: Start fails rather than retry forever.
var errNotServed = errors.New("kubernetes discovery: the API server does not serve discovery.k8s.io/v1 EndpointSlices")

// checkAccess lists and watches the slices of every namespace once, and
// its pods when pods is set (Config.readsPods), all
// at once under one overall deadline (timeout), so a missing permission or
// API is reported at start with what to do, rather than as informer
// retries forever. A namespace whose check has not answered by the
// deadline, or failed otherwise, is logged and left to the informers'
// retries; its request is cancelled and its goroutine ends with it, not
// waited for.
func checkAccess(ctx context.Context, cs kubernetes.Interface, namespaces []string, sel string, pods bool, timeout time.Duration, log *slog.Logger) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(namespaces)) // buffered: a late answer does not block
	for i, ns := range namespaces {
		go func() { results <- result{i, checkNamespace(cctx, cs, ns, sel, pods)} }()
	}
	errs := make([]error, len(namespaces))
	answered := make([]bool, len(namespaces))
wait:
	for range namespaces {
		select {
		case r := <-results:
			errs[r.i], answered[r.i] = r.err, true
		case <-cctx.Done():
			break wait
		}
	}
	var fatal []error
	for i, ns := range namespaces {
		switch err := errs[i]; {
		case !answered[i]:
			log.Warn("kubernetes discovery: the API server did not answer the access check; the informers keep trying",
				"namespace", ns, "error", fmt.Sprintf("no answer within %s (%v)", timeout, context.Cause(cctx)))
		case errors.Is(err, ErrForbidden) || errors.Is(err, errNotServed):
			fatal = append(fatal, err)
		case err != nil:
			log.Warn("kubernetes discovery: the API server did not answer the access check; the informers keep trying", "namespace", ns, "error", err)
		}
	}
	return errors.Join(fatal...)
}

// checkNamespace lists and watches the slices of ns once, then its pods
// when pods is set.
func checkNamespace(ctx context.Context, cs kubernetes.Interface, ns, sel string, pods bool) error {
	api := cs.DiscoveryV1().EndpointSlices(ns)
	l, err := api.List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: 1})
	if err != nil {
		return accessError("list", sliceRule, ns, err)
	}
	w, err := api.Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: l.ResourceVersion, TimeoutSeconds: new(int64(1))})
	if err != nil {
		return accessError("watch", sliceRule, ns, err)
	}
	w.Stop()
	if !pods {
		return nil
	}
	papi := cs.CoreV1().Pods(ns)
	pl, err := papi.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return accessError("list", podRule, ns, err)
	}
	pw, err := papi.Watch(ctx, metav1.ListOptions{ResourceVersion: pl.ResourceVersion, TimeoutSeconds: new(int64(1))})
	if err != nil {
		return accessError("watch", podRule, ns, err)
	}
	pw.Stop()
	return nil
}

// accessError says what an API error on verb of the resource of r in
// namespace ns means and what to do about it: a refused permission
// (wrapping ErrForbidden, with what the Role must grant), refused
// credentials (ErrForbidden too), or EndpointSlices not served
// (errNotServed).
func accessError(verb string, r Rule, ns string, err error) error {
	switch {
	case apierrors.IsForbidden(err) && r.Resource == podRule.Resource:
		return fmt.Errorf("%w: may not %s pods in namespace %q (%v): the gateway's Role there must grant list and watch on pods (the core API group), as deploy/kubernetes/base/role.yaml does, for the pods' role and group labels; or set discovery.kubernetes.role_label and group_label to \"\" to read no pods (every engine then does whole generations)",
			ErrForbidden, verb, ns, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: may not %s endpointslices.discovery.k8s.io in namespace %q (%v): the gateway's Role there must grant list and watch on discovery.k8s.io endpointslices, as deploy/kubernetes/base/role.yaml does",
			ErrForbidden, verb, ns, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w: the API server refused the gateway's credentials (%v): check its service account token or the kubeconfig", ErrForbidden, err)
	case apierrors.IsNotFound(err) && r.Resource == sliceRule.Resource:
		return fmt.Errorf("%w (%s in namespace %q: %v): EndpointSlice discovery needs Kubernetes 1.21 or later", errNotServed, verb, ns, err)
	}
	return fmt.Errorf("%s %s in namespace %q: %w", verb, r.Resource, ns, err)
}
