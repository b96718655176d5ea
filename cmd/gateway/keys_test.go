package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestKeysHash(t *testing.T) {
	for _, tc := range []struct {
		name, stdin string
		args        []string
		want, err   string
	}{
		{"line", "secret\n", []string{"hash"}, "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\n", ""},
		{"no newline", "secret", []string{"hash"}, "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\n", ""},
		{"crlf", "secret\r\n", []string{"hash"}, "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b\n", ""},
		{"empty", "", []string{"hash"}, "", "no key on stdin"},
		{"argument", "", []string{"hash", "secret"}, "", "on stdin, not as an argument"},
		{"no verb", "", nil, "", "usage: switchboard keys hash"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := keysCommand(tc.args, strings.NewReader(tc.stdin), &out)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || out.String() != tc.want {
				t.Errorf("got %q, %v; want %q", out.String(), err, tc.want)
			}
		})
	}
	var out bytes.Buffer
	if err := keysCommand([]string{"hash", "--generate"}, strings.NewReader(""), &out); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^key: (sk-sb-[A-Za-z0-9_-]{43})\nsha256: ([0-9a-f]{64})\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("--generate printed %q", out.String())
	}
	if hashKey(m[1]) != m[2] {
		t.Errorf("the printed hash is not the key's")
	}
}
