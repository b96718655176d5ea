package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
)

// timeoutErr is a net.Error that timed out.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// TestClassify is classify's table: what the client leaving, a shutdown,
// each gateway timer, a failed dial, a network timeout and an engine that
// drops the connection become (error.type, status, code).
func TestClassify(t *testing.T) {
	s := &Server{}
	cancelledBy := func(cause error) context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		return ctx
	}
	live := context.Background()
	tests := []struct {
		name       string
		client     context.Context // the client request's context
		attempt    context.Context
		err        error
		wantType   string
		wantStatus int
		wantCode   string
	}{
		{"client gone wins over everything", cancelledBy(context.Canceled), cancelledBy(errHeaderTimeout), errHeaderTimeout, ErrTypeClientCancelled, StatusClientClosedRequest, ""},
		{"shutdown", cancelledBy(errServerShutdown), live, io.EOF, ErrTypeShutdown, http.StatusServiceUnavailable, ErrTypeShutdown},
		{"header timeout", live, cancelledBy(errHeaderTimeout), errHeaderTimeout, ErrTypeHeaderTimeout, http.StatusGatewayTimeout, ErrTypeHeaderTimeout},
		{"first-token timeout", live, cancelledBy(errFirstTokenTimeout), context.Canceled, ErrTypeFirstToken, http.StatusGatewayTimeout, ErrTypeFirstToken},
		{"attempt timeout", live, cancelledBy(errAttemptTimeout), errAttemptTimeout, ErrTypeAttemptTimeout, http.StatusGatewayTimeout, ErrTypeAttemptTimeout},
		{"idle timeout", live, cancelledBy(errIdleTimeout), errIdleTimeout, ErrTypeIdleTimeout, http.StatusGatewayTimeout, ErrTypeIdleTimeout},
		{"request timeout", live, cancelledBy(errRequestTimeout), context.DeadlineExceeded, ErrTypeRequestTimeout, http.StatusGatewayTimeout, ErrTypeRequestTimeout},
		{"an EOF a timer merely followed is the engine's", live, cancelledBy(errHeaderTimeout), io.EOF, ErrTypeEngineDisconnect, http.StatusBadGateway, ErrTypeEngineDisconnect},
		{"refused connection", live, live, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, ErrTypeConnect, http.StatusBadGateway, "engine_unreachable"},
		{"connect timeout", live, live, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}, ErrTypeConnect, http.StatusGatewayTimeout, "engine_connect_timeout"},
		{"a read that timed out", live, live, &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, ErrTypeRequestTimeout, http.StatusGatewayTimeout, "engine_timeout"},
		{"the engine dropped the connection", live, live, io.ErrUnexpectedEOF, ErrTypeEngineDisconnect, http.StatusBadGateway, ErrTypeEngineDisconnect},
		{"a reset", live, live, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, ErrTypeEngineDisconnect, http.StatusBadGateway, ErrTypeEngineDisconnect},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil).WithContext(tc.client)
			et, ae := s.classify(r, tc.attempt, tc.err)
			if et != tc.wantType || ae.Status != tc.wantStatus || ae.Code != tc.wantCode {
				t.Errorf("classify = %q, %d %q; want %q, %d %q", et, ae.Status, ae.Code, tc.wantType, tc.wantStatus, tc.wantCode)
			}
			if tc.wantType == ErrTypeClientCancelled && !errors.Is(ae, context.Canceled) {
				t.Errorf("a client that left: %v does not wrap context.Canceled (writeError then answers 499 with no body)", ae)
			}
		})
	}
}
