package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The subscriber's sockets dial through a zmq4 transport of its own, which
// reads the ZMTP 3.x stream (RFC 23/ZMTP) as zmq4 receives it and drops the
// connection where zmq4 v0.17.0 would trust the peer:
//
//   - zmq4 allocates each frame at the size its header declares, before
//     the body arrives and with no cap, and a size near 2^63 makes it
//     panic. The transport fails the Read that would complete a frame
//     header taking a message over maxMessageSize or maxMessageFrames, or
//     a command over maxCommandSize, so zmq4 never sees the size.
//   - zmq4 reads a READY command's metadata with unchecked slice bounds (a
//     property whose length runs past the body panics). The transport
//     checks every READY before zmq4 has its last byte.
//   - zmq4 puts no deadline on the greeting and the security handshake.
//     The transport sets one (handshakeTimeout) from the dial until the
//     peer's first complete frame, its READY under the NULL mechanism, and
//     closes the connection when the context zmq4 dials with ends: zmq4
//     passes the socket's context, which ends when the socket is closed or
//     the context it was made with (the subscriber's) is done.
//
// What a peer can still make zmq4 allocate without sending it is one
// message's frames, up to maxMessageSize, per connection. A dropped
// connection is reported through the hook of withPeerErrorHook, which the
// subscriber counts in SubscriberStats.PeerErrors.
const (
	// transportScheme is the zmq4 transport name the subscriber dials
	// "tcp://host:port" endpoints through.
	transportScheme = "switchboard+tcp"

	// handshakeTimeout bounds a connection's ZMTP greeting and handshake:
	// from the TCP connect until the peer's first complete frame.
	handshakeTimeout = 10 * time.Second

	// frameMargin is what a message may carry beyond a MaxPayloadSize
	// payload (the topic and seq frames, a replay reply's identity and
	// delimiter), and the cap of one command frame.
	frameMargin = 64 << 10

	// maxMessageSize caps the sum of the declared sizes of one message's
	// frames.
	maxMessageSize = MaxPayloadSize + frameMargin

	// maxCommandSize caps one command frame (READY, ERROR, PING...).
	maxCommandSize = frameMargin

	// maxMessageFrames caps the frames of one message; a KV-events
	// message has 3, a replay reply at most 4 (the DEALER does not see the
	// ROUTER's identity frame).
	maxMessageFrames = 64

	// greetingLen is the length of a ZMTP 3.x greeting.
	greetingLen = 64
)

// ZMTP frame flags (RFC 23/ZMTP, "Framing").
const (
	flagMore    = 1 << 0
	flagLong    = 1 << 1
	flagCommand = 1 << 2
)

// peerError is the error a bounded connection's Read returns when the peer
// broke the bounds; the subscriber counts it in SubscriberStats.PeerErrors.
// It is a net.Error that is not a timeout, so that zmq4 marks the
// connection closed.
type peerError struct{ reason string }

func (e *peerError) Error() string   { return "kvevents: ZMTP peer dropped: " + e.reason }
func (e *peerError) Timeout() bool   { return false }
func (e *peerError) Temporary() bool { return false }

var _ net.Error = (*peerError)(nil)

// peerErrorKey is the context key of withPeerErrorHook.
type peerErrorKey struct{}

// withPeerErrorHook returns ctx carrying f: a socket made with the result
// (zmq4 dials with the socket's context, derived from the one it was made
// with) has each of its bounded connections call f with the *peerError
// that dropped it, once. zmq4 does not always pass that error on: a Send
// racing the drop fails with zmq4.ErrClosedConn.
func withPeerErrorHook(ctx context.Context, f func(error)) context.Context {
	return context.WithValue(ctx, peerErrorKey{}, f)
}

// zmtpParser follows a ZMTP 3.x byte stream as it is read, in pieces of
// any size: the greeting, then frames of a flags byte, a size (1 byte, or 8
// bytes big-endian with flagLong) and a body. It keeps no more than a
// command's body (at most maxCommandSize), and reports the first frame that
// breaks the bounds. The zero value expects a greeting.
type zmtpParser struct {
	state   parseState
	need    int    // bytes left in the greeting or the size field
	flags   byte   // the current frame's
	size    uint64 // the current frame's declared size, as read so far
	left    uint64 // body bytes left in the current frame
	msgSize uint64 // the declared sizes of the current message's frames
	frames  int    // the current message's frames, counting this one
	cmd     []byte // the current command frame's body, as read so far
	// handshook is set by the first complete frame after the greeting.
	handshook bool
	err       error
}

type parseState uint8

const (
	stGreeting parseState = iota
	stFlags
	stSize
	stBody
)

// feed parses p, the next bytes of the stream. Once it returned an error it
// returns the same one for every call.
func (z *zmtpParser) feed(p []byte) error {
	for len(p) > 0 && z.err == nil {
		switch z.state {
		case stGreeting:
			if z.need == 0 {
				z.need = greetingLen
			}
			k := min(z.need, len(p))
			z.need -= k
			p = p[k:]
			if z.need == 0 {
				z.state = stFlags
			}
		case stFlags:
			z.flags = p[0]
			p = p[1:]
			z.size = 0
			z.need = 1
			if z.flags&flagLong != 0 {
				z.need = 8
			}
			z.state = stSize
		case stSize:
			z.size = z.size<<8 | uint64(p[0])
			p = p[1:]
			z.need--
			if z.need == 0 {
				z.err = z.startBody()
			}
		case stBody:
			k := min(z.left, uint64(len(p)))
			if z.flags&flagCommand != 0 {
				z.cmd = append(z.cmd, p[:k]...)
			}
			z.left -= k
			p = p[k:]
			if z.left == 0 {
				z.err = z.endFrame()
			}
		}
	}
	return z.err
}

// startBody checks the size of the frame whose header was just read
// against the bounds and moves on to its body.
func (z *zmtpParser) startBody() error {
	z.frames++
	if z.frames > maxMessageFrames {
		return &peerError{"a message of more than " + strconv.Itoa(maxMessageFrames) + " frames"}
	}
	if z.flags&flagCommand != 0 && z.size > maxCommandSize {
		return &peerError{fmt.Sprintf("a command frame of %d bytes, cap %d", z.size, maxCommandSize)}
	}
	if z.size > maxMessageSize-z.msgSize {
		return &peerError{fmt.Sprintf("a frame of %d bytes after %d in its message, cap %d", z.size, z.msgSize, maxMessageSize)}
	}
	z.msgSize += z.size
	z.left = z.size
	z.state = stBody
	z.cmd = z.cmd[:0]
	if z.left == 0 {
		return z.endFrame()
	}
	return nil
}

// endFrame checks a complete command and moves on to the next frame.
func (z *zmtpParser) endFrame() error {
	z.state = stFlags
	z.handshook = true
	if z.flags&flagMore == 0 {
		z.msgSize, z.frames = 0, 0
	}
	if z.flags&flagCommand != 0 {
		return checkCommand(z.cmd)
	}
	return nil
}

// checkCommand checks what zmq4 v0.17.0 reads of a command body without
// bounds checks: a READY's metadata, properties of a name (length byte)
// and a value (4-byte big-endian length). Other commands, and a name
// longer than the body (which zmq4 refuses), are left to zmq4.
func checkCommand(body []byte) error {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return nil
	}
	name, md := body[1:1+int(body[0])], body[1+int(body[0]):]
	if string(name) != zmq4.CmdReady {
		return nil
	}
	for len(md) > 0 {
		k := int(md[0])
		if len(md) < 1+k+4 {
			return &peerError{"a READY command with a truncated property name"}
		}
		v := uint64(md[1+k])<<24 | uint64(md[2+k])<<16 | uint64(md[3+k])<<8 | uint64(md[4+k])
		md = md[5+k:]
		if v > uint64(len(md)) {
			return &peerError{"a READY command with a truncated property value"}
		}
		md = md[v:]
	}
	return nil
}

// boundedConn is a net.Conn whose Read passes what it reads through a
// zmtpParser. It is read from one goroutine at a time, as zmq4 does (the
// handshake in Dial, then the connection's reader).
type boundedConn struct {
	net.Conn
	z         zmtpParser
	err       error       // the first peerError, returned by every later Read
	onPeerErr func(error) // from withPeerErrorHook, or nil
	handshake time.Duration
	handshook bool
	stop      func() bool // unregisters the close on the dial's context
}

// Read reads from the connection and parses what it read. When that broke
// the bounds it closes the connection and returns 0 bytes and a
// *peerError, so that zmq4 (which reads with io.ReadFull) never sees the
// offending header complete. A read that timed out during the handshake is
// returned wrapped, naming the handshake.
func (c *boundedConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if perr := c.z.feed(p[:n]); perr != nil {
			c.err = perr
			_ = c.Conn.Close()
			if c.onPeerErr != nil {
				c.onPeerErr(perr)
			}
			return 0, perr
		}
		if c.z.handshook && !c.handshook {
			c.handshook = true
			if derr := c.Conn.SetDeadline(time.Time{}); derr != nil && err == nil {
				err = derr
			}
		}
	}
	if err != nil && !c.handshook {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			_ = c.Conn.Close()
			err = fmt.Errorf("kvevents: no ZMTP handshake within %v: %w", c.handshake, err)
		}
	}
	return n, err
}

// Close stops watching the dial's context and closes the connection.
func (c *boundedConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

// boundedTransport is the zmq4 transport registered as transportScheme: it
// dials TCP as zmq4's "tcp" transport does and returns a *boundedConn.
type boundedTransport struct {
	handshake time.Duration // the deadline of the handshake
}

var _ transport.Transport = boundedTransport{}

// Dial connects to addr ("host:port") with dialer, as zmq4's tcp transport
// does, and wraps the connection: its deadline is the handshake's until the
// peer's first complete frame, it is closed when ctx ends, and it calls
// the hook of withPeerErrorHook in ctx, if any, when it drops the peer.
func (t boundedTransport) Dial(ctx context.Context, dialer transport.Dialer, addr string) (net.Conn, error) {
	nc, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := nc.SetDeadline(time.Now().Add(t.handshake)); err != nil {
		_ = nc.Close()
		return nil, err
	}
	c := &boundedConn{Conn: nc, handshake: t.handshake}
	c.onPeerErr, _ = ctx.Value(peerErrorKey{}).(func(error))
	c.stop = context.AfterFunc(ctx, func() { _ = nc.Close() })
	return c, nil
}

// Listen refuses: the subscriber only dials.
func (boundedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kvevents: the " + transportScheme + " transport only dials")
}

// Addr returns ep ("host:port") as zmq4's tcp transport does.
func (boundedTransport) Addr(ep string) (string, error) {
	return tcpTransport.Addr(ep)
}

// tcpTransport is zmq4's own, for Addr.
var tcpTransport = transport.New("tcp")

// registerTransport registers the bounded transport with zmq4 once; it
// returns the registration's error (a name taken by another package).
var registerTransport = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(transportScheme, boundedTransport{handshake: handshakeTimeout})
})

// dialBounded dials ep, "tcp://host:port", on sock through the bounded
// transport.
func dialBounded(sock zmq4.Socket, ep string) error {
	if err := registerTransport(); err != nil {
		return err
	}
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return fmt.Errorf("kvevents: %q: want tcp://host:port", ep)
	}
	return sock.Dial(transportScheme + "://" + rest)
}
