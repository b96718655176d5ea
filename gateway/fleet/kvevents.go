package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// KVEventsConfig configures the fleet's subscriptions to its engines'
// KV-cache events (the gateway's kv_events section): every engine with
// [EngineConfig.KVEvents] gets one subscription per incarnation, for its
// life in the fleet, feeding the [routing.KVIndex] given with
// [WithKVIndex]. Every gateway replica subscribes to every engine, so all
// replicas hold the same index without talking to each other.
type KVEventsConfig struct {
	// Topic is the subscription's topic prefix, "" for every topic
	// (vLLM's topic default is "").
	Topic string
	// ReplayTimeout bounds one replay exchange with an engine's replay
	// socket; 0 is the subscriber's default (2 s).
	ReplayTimeout time.Duration
	// BlockSize is the tokens per block the gateway keys requests with
	// (kv_events.block_size); an engine whose events carry another size
	// is logged once, as its blocks can never match a request.
	BlockSize int
	// CheckInterval is how often each engine's index is checked for
	// staleness (routing.KVIndex.Fresh), to log and count its turning
	// stale and fresh again; 0 is one second.
	CheckInterval time.Duration
}

// WithKVIndex gives the fleet the index its KV-event subscriptions feed,
// and their settings. A nil index is ignored: no engine is subscribed.
func WithKVIndex(x *routing.KVIndex, c KVEventsConfig) Option {
	return func(o *options) {
		if x != nil {
			o.kv, o.kvCfg = x, c
		}
	}
}

// kvState is an engine incarnation's subscription, touched under
// Fleet.mu except for the fields the subscriber goroutine owns.
type kvState struct {
	sub    *kvevents.Subscriber
	cancel context.CancelFunc
	done   chan struct{} // closed when the subscriber has stopped and the index forgot the engine
	// fresh is the last freshness the staleness check saw (checkKV's
	// goroutine only).
	fresh, wasFresh bool
	// sizeWarned: a block size other than the configured one was logged
	// (the subscriber goroutine only).
	sizeWarned bool
	// badSize: the engine's events carry another block size than
	// kv_events.block_size (it is kept off them); lost counts Lost calls;
	// orphans counts BlockStored events skipped for an unknown parent.
	badSize       atomic.Bool
	lost, orphans atomic.Uint64
}

// kvSink adapts an engine's subscription to the index.
type kvSink struct {
	f *Fleet
	e *Engine
}

// Batch applies one batch to the index and records its lag.
func (s kvSink) Batch(_ uint64, b *kvevents.Batch) {
	now := s.f.now()
	if bs := s.f.kvCfg.BlockSize; bs > 0 {
		for i := range b.Events {
			if ev := &b.Events[i]; ev.Kind == kvevents.BlockStored && ev.BlockSize != bs {
				// Its blocks could never match a request's: the engine is
				// kept off its events (not fresh: the approximate index)
				// rather than routed as if its cache were empty.
				if !s.e.kv.sizeWarned {
					s.e.kv.sizeWarned = true
					s.f.log.Warn("engine's KV-cache blocks are not kv_events.block_size tokens: it is routed on the approximate index; set kv_events.block_size to the engine's --block-size",
						"engine", s.e.cfg.Name, "engine_block_size", ev.BlockSize, "block_size", bs)
				}
				s.e.kv.badSize.Store(true)
				s.f.kv.Drop(s.e.ep, now)
				return
			}
		}
	}
	a := s.f.kv.Apply(s.e.ep, b, now)
	s.e.kv.orphans.Add(uint64(a.Orphans))
	if b.TS > 0 && !math.IsInf(b.TS, 0) {
		lag := now.Sub(time.Unix(0, int64(b.TS*1e9))).Seconds()
		s.f.metrics.RecordKVLag(context.Background(), s.e.tel, max(lag, 0))
	}
}

// Lost drops what the index holds for the engine. After a gap it is
// unknown until new events rebuild it, and the policy routes the engine on
// the approximate index meanwhile (routing.KVIndex.Drop); after a restart
// the engine's cache is empty, which its next events confirm
// (routing.KVIndex.Reset).
func (s kvSink) Lost(reason kvevents.LostReason) {
	if reason == kvevents.LostRestart {
		// A new process: its cache is empty, and its events from their
		// start say all it holds.
		s.f.kv.Reset(s.e.ep)
	} else {
		s.f.kv.Drop(s.e.ep, s.f.now())
	}
	if n := s.e.kv.lost.Add(1); n == 1 || n%100 == 0 { // the first, then one in 100
		s.f.log.Warn("engine's KV-cache events were lost; its blocks are dropped from the precise index and it is routed on the approximate index while new events rebuild them (kv_events.stale_after)",
			"engine", s.e.cfg.Name, "reason", reason.String(), "losses", n)
	}
}

// checkBlockSize logs, once per incarnation, an engine subscribed to whose
// KV block size (vllm:cache_config_info's block_size, scraped; 0 when it
// reports none) is not kv_events.block_size: its blocks can never match a
// request's. Its events' own block size is checked too (kvSink.Batch).
func (f *Fleet) checkBlockSize(e *Engine, size int) {
	if f.kv == nil || e.cfg.KVEvents == "" || size == 0 || f.kvCfg.BlockSize == 0 || size == f.kvCfg.BlockSize {
		return
	}
	if e.kvSizeLogged.CompareAndSwap(false, true) {
		f.log.Warn("engine's KV block size (vllm:cache_config_info) is not kv_events.block_size: its blocks cannot match a request; set kv_events.block_size to the engine's --block-size",
			"engine", e.cfg.Name, "engine_block_size", size, "block_size", f.kvCfg.BlockSize)
	}
}

// startKVLocked starts e's subscription, when it has an endpoint, the
// fleet has an index and has started. Under f.mu.
func (f *Fleet) startKVLocked(e *Engine) error {
	if f.kv == nil || e.cfg.KVEvents == "" || e.kv.sub != nil || e.retired || f.ctx.Err() != nil {
		return nil // (a closed fleet starts nothing Close would not wait for)
	}
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
		Endpoint: e.cfg.KVEvents, Replay: e.cfg.KVEventsReplay, Topic: f.kvCfg.Topic,
		ReplayTimeout: f.kvCfg.ReplayTimeout, Logger: f.log.With("engine", e.cfg.Name),
	}, kvSink{f: f, e: e})
	if err != nil {
		return fmt.Errorf("%w: engine %q: kv_events: %w", ErrInvalidConfig, e.cfg.Name, err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	e.kv.sub, e.kv.cancel, e.kv.done = sub, cancel, make(chan struct{})
	f.wg.Add(1)
	go func(done chan struct{}) {
		defer f.wg.Done()
		defer close(done)
		if err := sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			f.log.Warn("engine's KV-cache event subscription ended", "engine", e.cfg.Name, "error", err)
		}
		// After the subscriber's last Apply: the index forgets the
		// incarnation for good.
		f.kv.Forget(e.ep)
	}(e.kv.done)
	return nil
}

// stopKVLocked stops e's subscription (e left the fleet). Under f.mu;
// the index forgets e once the subscriber has stopped.
func (f *Fleet) stopKVLocked(e *Engine) {
	if e.kv.cancel != nil {
		e.kv.cancel()
	}
}

// reconcileKVLocked starts the subscriptions of the fleet's engines that
// have none yet, once the fleet has started. Under f.mu.
func (f *Fleet) reconcileKVLocked() {
	if f.kv == nil || !f.kvStarted {
		return
	}
	for _, e := range f.engines {
		if err := f.startKVLocked(e); err != nil {
			f.log.Error("cannot subscribe to the engine's KV-cache events", "engine", e.cfg.Name, "error", err)
		}
	}
}

// checkKV logs and counts the engines whose index turned stale (their
// events stopped while they had work: routing.KVIndex.Fresh) or fresh
// again.
func (f *Fleet) checkKV(ctx context.Context) {
	now := f.now()
	for _, e := range f.subscribed() {
		fresh := f.kv.Fresh(e.ep, now)
		switch {
		case fresh && !e.kv.fresh:
			if e.kv.wasFresh {
				f.log.Info("engine's KV-cache events resumed; routing it on its reported blocks again", "engine", e.cfg.Name)
			} else {
				f.log.Info("engine's KV-cache events are flowing; routing it on its reported blocks", "engine", e.cfg.Name)
			}
			e.kv.wasFresh = true
		case !fresh && e.kv.fresh:
			f.log.Warn("engine's KV-cache events are stale; routing it on the gateway's approximate index until they resume",
				"engine", e.cfg.Name)
			f.metrics.RecordKVFallback(ctx, e.tel)
		}
		e.kv.fresh = fresh
	}
}

// subscribed returns the fleet's engines with a KV-event subscription,
// read under f.mu; their subscriptions are read without it.
func (f *Fleet) subscribed() []*Engine {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*Engine, 0, len(f.engines))
	for _, e := range f.engines {
		if e.kv.sub != nil {
			out = append(out, e)
		}
	}
	return out
}

// EngineKVStatus is an engine's KV-event subscription as GET
// /admin/engines shows it.
type EngineKVStatus struct {
	Endpoint  string `json:"endpoint"`
	Replay    string `json:"replay,omitempty"`
	Connected bool   `json:"connected"`
	// Fresh: the engine is routed on its reported blocks (its events are
	// not stale); false: on the approximate index.
	Fresh        bool   `json:"fresh"`
	Blocks       int    `json:"blocks"`        // blocks the index holds for it
	Batches      uint64 `json:"batches"`       // batches received
	LastSeq      uint64 `json:"last_seq"`      // the last batch's sequence number
	Gaps         uint64 `json:"gaps"`          // sequence gaps seen
	Replays      uint64 `json:"replays"`       // gaps filled by replay
	Restarts     uint64 `json:"restarts"`      // publisher restarts seen
	DecodeErrors uint64 `json:"decode_errors"` // messages that did not decode
	PeerErrors   uint64 `json:"peer_errors"`   // connections dropped for breaking the protocol's bounds
	Orphans      uint64 `json:"orphans"`       // stored events skipped: their parent block unknown (after a loss)
	// BlockSizeMismatch: its events carry another block size than
	// kv_events.block_size; it is routed on the approximate index.
	BlockSizeMismatch bool `json:"block_size_mismatch,omitempty"`
}

// kvStatus is e's subscription status, nil when it has none.
func (f *Fleet) kvStatus(e *Engine, now time.Time) *EngineKVStatus {
	if e.kv.sub == nil {
		return nil
	}
	st := e.kv.sub.Stats()
	blocks, fresh, _ := f.kv.EngineStats(e.ep, now)
	return &EngineKVStatus{Endpoint: e.cfg.KVEvents, Replay: e.cfg.KVEventsReplay, Connected: st.Connected, Fresh: fresh,
		Blocks: blocks, Batches: st.Batches, LastSeq: st.LastSeq, Gaps: st.Gaps, Replays: st.Replays, Restarts: st.Restarts,
		DecodeErrors: st.DecodeErrors, PeerErrors: st.PeerErrors, Orphans: e.kv.orphans.Load(), BlockSizeMismatch: e.kv.badSize.Load()}
}

// ObserveKV reports every subscribed engine's KV-event counters and the
// index's totals (telemetry.Metrics ObserveKVEvents).
func (f *Fleet) ObserveKV(report func(e *telemetry.Engine, c telemetry.KVEngineCounts)) telemetry.KVIndexTotals {
	if f.kv == nil {
		return telemetry.KVIndexTotals{}
	}
	now := f.now()
	for _, e := range f.subscribed() {
		st := e.kv.sub.Stats()
		blocks, _, _ := f.kv.EngineStats(e.ep, now)
		report(e.tel, telemetry.KVEngineCounts{Stored: st.Stored, Removed: st.Removed, Cleared: st.Cleared,
			Unknown: st.Unknown, Invalid: st.Invalid, DecodeErrors: st.DecodeErrors, PeerErrors: st.PeerErrors, Gaps: st.Gaps,
			Restarts: st.Restarts, Replays: st.Replays, ReplayFailures: st.ReplayFailures, Orphans: e.kv.orphans.Load(),
			Blocks: int64(blocks)})
	}
	// Outside the fleet's lock: it scans the speculative table.
	ix := f.kv.Stats()
	return telemetry.KVIndexTotals{Bytes: ix.Bytes, Stale: int64(ix.Stale)}
}

// KVIndex returns the index the fleet's subscriptions feed, nil when none.
func (f *Fleet) KVIndex() *routing.KVIndex { return f.kv }
