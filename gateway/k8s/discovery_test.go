package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeSink is a Sink recording each SetDiscovered call and readiness hold,
// and the log records of the discovery (its handler). It reports what a
// call changed the way the gateway does (added, removed, changed,
// unready, ready against the last call it took). Every change wakes
// waitFor. Safe for concurrent use.
type fakeSink struct {
	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every change
	calls    [][]fleet.DiscoveredEngine
	sources  []string
	fail     map[int]error // the error of call n (1-based)
	events   []string      // "hold", "set" and "release", in order
	held     int           // holds not released
	logs     []string
	timeline []string // "set ok", "set failed" and each log line, in order
	cur      map[string]fleet.DiscoveredEngine
}

func newFakeSink() *fakeSink { return &fakeSink{changed: make(chan struct{}), fail: map[int]error{}} }

func (s *fakeSink) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// poke wakes waitFor (a reactor's count changed).
func (s *fakeSink) poke() {
	s.mu.Lock()
	s.changedLocked()
	s.mu.Unlock()
}

func (s *fakeSink) SetDiscovered(source string, engines []fleet.DiscoveredEngine) (fleet.Changes, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, slices.Clone(engines))
	s.sources = append(s.sources, source)
	s.events = append(s.events, "set")
	s.changedLocked()
	err := s.fail[len(s.calls)]
	if err != nil && !errors.Is(err, fleet.ErrEngineLeftOut) {
		s.timeline = append(s.timeline, "set failed")
		return fleet.Changes{}, err
	}
	s.timeline = append(s.timeline, "set ok")
	var rep fleet.Changes
	next := map[string]fleet.DiscoveredEngine{}
	for _, de := range engines {
		next[de.Name] = de
		old, had := s.cur[de.Name]
		switch {
		case !had:
			rep.Added = append(rep.Added, de.Name)
		case old.URL != de.URL || !slices.Equal(old.Models, de.Models) || old.Role != de.Role || old.Group != de.Group:
			rep.Changed = append(rep.Changed, de.Name)
		}
		switch {
		case de.Unready && !(had && old.Unready):
			rep.Unready = append(rep.Unready, de.Name)
		case !de.Unready && had && old.Unready:
			rep.Ready = append(rep.Ready, de.Name)
		}
	}
	for name := range s.cur {
		if _, ok := next[name]; !ok {
			rep.Removed = append(rep.Removed, name)
		}
	}
	slices.Sort(rep.Removed)
	s.cur = next
	return rep, err
}

func (s *fakeSink) HoldReady(reason string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held++
	s.events = append(s.events, "hold")
	s.changedLocked()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.held--
			s.events = append(s.events, "release")
			s.changedLocked()
		})
	}
}

// waitFor waits until cond (called with s.mu held) holds, failing the
// test after a deadline.
func (s *fakeSink) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("timed out waiting for %s\ncalls: %+v\nevents: %q\nlogs:\n%s", what, s.calls, s.events, strings.Join(s.logs, "\n"))
		}
	}
}

// waitEngines waits for a SetDiscovered call of want.
func (s *fakeSink) waitEngines(t *testing.T, want ...fleet.DiscoveredEngine) {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("engines %+v", want), func() bool {
		return len(s.calls) > 0 && sameEngines(s.calls[len(s.calls)-1], want)
	})
}

// waitLogged waits for a log line containing sub.
func (s *fakeSink) waitLogged(t *testing.T, sub string) {
	t.Helper()
	s.waitFor(t, "a log line with "+strconv.Quote(sub), func() bool { return s.loggedLocked(sub) })
}

func (s *fakeSink) waitReleased(t *testing.T) {
	t.Helper()
	s.waitFor(t, "readiness released", func() bool { return slices.Contains(s.events, "release") && s.held == 0 })
}

func (s *fakeSink) snapshot() (calls [][]fleet.DiscoveredEngine, events []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls), slices.Clone(s.events)
}

// countLogged returns how many log lines contain sub.
func (s *fakeSink) countLogged(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.logs {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

// sinkLog is a slog.Handler recording into a fakeSink.
type sinkLog struct {
	s     *fakeSink
	attrs []slog.Attr
}

func (h sinkLog) Enabled(context.Context, slog.Level) bool { return true }

func (h sinkLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	add := func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true }
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	h.s.logs = append(h.s.logs, b.String())
	h.s.timeline = append(h.s.timeline, b.String())
	h.s.changedLocked()
	return nil
}

func (h sinkLog) WithAttrs(as []slog.Attr) slog.Handler {
	return sinkLog{s: h.s, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h sinkLog) WithGroup(string) slog.Handler { return h }

// logged reports whether a log line contains sub. Call with s.mu held.
func (s *fakeSink) loggedLocked(sub string) bool {
	return slices.ContainsFunc(s.logs, func(l string) bool { return strings.Contains(l, sub) })
}

// discoveryConfig is testConfig with a short batch.
func discoveryConfig() Config {
	c := testConfig()
	c.Batch = 10 * time.Millisecond
	c.SyncTimeout = 15 * time.Second
	return c
}

// start starts discovery on cs into sink, closed at the end of the test.
func start(t *testing.T, cfg Config, cs kubernetes.Interface, sink *fakeSink, opts ...Option) *Discovery {
	t.Helper()
	d, err := Start(t.Context(), cfg, sink, slog.New(sinkLog{s: sink}), append([]Option{WithClientset(cs)}, opts...)...)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(d.Close)
	return d
}

var (
	endpointSlices = schema.GroupResource{Group: discoveryv1.GroupName, Resource: "endpointslices"}
	pods           = schema.GroupResource{Resource: "pods"}
)

func TestStartHoldsReadyUntilFirstSync(t *testing.T) {
	cs := fake.NewClientset(
		eslice("default", "vllm-abc", "vllm", http8000(), podEP("vllm-1", "10.0.0.2"), podEP("vllm-0", "10.0.0.1")),
		eslice("default", "vllm-def", "vllm", http8000(), podEP("vllm-2", "10.0.0.3")),
		eslice("default", "other-abc", "other", http8000(), podEP("other-0", "10.0.9.1")),
		eslice("elsewhere", "vllm-abc", "vllm", http8000(), podEP("far-0", "10.0.8.1")),
	)
	sink := newFakeSink()
	d := start(t, discoveryConfig(), cs, sink)
	sink.waitReleased(t)
	if !d.Synced() {
		t.Errorf("Synced() = false after readiness was released on a sync")
	}
	calls, events := sink.snapshot()
	if want := []string{"hold", "set", "release"}; !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	want := []fleet.DiscoveredEngine{
		eng("vllm-0", "http://10.0.0.1:8000"),
		eng("vllm-1", "http://10.0.0.2:8000"),
		eng("vllm-2", "http://10.0.0.3:8000"),
	}
	if len(calls) != 1 || !sameEngines(calls[0], want) {
		t.Errorf("calls %+v, want one of %+v", calls, want)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if !slices.Equal(sink.sources, []string{Source}) {
		t.Errorf("sources %q", sink.sources)
	}
}

// TestDiscoveryFollowsChanges creates, updates and deletes slices; the
// fake clientset does not filter its watches by label, so a slice of
// another Service arrives too and must be ignored.
func TestDiscoveryFollowsChanges(t *testing.T) {
	ctx := t.Context()
	cs := fake.NewClientset(eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
	api := cs.DiscoveryV1().EndpointSlices("default")
	sink := newFakeSink()
	start(t, discoveryConfig(), cs, sink)
	e0, e1, e2, e3 := eng("vllm-0", "http://10.0.0.1:8000"), eng("vllm-1", "http://10.0.0.2:8000"),
		eng("vllm-2", "http://10.0.0.3:8000"), eng("vllm-3", "http://10.0.0.4:8000")
	sink.waitEngines(t, e0)
	sink.waitReleased(t)

	b := eslice("default", "vllm-b", "vllm", http8000(), podEP("vllm-1", "10.0.0.2"), podEP("vllm-2", "10.0.0.3"))
	if _, err := api.Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e0, e1, e2)

	// Terminating: it stays, unready (draining), until it leaves the
	// slice.
	b.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(true), Terminating: new(true)}
	if _, err := api.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e0, unready(e1), e2)
	b.Endpoints = b.Endpoints[1:]
	if _, err := api.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e0, e2)

	if err := api.Delete(ctx, "vllm-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e2)

	other := eslice("default", "other-a", "other", http8000(), podEP("other-0", "10.0.9.1"))
	if _, err := api.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := eslice("default", "vllm-c", "vllm", http8000(), podEP("vllm-3", "10.0.0.4"))
	if _, err := api.Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e2, e3)

	// A slice that stops matching the selector leaves.
	c.Labels[ServiceNameLabel] = "other"
	if _, err := api.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e2)

	if err := api.Delete(ctx, "vllm-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t)

	calls, _ := sink.snapshot()
	for _, es := range calls {
		for _, ec := range es {
			if strings.HasPrefix(ec.Name, "other") {
				t.Errorf("engine %+v of another Service discovered", ec)
			}
		}
	}
}

func TestDiscoveryBatchesChanges(t *testing.T) {
	ctx := t.Context()
	cs := fake.NewClientset(eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
	api := cs.DiscoveryV1().EndpointSlices("default")
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.Batch = 500 * time.Millisecond
	start(t, cfg, cs, sink)
	e := func(i int) fleet.DiscoveredEngine {
		return eng(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("http://10.0.0.%d:8000", i+1))
	}
	sink.waitReleased(t)

	// Three changes well inside one window: one call.
	for i := 1; i <= 3; i++ {
		s := eslice("default", fmt.Sprintf("vllm-%c", 'a'+i), "vllm", http8000(), podEP(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.0.0.%d", i+1)))
		if _, err := api.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sink.waitEngines(t, e(0), e(1), e(2), e(3))
	// A later change: its own call, and nothing in between.
	if err := api.Delete(ctx, "vllm-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e(1), e(2), e(3))
	calls, _ := sink.snapshot()
	want := [][]fleet.DiscoveredEngine{{e(0)}, {e(0), e(1), e(2), e(3)}, {e(1), e(2), e(3)}}
	if len(calls) != len(want) {
		t.Fatalf("%d calls, want %d: %+v", len(calls), len(want), calls)
	}
	for i := range want {
		if !sameEngines(calls[i], want[i]) {
			t.Errorf("call %d: %+v, want %+v", i+1, calls[i], want[i])
		}
	}
}

func TestDiscoveryRetriesSinkErrors(t *testing.T) {
	e0, e1 := eng("vllm-0", "http://10.0.0.1:8000"), eng("vllm-1", "http://10.0.0.2:8000")
	tests := []struct {
		name   string
		failAt int
		err    error
		// want are the calls once the second slice is applied.
		want [][]fleet.DiscoveredEngine
	}{
		{
			name: "first call fails", failAt: 1, err: errors.New("engine key variable unset"),
			want: [][]fleet.DiscoveredEngine{{e0}, {e0}, {e0, e1}},
		},
		{
			name: "a later call fails", failAt: 2, err: errors.New("the pool kept changing"),
			want: [][]fleet.DiscoveredEngine{{e0}, {e0, e1}, {e0, e1}},
		},
		{
			name: "an engine left out is not retried", failAt: 1,
			err:  fmt.Errorf("%w: %w: engine name taken", fleet.ErrEngineLeftOut, fleet.ErrInvalidConfig),
			want: [][]fleet.DiscoveredEngine{{e0}, {e0, e1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset(eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
			sink := newFakeSink()
			sink.fail[tt.failAt] = tt.err
			d := start(t, discoveryConfig(), cs, sink)
			sink.waitReleased(t)
			if tt.failAt == 1 {
				// Wait for the first call's outcome (a retry, or none)
				// to be settled before the next change.
				sink.waitFor(t, "the first call", func() bool { return len(sink.calls) >= 1 })
				if !errors.Is(tt.err, fleet.ErrEngineLeftOut) {
					sink.waitFor(t, "the retry", func() bool { return len(sink.calls) >= 2 })
				}
			}
			sink.waitLogged(t, "kubernetes discovery synced")
			if !d.Synced() {
				t.Errorf("Synced() = false")
			}
			if tt.failAt == 1 && !errors.Is(tt.err, fleet.ErrEngineLeftOut) {
				// Synced only once the sink took the engines: the first
				// apply's failure says they could not be applied.
				sink.mu.Lock()
				tl := slices.Clone(sink.timeline)
				sink.mu.Unlock()
				failed := slices.Index(tl, "set failed")
				notApplied := slices.IndexFunc(tl, func(l string) bool { return strings.Contains(l, "its engines could not be applied") })
				ok := slices.Index(tl, "set ok")
				synced := slices.IndexFunc(tl, func(l string) bool { return strings.Contains(l, "kubernetes discovery synced") })
				if !(failed >= 0 && failed < notApplied && notApplied < ok && ok < synced) {
					t.Errorf("want the failed call, the could-not-be-applied line, the retry, then synced, in that order:\n%s", strings.Join(tl, "\n"))
				}
			}
			s := eslice("default", "vllm-b", "vllm", http8000(), podEP("vllm-1", "10.0.0.2"))
			if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			sink.waitFor(t, "the calls", func() bool { return len(sink.calls) >= len(tt.want) })
			calls, _ := sink.snapshot()
			if len(calls) != len(tt.want) {
				t.Fatalf("%d calls, want %d: %+v", len(calls), len(tt.want), calls)
			}
			for i := range tt.want {
				if !sameEngines(calls[i], tt.want[i]) {
					t.Errorf("call %d: %+v, want %+v", i+1, calls[i], tt.want[i])
				}
			}
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if !errors.Is(tt.err, fleet.ErrEngineLeftOut) && !sink.loggedLocked(tt.err.Error()) {
				t.Errorf("the failure is not logged:\n%s", strings.Join(sink.logs, "\n"))
			}
		})
	}
}

func TestStartAccessDenied(t *testing.T) {
	forbidden := func(verb string) error {
		return apierrors.NewForbidden(endpointSlices, "", fmt.Errorf(`User "system:serviceaccount:team-b:switchboard" cannot %s resource "endpointslices"`, verb))
	}
	tests := []struct {
		name  string
		react func(cs *fake.Clientset) // denies in namespace team-b
		want  []string                 // in the error; "" wants no error
		is    error                    // what the error wraps; nil: ErrForbidden
	}{
		{
			name: "list forbidden",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, forbidden("list")
				})
			},
			want: []string{"may not list", `"team-b"`, "must grant list and watch on discovery.k8s.io endpointslices", "role.yaml"},
		},
		{
			name: "watch forbidden",
			react: func(cs *fake.Clientset) {
				cs.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
					return a.GetNamespace() == "team-b", nil, forbidden("watch")
				})
			},
			want: []string{"may not watch", `"team-b"`, "role.yaml"},
		},
		{
			name: "pods list forbidden",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, apierrors.NewForbidden(pods, "", errors.New("cannot list pods"))
				})
			},
			want: []string{"may not list pods", `"team-b"`, "must grant list and watch on pods", "role.yaml", "role_label and group_label"},
		},
		{
			name: "pods watch forbidden",
			react: func(cs *fake.Clientset) {
				cs.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
					return a.GetNamespace() == "team-b", nil, apierrors.NewForbidden(pods, "", errors.New("cannot watch pods"))
				})
			},
			want: []string{"may not watch pods", `"team-b"`, "role.yaml"},
		},
		{
			name: "unauthorized",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, apierrors.NewUnauthorized("token expired")
				})
			},
			want: []string{"credentials", "token expired"},
		},
		{
			name: "EndpointSlices not served (Kubernetes before 1.21)",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, apierrors.NewNotFound(endpointSlices, "")
				})
			},
			want: []string{"does not serve discovery.k8s.io/v1 EndpointSlices", `"team-b"`, "Kubernetes 1.21 or later"},
			is:   errNotServed,
		},
		{
			name: "an API server not answering is no error",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, apierrors.NewServerTimeout(endpointSlices, "list", 1)
				})
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset()
			tt.react(cs)
			sink := newFakeSink()
			cfg := discoveryConfig()
			cfg.Namespaces = []string{"team-a", "team-b"}
			d, err := Start(t.Context(), cfg, sink, slog.New(sinkLog{s: sink}), WithClientset(cs))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				d.Close()
				sink.mu.Lock()
				defer sink.mu.Unlock()
				if !sink.loggedLocked("did not answer the access check") {
					t.Errorf("not logged:\n%s", strings.Join(sink.logs, "\n"))
				}
				return
			}
			if err == nil {
				d.Close()
				t.Fatal("Start: nil error")
			}
			if d != nil {
				t.Errorf("Start returned a Discovery with its error")
			}
			is := tt.is
			if is == nil {
				is = ErrForbidden
			}
			if !errors.Is(err, is) {
				t.Errorf("%v does not wrap %v", err, is)
			}
			for _, sub := range tt.want {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("%q does not contain %q", err, sub)
				}
			}
			if strings.Contains(err.Error(), "team-a") {
				t.Errorf("%q names team-a, which allows it", err)
			}
			calls, events := sink.snapshot()
			if len(calls) != 0 || len(events) != 0 {
				t.Errorf("a failed Start touched the sink: calls %+v, events %q", calls, events)
			}
		})
	}
}

// TestSyncTimeout makes the informers' lists fail after the access check:
// readiness is released after SyncTimeout without a sync; once the API
// server answers, the engines arrive and Synced turns true.
func TestSyncTimeout(t *testing.T) {
	for _, empty := range []bool{false, true} {
		t.Run(fmt.Sprintf("empty=%v", empty), func(t *testing.T) {
			var objs []runtime.Object
			var want []fleet.DiscoveredEngine
			if !empty {
				objs = append(objs, eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
				want = append(want, eng("vllm-0", "http://10.0.0.1:8000"))
			}
			cs := fake.NewClientset(objs...)
			sink := newFakeSink()
			var lists atomic.Int32
			var answer atomic.Bool
			cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
				n := lists.Add(1)
				sink.poke()
				if n == 1 || answer.Load() { // the access check, and after the outage
					return false, nil, nil
				}
				return true, nil, apierrors.NewServerTimeout(endpointSlices, "list", 1)
			})
			cfg := discoveryConfig()
			cfg.SyncTimeout = 200 * time.Millisecond
			d := start(t, cfg, cs, sink)
			sink.waitReleased(t)
			if d.Synced() {
				t.Errorf("Synced() = true without a sync")
			}
			sink.waitFor(t, "an informer list", func() bool { return lists.Load() >= 2 })
			sink.mu.Lock()
			calls, timedOut := len(sink.calls), sink.loggedLocked("has not synced within sync_timeout")
			sink.mu.Unlock()
			if calls != 0 || !timedOut {
				t.Errorf("%d calls, sync timeout logged %v", calls, timedOut)
			}
			if d.Synced() {
				t.Errorf("Synced() = true without a sync")
			}

			answer.Store(true)
			sink.waitFor(t, "the sync", func() bool { return sink.loggedLocked("kubernetes discovery synced") })
			if !d.Synced() {
				t.Errorf("Synced() = false after the sync")
			}
			if !empty {
				sink.waitEngines(t, want...)
			}
		})
	}
}

// TestCloseTwice closes twice; closed, discovery follows the slices no
// more. The check needs a witness: a slice created after Close reaches a
// second, running Discovery on the same clientset, which applies it a
// batch (100 ms) after its event; the closed one (batch 0) would have
// applied it at once had its informer still been running, so once the
// witness has it, the closed one's sink must still have its one call.
func TestCloseTwice(t *testing.T) {
	before := goleak.IgnoreCurrent()
	cs := fake.NewClientset(eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
	e0, e1 := eng("vllm-0", "http://10.0.0.1:8000"), eng("vllm-1", "http://10.0.0.2:8000")
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.Batch = 0
	d, err := Start(t.Context(), cfg, sink, slog.New(sinkLog{s: sink}), WithClientset(cs))
	if err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e0)
	d.Close()
	d.Close()
	_, events := sink.snapshot()
	if want := []string{"hold", "set", "release"}; !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	if err := goleak.Find(before); err != nil {
		t.Error(err)
	}

	witness := newFakeSink()
	wcfg := discoveryConfig()
	wcfg.Batch = 100 * time.Millisecond
	start(t, wcfg, cs, witness)
	witness.waitEngines(t, e0)
	s := eslice("default", "vllm-b", "vllm", http8000(), podEP("vllm-1", "10.0.0.2"))
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	witness.waitEngines(t, e0, e1)
	if calls, _ := sink.snapshot(); len(calls) != 1 {
		t.Errorf("calls after Close: %+v", calls)
	}
}

// TestCloseBeforeSync closes while the first sync is still awaited: the
// hold is released and nothing is left running.
func TestCloseBeforeSync(t *testing.T) {
	cs := fake.NewClientset()
	var lists atomic.Int32
	sink := newFakeSink()
	cs.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if lists.Add(1) == 1 {
			return false, nil, nil
		}
		sink.poke()
		return true, nil, apierrors.NewServerTimeout(endpointSlices, "list", 1)
	})
	d := start(t, discoveryConfig(), cs, sink)
	sink.waitFor(t, "an informer list", func() bool { return lists.Load() >= 2 })
	d.Close()
	_, events := sink.snapshot()
	if want := []string{"hold", "release"}; !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	if d.Synced() {
		t.Errorf("Synced() = true")
	}
}

// TestDiscoveryReadinessFlap turns an endpoint not ready and ready again:
// it stays an engine throughout, Unready in between, never removed and
// re-added (the gateway keeps its incarnation), and the applied lines say
// which turned unready and ready.
func TestDiscoveryReadinessFlap(t *testing.T) {
	ctx := t.Context()
	a := eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"), podEP("vllm-1", "10.0.0.2"))
	cs := fake.NewClientset(a)
	api := cs.DiscoveryV1().EndpointSlices("default")
	sink := newFakeSink()
	start(t, discoveryConfig(), cs, sink)
	e0, e1 := eng("vllm-0", "http://10.0.0.1:8000"), eng("vllm-1", "http://10.0.0.2:8000")
	sink.waitEngines(t, e0, e1)

	a.Endpoints[1].Conditions.Ready = new(false)
	if _, err := api.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e0, unready(e1))
	sink.waitLogged(t, "unready=[vllm-1]")

	a.Endpoints[1].Conditions.Ready = new(true)
	if _, err := api.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, e0, e1)
	sink.waitLogged(t, " ready=[vllm-1]")

	calls, _ := sink.snapshot()
	if len(calls) != 3 {
		t.Errorf("calls %+v, want 3", calls)
	}
	if n := sink.countLogged("added=[vllm-0 vllm-1]"); n != 1 {
		t.Errorf("added logged %d times, want once", n)
	}
	if n := sink.countLogged("removed=[vllm-1]"); n != 0 {
		t.Errorf("the flapping engine was removed")
	}
}

// TestDiscoveryWarnsWithoutMatchingSlices: after the sync, no slice of the
// selector and address type in any namespace is warned about, naming them,
// once each time the count drops to zero.
func TestDiscoveryWarnsWithoutMatchingSlices(t *testing.T) {
	ctx := t.Context()
	cs := fake.NewClientset(
		family(eslice("default", "vllm-v6", "vllm", http8000(), podEP("vllm-0", "fd00::1")), discoveryv1.AddressTypeIPv6),
		eslice("default", "other-a", "other", http8000(), podEP("other-0", "10.0.9.1")),
	)
	api := cs.DiscoveryV1().EndpointSlices("default")
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.Namespaces = []string{"default", "team-b"}
	d := start(t, cfg, cs, sink)
	const none = "no EndpointSlice matches"
	sink.waitLogged(t, none)
	// The warning comes from the first apply; synced is marked (before its
	// line is logged) once that apply has returned.
	sink.waitLogged(t, "kubernetes discovery synced")
	if !d.Synced() {
		t.Errorf("Synced() = false: no slice is no failure")
	}
	sink.mu.Lock()
	i := slices.IndexFunc(sink.logs, func(l string) bool { return strings.Contains(l, none) })
	line := sink.logs[i]
	sink.mu.Unlock()
	for _, sub := range []string{"WARN", "selector=kubernetes.io/service-name=vllm", "address_type=IPv4", "namespaces=default,team-b", "slices_of_another_address_type=1"} {
		if !strings.Contains(line, sub) {
			t.Errorf("%q does not contain %q", line, sub)
		}
	}

	v4 := eslice("default", "vllm-v4", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))
	if _, err := api.Create(ctx, v4, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, eng("default/vllm-0", "http://10.0.0.1:8000"))
	if err := api.Delete(ctx, "vllm-v4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t)
	sink.waitFor(t, "the second warning", func() bool {
		return len(slices.DeleteFunc(slices.Clone(sink.logs), func(l string) bool { return !strings.Contains(l, none) })) == 2
	})

	// Still none: no new warning. The slice created after is the witness
	// that the change in between was applied.
	if _, err := api.Create(ctx, eslice("default", "other-b", "other", http8000(), podEP("other-1", "10.0.9.2")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "the other slice applied", func() bool { return sink.loggedLocked("other") })
	if _, err := api.Create(ctx, v4, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, eng("default/vllm-0", "http://10.0.0.1:8000"))
	if n := sink.countLogged(none); n != 2 {
		t.Errorf("warned %d times, want 2", n)
	}
}

// TestStartAPIKeyEnv: api_key_env naming a variable that is unset or empty
// fails Start at once, before any API request.
func TestStartAPIKeyEnv(t *testing.T) {
	const key = "SWITCHBOARD_K8S_TEST_API_KEY"
	tests := []struct {
		name, value string
		unset, ok   bool
	}{
		{name: "unset", unset: true},
		{name: "empty"},
		{name: "set", value: "sk-test", ok: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(key, tt.value)
			if tt.unset {
				os.Unsetenv(key)
			}
			cs := fake.NewClientset()
			sink := newFakeSink()
			cfg := discoveryConfig()
			cfg.APIKeyEnv = key
			d, err := Start(t.Context(), cfg, sink, slog.New(sinkLog{s: sink}), WithClientset(cs))
			if tt.ok {
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				d.Close()
				return
			}
			if err == nil {
				d.Close()
				t.Fatal("Start: nil error")
			}
			for _, sub := range []string{"api_key_env", key, "unset or empty"} {
				if !strings.Contains(err.Error(), sub) {
					t.Errorf("%q does not contain %q", err, sub)
				}
			}
			if a := cs.Actions(); len(a) != 0 {
				t.Errorf("the API was asked first: %v", a)
			}
			if calls, events := sink.snapshot(); len(calls)+len(events) != 0 {
				t.Errorf("a failed Start touched the sink: %+v, %q", calls, events)
			}
		})
	}
}

// TestStartLogsDefaultNamespace: with namespaces empty, Start says which
// namespace it watches and why.
func TestStartLogsDefaultNamespace(t *testing.T) {
	for _, set := range []bool{false, true} {
		t.Run(fmt.Sprintf("namespaces set %v", set), func(t *testing.T) {
			cfg := discoveryConfig()
			if set {
				cfg.Namespaces = []string{"team-a"}
			}
			sink := newFakeSink()
			start(t, cfg, fake.NewClientset(), sink)
			sink.waitReleased(t)
			sink.mu.Lock()
			defer sink.mu.Unlock()
			logged := sink.loggedLocked("INFO kubernetes discovery: discovery.kubernetes.namespaces is empty: watching the gateway's own namespace namespace=default why=")
			if logged == set {
				t.Errorf("namespace choice logged %v:\n%s", logged, strings.Join(sink.logs, "\n"))
			}
		})
	}
}

func TestRestConfigNamespace(t *testing.T) {
	kubeconfig := func(current string) string {
		p := filepath.Join(t.TempDir(), "kubeconfig")
		doc := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: abc}
contexts:
- name: with-ns
  context: {cluster: c, user: u, namespace: team-x}
- name: without-ns
  context: {cluster: c, user: u}
current-context: ` + current + "\n"
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name     string
		cfg      Config
		explicit *rest.Config
		ns       string
		why      []string
	}{
		{name: "the kubeconfig context's", cfg: Config{Kubeconfig: kubeconfig("with-ns")}, ns: "team-x",
			why: []string{"namespace of the kubeconfig's current context", `"with-ns"`}},
		{name: "a context without one: default", cfg: Config{Kubeconfig: kubeconfig("without-ns")}, ns: "default",
			why: []string{"current context", `"without-ns"`, "names no namespace"}},
		{name: "an explicit rest config: default", explicit: &rest.Config{Host: "https://127.0.0.1:6443"}, ns: "default",
			why: []string{"rest config"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, ns, why, err := restConfig(tt.cfg, tt.explicit)
			if err != nil {
				t.Fatalf("restConfig: %v", err)
			}
			if rc.Host != "https://127.0.0.1:6443" {
				t.Errorf("host %q", rc.Host)
			}
			if ns != tt.ns {
				t.Errorf("namespace %q, want %q", ns, tt.ns)
			}
			for _, sub := range tt.why {
				if !strings.Contains(why, sub) {
					t.Errorf("why %q does not contain %q", why, sub)
				}
			}
		})
	}
}

// TestStartInClusterWithoutToken: in a cluster (the service variables
// set) without the token mounted, Start asks whether
// automountServiceAccountToken is false.
func TestStartInClusterWithoutToken(t *testing.T) {
	if _, err := os.Stat(serviceAccountDir + "/token"); err == nil {
		t.Skip("running in a pod with a service account token")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	sink := newFakeSink()
	d, err := Start(t.Context(), discoveryConfig(), sink, slog.New(sinkLog{s: sink}))
	if err == nil {
		d.Close()
		t.Fatal("Start: nil error")
	}
	for _, sub := range []string{"kubernetes discovery", "token is not mounted", "is automountServiceAccountToken false?"} {
		if !strings.Contains(err.Error(), sub) {
			t.Errorf("%q does not contain %q", err, sub)
		}
	}
}

// TestStartAgainstAPIServerWithoutEndpointSlices runs Start against an
// HTTP server answering 404 to everything, as an API server before 1.21
// answers for discovery.k8s.io/v1: Start fails saying so, and its
// requests carry the gateway's User-Agent.
func TestStartAgainstAPIServerWithoutEndpointSlices(t *testing.T) {
	var mu sync.Mutex
	var agents, paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents = append(agents, r.UserAgent())
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		http.NotFound(w, r)
	}))
	defer srv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	sink := newFakeSink()
	d, err := Start(t.Context(), discoveryConfig(), sink, slog.New(sinkLog{s: sink}), WithRestConfig(&rest.Config{Host: srv.URL, Transport: tr}))
	if err == nil {
		d.Close()
		t.Fatal("Start: nil error")
	}
	if !errors.Is(err, errNotServed) || errors.Is(err, ErrForbidden) {
		t.Errorf("%v: want errNotServed, not ErrForbidden", err)
	}
	if !strings.Contains(err.Error(), "Kubernetes 1.21 or later") {
		t.Errorf("%q does not say which Kubernetes it needs", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(paths, []string{"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"}) {
		t.Errorf("paths %q, want the one list", paths)
	}
	for _, ua := range agents {
		if ua != userAgent() || !strings.HasPrefix(ua, "switchboard/v") {
			t.Errorf("User-Agent %q, want %q", ua, userAgent())
		}
	}
}

// hookedClientset is a fake clientset whose EndpointSlice lists call hook
// first, with the caller's context and outside the fake's lock. (The fake
// runs its reactors under one lock: they can neither run at once nor block
// like an API server that does not answer without blocking every call.)
type hookedClientset struct {
	*fake.Clientset
	hook func(ctx context.Context, ns string) error
}

func (c *hookedClientset) DiscoveryV1() discoveryv1client.DiscoveryV1Interface {
	return hookedDiscoveryV1{c.Clientset.DiscoveryV1(), c}
}

type hookedDiscoveryV1 struct {
	discoveryv1client.DiscoveryV1Interface
	c *hookedClientset
}

func (d hookedDiscoveryV1) EndpointSlices(ns string) discoveryv1client.EndpointSliceInterface {
	return hookedSlices{d.DiscoveryV1Interface.EndpointSlices(ns), ns, d.c}
}

type hookedSlices struct {
	discoveryv1client.EndpointSliceInterface
	ns string
	c  *hookedClientset
}

func (s hookedSlices) List(ctx context.Context, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	if err := s.c.hook(ctx, s.ns); err != nil {
		return nil, err
	}
	return s.EndpointSliceInterface.List(ctx, opts)
}

// firstPerNamespace returns a hook calling check on the first list of each
// namespace (the access check's) and letting the others (the informers')
// through.
func firstPerNamespace(check func(ctx context.Context, ns string, n int) error) func(context.Context, string) error {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(ctx context.Context, ns string) error {
		mu.Lock()
		first := !seen[ns]
		seen[ns] = true
		n := len(seen)
		mu.Unlock()
		if !first {
			return nil
		}
		return check(ctx, ns, n)
	}
}

// TestStartChecksNamespacesAtOnce: each namespace's access check waits
// for all three to have arrived, which only checks run at once pass.
func TestStartChecksNamespacesAtOnce(t *testing.T) {
	namespaces := []string{"team-a", "team-b", "team-c"}
	all := make(chan struct{})
	cs := &hookedClientset{Clientset: fake.NewClientset(), hook: firstPerNamespace(func(ctx context.Context, ns string, n int) error {
		if n == len(namespaces) {
			close(all)
		}
		select {
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})}
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.Namespaces = namespaces
	start(t, cfg, cs, sink, withAccessTimeout(5*time.Second))
	sink.waitReleased(t)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.loggedLocked("did not answer") {
		t.Errorf("the checks did not run at once:\n%s", strings.Join(sink.logs, "\n"))
	}
}

// TestStartAccessCheckDeadline: namespaces whose check gets no answer are
// given up together at the one deadline, each logged, and Start carries
// on (the informers keep trying).
func TestStartAccessCheckDeadline(t *testing.T) {
	cs := &hookedClientset{Clientset: fake.NewClientset(), hook: firstPerNamespace(func(ctx context.Context, ns string, _ int) error {
		if ns == "team-a" {
			return nil
		}
		<-ctx.Done() // a black-holed API server
		return ctx.Err()
	})}
	sink := newFakeSink()
	cfg := discoveryConfig()
	cfg.Namespaces = []string{"team-a", "team-b", "team-c"}
	start(t, cfg, cs, sink, withAccessTimeout(50*time.Millisecond))
	sink.waitReleased(t)
	for _, ns := range cfg.Namespaces {
		n := sink.countLogged("did not answer the access check; the informers keep trying namespace=" + ns + " ")
		if want := map[bool]int{true: 0, false: 1}[ns == "team-a"]; n != want {
			t.Errorf("namespace %s: logged %d times, want %d", ns, n, want)
		}
	}
}

func TestWatchError(t *testing.T) {
	forbidden := apierrors.NewForbidden(endpointSlices, "", errors.New(`User "system:serviceaccount:team-b:switchboard" cannot watch resource "endpointslices"`))
	tests := []struct {
		name  string
		err   error
		level string // "DEBUG" lines are not rate-limited
		want  []string
	}{
		{name: "expired", err: apierrors.NewResourceExpired("too old resource version: 10 (20)"), level: "DEBUG", want: []string{"expired"}},
		{name: "gone", err: apierrors.NewGone("gone"), level: "DEBUG", want: []string{"expired"}},
		{name: "EOF", err: io.EOF, level: "DEBUG", want: []string{"closed the watch"}},
		{name: "unexpected EOF, wrapped", err: fmt.Errorf("decoding: %w", io.ErrUnexpectedEOF), level: "DEBUG", want: []string{"closed the watch"}},
		{name: "forbidden", err: forbidden, level: "ERROR",
			want: []string{"refuses", `namespace "team-b"`, "must grant list and watch on discovery.k8s.io endpointslices", "role.yaml"}},
		{name: "unauthorized", err: apierrors.NewUnauthorized("token expired"), level: "ERROR", want: []string{"refuses", "credentials"}},
		{name: "anything else", err: errors.New("dial tcp 10.96.0.1:443: connect: connection refused"), level: "WARN",
			want: []string{"not answering", "connection refused"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := newFakeSink()
			clk := testutil.NewClock(time.Unix(1_000_000, 0))
			d := &Discovery{log: slog.New(sinkLog{s: sink}), now: clk.Now}
			h := d.watchError("team-b", sliceRule)
			for range 3 {
				h(t.Context(), nil, tt.err)
			}
			clk.Advance(time.Minute)
			h(t.Context(), nil, tt.err)
			sink.mu.Lock()
			defer sink.mu.Unlock()
			want := 2 // the first, and the one a minute later
			if tt.level == "DEBUG" {
				want = 4
			}
			if len(sink.logs) != want {
				t.Fatalf("%d lines, want %d:\n%s", len(sink.logs), want, strings.Join(sink.logs, "\n"))
			}
			for _, l := range sink.logs {
				if !strings.HasPrefix(l, tt.level+" ") || !strings.Contains(l, "namespace=team-b") {
					t.Errorf("%q: want level %s and the namespace", l, tt.level)
				}
				for _, sub := range tt.want {
					if !strings.Contains(l, sub) {
						t.Errorf("%q does not contain %q", l, sub)
					}
				}
			}
			if want == 2 && (!strings.Contains(sink.logs[0], "suppressed=0") || !strings.Contains(sink.logs[1], "suppressed=2")) {
				t.Errorf("suppressed counts:\n%s", strings.Join(sink.logs, "\n"))
			}
		})
	}
	t.Run("refusals are limited apart from outages", func(t *testing.T) {
		sink := newFakeSink()
		d := &Discovery{log: slog.New(sinkLog{s: sink}), now: time.Now}
		h := d.watchError("team-b", sliceRule)
		h(t.Context(), nil, errors.New("connection refused"))
		h(t.Context(), nil, forbidden)
		if n := sink.countLogged("ERROR "); n != 1 {
			t.Errorf("the refusal after an outage logged %d times, want 1", n)
		}
	})
}

// TestWatchForbiddenAfterStart: a watch refused after the access check
// passed (the Role changed) is logged as an error saying what to grant.
func TestWatchForbiddenAfterStart(t *testing.T) {
	cs := fake.NewClientset(eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
	sink := newFakeSink()
	var watches atomic.Int32
	cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		if watches.Add(1) == 1 {
			return false, nil, nil // the access check
		}
		return true, nil, apierrors.NewForbidden(endpointSlices, "", errors.New("cannot watch resource"))
	})
	start(t, discoveryConfig(), cs, sink)
	sink.waitLogged(t, "ERROR kubernetes discovery: the API server refuses the informer")
	sink.waitEngines(t, eng("vllm-0", "http://10.0.0.1:8000")) // the list went through
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if !sink.loggedLocked("must grant list and watch on discovery.k8s.io endpointslices") {
		t.Errorf("not said what to grant:\n%s", strings.Join(sink.logs, "\n"))
	}
}

// TestInformersStripManagedFields: the informers' caches keep the slices
// without their managedFields.
func TestInformersStripManagedFields(t *testing.T) {
	s := eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1"))
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "endpointslice-controller.k8s.io", Operation: metav1.ManagedFieldsOperationUpdate}}
	cs := fake.NewClientset(s)
	sink := newFakeSink()
	d := start(t, discoveryConfig(), cs, sink)
	sink.waitEngines(t, eng("vllm-0", "http://10.0.0.1:8000"))
	got := d.informers[0].GetStore().List()
	if len(got) != 1 {
		t.Fatalf("cache %+v", got)
	}
	if mf := got[0].(*discoveryv1.EndpointSlice).ManagedFields; mf != nil {
		t.Errorf("managedFields kept: %+v", mf)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "default/vllm-a"}
	if out, err := stripManagedFields(tomb); err != nil || out != any(tomb) {
		t.Errorf("stripManagedFields(tombstone) = %v, %v", out, err)
	}
}
