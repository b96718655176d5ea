package enginesim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// errorBody is vLLM's OpenAI-compatible error envelope:
// {"error":{"message":"...","type":"...","param":null,"code":404}}.
type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// errorType returns the error type vLLM uses for status.
func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusUnauthorized:
		return "AuthenticationError"
	case http.StatusForbidden:
		return "PermissionDeniedError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusMethodNotAllowed:
		return "MethodNotAllowedError"
	case http.StatusUnprocessableEntity:
		return "UnprocessableEntityError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	if status < 500 {
		return "BadRequestError"
	}
	return "InternalServerError"
}

// writeError writes a complete JSON error response in vLLM's OpenAI envelope.
func writeError(w http.ResponseWriter, status int, msg string) {
	apiOpenAI.writeError(w, status, msg)
}

// api is the error envelope a route answers in: vLLM's OpenAI-compatible one, or Anthropic's
// on /v1/messages and /v1/messages/count_tokens.
type api int

const (
	apiOpenAI api = iota
	apiAnthropic
)

// anthropicError is Anthropic's error envelope: {"type":"error","error":{"type":...,"message":...}}.
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorInfo `json:"error"`
}

type anthropicErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicErrorType returns Anthropic's error type for status.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// errorJSON returns the encoded error envelope of a for status; typ "" picks the type from
// the status.
func (a api) errorJSON(status int, typ, msg string) []byte {
	var b []byte
	if a == apiAnthropic {
		if typ == "" {
			typ = anthropicErrorType(status)
		}
		b, _ = json.Marshal(anthropicError{Type: "error", Error: anthropicErrorInfo{Type: typ, Message: msg}})
		return b
	}
	if typ == "" {
		typ = errorType(status)
	}
	b, _ = json.Marshal(errorBody{Error: errorInfo{Message: msg, Type: typ, Code: status}})
	return b
}

// writeError writes a complete JSON error response, its type chosen by the status.
func (a api) writeError(w http.ResponseWriter, status int, msg string) {
	a.writeTypedError(w, status, "", msg)
}

// writeTypedError writes a complete JSON error response of type typ ("" picks it from the
// status), for the errors whose type vLLM spells out (invalid_request_error, InvalidUserInput).
func (a api) writeTypedError(w http.ResponseWriter, status int, typ, msg string) {
	b := a.errorJSON(status, typ, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// InternalPath is the server-side file path in the html and text error bodies of the
// error-body fault: an internal detail that a gateway in front of the engine must not show
// its clients.
const InternalPath = "/srv/vllm/worker.py"

// faultTraceback is the Python traceback in the html and text error bodies.
const faultTraceback = "Traceback (most recent call last):\n" +
	"  File \"" + InternalPath + "\", line 42, in execute_model\n" +
	"    output = self.model_runner.execute_model(scheduler_output)\n" +
	"RuntimeError: CUDA error: an illegal memory access was encountered\n"

// faultErrorBody returns the Content-Type ("" for none) and body of the status fault's
// response for the error-body kind ("" is json, in the route's envelope a).
func faultErrorBody(a api, kind string, status int) (contentType string, body []byte) {
	title := strings.TrimSpace(strconv.Itoa(status) + " " + http.StatusText(status))
	switch kind {
	case errorBodyHTML:
		return "text/html; charset=utf-8", []byte("<html><head><title>" + title + "</title></head><body><h1>" + title +
			"</h1><pre>" + faultTraceback + "</pre></body></html>\n")
	case errorBodyText:
		return "text/plain; charset=utf-8", []byte(faultTraceback)
	case errorBodyEmpty:
		return "", nil
	}
	return "application/json", a.errorJSON(status, "", "enginesim: injected fault status="+strconv.Itoa(status))
}

// writeFaultError writes the complete response of the status fault: f.status with the
// error-body kind's body (json in the route's envelope a), Content-Length, and Retry-After
// when retry-after is set.
func writeFaultError(w http.ResponseWriter, a api, f *faults) {
	ct, b := faultErrorBody(a, f.errorBody, f.status)
	h := w.Header()
	if ct != "" {
		h.Set("Content-Type", ct)
	}
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if f.retryAfter >= 0 {
		h.Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	w.WriteHeader(f.status)
	_, _ = w.Write(b)
}
