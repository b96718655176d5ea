package testutil

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestRefusedAddr checks that RefusedAddr refuses a connection at once.
func TestRefusedAddr(t *testing.T) {
	c, err := net.DialTimeout("tcp", RefusedAddr, time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("%s accepted a connection", RefusedAddr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial %s: %v, want connection refused", RefusedAddr, err)
	}
}
