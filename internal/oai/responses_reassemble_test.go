package oai

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestResponsesReassembler: the body is the terminal event's response
// object; the error and response.failed events are StreamErrors; bad data
// is ErrMalformedChunk; SetModel renames the model.
func TestResponsesReassembler(t *testing.T) {
	resp := `{"id":"resp_1","object":"response","model":"m","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"hi"}]}],"usage":{"input_tokens":2,"output_tokens":1,"total_tokens":3}}`
	events := []string{
		`{"response":{"id":"resp_1","model":"m","status":"in_progress","output":[]},"sequence_number":0,"type":"response.created"}`,
		`{"content_index":0,"delta":"hi","item_id":"msg_1","output_index":0,"sequence_number":1,"type":"response.output_text.delta"}`,
		`{"response":` + resp + `,"sequence_number":2,"type":"response.completed"}`,
	}
	var r ResponsesReassembler
	for i, ev := range events {
		if r.Finished() {
			t.Fatalf("finished before event %d", i)
		}
		if err := r.Add([]byte(ev)); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if !r.Finished() || string(r.Body()) != resp {
		t.Fatalf("finished %v body %s", r.Finished(), r.Body())
	}
	r.SetModel([]byte(`"b"`))
	var got map[string]json.RawMessage
	if err := json.Unmarshal(r.Body(), &got); err != nil || string(got["model"]) != `"b"` || string(got["id"]) != `"resp_1"` {
		t.Errorf("with SetModel: %s", r.Body())
	}

	for _, tc := range []struct {
		name, data string
		msg        string
		code       int
		malformed  bool
	}{
		{"error event", `{"type":"error","code":"InternalServerError","message":"Internal server error","param":null,"sequence_number":5}`, "Internal server error", 500, false},
		{"failed", `{"type":"response.failed","sequence_number":5,"response":{"id":"r","status":"failed","error":{"code":"server_error","message":"boom"}}}`, "boom", 0, false},
		{"not json", `{"type":`, "", 0, true},
		{"completed without a response", `{"type":"response.completed","response":null}`, "", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r ResponsesReassembler
			err := r.Add([]byte(tc.data))
			var se *StreamError
			switch {
			case tc.malformed:
				if !errors.Is(err, ErrMalformedChunk) {
					t.Errorf("err %v, want ErrMalformedChunk", err)
				}
			case !errors.As(err, &se):
				t.Fatalf("err %v, want a StreamError", err)
			default:
				var body struct {
					Error struct{ Message string } `json:"error"`
				}
				if se.Message != tc.msg || se.Code != tc.code || json.Unmarshal(se.Body, &body) != nil || body.Error.Message != tc.msg {
					t.Errorf("StreamError %+v body %s, want message %q code %d", se, se.Body, tc.msg, tc.code)
				}
			}
			if r.Finished() || r.Body() != nil {
				t.Errorf("finished %v body %s after an error", r.Finished(), r.Body())
			}
			if again := r.Add([]byte(events[2])); again != err {
				t.Errorf("Add after the error: %v, want the same error", again)
			}
		})
	}
}

// FuzzResponsesReassembler: Add never panics, and Body is a JSON object
// once finished.
func FuzzResponsesReassembler(f *testing.F) {
	f.Add([]byte(`{"type":"response.completed","response":{"id":"r"}}`))
	f.Add([]byte(`{"type":"error","code":"x","message":"y"}`))
	f.Add([]byte(`{"type":"response.failed","response":{"error":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r ResponsesReassembler
		_ = r.Add(data)
		if r.Finished() && !json.Valid(r.Body()) {
			t.Errorf("body %q is not JSON", r.Body())
		}
	})
}
