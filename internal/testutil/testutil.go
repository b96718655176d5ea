// Package testutil holds small helpers shared by the tests of several
// packages. It is imported by tests only.
package testutil

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"
)

// UnsetOTEL removes every OTEL_* variable from the process environment for
// the duration of the test (the OpenTelemetry SDK reads them from there),
// restoring them on cleanup. Tests that call it must not run in parallel.
func UnsetOTEL(t testing.TB) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "") // restores the original value on cleanup
			if err := os.Unsetenv(k); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// LockedBuffer is a bytes.Buffer that loggers may write to from any
// goroutine while a test reads it.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Selects reports whether every label of a Kubernetes equality selector
// sel is in labels; an empty selector selects nothing here (a manifest
// selecting every pod is a mistake the deploy tests want to catch).
func Selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}
