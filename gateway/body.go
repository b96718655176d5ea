package gateway

import (
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/switchboard-gw/switchboard/internal/oai"
)

// maxUsageCapture caps how much of a relayed (unbuffered) non-streaming
// body is kept to read its usage; larger bodies (big embedding batches) are
// forwarded without it. It is reserved in the buffered-bytes budget too.
const maxUsageCapture = 1 << 20

// copyMode is how copyBody relays a body that is not SSE.
type copyMode uint8

const (
	// copyWhole: a non-streaming response, buffered whole up to
	// Config.MaxResponseBufferBytes before anything is sent.
	copyWhole copyMode = iota
	// copyStream: a streamed response in another framing (NDJSON, chunked
	// JSON): relayed as it arrives, flushed per write, never parsed.
	copyStream
)

// copyBody forwards a response that is not SSE.
//
// copyWhole: vLLM sends a non-streaming response in one piece, so it is
// buffered up to Config.MaxResponseBufferBytes (every byte of buffer
// capacity reserved in the buffered-bytes budget) and sent with its exact
// Content-Length once it has ended; an engine failing before its end gets
// a clean 502/504 JSON error, never a 200 that looks whole. A body above the
// cap (or one the budget cannot hold) is relayed as it arrives from then on,
// and a failure after its first bytes went out aborts the client connection
// (a cut body must not look complete; with a declared length the client sees
// it short). The body's id and usage are read from what was held, up to
// maxUsageCapture when relayed.
//
// copyStream: relayed byte for byte as it arrives, flushed per write; the
// engine may be silent until firstBy before its first bytes, then
// Timeouts.Idle between reads; the body's clean end is the stream's end.
func (s *Server) copyBody(w http.ResponseWriter, r *http.Request, resp *http.Response, c *call, mode copyMode) *APIError {
	a, actx := c.a, c.actx
	firstBy := time.Time{}
	if mode == copyStream {
		firstBy = c.firstBy
	}
	rl := s.newRelay(w, r, resp, c, false, mode == copyStream, firstBy)
	defer rl.close()
	flush := mode == copyStream || resp.ContentLength < 0
	// hold is the body kept: all of it while buffering, a prefix for the
	// usage while relaying, nothing for copyStream.
	hold := heldBuf{s: s, hint: resp.ContentLength}
	defer hold.release()
	bufLimit := c.set.cfg.MaxResponseBufferBytes
	buffering := mode == copyWhole && bufLimit > 0 && resp.ContentLength <= bufLimit
	capturing := mode == copyWhole // keeping the body (or its first bytes) to read its usage
	for {
		p, now, rerr := rl.read()
		if len(p) > 0 {
			rl.touch(now)
			if buffering && int64(len(hold.b)+len(p)) <= bufLimit && hold.add(p, bufLimit) {
				p = nil
			} else if buffering {
				// Too large (or no budget) to hold: relay from here on.
				buffering = false
				if err := rl.write(hold.b, false); err != nil {
					a.fail(clientWriteErrType(err))
					return nil
				}
			}
			if len(p) > 0 {
				if capturing && !hold.add(p, maxUsageCapture) {
					capturing = false // too large (or no budget) to read its usage
					hold.release()
				}
				if rerr == io.EOF {
					// The body's last bytes (the engine clients return
					// EOF with them): the lease goes back first.
					s.answerComplete(r)
				}
				if err := rl.write(p, flush); err != nil {
					a.fail(clientWriteErrType(err))
					return nil
				}
			}
		}
		if rerr == nil {
			continue
		}
		if rerr == io.EOF {
			if buffering {
				// The whole body: sent with its exact length (the engine's
				// header when it had one; it matched, or the read failed).
				body := hold.b
				if b, ok := a.rewriteUsage(nil, body); ok {
					// A disaggregated request's answer, with the prefill
					// engine's cached tokens: its own length.
					body = b
					rl.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				} else if resp.ContentLength < 0 {
					rl.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				}
				s.answerComplete(r)
				if err := rl.write(body, false); err != nil {
					a.fail(clientWriteErrType(err))
				}
			}
			rl.start()
			if capturing {
				if b, ok := oai.ParseBody(hold.b); ok {
					a.respID, a.usage, a.hasUsage = b.ID, b.Usage, b.Usage != (oai.Usage{})
					a.answered(b.Model)
					a.finished(b.FinishReason)
				}
			}
			return nil
		}
		et, ae := s.classify(r, actx, rerr)
		a.fail(et)
		if !rl.started {
			return ae
		}
		if et == ErrTypeClientCancelled {
			return nil
		}
		// finish keeps the recorded cause for this panic.
		panic(http.ErrAbortHandler)
	}
}

// heldBuf is response bytes kept in memory under the gateway's
// buffered-bytes budget: its capacity grows by doubling, from the declared
// length (hint, when known and small enough) or 16 KiB, and every byte of
// capacity is reserved before it is allocated. b is nil until the first
// add and after release.
type heldBuf struct {
	s        *Server
	hint     int64 // the body's declared length, -1 when unknown
	b        []byte
	reserved int64
}

// add appends p when the buffer can then hold at most limit bytes and the
// budget has room for its capacity; otherwise it appends nothing and
// returns false.
func (h *heldBuf) add(p []byte, limit int64) bool {
	need := int64(len(h.b) + len(p))
	if need > limit {
		return false
	}
	if need > int64(cap(h.b)) {
		c := max(2*int64(cap(h.b)), need)
		if cap(h.b) == 0 {
			c = max(need, initialBodyBuf)
			if h.hint >= need {
				c = h.hint // one exact allocation when the length is known
			}
		}
		c = min(c, limit)
		if !h.s.buffered.take(c - h.reserved) {
			return false
		}
		h.reserved = c
		nb := make([]byte, len(h.b), c)
		copy(nb, h.b)
		h.b = nb
	}
	h.b = append(h.b, p...)
	return true
}

// release drops the buffer and gives its reservation back.
func (h *heldBuf) release() {
	h.s.buffered.give(h.reserved)
	h.reserved, h.b = 0, nil
}
