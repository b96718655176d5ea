package redistest

import "syscall"

// procAttr has the kernel kill redis-server if the test binary dies
// without its cleanup (a panic in another goroutine, a timeout's SIGQUIT),
// so no server outlives its test.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
