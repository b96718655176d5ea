package routing_test

import (
	"context"
	"fmt"
	"net/url"

	"github.com/switchboard-gw/switchboard/routing"
)

func ExampleRoundRobin_Pick() {
	var eps []*routing.Endpoint
	for _, name := range []string{"a", "b"} {
		u, _ := url.Parse("http://" + name + ".internal:8000")
		eps = append(eps, routing.NewEndpoint(name, u))
	}
	p := routing.NewRoundRobin()
	for range 3 {
		e, _ := p.Pick(context.Background(), &routing.Request{Model: "m"}, eps)
		fmt.Println(e.Name())
	}
	// Output:
	// a
	// b
	// a
}

func ExampleSlot() {
	u, _ := url.Parse("http://e1.internal:8000")
	e := routing.NewEndpoint("e1", u)
	var s routing.Slot
	s.Acquire(e)
	defer s.Release()
	s.Promote() // first token seen
	pf, dc := e.InFlight()
	fmt.Println(pf, dc)
	// Output: 0 1
}
