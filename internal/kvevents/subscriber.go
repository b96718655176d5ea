package kvevents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

const (
	// defaultReplayTimeout bounds one replay exchange (dial, request and
	// every reply up to the end marker) when SubscriberConfig.ReplayTimeout
	// is 0.
	defaultReplayTimeout = 2 * time.Second

	// minBackoff and maxBackoff bound the pause before a redial: it starts
	// at minBackoff and doubles after each connection that delivered
	// nothing, up to maxBackoff.
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second

	// dialTimeout bounds the TCP connect of one dial of the PUB socket.
	dialTimeout = 5 * time.Second

	// liveQueue is how many received messages wait for the handler while
	// it is busy (a replay, a slow Batch). A message that finds the queue
	// full is dropped; its seq is then missing, which the gap logic
	// treats like any other loss (a replay, or Lost).
	liveQueue = 1024

	// liveQueueBytes bounds the frame bytes (topic, seq and payload) of the
	// messages waiting in the live queue, since its count alone would let
	// 1024 messages of up to MaxPayloadSize (64 MiB) each hold 64 GiB per
	// engine while a replay runs. vLLM publishes one batch per engine step
	// with that step's events, typically a few KB; a prompt of 100k tokens
	// makes a batch of a few hundred KB (one BlockStored with every token
	// id), so 64 MiB holds hundreds of steps of the largest batches seen.
	// A message that would take the queue over it is dropped like one that
	// finds the queue full. One message is always taken into an empty
	// queue, whatever its size, so a batch over the budget is not lost for
	// good: memory stays under the budget or one message.
	liveQueueBytes = 64 << 20

	// decodeLogEvery: the first decode error is logged, then one in this
	// many, so a publisher speaking another format does not flood the log.
	decodeLogEvery = 1000

	// drainAfterClose is how many times closeSocket calls Recv on a closed
	// zmq4 socket; see closeSocket.
	drainAfterClose = 64
)

// SubscriberConfig configures one engine's subscription: the engine binds
// its sockets (vLLM's --kv-events-config endpoint "tcp://*:5557" and
// replay_endpoint) and the subscriber dials them.
type SubscriberConfig struct {
	// Endpoint is the engine's PUB socket, "tcp://host:port" (vLLM's
	// default port is 5557; a data-parallel rank r publishes on the port
	// plus r). Required.
	Endpoint string
	// Replay is the engine's replay ROUTER socket, "tcp://host:port", or ""
	// when the engine has none (vLLM's replay_endpoint is unset by
	// default).
	Replay string
	// Topic is the subscription prefix; "" subscribes to every topic. vLLM
	// publishes its configured topic ("" by default) as the first frame of
	// every message.
	Topic string
	// ReplayTimeout bounds one replay exchange, from the dial to the end
	// marker; 0 means 2s.
	ReplayTimeout time.Duration
	// Logger receives connection, replay and loss records; nil discards
	// them.
	Logger *slog.Logger
}

// LostReason says why a [Handler] must drop what it knows of the engine.
type LostReason uint8

const (
	// LostGap: batches were missed (a seq gap) and the engine has no
	// replay socket, or the subscriber's own queue overflowed.
	LostGap LostReason = iota + 1
	// LostRestart: seq went back, so the publisher restarted (vLLM's seq
	// starts at 0 per process) and its cache started empty; or the first
	// batch after a redial did not follow the last seq handed over, so
	// the publisher may have restarted while the connection was down.
	LostRestart
	// LostReplayFailed: batches were missed and the replay that should
	// have filled the gap failed, timed out or did not cover it.
	LostReplayFailed
)

// String returns "gap", "restart" or "replay_failed", a low-cardinality
// value for a log field or a metric attribute.
func (r LostReason) String() string {
	switch r {
	case LostGap:
		return "gap"
	case LostRestart:
		return "restart"
	case LostReplayFailed:
		return "replay_failed"
	}
	return "LostReason(" + strconv.Itoa(int(r)) + ")"
}

// Handler receives one engine's batches. A [Subscriber] calls it from one
// goroutine, never concurrently, so an implementation that serves a single
// subscriber needs no locking of its own for the engine's state. Its
// methods should return quickly: while one runs, messages wait in a queue
// of 1024 messages and 64 MiB of frames, and the ones that find it full
// are dropped (a gap).
type Handler interface {
	// Batch hands over the batch published with seq. Batches arrive in
	// seq order with no hole since the previous Batch, except right
	// after a Lost (or for the first batch), where seq starts anew. b and
	// everything it points to are valid only during the call.
	Batch(seq uint64, b *Batch)
	// Lost says the engine's cache state is unknown: batches were missed
	// or the engine restarted. The handler drops what it knows of the
	// engine; the next Batch starts its state again.
	Lost(reason LostReason)
}

// SubscriberStats are a subscriber's cumulative counters, each read
// atomically (the set is not one snapshot).
type SubscriberStats struct {
	// Batches counts batches handed over (live and replayed); Stored,
	// Removed and Cleared count their events by kind.
	Batches, Stored, Removed, Cleared uint64
	// Unknown counts events skipped for an unknown type (Batch.Unknown);
	// Invalid those dropped by validation (Batch.Dropped).
	Unknown, Invalid uint64
	// DecodeErrors counts messages and payloads that did not parse, which
	// were not handed over: a live message that is not [topic, seq,
	// payload], a payload DecodeBatch refused, a malformed replay reply.
	DecodeErrors uint64
	// Gaps counts live batches whose seq skipped ahead of the last
	// handed over. Replays counts replay exchanges that filled what they
	// were asked for; ReplayedBatches the batches they handed over;
	// ReplayFailures replays that failed, timed out or left a hole.
	// Restarts counts Lost(LostRestart): seq going back, or the first
	// batch of a new connection not following the last one.
	Gaps, Replays, ReplayedBatches, ReplayFailures, Restarts uint64
	// PeerErrors counts connections (to Endpoint or Replay) dropped
	// because the peer broke the bounds of the ZMTP stream: a frame header
	// taking a message over MaxPayloadSize plus 64 KiB or over 64 frames,
	// a command frame over 64 KiB, or a malformed READY command. Such a
	// connection's frames are never allocated at their declared size.
	PeerErrors uint64
	// LastSeq is the seq of the last batch handed over, meaningful when
	// HaveSeq is true.
	LastSeq uint64
	HaveSeq bool
	// Connected reports a live connection to Endpoint, best effort: ZMQ
	// sees a closed TCP connection but not a silently dead one.
	Connected bool
}

// Subscriber follows one engine's KV-cache events: it subscribes to the
// engine's PUB socket, decodes each batch, checks seq continuity, fills
// gaps from the replay socket when there is one, and hands batches over to
// a [Handler] in seq order. Build it with [NewSubscriber] and start it with
// [Subscriber.Run]; Stats is safe for concurrent use.
type Subscriber struct {
	cfg           SubscriberConfig
	h             Handler
	log           *slog.Logger
	replayTimeout time.Duration
	topic         []byte
	queueBudget   int64 // liveQueueBudget when built
	running       atomic.Bool

	// queued is the frame bytes of the messages in Run's live queue: added
	// by the receiving goroutine before it queues one, taken off by Run's
	// goroutine when it takes one out.
	queued atomic.Int64

	// The seq state, touched only by Run's goroutine.
	have     bool   // a batch was handed over since the start or the last Lost
	last     uint64 // its seq
	redialed bool   // a new connection's first message came, and no batch of it was decoded yet

	batches, stored, removed, cleared    atomic.Uint64
	unknown, invalid, decodeErrors       atomic.Uint64
	gaps, replays, replayedBatches       atomic.Uint64
	replayFailures, restarts, queueDrops atomic.Uint64
	peerErrors                           atomic.Uint64
	lastSeq                              atomic.Uint64
	haveSeq, connected                   atomic.Bool
}

// liveQueueBudget is the byte bound of a new subscriber's live queue:
// liveQueueBytes, which tests lower.
var liveQueueBudget int64 = liveQueueBytes

// zmqLog silences zmq4's own logger (it logs only failed accepts of
// listening sockets, which a subscriber does not have).
var zmqLog = log.New(io.Discard, "", 0)

// errRunning is returned by a second concurrent Run.
var errRunning = errors.New("kvevents: subscriber already running")

// NewSubscriber checks cfg and returns a subscriber that hands h the
// batches of cfg.Endpoint once Run is called. It does no I/O. The error
// names the field at fault: Endpoint or Replay not "tcp://host:port" with a
// host to dial (not "*") and a port in 1-65535, a negative ReplayTimeout,
// or a nil h.
func NewSubscriber(cfg SubscriberConfig, h Handler) (*Subscriber, error) {
	var errs []error
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("kvevents: endpoint: %w", err))
	}
	if cfg.Replay != "" {
		if err := checkEndpoint(cfg.Replay); err != nil {
			errs = append(errs, fmt.Errorf("kvevents: replay endpoint: %w", err))
		}
	}
	if cfg.ReplayTimeout < 0 {
		errs = append(errs, fmt.Errorf("kvevents: negative replay timeout %v", cfg.ReplayTimeout))
	}
	if h == nil {
		errs = append(errs, errors.New("kvevents: nil handler"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg, h: h, log: cfg.Logger, replayTimeout: cfg.ReplayTimeout, topic: []byte(cfg.Topic), queueBudget: liveQueueBudget}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.replayTimeout == 0 {
		s.replayTimeout = defaultReplayTimeout
	}
	return s, nil
}

// checkEndpoint accepts "tcp://host:port" with a host to dial and a port
// in 1-65535.
func checkEndpoint(ep string) error {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return fmt.Errorf("%q: want tcp://host:port", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return fmt.Errorf("%q: %w", ep, err)
	}
	if host == "" || host == "*" {
		return fmt.Errorf("%q: no host to dial", ep)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("%q: port %q not in 1-65535", ep, port)
	}
	return nil
}

// Stats returns the subscriber's counters. It is safe for concurrent use,
// also while Run runs.
func (s *Subscriber) Stats() SubscriberStats {
	return SubscriberStats{
		Batches:         s.batches.Load(),
		Stored:          s.stored.Load(),
		Removed:         s.removed.Load(),
		Cleared:         s.cleared.Load(),
		Unknown:         s.unknown.Load(),
		Invalid:         s.invalid.Load(),
		DecodeErrors:    s.decodeErrors.Load(),
		Gaps:            s.gaps.Load(),
		Replays:         s.replays.Load(),
		ReplayedBatches: s.replayedBatches.Load(),
		ReplayFailures:  s.replayFailures.Load(),
		Restarts:        s.restarts.Load(),
		PeerErrors:      s.peerErrors.Load(),
		LastSeq:         s.lastSeq.Load(),
		HaveSeq:         s.haveSeq.Load(),
		Connected:       s.connected.Load(),
	}
}

// liveMsg is one message of the PUB socket, parsed but not decoded.
type liveMsg struct {
	seq     uint64
	payload []byte
	size    int64 // the message's frame bytes, counted in Subscriber.queued
	fresh   bool  // the first message queued from its connection
}

// Run subscribes and hands batches to the handler until ctx is done, then
// closes its sockets and returns nil once every goroutine it started has
// ended. It dials Endpoint, and when the connection fails or cannot be
// made it dials again after a pause that starts at 100ms and doubles up to
// 5s (reset by a connection that delivered a message). Decode errors,
// dial errors and replay failures are counted and logged, never returned.
//
// Run may be called again after it returned, continuing from the last seq
// it handed over (its first batch is then taken as the first after a
// redial); a call while another runs returns an error at once.
//
// Its connections, to Endpoint and to Replay, go through a transport that
// bounds what a peer can make zmq4 v0.17.0 do (see the package doc,
// Bounds): the ZMTP handshake must end within 10s of the TCP connect and
// ends at once when ctx is done, so a peer that accepts the connection and
// never answers does not hold Run; a frame header taking a message over
// MaxPayloadSize plus 64 KiB, or a malformed READY, drops the connection
// before zmq4 allocates or reads it, counted in PeerErrors, and Run
// redials. Such a connection does not reset the pause, whatever it
// delivered before.
func (s *Subscriber) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer s.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	live := make(chan liveMsg, liveQueue)
	s.queued.Store(0) // what a previous Run left queued is gone with its channel
	var wg sync.WaitGroup
	wg.Go(func() { s.receive(ctx, live) })
	defer wg.Wait() // runs after cancel
	defer cancel()

	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-live:
			s.queued.Add(-m.size)
			s.onLive(ctx, m)
		}
	}
}

// receive runs the connections to Endpoint one after the other until ctx
// is done, queueing their messages on live.
func (s *Subscriber) receive(ctx context.Context, live chan<- liveMsg) {
	backoff := minBackoff
	for {
		got, err := s.session(ctx, live)
		if ctx.Err() != nil {
			return
		}
		if got {
			backoff = minBackoff
		}
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.DebugContext(ctx, "kv events: connection ended", "endpoint", s.cfg.Endpoint, "error", err, "redial_in", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session dials Endpoint once and queues what it receives until the
// connection fails or ctx is done, marking the first message it queues
// fresh. received reports whether a message arrived on a connection that
// did not break the ZMTP bounds.
func (s *Subscriber) session(ctx context.Context, live chan<- liveMsg) (received bool, err error) {
	var broke atomic.Bool
	defer func() {
		if broke.Load() {
			received = false // no backoff reset for a hostile peer
		}
	}()
	// No automatic reconnect: zmq4 redials inside the closed connection's
	// callback with sleeps that ignore ctx and gives up after its retries.
	// A failed Recv ends the session and receive redials with backoff.
	sock := zmq4.NewSub(withPeerErrorHook(ctx, func(err error) {
		broke.Store(true)
		s.peerError(ctx, s.cfg.Endpoint, err)
	}),
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(dialTimeout),
		zmq4.WithAutomaticReconnect(false),
		zmq4.WithLogger(zmqLog))
	defer closeSocket(sock)
	if err := sock.SetOption(zmq4.OptionSubscribe, s.cfg.Topic); err != nil {
		return false, err
	}
	if err := dialBounded(sock, s.cfg.Endpoint); err != nil {
		return false, err
	}
	s.connected.Store(true)
	defer s.connected.Store(false)
	s.log.InfoContext(ctx, "kv events: subscribed", "endpoint", s.cfg.Endpoint, "topic", s.cfg.Topic)
	fresh := true // until a message of this connection is queued
	for {
		msg, err := sock.Recv()
		if err != nil {
			return received, err
		}
		received = true
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		topic, seq, payload, err := ParseMessage(msg.Frames)
		if err != nil {
			s.decodeError(ctx, err)
			continue
		}
		if !bytes.HasPrefix(topic, s.topic) {
			continue // the PUB filters by subscription; this is a second check
		}
		// Never block here: zmq4's reader of the connection would block
		// behind us. A message dropped leaves its seq missing, which shows
		// as a gap. Only this goroutine adds to queued, so the check
		// cannot be overtaken; Run's goroutine only takes off.
		size := frameBytes(msg.Frames)
		if q := s.queued.Load(); q > 0 && q+size > s.queueBudget {
			s.queueDrop(ctx, seq, "bytes")
			continue
		}
		s.queued.Add(size)
		select {
		case live <- liveMsg{seq: seq, payload: payload, size: size, fresh: fresh}:
			fresh = false
		default:
			s.queued.Add(-size)
			s.queueDrop(ctx, seq, "count")
		}
	}
}

// frameBytes is the length of a message's frames together.
func frameBytes(frames [][]byte) int64 {
	var n int64
	for _, f := range frames {
		n += int64(len(f))
	}
	return n
}

// queueDrop counts a live message dropped because the queue was full, by
// its count or its bytes (over), and logs the first and then one in
// decodeLogEvery.
func (s *Subscriber) queueDrop(ctx context.Context, seq uint64, over string) {
	if n := s.queueDrops.Add(1); n == 1 || n%decodeLogEvery == 0 {
		s.log.WarnContext(ctx, "kv events: queue full, batch dropped", "endpoint", s.cfg.Endpoint, "seq", seq, "full_by", over,
			"queued_bytes", s.queued.Load(), "dropped_total", n)
	}
}

// closeSocket closes sock, then calls Recv on it a few times. zmq4 v0.17.0
// reads each connection in a goroutine that hands messages over on a
// channel of 10 without watching the socket's context; if that channel is
// full when the socket closes, the goroutine would wait forever. Each Recv
// on a closed socket takes a queued message or returns at once.
func closeSocket(sock zmq4.Socket) {
	_ = sock.Close()
	for range drainAfterClose {
		_, _ = sock.Recv()
	}
}

// decodeError counts a message or payload that did not parse and logs the
// first and then one in decodeLogEvery.
func (s *Subscriber) decodeError(ctx context.Context, err error) {
	n := s.decodeErrors.Add(1)
	if (n == 1 || n%decodeLogEvery == 0) && s.log.Enabled(ctx, slog.LevelDebug) {
		s.log.DebugContext(ctx, "kv events: undecodable message", "endpoint", s.cfg.Endpoint, "error", err, "decode_errors", n)
	}
}

// peerError counts err, which dropped a connection to endpoint whose peer
// broke the bounds of the ZMTP stream (see transport.go), and logs the
// first and then one in decodeLogEvery. The bounded transport calls it,
// from zmq4's goroutine that reads the connection.
func (s *Subscriber) peerError(ctx context.Context, endpoint string, err error) {
	if n := s.peerErrors.Add(1); n == 1 || n%decodeLogEvery == 0 {
		s.log.WarnContext(ctx, "kv events: peer broke the ZMTP bounds, connection dropped", "endpoint", endpoint, "error", err, "peer_errors", n)
	}
}

// onLive checks one live message's seq against the last handed over and
// hands it over, after a replay or a Lost when it does not follow.
//
// The first batch of a new connection (a redial) that does not follow is
// taken as a restart, not a gap: the engine may have restarted while the
// connection was down and published past the last seq seen before the
// subscriber is back, and a replay from the new process's buffer would
// leave the old process's blocks in the handler's state. Its cost, when
// the engine did not restart, is a state rebuilt from the catch-up
// instead of a gap filled.
func (s *Subscriber) onLive(ctx context.Context, m liveMsg) {
	s.redialed = s.redialed || m.fresh
	b, err := DecodeBatch(m.payload)
	if err != nil {
		// Not handed over: its seq stays missing, and the next batch
		// shows the gap (or, first of a connection, the redial).
		s.decodeError(ctx, err)
		return
	}
	redialed := s.redialed
	s.redialed = false
	switch {
	case !s.have:
		s.catchUp(ctx, m.seq)
	case m.seq == s.last+1:
	case m.seq <= s.last, redialed:
		s.restarts.Add(1)
		s.lost(ctx, LostRestart, "seq", m.seq, "last", s.last, "redialed", redialed)
		s.catchUp(ctx, m.seq)
	default:
		s.gaps.Add(1)
		if s.cfg.Replay == "" {
			s.lost(ctx, LostGap, "seq", m.seq, "last", s.last)
		} else {
			s.fill(ctx, s.last+1, m.seq)
		}
	}
	if ctx.Err() != nil {
		return
	}
	s.handOver(m.seq, &b)
}

// catchUp, before live batch seq is handed over with no state (the first
// batch, or after a restart), replays what the engine still buffers from
// 0, so that the blocks it stored before we listened are known. It is
// best effort: the engine keeps only its last buffer_steps batches, and
// with no state there is nothing a failure makes wrong, so a failed
// catch-up before anything was handed over calls no Lost.
func (s *Subscriber) catchUp(ctx context.Context, seq uint64) {
	if s.cfg.Replay == "" || seq == 0 {
		return
	}
	s.fill(ctx, 0, seq)
}

// fill replays the batches from start up to but not including live (the
// seq of the live batch about to be handed over) and hands them over.
// Where the replay fails or leaves a hole while the handler holds state,
// it calls Lost(LostReplayFailed) and goes on from what follows.
func (s *Subscriber) fill(ctx context.Context, start, live uint64) {
	var n uint64
	failed := false
	hole := func(attrs ...any) {
		if !failed {
			failed = true
			s.replayFailures.Add(1)
		}
		if s.have {
			s.lost(ctx, LostReplayFailed, attrs...)
		}
	}
	err := s.replay(ctx, start, func(seq uint64, payload []byte) {
		if seq >= live || (s.have && seq <= s.last) || seq < start {
			return // handed over already, or about to be from the live queue
		}
		b, err := DecodeBatch(payload)
		if err != nil {
			s.decodeError(ctx, err)
			return // its seq stays missing: the next one sees the hole
		}
		if s.have && seq != s.last+1 {
			hole("from", s.last+1, "to", seq-1)
		}
		s.handOver(seq, &b)
		n++
	})
	s.replayedBatches.Add(n)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		s.log.WarnContext(ctx, "kv events: replay failed", "replay", s.cfg.Replay, "start", start, "error", err)
		hole("from", start, "to", live-1, "error", err)
		return
	}
	if s.have && s.last+1 != live {
		hole("from", s.last+1, "to", live-1)
	}
	if !failed {
		s.replays.Add(1)
	}
}

// replay asks the Replay socket for every buffered batch from start on and
// calls fn with each, in the order received, until the end marker. The
// whole exchange is bounded by the replay timeout.
//
// The request is [empty delimiter, start] from a DEALER socket (one
// request, many replies: a REQ socket would take only the first), so the
// ROUTER sees [identity, "", start] as vLLM's expects. Replies are
// accepted with or without the delimiter vLLM sends back ([identity, "",
// seq, payload]), and with a topic frame before seq ([topic, seq, payload],
// as some ports of vLLM's publisher send); an end marker from before
// END_SEQ existed (one empty frame) ends the reply too.
func (s *Subscriber) replay(ctx context.Context, start uint64, fn func(seq uint64, payload []byte)) error {
	rctx, cancel := context.WithTimeout(ctx, s.replayTimeout)
	defer cancel()
	sock := zmq4.NewDealer(withPeerErrorHook(rctx, func(err error) { s.peerError(ctx, s.cfg.Replay, err) }),
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.replayTimeout),
		zmq4.WithTimeout(s.replayTimeout),
		zmq4.WithLogger(zmqLog))
	defer closeSocket(sock)
	if err := dialBounded(sock, s.cfg.Replay); err != nil {
		return err
	}
	if err := sock.Send(zmq4.NewMsgFrom([]byte{}, ReplayRequest(start))); err != nil {
		return fmt.Errorf("kvevents: send replay request: %w", err)
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				return fmt.Errorf("kvevents: replay timed out after %v: %w", s.replayTimeout, err)
			}
			return err
		}
		frames := msg.Frames
		if len(frames) > 1 && len(frames[0]) == 0 {
			frames = frames[1:] // the delimiter
		}
		switch len(frames) {
		case 1:
			if len(frames[0]) == 0 {
				return nil // old end marker
			}
		case 3:
			frames = frames[1:] // [topic, seq, payload]
		}
		seq, payload, end, err := ParseReplayReply(frames)
		if err != nil {
			s.decodeErrors.Add(1)
			return err
		}
		if end {
			return nil
		}
		fn(seq, payload)
	}
}

// handOver passes b to the handler and counts it.
func (s *Subscriber) handOver(seq uint64, b *Batch) {
	s.h.Batch(seq, b)
	s.have, s.last = true, seq
	s.lastSeq.Store(seq)
	s.haveSeq.Store(true)
	s.batches.Add(1)
	var st, rm, cl uint64
	for i := range b.Events {
		switch b.Events[i].Kind {
		case BlockStored:
			st++
		case BlockRemoved:
			rm++
		case AllBlocksCleared:
			cl++
		}
	}
	s.stored.Add(st)
	s.removed.Add(rm)
	s.cleared.Add(cl)
	s.unknown.Add(uint64(b.Unknown))
	s.invalid.Add(uint64(b.Dropped))
}

// lost tells the handler its state of the engine is unknown and forgets
// the last seq, so the next batch is taken as it is.
func (s *Subscriber) lost(ctx context.Context, r LostReason, attrs ...any) {
	s.log.InfoContext(ctx, "kv events: state lost", append([]any{"endpoint", s.cfg.Endpoint, "reason", r.String()}, attrs...)...)
	s.h.Lost(r)
	s.have = false
}
