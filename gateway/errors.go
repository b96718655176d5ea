package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/routing"
)

// OpenAI error types, as the OpenAI API uses them in the error object's
// "type" field.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeTimeout        = "timeout_error"
	TypeUnavailable    = "service_unavailable_error"
)

// StatusClientClosedRequest is the non-standard status (nginx's 499)
// recorded when the client goes away before the response is complete. It
// is never written to the client, which is gone; it only labels the
// request in telemetry and logs.
const StatusClientClosedRequest = 499

// APIError is an error the gateway itself answers with an error object and
// Status: OpenAI's {"error":{"message","type","param","code"}}, or on the
// Anthropic routes {"type":"error","error":{"type","message"}} (the type
// derived from Status).
type APIError struct {
	Status  int    // HTTP status code
	Type    string // OpenAI error type, e.g. invalid_request_error
	Code    string // machine-readable code, e.g. model_not_found; "" is null
	Param   string // the offending request parameter; "" is null
	Message string // lower-case, no trailing period
	Err     error  // the cause, if any
}

// Error returns the message and the cause.
func (e *APIError) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

// Unwrap returns the cause.
func (e *APIError) Unwrap() error { return e.Err }

// openAIError is the wire shape of the error object.
type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// anthropicError is the wire shape of an Anthropic API error
// (https://docs.anthropic.com/en/api/errors).
type anthropicError struct {
	Type  string             `json:"type"` // always "error"
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicType is the Anthropic error type for an HTTP status, as the
// Messages API documents them (529 overloaded_error is given for 503 too).
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnsupportedMediaType, http.StatusMethodNotAllowed, http.StatusRequestTimeout, StatusClientClosedRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}

// body returns the JSON error object for e in the envelope env.
func (e *APIError) body(env envelope) []byte {
	var b []byte
	if env == envAnthropic {
		b, _ = json.Marshal(anthropicError{Type: "error", Error: anthropicErrorBody{Type: anthropicType(e.Status), Message: e.Message}})
		return b
	}
	b, _ = json.Marshal(openAIError{Error: openAIErrorBody{
		Message: e.Message, Type: e.Type, Param: nullable(e.Param), Code: nullable(e.Code),
	}})
	return b
}

// responsesErrorEvent returns the data of a Responses API stream error
// event for e: the event's own fields (type "error", code, message, param)
// and the OpenAI error object under "error" (see writeStreamError).
func (e *APIError) responsesErrorEvent() []byte {
	b, _ := json.Marshal(struct {
		Type    string          `json:"type"`
		Code    *string         `json:"code"`
		Message string          `json:"message"`
		Param   *string         `json:"param"`
		Error   openAIErrorBody `json:"error"`
	}{"error", nullable(e.Code), e.Message, nullable(e.Param),
		openAIErrorBody{Message: e.Message, Type: e.Type, Param: nullable(e.Param), Code: nullable(e.Code)}})
	return b
}

// apiErrorFor maps any error to the APIError answered for it:
//   - an *APIError anywhere in the chain: itself
//   - routing.ErrNoEndpoint, fleet.ErrModelPending: 503 with Retry-After
//     (fleet.ErrModelNotFound is lookupError's: its 404 names the model)
//   - a timeout (net.Error Timeout, context.DeadlineExceeded): 504
//   - anything else reaching an engine: 502
func apiErrorFor(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case errors.Is(err, fleet.ErrModelNotFound):
		// A caller that did not name the model (lookupError does).
		return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "model", Code: "model_not_found", Message: "the model does not exist or is not served by any engine", Err: err}
	case errors.Is(err, fleet.ErrDrained):
		return errDrained("every engine serving the model is drained: it finishes its requests in flight and takes no new ones")
	}
	if errors.Is(err, routing.ErrNoEndpoint) || errors.Is(err, fleet.ErrModelPending) {
		return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "no_healthy_engine", Message: "no healthy engine is available for this model", Err: err}
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return &APIError{Status: http.StatusGatewayTimeout, Type: TypeTimeout, Code: "engine_timeout", Message: "the engine did not answer in time", Err: err}
	}
	return &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: "engine_unreachable", Message: "the engine could not be reached", Err: err}
}

// handlerFunc is a handler that returns the error its client is to get
// instead of writing it: nil when it wrote the response itself.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// door adapts a handlerFunc to net/http: the one place the gateway's
// handlers and middlewares write an error (the recoverer, which has no
// handler to return from, is the other).
func door(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, r, err)
		}
	}
}

// writeError writes err as an error object in the envelope of the request's
// route (OpenAI's unless the route's row says otherwise). When the client has gone
// (context.Canceled) it only sets status 499, without a body: nobody is
// there to read it, but the server span and HTTP metrics record the
// request as client-closed rather than 200.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		writeHeader(w, r, StatusClientClosedRequest)
		return
	}
	ae := apiErrorFor(err)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if ae.Status == http.StatusServiceUnavailable && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	st := stateFrom(r.Context())
	env := envOpenAI
	if st != nil {
		env = st.env
	}
	b := ae.body(env)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if st != nil && st.errType == "" && !st.legAnswer {
		st.errType = cmp.Or(ae.Code, ae.Type)
	}
	writeHeader(w, r, ae.Status)
	_, _ = w.Write(b)
}

// Errors for the request path. Their messages are what the client reads.
var (
	errBodyEmpty = &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Message: "request body is empty"}
)

func errBadRequest(param, msg string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Param: param, Message: msg}
}

func errModelNotFound(model string) *APIError {
	return &APIError{Status: http.StatusNotFound, Type: TypeInvalidRequest, Param: "model", Code: "model_not_found",
		Message: "the model `" + model + "` does not exist or is not served by any engine"}
}

// lookupError maps the error of a fleet lookup (fleet.Fleet.Lookup) of the
// model the client named as model (an alias, not its target) to what is
// answered: fleet.ErrModelNotFound becomes errModelNotFound(model); the
// others (routing.ErrNoEndpoint, fleet.ErrModelPending: 503) go to
// apiErrorFor as they are. nil stays nil.
func lookupError(model string, err error) error {
	switch {
	case errors.Is(err, fleet.ErrModelNotFound):
		return errModelNotFound(model)
	case errors.Is(err, fleet.ErrDrained):
		return errDrained("every engine serving model `" + model + "` is drained: it finishes its requests in flight and takes no new ones")
	}
	return err
}

// errDrained is the 503 when every engine that could serve a request is
// drained (the admin API's drain, or its discovery source reports it not
// ready): not "no healthy engine", which would send the operator looking
// for a failure.
func errDrained(msg string) *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: "engines_drained", Message: msg}
}

// errOverloaded is the 503 for a request over a gateway-wide budget
// (concurrent requests, buffered bytes); it comes with Retry-After.
func errOverloaded(msg string) *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: ErrTypeOverloaded, Message: msg}
}

// errBodyTimeout is the 408 for a body not received within
// Config.BodyReadTimeout; the connection is closed after it.
func errBodyTimeout(d time.Duration) *APIError {
	return &APIError{Status: http.StatusRequestTimeout, Type: TypeTimeout, Code: "body_read_timeout",
		Message: "the request body was not received within " + d.String()}
}

func errBodyTooLarge(limit int64) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: "request_too_large",
		Message: "request body is larger than " + strconv.FormatInt(limit, 10) + " bytes"}
}

// Engine-facing error types (the error.type attribute). The vocabulary is
// fixed so metric cardinality stays bounded; an engine's HTTP error status
// is recorded as its decimal code ("503").
const (
	ErrTypeClientCancelled  = "client_cancelled"
	ErrTypeClientStalled    = "client_stalled" // stopped reading for Timeouts.ClientWrite
	ErrTypeConnect          = "connect_error"
	ErrTypeEngineDisconnect = "engine_disconnect"
	ErrTypeHeaderTimeout    = "header_timeout"
	ErrTypeIdleTimeout      = "idle_timeout"
	ErrTypeRequestTimeout   = "request_timeout"
	ErrTypeStreamError      = "stream_error"
	ErrTypeFirstToken       = "first_token_timeout" // no first content within Timeouts.FirstToken
	ErrTypeAttemptTimeout   = "attempt_timeout"     // a non-streaming attempt over Timeouts.Attempt
	ErrTypeShutdown         = "server_shutdown"     // cut at the shutdown deadline
	ErrTypeOverloaded       = "gateway_overloaded"  // a gateway-wide budget was full (no attempt is made)
	ErrTypePanic            = "panic"
	ErrTypeBadResponse      = "bad_response" // a 2xx answer the gateway must read and cannot (a prefill reply that is not a JSON object)
	ErrTypeInternal         = "_OTHER"
)
