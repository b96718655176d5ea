package gateway

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// A request too long for its model, the gateway's check and the engine's:
// a request whose max_tokens alone is over the model's max_model_len
// (fleet.Route.MaxModelLen, from GET /v1/models) is answered 400 before
// any engine slot is taken, as vLLM would answer it; an engine's own
// context-length 400 is recognised by its message, so that it can go to a
// longer-context model (models.context_fallbacks) instead of failing. A
// 400 is never retried on the same model (retry.go): it would fail again.

// contextLengthText is in every context-length error vLLM answers
// ("This model's maximum context length is 8192 tokens. However, you
// requested ...", serving_engine.py's _validate_input; newer versions:
// "'max_tokens' or 'max_completion_tokens' is too large: 9000. This
// model's maximum context length is ..."), and in OpenAI's.
var contextLengthText = []byte("maximum context length")

// maxContextPeek is how much of an engine's 400 body is read to find
// contextLengthText: vLLM's error object is a few hundred bytes.
const maxContextPeek = 4 << 10

// isContextLengthError reports whether resp, an engine's answer whose body
// has not been read, is a context-length error: status 400 and
// contextLengthText in the first maxContextPeek bytes of its body. The
// bytes read are put back: resp.Body still reads the whole body, for the
// client when the error is passed through.
func isContextLengthError(resp *http.Response) bool {
	if resp.StatusCode != http.StatusBadRequest {
		return false
	}
	buf := make([]byte, maxContextPeek)
	n, _ := io.ReadFull(resp.Body, buf)
	buf = buf[:n]
	resp.Body = peekedBody{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	return bytes.Contains(buf, contextLengthText)
}

// peekedBody is a body with its first bytes read and put back in front.
type peekedBody struct {
	io.Reader
	io.Closer
}

// overContext returns the 400 for a request whose max_tokens (maxTokens,
// read from the field param) alone is over its model's context length
// maxLen, both in tokens; nil when it fits or either is unknown (0). The
// message is in vLLM's words (and so capitalised and ending in a period,
// unlike the gateway's own), so that clients that recognise vLLM's or
// OpenAI's context-length error recognise it too; its code is OpenAI's
// context_length_exceeded.
func overContext(param string, maxTokens, maxLen int64) *APIError {
	if maxTokens <= 0 || maxLen <= 0 || maxTokens <= maxLen {
		return nil
	}
	return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: param, Code: "context_length_exceeded",
		Message: "'" + param + "' is too large: " + strconv.FormatInt(maxTokens, 10) +
			". This model's maximum context length is " + strconv.FormatInt(maxLen, 10) + " tokens."}
}
