package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/logbuf"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// TestWarningsFlushTheLogAtOnce: with a flush interval far longer than the
// test, info lines wait in the buffer, and a warning writes them out with
// itself, in order; so does an error from a handler derived by With.
func TestWarningsFlushTheLogAtOnce(t *testing.T) {
	out := &testutil.LockedBuffer{}
	lb := logbuf.New(out, 64<<10, time.Hour)
	defer lb.Close()
	log := slog.New(flushAt{slog.NewTextHandler(lb, nil), lb, slog.LevelWarn})
	log.Info("request", "n", 1)
	log.Info("request", "n", 2)
	if got := out.String(); got != "" {
		t.Fatalf("info lines written before the interval: %q", got)
	}
	log.Warn("engine ejected")
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "n=1") || !strings.Contains(lines[1], "n=2") || !strings.Contains(lines[2], "engine ejected") {
		t.Fatalf("after the warning the log is %q, want both info lines then the warning", lines)
	}
	log.With("engine", "e1").WithGroup("g").Info("request", "n", 3)
	log.With("engine", "e1").Error("probe failed")
	if got := out.String(); !strings.Contains(got, "g.n=3") || !strings.HasSuffix(got, "msg=\"probe failed\" engine=e1\n") {
		t.Fatalf("a derived handler's error did not flush: %q", got)
	}
}
