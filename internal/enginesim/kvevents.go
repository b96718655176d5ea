package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchboard-gw/switchboard/internal/kvevents"
)

// The values of Config.KVEventsEncoding.
const (
	// KVEventsEncodingMap writes each event as a map {"type": "BlockStored", ...}, as vLLM
	// publishes since PR #42892 (vLLM 0.26.0).
	KVEventsEncodingMap = "map"
	// KVEventsEncodingArray writes each event as a positional array ["BlockStored", ...]
	// with trailing nil fields omitted, as vLLM published before PR #42892.
	KVEventsEncodingArray = "array"
)

// Defaults of the KV-events publisher.
const (
	// DefaultKVEventsBuffer is the number of published batches kept for replay: vLLM's
	// KVEventsConfig buffer_steps (vllm/config/kv_events.py).
	DefaultKVEventsBuffer = 10000
	// DefaultKVEventsQueue is the number of batches that may wait for the publisher
	// goroutine. vLLM's max_queue_size is 100000 and its queue blocks the scheduler when
	// full; the simulator's drops instead (see Config.KVEventsQueue).
	DefaultKVEventsQueue = 4096
)

// maxKVEventsQueue bounds Config.KVEventsQueue: the queue is allocated whole (about 100
// bytes a batch).
const maxKVEventsQueue = 1 << 20

// kvEventsHWM is the PUB socket's high-water mark, in messages: beyond it a message for
// a slow subscriber is dropped, as vLLM's hwm (100000 by default) drops them. It bounds
// the socket's own queue, which zmq4 leaves unbounded otherwise.
const kvEventsHWM = 10000

// Field values of the events, as vLLM's block pool sets them.
const (
	kvMediumGPU         = "GPU"            // vllm/distributed/kv_events.py MEDIUM_GPU
	kvSpecFullAttention = "full_attention" // KVCacheSpecKind.FULL_ATTENTION
)

// ErrKVEventsOff is returned by the KV-events fault methods of an engine whose
// Config.KVEvents is empty.
var ErrKVEventsOff = errors.New("enginesim: kv events are off")

// ErrBadKVEventsDrop is wrapped by the error for a malformed KV-events drop range (see
// Config.KVEventsDrop).
var ErrBadKVEventsDrop = errors.New("enginesim: bad kv events drop range")

// kvItem is one batch waiting for the publisher goroutine, with the sequence number it
// was given and the epoch (restart count) it belongs to.
type kvItem struct {
	epoch, seq uint64
	batch      kvevents.Batch
}

// kvBuffered is one published batch kept for replay: its sequence number and payload.
type kvBuffered struct {
	seq     uint64
	payload []byte
}

// kvPublisher publishes the prefix cache's event batches as vLLM's ZmqEventPublisher
// does (vllm/distributed/kv_events.py): messages [topic, seq (8 bytes big-endian),
// payload] on a PUB socket, and a ROUTER socket that replays the buffered batches.
//
// The cache hands it batches through enqueue, which never blocks: a batch takes the next
// sequence number and joins a bounded queue, or is dropped (and counted) when the queue
// is full. One goroutine encodes the queued batches, keeps them in a ring of the last
// buffer ones and sends them; another answers replay requests. close stops both.
type kvPublisher struct {
	topic []byte
	enc   kvevents.Encoding
	pub   zmq4.Socket
	rep   zmq4.Socket // the replay ROUTER socket; nil when off

	queue  chan kvItem
	done   chan struct{} // closed by close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	mu       sync.Mutex
	epoch    uint64       // restarts so far; items of an older epoch are discarded
	seq      uint64       // the next batch's sequence number
	ring     []kvBuffered // the last ringCap batches, oldest at ring[head] once full
	ringCap  int
	head     int
	stopped  bool          // the stop fault: nothing is sent on PUB
	drop     kvDropRange   // the drop fault
	hold     chan struct{} // tests: the goroutine waits on it before each batch
	batches  atomic.Int64  // batches given a sequence number
	queueOut atomic.Int64  // batches dropped on a full queue
	withheld atomic.Int64  // batches not sent on PUB because of a fault
	sent     atomic.Int64  // batches handed to the PUB socket
}

// kvDropRange is an inclusive range of sequence numbers whose batches are not sent on
// PUB; set is false for none.
type kvDropRange struct {
	from, to uint64
	set      bool
}

// contains reports whether seq is in r.
func (r kvDropRange) contains(seq uint64) bool { return r.set && seq >= r.from && seq <= r.to }

// parseKVDrop parses a drop range "N" or "N-M" (N <= M, decimal); "" is no range.
func parseKVDrop(spec string) (kvDropRange, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return kvDropRange{}, nil
	}
	lo, hi, isRange := strings.Cut(spec, "-")
	if !isRange {
		hi = lo
	}
	from, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 64)
	to, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 64)
	if err1 != nil || err2 != nil || from > to {
		return kvDropRange{}, fmt.Errorf("%w %q: want N or N-M with N <= M", ErrBadKVEventsDrop, spec)
	}
	return kvDropRange{from: from, to: to, set: true}, nil
}

// newKVPublisher binds the sockets of cfg (defaults applied) and starts the goroutines.
func newKVPublisher(cfg *Config) (*kvPublisher, error) {
	drop, err := parseKVDrop(cfg.KVEventsDrop)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &kvPublisher{
		topic:  []byte(cfg.KVEventsTopic),
		enc:    kvevents.EncodingMap,
		queue:  make(chan kvItem, cfg.KVEventsQueue),
		done:   make(chan struct{}),
		cancel: cancel,
		ring:   make([]kvBuffered, 0, min(cfg.KVEventsBuffer, 1024)),
		drop:   drop,
	}
	if cfg.KVEventsEncoding == KVEventsEncodingArray {
		p.enc = kvevents.EncodingArray
	}
	p.ringCap = cfg.KVEventsBuffer
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, kvEventsHWM); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("enginesim: kv events hwm: %w", err)
	}
	if err := p.pub.Listen(cfg.KVEvents); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("enginesim: kv events endpoint: %w", err)
	}
	if cfg.KVEventsReplay != "" {
		p.rep = zmq4.NewRouter(ctx)
		if err := p.rep.Listen(cfg.KVEventsReplay); err != nil {
			cancel()
			_ = p.pub.Close()
			_ = p.rep.Close()
			return nil, fmt.Errorf("enginesim: kv events replay endpoint: %w", err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// kvAddr returns the endpoint socket s (bound to endpoint) listens on, with the port it
// got for a tcp port 0; "" for a nil s.
func kvAddr(s zmq4.Socket, endpoint string) string {
	if s == nil {
		return ""
	}
	a := s.Addr()
	if a == nil {
		return ""
	}
	scheme, _, _ := strings.Cut(endpoint, "://")
	if scheme == "tcp" {
		return "tcp://" + a.String()
	}
	return endpoint
}

// enqueue gives events a sequence number and hands them to the publisher goroutine as
// one batch (ts now, data_parallel_rank 0), or drops them when its queue is full. It
// never blocks. The caller holds the cache's lock, so batches are numbered in the
// cache's order; a dropped batch leaves a gap in the sequence, as a PUB hwm drop does.
func (p *kvPublisher) enqueue(events []kvevents.Event) {
	b := kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: events, DPRank: 0}
	p.mu.Lock()
	defer p.mu.Unlock()
	it := kvItem{epoch: p.epoch, seq: p.seq, batch: b}
	p.seq++
	p.batches.Add(1)
	select {
	case p.queue <- it:
	default:
		p.queueOut.Add(1)
	}
}

// restart starts the sequence over at 0 and empties the replay buffer; batches still
// queued from before are discarded.
func (p *kvPublisher) restart() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.epoch++
	p.seq = 0
	clear(p.ring)
	p.ring, p.head = p.ring[:0], 0
}

// run publishes the queued batches until close.
func (p *kvPublisher) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.done:
			return
		case it := <-p.queue:
			p.mu.Lock()
			hold := p.hold
			p.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-p.done:
					return
				}
			}
			p.publish(it)
		}
	}
}

// publish encodes one batch, keeps it for replay and sends it on PUB unless a fault
// withholds it.
func (p *kvPublisher) publish(it kvItem) {
	payload := kvevents.AppendBatch(nil, it.batch, p.enc)
	p.mu.Lock()
	if it.epoch != p.epoch {
		p.mu.Unlock()
		return // queued before a restart
	}
	p.remember(kvBuffered{seq: it.seq, payload: payload})
	send := !p.stopped && !p.drop.contains(it.seq)
	p.mu.Unlock()
	if !send {
		p.withheld.Add(1)
		return
	}
	msg := zmq4.NewMsgFrom(p.topic, kvevents.AppendSeq(make([]byte, 0, 8), it.seq), payload)
	if err := p.pub.SendMulti(msg); err != nil {
		slog.Debug("kv events: send failed", "seq", it.seq, "err", err)
		return
	}
	p.sent.Add(1)
}

// remember appends b to the replay ring, overwriting the oldest batch once full. The
// caller holds p.mu.
func (p *kvPublisher) remember(b kvBuffered) {
	if p.ringCap == 0 {
		return
	}
	if len(p.ring) < p.ringCap {
		p.ring = append(p.ring, b)
		return
	}
	p.ring[p.head] = b
	p.head = (p.head + 1) % p.ringCap
}

// buffered returns the buffered batches with seq >= start, oldest first.
func (p *kvPublisher) buffered(start uint64) []kvBuffered {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []kvBuffered
	for i := range p.ring {
		b := p.ring[(p.head+i)%len(p.ring)]
		if b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

// replayEnd is the sequence frame of the end marker of a replay: -1 as a signed 8-byte
// big-endian integer (vLLM's ZmqEventPublisher.END_SEQ).
var replayEnd = kvevents.AppendSeq(nil, kvevents.ReplayEndSeq)

// serveReplay answers replay requests until close, as vLLM's
// ZmqEventPublisher._service_replay does: a request is [identity, "", start] (a REQ
// client sends [start], a DEALER client ["", start]), start big-endian; the answer is
// [identity, "", seq, payload] for every buffered batch with seq >= start, oldest first,
// then [identity, "", -1 (8 bytes), ""]. Other requests are ignored, as vLLM does.
func (p *kvPublisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.rep.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			slog.Debug("kv events replay: receive failed", "err", err)
			continue
		}
		if len(msg.Frames) != 3 {
			slog.Debug("kv events replay: invalid request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		start := beUint(msg.Frames[2])
		for _, b := range p.buffered(start) {
			seq := kvevents.AppendSeq(make([]byte, 0, 8), b.seq)
			if err := p.rep.SendMulti(zmq4.NewMsgFrom(id, nil, seq, b.payload)); err != nil {
				break
			}
		}
		_ = p.rep.SendMulti(zmq4.NewMsgFrom(id, nil, replayEnd, nil))
	}
}

// beUint reads b as a big-endian unsigned integer, as Python's int.from_bytes(b, "big")
// does; a value over 64 bits saturates to the maximum (no batch has so large a seq).
func beUint(b []byte) uint64 {
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	if len(b) > 8 {
		return ^uint64(0)
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// close stops the goroutines and closes the sockets; batches still queued are dropped.
// Idempotent.
func (p *kvPublisher) close() error {
	var err error
	p.once.Do(func() {
		close(p.done)
		p.cancel()
		err = closeSocket(p.pub)
		if p.rep != nil {
			err = errors.Join(err, closeSocket(p.rep))
		}
		p.wg.Wait()
	})
	return err
}

// closeSocket closes s. A connection its peer had already closed is not an error: zmq4
// closes every connection it still lists, including those whose peer went away.
func closeSocket(s zmq4.Socket) error {
	if err := s.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// extraKeys returns the msgpack of a BlockStored's extra_keys for n blocks: one entry
// per block, the tuple (lora_name,) for an adapter's blocks, else nil, as vLLM's
// generate_block_hash_extra_keys gives for a prompt without multimodal inputs, cache salt
// or prompt embeddings (vllm/v1/core/kv_cache_utils.py).
func extraKeys(n int, loraName string) []byte {
	keys := make([]any, n)
	if loraName != "" {
		for i := range keys {
			keys[i] = []string{loraName}
		}
	}
	b, err := msgpack.Marshal(keys)
	if err != nil { // cannot happen for nils and strings
		return nil
	}
	return b
}
