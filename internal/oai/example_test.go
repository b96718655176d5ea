package oai_test

import (
	"errors"
	"fmt"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

func ExampleParseRequest() {
	r, err := oai.ParseRequest(oai.SchemaChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`))
	fmt.Printf("%+v %v\n", r, err)

	_, err = oai.ParseRequest(oai.SchemaChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true, x}`))
	var re *oai.RequestError
	if errors.As(err, &re) {
		fmt.Printf("param %q: %s\n", re.Param, re.Message)
	}
	// Output:
	// {Model:m ModelStart:9 ModelEnd:12 Stream:true StreamStart:66 StreamEnd:70 Streamable:true KVTransfer:false PromptBatch:false EchoLogprobs:false Sampling:{Temperature:[] TopP:[] TopK:[] FrequencyPenalty:[] PresencePenalty:[] Seed:[] N:[] Stop:[] StopSequences:[] ResponseFormat:[]} IncludeUsage:true ContinuousUsage:false HasStreamOptions:true StreamOptionsEnd:109 StreamOptionsEmpty:false User: MaxTokens:0 MaxTokensParam: PromptBytes:2 PrefixHashes:[]} <nil>
	// param "": invalid json: invalid character 'x' looking for beginning of object key string
}

// Two conversations with the same system prompt share their leading prefix
// hashes, whatever the key order, so a prefix-aware policy can send the
// second to the engine that already holds that prefix in its KV cache.
func ExampleParser_Parse() {
	p := oai.Parser{BlockBytes: 16, MaxBlocks: 256}
	system := `{"role":"system","content":"You are the support assistant for the Switchboard gateway."}`
	a, _ := p.Parse(oai.SchemaChat, []byte(`{"model":"m","messages":[`+system+`,{"role":"user","content":"What is TTFT?"}]}`))
	b, _ := p.Parse(oai.SchemaChat, []byte(`{"messages":[`+system+`,{"content":"How do I add an engine?","role":"user"}],"model":"m"}`))
	c, _ := p.Parse(oai.SchemaChat, []byte(`{"model":"other","messages":[`+system+`,{"role":"user","content":"What is TTFT?"}]}`))

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
	// id=c1 content=false finish=false usage=false {PromptTokens:0 CompletionTokens:0 TotalTokens:0 CachedTokens:0 HasCached:false} err=<nil>
	// id=c1 content=true finish=false usage=false {PromptTokens:0 CompletionTokens:0 TotalTokens:0 CachedTokens:0 HasCached:false} err=<nil>
	// id=c1 content=false finish=true usage=false {PromptTokens:0 CompletionTokens:0 TotalTokens:0 CachedTokens:0 HasCached:false} err=<nil>
	// id=c1 content=false finish=false usage=true {PromptTokens:9 CompletionTokens:6 TotalTokens:15 CachedTokens:0 HasCached:false} err=<nil>
}

// A route table holds a Schema per route; the gateway parses each body
// with its route's schema.
func ExampleParser_Parse_schemas() {
	routes := map[string]*oai.Schema{
		"/v1/chat/completions": oai.SchemaChat,
		"/v1/messages":         oai.SchemaMessages,
		"/v1/rerank":           oai.SchemaRerank,
	}
	p := oai.Parser{BlockBytes: 16}
	for _, rq := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"claude-like","system":"Be terse.","max_tokens":64,"metadata":{"user_id":"u-7"},"messages":[{"role":"user","content":"What is a KV cache?"}]}`},
		{"/v1/rerank", `{"query":"kv cache","documents":["a","b"]}`},
		{"/v1/rerank", `{"model":"bge","query":"kv cache"}`},
	} {
		r, err := p.Parse(routes[rq.path], []byte(rq.body))
		if err != nil {
			fmt.Println(rq.path, "error:", err)
			continue
		}
		fmt.Printf("%s model=%q at [%d:%d] user=%q max_tokens=%d prompt_bytes=%d hashes=%d\n",
			rq.path, r.Model, r.ModelStart, r.ModelEnd, r.User, r.MaxTokens, r.PromptBytes, len(r.PrefixHashes))
	}
	// Output:
	// /v1/messages model="claude-like" at [9:22] user="u-7" max_tokens=64 prompt_bytes=28 hashes=1
	// /v1/rerank model="" at [0:0] user="" max_tokens=0 prompt_bytes=0 hashes=0
	// /v1/rerank error: documents is required
}

func ExampleInspectAnthropicEvent() {
	for _, data := range []string{
		`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":25,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}`,
		`{"type":"message_stop"}`,
	} {
		e, err := oai.InspectAnthropicEvent([]byte(data))
		fmt.Printf("%s content=%v terminal=%v id=%q in=%d out=%d err=%v\n", e.Type, e.Content, e.Terminal, e.ID, e.InputTokens, e.OutputTokens, err)
	}
	// Output:
	// message_start content=false terminal=false id="msg_1" in=25 out=1 err=<nil>
	// content_block_start content=false terminal=false id="" in=-1 out=-1 err=<nil>
	// content_block_delta content=true terminal=false id="" in=-1 out=-1 err=<nil>
	// message_delta content=false terminal=false id="" in=-1 out=15 err=<nil>
	// message_stop content=false terminal=true id="" in=-1 out=-1 err=<nil>
}

func ExampleInspectResponsesEvent() {
	for _, data := range []string{
		`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","usage":null}}`,
		`{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`,
		`{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","status":"completed","usage":{"input_tokens":12,"output_tokens":7,"total_tokens":19}}}`,
	} {
		e, err := oai.InspectResponsesEvent([]byte(data))
		fmt.Printf("%s content=%v terminal=%v id=%q in=%d out=%d err=%v\n", e.Type, e.Content, e.Terminal, e.ID, e.InputTokens, e.OutputTokens, err)
	}
	// Output:
	// response.created content=false terminal=false id="resp_1" in=-1 out=-1 err=<nil>
	// response.output_text.delta content=true terminal=false id="" in=-1 out=-1 err=<nil>
	// response.completed content=false terminal=true id="resp_1" in=12 out=7 err=<nil>
}

func ExampleParseForm() {
	body := "--XyZ\r\n" +
		"Content-Disposition: form-data; name=\"file\"; filename=\"speech.wav\"\r\n" +
		"Content-Type: audio/wav\r\n\r\n" +
		"RIFF....WAVE\r\n" +
		"--XyZ\r\n" +
		"Content-Disposition: form-data; name=\"model\"\r\n\r\n" +
		"whisper\r\n" +
		"--XyZ--\r\n"
	f, err := oai.ParseForm([]byte(body), "multipart/form-data; boundary=XyZ", "file")
	fmt.Printf("%+v %v\n", f, err)
	// The offsets let the gateway swap a model alias in place.
	fmt.Printf("%q\n", body[f.ModelStart:f.ModelEnd])

	_, err = oai.ParseForm([]byte(body), "application/json", "file")
	var re *oai.RequestError
	if errors.As(err, &re) {
		fmt.Println(re.HTTPStatus(), re.Message)
	}
	// Output:
	// {Model:whisper ModelStart:171 ModelEnd:178 HasFile:true Stream:false} <nil>
	// "whisper"
	// 415 content type must be multipart/form-data
}

// A non-streaming request sent to the engine as a stream: every event's
// data goes to the Reassembler, and the client gets the body.
func ExampleReassembler() {
	r := oai.NewReassembler(false)
	for _, data := range []string{
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}`,
		`[DONE]`,
	} {
		if err := r.Add([]byte(data)); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(r.Finished())
	fmt.Printf("%s\n", r.Body())

	r.Reset(false)
	err := r.Add([]byte(`{"error":{"message":"The engine died.","type":"InternalServerError","param":null,"code":500}}`))
	var se *oai.StreamError
	if errors.As(err, &se) {
		fmt.Println(se.Code, se.Message)
	}
	// Output:
	// true
	// {"id":"c1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}
	// 500 The engine died.
}
