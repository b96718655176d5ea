package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// kvWait bounds every wait for a KV-events message.
const kvWait = 5 * time.Second

// kvConfig is fastConfig with KV events on free ports of 127.0.0.1 and small blocks.
func kvConfig() Config {
	cfg := fastConfig()
	cfg.BlockSize = 4
	cfg.KVEvents = "tcp://127.0.0.1:0"
	cfg.KVEventsReplay = "tcp://127.0.0.1:0"
	return cfg
}

// startKVEngine is startEngine for an engine with KV events, closed at cleanup (before
// its HTTP server).
func startKVEngine(t *testing.T, cfg Config) (*Engine, *httptest.Server) {
	t.Helper()
	e, srv := startEngine(t, cfg)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e, srv
}

// kvMsg is one message received on the PUB socket, decoded.
type kvMsg struct {
	topic   string
	seq     uint64
	payload []byte
	batch   kvevents.Batch
}

// kvSub is a SUB socket on an engine's KV events, read by one goroutine into msgs.
type kvSub struct {
	t    *testing.T
	sock zmq4.Socket
	msgs chan kvMsg
	done chan struct{}
}

// subscribe connects a SUB socket to addr with the topic filter topic and reads it until
// the test ends.
func subscribe(t *testing.T, addr, topic string) *kvSub {
	t.Helper()
	s := &kvSub{t: t, sock: zmq4.NewSub(context.Background()), msgs: make(chan kvMsg, 1024), done: make(chan struct{})}
	if err := s.sock.Dial(addr); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	if err := s.sock.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	go func() {
		defer close(s.done)
		for {
			m, err := s.sock.Recv()
			if err != nil {
				return
			}
			topic, seq, payload, err := kvevents.ParseMessage(m.Frames)
			if err != nil {
				t.Errorf("message %q: %v", m.Frames, err)
				continue
			}
			b, err := kvevents.DecodeBatch(payload)
			if err != nil {
				t.Errorf("batch %d: %v", seq, err)
				continue
			}
			s.msgs <- kvMsg{topic: string(topic), seq: seq, payload: payload, batch: b}
		}
	}()
	t.Cleanup(func() {
		_ = s.sock.Close()
		<-s.done
	})
	return s
}

// next returns the next message, failing the test after kvWait.
func (s *kvSub) next() kvMsg {
	s.t.Helper()
	select {
	case m := <-s.msgs:
		return m
	case <-time.After(kvWait):
		s.t.Fatalf("no KV events message within %v", kvWait)
		return kvMsg{}
	}
}

// sync waits until the subscription is live (the slow joiner: a SUB misses what is
// published before its subscription reaches the PUB socket). It resets the prefix cache,
// whose AllBlocksCleared batch is a harmless probe, until a batch arrives, then drains the
// messages up to the last batch published, so the next message is the next batch.
func (s *kvSub) sync(e *Engine, srv *httptest.Server) {
	s.t.Helper()
	deadline := time.Now().Add(kvWait)
	for {
		mustSend(s.t, srv, "POST", "/reset_prefix_cache", "", nil)
		select {
		case m := <-s.msgs:
			for last := uint64(e.KVEventsStats().Batches - 1); m.seq != last; {
				m = s.next()
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("subscription not live within %v", kvWait)
		}
	}
}

// chat sends one chat request with prompt as the user message and returns its
// usage.prompt_tokens.
func chat(t *testing.T, srv *httptest.Server, model, prompt string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	resp := mustSend(t, srv, "POST", "/v1/chat/completions", string(body), nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	return decode[struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}](t, b).Usage.PromptTokens
}

// tokenize returns the ids and count /tokenize gives for body.
func tokenize(t *testing.T, srv *httptest.Server, body string) ([]uint32, int) {
	t.Helper()
	resp := mustSend(t, srv, "POST", "/tokenize", body, nil)
	b, _ := io.ReadAll(resp.Body)
	v := decode[struct {
		Count  int      `json:"count"`
		Tokens []uint32 `json:"tokens"`
	}](t, b)
	return v.Tokens, v.Count
}

// words returns n distinct words starting with prefix.
func kvWords(prefix string, n int) []string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return w
}

// nilExtraKeys is the msgpack of n nil extra_keys entries.
func nilExtraKeys(n int) []byte { return extraKeys(n, "") }

func TestKVEventsStoredChain(t *testing.T) {
	cfg := kvConfig()
	cfg.LoRAs = []LoRA{{Name: "sql", Path: "/loras/sql"}}
	e, srv := startKVEngine(t, cfg)
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)

	shared := kvWords("s", 8)
	a := strings.Join(append(slices.Clone(shared), kvWords("a", 5)...), " ") // 13 words: 3 blocks
	b := strings.Join(append(slices.Clone(shared), kvWords("b", 8)...), " ") // 16 words: 4 blocks
	idsA, _ := tokenize(t, srv, fmt.Sprintf(`{"prompt":%q}`, a))
	idsB, _ := tokenize(t, srv, fmt.Sprintf(`{"prompt":%q}`, b))

	chat(t, srv, "m1", a)
	m1 := sub.next()
	chat(t, srv, "m1", b)
	m2 := sub.next()
	if m2.seq != m1.seq+1 {
		t.Errorf("seqs %d then %d, want consecutive", m1.seq, m2.seq)
	}
	if len(m1.batch.Events) != 1 || len(m2.batch.Events) != 1 {
		t.Fatalf("batches of %d and %d events, want 1 each", len(m1.batch.Events), len(m2.batch.Events))
	}
	if m1.batch.DPRank != 0 || m1.topic != "" {
		t.Errorf("rank %d topic %q, want 0 and \"\"", m1.batch.DPRank, m1.topic)
	}
	if now := float64(time.Now().UnixNano()) / 1e9; m1.batch.TS < now-60 || m1.batch.TS > now {
		t.Errorf("ts %v, want about %v", m1.batch.TS, now)
	}
	first, second := m1.batch.Events[0], m2.batch.Events[0]
	want := kvevents.Event{
		Kind: kvevents.BlockStored, BlockHashes: first.BlockHashes, TokenIDs: idsA[:12], BlockSize: 4,
		LoRAID: -1, Medium: "GPU", ExtraKeys: nilExtraKeys(3), GroupIdx: 0, SpecKind: "full_attention", SlidingWindow: -1,
	}
	if !reflect.DeepEqual(first, want) {
		t.Errorf("first request's event\n got %+v\nwant %+v", first, want)
	}
	if len(first.BlockHashes) != 3 {
		t.Fatalf("first request stored %d blocks, want 3", len(first.BlockHashes))
	}
	// The second prompt shares two blocks: only its last two are stored, chained on the
	// last shared block.
	want = kvevents.Event{
		Kind: kvevents.BlockStored, BlockHashes: second.BlockHashes, ParentBlockHash: first.BlockHashes[1], HasParent: true,
		TokenIDs: idsB[8:16], BlockSize: 4, LoRAID: -1, Medium: "GPU", ExtraKeys: nilExtraKeys(2), GroupIdx: 0,
		SpecKind: "full_attention", SlidingWindow: -1,
	}
	if !reflect.DeepEqual(second, want) {
		t.Errorf("second request's event\n got %+v\nwant %+v", second, want)
	}
	if len(second.BlockHashes) != 2 || slices.Contains(first.BlockHashes, second.BlockHashes[0]) {
		t.Errorf("second request's hashes %v, want 2 new ones (first request's %v)", second.BlockHashes, first.BlockHashes)
	}

	// The same prompt again stores nothing; under a LoRA adapter its blocks are the
	// adapter's own.
	chat(t, srv, "m1", a)
	chat(t, srv, "sql", a)
	m3 := sub.next()
	if m3.seq != m2.seq+1 || len(m3.batch.Events) != 1 {
		t.Fatalf("after a cache hit: seq %d with %d events, want seq %d, 1 event", m3.seq, len(m3.batch.Events), m2.seq+1)
	}
	lora := m3.batch.Events[0]
	if lora.LoRAName != "sql" || lora.HasParent || len(lora.BlockHashes) != 3 || !slices.Equal(lora.TokenIDs, idsA[:12]) ||
		!bytes.Equal(lora.ExtraKeys, extraKeys(3, "sql")) || lora.BlockHashes[0] == first.BlockHashes[0] {
		t.Errorf("adapter's event %+v, want 3 blocks of its own with lora_name sql", lora)
	}
}

func TestKVEventsEviction(t *testing.T) {
	cfg := kvConfig()
	cfg.BlockSize = 2
	cfg.KVCacheBlocks = 3
	e, srv := startKVEngine(t, cfg)
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)

	chat(t, srv, "m1", "a b c d")
	ab := sub.next().batch.Events[0].BlockHashes // ab, abcd
	chat(t, srv, "m1", "e f g h")                // needs 2 blocks, 1 free: evicts abcd
	m := sub.next()
	if len(m.batch.Events) != 2 {
		t.Fatalf("batch of %d events, want BlockRemoved then BlockStored", len(m.batch.Events))
	}
	removed := kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []kvevents.Hash{ab[1]}, Medium: "GPU", GroupIdx: 0,
		LoRAID: -1, SlidingWindow: -1}
	if !reflect.DeepEqual(m.batch.Events[0], removed) {
		t.Errorf("first event %+v, want %+v", m.batch.Events[0], removed)
	}
	if st := m.batch.Events[1]; st.Kind != kvevents.BlockStored || len(st.BlockHashes) != 2 || st.HasParent {
		t.Errorf("second event %+v, want BlockStored of 2 blocks", st)
	}
	// Three new blocks: one BlockRemoved per evicted block, least recently used first.
	chat(t, srv, "m1", "x y z w u v")
	m = sub.next()
	if kinds := eventKinds(m.batch); !slices.Equal(kinds, []kvevents.Kind{kvevents.BlockRemoved, kvevents.BlockRemoved, kvevents.BlockRemoved, kvevents.BlockStored}) {
		t.Fatalf("events %v, want 3 BlockRemoved then BlockStored", kinds)
	}
	ef := m.batch.Events[1:3]
	if got := m.batch.Events[0].BlockHashes; len(got) != 1 || got[0] != ab[0] {
		t.Errorf("first evicted %v, want the least recently used block %v", got, ab[0])
	}
	// A prompt's tail block goes before its head.
	if ef[0].BlockHashes[0] == ef[1].BlockHashes[0] {
		t.Errorf("evicted %v twice", ef[0].BlockHashes)
	}
}

func eventKinds(b kvevents.Batch) []kvevents.Kind {
	var k []kvevents.Kind
	for _, ev := range b.Events {
		k = append(k, ev.Kind)
	}
	return k
}

func TestKVEventsResetAndSleep(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	cleared := kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared, LoRAID: -1, GroupIdx: -1, SlidingWindow: -1}}}
	for _, path := range []string{"/reset_prefix_cache", "/sleep?level=1"} {
		mustSend(t, srv, "POST", path, "", nil)
		m := sub.next()
		if !reflect.DeepEqual(m.batch.Events, cleared.Events) {
			t.Errorf("%s: events %+v, want AllBlocksCleared", path, m.batch.Events)
		}
	}
	mustSend(t, srv, "POST", "/wake_up", "", nil)
}

// kvScript runs the same requests on an engine and returns its batches' events in order.
func kvScript(t *testing.T, cfg Config) ([][]kvevents.Event, [][]byte) {
	t.Helper()
	e, srv := startKVEngine(t, cfg)
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	var (
		events   [][]kvevents.Event
		payloads [][]byte
	)
	for _, p := range []string{"a b c d e f g h i", "a b c d x y z w", "q r s t u v w x y z", "a b c d e f g h i"} {
		chat(t, srv, "m1", p)
		if p == "q r s t u v w x y z" {
			mustSend(t, srv, "POST", "/reset_prefix_cache", "", nil)
		}
	}
	for range 5 {
		m := sub.next()
		events = append(events, m.batch.Events)
		payloads = append(payloads, m.payload)
	}
	return events, payloads
}

func TestKVEventsEncodings(t *testing.T) {
	cfg := kvConfig()
	cfg.KVCacheBlocks = 4
	cfg.KVEventsEncoding = KVEventsEncodingMap
	mapEvents, mapPayloads := kvScript(t, cfg)
	cfg.KVEventsEncoding = KVEventsEncodingArray
	arrEvents, arrPayloads := kvScript(t, cfg)
	if !reflect.DeepEqual(mapEvents, arrEvents) {
		t.Errorf("map encoding decodes to\n%+v\narray encoding to\n%+v", mapEvents, arrEvents)
	}
	if !bytes.Contains(mapPayloads[0], []byte("block_hashes")) || bytes.Contains(arrPayloads[0], []byte("block_hashes")) {
		t.Errorf("map payload %q, array payload %q: want field names in the map one only", mapPayloads[0], arrPayloads[0])
	}
	var kinds [][]kvevents.Kind
	for _, evs := range mapEvents {
		kinds = append(kinds, eventKinds(kvevents.Batch{Events: evs}))
	}
	stored, removed, cleared := kvevents.BlockStored, kvevents.BlockRemoved, kvevents.AllBlocksCleared
	want := [][]kvevents.Kind{{stored}, {stored}, {removed, stored}, {cleared}, {stored}}
	if !reflect.DeepEqual(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
}

// replayClient asks a replay socket for the batches from start, as a DEALER (sending the
// empty delimiter itself) or a REQ client, and returns the replies' seqs and payloads up
// to the end marker.
func replay(t *testing.T, addr string, req bool, start uint64) ([]uint64, [][]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kvWait)
	defer cancel()
	var s zmq4.Socket
	if req {
		s = zmq4.NewReq(ctx)
	} else {
		s = zmq4.NewDealer(ctx)
	}
	defer s.Close()
	if err := s.Dial(addr); err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	frames := [][]byte{kvevents.ReplayRequest(start)}
	if !req {
		frames = append([][]byte{{}}, frames...)
	}
	if err := s.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		t.Fatalf("replay request: %v", err)
	}
	type reply struct {
		msg zmq4.Msg
		err error
	}
	var (
		seqs     []uint64
		payloads [][]byte
	)
	for {
		c := make(chan reply, 1)
		go func() { m, err := s.Recv(); c <- reply{m, err} }()
		var r reply
		select {
		case r = <-c:
		case <-time.After(kvWait):
			_ = s.Close()
			<-c
			t.Fatalf("no replay reply within %v", kvWait)
		}
		if r.err != nil {
			t.Fatalf("replay reply: %v", r.err)
		}
		f := r.msg.Frames
		if !req {
			if len(f) == 0 || len(f[0]) != 0 {
				t.Fatalf("DEALER reply %q, want the empty delimiter first", f)
			}
			f = f[1:]
		}
		seq, payload, end, err := kvevents.ParseReplayReply(f)
		if err != nil {
			t.Fatalf("replay reply %q: %v", f, err)
		}
		if end {
			return seqs, payloads
		}
		seqs = append(seqs, seq)
		payloads = append(payloads, slices.Clone(payload))
	}
}

// seqRange returns from, from+1, ..., to.
func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestKVEventsReplay(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	var sent []kvMsg
	for i := range 4 {
		chat(t, srv, "m1", strings.Join(kvWords(fmt.Sprint("p", i), 4), " "))
		sent = append(sent, sub.next())
	}
	for _, req := range []bool{false, true} {
		seqs, payloads := replay(t, e.KVReplayAddr(), req, sent[1].seq)
		if want := seqRange(sent[1].seq, sent[3].seq); !slices.Equal(seqs, want) {
			t.Fatalf("req %v: replayed seqs %v, want %v", req, seqs, want)
		}
		for i, p := range payloads {
			if !bytes.Equal(p, sent[i+1].payload) {
				t.Errorf("req %v: replayed payload of seq %d differs from the published one", req, seqs[i])
			}
		}
		if seqs, _ := replay(t, e.KVReplayAddr(), req, sent[3].seq+1); len(seqs) != 0 {
			t.Errorf("req %v: replay past the end gave %v, want only the end marker", req, seqs)
		}
	}
}

func TestKVEventsReplayBufferBounded(t *testing.T) {
	cfg := kvConfig()
	cfg.KVEventsBuffer = 2
	e, srv := startKVEngine(t, cfg)
	for i := range 5 {
		chat(t, srv, "m1", strings.Join(kvWords(fmt.Sprint("p", i), 4), " "))
	}
	testutil.Eventually(t, kvWait, func() bool { return e.KVEventsStats().Sent == 5 }, "5 batches sent")
	if seqs, _ := replay(t, e.KVReplayAddr(), false, 0); !slices.Equal(seqs, []uint64{3, 4}) {
		t.Errorf("replayed %v, want the last 2 batches [3 4]", seqs)
	}
}

func TestKVEventsDropRange(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	next := uint64(e.KVEventsStats().Batches)
	resp := mustSend(t, srv, "POST", "/admin/kv-events/drop", fmt.Sprintf("%d-%d", next, next+1), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("drop: %d", resp.StatusCode)
	}
	for i := range 3 {
		chat(t, srv, "m1", strings.Join(kvWords(fmt.Sprint("p", i), 4), " "))
	}
	if m := sub.next(); m.seq != next+2 {
		t.Errorf("first seq after the drop = %d, want %d (a gap of 2)", m.seq, next+2)
	}
	if st := e.KVEventsStats(); st.Withheld != 2 {
		t.Errorf("withheld %d batches, want 2", st.Withheld)
	}
	if seqs, _ := replay(t, e.KVReplayAddr(), false, next); !slices.Equal(seqs, seqRange(next, next+2)) {
		t.Errorf("replayed %v, want %v: dropped batches stay in the buffer", seqs, seqRange(next, next+2))
	}
	// Removed: the next batch is sent.
	mustSend(t, srv, "POST", "/admin/kv-events/drop", "", nil)
	chat(t, srv, "m1", "x y z w")
	if m := sub.next(); m.seq != next+3 {
		t.Errorf("seq %d after removing the drop, want %d", m.seq, next+3)
	}
}

func TestKVEventsStopResume(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	next := uint64(e.KVEventsStats().Batches)
	mustSend(t, srv, "POST", "/admin/kv-events/stop", "", nil)
	for i := range 2 {
		chat(t, srv, "m1", strings.Join(kvWords(fmt.Sprint("p", i), 4), " "))
	}
	testutil.Eventually(t, kvWait, func() bool { return e.KVEventsStats().Withheld == 2 }, "2 batches withheld")
	mustSend(t, srv, "POST", "/admin/kv-events/resume", "", nil)
	chat(t, srv, "m1", "x y z w")
	if m := sub.next(); m.seq != next+2 {
		t.Errorf("first seq after the resume = %d, want %d: nothing sent while stopped", m.seq, next+2)
	}
	if seqs, _ := replay(t, e.KVReplayAddr(), false, next); !slices.Equal(seqs, seqRange(next, next+2)) {
		t.Errorf("replayed %v, want %v", seqs, seqRange(next, next+2))
	}
}

func TestKVEventsRestart(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	chat(t, srv, "m1", "a b c d e f g h")
	before := sub.next()
	if before.seq == 0 {
		t.Fatalf("seq %d before the restart, want > 0", before.seq)
	}
	mustSend(t, srv, "POST", "/admin/kv-events/restart", "", nil)
	if seqs, _ := replay(t, e.KVReplayAddr(), false, 0); len(seqs) != 0 {
		t.Errorf("replay after the restart gave %v, want an empty buffer", seqs)
	}
	// The cache was emptied without AllBlocksCleared: the same prompt is stored whole again
	// under the same hashes, as seq 0.
	chat(t, srv, "m1", "a b c d e f g h")
	m := sub.next()
	if m.seq != 0 || len(m.batch.Events) != 1 || !reflect.DeepEqual(m.batch.Events[0], before.batch.Events[0]) {
		t.Errorf("after the restart: seq %d events %+v, want seq 0 with %+v", m.seq, m.batch.Events, before.batch.Events[0])
	}
	if seqs, _ := replay(t, e.KVReplayAddr(), false, 0); !slices.Equal(seqs, []uint64{0}) {
		t.Errorf("replay gave %v, want [0]", seqs)
	}
}

func TestKVEventsTopic(t *testing.T) {
	cfg := kvConfig()
	cfg.KVEventsTopic = "kv@10.0.0.1@m1"
	e, srv := startKVEngine(t, cfg)
	sub := subscribe(t, e.KVEventsAddr(), "kv@")
	sub.sync(e, srv)
	chat(t, srv, "m1", "a b c d")
	if m := sub.next(); m.topic != cfg.KVEventsTopic {
		t.Errorf("topic %q, want %q", m.topic, cfg.KVEventsTopic)
	}
}

func TestKVEventsNeverBlockRequests(t *testing.T) {
	cfg := kvConfig()
	cfg.KVEventsQueue = 1
	e, srv := startKVEngine(t, cfg)
	// Nobody subscribes: batches are published to no one.
	chat(t, srv, "m1", "a b c d")
	testutil.Eventually(t, kvWait, func() bool { return e.KVEventsStats().Sent == 1 }, "first batch sent")

	// The publisher goroutine is held: the queue (1 batch) fills, and requests go on.
	hold := make(chan struct{})
	e.kvPub.mu.Lock()
	e.kvPub.hold = hold
	e.kvPub.mu.Unlock()
	for i := range 5 {
		chat(t, srv, "m1", strings.Join(kvWords(fmt.Sprint("p", i), 4), " "))
	}
	st := e.KVEventsStats()
	// One batch may be held by the goroutine, one waits in the queue, the rest dropped.
	if st.Batches != 6 || st.QueueDrops < 3 || st.QueueDrops > 4 {
		t.Errorf("stats %+v, want 6 batches, 3 or 4 of them dropped", st)
	}
	e.kvPub.mu.Lock()
	e.kvPub.hold = nil
	e.kvPub.mu.Unlock()
	close(hold)
	testutil.Eventually(t, kvWait, func() bool {
		st := e.KVEventsStats()
		return st.Sent+st.QueueDrops == 6
	}, "queued batches sent")
}

func TestKVEventsCloseWhileHeld(t *testing.T) {
	e, err := New(kvConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()
	e.kvPub.mu.Lock()
	e.kvPub.hold = make(chan struct{}) // never released: Close must still stop the goroutine
	e.kvPub.mu.Unlock()
	chat(t, srv, "m1", "a b c d")
	testutil.Eventually(t, kvWait, func() bool { return len(e.kvPub.queue) == 0 }, "batch taken by the goroutine")
	if err := e.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Requests go on after Close, publishing nothing.
	chat(t, srv, "m1", "e f g h")
	if got := e.KVEventsStats().Sent; got != 0 {
		t.Errorf("sent %d batches, want 0", got)
	}
}

func TestKVEventsTokenizeAgrees(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	messages := `[{"role":"system","content":"you are terse"},{"role":"user","content":[{"type":"text","text":"tok3 say 42 words\nhere"},{"type":"text","text":"and there"}]}]`
	tests := []struct {
		name, tokenize, request, path string
	}{
		{"chat", `{"model":"m1","messages":` + messages + `}`,
			`{"model":"m1","max_tokens":1,"messages":` + messages + `}`, "/v1/chat/completions"},
		{"completions", `{"model":"m1","prompt":"the  quick brown fox 7 jumps over\tthe lazy dog"}`,
			`{"model":"m1","max_tokens":1,"prompt":"the  quick brown fox 7 jumps over\tthe lazy dog"}`, "/v1/completions"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mustSend(t, srv, "POST", "/reset_prefix_cache", "", nil)
			sub.next()
			ids, count := tokenize(t, srv, tc.tokenize)
			resp := mustSend(t, srv, "POST", tc.path, tc.request, nil)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %s", tc.path, resp.StatusCode, b)
			}
			usage := decode[struct {
				Usage struct {
					PromptTokens int `json:"prompt_tokens"`
				} `json:"usage"`
			}](t, b).Usage
			if count != usage.PromptTokens || count != len(ids) {
				t.Errorf("tokenize count %d (%d ids), usage.prompt_tokens %d: want equal", count, len(ids), usage.PromptTokens)
			}
			full := len(ids) / 4 * 4
			m := sub.next()
			if len(m.batch.Events) != 1 || !slices.Equal(m.batch.Events[0].TokenIDs, ids[:full]) {
				t.Errorf("stored token ids %v, want /tokenize's full blocks %v", m.batch.Events, ids[:full])
			}
		})
	}
}

func TestKVEventsAdminOff(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	for _, path := range []string{"/admin/kv-events/drop", "/admin/kv-events/stop", "/admin/kv-events/resume", "/admin/kv-events/restart"} {
		if resp := mustSend(t, srv, "POST", path, "", nil); resp.StatusCode != http.StatusConflict {
			t.Errorf("%s with KV events off: %d, want 409", path, resp.StatusCode)
		}
	}
	if e.KVEventsAddr() != "" || e.KVReplayAddr() != "" || e.Close() != nil || e.KVEventsStats() != (KVEventsStats{}) {
		t.Error("an engine without KV events has addresses, counters or a Close error")
	}
	if err := e.SetKVEventsDrop("1"); !errors.Is(err, ErrKVEventsOff) {
		t.Errorf("SetKVEventsDrop = %v, want ErrKVEventsOff", err)
	}
}

func TestKVEventsAdminBadDrop(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	if err := e.SetKVEventsDrop("3-7"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"x", "5-2", "-3", "1-", "1-2-3"} {
		if resp := mustSend(t, srv, "POST", "/admin/kv-events/drop", bad, nil); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("drop %q: %d, want 400", bad, resp.StatusCode)
		}
	}
	if r := e.kvPub.drop; r != (kvDropRange{from: 3, to: 7, set: true}) {
		t.Errorf("drop range %+v after bad specs, want 3-7 unchanged", r)
	}
	if mustSend(t, srv, "GET", "/admin/kv-events/stop", "", nil).StatusCode != http.StatusMethodNotAllowed {
		t.Error("GET /admin/kv-events/stop: want 405")
	}
}

func TestKVEventsConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"off", Config{}, true},
		{"all", Config{KVEvents: "tcp://*:5557", KVEventsReplay: "tcp://127.0.0.1:0", KVEventsEncoding: "array", KVEventsTopic: "t",
			KVEventsBuffer: 5, KVEventsQueue: 5, KVEventsDrop: "4"}, true},
		{"ipc", Config{KVEvents: "ipc:///tmp/kv.sock"}, true},
		{"no scheme", Config{KVEvents: "127.0.0.1:5557"}, false},
		{"no port", Config{KVEvents: "tcp://127.0.0.1"}, false},
		{"bad port", Config{KVEvents: "tcp://127.0.0.1:99999"}, false},
		{"inproc", Config{KVEvents: "inproc://kv"}, false},
		{"replay alone", Config{KVEventsReplay: "tcp://127.0.0.1:0"}, false},
		{"encoding", Config{KVEvents: "tcp://127.0.0.1:0", KVEventsEncoding: "json"}, false},
		{"buffer", Config{KVEventsBuffer: -1}, false},
		{"queue", Config{KVEventsQueue: -1}, false},
		{"drop", Config{KVEventsDrop: "2-1"}, false},
		{"huge queue", Config{KVEventsQueue: 1<<20 + 1}, false},
	}
	for _, tc := range tests {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	if err := (Config{KVEventsDrop: "x"}).Validate(); !errors.Is(err, ErrBadKVEventsDrop) {
		t.Errorf("bad drop: %v, want ErrBadKVEventsDrop", err)
	}
	// An ipc endpoint binds a Unix socket; its address is the endpoint.
	ipc := Config{KVEvents: "ipc://" + t.TempDir() + "/kv.sock"}
	ie, err := New(ipc)
	if err != nil {
		t.Fatalf("New(%s): %v", ipc.KVEvents, err)
	}
	if got := ie.KVEventsAddr(); got != ipc.KVEvents {
		t.Errorf("KVEventsAddr() = %q, want %q", got, ipc.KVEvents)
	}
	if err := ie.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// A port in use fails New.
	e, _ := startKVEngine(t, kvConfig())
	if _, err := New(Config{KVEvents: e.KVEventsAddr()}); err == nil {
		t.Errorf("New on a bound endpoint %s: nil error", e.KVEventsAddr())
	}
}

func TestKVEventsConcurrentSafe(t *testing.T) {
	cfg := kvConfig()
	cfg.KVCacheBlocks = 8
	e, srv := startKVEngine(t, cfg)
	sub := subscribe(t, e.KVEventsAddr(), "")
	sub.sync(e, srv)
	start := uint64(e.KVEventsStats().Batches)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 5 {
				body := fmt.Sprintf(`{"model":"m1","max_tokens":1,"prompt":%q}`, strings.Join(kvWords(fmt.Sprint("c", (i+j)%6), 8), " "))
				path := "/v1/completions"
				if j == 2 && i == 0 {
					body, path = "", "/reset_prefix_cache"
				}
				resp, err := send(t, nil, srv, "POST", path, body, nil)
				if err != nil {
					t.Errorf("%s: %v", path, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	// Every batch arrives once, in seq order, and replaying the stream of events keeps the
	// cache's bound.
	n := uint64(e.KVEventsStats().Batches) - start
	cached := map[kvevents.Hash]bool{}
	for i := range n {
		m := sub.next()
		if m.seq != start+i {
			t.Fatalf("seq %d, want %d", m.seq, start+i)
		}
		for _, ev := range m.batch.Events {
			switch ev.Kind {
			case kvevents.BlockStored:
				if ev.HasParent && !cached[ev.ParentBlockHash] {
					t.Errorf("seq %d: parent %x not cached", m.seq, ev.ParentBlockHash)
				}
				for _, h := range ev.BlockHashes {
					cached[h] = true
				}
			case kvevents.BlockRemoved:
				for _, h := range ev.BlockHashes {
					if !cached[h] {
						t.Errorf("seq %d: removed %x not cached", m.seq, h)
					}
					delete(cached, h)
				}
			case kvevents.AllBlocksCleared:
				clear(cached)
			}
		}
		if len(cached) > cfg.KVCacheBlocks {
			t.Fatalf("seq %d: %d blocks cached, over %d", m.seq, len(cached), cfg.KVCacheBlocks)
		}
	}
	e.cache.mu.Lock()
	got := len(e.cache.index)
	e.cache.mu.Unlock()
	if got != len(cached) {
		t.Errorf("the events leave %d blocks cached, the cache has %d", len(cached), got)
	}
}

func TestKVEventsExtraKeys(t *testing.T) {
	// msgpack: an array of 2 nils; an array of 2 one-string arrays ["sql"].
	if got, want := extraKeys(2, ""), []byte{0x92, 0xc0, 0xc0}; !bytes.Equal(got, want) {
		t.Errorf("extraKeys(2, \"\") = % x, want % x", got, want)
	}
	one := []byte{0x91, 0xa3, 's', 'q', 'l'}
	if got, want := extraKeys(2, "sql"), append(append([]byte{0x92}, one...), one...); !bytes.Equal(got, want) {
		t.Errorf("extraKeys(2, \"sql\") = % x, want % x", got, want)
	}
}

func TestKVEventsBeUint(t *testing.T) {
	tests := []struct {
		b    []byte
		want uint64
	}{
		{nil, 0},
		{[]byte{5}, 5},
		{kvevents.ReplayRequest(300), 300},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 1},
		{[]byte{1, 0, 0, 0, 0, 0, 0, 0, 0}, ^uint64(0)},
	}
	for _, tc := range tests {
		if got := beUint(tc.b); got != tc.want {
			t.Errorf("beUint(% x) = %d, want %d", tc.b, got, tc.want)
		}
	}
}

func TestKVEventsReplayIgnoresInvalidRequests(t *testing.T) {
	e, srv := startKVEngine(t, kvConfig())
	chat(t, srv, "m1", "a b c d")
	testutil.Eventually(t, kvWait, func() bool { return e.KVEventsStats().Sent == 1 }, "batch sent")
	ctx, cancel := context.WithTimeout(context.Background(), kvWait)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(e.KVReplayAddr()); err != nil {
		t.Fatal(err)
	}
	// [start] without the delimiter (2 frames at the ROUTER) and 3 frames after it are
	// ignored, as vLLM does; the valid request after them is the only one answered.
	for _, frames := range [][][]byte{
		{kvevents.ReplayRequest(0)},
		{{}, kvevents.ReplayRequest(0), []byte("x")},
		{{}, kvevents.ReplayRequest(0)},
	} {
		if err := d.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	var seqs []uint64
	for {
		m, err := d.Recv()
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		seq, _, end, err := kvevents.ParseReplayReply(m.Frames[1:])
		if err != nil || len(m.Frames[0]) != 0 {
			t.Fatalf("reply %q: %v", m.Frames, err)
		}
		if end {
			break
		}
		seqs = append(seqs, seq)
	}
	if !slices.Equal(seqs, []uint64{0}) {
		t.Errorf("replayed %v, want [0] once", seqs)
	}
}
