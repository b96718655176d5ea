//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package h1

import (
	"net"
	"syscall"
)

// peerGone reports whether the engine closed nc (or reset it, or sent
// bytes nobody asked for) while it was idle: a non-blocking MSG_PEEK of
// one byte, which consumes nothing. A connection that cannot be checked
// is taken as alive (the replay rule covers it).
func peerGone(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true // closed
	}
	gone := false
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing to read is an open, quiet connection; anything else
		// is a reset, the engine's FIN (0 bytes) or unasked bytes.
		gone = err != syscall.EAGAIN && err != syscall.EWOULDBLOCK && err != syscall.EINTR
		return true // never wait for the poller
	})
	return gone || err != nil
}
