package sse

import "bytes"

// DefaultMaxEvent is the largest event, in bytes, that a Scanner made with
// NewScanner(0) parses. Larger events are forwarded without a callback.
const DefaultMaxEvent = 1 << 20

// shrinkCap is the buffer capacity above which Reset drops the buffer, so a
// Scanner kept in a pool does not pin the memory of one unusually large event.
const shrinkCap = 64 << 10

// utf8BOM is the byte order mark that the SSE spec says to ignore at the very
// start of a stream.
const utf8BOM = "\xef\xbb\xbf"

// Event is one complete SSE event, sliced from the scanner's buffer (valid
// only during the callback).
//
// Copy any field that must outlive the callback: the next event may reuse the
// same memory.
type Event struct {
	// Raw is the event's bytes exactly as received, including its
	// terminating blank line. When a "\r\n" blank line is split across two
	// calls to Push, Raw ends at the "\r" and the "\n" is forwarded by the
	// next Push without a callback (see Scanner.Push).
	Raw []byte
	// Data is the data field: the values of all "data" lines joined with
	// "\n", each stripped of "data:" and one leading space if present. It is
	// nil when the event has no data line, and empty but non-nil for a data
	// line with an empty value. Single-line data aliases Raw; multi-line data
	// is assembled in a scratch buffer owned by the Scanner.
	Data []byte
	// Name is the value of the last "event" field, nil if there is none.
	Name []byte
	// Comment is true when the event has only comment lines (":...") and no
	// field lines, such as ": keep-alive". An event that mixes comments and
	// fields is not a Comment; its comment lines are ignored.
	Comment bool
	// Offset is where Raw starts within the slice the same Push call
	// returns, so a caller can forward that slice minus some events.
	Offset int
}

// Scanner splits a byte stream into complete SSE events. Not safe for
// concurrent use; reusable via Reset.
//
// The zero value is ready to use, with the default limit.
type Scanner struct {
	// buf holds buf[:done], the bytes returned by the previous Push (kept
	// until the next call so the returned slice stays valid), followed by
	// the pending bytes of the incomplete event.
	buf  []byte
	done int
	// line is the offset in buf of the first line of the pending event that
	// has not been confirmed complete; lines before it are known complete,
	// so a large event arriving in small reads is scanned once, not once
	// per read.
	line int
	// scan is where the search for the terminator of the line at line
	// resumes: the bytes between them hold none, so a long line arriving in
	// small reads is searched once, not once per read.
	scan int
	// scratch joins multi-line data.
	scratch []byte
	max     int
	// started is true once some bytes of the stream were returned by Push;
	// a byte order mark is ignored only at the very start of the stream.
	started   bool
	overflows int
	// Resynchronisation after an overflow: while discarding, every byte is
	// forwarded until the next blank line. lineStart says the next byte
	// starts a line; cr says the last byte was a '\r', so a '\n' that
	// follows it finishes the same line terminator.
	discarding bool
	lineStart  bool
	cr         bool
}

// NewScanner returns a Scanner that parses events of at most maxEvent bytes
// (<=0 means 1 MiB default), not counting the blank line that ends an event.
// The limit bounds the memory a Scanner holds for a single incomplete event
// (plus at most one Push worth of bytes).
func NewScanner(maxEvent int) *Scanner {
	if maxEvent <= 0 {
		maxEvent = DefaultMaxEvent
	}
	return &Scanner{max: maxEvent}
}

// Push appends p to the pending bytes, calls fn for every event completed by
// them, in order, and returns the bytes of all complete events (the
// concatenation of their Raw, i.e. a contiguous prefix of the stream) ready
// to forward. The returned slice is valid until the next call. Incomplete
// trailing bytes are kept for the next Push.
//
// Push copies p, so the caller may reuse p as soon as Push returns; the
// returned slice and the Events alias the Scanner's buffer, never p.
//
// Concatenated over a whole stream, the returned slices equal the input up
// to the end of its last complete event, byte for byte. A few complete
// bytes are returned without a callback because they carry no event: a
// blank line that no field or comment line precedes (per the SSE spec it
// dispatches nothing), the "\n" that completes a "\r\n" blank line whose
// "\r" ended the previous Push, and the bytes of events longer than the
// limit (see Overflows). fn may be nil when only framing is needed.
func (s *Scanner) Push(p []byte, fn func(Event)) []byte {
	if s.max <= 0 {
		s.max = DefaultMaxEvent
	}
	s.compact()
	s.buf = append(s.buf, p...)
	b := s.buf
	out := 0
	if s.discarding {
		out = s.discard(0)
		if s.discarding {
			s.done, s.line, s.scan = out, out, out
			s.started = true
			return b[:out]
		}
	}
	ev := out              // start of the current event
	i := max(s.line, ev)   // start of the current line
	from := max(s.scan, i) // where the search for its terminator resumes
	f := finder{b: b, lf: -1, cr: -1}
	for {
		t := f.next(from)
		if t == len(b) {
			from = t
			break // no terminator yet: the line is incomplete
		}
		end := t + 1
		if b[t] == '\r' {
			if end < len(b) {
				if b[end] == '\n' {
					end++
				}
			} else if t > i {
				// A line ends with the last byte we have, a '\r'. If the
				// next byte is '\n' it belongs to this terminator, so the
				// line is re-scanned when more bytes arrive instead of
				// mistaking "\r" + "\n" for two line ends.
				from = t
				break
			}
			// A blank line that is a bare '\r' at the end of the input
			// completes the event now rather than waiting for a byte that
			// may never come; a '\n' that follows is then a blank line
			// with nothing before it, which dispatches nothing.
		}
		if t == i { // blank line: the event ends here
			if i > ev {
				s.dispatch(b[ev:end], ev, i-ev, !s.started && ev == 0, fn)
			}
			ev = end
			out = end
		}
		i = end
		from = end
	}
	if len(b)-ev > s.max {
		// The incomplete event already exceeds the limit: forward what we
		// have and skip the rest of it as it arrives. Pending bytes never
		// include the blank line that ends an event, so this is the limit
		// dispatch applies to complete events, whatever the read boundaries.
		s.overflows++
		s.discarding, s.lineStart, s.cr = true, true, false
		out = s.discard(i)
		i, from = out, out
	}
	if out > 0 {
		s.started = true
	}
	s.done, s.line, s.scan = out, i, from
	return b[:out]
}

// compact drops the bytes returned by the previous Push.
func (s *Scanner) compact() {
	if s.done == 0 {
		return
	}
	n := copy(s.buf, s.buf[s.done:])
	s.buf = s.buf[:n]
	s.line -= s.done
	s.scan -= s.done
	s.done = 0
}

// discard skips the bytes of an overflowed event from buf[i:], returning the
// end of the forwarded bytes: the end of the blank line that ends the event,
// when it is found (and discarding stops), or len(buf).
func (s *Scanner) discard(i int) int {
	b := s.buf
	f := finder{b: b, lf: -1, cr: -1}
	for i < len(b) {
		if s.cr {
			s.cr = false
			if b[i] == '\n' { // second half of a "\r\n" split across reads
				i++
				continue
			}
		}
		t := f.next(i)
		if t == len(b) {
			s.lineStart = false
			return len(b)
		}
		blank := s.lineStart && t == i
		i = t + 1
		if b[t] == '\r' {
			if i == len(b) {
				s.cr = true
			} else if b[i] == '\n' {
				i++
			}
		}
		s.lineStart = true
		if blank {
			s.discarding = false
			return i
		}
	}
	return i
}

// dispatch parses the complete event raw, whose lines before the blank line
// span raw[:n], and calls fn with it unless n is over the limit. first says raw
// starts the stream, where a byte order mark is ignored.
func (s *Scanner) dispatch(raw []byte, offset, n int, first bool, fn func(Event)) {
	if n > s.max {
		s.overflows++
		return
	}
	lines := raw[:n]
	if first {
		lines = bytes.TrimPrefix(lines, []byte(utf8BOM))
	}
	if fn == nil {
		return
	}
	e := Event{Raw: raw, Offset: offset}
	fields, comments, ndata := false, false, 0
	f := finder{b: lines, lf: -1, cr: -1}
	for i := 0; i < len(lines); {
		t := f.next(i)
		line := lines[i:t]
		i = t + 1
		if t < len(lines) && lines[t] == '\r' && i < len(lines) && lines[i] == '\n' {
			i++
		}
		if len(line) == 0 {
			continue // cannot happen: the event has no blank line before its end
		}
		if line[0] == ':' {
			comments = true
			continue
		}
		fields = true
		name, value := line, line[len(line):]
		if c := bytes.IndexByte(line, ':'); c >= 0 {
			name, value = line[:c], line[c+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(name) {
		case "data":
			switch ndata {
			case 0:
				e.Data = value
			case 1:
				s.scratch = append(append(append(s.scratch[:0], e.Data...), '\n'), value...)
			default:
				s.scratch = append(append(s.scratch, '\n'), value...)
			}
			ndata++
		case "event":
			e.Name = value
		}
	}
	if !fields && !comments {
		return // only a byte order mark: the spec sees a blank line
	}
	if ndata > 1 {
		e.Data = s.scratch
	}
	e.Comment = comments && !fields
	fn(e)
}

// Pending returns the buffered bytes of the incomplete event (for
// end-of-stream handling). The slice is valid until the next call to Push or
// Reset. While an overflowed event is being skipped nothing is pending: its
// bytes are returned by Push as they arrive.
func (s *Scanner) Pending() []byte {
	return s.buf[s.done:]
}

// Reset discards all state, including pending bytes and the overflow count,
// so the Scanner can parse a new stream. It keeps its buffers for reuse
// unless they have grown unusually large.
func (s *Scanner) Reset() {
	if cap(s.buf) > shrinkCap {
		s.buf = nil
	}
	if cap(s.scratch) > shrinkCap {
		s.scratch = nil
	}
	*s = Scanner{buf: s.buf[:0], scratch: s.scratch[:0], max: s.max}
}

// Overflows counts events that exceeded maxEvent: such bytes are returned by
// Push for forwarding without a callback, and the scanner resynchronises at
// the next blank line.
func (s *Scanner) Overflows() int {
	return s.overflows
}

// finder locates line terminators in b. It remembers the next '\n' and the
// next '\r' it has seen, so finding every terminator of b costs one pass of
// bytes.IndexByte per byte value even when one value is rare or absent
// (a CR-only stream would otherwise rescan all of b for '\n' on each line).
type finder struct {
	b      []byte
	lf, cr int // index of the next '\n' / '\r' at or after the last query; len(b) when none
}

// next returns the index of the first '\r' or '\n' at or after i, or len(b).
// Successive calls must not decrease i.
func (f *finder) next(i int) int {
	if f.lf < i {
		f.lf = index(f.b, i, '\n')
	}
	if f.cr < i {
		f.cr = index(f.b, i, '\r')
	}
	return min(f.lf, f.cr)
}

func index(b []byte, i int, c byte) int {
	if k := bytes.IndexByte(b[i:], c); k >= 0 {
		return i + k
	}
	return len(b)
}

// IsDone reports whether data is the "[DONE]" sentinel that ends an
// OpenAI-style stream, ignoring surrounding ASCII white space.
func IsDone(data []byte) bool {
	for len(data) > 0 && isSpace(data[0]) {
		data = data[1:]
	}
	for len(data) > 0 && isSpace(data[len(data)-1]) {
		data = data[:len(data)-1]
	}
	return string(data) == "[DONE]"
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}
