// Package redistest runs a real redis-server for tests: one private
// process per test, on a free loopback port, with no persistence, stopped
// by its PID when the test ends.
//
// It needs Debian's redis-server on PATH (apt-get install redis-server);
// without it Start fails the test rather than skipping it, so a CI machine
// without Redis cannot pass by testing nothing.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readyTimeout bounds how long Start and Restart wait for the server to
// answer PING; stopGrace is how long Stop waits after SIGTERM before
// SIGKILL.
const (
	readyTimeout = 10 * time.Second
	stopGrace    = 5 * time.Second
)

// Server is one redis-server process. Its methods are safe for concurrent
// use, but Stop and Restart are meant to be called from the test's own
// goroutine.
type Server struct {
	tb   testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	runs int           // processes started, to name their log files
}

// Start runs a redis-server on a free port of 127.0.0.1 and waits until
// it answers PING. It stops the server in tb.Cleanup. It fails tb (never
// skips) when redis-server is not on PATH or does not come up.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redistest: redis-server is not on PATH (%v): install Debian's redis-server package (apt-get install redis-server)", err)
	}
	s := &Server{tb: tb, bin: bin, dir: tb.TempDir()}
	// A port picked by listening on :0 can be taken by someone else before
	// redis-server binds it: try a few.
	var last error
	for range 3 {
		if s.port, last = freePort(); last != nil {
			continue
		}
		if last = s.start(); last == nil {
			tb.Cleanup(func() {
				if err := s.stop(); err != nil {
					tb.Errorf("redistest: %v", err)
				}
			})
			return s
		}
	}
	tb.Fatalf("redistest: %v", last)
	return nil
}

// Addr is the server's "127.0.0.1:port", the same across Restart.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Stop ends the server (SIGTERM, then SIGKILL after 5 s) and waits for it
// to exit. Its data is gone: it keeps none. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.tb.Helper()
	if err := s.stop(); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
}

// Restart starts a stopped server again on the same port, empty, and waits
// until it answers PING. It stops a running one first.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.stop(); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
	if err := s.start(); err != nil {
		s.tb.Fatalf("redistest: %v", err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs++
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.runs))
	// A file, not a pipe: exec copies an *os.File's output without a
	// goroutine, and the log stays readable after the process is gone.
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done

	deadline := time.Now().Add(readyTimeout)
	for {
		err := ping(s.Addr())
		if err == nil {
			return nil
		}
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("redis-server on port %d exited before answering PING: %s", s.port, tail(logPath))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on port %d did not answer PING within %v (%v): %s", s.port, readyTimeout, err, tail(logPath))
		}
	}
}

func (s *Server) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
		s.cmd = nil
		return nil
	case <-time.After(stopGrace):
	}
	pid := s.cmd.Process.Pid
	s.kill()
	return fmt.Errorf("redis-server (pid %d) ignored SIGTERM for %v and was killed", pid, stopGrace)
}

// kill ends the process with SIGKILL and waits for it; s.mu is held.
func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ping sends one PING in RESP and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return errors.New("PING answered " + strconv.Quote(line))
	}
	return nil
}

// tail is the end of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strconv.Quote(string(b))
}
