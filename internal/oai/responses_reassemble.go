package oai

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// ResponsesReassembler answers a non-streaming Responses API request from
// the engine's stream (POST /v1/responses with "stream": true): the
// stream's terminal event carries the whole response object, the same one
// vLLM returns for the non-streaming request (both are built by
// ResponsesResponse.from_request in vllm/entrypoints/openai/responses/
// serving.py), so the body is that object:
//
//   - response.completed (status "completed", or "incomplete" with
//     incomplete_details when the length ran out) and response.incomplete:
//     the body is the event's "response";
//   - response.failed: a [StreamError] with the response's error message
//     and code (Code 0: its codes are not HTTP statuses);
//   - the "error" event (OpenAI's ResponseErrorEvent {type, code,
//     message, param, sequence_number}, as vLLM sends when generation
//     fails): a [StreamError] with its message; Code is the HTTP status
//     its code names when it names one of vLLM's error types (as
//     "InternalServerError": 500), else 0.
//
// The other events are not kept, so memory is bounded by the terminal
// event. The zero value is ready to use; it is not safe for concurrent
// use.
type ResponsesReassembler struct {
	resp     []byte // the terminal event's response object
	model    []byte // a model to name instead (SetModel), raw JSON
	finished bool
	err      error
}

// Add merges the data of one event. It returns the [StreamError] of an
// error or response.failed event, an error wrapping [ErrMalformedChunk]
// for data that is not a JSON object or a terminal event without a
// response object; after an error, or once finished, Add returns that
// error (or nil) and keeps nothing more.
func (r *ResponsesReassembler) Add(data []byte) error {
	if r.err != nil || r.finished {
		return r.err
	}
	var ev struct {
		Type     string          `json:"type"`
		Response json.RawMessage `json:"response"`
		Code     json.RawMessage `json:"code"`
		Message  json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return r.fail(malformedf("%v", err))
	}
	switch ev.Type {
	case "response.completed", "response.incomplete":
		if len(ev.Response) == 0 || ev.Response[0] != '{' {
			return r.fail(fmt.Errorf("%w: %s without a response object", ErrMalformedChunk, ev.Type))
		}
		r.resp = append(r.resp[:0], ev.Response...)
		r.finished = true
	case "response.failed":
		var f struct {
			Error *struct {
				Code    json.RawMessage `json:"code"`
				Message string          `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(ev.Response, &f)
		se := &StreamError{Message: "the response failed"}
		if f.Error != nil && f.Error.Message != "" {
			se.Message = f.Error.Message
		}
		se.Body = errorBody(se.Message, "server_error")
		return r.fail(se)
	case "error":
		var msg, code string
		_ = json.Unmarshal(ev.Message, &msg)
		_ = json.Unmarshal(ev.Code, &code)
		se := &StreamError{Message: msg, Code: statusOfType(code)}
		se.Body = errorBody(msg, code)
		return r.fail(se)
	}
	return nil
}

// errorBody builds {"error":{"message","type","param","code"}}.
func errorBody(msg, typ string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": nil}})
	return b
}

// statusOfType returns the HTTP status of one of vLLM's error type names
// (vllm/entrypoints/openai/protocol.py ErrorInfo types, as
// create_error_response names them from HTTPStatus phrases:
// "InternalServerError", "BadRequestError", ...), 0 for another.
func statusOfType(t string) int {
	switch t {
	case "BadRequestError":
		return 400
	case "NotFoundError":
		return 404
	case "InternalServerError":
		return 500
	case "ServiceUnavailableError":
		return 503
	}
	if n, err := strconv.Atoi(t); err == nil && n >= 400 && n <= 599 {
		return n
	}
	return 0
}

func (r *ResponsesReassembler) fail(err error) error {
	r.err = err
	r.resp = nil
	return err
}

// Held returns the bytes the ResponsesReassembler keeps: the terminal
// event's response object (the other events are not kept).
func (r *ResponsesReassembler) Held() int { return len(r.resp) }

// Finished reports whether the terminal event with the whole response has
// been added.
func (r *ResponsesReassembler) Finished() bool { return r.finished }

// SetModel makes the body name raw (a JSON string) as its "model": the
// model that finished the answer, when another one began it.
func (r *ResponsesReassembler) SetModel(raw []byte) { r.model = append(r.model[:0], raw...) }

// Body returns the response object (nil before Finished); with SetModel,
// its "model" replaced (the members are then in sorted order).
func (r *ResponsesReassembler) Body() []byte {
	if !r.finished {
		return nil
	}
	if r.model == nil {
		return r.resp
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(r.resp, &m) != nil {
		return r.resp
	}
	m["model"] = r.model
	b, err := json.Marshal(m)
	if err != nil {
		return r.resp
	}
	return b
}
