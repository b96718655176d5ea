// Package logbuf batches log output. A busy gateway writes one access-log
// line per request; written one by one, each line is a write system call on
// the request's goroutine (and, when the log file sits in a watched
// directory, an inotify event for the watcher to read). A Writer appends
// lines to a buffer instead and writes the buffer out in one call when it
// fills, every flush interval, on Flush and on Close: nginx's
// `access_log ... buffer=size flush=time` does the same.
//
// What a buffer costs: lines reach the output up to one flush interval late,
// and a process killed outright (SIGKILL, an unrecovered panic) loses the
// lines of its last interval. cmd/gateway flushes at once after a warning or
// an error, and on exit.
package logbuf

import (
	"io"
	"sync"
	"time"
)

// Writer is a buffered io.Writer safe for concurrent use. Each Write is kept
// whole: a line is never split between two writes to the output, as long as
// it fits the buffer (a longer one is written through on its own).
type Writer struct {
	mu     sync.Mutex
	out    io.Writer
	buf    []byte // len(buf) <= size
	size   int
	closed bool

	stop chan struct{}
	done chan struct{}
}

// New returns a Writer over out with a buffer of size bytes, written out
// at least every interval by a goroutine that Close stops. size <= 0 or
// interval <= 0 returns a Writer that writes through at once (and starts
// no goroutine).
func New(out io.Writer, size int, interval time.Duration) *Writer {
	b := &Writer{out: out, size: size}
	if size <= 0 || interval <= 0 {
		b.closed = true // writes go straight through
		return b
	}
	b.buf = make([]byte, 0, size)
	b.stop, b.done = make(chan struct{}), make(chan struct{})
	go b.flusher(interval)
	return b
}

// Write appends p to the buffer, first writing the buffer out if p does not
// fit; a p larger than the buffer is written through. The error is that of
// a write to the output made in this call, if one was.
func (b *Writer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return b.out.Write(p)
	}
	if len(b.buf)+len(p) > b.size {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > b.size {
			return b.out.Write(p)
		}
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Flush writes the buffered bytes out.
func (b *Writer) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

// flushLocked writes buf out and empties it, even on error: a broken output
// must not grow the buffer or repeat old lines. b.mu is held.
func (b *Writer) flushLocked() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.out.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// Close stops the flusher, writes the buffer out and makes every later
// Write go straight through. It does not close the output. Calling it again
// does nothing.
func (b *Writer) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	err := b.flushLocked()
	b.mu.Unlock()
	close(b.stop)
	<-b.done
	return err
}

func (b *Writer) flusher(interval time.Duration) {
	defer close(b.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
			_ = b.Flush() // an output error is the next Write's too
		}
	}
}
