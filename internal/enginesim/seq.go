package enginesim

import (
	"errors"
	"net/http"
	"time"
)

// seq is one generative sequence on its handler goroutine: its prompt, how many tokens it
// generates and why it stops. Every generative route (chat, completions, responses, messages,
// audio, images) runs one through [seq.serveStream] or [seq.serveUnary], so they all share the
// scheduler, the prefix cache, the latency model, the accounting and the faults.
type seq struct {
	*call
	words        []string // prompt words, hashed for the prefix cache when cacheable
	promptTokens int
	cacheable    bool
	n            int    // tokens to generate
	finish       string // finishStop or finishLength
	cached       int    // prompt tokens found in the prefix cache, known after prefill
	// abortable: the route renders a finish_reason "abort" (chat and completions), so the
	// drain-after fault ends the request with one; other routes are cut instead.
	abortable bool
	// kv is set on a decode leg (kv_transfer_params with do_remote_prefill): the prompt's
	// KV is pulled from the prefill engine instead of computed.
	kv *kvTransferParams
}

// streamer renders one route's SSE stream around the tokens [seq.serveStream] generates. Its
// methods write through the call, so trickle, keep-alives and client disconnects act on
// every route alike.
type streamer interface {
	// open writes the events sent before the sequence is even scheduled (chat's role chunk,
	// the Responses API's response.created, Anthropic's message_start).
	open() error
	// lead writes the events sent at the time to first token before token 0 and reports
	// whether it wrote any; token 0 then follows one inter-token latency later (chat's
	// tool-call delta).
	lead() (bool, error)
	// token writes the events of generated token i (0 <= i < n).
	token(i int) error
	// close writes the events after the last token (finish and usage chunks, done events).
	close() error
	// terminator returns the stream's last bytes, written once the request is settled as
	// completed: "data: [DONE]" or a typed stream's final event. The truncate fault omits
	// them.
	terminator() ([]byte, error)
	// malformed returns the invalid event of the malformed fault, sent right after open.
	malformed() string
	// midError returns the in-band error event of the error-after fault, with whatever the
	// route's server sends after it (chat's "data: [DONE]").
	midError() ([]byte, error)
}

// prefill admits the sequence and waits for its time to first token: TTFT, plus
// TTFTPerPromptToken for each prompt token not in the prefix cache, plus TTFTPerRunning for
// each other sequence running once this one is admitted (see [Engine.ttftFor]).
func (s *seq) prefill() error {
	cached, err := s.admit(s.words, s.promptTokens, s.cacheable)
	if err != nil {
		return err
	}
	s.cached = cached
	recompute := true
	if s.kv != nil {
		if recompute, err = s.loadRemoteKV(); err != nil {
			return err
		}
	}
	if recompute {
		uncached := s.promptTokens - cached
		queued := s.e.interf.queuePrefill(uncached, s.e.now())
		job := s.e.interf.startPrefill(uncached)
		err := s.wait(queued+s.prefillDelay(uncached), nil, true)
		s.e.interf.endPrefill(job, err != nil)
		if err != nil {
			return err
		}
	}
	// From here on the sequence decodes (a decode leg computed no prompt: it stretched
	// nobody).
	s.dec = s.e.interf.startDecode()
	s.m.ttft.Observe(time.Since(s.start).Seconds())
	s.m.promptTokens.Add(float64(s.promptTokens))
	return nil
}

// decode accounts generated token i: one more generation token and its KV cache slot.
func (s *seq) decode(i int) {
	s.m.genTokens.Inc()
	s.setKVTokens(s.promptTokens + i + 1)
}

// serveStream runs the sequence as an SSE stream rendered by st: the faults before the headers,
// the headers, st's opening events (and the malformed event), the prefill, one token event
// per inter-token latency (cut by close-after and stall-after), st's closing events and
// its terminator.
func (s *seq) serveStream(st streamer) error {
	if handled, err := s.preHeaders(); handled || err != nil {
		return err
	}
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	s.w.WriteHeader(http.StatusOK)
	if err := s.flush(); err != nil {
		return err
	}
	if s.f.closeAfterHeaders {
		s.abortConn()
	}
	if err := st.open(); err != nil {
		return err
	}
	if s.f.malformed {
		if err := s.write([]byte(st.malformed())); err != nil {
			return err
		}
	}
	if err := s.prefill(); err != nil {
		if errors.Is(err, errKVLoadFailed) {
			// vLLM finishes the request with an error: its stream generator sends the
			// in-band error event and [DONE].
			return s.streamError(st)
		}
		return err
	}
	led, err := st.lead()
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		if s.f.closeAfter >= 0 && i == min(s.f.closeAfter, s.n) {
			s.abortConn()
		}
		if s.f.resetAfter >= 0 && i == min(s.f.resetAfter, s.n) {
			s.resetConn()
		}
		if s.f.errorAfter >= 0 && i == min(s.f.errorAfter, s.n) {
			return s.streamError(st)
		}
		if s.f.drainAfter >= 0 && i == min(s.f.drainAfter, s.n) {
			return s.drainStream(st, i)
		}
		if s.f.stallAfter >= 0 && i == min(s.f.stallAfter, s.n) {
			// A stalled stream decodes no more: it leaves the interference model, so
			// later prefills do not wait for it to pass their chunks.
			s.e.interf.endDecode(s.dec)
			s.dec = nil
			return s.sleep(-1)
		}
		if i == s.n {
			break
		}
		if i > 0 || led {
			if err := s.wait(s.itlDelay(), nil, true); err != nil {
				return err
			}
		}
		s.decode(i)
		if err := st.token(i); err != nil {
			return err
		}
	}
	if err := st.close(); err != nil {
		return err
	}
	if s.f.truncate {
		// End the stream cleanly without its terminator. The client sees the end only when
		// net/http finishes the response after the handler returns, so this is still
		// before the last bytes.
		s.settle(outcomeFaulted, "")
		return nil
	}
	term, err := st.terminator()
	if err != nil {
		return err
	}
	s.settle(outcomeCompleted, s.finish)
	_ = s.write(term) // the request is complete; a client gone now is not an abort
	return nil
}

// streamError ends a stream as vLLM ends a generation that failed: the in-band error event
// (and, on the OpenAI routes, [DONE]), the sequence settled as faulted.
func (s *seq) streamError(st streamer) error {
	b, err := st.midError()
	if err != nil {
		return err
	}
	s.settle(outcomeFaulted, "")
	_ = s.write(b)
	return nil
}

// drainStream applies the drain-after fault to a stream after its first generated tokens:
// the engine starts draining ([Engine.SetDraining]) and aborts the request. Chat and
// completions end it as vLLM ends a request its engine aborts: a finish chunk with
// finish_reason "abort", the usage chunk if asked (counting the generated tokens) and
// [DONE]; the other routes are cut like close-after. Faulted.
func (s *seq) drainStream(st streamer, generated int) error {
	s.e.SetDraining(true)
	if !s.abortable {
		s.abortConn()
	}
	s.n, s.finish = generated, finishAbort
	if err := st.close(); err != nil {
		return err
	}
	term, err := st.terminator()
	if err != nil {
		return err
	}
	s.settle(outcomeFaulted, "")
	_ = s.write(term)
	return nil
}

// serveUnary runs the sequence as a non-stream request: the faults before the headers, the whole
// generation (the prefill, then n-1 inter-token latencies), and the body that body builds
// afterwards, of Content-Type ct, written with the body faults.
func (s *seq) serveUnary(ct string, body func() ([]byte, error)) error {
	if handled, err := s.preHeaders(); handled || err != nil {
		return err
	}
	s.closeAfterHeaders(ct)
	if err := s.prefill(); err != nil {
		if errors.Is(err, errKVLoadFailed) {
			// vLLM answers a request finished with an error with its 500.
			s.settle(outcomeFaulted, "")
			s.api.writeError(s.w, midErrorStatus, midErrorMessage)
			return nil
		}
		return err
	}
	// error-after and drain-after end the generation after their first tokens.
	if s.f.errorAfter >= 0 {
		s.n = min(s.n, s.f.errorAfter)
	}
	if s.f.drainAfter >= 0 && s.abortable {
		s.n, s.finish = min(s.n, s.f.drainAfter), finishAbort
	}
	for i := range s.n {
		if i > 0 {
			if err := s.wait(s.itlDelay(), nil, false); err != nil {
				return err
			}
		}
		s.decode(i)
	}
	b, err := body()
	if err != nil {
		return err
	}
	return s.writeBodyAs(b, ct, s.finish)
}
