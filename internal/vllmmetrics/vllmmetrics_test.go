package vllmmetrics

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestCappedReader: a body of exactly the limit is read whole; one byte
// more fails, without the parser seeing more than the limit.
func TestCappedReader(t *testing.T) {
	for _, tc := range []struct {
		size int
		over bool
	}{{0, false}, {9, false}, {10, false}, {11, true}, {1000, true}} {
		c := &cappedReader{r: bytes.NewReader(bytes.Repeat([]byte("x"), tc.size)), left: 10}
		b, err := io.ReadAll(c)
		if tc.over != (err != nil) || c.over != tc.over || (tc.over && !errors.Is(err, ErrTooLarge)) {
			t.Errorf("size %d: err %v over %v, want over %v", tc.size, err, c.over, tc.over)
		}
		if len(b) > 10 {
			t.Errorf("size %d: read %d bytes past a limit of 10", tc.size, len(b))
		}
	}
}

// TestParseLimit: a page over the limit is ErrTooLarge, not a parse error
// of its cut-off end; at the limit it parses.
func TestParseLimit(t *testing.T) {
	page := "vllm:num_requests_running 3\n"
	if s, err := Parse(strings.NewReader(page), int64(len(page))); err != nil || s.Running != 3 || !s.HasScheduler {
		t.Fatalf("at the limit: %+v, %v", s, err)
	}
	if _, err := Parse(strings.NewReader(page), int64(len(page)-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one byte over: %v, want ErrTooLarge", err)
	}
	if s, err := Parse(strings.NewReader(page), 0); err != nil || s.Running != 3 {
		t.Fatalf("no limit: %+v, %v", s, err)
	}
}
