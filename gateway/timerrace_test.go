package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// timerRaceTransport is an engine transport that fails only after a
// gateway timer has fired: the round trip (or, with first set, the second
// read of a 200 answer's body, after first) waits until the attempt's
// context is done and then returns err. That is the order a loaded machine
// produces when the engine closes the connection just before a timer
// fires: net/http has the EOF, and the timer's cause is set before the
// gateway classifies the error. With err nil it returns the context's
// cause instead, which is what net/http returns when the cancellation
// itself ended the wait (the timeout really ran out).
type timerRaceTransport struct {
	err   error
	first string // "" = fail the round trip; else the body's first bytes
	ct    string // the answer's Content-Type, with first
}

func (tr timerRaceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		_ = req.Body.Close()
	}
	ctx := req.Context()
	fail := func() error {
		<-ctx.Done()
		if tr.err != nil {
			return tr.err
		}
		return context.Cause(ctx)
	}
	if tr.first == "" {
		return nil, fail()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {tr.ct}},
		ContentLength: -1, Body: &raceBody{first: tr.first, fail: fail}, Request: req}, nil
}

// raceBody returns first, then blocks in fail.
type raceBody struct {
	first string
	fail  func() error
}

func (b *raceBody) Read(p []byte) (int, error) {
	if b.first != "" {
		n := copy(p, b.first)
		b.first = b.first[n:]
		return n, nil
	}
	return 0, b.fail()
}

func (b *raceBody) Close() error { return nil }

// errorCodeOf returns the code of the error a client got: the error
// object's code of a non-200 answer, or of a stream's last event.
func errorCodeOf(t *testing.T, status int, body string) string {
	t.Helper()
	if status == http.StatusOK {
		ev, ok := strings.CutPrefix(string(lastEvent([]byte(body))), "data: ")
		if !ok {
			t.Fatalf("200 whose last event is not data: %q", body)
		}
		body = ev
	}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == "" {
		t.Fatalf("status %d: no error code in %q (%v)", status, body, err)
	}
	return e.Error.Code
}

// TestCloseBeforeHeadersIsDisconnectNotTimeout: a fault is classified by
// what it is, not by which timer wins. An engine that closed the
// connection (io.EOF before headers, a cut or reset body) is an
// engine_disconnect even when a gateway timer fired between the close and
// the classification; only a wait that the timer itself ended is its
// timeout. Every gateway timer that cancels an attempt is covered: the
// response-header timeout, the first-token timeout (as the header wait and
// during the body), the attempt timeout, the request timeout and the idle
// timeout. The transport stub orders the events (it fails only once the
// timer has fired), so nothing depends on scheduling.
func TestCloseBeforeHeadersIsDisconnectNotTimeout(t *testing.T) {
	const tick = 20 * time.Millisecond
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, tc := range []struct {
		name     string
		stream   bool
		timeouts func(*Timeouts)
		first    string // the body's bytes before the failure; "" = no headers
		ct       string
		errs     []error // the engine failures, each a disconnect
		timeout  string  // the timer's error type when it ended the wait
		status   int     // both cases' client status (502 and 504 before headers)
	}{
		{name: "response-header timeout", stream: true,
			timeouts: func(to *Timeouts) { to.ResponseHeader = tick },
			errs:     []error{io.EOF, io.ErrUnexpectedEOF, reset}, timeout: ErrTypeHeaderTimeout},
		{name: "first-token timeout before headers", stream: true,
			timeouts: func(to *Timeouts) { to.FirstToken = tick },
			errs:     []error{io.EOF, reset}, timeout: ErrTypeFirstToken},
		{name: "attempt timeout before headers",
			timeouts: func(to *Timeouts) { to.Attempt = tick },
			errs:     []error{io.EOF, reset}, timeout: ErrTypeAttemptTimeout},
		{name: "request timeout before headers",
			timeouts: func(to *Timeouts) { to.Request = tick },
			errs:     []error{io.EOF, reset}, timeout: ErrTypeRequestTimeout},
		{name: "attempt timeout in the body",
			timeouts: func(to *Timeouts) { to.Attempt = tick },
			first:    `{"id":"x","object":"chat.completion",`, ct: "application/json",
			errs: []error{io.ErrUnexpectedEOF, reset}, timeout: ErrTypeAttemptTimeout},
		{name: "idle timeout in the stream", stream: true, status: http.StatusOK,
			timeouts: func(to *Timeouts) { to.Idle = tick },
			first:    "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n", ct: "text/event-stream",
			errs: []error{io.ErrUnexpectedEOF, reset}, timeout: ErrTypeIdleTimeout},
		{name: "first-token timeout in the stream", stream: true, status: http.StatusOK,
			timeouts: func(to *Timeouts) { to.FirstToken = tick },
			first:    "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n", ct: "text/event-stream",
			errs: []error{io.ErrUnexpectedEOF, reset}, timeout: ErrTypeFirstToken},
	} {
		cases := []struct {
			err      error
			wantType string
		}{{nil, tc.timeout}}
		for _, e := range tc.errs {
			cases = append(cases, struct {
				err      error
				wantType string
			}{e, ErrTypeEngineDisconnect})
		}
		for _, c := range cases {
			what := "the timer's own cancellation"
			if c.err != nil {
				what = fmt.Sprintf("%v after the timer", c.err)
			}
			t.Run(tc.name+"/"+what, func(t *testing.T) {
				cfg := testConfig(fleet.EngineConfig{Name: "e1", URL: "http://127.0.0.1:1", Models: []string{"m"}})
				cfg.Timeouts.ResponseHeader, cfg.Timeouts.FirstToken, cfg.Timeouts.Idle = time.Minute, time.Minute, time.Minute
				cfg.Timeouts.Attempt, cfg.Timeouts.Request = time.Minute, 2*time.Minute
				tc.timeouts(&cfg.Timeouts)
				h := newHarnessWith(t, cfg, []Option{WithTransport(timerRaceTransport{err: c.err, first: tc.first, ct: tc.ct})}, withoutStart())
				resp := h.post("/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, tc.stream))
				body := readBodyT(t, resp)
				wantStatus := tc.status
				if wantStatus == 0 {
					wantStatus = http.StatusGatewayTimeout
					if c.wantType == ErrTypeEngineDisconnect {
						wantStatus = http.StatusBadGateway
					}
				}
				if resp.StatusCode != wantStatus {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, wantStatus, body)
				}
				if code := errorCodeOf(t, resp.StatusCode, body); code != c.wantType {
					t.Errorf("error code %q, want %q", code, c.wantType)
				}
				h.waitIdle()
				got := errorTypesOf(h.collect(), telemetry.RequestDurationName)
				if len(got) != 1 || got[c.wantType] != 1 {
					t.Errorf("request.duration by error.type %v, want one %s", got, c.wantType)
				}
			})
		}
	}
}

// TestEndedBy: a timer's cause, or a context error, is the context's
// doing; a transport error is not, whether or not the context is done.
func TestEndedBy(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	if endedBy(ctx, errHeaderTimeout) {
		t.Error("a live context ended an error")
	}
	cancel(errHeaderTimeout)
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errHeaderTimeout, true},
		{fmt.Errorf("read: %w", errHeaderTimeout), true},
		{context.Canceled, true},
		{context.DeadlineExceeded, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: context.Canceled}, true},
		{errIdleTimeout, false},
		{io.EOF, false},
		{io.ErrUnexpectedEOF, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{errors.New("net/http: HTTP/1.x transport connection broken: EOF"), false},
	} {
		if got := endedBy(ctx, tc.err); got != tc.want {
			t.Errorf("endedBy(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
