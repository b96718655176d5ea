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

// errorJSON returns the encoded error envelope.
func errorJSON(status int, msg string) []byte {
	b, _ := json.Marshal(errorBody{Error: errorInfo{Message: msg, Type: errorType(status), Code: status}})
	return b
}

// writeError writes a complete JSON error response.
func writeError(w http.ResponseWriter, status int, msg string) {
	b := errorJSON(status, msg)
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
// response for the error-body kind ("" is json).
func faultErrorBody(kind string, status int) (contentType string, body []byte) {
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
	return "application/json", errorJSON(status, "enginesim: injected fault status="+strconv.Itoa(status))
}

// writeFaultError writes the complete response of the status fault: f.status with the
// error-body kind's body, Content-Length, and Retry-After when retry-after is set.
func writeFaultError(w http.ResponseWriter, f *faults) {
	ct, b := faultErrorBody(f.errorBody, f.status)
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
