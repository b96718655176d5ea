package gateway

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/internal/sse"
)

// errReassembleTooLarge ends a reassembly whose event data passed
// Config.MaxResponseBufferBytes.
var errReassembleTooLarge = errors.New("stream too large to reassemble")

// reassembleStream answers a non-streaming client from the engine's stream
// (Config.ObserveNonStreaming): every event goes through the stream
// accounting as a streamed request's would (the first content event moves
// the slot to decode and records TTFT; later ones ITL; the usage chunk the
// token usage), and into a reassembler; nothing reaches the client until
// the stream has ended, so every failure still gets a real status:
//
//   - the whole stream ([DONE], every choice finished): 200 with the
//     reassembled body, as vLLM's non-streaming answer, with
//     Content-Length;
//   - the engine's own error event: its error object, with its code as
//     the status when that is one (else 502);
//   - a stream cut short, or one that cannot be reassembled: 502;
//   - timeouts and client cancellation as for any non-streaming answer
//     (the attempt timeout bounds the whole, Timeouts.Idle the silence
//     between reads).
func (s *Server) reassembleStream(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call) {
	a := c.a
	rl := s.newRelay(w, r, resp, c.cancel, false, false, time.Time{})
	defer rl.close()
	defer func() {
		if rl.maxGap > 0 {
			s.metrics.RecordMaxGap(a.ctx, a.attrs, rl.maxGap.Seconds())
		}
	}()
	sc := scannerPool.Get().(*sse.Scanner)
	sc.Reset()
	defer scannerPool.Put(sc)

	ra := newReassembler(c.op.schema == oai.SchemaCompletion)
	st := streamState{a: a, framing: frameOpenAI, injected: true}
	var failed error // the first reassembly failure; later events are only accounted
	var size int64
	limit := s.cfg.MaxResponseBufferBytes
	onEvent := func(ev sse.Event) {
		st.onEvent(ev)
		if failed != nil || ev.Comment || ev.Data == nil || sse.IsDone(ev.Data) {
			return
		}
		if size += int64(len(ev.Data)); limit > 0 && size > limit {
			failed = errReassembleTooLarge
			return
		}
		failed = ra.add(ev.Data)
	}
	for {
		p, now, rerr := rl.read()
		if len(p) > 0 {
			st.now = now
			sc.Push(p, onEvent)
			rl.touch(now)
		}
		if st.done && rerr == nil {
			rerr = io.EOF // [DONE] is the end, whatever the connection does
		}
		if rerr == nil && failed == nil {
			continue
		}
		var es *engineStreamError
		switch {
		case errors.As(failed, &es):
			a.fail(ErrTypeStreamError)
			status := http.StatusBadGateway
			if es.Code >= 400 && es.Code <= 599 {
				status = es.Code
			}
			writeRaw(w, r, status, es.Body)
		case failed != nil:
			a.fail(ErrTypeStreamError)
			writeError(w, r, &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeStreamError, Message: "the engine's stream could not be reassembled into a response: " + failed.Error(), Err: failed})
		case rerr == io.EOF && st.done && ra.finished():
			body := ra.body()
			h := w.Header()
			copyResponseHeaders(h, resp.Header, true)
			h["Content-Type"] = jsonContentType // shared: no one mutates it
			h.Set("Content-Length", strconv.Itoa(len(body)))
			writeHeader(w, r, http.StatusOK)
			if _, err := w.Write(body); err != nil {
				a.fail(clientWriteErrType(err))
			}
		case rerr == io.EOF:
			a.fail(ErrTypeEngineDisconnect)
			writeError(w, r, &APIError{Status: http.StatusBadGateway, Type: TypeServer, Code: ErrTypeEngineDisconnect, Message: "the engine closed the stream before it was complete"})
		default:
			et, ae := s.classify(r, c.actx, rerr)
			a.fail(et)
			writeError(w, r, ae)
		}
		return
	}
}

// writeRaw writes a JSON body the engine produced, with status.
func writeRaw(w http.ResponseWriter, r *http.Request, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = jsonContentType
	h.Set("Content-Length", strconv.Itoa(len(body)))
	writeHeader(w, r, status)
	_, _ = w.Write(body)
}
