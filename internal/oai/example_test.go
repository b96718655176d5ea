package oai_test

import (
	"errors"
	"fmt"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

func ExampleParseRequest() {
	r, err := oai.ParseRequest(oai.OpChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`))
	fmt.Printf("%+v %v\n", r, err)

	_, err = oai.ParseRequest(oai.OpChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true, x}`))
	var re *oai.RequestError
	if errors.As(err, &re) {
		fmt.Printf("param %q: %s\n", re.Param, re.Message)
	}
	// Output:
	// {Model:m Stream:true IncludeUsage:true ContinuousUsage:false HasStreamOptions:true StreamOptionsEnd:109 StreamOptionsEmpty:false User: MaxTokens:0 PromptBytes:2 PrefixHashes:[]} <nil>
	// param "": invalid json: invalid character 'x' looking for beginning of object key string
}

// Two conversations with the same system prompt share their leading prefix
// hashes, whatever the key order, so a prefix-aware policy can send the
// second to the engine that already holds that prefix in its KV cache.
func ExampleParser_Parse() {
	p := oai.Parser{BlockBytes: 16, MaxBlocks: 256}
	system := `{"role":"system","content":"You are the support assistant for the Switchboard gateway."}`
	a, _ := p.Parse(oai.OpChat, []byte(`{"model":"m","messages":[`+system+`,{"role":"user","content":"What is TTFT?"}]}`))
	b, _ := p.Parse(oai.OpChat, []byte(`{"messages":[`+system+`,{"content":"How do I add an engine?","role":"user"}],"model":"m"}`))
	c, _ := p.Parse(oai.OpChat, []byte(`{"model":"other","messages":[`+system+`,{"role":"user","content":"What is TTFT?"}]}`))

	shared := func(x, y []uint64) int {
		n := 0
		for n < len(x) && n < len(y) && x[n] == y[n] {
			n++
		}
		return n
	}
	fmt.Println("blocks:", len(a.PrefixHashes), len(b.PrefixHashes), len(c.PrefixHashes))
	fmt.Println("a and b share:", shared(a.PrefixHashes, b.PrefixHashes))
	fmt.Println("a and c share:", shared(a.PrefixHashes, c.PrefixHashes))
	// Output:
	// blocks: 5 5 5
	// a and b share: 4
	// a and c share: 0
}

func ExampleInspectChunk() {
	for _, data := range []string{
		`{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}`,
		`{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}}`,
	} {
		c, err := oai.InspectChunk([]byte(data))
		fmt.Printf("id=%s content=%v finish=%v usage=%v %+v err=%v\n", c.ID, c.Content, c.Finish, c.HasUsage, c.Usage, err)
	}
	// Output:
	// id=c1 content=false finish=false usage=false {PromptTokens:0 CompletionTokens:0 TotalTokens:0} err=<nil>
	// id=c1 content=true finish=false usage=false {PromptTokens:0 CompletionTokens:0 TotalTokens:0} err=<nil>
	// id=c1 content=false finish=true usage=false {PromptTokens:0 CompletionTokens:0 TotalTokens:0} err=<nil>
	// id=c1 content=false finish=false usage=true {PromptTokens:9 CompletionTokens:6 TotalTokens:15} err=<nil>
}
