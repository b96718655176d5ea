package gateway

import (
	"sync/atomic"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

// streamEnd says how a route's SSE stream ends when it is complete.
type streamEnd uint8

const (
	// endAtEOF: the stream is complete when the engine ends the body
	// cleanly (any stream that has no terminator of its own).
	endAtEOF streamEnd = iota
	// endDone: OpenAI's chat and completions streams end with the event
	// `data: [DONE]`; a body that ends without it was cut.
	endDone
)

// operation is one proxied route: its path (on the gateway and on the
// engine), the parser's operation and how its streams end.
type operation struct {
	op   oai.Operation
	path string
	end  streamEnd
}

// operations are the proxied routes. Every one is POST with a JSON body.
var operations = []*operation{
	{op: oai.OpChat, path: "/v1/chat/completions", end: endDone},
	{op: oai.OpCompletion, path: "/v1/completions", end: endDone},
	{op: oai.OpEmbeddings, path: "/v1/embeddings", end: endAtEOF},
}

// budget is a gateway-wide byte budget shared by all requests
// (Config.MaxBufferedBytes). It is always counted; limit 0 means take never
// fails.
type budget struct {
	limit int64
	used  atomic.Int64
}

// take reserves n bytes and reports whether they fit under the limit;
// when they do not, nothing is reserved.
func (b *budget) take(n int64) bool {
	if v := b.used.Add(n); b.limit > 0 && v > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n reserved bytes.
func (b *budget) give(n int64) { b.used.Add(-n) }
