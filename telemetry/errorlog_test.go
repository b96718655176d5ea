package telemetry

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// TestErrorLogBoundedRate: a collector that is down fails every export;
// the log gets the first error at once, then one line per interval with
// the number of errors it stood for.
func TestErrorLogBoundedRate(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	clk := testutil.NewClock(time.Unix(1000, 0))
	l := newErrorLog(log, 10*time.Second, clk.Now)
	l.Handle(errors.New("e0"))
	for i := range 50 { // 50 errors within the interval: no line
		clk.Advance(100 * time.Millisecond)
		_ = i
		l.Handle(errors.New("within"))
	}
	clk.Advance(5 * time.Second) // 10 s after the first line
	l.Handle(errors.New("e51"))
	clk.Advance(time.Second)
	l.Handle(errors.New("e52"))
	l.flush() // at shutdown: e52 was counted by no line
	l.flush() // nothing left
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=WARN msg="opentelemetry export error" error=e0 suppressed=0`,
		`level=WARN msg="opentelemetry export error" error=e51 suppressed=50`,
		`level=WARN msg="opentelemetry export errors not logged" suppressed=1`,
	}
	if len(lines) != len(want) {
		t.Fatalf("log lines:\n%s\nwant %d lines", buf.String(), len(want))
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d = %q, want %q", i, lines[i], want[i])
		}
	}
}
