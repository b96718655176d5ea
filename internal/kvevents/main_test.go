package kvevents

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind. The one ignored
// is the writer of the tests' own PUB sockets (the fake engines): zmq4
// v0.17.0 starts it in NewPub and its Close never stops it. The subscriber
// uses only SUB and DEALER sockets, which have no such goroutine.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}
