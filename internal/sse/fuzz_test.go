package sse

import (
	"strings"
	"testing"
)

// FuzzScanner checks the framing properties on arbitrary input: Push never
// panics, its output concatenated is a prefix of the input (and with the
// pending bytes, all of it), and splitting the input at a fuzzed point, or
// pushing it a byte at a time, gives the same events, overflows and pending
// bytes as pushing it whole.
func FuzzScanner(f *testing.F) {
	seeds := []string{
		l07Event, l07Event + l07Event,
		"data: {\"content\":\"caf\u00e9 \u4e16\"}\n\n",
		"data: {\"a\":1}\r\n\r\n", "data: a\r\ndata: b\r\n\r\n", "data: a\r\n\r", "data: a\rdata: b\r\r",
		": keep-alive\n\n: keep-alive\n\n: keep-alive\n\n" + dataEvent(contentChunk) + dataEvent(contentChunk) + "data: [DONE]\n\n",
		"event: message\nid: 7\nretry: 1000\ndata: {}\n\n",
		"data: {\"a\":\ndata: 1}\n\n", "data:{\"a\":1}\n\n", ": c1\ndata: x\n: c2\ndata: y\n\n",
		dataEvent(roleChunk) + ": ping\n\n" + dataEvent(contentChunk) + dataEvent(usageChunk) + "data: [DONE]\n\n",
		dataEvent(reasoningChunk), dataEvent(toolChunk), dataEvent(finishChunk),
		"\xef\xbb\xbfdata: x\n\n", "\n\r\n\r", "data: " + strings.Repeat("y", 300) + "\r\n\r\ndata: ok\n\n",
	}
	seeds = append(seeds, shapes...)
	for i, s := range seeds {
		f.Add([]byte(s), uint16(len(s)/2), uint16(i*37%300))
	}
	f.Fuzz(func(t *testing.T, in []byte, at, maxEvent uint16) {
		split := int(at) % (len(in) + 1)
		max := int(maxEvent) % 512 // 0 is the default limit; small limits exercise overflows
		if msg := checkSplits(in, max, []int{split}); msg != "" {
			t.Fatalf("split at %d, max %d: %s", split, max, msg)
		}
		if len(in) <= 512 {
			bytewise := make([]int, len(in))
			for i := range bytewise {
				bytewise[i] = i
			}
			if msg := checkSplits(in, max, bytewise); msg != "" {
				t.Fatalf("byte by byte, max %d: %s", max, msg)
			}
		}
	})
}
