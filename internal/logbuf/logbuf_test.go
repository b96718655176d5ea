package logbuf

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sink records each write to the output separately.
type sink struct {
	mu     sync.Mutex
	writes []string
	err    error
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, string(p))
	if s.err != nil {
		return 0, s.err
	}
	return len(p), nil
}

func (s *sink) got() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.writes...)
}

func TestLinesWaitForTheInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &sink{}
		w := New(out, 1024, 100*time.Millisecond)
		defer w.Close()
		fmt.Fprintln(w, "one")
		fmt.Fprintln(w, "two")
		time.Sleep(99 * time.Millisecond)
		synctest.Wait()
		if got := out.got(); len(got) != 0 {
			t.Fatalf("written before the interval: %q", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := out.got(); len(got) != 1 || got[0] != "one\ntwo\n" {
			t.Fatalf("after the interval: %q, want one write of both lines", got)
		}
		// Nothing new: no empty write.
		time.Sleep(time.Second)
		synctest.Wait()
		if got := out.got(); len(got) != 1 {
			t.Fatalf("idle intervals wrote %q", got[1:])
		}
	})
}

func TestFullBufferIsWrittenBeforeTheLineThatDoesNotFit(t *testing.T) {
	out := &sink{}
	w := New(out, 10, time.Hour)
	defer w.Close()
	for _, l := range []string{"aaaa\n", "bbbb\n", "cccc\n"} {
		if n, err := w.Write([]byte(l)); n != len(l) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", l, n, err)
		}
	}
	if got := out.got(); len(got) != 1 || got[0] != "aaaa\nbbbb\n" {
		t.Fatalf("writes %q, want the first two lines, whole, in one", got)
	}
	// Longer than the buffer: the buffer first, then the line on its own.
	long := strings.Repeat("x", 25) + "\n"
	fmt.Fprint(w, long)
	if got := out.got(); len(got) != 3 || got[1] != "cccc\n" || got[2] != long {
		t.Fatalf("writes %q, want the buffered line then the long one", got)
	}
}

func TestCloseFlushesAndWritesThroughAfter(t *testing.T) {
	out := &sink{}
	w := New(out, 1024, time.Hour)
	fmt.Fprint(w, "last\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	fmt.Fprint(w, "after\n")
	if got := out.got(); len(got) != 2 || got[0] != "last\n" || got[1] != "after\n" {
		t.Fatalf("writes %q", got)
	}
}

func TestUnbufferedWritesThrough(t *testing.T) {
	for _, c := range []struct {
		size     int
		interval time.Duration
	}{{0, time.Second}, {1024, 0}} {
		out := &sink{}
		w := New(out, c.size, c.interval)
		fmt.Fprint(w, "now\n")
		if got := out.got(); len(got) != 1 {
			t.Errorf("New(%d, %v): writes %q, want the line at once", c.size, c.interval, got)
		}
		_ = w.Close()
	}
}

func TestOutputErrorEmptiesTheBuffer(t *testing.T) {
	boom := errors.New("disk full")
	out := &sink{err: boom}
	w := New(out, 8, time.Hour)
	defer w.Close()
	fmt.Fprint(w, "12345\n")
	if _, err := w.Write([]byte("6789\n")); !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want the output's error", err)
	}
	out.mu.Lock()
	out.err = nil
	out.mu.Unlock()
	fmt.Fprint(w, "ok\n")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// The failed buffer is not written again; the line that met the error
	// was not taken (n = 0), as io.Writer says.
	if got := out.got(); len(got) != 2 || got[1] != "ok\n" {
		t.Fatalf("writes %q", got)
	}
}

func TestConcurrentLinesStayWhole(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	locked := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	w := New(locked, 256, time.Millisecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				fmt.Fprintf(w, "g%d line %03d\n", g, i)
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 8*500 {
		t.Fatalf("%d lines, want %d", len(lines), 8*500)
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var g, i int
		if n, err := fmt.Sscanf(l, "g%d line %d", &g, &i); n != 2 || err != nil || len(l) != len("g0 line 000") {
			t.Fatalf("broken line %q", l)
		}
		seen[l] = true
	}
	if len(seen) != 8*500 {
		t.Fatalf("%d distinct lines, want %d", len(seen), 8*500)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
