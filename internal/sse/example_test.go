package sse_test

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/switchboard-gw/switchboard/internal/sse"
)

// A proxy loop: forward every complete event as soon as it is whole, and
// look at its data on the way through.
func ExampleScanner() {
	stream := ": keep-alive\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
		"event: note\ndata: line one\ndata: line two\n\n" +
		"data: [DONE]\n\n"
	upstream := strings.NewReader(stream)
	var client bytes.Buffer

	s := sse.NewScanner(0)
	buf := make([]byte, 16) // small reads split events anywhere
	for {
		n, err := upstream.Read(buf)
		client.Write(s.Push(buf[:n], func(e sse.Event) {
			switch {
			case e.Comment:
				fmt.Println("comment")
			case sse.IsDone(e.Data):
				fmt.Println("done")
			default:
				fmt.Printf("event %q data %q\n", e.Name, e.Data)
			}
		}))
		if err == io.EOF {
			client.Write(s.Pending()) // an incomplete last event, forwarded as is
			break
		}
	}
	fmt.Println(client.String() == stream) // byte-identical
	// Output:
	// comment
	// event "" data "{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}"
	// event "note" data "line one\nline two"
	// done
	// true
}
