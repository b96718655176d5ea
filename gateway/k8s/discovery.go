package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/switchboard-gw/switchboard/gateway"
)

// Source is the discovery source name given to [Sink.SetDiscovered].
const Source = "kubernetes"

// Sink receives the discovered engines; *gateway.Server is one.
type Sink interface {
	// SetDiscovered replaces the engines of source with engines, applied
	// as one batch ([gateway.Server.SetDiscovered]).
	SetDiscovered(source string, engines []gateway.EngineConfig) (gateway.ReloadReport, error)
	// HoldReady holds readiness until release is called.
	HoldReady(reason string) (release func())
}

var _ Sink = (*gateway.Server)(nil)

// Rule is one permission discovery needs, as a Role grants it.
type Rule struct {
	APIGroup, Resource string
	Verbs              []string
}

// Rules are every permission discovery uses, in each watched namespace:
// get, list and watch on EndpointSlices (list for the informer's first
// sync, watch for its changes, get for reading one slice). Nothing else:
// deploy/kubernetes/base/role.yaml grants exactly these, and a test checks
// it.
var Rules = []Rule{{APIGroup: discoveryv1.GroupName, Resource: "endpointslices", Verbs: []string{"get", "list", "watch"}}}

// ErrForbidden wraps the error Start returns when the API server refuses
// the gateway's credentials (401) or one of [Rules] (403).
var ErrForbidden = errors.New("kubernetes discovery is not allowed")

type options struct {
	rest *rest.Config
	cs   kubernetes.Interface
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

// Discovery watches EndpointSlices and keeps a Sink's engines equal to the
// ready endpoints they list. Start it with [Start]; stop it with Close.
type Discovery struct {
	cfg        Config
	sink       Sink
	log        *slog.Logger
	namespaces []string
	sel        labels.Selector
	informers  []cache.SharedIndexInformer
	release    func()
	dirty      chan struct{}
	cancel     context.CancelFunc
	wg         sync.WaitGroup

	mu      sync.Mutex
	applied []gateway.EngineConfig // the last list the sink took
	synced  bool
	skipped string // the last skipped lines logged, so a batch that changes nothing logs nothing
	failed  string // the last apply failure logged, "" after a success
}

// Start checks that the gateway may list and watch the EndpointSlices of
// every namespace of cfg (enabled and valid), then starts one informer per
// namespace and returns at once. Until the informers have synced and their
// engines are applied to sink (or cfg.SyncTimeout has passed, then it
// serves with what it has and logs a warning), it holds the sink's
// readiness. Changes are collected for cfg.Batch and applied as one batch.
//
// Errors: the API server cannot be configured (no kubeconfig and not in a
// cluster); or it refuses the credentials or a permission (wrapping
// ErrForbidden, with what the Role must grant). An API server that cannot
// be reached is not an error: the informers retry with client-go's
// back-off (0.8 s doubling to 30 s, jittered) while readiness waits, and
// afterwards, when the API server goes away, the last known engines keep
// serving until it answers again and the informers list afresh.
func Start(ctx context.Context, cfg Config, sink Sink, log *slog.Logger, opts ...Option) (*Discovery, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	namespaces := slices.Clone(cfg.Namespaces)
	cs := o.cs
	if cs == nil {
		rc, ns, err := restConfig(cfg, o.rest)
		if err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		if len(namespaces) == 0 {
			namespaces = []string{ns}
		}
		if cs, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
	} else if len(namespaces) == 0 {
		namespaces = []string{"default"}
	}
	sel, _ := cfg.selector() // Validate parsed it
	if err := checkAccess(ctx, cs, namespaces, sel.String(), log); err != nil {
		return nil, err
	}

	d := &Discovery{cfg: cfg, sink: sink, log: log.With("discovery", Source), namespaces: namespaces, sel: sel,
		dirty: make(chan struct{}, 1)}
	d.release = sink.HoldReady(fmt.Sprintf("kubernetes discovery to list the EndpointSlices (%s) in %s", sel, strings.Join(namespaces, ", ")))
	rctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	for _, ns := range namespaces {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = sel.String() }))
		inf := f.Discovery().V1().EndpointSlices().Informer()
		mark := func(any) { d.mark() }
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: mark, UpdateFunc: func(_, n any) { d.mark() }, DeleteFunc: mark,
		}); err != nil {
			cancel()
			d.release()
			return nil, fmt.Errorf("kubernetes discovery: %w", err)
		}
		_ = inf.SetWatchErrorHandlerWithContext(d.watchError(ns))
		d.informers = append(d.informers, inf)
		d.wg.Go(func() { inf.RunWithContext(rctx) })
	}
	d.wg.Go(func() { d.loop(rctx) })
	return d, nil
}

// Close stops the informers; the engines discovered so far stay in the
// sink. Safe to call more than once.
func (d *Discovery) Close() {
	d.cancel()
	d.wg.Wait()
	d.release()
}

// Synced reports whether every informer has listed its namespace once and
// that view has been applied.
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
	syncs := make([]cache.InformerSynced, len(d.informers))
	for i, inf := range d.informers {
		syncs[i] = inf.HasSynced
	}
	synced := cache.WaitForCacheSync(sctx.Done(), syncs...)
	cancel()
	if ctx.Err() != nil {
		return
	}
	n := d.apply()
	if synced {
		d.log.Info("kubernetes discovery synced", "namespaces", strings.Join(d.namespaces, ","), "selector", d.sel.String(), "engines", n)
	} else {
		d.log.Warn("kubernetes discovery has not synced within sync_timeout: serving with the engines known so far; discovery keeps trying",
			"sync_timeout", d.cfg.SyncTimeout, "engines", n, "namespaces", strings.Join(d.namespaces, ","))
	}
	d.mu.Lock()
	d.synced = synced
	d.mu.Unlock()
	d.release()
	if !synced {
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
		if !synced {
			if synced = allSynced(syncs); synced {
				d.mu.Lock()
				d.synced = true
				d.mu.Unlock()
				d.log.Info("kubernetes discovery synced", "engines", len(d.current()))
			}
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
		if d.apply() < 0 {
			retry.Reset(time.Second)
		}
	}
}

func allSynced(fs []cache.InformerSynced) bool {
	for _, f := range fs {
		if !f() {
			return false
		}
	}
	return true
}

// current returns the engines the informers' caches describe now.
func (d *Discovery) current() []gateway.EngineConfig {
	es, _ := d.engines()
	return es
}

func (d *Discovery) engines() ([]gateway.EngineConfig, []string) {
	var all []*discoveryv1.EndpointSlice
	for _, inf := range d.informers {
		for _, o := range inf.GetStore().List() {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok && d.sel.Matches(labels.Set(s.Labels)) {
				all = append(all, s)
			}
		}
	}
	return Engines(d.cfg, all, len(d.namespaces) > 1)
}

// apply gives the sink the engines of the informers' caches when they
// differ from the last applied; it returns how many engines there are, or
// -1 when the sink could not take them (retried a second later).
func (d *Discovery) apply() int {
	es, skipped := d.engines()
	d.mu.Lock()
	same := slices.EqualFunc(es, d.applied, func(a, b gateway.EngineConfig) bool {
		return a.Name == b.Name && a.URL == b.URL && slices.Equal(a.Models, b.Models)
	})
	if msg := strings.Join(skipped, "; "); msg != d.skipped {
		d.skipped = msg
		if msg != "" {
			d.log.Warn("kubernetes discovery left endpoints out", "why", msg)
		}
	}
	d.mu.Unlock()
	if same {
		return len(es)
	}
	rep, err := d.sink.SetDiscovered(Source, es)
	if err != nil && !errors.Is(err, gateway.ErrEngineLeftOut) {
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
		d.log.Info("kubernetes discovery applied", "engines", len(es), "added", rep.Added, "removed", rep.Removed, "changed", rep.Changed)
	}
	return len(es)
}

// watchError logs the informer's list and watch failures at a bounded
// rate (the first, then at most one a minute with the count in between);
// the reflector retries on its own back-off.
func (d *Discovery) watchError(ns string) cache.WatchErrorHandlerWithContext {
	var mu sync.Mutex
	var last time.Time
	suppressed := 0
	return func(_ context.Context, _ *cache.Reflector, err error) {
		mu.Lock()
		defer mu.Unlock()
		if now := time.Now(); now.Sub(last) >= time.Minute {
			d.log.Warn("kubernetes discovery: the API server is not answering the watch; the known engines keep serving, retrying with back-off",
				"namespace", ns, "error", err, "suppressed", suppressed)
			last, suppressed = now, 0
			return
		}
		suppressed++
	}
}

// restConfig returns the API server configuration and the default
// namespace: explicit (tests), cfg.Kubeconfig, in-cluster, or the default
// kubeconfig loading rules ($KUBECONFIG, ~/.kube/config).
func restConfig(cfg Config, explicit *rest.Config) (*rest.Config, string, error) {
	if explicit != nil {
		return rest.CopyConfig(explicit), "default", nil
	}
	if cfg.Kubeconfig == "" {
		rc, err := rest.InClusterConfig()
		if err == nil {
			ns := "default"
			if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(b) > 0 {
				ns = strings.TrimSpace(string(b))
			}
			return rc, ns, nil
		}
		if !errors.Is(err, rest.ErrNotInCluster) {
			return nil, "", err
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if cfg.Kubeconfig != "" {
		rules.ExplicitPath = cfg.Kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("no API server: not in a cluster, and the kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	return rc, ns, nil
}

// checkAccess lists and watches the slices of every namespace once, so a
// missing permission is reported at start with what to grant, rather than
// as informer retries forever. An API server that does not answer is
// logged and left to the informers' retries.
func checkAccess(ctx context.Context, cs kubernetes.Interface, namespaces []string, sel string, log *slog.Logger) error {
	var errs []error
	for _, ns := range namespaces {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := func() error {
			api := cs.DiscoveryV1().EndpointSlices(ns)
			l, err := api.List(cctx, metav1.ListOptions{LabelSelector: sel, Limit: 1})
			if err != nil {
				return accessError("list", ns, err)
			}
			w, err := api.Watch(cctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: l.ResourceVersion, TimeoutSeconds: new(int64(1))})
			if err != nil {
				return accessError("watch", ns, err)
			}
			w.Stop()
			return nil
		}()
		cancel()
		if errors.Is(err, ErrForbidden) {
			errs = append(errs, err)
		} else if err != nil {
			log.Warn("kubernetes discovery: the API server did not answer the access check; the informers keep trying", "namespace", ns, "error", err)
		}
	}
	return errors.Join(errs...)
}

func accessError(verb, ns string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: may not %s endpointslices.discovery.k8s.io in namespace %q (%v): the gateway's Role there must grant get, list and watch on discovery.k8s.io endpointslices, as deploy/kubernetes/base/role.yaml does",
			ErrForbidden, verb, ns, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%w: the API server refused the gateway's credentials (%v): check its service account token or the kubeconfig", ErrForbidden, err)
	}
	return fmt.Errorf("%s endpointslices in namespace %q: %w", verb, ns, err)
}
