package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// zmtpGreeting is a ZMTP 3.0 greeting for the NULL mechanism, as a client
// sends it (RFC 23/ZMTP, "The Greeting").
func zmtpGreeting() []byte {
	g := make([]byte, greetingLen)
	g[0], g[9] = 0xFF, 0x7F
	g[10], g[11] = 3, 0
	copy(g[12:32], "NULL")
	return g
}

// zmtpFrame is a frame of body with flags (flagMore, flagCommand), with a
// 1-byte size up to 255 and an 8-byte one above, as zmq4 writes them.
func zmtpFrame(flags byte, body []byte) []byte {
	f := zmtpHeader(flags, uint64(len(body)))
	return append(f, body...)
}

// zmtpHeader is a frame header declaring size; it uses the 8-byte form
// above 255.
func zmtpHeader(flags byte, size uint64) []byte {
	if size > 255 {
		return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
	}
	return []byte{flags, byte(size)}
}

// zmtpCommand is the body of a command: its name's length, the name, and
// body.
func zmtpCommand(name string, body []byte) []byte {
	return append(append([]byte{byte(len(name))}, name...), body...)
}

// zmtpReady is a READY command's body with the properties kv (name,
// value, ...).
func zmtpReady(kv ...string) []byte {
	var md []byte
	for i := 0; i+1 < len(kv); i += 2 {
		md = append(md, byte(len(kv[i])))
		md = append(md, kv[i]...)
		md = binary.BigEndian.AppendUint32(md, uint32(len(kv[i+1])))
		md = append(md, kv[i+1]...)
	}
	return zmtpCommand(zmq4.CmdReady, md)
}

// pubHandshake is what a PUB socket sends first: its greeting and its
// READY command.
func pubHandshake() []byte {
	return append(zmtpGreeting(), zmtpFrame(flagCommand, zmtpReady("Socket-Type", "PUB"))...)
}

// isPeerError reports whether err is or wraps a *peerError.
func isPeerError(err error) bool {
	var pe *peerError
	return errors.As(err, &pe)
}

// feedBytewise feeds s to a new parser one byte at a time and returns the
// parser and the index of the byte whose feed returned an error, or -1.
func feedBytewise(s []byte) (*zmtpParser, int, error) {
	var z zmtpParser
	for i := range s {
		if err := z.feed(s[i : i+1]); err != nil {
			return &z, i, err
		}
	}
	return &z, -1, nil
}

// TestZMTPParserSplitReads: a well-formed stream (greeting, READY,
// messages of short and long frames, an empty frame, a PING) parses the
// same fed whole, byte by byte or in pieces of any size, and the handshake
// counts as done exactly at the READY's last byte.
func TestZMTPParserSplitReads(t *testing.T) {
	hs := pubHandshake()
	var s []byte
	s = append(s, hs...)
	s = append(s, zmtpFrame(flagMore, []byte("kv@10.0.0.7@qwen"))...)
	s = append(s, zmtpFrame(flagMore, AppendSeq(nil, 7))...)
	s = append(s, zmtpFrame(0, bytes.Repeat([]byte{0xA5}, 300))...) // long size
	s = append(s, zmtpFrame(0, nil)...)
	s = append(s, zmtpFrame(flagCommand, zmtpCommand(zmq4.CmdPing, []byte{0, 1}))...)
	s = append(s, zmtpFrame(flagMore, bytes.Repeat([]byte{1}, 255))...) // the longest short size
	s = append(s, zmtpFrame(0, bytes.Repeat([]byte{2}, 256))...)        // the shortest long one

	for _, piece := range []int{1, 2, 3, 7, 9, 64, 65, 1000, len(s)} {
		var z zmtpParser
		for i := 0; i < len(s); i += piece {
			end := min(i+piece, len(s))
			if i < len(hs) && end >= len(hs)-1 {
				// The piece that holds the READY's last byte (index len(hs)-1).
				if z.handshook {
					t.Fatalf("piece %d: handshake done before the READY's last byte", piece)
				}
			}
			if err := z.feed(s[i:end]); err != nil {
				t.Fatalf("piece %d: feed at %d: %v", piece, i, err)
			}
			if end >= len(hs) && !z.handshook {
				t.Fatalf("piece %d: handshake not done after the READY (fed %d bytes)", piece, end)
			}
		}
		if z.state != stFlags || z.msgSize != 0 || z.frames != 0 {
			t.Errorf("piece %d: end state %d, msgSize %d, frames %d; want stFlags, 0, 0", piece, z.state, z.msgSize, z.frames)
		}
	}
}

// TestZMTPParserBounds: fed byte by byte after a PUB's handshake, a frame
// header is refused at its last size byte exactly when it takes the
// message or command over its cap, and a malformed READY at its last
// byte.
func TestZMTPParserBounds(t *testing.T) {
	hs := pubHandshake()
	many := func(n int) []byte {
		var b []byte
		for range n {
			b = append(b, zmtpFrame(flagMore, nil)...)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		pre  []byte // before the stream under test, default pubHandshake
		s    []byte
		want string // "" for no error; else a substring, the error at s's last byte
	}{
		{"2^40 long", nil, zmtpHeader(0, 1<<40), "a frame of 1099511627776 bytes after 0"},
		{"2^64-1 long", nil, zmtpHeader(0, 1<<64-1), "a frame of 18446744073709551615 bytes"},
		{"cap long", nil, zmtpHeader(0, maxMessageSize), ""},
		{"cap+1 long", nil, zmtpHeader(0, maxMessageSize+1), "a frame of 67174401 bytes after 0 in its message, cap 67174400"},
		{"short 255", nil, zmtpHeader(0, 255), ""},
		{"long 0", nil, []byte{flagLong, 0, 0, 0, 0, 0, 0, 0, 0}, ""},
		{"64 frames", nil, append(many(63), zmtpHeader(0, 0)...), ""},
		{"65 frames", nil, append(many(64), zmtpHeader(0, 0)...), "more than 64 frames"},
		{"frame count resets", nil, append(append(many(63), zmtpFrame(0, nil)...), many(64)...), ""},
		{"command cap", nil, zmtpHeader(flagCommand, maxCommandSize), ""},
		{"command cap+1", nil, zmtpHeader(flagCommand, maxCommandSize+1), "a command frame of 65537 bytes, cap 65536"},
		{"READY value past the end", zmtpGreeting(), zmtpFrame(flagCommand, append(zmtpCommand("READY", []byte("\x0bSocket-Type\x00\x00\x00\x09")), "PUB"...)), "truncated property value"},
		{"READY name past the end", zmtpGreeting(), zmtpFrame(flagCommand, zmtpCommand("READY", []byte("\x03abc"))), "truncated property name"},
		{"READY empty", zmtpGreeting(), zmtpFrame(flagCommand, zmtpReady()), ""},
		{"READY two properties", zmtpGreeting(), zmtpFrame(flagCommand, zmtpReady("Socket-Type", "ROUTER", "Identity", "")), ""},
		{"ERROR", zmtpGreeting(), zmtpFrame(flagCommand, zmtpCommand("ERROR", []byte("\x03abc"))), ""},
		{"name past the end", zmtpGreeting(), zmtpFrame(flagCommand, []byte{9, 'R'}), ""}, // zmq4 refuses it
	} {
		t.Run(tc.name, func(t *testing.T) {
			pre := tc.pre
			if pre == nil {
				pre = hs
			}
			z, at, err := feedBytewise(append(append([]byte{}, pre...), tc.s...))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("error %v at byte %d, want none", err, at)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if last := len(pre) + len(tc.s) - 1; at != last {
				t.Errorf("error at byte %d, want at the last one, %d", at, last)
			}
			if !strings.Contains(err.Error(), tc.want) || !isPeerError(err) {
				t.Errorf("error %q (peer error %v), want a peer error containing %q", err, isPeerError(err), tc.want)
			}
			if err2 := z.feed([]byte{0}); err2 != err {
				t.Errorf("feed after the error = %v, want the same error", err2)
			}
		})
	}
}

// TestZMTPParserMessageCap: the frames of one message share the cap, and a
// message's end frees it for the next.
func TestZMTPParserMessageCap(t *testing.T) {
	body := make([]byte, 1<<20)
	feedBody := func(z *zmtpParser, n int) {
		t.Helper()
		for n > 0 {
			k := min(n, len(body))
			if err := z.feed(body[:k]); err != nil {
				t.Fatalf("feed body: %v", err)
			}
			n -= k
		}
	}
	var z zmtpParser
	if err := z.feed(pubHandshake()); err != nil {
		t.Fatal(err)
	}
	// A message of the cap exactly, in two frames, then the same again.
	for range 2 {
		if err := z.feed(zmtpHeader(flagMore, maxMessageSize-10)); err != nil {
			t.Fatal(err)
		}
		feedBody(&z, maxMessageSize-10)
		if err := z.feed(zmtpFrame(0, make([]byte, 10))); err != nil {
			t.Fatalf("last frame reaching the cap: %v", err)
		}
	}
	// One byte over, in a third frame.
	if err := z.feed(zmtpHeader(flagMore, maxMessageSize-10)); err != nil {
		t.Fatal(err)
	}
	feedBody(&z, maxMessageSize-10)
	if err := z.feed(zmtpFrame(flagMore, make([]byte, 5))); err != nil {
		t.Fatal(err)
	}
	err := z.feed(zmtpHeader(0, 6))
	if err == nil || !strings.Contains(err.Error(), "a frame of 6 bytes after 67174395 in its message") {
		t.Fatalf("frame over the message cap: %v", err)
	}
}

// fakePeer is a TCP listener on 127.0.0.1 that sends its first connection
// the bytes hostile and then holds it open, and proxies later connections
// to upstream (when not ""). It keeps every connection it accepted until
// the test ends.
type fakePeer struct {
	ln       net.Listener
	endpoint string // tcp://127.0.0.1:port
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
	accepted int
}

func newFakePeer(t *testing.T, hostile []byte, upstream string) *fakePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePeer{ln: ln, endpoint: "tcp://" + ln.Addr().String()}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.accepted++
			first := p.accepted == 1
			p.mu.Unlock()
			switch {
			case first:
				if _, err := c.Write(hostile); err != nil {
					t.Errorf("fake peer write: %v", err)
				}
			case upstream != "":
				p.proxy(t, c, strings.TrimPrefix(upstream, "tcp://"))
			}
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// proxy copies between c and a new connection to addr until either ends.
func (p *fakePeer) proxy(t *testing.T, c net.Conn, addr string) {
	u, err := net.Dial("tcp", addr)
	if err != nil {
		t.Errorf("fake peer: dial upstream: %v", err)
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, u)
	p.mu.Unlock()
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
	}
	p.wg.Go(func() { cp(u, c) })
	p.wg.Go(func() { cp(c, u) })
}

func (p *fakePeer) acceptedConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// TestSubscriberHostilePeer: a peer that declares a frame of 2^40 bytes
// (in a message or as its READY) or sends a READY whose metadata would
// make zmq4 panic is dropped without the allocation, counted in
// PeerErrors, and the subscriber redials and receives from the real
// publisher behind the same address.
func TestSubscriberHostilePeer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hostile []byte
	}{
		{"huge frame", append(pubHandshake(), zmtpHeader(flagMore, 1<<40)...)},
		{"huge READY", append(zmtpGreeting(), zmtpHeader(flagCommand, 1<<40)...)},
		{"malformed READY", append(zmtpGreeting(), zmtpFrame(flagCommand, zmtpCommand("READY", []byte("\x03abc")))...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, "", false, framingVLLM)
			p := newFakePeer(t, tc.hostile, e.endpoint)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r := newRecorder()
			s := run(t, SubscriberConfig{Endpoint: p.endpoint}, r)
			testutil.Eventually(t, wait, func() bool { return s.Stats().PeerErrors == 1 }, "PeerErrors 1 (stats %+v)", s.Stats())
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("allocated %d bytes while dropping the peer, want far less than its frame", grew)
			}
			e.connect(t, r)
			if st := s.Stats(); st.PeerErrors != 1 || st.DecodeErrors != 0 || !st.Connected || st.Batches == 0 {
				t.Errorf("stats %+v, want PeerErrors 1, no decode error, connected, batches", st)
			}
			if n := p.acceptedConns(); n < 2 {
				t.Errorf("fake peer accepted %d connections, want the hostile one and a redial", n)
			}
		})
	}
}

// TestSubscriberSilentPeer: Run returns within a second of the cancel while
// its dial waits for a greeting that never comes.
func TestSubscriberSilentPeer(t *testing.T) {
	p := newFakePeer(t, nil, "")
	s, err := NewSubscriber(SubscriberConfig{Endpoint: p.endpoint}, newRecorder())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	// The first connection gets nil: the handshake hangs.
	testutil.Eventually(t, wait, func() bool { return p.acceptedConns() == 1 }, "the subscriber's connection")
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
	if st := s.Stats(); st.Connected || st.PeerErrors != 0 {
		t.Errorf("stats %+v, want not connected, no peer error", st)
	}
}

// TestBoundedTransportHandshakeDeadline: a connection whose peer sends no
// greeting fails its read at the handshake deadline, and one whose dial
// context ends is closed.
func TestBoundedTransportHandshakeDeadline(t *testing.T) {
	p := newFakePeer(t, nil, "")
	addr := strings.TrimPrefix(p.endpoint, "tcp://")
	tr := boundedTransport{handshake: 100 * time.Millisecond}

	c, err := tr.Dial(context.Background(), &net.Dialer{}, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_, err = c.Read(make([]byte, greetingLen))
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "no ZMTP handshake within 100ms") {
		t.Errorf("read = %v, want the handshake deadline", err)
	}
	if el := time.Since(start); el < 90*time.Millisecond || el > 2*time.Second {
		t.Errorf("read failed after %v, want about 100ms", el)
	}

	ctx, cancel := context.WithCancel(context.Background())
	c2, err := boundedTransport{handshake: time.Minute}.Dial(ctx, &net.Dialer{}, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	res := make(chan error, 1)
	go func() {
		_, err := c2.Read(make([]byte, greetingLen))
		res <- err
	}()
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read after the cancel = %v, want net.ErrClosed", err)
		}
	case <-time.After(wait):
		t.Fatal("read did not end after the dial's context was cancelled")
	}
}

// testScheme is boundedTransport with a short handshake deadline,
// registered for TestBoundedTransportIdle.
const testScheme = "switchboard+tcp-test"

var registerTestTransport = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(testScheme, boundedTransport{handshake: 100 * time.Millisecond})
})

// TestBoundedTransportIdle: a real zmq4 PUB and SUB talk through the
// transport, and a connection idle past the handshake deadline still
// delivers (the deadline ends with the handshake).
func TestBoundedTransportIdle(t *testing.T) {
	if err := registerTestTransport(); err != nil {
		t.Fatal(err)
	}
	pub := zmq4.NewPub(context.Background(), zmq4.WithLogger(zmqLog))
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	sub := zmq4.NewSub(context.Background(), zmq4.WithDialerMaxRetries(0), zmq4.WithAutomaticReconnect(false), zmq4.WithLogger(zmqLog))
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(testScheme + "://" + pub.Addr().String()); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 100)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(got)
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			got <- string(msg.Bytes())
		}
	})
	defer func() {
		closeSocket(sub)
		wg.Wait()
	}()
	recv := func(want string) bool {
		for {
			select {
			case m, ok := <-got:
				if !ok {
					t.Fatalf("SUB stopped receiving, waiting for %q", want)
				}
				if m == want {
					return true
				}
			case <-time.After(50 * time.Millisecond):
				return false
			}
		}
	}
	testutil.Eventually(t, wait, func() bool {
		if err := pub.Send(zmq4.NewMsgString("first")); err != nil {
			t.Fatal(err)
		}
		return recv("first")
	}, "a first message through the transport")
	// Nothing to poll: the point is that nothing happens for longer than
	// the handshake deadline.
	time.Sleep(300 * time.Millisecond)
	if err := pub.Send(zmq4.NewMsgString("after idle")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, wait, func() bool { return recv("after idle") }, "a message after 300ms idle")
}

// TestSubscriberHostileReplayPeer: a replay socket that declares a frame of
// 2^40 bytes fails the replay, is counted in PeerErrors, and the live
// batch is still handed over.
func TestSubscriberHostileReplayPeer(t *testing.T) {
	e := newEngine(t, "", false, framingVLLM)
	e.mu.Lock()
	e.next = 5 // the first batch is not seq 0, so the subscriber catches up
	e.mu.Unlock()
	hostile := append(zmtpGreeting(), zmtpFrame(flagCommand, zmtpReady("Socket-Type", "ROUTER"))...)
	hostile = append(hostile, zmtpHeader(flagMore, 1<<40)...)
	p := newFakePeer(t, hostile, "")
	r := newRecorder()
	s := run(t, SubscriberConfig{Endpoint: e.endpoint, Replay: p.endpoint, ReplayTimeout: 5 * time.Second}, r)
	e.connect(t, r)
	if st := s.Stats(); st.PeerErrors != 1 || st.ReplayFailures != 1 || st.Replays != 0 || st.ReplayedBatches != 0 {
		t.Errorf("stats %+v, want PeerErrors 1, ReplayFailures 1, nothing replayed", st)
	}
	if got := r.entries(); len(got) == 0 || !strings.HasPrefix(got[0], "b") {
		t.Errorf("entries %v, want a batch first (a failed catch-up calls no Lost)", got)
	}
}
