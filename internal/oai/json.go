package oai

import (
	"encoding/json"
	"math"
	"strconv"
)

// maxDepth is encoding/json's nesting limit, so that decoder accepts exactly
// the documents json.Valid accepts.
const maxDepth = 10000

// decoder is a validating, single-pass, allocation-free JSON reader for the
// few fields this package needs. The caller walks the document with open,
// more and key, reads the values it wants with str, num or lit-based helpers,
// and skips the rest with skip, which validates what it skips. Any syntax
// error sets bad, after which every method is a no-op, so callers check bad
// once at the end instead of after every step.
//
// It accepts exactly what encoding/json accepts (RFC 8259, any bytes >= 0x20
// inside strings, nesting up to maxDepth); TestDecoderValid and the fuzz
// targets check this against encoding/json.
type decoder struct {
	b     []byte
	i     int
	depth int
	bad   bool
}

// openObject starts decoding an event's data, which must be one JSON
// object: the decoder past its '{', or the ErrMalformedChunk error of data
// that is not valid JSON or not an object.
func openObject(data []byte) (decoder, error) {
	d := decoder{b: data}
	if d.peek() != '{' {
		d.skip()
		d.end()
		if d.bad {
			return d, malformedf("not valid JSON")
		}
		return d, malformedf("not a JSON object")
	}
	d.open('{')
	return d, nil
}

func (d *decoder) fail() {
	d.bad = true
	d.i = len(d.b) // every loop ends
}

// peek skips white space and returns the next byte without consuming it, or
// 0 at the end of the input.
func (d *decoder) peek() byte {
	for d.i < len(d.b) {
		switch c := d.b[d.i]; c {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return c
		}
	}
	return 0
}

// end checks that only white space follows the top-level value.
func (d *decoder) end() {
	if d.peek() != 0 || d.i != len(d.b) {
		d.fail()
	}
}

// open consumes the opening byte c ('{' or '[') of a composite value.
func (d *decoder) open(c byte) bool {
	if d.peek() != c {
		d.fail()
		return false
	}
	d.i++
	d.depth++
	if d.depth > maxDepth {
		d.fail()
		return false
	}
	return true
}

// more reports whether the composite value opened with open has another
// element, consuming the ',' before it, or consumes the closing byte close
// and returns false. n counts the elements seen so far.
func (d *decoder) more(close byte, n *int) bool {
	c := d.peek()
	if d.bad {
		return false
	}
	if c == close {
		d.i++
		d.depth--
		return false
	}
	if *n > 0 {
		if c != ',' {
			d.fail()
			return false
		}
		d.i++
	}
	*n++
	return true
}

// key reads an object member's name and the ':' after it. Names with escape
// sequences are decoded (allocating; JSON writers do not escape plain ASCII
// names) so that "mod\u0065l" is "model", as it is for the engine's parser.
func (d *decoder) key() []byte {
	d.peek()
	start := d.i
	k, esc := d.str()
	end := d.i
	if d.peek() != ':' {
		d.fail()
		return nil
	}
	d.i++
	if esc {
		var s string
		if json.Unmarshal(d.b[start:end], &s) == nil {
			return []byte(s)
		}
	}
	return k
}

// str reads a string and returns its raw content between the quotes, escape
// sequences undecoded, and whether it contains any. Decoding can only make a
// string shorter, and a non-empty raw string decodes to a non-empty string.
func (d *decoder) str() (raw []byte, esc bool) {
	if d.peek() != '"' {
		d.fail()
		return nil, false
	}
	b := d.b
	start := d.i + 1
	for j := start; j < len(b); j++ {
		for j < len(b) && !strStop[b[j]] {
			j++
		}
		if j == len(b) {
			break
		}
		switch c := b[j]; {
		case c == '"':
			d.i = j + 1
			return b[start:j], esc
		case c == '\\':
			esc = true
			j++
			if j >= len(b) {
				d.fail()
				return nil, false
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) || !isHex(b[j+1]) || !isHex(b[j+2]) || !isHex(b[j+3]) || !isHex(b[j+4]) {
					d.fail()
					return nil, false
				}
				j += 4
			default:
				d.fail()
				return nil, false
			}
		case c < 0x20:
			d.fail()
			return nil, false
		}
	}
	d.fail() // unterminated
	return nil, false
}

// strStop marks the bytes that end the fast scan of a string: the closing
// quote, an escape and the control characters JSON forbids in strings.
var strStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// num reads a number and returns its text and whether it is written as an
// integer (no fraction or exponent).
func (d *decoder) num() (text []byte, integer bool) {
	d.peek()
	b := d.b
	i := d.i
	start := i
	digits := func() bool {
		if i >= len(b) || !isDigit(b[i]) {
			return false
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		return true
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case !digits():
		d.fail()
		return nil, false
	}
	integer = true
	if i < len(b) && b[i] == '.' {
		i++
		integer = false
		if !digits() {
			d.fail()
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		integer = false
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if !digits() {
			d.fail()
			return nil, false
		}
	}
	d.i = i
	return b[start:i], integer
}

// lit consumes the literal word (true, false or null).
func (d *decoder) lit(word string) {
	if len(d.b)-d.i < len(word) || string(d.b[d.i:d.i+len(word)]) != word {
		d.fail()
		return
	}
	d.i += len(word)
}

// skip reads and validates any value.
func (d *decoder) skip() {
	switch d.peek() {
	case '{':
		if !d.open('{') {
			return
		}
		for n := 0; d.more('}', &n); {
			d.key()
			d.skip()
		}
	case '[':
		if !d.open('[') {
			return
		}
		for n := 0; d.more(']', &n); {
			d.skip()
		}
	case '"':
		d.str()
	case 't':
		d.lit("true")
	case 'f':
		d.lit("false")
	case 'n':
		d.lit("null")
	default:
		d.num()
	}
}

// value reads any value and returns its raw text.
func (d *decoder) value() []byte {
	d.peek()
	start := d.i
	d.skip()
	if d.bad {
		return nil
	}
	return d.b[start:d.i]
}

// isNull reports whether the next value is null, consuming it if so.
func (d *decoder) isNull() bool {
	if d.peek() == 'n' {
		d.lit("null")
		return true
	}
	return false
}

// nonEmptyString reads any value and reports whether it is a non-empty
// string.
func (d *decoder) nonEmptyString() bool {
	if d.peek() != '"' {
		d.skip()
		return false
	}
	s, _ := d.str()
	return len(s) > 0
}

// nonEmptyArray reads any value and reports whether it is an array with at
// least one element.
func (d *decoder) nonEmptyArray() bool {
	if d.peek() != '[' {
		d.skip()
		return false
	}
	d.open('[')
	n := 0
	for d.more(']', &n) {
		d.skip()
	}
	return n > 0
}

// int reads any value and returns it as an integer: numbers with a fraction
// are truncated and out-of-range values saturate; anything but a number is
// 0 with ok false.
func (d *decoder) int() (v int64, ok bool) {
	switch c := d.peek(); {
	case c == '-' || isDigit(c):
	default:
		d.skip()
		return 0, false
	}
	text, integer := d.num()
	if d.bad {
		return 0, false
	}
	return parseInt(text, integer), true
}

// parseInt converts a valid JSON number to an int64, truncating a fraction
// and saturating at the int64 range.
func parseInt(text []byte, integer bool) int64 {
	if integer && len(text) <= 18 { // at most 18 digits (or "-" and 17) cannot overflow
		neg := text[0] == '-'
		if neg {
			text = text[1:]
		}
		var v int64
		for _, c := range text {
			v = v*10 + int64(c-'0')
		}
		if neg {
			v = -v
		}
		return v
	}
	f, _ := strconv.ParseFloat(string(text), 64) // valid syntax; ±Inf on overflow
	switch {
	case f >= math.MaxInt64:
		return math.MaxInt64
	case f <= math.MinInt64:
		return math.MinInt64
	case integer:
		// Exact for the integers a float64 cannot hold exactly.
		if v, err := strconv.ParseInt(string(text), 10, 64); err == nil {
			return v
		}
	}
	return int64(f)
}
