package h1

import (
	"context"
	"net"
	"time"
)

// Defaults of a Transport built without options. They match the gateway's
// engine transport (gateway.NewTransport) where it sets a value, and
// net/http's Transport elsewhere.
const (
	// DefaultConnectTimeout bounds a dial (net.Dialer.Timeout).
	DefaultConnectTimeout = 30 * time.Second
	// DefaultMaxIdleConnsPerHost is how many idle connections each
	// host:port keeps.
	DefaultMaxIdleConnsPerHost = 256
	// DefaultIdleConnTimeout is how long a connection may stay idle in
	// its pool before it is closed.
	DefaultIdleConnTimeout = 90 * time.Second
	// DefaultMaxResponseHeaderBytes bounds a response head (the status
	// line, the header lines and any 1xx heads before them), in bytes
	// as they arrive on the wire.
	DefaultMaxResponseHeaderBytes = 1 << 20
	// DefaultReadBufferSize is the size of each connection's read
	// buffer, in bytes (net/http's Transport.ReadBufferSize default).
	DefaultReadBufferSize = 4 << 10
	// DefaultWriteBufferSize is the size of the buffers requests are
	// written through, in bytes. They are pooled and held only while a
	// request is written, not per connection.
	DefaultWriteBufferSize = 8 << 10
	// tcpKeepAlive is the TCP keep-alive period of the default dialer
	// (gateway.NewTransport's).
	tcpKeepAlive = 30 * time.Second
	// defaultProbeIdle: a connection idle for this long is checked at
	// checkout for a close by the engine (peerGone); one reused sooner is
	// not, a syscall saved on a busy pool.
	defaultProbeIdle = time.Second
)

// config is a Transport's configuration, set by Options.
type config struct {
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)
	connectTimeout time.Duration
	maxConns       int
	maxIdle        int
	idleTimeout    time.Duration
	maxHeaderBytes int64
	readBufSize    int
	writeBufSize   int
	probeIdle      time.Duration
}

// Option configures a Transport; see New.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithDialContext sets the function that opens connections, called with
// the request's context, network "tcp" and the address "host:port". Its
// errors are returned by RoundTrip unchanged (unless the context ended
// first: then the context's cause is returned), so a connect failure should
// be a *net.OpError with Op "dial" as net.Dialer returns it. The connect
// timeout of WithConnectTimeout does not apply to it. Default: a
// net.Dialer with the connect timeout and a 30 s TCP keep-alive. A nil
// argument is ignored.
func WithDialContext(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return optionFunc(func(c *config) {
		if dial != nil {
			c.dial = dial
		}
	})
}

// WithConnectTimeout sets the default dialer's timeout (net.Dialer.Timeout):
// a dial that takes longer fails with a *net.OpError whose Timeout() is
// true. Default: DefaultConnectTimeout. A d <= 0 is ignored.
func WithConnectTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.connectTimeout = d
		}
	})
}

// WithMaxConnsPerHost bounds the connections to one host:port, counting
// those being dialed, in use and idle (net/http's
// Transport.MaxConnsPerHost). A request that finds none free waits for one,
// until its context ends. 0 means no bound (the default); n < 0 is
// ignored.
func WithMaxConnsPerHost(n int) Option {
	return optionFunc(func(c *config) {
		if n >= 0 {
			c.maxConns = n
		}
	})
}

// WithMaxIdleConnsPerHost sets how many idle connections each host:port
// keeps for reuse; a connection released when that many are idle is
// closed. Default: DefaultMaxIdleConnsPerHost. n <= 0 is ignored.
func WithMaxIdleConnsPerHost(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxIdle = n
		}
	})
}

// WithIdleConnTimeout sets how long a connection may stay idle before it is
// closed: by a timer per host, and at checkout. Default:
// DefaultIdleConnTimeout. d <= 0 is ignored.
func WithIdleConnTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.idleTimeout = d
		}
	})
}

// WithMaxResponseHeaderBytes bounds a response head, in bytes on the wire
// (status line, header lines, 1xx heads before the final one; chunked
// trailers have a bound of their own of the same size). A longer head
// fails the round trip with an error wrapping ErrResponseHeaderTooLarge and
// the connection is closed. Default: DefaultMaxResponseHeaderBytes. n <= 0
// is ignored.
func WithMaxResponseHeaderBytes(n int64) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxHeaderBytes = n
		}
	})
}

// WithReadBufferSize sets the size of each connection's read buffer, in
// bytes. It trades memory per connection against read syscalls: header
// and chunk-size lines longer than the buffer are still read (up to their
// bounds), and body reads larger than it go straight into the caller's
// slice. Default:
// DefaultReadBufferSize. n < 16 is ignored.
func WithReadBufferSize(n int) Option {
	return optionFunc(func(c *config) {
		if n >= 16 {
			c.readBufSize = n
		}
	})
}

// WithWriteBufferSize sets the size of the pooled buffers requests are
// written through, in bytes: a request whose head and body fit is written
// with one write. Default: DefaultWriteBufferSize. n < 64 is ignored.
func WithWriteBufferSize(n int) Option {
	return optionFunc(func(c *config) {
		if n >= 64 {
			c.writeBufSize = n
		}
	})
}

func newConfig(opts []Option) config {
	c := config{
		connectTimeout: DefaultConnectTimeout,
		maxIdle:        DefaultMaxIdleConnsPerHost,
		idleTimeout:    DefaultIdleConnTimeout,
		maxHeaderBytes: DefaultMaxResponseHeaderBytes,
		readBufSize:    DefaultReadBufferSize,
		writeBufSize:   DefaultWriteBufferSize,
		probeIdle:      defaultProbeIdle,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	if c.dial == nil {
		c.dial = (&net.Dialer{Timeout: c.connectTimeout, KeepAlive: tcpKeepAlive}).DialContext
	}
	return c
}
