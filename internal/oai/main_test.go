package oai

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind (the reassembly
// differential test serves a simulated engine over loopback).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
