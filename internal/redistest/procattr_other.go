//go:build !linux

package redistest

import "syscall"

// procAttr is nil where there is no parent-death signal: a test binary that
// dies without its cleanup leaves its redis-server running.
func procAttr() *syscall.SysProcAttr { return nil }
