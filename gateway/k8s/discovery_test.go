package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/switchboard-gw/switchboard/gateway"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeSink is a Sink recording each SetDiscovered call and readiness hold,
// and the log records of the discovery (its handler). Every change wakes
// waitFor. Safe for concurrent use.
type fakeSink struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	calls   [][]gateway.EngineConfig
	sources []string
	fail    map[int]error // the error of call n (1-based)
	events  []string      // "hold", "set" and "release", in order
	held    int           // holds not released
	logs    []string
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

func (s *fakeSink) SetDiscovered(source string, engines []gateway.EngineConfig) (gateway.ReloadReport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, slices.Clone(engines))
	s.sources = append(s.sources, source)
	s.events = append(s.events, "set")
	s.changedLocked()
	if err := s.fail[len(s.calls)]; err != nil {
		return gateway.ReloadReport{}, err
	}
	rep := gateway.ReloadReport{}
	for _, ec := range engines {
		rep.Added = append(rep.Added, ec.Name)
	}
	return rep, nil
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
func (s *fakeSink) waitEngines(t *testing.T, want ...gateway.EngineConfig) {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("engines %+v", want), func() bool {
		return len(s.calls) > 0 && sameEngines(s.calls[len(s.calls)-1], want)
	})
}

func (s *fakeSink) waitReleased(t *testing.T) {
	t.Helper()
	s.waitFor(t, "readiness released", func() bool { return slices.Contains(s.events, "release") && s.held == 0 })
}

func (s *fakeSink) snapshot() (calls [][]gateway.EngineConfig, events []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls), slices.Clone(s.events)
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
func start(t *testing.T, cfg Config, cs *fake.Clientset, sink *fakeSink) *Discovery {
	t.Helper()
	d, err := Start(t.Context(), cfg, sink, slog.New(sinkLog{s: sink}), WithClientset(cs))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(d.Close)
	return d
}

var endpointSlices = schema.GroupResource{Group: discoveryv1.GroupName, Resource: "endpointslices"}

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
	want := []gateway.EngineConfig{
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

	b.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: new(false), Serving: new(true), Terminating: new(true)}
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
	e := func(i int) gateway.EngineConfig {
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
	want := [][]gateway.EngineConfig{{e(0)}, {e(0), e(1), e(2), e(3)}, {e(1), e(2), e(3)}}
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
		want [][]gateway.EngineConfig
	}{
		{
			name: "first call fails", failAt: 1, err: errors.New("engine key variable unset"),
			want: [][]gateway.EngineConfig{{e0}, {e0}, {e0, e1}},
		},
		{
			name: "a later call fails", failAt: 2, err: errors.New("the pool kept changing"),
			want: [][]gateway.EngineConfig{{e0}, {e0, e1}, {e0, e1}},
		},
		{
			name: "an engine left out is not retried", failAt: 1,
			err:  fmt.Errorf("%w: %w: engine name taken", gateway.ErrEngineLeftOut, gateway.ErrInvalidConfig),
			want: [][]gateway.EngineConfig{{e0}, {e0, e1}},
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
				if !errors.Is(tt.err, gateway.ErrEngineLeftOut) {
					sink.waitFor(t, "the retry", func() bool { return len(sink.calls) >= 2 })
				}
			}
			if !d.Synced() {
				t.Errorf("Synced() = false")
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
			if !errors.Is(tt.err, gateway.ErrEngineLeftOut) && !sink.loggedLocked(tt.err.Error()) {
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
	}{
		{
			name: "list forbidden",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, forbidden("list")
				})
			},
			want: []string{"may not list", `"team-b"`, "role.yaml"},
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
			name: "unauthorized",
			react: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetNamespace() == "team-b", nil, apierrors.NewUnauthorized("token expired")
				})
			},
			want: []string{"credentials", "token expired"},
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
			if !errors.Is(err, ErrForbidden) {
				t.Errorf("%v does not wrap ErrForbidden", err)
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
			var want []gateway.EngineConfig
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

func TestCloseTwice(t *testing.T) {
	before := goleak.IgnoreCurrent()
	cs := fake.NewClientset(eslice("default", "vllm-a", "vllm", http8000(), podEP("vllm-0", "10.0.0.1")))
	sink := newFakeSink()
	d, err := Start(t.Context(), discoveryConfig(), sink, slog.New(sinkLog{s: sink}), WithClientset(cs))
	if err != nil {
		t.Fatal(err)
	}
	sink.waitEngines(t, eng("vllm-0", "http://10.0.0.1:8000"))
	d.Close()
	d.Close()
	_, events := sink.snapshot()
	if want := []string{"hold", "set", "release"}; !slices.Equal(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
	// Closed, discovery no longer follows the slices.
	s := eslice("default", "vllm-b", "vllm", http8000(), podEP("vllm-1", "10.0.0.2"))
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Error(err)
	}
	calls, _ := sink.snapshot()
	if len(calls) != 1 {
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
