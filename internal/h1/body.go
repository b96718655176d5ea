package h1

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync/atomic"
)

// Body framings.
const (
	bodyLength     = iota + 1 // Content-Length
	bodyChunked               // Transfer-Encoding: chunked
	bodyUntilClose            // delimited by the connection's close
)

// States of a chunked body.
const (
	chunkSize    = iota // a chunk-size line is next
	chunkData           // inside a chunk's data (remain bytes left)
	chunkDataEnd        // the CRLF after a chunk's data is next
	chunkTrailer        // the trailer (or the final CRLF) is next
)

// maxChunkLine bounds a chunk-size line (net/http/internal's maxLineLength).
const maxChunkLine = 4096

// body is a response body read from its connection as the caller reads
// it. It owns the connection, and the context's AfterFunc (stop), until it
// ends: at its clean end (io.EOF), which returns the connection to its
// pool when it may be reused, or at an error or a Close before the end,
// which closes it. Read is for one goroutine; Close may be called from any,
// also during a Read, and any number of times.
type body struct {
	c      *conn
	ctx    context.Context
	stop   func() bool // the context AfterFunc's; nil when none
	resp   *http.Response
	kind   uint8
	remain int64 // bodyLength: bytes left; bodyChunked: left in the chunk
	state  uint8 // bodyChunked's
	excess int64 // bodyChunked: framing bytes beyond an allowance
	keep   bool  // the connection may be reused after the body
	err    error // sticky: io.EOF or the error that ended the body

	closed atomic.Bool // Close was called
	done   atomic.Bool // the connection was released
}

// Read reads the body. It returns io.EOF at its clean end (with the last
// bytes when they are already at hand, as net/http does, so a caller that
// stops at the last byte still frees the connection); a body cut short
// returns io.ErrUnexpectedEOF; a read ended by the request's context
// returns context.Cause(ctx) (net/http: bodyEOFSignal with
// persistConn.canceled); after Close it returns net/http's "http: read on
// closed response body".
func (b *body) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errReadOnClosedResBody
	}
	if b.err != nil {
		return 0, b.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if b.c.canceled.Load() {
		b.err = context.Cause(b.ctx)
		b.end(false)
		return 0, b.err
	}
	var (
		n   int
		err error
	)
	switch b.kind {
	case bodyLength:
		n, err = b.readLength(p)
	case bodyChunked:
		n, err = b.readChunked(p)
	default:
		n, err = b.c.br.Read(p)
	}
	if err == nil {
		return n, nil
	}
	if err == io.EOF {
		b.err = io.EOF
		b.end(true)
		return n, io.EOF
	}
	if b.c.canceled.Load() {
		err = context.Cause(b.ctx)
	}
	b.err = err
	b.end(false)
	return n, err
}

// Close ends the body. Before its end the connection is closed (net/http
// does not drain a body either: bodyEOFSignal's earlyCloseFn), so an engine
// still generating sees the client leave; after it, Close does nothing.
// It always returns nil.
func (b *body) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	if b.done.CompareAndSwap(false, true) {
		b.c.release(b.stop, false)
	}
	return nil
}

// end releases the connection, once: to its pool after a clean end when
// it may be reused, else closed.
func (b *body) end(clean bool) {
	if b.done.CompareAndSwap(false, true) {
		b.c.release(b.stop, clean && b.keep)
	}
}

// readLength reads a Content-Length body; it returns io.EOF with its last
// byte (transfer.go, body.readLocked).
func (b *body) readLength(p []byte) (int, error) {
	if int64(len(p)) > b.remain {
		p = p[:b.remain]
	}
	n, err := b.c.br.Read(p)
	b.remain -= int64(n)
	if b.remain == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// readChunked reads a chunked body (net/http/internal's chunkedReader): it
// blocks only while it has nothing to return, and having bytes it goes on
// through framing only as far as it is already buffered, so a stream's
// chunks are returned as they arrive and the end is seen with the last
// data when it came with it.
func (b *body) readChunked(p []byte) (int, error) {
	br := b.c.br
	n := 0
	for {
		switch b.state {
		case chunkSize:
			if n > 0 && !lineBuffered(br) {
				return n, nil
			}
			size, err := b.readChunkSize(br)
			if err != nil {
				return n, err
			}
			if size == 0 {
				b.state = chunkTrailer
			} else {
				b.state, b.remain = chunkData, size
			}
		case chunkData:
			if n == len(p) || (n > 0 && br.Buffered() == 0) {
				return n, nil
			}
			m, err := br.Read(p[n : n+int(min(int64(len(p)-n), b.remain))])
			n += m
			b.remain -= int64(m)
			if b.remain == 0 {
				b.state = chunkDataEnd
			}
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
		case chunkDataEnd:
			if n > 0 && br.Buffered() < 2 {
				return n, nil
			}
			crlf, err := br.Peek(2)
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return n, err
			}
			if crlf[0] != '\r' || crlf[1] != '\n' {
				return n, fmt.Errorf("%w: malformed chunked encoding", ErrMalformedResponse)
			}
			_, _ = br.Discard(2)
			b.state = chunkSize
		case chunkTrailer:
			if n > 0 {
				// Only a bare final CRLF is taken here; a
				// trailer waits for the next Read.
				buf, _ := br.Peek(min(br.Buffered(), 2))
				switch {
				case len(buf) >= 1 && buf[0] == '\n':
					_, _ = br.Discard(1)
				case len(buf) == 2 && buf[0] == '\r' && buf[1] == '\n':
					_, _ = br.Discard(2)
				default:
					return n, nil
				}
				return n, io.EOF
			}
			return 0, b.readTrailer(br)
		}
	}
}

// readChunkSize reads a chunk-size line (chunkedReader.beginChunk):
// extensions are ignored, and a stream of small chunks whose framing
// outweighs its data fails (net/http's excess accounting).
func (b *body) readChunkSize(br *bufio.Reader) (int64, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// Longer than the read buffer (a small one, or extensions).
		long := append(b.c.hp.long[:0], line...)
		for err == bufio.ErrBufferFull && len(long) < maxChunkLine {
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		b.c.hp.long, line = long, long
	}
	if err != nil {
		switch err {
		case io.EOF:
			err = io.ErrUnexpectedEOF
		case bufio.ErrBufferFull:
			err = fmt.Errorf("%w: chunk-size line too long", ErrMalformedResponse)
		}
		return 0, err
	}
	if len(line) >= maxChunkLine {
		return 0, fmt.Errorf("%w: chunk-size line too long", ErrMalformedResponse)
	}
	b.excess += int64(len(line)) + 2 // the line, and the CRLF after the data
	line = bytes.TrimRight(line, " \t\r\n")
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = bytes.TrimRight(line[:i], " \t")
	}
	size, err := parseHex(line)
	if err != nil {
		return 0, err
	}
	b.excess -= 16 + 2*size
	b.excess = max(b.excess, 0)
	if b.excess > 16<<10 {
		return 0, fmt.Errorf("%w: chunked encoding contains too much non-data", ErrMalformedResponse)
	}
	return size, nil
}

// readTrailer reads the trailer fields after the last chunk, bounded like
// a head, into resp.Trailer (chunkedReader and body.readTrailer), and
// returns io.EOF.
func (b *body) readTrailer(br *bufio.Reader) error {
	hp := &b.c.hp
	hp.limit = b.c.h.t.cfg.maxHeaderBytes
	defer hp.trim()
	if err := hp.readFields(br); err != nil {
		return err
	}
	if len(hp.kvs) > 0 {
		if b.resp.Trailer == nil {
			b.resp.Trailer = make(http.Header, len(hp.kvs))
		}
		for k, vv := range hp.header() {
			b.resp.Trailer[k] = vv
		}
	}
	return io.EOF
}

// parseHex is net/http/internal's parseHexUint, capped at MaxInt64.
func parseHex(v []byte) (int64, error) {
	if len(v) == 0 {
		return 0, fmt.Errorf("%w: empty hex number for chunk length", ErrMalformedResponse)
	}
	var n uint64
	for i, c := range v {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, fmt.Errorf("%w: invalid byte in chunk length", ErrMalformedResponse)
		}
		if i == 16 {
			return 0, fmt.Errorf("%w: http chunk length too large", ErrMalformedResponse)
		}
		n = n<<4 | uint64(c)
	}
	if n > math.MaxInt64 {
		return 0, fmt.Errorf("%w: http chunk length too large", ErrMalformedResponse)
	}
	return int64(n), nil
}

// lineBuffered reports whether a whole line is in br's buffer.
func lineBuffered(br *bufio.Reader) bool {
	buf, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(buf, '\n') >= 0
}
