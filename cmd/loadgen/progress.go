package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progressInterval is the period of the progress line: at most 4 updates/s.
const progressInterval = 250 * time.Millisecond

// isTerminal reports whether w is a character device such as a terminal.
// (golang.org/x/term is not a dependency of the module.)
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine formats one progress update.
func progressLine(elapsed time.Duration, done, failed, inflight int64) string {
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / s
	}
	return fmt.Sprintf("\r%6.1fs  %d done  %d failed  %d in flight  %.1f req/s\x1b[K", elapsed.Seconds(), done, failed, inflight, rate)
}

// startProgress rewrites a progress line on w every progressInterval until
// the returned stop function is called; stop waits for the goroutine and
// ends the line.
func startProgress(w io.Writer, r *Runner) (stop func()) {
	start := time.Now()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				fmt.Fprint(w, progressLine(time.Since(start), r.done.Load(), r.failed.Load(), r.inflight.Load()))
			}
		}
	})
	return func() {
		close(quit)
		wg.Wait()
		fmt.Fprint(w, progressLine(time.Since(start), r.done.Load(), r.failed.Load(), r.inflight.Load())+"\n")
	}
}
