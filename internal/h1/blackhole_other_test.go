//go:build !linux

package h1

import "testing"

// blackhole needs Linux's listen backlog semantics.
func blackhole(t *testing.T) string {
	t.Skip("needs Linux's listen backlog semantics")
	return ""
}
