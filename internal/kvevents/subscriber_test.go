package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// wait bounds every poll of these tests; a passing run takes milliseconds.
const wait = 10 * time.Second

// recorder is a Handler that keeps what it was given, as "b<seq>" for a
// batch and "lost:<reason>" for a Lost, and checks it is never called
// concurrently.
type recorder struct {
	mu      sync.Mutex
	log     []string
	batches map[uint64]Batch // the last batch handed over per seq
	inCall  atomic.Int32
	overlap atomic.Bool
}

func newRecorder() *recorder { return &recorder{batches: map[uint64]Batch{}} }

func (r *recorder) enter() {
	if r.inCall.Add(1) != 1 {
		r.overlap.Store(true)
	}
}

func (r *recorder) Batch(seq uint64, b *Batch) {
	r.enter()
	defer r.inCall.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "b"+fmt.Sprint(seq))
	r.batches[seq] = *b // DecodeBatch's result aliases nothing the subscriber reuses
}

func (r *recorder) Lost(reason LostReason) {
	r.enter()
	defer r.inCall.Add(-1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "lost:"+reason.String())
}

func (r *recorder) entries() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func (r *recorder) batch(seq uint64) (Batch, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.batches[seq]
	return b, ok
}

// waitLast waits until the last entry is the batch seq and returns the
// entries.
func (r *recorder) waitLast(t *testing.T, seq uint64) []string {
	t.Helper()
	want := "b" + fmt.Sprint(seq)
	testutil.Eventually(t, wait, func() bool {
		e := r.entries()
		return len(e) > 0 && e[len(e)-1] == want
	}, "handler's last entry %s (have %v)", want, tail(r.entries(), 8))
	if r.overlap.Load() {
		t.Fatal("handler called concurrently")
	}
	return r.entries()
}

// waitLen waits until the handler has n entries and returns them.
func (r *recorder) waitLen(t *testing.T, n int) []string {
	t.Helper()
	testutil.Eventually(t, wait, func() bool { return len(r.entries()) >= n }, "%d handler entries (have %d)", n, len(r.entries()))
	return r.entries()
}

func tail(s []string, n int) []string { return s[max(0, len(s)-n):] }

// seqs returns "b<from>" ... "b<to>".
func seqs(from, to uint64) []string {
	var s []string
	for i := from; i <= to; i++ {
		s = append(s, "b"+fmt.Sprint(i))
	}
	return s
}

// testBatch is a batch whose content says its seq: TS = seq + 0.5 and one
// BlockStored of hash seq+1.
func testBatch(seq uint64) Batch {
	return Batch{TS: float64(seq) + 0.5, DPRank: 0, Events: []Event{{
		Kind: BlockStored, BlockHashes: []Hash{Hash(seq + 1)}, TokenIDs: seqU32(int(seq), 4), BlockSize: 4,
		LoRAID: -1, GroupIdx: 0, SlidingWindow: -1, Medium: "GPU",
	}}}
}

// framing is how the fake engine's replay socket answers.
type framing int

const (
	framingVLLM   framing = iota // [identity, "", seq, payload], end [identity, "", -1, ""] (vLLM)
	framingBare                  // [identity, seq, payload], end [identity, -1, ""]
	framingTopic                 // [identity, "", topic, seq, payload], end [identity, "", "", -1, ""]
	framingSilent                // never answers
)

// engine is a fake vLLM KV-events publisher: a PUB socket and, when asked,
// a replay ROUTER that answers from a buffer of every batch recorded, as
// vLLM's ZmqEventPublisher does.
type engine struct {
	t        *testing.T
	topic    []byte
	pub      zmq4.Socket
	router   zmq4.Socket
	endpoint string // tcp://127.0.0.1:port of pub
	replay   string // of router, or ""
	framing  framing
	requests atomic.Int32 // replay requests received
	wg       sync.WaitGroup
	closing  sync.Once

	mu   sync.Mutex
	next uint64
	buf  []record
}

type record struct {
	seq     uint64
	payload []byte
}

// newEngine starts a fake engine whose PUB listens on addr ("" for a free
// port of 127.0.0.1) and, with replay, a replay socket answering as f says.
func newEngine(t *testing.T, addr string, replay bool, f framing) *engine {
	t.Helper()
	return newEngineAt(t, addr, "", replay, f)
}

// newEngineAt is newEngine with the replay socket on replayAddr ("" for a
// free port), as a restarted engine binds the same ports.
func newEngineAt(t *testing.T, addr, replayAddr string, replay bool, f framing) *engine {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if replayAddr == "" {
		replayAddr = "127.0.0.1:0"
	}
	e := &engine{t: t, topic: []byte("kv@10.0.0.7@qwen"), framing: f}
	e.pub = zmq4.NewPub(context.Background(), zmq4.WithLogger(zmqLog))
	if err := e.pub.Listen("tcp://" + addr); err != nil {
		t.Fatalf("pub listen: %v", err)
	}
	e.endpoint = "tcp://" + e.pub.Addr().String()
	if replay {
		e.router = zmq4.NewRouter(context.Background(), zmq4.WithLogger(zmqLog))
		if err := e.router.Listen("tcp://" + replayAddr); err != nil {
			t.Fatalf("router listen: %v", err)
		}
		e.replay = "tcp://" + e.router.Addr().String()
		e.wg.Go(e.serveReplay)
	}
	t.Cleanup(e.close)
	return e
}

// close stops the engine's sockets and its replay server.
func (e *engine) close() {
	e.closing.Do(func() {
		e.pub.Close()
		if e.router != nil {
			e.router.Close()
		}
		e.wg.Wait()
	})
}

// record appends b to the replay buffer under the next seq.
func (e *engine) record(b Batch, enc Encoding) (uint64, []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	seq := e.next
	e.next++
	payload := AppendBatch(nil, b, enc)
	e.buf = append(e.buf, record{seq, payload})
	return seq, payload
}

// publish records b and sends it; it returns its seq.
func (e *engine) publish(b Batch, enc Encoding) uint64 {
	seq, payload := e.record(b, enc)
	e.send(e.topic, AppendSeq(nil, seq), payload)
	return seq
}

// publishNext publishes testBatch of the next seq.
func (e *engine) publishNext() uint64 {
	e.mu.Lock()
	seq := e.next
	e.mu.Unlock()
	return e.publish(testBatch(seq), EncodingMap)
}

// withhold records testBatch of the next seq without sending it, as if the
// PUB socket had dropped it; the replay buffer still has it.
func (e *engine) withhold() uint64 {
	e.mu.Lock()
	seq := e.next
	e.mu.Unlock()
	s, _ := e.record(testBatch(seq), EncodingArray)
	return s
}

// lastSeq is the seq of the last batch recorded.
func (e *engine) lastSeq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.next - 1
}

// restart forgets the buffer and starts seq at 0 again, as a new engine
// process would.
func (e *engine) restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.next, e.buf = 0, nil
}

// trim drops the buffered batches below seq, as vLLM's bounded buffer
// does.
func (e *engine) trim(seq uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.buf = slices.DeleteFunc(e.buf, func(r record) bool { return r.seq < seq })
}

func (e *engine) send(frames ...[]byte) {
	if err := e.pub.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		e.t.Errorf("publish: %v", err)
	}
}

// serveReplay answers replay requests until the router closes.
func (e *engine) serveReplay() {
	for {
		msg, err := e.router.Recv()
		if err != nil {
			return
		}
		e.requests.Add(1)
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			e.t.Errorf("replay request %q, want [identity, \"\", 8-byte start]", f)
			continue
		}
		if e.framing == framingSilent {
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		e.mu.Lock()
		buf := slices.Clone(e.buf)
		e.mu.Unlock()
		end := AppendSeq(nil, ReplayEndSeq)
		for _, r := range buf {
			if r.seq >= start {
				e.reply(id, AppendSeq(nil, r.seq), r.payload)
			}
		}
		e.reply(id, end, []byte{})
	}
}

func (e *engine) reply(id, seq, payload []byte) {
	var frames [][]byte
	switch e.framing {
	case framingVLLM:
		frames = [][]byte{id, {}, seq, payload}
	case framingBare:
		frames = [][]byte{id, seq, payload}
	case framingTopic:
		topic := e.topic
		if binary.BigEndian.Uint64(seq) == ReplayEndSeq {
			topic = []byte{}
		}
		frames = [][]byte{id, {}, topic, seq, payload}
	}
	err := e.router.Send(zmq4.NewMsgFrom(frames...))
	if err != nil && binary.BigEndian.Uint64(seq) == ReplayEndSeq {
		// zmq4 writes a frame's header and then its body, even an empty
		// one: the client may have read the end marker's last (empty)
		// frame from its header and closed before that second write.
		return
	}
	if err != nil {
		e.t.Errorf("replay reply: %v", err)
	}
}

// connect publishes a new batch at a time until the handler has one (a
// PUB drops what it sends before the SUB's subscription arrives), then
// waits until the handler has the last one published.
func (e *engine) connect(t *testing.T, r *recorder) {
	t.Helper()
	n := len(r.entries())
	testutil.Eventually(t, wait, func() bool {
		e.publishNext()
		return testutil.Poll(50*time.Millisecond, func() bool { return len(r.entries()) > n })
	}, "a first batch from %s", e.endpoint)
	r.waitLast(t, e.lastSeq())
}

// run starts s.Run and stops it at the end of the test, failing the test
// if Run does not return nil within a second of the cancel.
func run(t *testing.T, cfg SubscriberConfig, h Handler) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(cfg, h)
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		case <-time.After(time.Second):
			t.Errorf("Run did not return within 1s of the cancel")
			<-done
		}
		if r, ok := h.(*recorder); ok && r.overlap.Load() {
			t.Error("handler called concurrently")
		}
	})
	return s
}

func TestLostReasonString(t *testing.T) {
	for r, want := range map[LostReason]string{LostGap: "gap", LostRestart: "restart", LostReplayFailed: "replay_failed", 0: "LostReason(0)", 9: "LostReason(9)"} {
		if got := r.String(); got != want {
			t.Errorf("LostReason(%d).String() = %q, want %q", r, got, want)
		}
	}
}

func TestNewSubscriberValidates(t *testing.T) {
	h := newRecorder()
	tests := []struct {
		name    string
		cfg     SubscriberConfig
		h       Handler
		wantErr string // "" = valid
	}{
		{"minimal", SubscriberConfig{Endpoint: "tcp://10.0.0.7:5557"}, h, ""},
		{"host name and replay", SubscriberConfig{Endpoint: "tcp://engine-0.vllm:5557", Replay: "tcp://engine-0.vllm:5558", ReplayTimeout: time.Second}, h, ""},
		{"ipv6", SubscriberConfig{Endpoint: "tcp://[::1]:5557"}, h, ""},
		{"empty", SubscriberConfig{}, h, "endpoint"},
		{"no scheme", SubscriberConfig{Endpoint: "10.0.0.7:5557"}, h, "want tcp://host:port"},
		{"ipc", SubscriberConfig{Endpoint: "ipc:///tmp/kv"}, h, "want tcp://host:port"},
		{"bind address", SubscriberConfig{Endpoint: "tcp://*:5557"}, h, "no host"},
		{"no host", SubscriberConfig{Endpoint: "tcp://:5557"}, h, "no host"},
		{"no port", SubscriberConfig{Endpoint: "tcp://10.0.0.7"}, h, "missing port"},
		{"port 0", SubscriberConfig{Endpoint: "tcp://10.0.0.7:0"}, h, "not in 1-65535"},
		{"port too big", SubscriberConfig{Endpoint: "tcp://10.0.0.7:65536"}, h, "not in 1-65535"},
		{"bad replay", SubscriberConfig{Endpoint: "tcp://10.0.0.7:5557", Replay: "tcp://10.0.0.7"}, h, "replay endpoint"},
		{"negative timeout", SubscriberConfig{Endpoint: "tcp://10.0.0.7:5557", ReplayTimeout: -time.Second}, h, "negative replay timeout"},
		{"nil handler", SubscriberConfig{Endpoint: "tcp://10.0.0.7:5557"}, nil, "nil handler"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewSubscriber(tt.cfg, tt.h)
			if tt.wantErr == "" {
				if err != nil || s == nil {
					t.Fatalf("NewSubscriber = %v, %v; want a subscriber", s, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewSubscriber error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestSubscriberEncodings: batches of both encodings are handed over with
// their seq and events, and counted.
func TestSubscriberEncodings(t *testing.T) {
	e := newEngine(t, "", false, framingVLLM)
	r := newRecorder()
	s := run(t, SubscriberConfig{Endpoint: e.endpoint, Topic: "kv@"}, r)
	e.connect(t, r)
	before := s.Stats()

	rich := richBatch()
	invalid := testBatch(0)
	invalid.Events[0].TokenIDs = invalid.Events[0].TokenIDs[:3] // 3 tokens for a block of 4: dropped
	invalid.Events = append(invalid.Events, nilEvent(AllBlocksCleared))
	want := map[uint64]Batch{}
	a := e.publish(rich, EncodingArray)
	m := e.publish(rich, EncodingMap)
	i := e.publish(invalid, EncodingMap)
	want[a], want[m] = rich, rich
	want[i] = Batch{TS: invalid.TS, DPRank: 0, Events: []Event{nilEvent(AllBlocksCleared)}}
	got := r.waitLast(t, i)
	if g, w := tail(got, 3), seqs(a, i); !slices.Equal(g, w) {
		t.Fatalf("entries end %v, want %v", g, w)
	}
	for seq, w := range want {
		b, _ := r.batch(seq)
		if !equalDecoded(b, w) {
			t.Errorf("batch %d = %+v, want %+v", seq, b, w)
		}
	}
	if b, _ := r.batch(i); b.Dropped != 1 {
		t.Errorf("batch %d Dropped = %d, want 1", i, b.Dropped)
	}
	st := s.Stats()
	// rich: 3 BlockStored, 1 BlockRemoved, 1 AllBlocksCleared; invalid: 1 dropped, 1 cleared.
	diff := SubscriberStats{
		Batches: st.Batches - before.Batches, Stored: st.Stored - before.Stored, Removed: st.Removed - before.Removed,
		Cleared: st.Cleared - before.Cleared, Invalid: st.Invalid - before.Invalid, Unknown: st.Unknown - before.Unknown,
		DecodeErrors: st.DecodeErrors, Gaps: st.Gaps, LastSeq: st.LastSeq, HaveSeq: st.HaveSeq, Connected: st.Connected,
	}
	wantDiff := SubscriberStats{Batches: 3, Stored: 6, Removed: 2, Cleared: 3, Invalid: 1, LastSeq: i, HaveSeq: true, Connected: true}
	if diff != wantDiff {
		t.Errorf("stats change %+v, want %+v", diff, wantDiff)
	}
}

// TestSubscriberTopicFilter: a message of another topic is not handed
// over.
func TestSubscriberTopicFilter(t *testing.T) {
	e := newEngine(t, "", false, framingVLLM)
	r := newRecorder()
	run(t, SubscriberConfig{Endpoint: e.endpoint, Topic: string(e.topic)}, r)
	e.connect(t, r)
	n := len(r.entries())
	e.send([]byte("other"), AppendSeq(nil, 999), AppendBatch(nil, testBatch(999), EncodingMap))
	last := e.publishNext()
	got := r.waitLast(t, last)
	if g, w := got[n:], seqs(last, last); !slices.Equal(g, w) {
		t.Fatalf("entries after connect %v, want %v", g, w)
	}
}

// TestSubscriberGapReplay: a gap is filled from the replay socket, in
// order and with no Lost, whichever framing the replay socket answers in;
// the first batch is preceded by what the engine published before.
func TestSubscriberGapReplay(t *testing.T) {
	for name, f := range map[string]framing{"vllm": framingVLLM, "bare": framingBare, "topic": framingTopic} {
		t.Run(name, func(t *testing.T) {
			e := newEngine(t, "", true, f)
			r := newRecorder()
			s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: e.replay}, r)
			e.connect(t, r)
			// The catch-up: every batch since seq 0, the dropped warm-up ones included.
			if got, want := r.entries(), seqs(0, e.lastSeq()); !slices.Equal(got, want) {
				t.Fatalf("entries after connect %v, want %v", got, want)
			}
			before := s.Stats()
			from := e.withhold()
			e.withhold()
			e.withhold()
			live := e.publishNext()
			got := r.waitLast(t, live)
			if want := seqs(0, live); !slices.Equal(got, want) {
				t.Fatalf("entries %v, want %v", got, want)
			}
			for seq := from; seq <= live; seq++ {
				if b, _ := r.batch(seq); b.TS != float64(seq)+0.5 {
					t.Errorf("batch %d has TS %v, want %v", seq, b.TS, float64(seq)+0.5)
				}
			}
			st := s.Stats()
			if st.Gaps != 1 || st.Replays != before.Replays+1 || st.ReplayedBatches != before.ReplayedBatches+3 ||
				st.ReplayFailures != 0 || st.Batches != live+1 || st.LastSeq != live {
				t.Errorf("stats %+v (before the gap %+v): want Gaps 1, one more replay of 3 batches, no failure, %d batches, LastSeq %d",
					st, before, live+1, live)
			}
		})
	}
}

// TestSubscriberGapNoReplay: without a replay socket a gap is a Lost, then
// the live batch.
func TestSubscriberGapNoReplay(t *testing.T) {
	e := newEngine(t, "", false, framingVLLM)
	r := newRecorder()
	s := run(t, SubscriberConfig{Endpoint: e.endpoint}, r)
	e.connect(t, r)
	n := len(r.entries())
	e.withhold()
	e.withhold()
	live := e.publishNext()
	next := e.publishNext()
	got := r.waitLast(t, next)
	if g, w := got[n:], []string{"lost:gap", "b" + fmt.Sprint(live), "b" + fmt.Sprint(next)}; !slices.Equal(g, w) {
		t.Fatalf("entries after connect %v, want %v", g, w)
	}
	if st := s.Stats(); st.Gaps != 1 || st.Replays != 0 || st.ReplayFailures != 0 {
		t.Errorf("stats %+v, want Gaps 1 and no replay", st)
	}
}

// TestSubscriberReplayFails: a replay that cannot be made, times out or
// does not reach back to the gap ends in Lost(LostReplayFailed); the
// batches after it are handed over.
func TestSubscriberReplayFails(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		e := newEngine(t, "", false, framingVLLM)
		r := newRecorder()
		s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: "tcp://" + testutil.RefusedAddr}, r)
		e.connect(t, r)
		n, failed := len(r.entries()), s.Stats().ReplayFailures
		e.withhold()
		live := e.publishNext()
		got := r.waitLast(t, live)
		if g, w := got[n:], []string{"lost:replay_failed", "b" + fmt.Sprint(live)}; !slices.Equal(g, w) {
			t.Fatalf("entries after connect %v, want %v", g, w)
		}
		if st := s.Stats(); st.Gaps != 1 || st.ReplayFailures != failed+1 || st.Replays != 0 {
			t.Errorf("stats %+v, want Gaps 1, ReplayFailures %d, Replays 0", st, failed+1)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		e := newEngine(t, "", true, framingSilent)
		r := newRecorder()
		s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: e.replay, ReplayTimeout: 100 * time.Millisecond}, r)
		e.connect(t, r)
		n, failed := len(r.entries()), s.Stats().ReplayFailures
		e.withhold()
		live := e.publishNext()
		start := time.Now()
		got := r.waitLast(t, live)
		if g, w := got[n:], []string{"lost:replay_failed", "b" + fmt.Sprint(live)}; !slices.Equal(g, w) {
			t.Fatalf("entries after connect %v, want %v", g, w)
		}
		if el := time.Since(start); el < 100*time.Millisecond {
			t.Errorf("live batch handed over after %v, before the replay timeout", el)
		}
		if st := s.Stats(); st.ReplayFailures != failed+1 || e.requests.Load() < 1 {
			t.Errorf("stats %+v after %d requests, want ReplayFailures %d", st, e.requests.Load(), failed+1)
		}
	})
	t.Run("not covered", func(t *testing.T) {
		e := newEngine(t, "", true, framingVLLM)
		r := newRecorder()
		s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: e.replay}, r)
		e.connect(t, r)
		n := len(r.entries())
		gone := e.withhold()
		kept := e.withhold()
		e.trim(kept) // the engine's buffer no longer reaches back to the gap
		live := e.publishNext()
		got := r.waitLast(t, live)
		if g, w := got[n:], []string{"lost:replay_failed", "b" + fmt.Sprint(kept), "b" + fmt.Sprint(live)}; !slices.Equal(g, w) {
			t.Fatalf("entries after connect %v (b%d gone), want %v", g, gone, w)
		}
		if st := s.Stats(); st.ReplayFailures != 1 || st.Gaps != 1 {
			t.Errorf("stats %+v, want ReplayFailures 1 and Gaps 1", st)
		}
	})
}

// TestSubscriberRestart: seq going back is a restart: Lost(LostRestart),
// then the new process's batches; with a replay socket, the ones it
// published before the first seen are caught up.
func TestSubscriberRestart(t *testing.T) {
	t.Run("no replay", func(t *testing.T) {
		e := newEngine(t, "", false, framingVLLM)
		r := newRecorder()
		s := run(t, SubscriberConfig{Endpoint: e.endpoint}, r)
		e.connect(t, r)
		e.publishNext()
		e.publishNext()
		r.waitLast(t, e.lastSeq())
		n := len(r.entries())
		e.restart()
		for range 3 {
			e.publishNext()
		}
		got := r.waitLen(t, n+4)
		if g, w := got[n:], append([]string{"lost:restart"}, seqs(0, 2)...); !slices.Equal(g, w) {
			t.Fatalf("entries after the restart %v, want %v", g, w)
		}
		if st := s.Stats(); st.Restarts != 1 || st.Gaps != 0 || st.LastSeq != 2 {
			t.Errorf("stats %+v, want Restarts 1, no gap, LastSeq 2", st)
		}
	})
	t.Run("replay", func(t *testing.T) {
		e := newEngine(t, "", true, framingVLLM)
		r := newRecorder()
		s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: e.replay}, r)
		e.connect(t, r)
		e.publishNext()
		e.publishNext()
		r.waitLast(t, e.lastSeq())
		n := len(r.entries())
		e.restart()
		e.withhold()
		e.withhold()
		e.publishNext() // 2, and the last seq handed over is at least 2
		got := r.waitLen(t, n+4)
		if g, w := got[n:], append([]string{"lost:restart"}, seqs(0, 2)...); !slices.Equal(g, w) {
			t.Fatalf("entries after the restart %v, want %v", g, w)
		}
		if st := s.Stats(); st.Restarts != 1 || st.ReplayFailures != 0 {
			t.Errorf("stats %+v, want Restarts 1, no replay failure", st)
		}
	})
}

// TestSubscriberDecodeErrors: messages and payloads that do not parse are
// counted and skipped; the stream goes on. A batch lost that way is a gap.
func TestSubscriberDecodeErrors(t *testing.T) {
	e := newEngine(t, "", false, framingVLLM)
	r := newRecorder()
	s := run(t, SubscriberConfig{Endpoint: e.endpoint}, r)
	e.connect(t, r)
	n := len(r.entries())
	e.send(e.topic, AppendSeq(nil, 1000))                        // two frames
	e.send(e.topic, []byte{0, 0, 0, 0, 0, 0, 7}, []byte{0x90})   // a 7-byte seq
	e.send(e.topic, AppendSeq(nil, 1001), []byte{0x93, 0xc1, 0}) // not msgpack (0xc1 is never used)
	next := e.publishNext()
	got := r.waitLast(t, next)
	if g, w := got[n:], seqs(next, next); !slices.Equal(g, w) {
		t.Fatalf("entries after the junk %v, want %v", g, w)
	}
	if st := s.Stats(); st.DecodeErrors != 3 || st.Gaps != 0 {
		t.Errorf("stats %+v, want DecodeErrors 3, no gap", st)
	}

	// A payload that does not decode under the next seq: that batch is
	// missing, so the one after is a gap.
	e.mu.Lock()
	bad := e.next
	e.next++
	e.mu.Unlock()
	e.send(e.topic, AppendSeq(nil, bad), []byte("garbage"))
	after := e.publishNext()
	got = r.waitLast(t, after)
	if g, w := got[n+1:], []string{"lost:gap", "b" + fmt.Sprint(after)}; !slices.Equal(g, w) {
		t.Fatalf("entries after the bad payload %v, want %v", g, w)
	}
	if st := s.Stats(); st.DecodeErrors != 4 || st.Gaps != 1 {
		t.Errorf("stats %+v, want DecodeErrors 4, Gaps 1", st)
	}
}

// TestSubscriberReconnect: the publisher goes away and a new one binds the
// same port; the subscriber redials, receives again and sees the restart.
func TestSubscriberReconnect(t *testing.T) {
	e := newEngine(t, "", false, framingVLLM)
	r := newRecorder()
	s := run(t, SubscriberConfig{Endpoint: e.endpoint}, r)
	e.connect(t, r)
	// Far ahead, so that the new publisher's seqs, from 0, go back.
	e.mu.Lock()
	e.next = 1000
	e.mu.Unlock()
	r.waitLast(t, e.publishNext())
	e.close()
	testutil.Eventually(t, wait, func() bool { return !s.Stats().Connected }, "Connected false after the publisher closed")
	n := len(r.entries())

	addr := strings.TrimPrefix(e.endpoint, "tcp://")
	e2 := newEngine(t, addr, false, framingVLLM)
	e2.connect(t, r)
	got := r.entries()[n:]
	if len(got) < 2 || got[0] != "lost:restart" {
		t.Fatalf("entries after the new publisher %v, want lost:restart then its batches", got)
	}
	if st := s.Stats(); !st.Connected || st.Restarts != 1 {
		t.Errorf("stats %+v, want Connected and Restarts 1", st)
	}
}

// TestSubscriberRunCancel: Run returns nil promptly on cancel, connected
// or redialing an engine that is down, and a second concurrent Run is
// refused.
func TestSubscriberRunCancel(t *testing.T) {
	for name, connected := range map[string]bool{"connected": true, "redialing": false} {
		t.Run(name, func(t *testing.T) {
			endpoint := "tcp://" + testutil.RefusedAddr
			var e *engine
			if connected {
				e = newEngine(t, "", true, framingSilent)
				endpoint = e.endpoint
			}
			r := newRecorder()
			s, err := NewSubscriber(SubscriberConfig{Endpoint: endpoint}, r)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			if connected {
				e.connect(t, r)
			} else {
				// Nothing to poll: give it time to fail a dial or two and back off.
				time.Sleep(250 * time.Millisecond)
			}
			if err := s.Run(context.Background()); err == nil {
				t.Error("a second concurrent Run returned nil, want an error")
			}
			start := time.Now()
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run = %v, want nil", err)
				}
			case <-time.After(time.Second):
				t.Fatal("Run did not return within 1s of the cancel")
			}
			if el := time.Since(start); el > 500*time.Millisecond {
				t.Errorf("Run returned %v after the cancel", el)
			}
			if s.Stats().Connected {
				t.Error("Connected after Run returned")
			}
		})
	}
}

// gated is a recorder whose Batch waits for gate to close while hold is
// set, as a slow handler would.
type gated struct {
	*recorder
	hold atomic.Bool
	gate chan struct{}
}

func (g *gated) Batch(seq uint64, b *Batch) {
	if g.hold.Load() {
		<-g.gate
	}
	g.recorder.Batch(seq, b)
}

// TestSubscriberQueueOverflow: while the handler is stuck, messages beyond
// the bounded queue are dropped and the hole shows as a gap: a Lost
// without a replay socket, filled with one.
func TestSubscriberQueueOverflow(t *testing.T) {
	for name, replay := range map[string]bool{"no replay": false, "replay": true} {
		t.Run(name, func(t *testing.T) {
			e := newEngine(t, "", replay, framingVLLM)
			g := &gated{recorder: newRecorder(), gate: make(chan struct{})}
			s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: e.replay}, g)
			e.connect(t, g.recorder)
			n := len(g.entries())
			g.hold.Store(true)
			first := e.publishNext()
			for range liveQueue + 100 {
				e.publishNext()
			}
			testutil.Eventually(t, wait, func() bool { return s.queueDrops.Load() > 0 }, "a message dropped from the full queue")
			g.hold.Store(false)
			close(g.gate)
			// A dropped tail shows only when a later batch comes: publish
			// until one is handed over.
			testutil.Eventually(t, wait, func() bool {
				seq := e.publishNext()
				return testutil.Poll(200*time.Millisecond, func() bool {
					got := g.entries()
					return got[len(got)-1] == "b"+fmt.Sprint(seq)
				})
			}, "the handler to catch up")
			got := g.waitLast(t, e.lastSeq())[n:]
			st := s.Stats()
			if replay {
				if want := seqs(first, e.lastSeq()); !slices.Equal(got, want) {
					t.Fatalf("entries after connect: %d, want %d batches from b%d with no Lost (%v...)", len(got), len(want), first, got[:min(len(got), 5)])
				}
				if st.Gaps == 0 || st.ReplayFailures != 0 {
					t.Errorf("stats %+v, want gaps filled by replays", st)
				}
				return
			}
			lost := slices.Index(got, "lost:gap")
			if got[0] != "b"+fmt.Sprint(first) || lost < 0 || uint64(strings.Count(strings.Join(got, " "), "lost:gap")) != st.Gaps {
				t.Fatalf("entries after connect start %v, want b%d first and one lost:gap per gap (%d)", got[:min(len(got), 5)], first, st.Gaps)
			}
		})
	}
}

// msgBytes is the frame bytes of the message publishNext sends for seq:
// the topic, the 8-byte seq and testBatch(seq) in the map encoding.
func (e *engine) msgBytes(seq uint64) int64 {
	return int64(len(e.topic)) + 8 + int64(len(AppendBatch(nil, testBatch(seq), EncodingMap)))
}

// setQueueBudget sets liveQueueBudget for the subscribers the test builds
// and restores it at its end.
func setQueueBudget(t *testing.T, n int64) {
	old := liveQueueBudget
	liveQueueBudget = n
	t.Cleanup(func() { liveQueueBudget = old })
}

// TestSubscriberQueueBytes: while the handler is stuck, the live queue
// takes messages up to its byte budget, far below its count of 1024, and
// drops the one that would go over; the hole shows as a gap. A message
// over the whole budget still enters an empty queue.
func TestSubscriberQueueBytes(t *testing.T) {
	t.Run("budget", func(t *testing.T) {
		e := newEngine(t, "", false, framingVLLM)
		budget := 20 * e.msgBytes(1000)
		setQueueBudget(t, budget)
		g := &gated{recorder: newRecorder(), gate: make(chan struct{})}
		s := run(t, SubscriberConfig{Endpoint: e.endpoint}, g)
		var once sync.Once
		release := func() {
			once.Do(func() {
				g.hold.Store(false)
				close(g.gate)
			})
		}
		t.Cleanup(release) // before run's cleanup waits for Run: a failure must not leave the handler stuck
		e.connect(t, g.recorder)
		n := len(g.entries())
		g.hold.Store(true)
		first := e.publishNext()
		for range 100 {
			e.publishNext()
		}
		testutil.Eventually(t, wait, func() bool { return s.queueDrops.Load() > 0 }, "a message dropped over the byte budget")
		if q := s.queued.Load(); q > budget || q <= 0 {
			t.Errorf("queued %d bytes with the handler stuck, want 1..%d", q, budget)
		}
		release()
		testutil.Eventually(t, wait, func() bool {
			seq := e.publishNext()
			return testutil.Poll(200*time.Millisecond, func() bool {
				got := g.entries()
				return got[len(got)-1] == "b"+fmt.Sprint(seq)
			})
		}, "the handler to catch up")
		got := g.waitLast(t, e.lastSeq())[n:]
		// got: b<first>, then the k batches queued behind it, then the gap.
		k := slices.Index(got, "lost:gap") - 1
		if k < 1 || !slices.Equal(got[:k+1], seqs(first, first+uint64(k))) {
			t.Fatalf("entries after connect start %v, want b%d, the batches queued behind it, then lost:gap", got[:min(len(got), 30)], first)
		}
		var queued int64 // what the k batches held in the queue, together
		for seq := first + 1; seq <= first+uint64(k); seq++ {
			queued += e.msgBytes(seq)
		}
		// While the handler held first, the k were in the queue together;
		// the next did not fit beside them (and first, if not yet taken).
		next := e.msgBytes(first + uint64(k) + 1)
		if queued > budget || e.msgBytes(first)+queued+next <= budget {
			t.Errorf("%d batches of %d bytes queued, next of %d dropped; want them within the budget %d and the next over it",
				k, queued, next, budget)
		}
		// The ones still arriving after the release may be queued again,
		// so only the first gap is exact.
		if st := s.Stats(); st.Gaps == 0 {
			t.Errorf("stats %+v, want a gap", st)
		}
		if q := s.queued.Load(); q != 0 {
			t.Errorf("queued %d bytes after the handler caught up, want 0", q)
		}
	})
	t.Run("message over the budget", func(t *testing.T) {
		setQueueBudget(t, 1)
		e := newEngine(t, "", false, framingVLLM)
		r := newRecorder()
		s := run(t, SubscriberConfig{Endpoint: e.endpoint}, r)
		e.connect(t, r)
		n := len(r.entries())
		for range 3 {
			r.waitLast(t, e.publishNext())
		}
		if got, want := r.entries()[n:], seqs(e.lastSeq()-2, e.lastSeq()); !slices.Equal(got, want) {
			t.Fatalf("entries %v, want %v", got, want)
		}
		if st := s.Stats(); st.Gaps != 0 {
			t.Errorf("stats %+v, want no gap", st)
		}
	})
}

// TestSubscriberRedialRestart: the engine restarts while the connection
// is down and has published past the last seq seen before the subscriber
// is back. The first batch of the new connection does not follow, so it
// is a restart: Lost(LostRestart), then the new process's batches (from
// seq 0 with a replay endpoint), and no gap replayed from the new
// process's buffer.
func TestSubscriberRedialRestart(t *testing.T) {
	for name, replay := range map[string]bool{"no replay": false, "replay": true} {
		t.Run(name, func(t *testing.T) {
			a := newEngine(t, "", replay, framingVLLM)
			r := newRecorder()
			s := run(t, SubscriberConfig{Endpoint: a.endpoint, Replay: a.replay}, r)
			a.connect(t, r)
			for a.lastSeq() < 5 {
				a.publishNext()
			}
			r.waitLast(t, a.lastSeq())
			last := a.lastSeq()
			a.close()
			testutil.Eventually(t, wait, func() bool { return !s.Stats().Connected }, "Connected false after the publisher closed")
			n := len(r.entries())

			// The new process, on the same ports, has published up to
			// start-1 already.
			start := max(10, last+2)
			b := newEngineAt(t, strings.TrimPrefix(a.endpoint, "tcp://"), strings.TrimPrefix(a.replay, "tcp://"), replay, framingVLLM)
			for range start {
				b.withhold()
			}
			b.connect(t, r)
			got := r.entries()[n:]
			if len(got) < 2 || got[0] != "lost:restart" {
				t.Fatalf("entries after the new publisher %v, want lost:restart then its batches", got)
			}
			var from uint64
			if _, err := fmt.Sscanf(got[1], "b%d", &from); err != nil {
				t.Fatalf("entries after the new publisher %v: %v", got, err)
			}
			switch {
			case replay && from != 0:
				t.Fatalf("entries after the new publisher %v, want lost:restart then b0... (the catch-up)", got)
			case !replay && from < start:
				t.Fatalf("entries after the new publisher %v, want lost:restart then b%d or later", got, start)
			}
			if want := seqs(from, b.lastSeq()); !slices.Equal(got[1:], want) {
				t.Fatalf("entries after the new publisher %v, want lost:restart then %v", got, want)
			}
			if st := s.Stats(); st.Restarts != 1 || st.Gaps != 0 || st.ReplayFailures != 0 || st.LastSeq != b.lastSeq() {
				t.Errorf("stats %+v, want Restarts 1, no gap, no replay failure, LastSeq %d", st, b.lastSeq())
			}
		})
	}
}

// TestSubscriberRedialRule: the first batch of a new connection continues
// the stream only when its seq is the next one; otherwise it is a restart,
// also when the connection's first message did not decode. On the same
// connection a seq ahead is a gap.
func TestSubscriberRedialRule(t *testing.T) {
	payload := AppendBatch(nil, testBatch(0), EncodingMap)
	tests := []struct {
		name     string
		junk     bool // the connection's first message does not decode; seq comes second
		seq      uint64
		fresh    bool
		want     []string
		restarts uint64
		gaps     uint64
	}{
		{"redial, next seq", false, 6, true, []string{"b6"}, 0, 0},
		{"redial, seq ahead", false, 10, true, []string{"lost:restart", "b10"}, 1, 0},
		{"redial, seq back", false, 3, true, []string{"lost:restart", "b3"}, 1, 0},
		{"redial, seq repeated", false, 5, true, []string{"lost:restart", "b5"}, 1, 0},
		{"redial, first undecodable", true, 10, false, []string{"lost:restart", "b10"}, 1, 0},
		{"same connection, seq ahead", false, 10, false, []string{"lost:gap", "b10"}, 0, 1},
		{"same connection, next seq", false, 6, false, []string{"b6"}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRecorder()
			s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://" + testutil.RefusedAddr}, r)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			s.onLive(ctx, liveMsg{seq: 5, payload: payload, fresh: true}) // the first connection's first
			if tt.junk {
				s.onLive(ctx, liveMsg{seq: tt.seq - 1, payload: []byte("junk"), fresh: true})
			}
			s.onLive(ctx, liveMsg{seq: tt.seq, payload: payload, fresh: tt.fresh})
			if got := r.entries(); !slices.Equal(got[1:], tt.want) || got[0] != "b5" {
				t.Fatalf("entries %v, want b5 then %v", got, tt.want)
			}
			if st := s.Stats(); st.Restarts != tt.restarts || st.Gaps != tt.gaps || st.LastSeq != tt.seq {
				t.Errorf("stats %+v, want Restarts %d, Gaps %d, LastSeq %d", st, tt.restarts, tt.gaps, tt.seq)
			}
		})
	}
}
