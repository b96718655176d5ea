package sse

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// ev is a copy of an Event that outlives the callback; nil Data and Name are
// kept apart from empty ones.
type ev struct {
	Raw     string
	Data    *string
	Name    *string
	Comment bool
}

func (e ev) String() string {
	f := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return fmt.Sprintf("%q", *p)
	}
	return fmt.Sprintf("{Raw:%q Data:%s Name:%s Comment:%v}", e.Raw, f(e.Data), f(e.Name), e.Comment)
}

func copyEvent(e Event) ev {
	c := ev{Raw: string(e.Raw), Comment: e.Comment}
	if e.Data != nil {
		d := string(e.Data)
		c.Data = &d
	}
	if e.Name != nil {
		n := string(e.Name)
		c.Name = &n
	}
	return c
}

func str(s string) *string { return &s }

// run pushes chunks through s and returns the concatenated output and the
// events seen.
func run(s *Scanner, chunks ...string) (string, []ev) {
	var out strings.Builder
	var evs []ev
	for _, c := range chunks {
		var offsets [][2]int
		var raws []string
		o := s.Push([]byte(c), func(e Event) {
			evs = append(evs, copyEvent(e))
			offsets = append(offsets, [2]int{e.Offset, e.Offset + len(e.Raw)})
			raws = append(raws, string(e.Raw))
		})
		// Every event's Raw sits at its Offset in this Push's output.
		for i, r := range offsets {
			if r[0] < 0 || r[1] > len(o) || string(o[r[0]:r[1]]) != raws[i] {
				panic(fmt.Sprintf("event %q at offset %d is not in the output %q", raws[i], r[0], o))
			}
		}
		out.Write(o)
	}
	return out.String(), evs
}

// Realistic vLLM chunks (L10): role prelude, content, reasoning, tool call,
// finish, usage-only.
const (
	roleChunk      = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	contentChunk   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`
	reasoningChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"},"logprobs":null,"finish_reason":null}]}`
	toolChunk      = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null}]}`
	finishChunk    = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`
	usageChunk     = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":15,"completion_tokens":6}}`
	l07Event       = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"}}]}\n\n"
	l07Data        = `{"id":"c1","choices":[{"index":0,"delta":{"content":"hello"}}]}`
)

func dataEvent(data string) string { return "data: " + data + "\n\n" }

func TestScannerPush(t *testing.T) {
	type test struct {
		name    string
		chunks  []string
		out     string // concatenated Push output; defaults to the whole input
		pending string
		want    []ev
	}
	split := func(s string, at ...int) []string {
		var c []string
		prev := 0
		for _, a := range at {
			c = append(c, s[prev:a])
			prev = a
		}
		return append(c, s[prev:])
	}
	jsonSplit := strings.Index(l07Event, "hel") + 3
	utf8Event := "data: {\"content\":\"caf\u00e9 \u4e16\"}\n\n"
	utf8At := strings.Index(utf8Event, "\u00e9") + 1 // between the two bytes of é
	cjkAt := strings.Index(utf8Event, "\u4e16") + 2  // inside the 3-byte 世
	l08 := ": keep-alive\n\n" + ": keep-alive\n\n" + ": keep-alive\n\n" +
		dataEvent(contentChunk) + dataEvent(contentChunk) + "data: [DONE]\n\n"
	l10 := dataEvent(roleChunk) + ": ping\n\n" + dataEvent(contentChunk) + dataEvent(contentChunk) +
		dataEvent(usageChunk) + "data: [DONE]\n\n"
	keepAlive := ev{Raw: ": keep-alive\n\n", Comment: true}
	tests := []test{
		// L07: one event split across reads.
		{name: "whole event", chunks: []string{l07Event},
			want: []ev{{Raw: l07Event, Data: str(l07Data)}}},
		{name: "split inside json string", chunks: split(l07Event, jsonSplit),
			want: []ev{{Raw: l07Event, Data: str(l07Data)}}},
		{name: "split between the two newlines", chunks: split(l07Event, len(l07Event)-1),
			want: []ev{{Raw: l07Event, Data: str(l07Data)}}},
		{name: "split after data colon", chunks: split(l07Event, 5),
			want: []ev{{Raw: l07Event, Data: str(l07Data)}}},
		{name: "two events in one write", chunks: []string{l07Event + dataEvent(contentChunk)},
			want: []ev{{Raw: l07Event, Data: str(l07Data)}, {Raw: dataEvent(contentChunk), Data: str(contentChunk)}}},
		{name: "one and a half events then the rest", chunks: split(l07Event+l07Event, len(l07Event)+10),
			want: []ev{{Raw: l07Event, Data: str(l07Data)}, {Raw: l07Event, Data: str(l07Data)}}},
		{name: "utf8 split inside a two-byte rune", chunks: split(utf8Event, utf8At),
			want: []ev{{Raw: utf8Event, Data: str("{\"content\":\"caf\u00e9 \u4e16\"}")}}},
		{name: "utf8 split inside a three-byte rune", chunks: split(utf8Event, cjkAt),
			want: []ev{{Raw: utf8Event, Data: str("{\"content\":\"caf\u00e9 \u4e16\"}")}}},
		{name: "crlf", chunks: []string{"data: {\"a\":1}\r\n\r\n"},
			want: []ev{{Raw: "data: {\"a\":1}\r\n\r\n", Data: str(`{"a":1}`)}}},
		{name: "crlf split between cr and lf of a field line",
			chunks: []string{"data: a\r", "\ndata: b\r\n\r\n"},
			want:   []ev{{Raw: "data: a\r\ndata: b\r\n\r\n", Data: str("a\nb")}}},
		{name: "crlf split after the first crlf", chunks: []string{"data: a\r\n", "\r\n"},
			want: []ev{{Raw: "data: a\r\n\r\n", Data: str("a")}}},
		{name: "crlf blank line split between cr and lf",
			chunks: []string{"data: a\r\n\r", "\ndata: b\r\n\r\n"},
			want: []ev{{Raw: "data: a\r\n\r", Data: str("a")},
				{Raw: "data: b\r\n\r\n", Data: str("b")}}},
		{name: "crlf byte by byte", chunks: strings.Split("data: a\r\ndata: b\r\n\r\n", ""),
			want: []ev{{Raw: "data: a\r\ndata: b\r\n\r", Data: str("a\nb")}}}, // final "\n" forwarded alone
		{name: "bare cr terminators", chunks: []string{"data: a\rdata: b\r\rdata: c\r\r"},
			want: []ev{{Raw: "data: a\rdata: b\r\r", Data: str("a\nb")}, {Raw: "data: c\r\r", Data: str("c")}}},
		{name: "mixed terminators", chunks: []string{"event: e\rdata: a\r\ndata: b\n\r\n"},
			want: []ev{{Raw: "event: e\rdata: a\r\ndata: b\n\r\n", Data: str("a\nb"), Name: str("e")}}},
		{name: "incomplete event stays pending", chunks: []string{l07Event + "data: {\"x\""},
			out: l07Event, pending: "data: {\"x\"",
			want: []ev{{Raw: l07Event, Data: str(l07Data)}}},
		{name: "line complete but no blank line yet", chunks: []string{"data: a\n"},
			out: "", pending: "data: a\n"},
		{name: "trailing cr of a field line stays pending", chunks: []string{"data: a\r"},
			out: "", pending: "data: a\r"},

		// L08: comments and framing.
		{name: "keep-alive comment", chunks: []string{": keep-alive\n\n"},
			want: []ev{keepAlive}},
		{name: "keep-alives then content then done", chunks: []string{l08},
			want: []ev{keepAlive, keepAlive, keepAlive,
				{Raw: dataEvent(contentChunk), Data: str(contentChunk)},
				{Raw: dataEvent(contentChunk), Data: str(contentChunk)},
				{Raw: "data: [DONE]\n\n", Data: str("[DONE]")}}},
		{name: "empty comment", chunks: []string{":\n\n"},
			want: []ev{{Raw: ":\n\n", Comment: true}}},
		{name: "event id retry lines",
			chunks: []string{"event: message\nid: 7\nretry: 1000\ndata: {}\n\n"},
			want:   []ev{{Raw: "event: message\nid: 7\nretry: 1000\ndata: {}\n\n", Data: str("{}"), Name: str("message")}}},
		{name: "id only", chunks: []string{"id: 7\n\n"},
			want: []ev{{Raw: "id: 7\n\n"}}},
		{name: "event name without data", chunks: []string{"event: ping\n\n"},
			want: []ev{{Raw: "event: ping\n\n", Name: str("ping")}}},
		{name: "last event name wins", chunks: []string{"event: a\nevent:b\ndata: x\n\n"},
			want: []ev{{Raw: "event: a\nevent:b\ndata: x\n\n", Data: str("x"), Name: str("b")}}},
		{name: "two data lines joined", chunks: []string{"data: {\"a\":\ndata: 1}\n\n"},
			want: []ev{{Raw: "data: {\"a\":\ndata: 1}\n\n", Data: str("{\"a\":\n1}")}}},
		{name: "three data lines joined", chunks: []string{"data: a\ndata:\ndata: c\n\n"},
			want: []ev{{Raw: "data: a\ndata:\ndata: c\n\n", Data: str("a\n\nc")}}},
		{name: "data without space", chunks: []string{"data:{\"a\":1}\n\n"},
			want: []ev{{Raw: "data:{\"a\":1}\n\n", Data: str(`{"a":1}`)}}},
		{name: "only one leading space stripped", chunks: []string{"data:  x \n\n"},
			want: []ev{{Raw: "data:  x \n\n", Data: str(" x ")}}},
		{name: "data line without colon is empty data", chunks: []string{"data\n\n"},
			want: []ev{{Raw: "data\n\n", Data: str("")}}},
		{name: "empty data value", chunks: []string{"data:\n\n"},
			want: []ev{{Raw: "data:\n\n", Data: str("")}}},
		{name: "value keeps later colons", chunks: []string{"data: a: b\n\n"},
			want: []ev{{Raw: "data: a: b\n\n", Data: str("a: b")}}},
		{name: "comment mixed into an event is ignored",
			chunks: []string{": c1\ndata: x\n: c2\ndata: y\n\n"},
			want:   []ev{{Raw: ": c1\ndata: x\n: c2\ndata: y\n\n", Data: str("x\ny")}}},
		{name: "field names are case sensitive", chunks: []string{"Data: x\nEVENT: e\n\n"},
			want: []ev{{Raw: "Data: x\nEVENT: e\n\n"}}},
		{name: "space before colon is part of the name", chunks: []string{"data : x\n\n"},
			want: []ev{{Raw: "data : x\n\n"}}},
		{name: "blank lines without an event dispatch nothing",
			chunks: []string{"\n\r\n\r" + dataEvent("x") + "\n"},
			want:   []ev{{Raw: dataEvent("x"), Data: str("x")}}},
		{name: "byte order mark at stream start", chunks: []string{"\xef\xbb\xbf" + dataEvent("x")},
			want: []ev{{Raw: "\xef\xbb\xbf" + dataEvent("x"), Data: str("x")}}},
		{name: "byte order mark split", chunks: []string{"\xef", "\xbb", "\xbfdata: x\n\n"},
			want: []ev{{Raw: "\xef\xbb\xbf" + dataEvent("x"), Data: str("x")}}},
		{name: "byte order mark alone is a blank line", chunks: []string{"\xef\xbb\xbf\n\n" + dataEvent("x")},
			want: []ev{{Raw: dataEvent("x"), Data: str("x")}}},
		{name: "byte order mark later is data", chunks: []string{dataEvent("x") + "\xef\xbb\xbf" + dataEvent("y")},
			want: []ev{{Raw: dataEvent("x"), Data: str("x")}, {Raw: "\xef\xbb\xbf" + dataEvent("y")}}},

		// L10: a vLLM chat stream with its prelude, ping and usage chunk.
		{name: "vllm stream", chunks: split(l10, 100, 250, 500, 501, 700),
			want: []ev{{Raw: dataEvent(roleChunk), Data: str(roleChunk)},
				{Raw: ": ping\n\n", Comment: true},
				{Raw: dataEvent(contentChunk), Data: str(contentChunk)},
				{Raw: dataEvent(contentChunk), Data: str(contentChunk)},
				{Raw: dataEvent(usageChunk), Data: str(usageChunk)},
				{Raw: "data: [DONE]\n\n", Data: str("[DONE]")}}},
		{name: "reasoning tool call and finish chunks",
			chunks: []string{dataEvent(reasoningChunk) + dataEvent(toolChunk), dataEvent(finishChunk)},
			want: []ev{{Raw: dataEvent(reasoningChunk), Data: str(reasoningChunk)},
				{Raw: dataEvent(toolChunk), Data: str(toolChunk)},
				{Raw: dataEvent(finishChunk), Data: str(finishChunk)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := strings.Join(tt.chunks, "")
			wantOut := tt.out
			if wantOut == "" && tt.pending == "" {
				wantOut = input
			}
			s := NewScanner(0)
			out, evs := run(s, tt.chunks...)
			if out != wantOut {
				t.Errorf("output = %q, want %q", out, wantOut)
			}
			if got := string(s.Pending()); got != tt.pending {
				t.Errorf("Pending() = %q, want %q", got, tt.pending)
			}
			if fmt.Sprint(evs) != fmt.Sprint(tt.want) {
				t.Errorf("events:\n got %v\nwant %v", evs, tt.want)
			}
			if s.Overflows() != 0 {
				t.Errorf("Overflows() = %d, want 0", s.Overflows())
			}
		})
	}
}

func TestScannerOverflow(t *testing.T) {
	big := "data: " + strings.Repeat("x", 40) + "\n\n"
	tests := []struct {
		name   string
		chunks []string
		want   []ev
		over   int
	}{
		{name: "complete oversized event", chunks: []string{big + dataEvent("ok")},
			want: []ev{{Raw: dataEvent("ok"), Data: str("ok")}}, over: 1},
		{name: "oversized event in small reads", chunks: strings.SplitAfter(big+dataEvent("ok"), "xxxxxxx"),
			want: []ev{{Raw: dataEvent("ok"), Data: str("ok")}}, over: 1},
		{name: "oversized event byte by byte", chunks: strings.Split(big+dataEvent("ok"), ""),
			want: []ev{{Raw: dataEvent("ok"), Data: str("ok")}}, over: 1},
		{name: "oversized multi-line event resyncs at the blank line",
			chunks: []string{"data: " + strings.Repeat("y", 30) + "\r", "\ndata: z\r", "\n", "\r\n" + dataEvent("ok")},
			want:   []ev{{Raw: dataEvent("ok"), Data: str("ok")}}, over: 1},
		{name: "resync blank line split between cr and lf",
			chunks: []string{"data: " + strings.Repeat("y", 30) + "\r\n\r", "\n" + dataEvent("ok")},
			want:   []ev{{Raw: dataEvent("ok"), Data: str("ok")}}, over: 1},
		{name: "two oversized events", chunks: []string{big, big, dataEvent("ok")},
			want: []ev{{Raw: dataEvent("ok"), Data: str("ok")}}, over: 2},
		{name: "event exactly at the limit", chunks: []string{"data: " + strings.Repeat("x", 15) + "\n", "\n"},
			want: []ev{{Raw: "data: " + strings.Repeat("x", 15) + "\n\n", Data: str(strings.Repeat("x", 15))}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewScanner(22) // "data: " + 15 bytes + "\n"
			input := strings.Join(tt.chunks, "")
			out, evs := run(s, tt.chunks...)
			if out+string(s.Pending()) != input {
				t.Errorf("output+pending = %q, want %q", out+string(s.Pending()), input)
			}
			if fmt.Sprint(evs) != fmt.Sprint(tt.want) {
				t.Errorf("events:\n got %v\nwant %v", evs, tt.want)
			}
			if s.Overflows() != tt.over {
				t.Errorf("Overflows() = %d, want %d", s.Overflows(), tt.over)
			}
		})
	}
}

func TestScannerReset(t *testing.T) {
	s := NewScanner(12)
	run(s, "data: 0123456789", "\n\n", "data: h")
	if s.Overflows() != 1 || len(s.Pending()) == 0 {
		t.Fatalf("before Reset: Overflows()=%d Pending()=%q", s.Overflows(), s.Pending())
	}
	s.Reset()
	if s.Overflows() != 0 || len(s.Pending()) != 0 {
		t.Fatalf("after Reset: Overflows()=%d Pending()=%q", s.Overflows(), s.Pending())
	}
	out, evs := run(s, "\xef\xbb\xbfdata: a\n\n")
	if want := "\xef\xbb\xbfdata: a\n\n"; out != want {
		t.Errorf("output = %q, want %q", out, want)
	}
	if want := fmt.Sprint([]ev{{Raw: "\xef\xbb\xbfdata: a\n\n", Data: str("a")}}); fmt.Sprint(evs) != want {
		t.Errorf("events = %v, want %v", evs, want)
	}
}

func TestScannerZeroValue(t *testing.T) {
	var s Scanner
	out, evs := run(&s, l07Event[:10], l07Event[10:])
	if out != l07Event || fmt.Sprint(evs) != fmt.Sprint([]ev{{Raw: l07Event, Data: str(l07Data)}}) {
		t.Errorf("zero Scanner: output %q, events %v", out, evs)
	}
}

func TestScannerPushOutputValidUntilNextCall(t *testing.T) {
	s := NewScanner(0)
	p := []byte(dataEvent("a") + "data: b")
	out := s.Push(p, nil)
	copy(p, bytes.Repeat([]byte("#"), len(p))) // Push must not alias p
	if string(out) != dataEvent("a") {
		t.Fatalf("output = %q, want %q", out, dataEvent("a"))
	}
	if string(s.Pending()) != "data: b" {
		t.Fatalf("Pending() = %q, want %q", s.Pending(), "data: b")
	}
}

func TestIsDone(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"[DONE]", true},
		{" [DONE] ", true},
		{"\t[DONE]\r\n", true},
		{"[DONE]\n\n", true},
		{"", false},
		{"[done]", false},
		{"[DONE]x", false},
		{"DONE", false},
		{`"[DONE]"`, false},
		{"\u00a0[DONE]", false}, // not ASCII space
	}
	for _, tt := range tests {
		if got := IsDone([]byte(tt.in)); got != tt.want {
			t.Errorf("IsDone(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// sameEvents reports whether events from a split stream match those of the
// whole stream. The one allowed difference: a "\r\n" blank line split
// between its bytes ends the event at the "\r".
func sameEvents(whole, split []ev) bool {
	if len(whole) != len(split) {
		return false
	}
	for i := range whole {
		w, s := whole[i], split[i]
		if s.Raw != w.Raw && !(strings.HasSuffix(s.Raw, "\r") && s.Raw+"\n" == w.Raw) {
			return false
		}
		s.Raw = w.Raw
		if s.String() != w.String() {
			return false
		}
	}
	return true
}

// checkSplits pushes input whole and split at the given points and checks
// the framing properties. It returns a description of the first violation.
func checkSplits(input []byte, maxEvent int, at []int) string {
	whole := NewScanner(maxEvent)
	var wevs []ev
	wout := string(whole.Push(input, func(e Event) { wevs = append(wevs, copyEvent(e)) }))
	if !strings.HasPrefix(string(input), wout) {
		return fmt.Sprintf("whole output %q is not a prefix of the input", wout)
	}
	if wout+string(whole.Pending()) != string(input) {
		return fmt.Sprintf("whole output+pending %q != input", wout+string(whole.Pending()))
	}
	s := NewScanner(maxEvent)
	var sevs []ev
	var out []byte
	prev := 0
	for _, a := range append(at, len(input)) {
		var offErr string
		var raws []string
		var offs []int
		o := s.Push(input[prev:a], func(e Event) {
			sevs = append(sevs, copyEvent(e))
			raws, offs = append(raws, string(e.Raw)), append(offs, e.Offset)
		})
		for i, r := range raws {
			if offs[i] < 0 || offs[i]+len(r) > len(o) || string(o[offs[i]:offs[i]+len(r)]) != r {
				offErr = fmt.Sprintf("event %q at offset %d is not in the output %q", r, offs[i], o)
			}
		}
		if offErr != "" {
			return offErr
		}
		out = append(out, o...)
		prev = a
	}
	if !bytes.HasPrefix(input, out) {
		return fmt.Sprintf("split output %q is not a prefix of the input", out)
	}
	if string(out)+string(s.Pending()) != string(input) {
		return fmt.Sprintf("split output+pending %q != input", string(out)+string(s.Pending()))
	}
	if !sameEvents(wevs, sevs) {
		return fmt.Sprintf("events differ:\nwhole %v\nsplit %v", wevs, sevs)
	}
	if whole.Overflows() != s.Overflows() {
		return fmt.Sprintf("Overflows() whole %d, split %d", whole.Overflows(), s.Overflows())
	}
	if string(whole.Pending()) != string(s.Pending()) {
		return fmt.Sprintf("Pending() whole %q, split %q", whole.Pending(), s.Pending())
	}
	return ""
}

// shapes are the event shapes of L07, L08 and L10, with every terminator.
var shapes = []string{
	l07Event,
	dataEvent(roleChunk), dataEvent(contentChunk), dataEvent(reasoningChunk), dataEvent(toolChunk),
	dataEvent(finishChunk), dataEvent(usageChunk), "data: [DONE]\n\n",
	": keep-alive\n\n", ": ping\n\n", ":\n\n",
	"event: message\nid: 7\nretry: 1000\ndata: {}\n\n",
	"data: {\"a\":\ndata: 1}\n\n", "data:{\"a\":1}\n\n",
	": c\ndata: x\n\n",
	"data: {\"content\":\"caf\u00e9 \u4e16\"}\n\n",
	"data: a\r\ndata: b\r\n\r\n", "data: a\rdata: b\r\r", "event: e\rdata: a\r\ndata: b\n\r\n",
	"\n", "\r\n", "\r",
	"data: " + strings.Repeat("long ", 20) + "\n\n",
}

func TestScannerRandomSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		var in []byte
		for range 1 + r.IntN(12) {
			in = append(in, shapes[r.IntN(len(shapes))]...)
		}
		if r.IntN(4) == 0 { // a trailing incomplete event
			sh := shapes[r.IntN(len(shapes))]
			in = append(in, sh[:r.IntN(len(sh))]...)
		}
		var at []int
		for range r.IntN(8) {
			at = append(at, r.IntN(len(in)+1))
		}
		slicesSort(at)
		maxEvent := 0
		if iter%3 == 0 {
			maxEvent = 1 + r.IntN(120) // exercise overflows too
		}
		if msg := checkSplits(in, maxEvent, at); msg != "" {
			t.Fatalf("input %q max %d split at %v: %s", in, maxEvent, at, msg)
		}
	}
}

func TestScannerEveryByteSplit(t *testing.T) {
	var in []byte
	for _, sh := range shapes {
		in = append(in, sh...)
	}
	for i := 0; i <= len(in); i++ {
		if msg := checkSplits(in, 0, []int{i}); msg != "" {
			t.Fatalf("split at %d: %s", i, msg)
		}
	}
	// One byte at a time.
	at := make([]int, len(in))
	for i := range at {
		at[i] = i
	}
	if msg := checkSplits(in, 0, at); msg != "" {
		t.Fatalf("byte by byte: %s", msg)
	}
}

func slicesSort(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func TestScannerSteadyStateAllocs(t *testing.T) {
	stream := vllmStream(50)
	s := NewScanner(0)
	n := 0
	fn := func(e Event) { n += len(e.Data) }
	pushAll := func() {
		s.Reset()
		for p := stream; len(p) > 0; {
			k := min(len(p), 1024)
			s.Push(p[:k], fn)
			p = p[k:]
		}
	}
	pushAll() // warm up the buffers
	if a := testing.AllocsPerRun(20, pushAll); a != 0 {
		t.Errorf("allocations per stream = %v, want 0", a)
	}
	multi := []byte("data: a\ndata: b\ndata: c\n\n")
	s.Push(multi, fn)
	if a := testing.AllocsPerRun(100, func() { s.Push(multi, fn) }); a != 0 {
		t.Errorf("allocations per multi-line event = %v, want 0", a)
	}
}

// vllmStream is a vLLM chat completion stream with n content chunks.
func vllmStream(n int) []byte {
	var b bytes.Buffer
	b.WriteString(dataEvent(roleChunk))
	b.WriteString(": ping\n\n")
	for i := range n {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-4f3b2a1c9e8d7f6a\",\"object\":\"chat.completion.chunk\",\"created\":1735689600,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
	}
	b.WriteString(dataEvent(finishChunk))
	b.WriteString(dataEvent(usageChunk))
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

func BenchmarkScannerPush(b *testing.B) {
	stream := vllmStream(200)
	s := NewScanner(0)
	events := 0
	fn := func(e Event) {
		if !e.Comment && !IsDone(e.Data) {
			events++
		}
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		for p := stream; len(p) > 0; {
			k := min(len(p), 1024)
			s.Push(p[:k], fn)
			p = p[k:]
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/203, "ns/event")
}

// TestEventOffset: every event's Raw sits at Offset in the slice that the
// same Push returns, however the stream is split.
func TestEventOffset(t *testing.T) {
	stream := []byte(": ping\n\ndata: a\n\nevent: x\ndata: b\r\n\r\ndata: [DONE]\n\n")
	for split := 1; split < len(stream); split++ {
		s := NewScanner(0)
		for _, part := range [][]byte{stream[:split], stream[split:]} {
			var evs []Event
			out := s.Push(part, func(e Event) {
				e.Raw = append([]byte(nil), e.Raw...)
				evs = append(evs, e)
			})
			for _, e := range evs {
				if e.Offset < 0 || e.Offset+len(e.Raw) > len(out) || string(out[e.Offset:e.Offset+len(e.Raw)]) != string(e.Raw) {
					t.Fatalf("split %d: event %q at offset %d not found in output %q", split, e.Raw, e.Offset, out)
				}
			}
		}
	}
}
