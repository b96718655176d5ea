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

// TestParseCacheConfigInfo: the KV block size comes from vLLM's
// cache_config_info labels; a page without it, or with a label that is
// not a positive integer, has none.
func TestParseCacheConfigInfo(t *testing.T) {
	for _, tc := range []struct {
		page string
		want int
	}{
		{"# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n" +
			`vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27000"} 1.0` + "\n", 32},
		{`vllm:cache_config_info{block_size="x"} 1` + "\n", 0},
		{`vllm:cache_config_info{cache_dtype="auto"} 1` + "\n", 0},
		{`vllm:num_requests_running{model_name="m"} 1` + "\n", 0},
	} {
		s, err := Parse(strings.NewReader(tc.page), 0)
		if err != nil || s.BlockSize != tc.want {
			t.Errorf("Parse(%q): block size %d, %v; want %d", tc.page, s.BlockSize, err, tc.want)
		}
	}
}
