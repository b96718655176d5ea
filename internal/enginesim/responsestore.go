package enginesim

import (
	"container/list"
	"encoding/json"
	"sync"
	"time"
)

// Bounds of the stored Responses API responses: the newest responseStoreSize responses are
// kept, fewer when their echoed request fields and prompts take more than
// responseStoreBytes.
const (
	responseStoreSize  = 1024
	responseStoreBytes = 64 << 20
)

// Response statuses.
const (
	statusQueued     = "queued"
	statusInProgress = "in_progress"
	statusCompleted  = "completed"
	statusIncomplete = "incomplete"
	statusCancelled  = "cancelled"
)

// storedResponse is one stored response: its echoed request fields and the plan of its
// generation, from which the output is rebuilt on every read (the output text is a function
// of the token counts), so an entry's size does not grow with its output. Guarded by the
// store's mutex.
type storedResponse struct {
	obj        responseObject // without output, usage and status
	msgID      string
	rsID       string
	n          int // generated tokens
	reasoning  int // of which reasoning tokens
	prompt     int // prompt tokens
	cached     int // of which found in the prefix cache
	finish     string
	promptText string // the prompt's words, for a later previous_response_id
	size       int    // bytes counted against responseStoreBytes

	// status is the final status; "" while a background response is still generating.
	status string
	// A background response generates by time alone: it is done at created+ttft+(n-1)*itl,
	// and counted in Stats and the metrics when the engine first looks after that.
	background bool
	m          *modelState
	created    time.Time
	ttft, itl  time.Duration

	elem *list.Element
}

// doneAt is when a background response's last token is generated.
func (sr *storedResponse) doneAt() time.Time {
	d := sr.ttft
	if sr.n > 1 {
		d += time.Duration(sr.n-1) * sr.itl
	}
	return sr.created.Add(d)
}

// finalStatus is the status of a response that ran to its end.
func (sr *storedResponse) finalStatus() string {
	if sr.finish == finishLength {
		return statusIncomplete
	}
	return statusCompleted
}

// render returns the response as GET /v1/responses/{id} answers it.
func (sr *storedResponse) render() ([]byte, error) {
	obj := sr.obj
	switch sr.status {
	case "":
		obj.Status, obj.Output = statusInProgress, []any{}
	case statusCancelled:
		obj.Status, obj.Output = statusCancelled, []any{}
	default:
		obj = sr.final()
	}
	return json.Marshal(obj)
}

// final returns the complete response: output, usage and the final status.
func (sr *storedResponse) final() responseObject {
	obj := sr.obj
	obj.Status = sr.finalStatus()
	if obj.Status == statusIncomplete {
		obj.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	obj.Output = responseOutput(sr.msgID, sr.rsID, sr.n, sr.reasoning)
	obj.Usage = &responseUsage{
		InputTokens:         sr.prompt,
		InputTokensDetails:  inputTokensDetails{CachedTokens: sr.cached},
		OutputTokens:        sr.n,
		OutputTokensDetails: outputTokensDetails{ReasoningTokens: sr.reasoning},
		TotalTokens:         sr.prompt + sr.n,
	}
	return obj
}

// responseStore holds the newest stored responses by id, bounded in count and bytes. It is
// safe for concurrent use.
type responseStore struct {
	maxEntries, maxBytes int

	mu      sync.Mutex
	bytes   int
	byID    map[string]*storedResponse
	order   list.List // of *storedResponse, oldest first
	pending map[*storedResponse]struct{}
}

func newResponseStore(maxEntries, maxBytes int) *responseStore {
	return &responseStore{
		maxEntries: maxEntries, maxBytes: maxBytes,
		byID: make(map[string]*storedResponse), pending: make(map[*storedResponse]struct{}),
	}
}

// storeResponse adds sr, evicting the oldest responses beyond the bounds. A background
// response evicted before the engine saw it finish is counted as completed then.
func (e *Engine) storeResponse(sr *storedResponse) {
	s := e.responses
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.byID[sr.obj.ID]; ok { // an id reused by a client-chosen request id
		e.evictLocked(old)
	}
	sr.elem = s.order.PushBack(sr)
	s.byID[sr.obj.ID] = sr
	s.bytes += sr.size
	if sr.background && sr.status == "" {
		s.pending[sr] = struct{}{}
	}
	for s.order.Len() > 1 && (s.order.Len() > s.maxEntries || s.bytes > s.maxBytes) {
		e.evictLocked(s.order.Front().Value.(*storedResponse))
	}
}

// evictLocked removes sr from the store, settling it first if it is a pending background
// response. The caller holds the store's mutex.
func (e *Engine) evictLocked(sr *storedResponse) {
	s := e.responses
	if _, ok := s.pending[sr]; ok {
		e.finishBackgroundLocked(sr, sr.doneAt(), false)
	}
	s.order.Remove(sr.elem)
	delete(s.byID, sr.obj.ID)
	s.bytes -= sr.size
}

// sweepResponses counts the background responses whose generation time has passed. Stats,
// /metrics and every read of a stored response sweep first, so what they show is current
// without the engine owning a goroutine.
func (e *Engine) sweepResponses() {
	s := e.responses
	s.mu.Lock()
	defer s.mu.Unlock()
	e.sweepLocked(e.now())
}

func (e *Engine) sweepLocked(now time.Time) {
	for sr := range e.responses.pending {
		if !now.Before(sr.doneAt()) {
			e.finishBackgroundLocked(sr, now, false)
		}
	}
}

// finishBackgroundLocked ends the pending background response sr at now: completed (with
// all its tokens), or cancelled (counted as aborted, with the tokens generated by now). The
// caller holds the store's mutex.
func (e *Engine) finishBackgroundLocked(sr *storedResponse, now time.Time, cancelled bool) {
	delete(e.responses.pending, sr)
	m := sr.m
	elapsed := now.Sub(sr.created)
	tokens := sr.n
	if cancelled {
		sr.status = statusCancelled
		tokens = 0
		if sr.n > 0 && elapsed >= sr.ttft {
			tokens = min(sr.n, 1+int((elapsed-sr.ttft)/max(sr.itl, 1)))
		}
	} else {
		sr.status = sr.finalStatus()
	}
	if !cancelled || elapsed >= sr.ttft {
		m.ttft.Observe(sr.ttft.Seconds())
		m.promptTokens.Add(float64(sr.prompt))
	}
	m.genTokens.Add(float64(tokens))
	switch {
	case cancelled:
		e.aborted.Add(1)
		m.aborted.Inc()
	case sr.finish == finishLength:
		e.completed.Add(1)
		m.successLen.Inc()
	default:
		e.completed.Add(1)
		m.successStop.Inc()
	}
}

// readResponse returns the stored response id as GET answers it, and its prompt and output
// words for a follow-up request; ok is false when no such response is stored.
func (e *Engine) readResponse(id string) (body []byte, history []string, ok bool, err error) {
	s := e.responses
	s.mu.Lock()
	defer s.mu.Unlock()
	e.sweepLocked(e.now())
	sr, ok := s.byID[id]
	if !ok {
		return nil, nil, false, nil
	}
	body, err = sr.render()
	history = wordList(sr.promptText)
	if sr.status == statusCompleted || sr.status == statusIncomplete {
		history = append(history, outputWords(sr.n, sr.reasoning)...)
	}
	return body, history, true, err
}

// cancelResponse cancels the stored response id if it is a background response still
// generating. It returns the response afterwards, and whether it was cancellable (false
// also when it is not stored: see found).
func (e *Engine) cancelResponse(id string) (body []byte, found, cancellable bool, err error) {
	s := e.responses
	s.mu.Lock()
	defer s.mu.Unlock()
	now := e.now()
	e.sweepLocked(now)
	sr, found := s.byID[id]
	if !found {
		return nil, false, false, nil
	}
	if _, cancellable = s.pending[sr]; cancellable {
		e.finishBackgroundLocked(sr, now, true)
	}
	body, err = sr.render()
	return body, true, cancellable, err
}

// cancellable reports whether the stored response id exists and is a background response
// still generating.
func (e *Engine) cancellable(id string) (found, ok bool) {
	s := e.responses
	s.mu.Lock()
	defer s.mu.Unlock()
	e.sweepLocked(e.now())
	sr, found := s.byID[id]
	if !found {
		return false, false
	}
	_, ok = s.pending[sr]
	return true, ok
}
