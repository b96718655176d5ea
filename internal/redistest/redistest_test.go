package redistest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("ping after Start: %v", err)
	}
	s.Stop()
	if err := ping(s.Addr()); err == nil {
		t.Fatal("ping answered after Stop")
	}
	s.Stop() // a stopped server: nothing to do
	s.Restart()
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("ping after Restart: %v", err)
	}
	s.Restart() // a running server: stopped, then started
	if err := ping(s.Addr()); err != nil {
		t.Fatalf("ping after a second Restart: %v", err)
	}
}
