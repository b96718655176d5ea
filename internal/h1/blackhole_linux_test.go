//go:build linux

package h1

import (
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// blackhole returns the address of a listener whose accept queue is full,
// so a dial to it hangs until it times out (Linux: backlog 0 takes one
// connection, which is made here). It is closed when the test ends.
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "blackhole")
	t.Cleanup(func() { f.Close() })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}).String()
	// Fill the queue; a second dial must then hang.
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	probe, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
	if err == nil {
		probe.Close()
		t.Skip("the listen backlog does not make dials hang here")
	}
	return addr
}
