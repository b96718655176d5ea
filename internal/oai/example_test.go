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
	// {Model:m Stream:true IncludeUsage:true ContinuousUsage:false HasStreamOptions:true StreamOptionsEnd:109 StreamOptionsEmpty:false User: MaxTokens:0 PromptBytes:2} <nil>
	// param "": invalid json: invalid character 'x' looking for beginning of object key string
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
