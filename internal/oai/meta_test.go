package oai

import "testing"

// TestModelAndFinishReason checks the response model and finish reason the
// gateway puts on its GenAI spans and metrics, in every framing.
func TestModelAndFinishReason(t *testing.T) {
	c, err := InspectChunk([]byte(`{"id":"c","model":"m-1","choices":[{"index":0,"delta":{},"finish_reason":"length"},{"index":1,"delta":{},"finish_reason":null}]}`))
	if err != nil || string(c.Model) != "m-1" || string(c.FinishReason) != "length" || !c.Finish {
		t.Errorf("chunk: %+v, %v", c, err)
	}
	c, _ = InspectChunk([]byte(`{"model":7,"choices":[{"delta":{"content":"x"},"finish_reason":null}]}`))
	if c.Model != nil || c.FinishReason != nil || c.Finish {
		t.Errorf("chunk without model or finish: %+v", c)
	}
	b, ok := ParseBody([]byte(`{"id":"x","object":"chat.completion","model":"m-2","choices":[{"message":{"content":"a"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	if !ok || b.ID != "x" || string(b.Model) != "m-2" || string(b.FinishReason) != "stop" || b.Usage.PromptTokens != 3 {
		t.Errorf("body: %+v %v", b, ok)
	}
	b, ok = ParseBody([]byte(`{"id":"msg","type":"message","model":"claude","stop_reason":"end_turn","usage":{"input_tokens":2,"output_tokens":5}}`))
	if !ok || string(b.Model) != "claude" || string(b.FinishReason) != "end_turn" || b.Usage.CompletionTokens != 5 {
		t.Errorf("anthropic body: %+v %v", b, ok)
	}
	e, err := InspectAnthropicEvent([]byte(`{"type":"message_start","message":{"id":"msg_1","model":"claude","usage":{"input_tokens":4}}}`))
	if err != nil || string(e.Model) != "claude" || string(e.ID) != "msg_1" {
		t.Errorf("message_start: %+v %v", e, err)
	}
	e, _ = InspectAnthropicEvent([]byte(`{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":9}}`))
	if string(e.FinishReason) != "max_tokens" || e.OutputTokens != 9 || e.Content {
		t.Errorf("message_delta: %+v", e)
	}
	e, _ = InspectResponsesEvent([]byte(`{"type":"response.created","response":{"id":"resp_1","model":"m-3","status":"in_progress"}}`))
	if string(e.Model) != "m-3" || string(e.ID) != "resp_1" {
		t.Errorf("response.created: %+v", e)
	}
}
