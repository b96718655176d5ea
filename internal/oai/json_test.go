package oai

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func sprint(v any) string { return fmt.Sprintf("%+v", v) }

// decoderValid reports whether decoder accepts data as one JSON document.
func decoderValid(data []byte) bool {
	d := decoder{b: data}
	d.skip()
	d.end()
	return !d.bad
}

func TestDecoderValid(t *testing.T) {
	docs := []string{
		``, ` `, `{}`, `[]`, `""`, `0`, `-0`, `1.5e+10`, `1E-2`, `true`, `false`, `null`,
		`{"a":[1,{"b":null}],"c":"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"}`, " \t\r\n{ \"a\" : [ 1 , 2 ] } \n",
		"\"\xff\xfe\"", "\"\u2028\"",
		`{`, `}`, `[`, `[1,]`, `[,1]`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{,}`, `{"a":1,}`, `{1:2}`,
		`01`, `-`, `-a`, `1.`, `.1`, `1e`, `1e+`, `+1`, `0x1`, `NaN`, `Infinity`, `tru`, `nul`, `True`,
		`"abc`, `"\a"`, `"\u12"`, `"\u12G4"`, "\"\x00\"", "\"\x1f\"", "\"\t\"", `"\`, `[1 2]`, `{"a":1 "b":2}`,
		`{} {}`, `[] x`, "\f1", "1\f", "\xef\xbb\xbf{}", `[1]]`, `{"a":1}}`,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000),
		strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001),
	}
	for _, doc := range docs {
		if got, want := decoderValid([]byte(doc)), json.Valid([]byte(doc)); got != want {
			t.Errorf("decoder valid(%.60q) = %v, json.Valid = %v", doc, got, want)
		}
	}
}

func TestParseInt(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"-0", 0}, {"7", 7}, {"-12", -12}, {"999999999999999999", 999999999999999999},
		{"9223372036854775807", 9223372036854775807}, {"9223372036854775808", 9223372036854775807},
		{"-9223372036854775808", -9223372036854775808}, {"-9223372036854775809", -9223372036854775808},
		{"1.9", 1}, {"-1.9", -1}, {"1e3", 1000}, {"1e400", 9223372036854775807}, {"-1e400", -9223372036854775808},
	} {
		d := decoder{b: []byte(tt.in)}
		text, integer := d.num()
		if got := parseInt(text, integer); got != tt.want || d.bad {
			t.Errorf("parseInt(%q) = %d (bad %v), want %d", tt.in, got, d.bad, tt.want)
		}
	}
}
