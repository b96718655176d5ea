package enginesim

import (
	"encoding/json"
	"net/http"
	"strconv"
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
