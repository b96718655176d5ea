package enginesim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FaultHeader is the request header that selects the faults for one request. When present
// (even empty) it replaces the engine's default fault; see the package documentation for the
// syntax.
const FaultHeader = "X-Enginesim-Fault"

// ErrBadFault is wrapped by every fault spec parse error.
var ErrBadFault = errors.New("invalid fault spec")

// defaultTrickle is the pause after each byte for a bare "trickle" fault.
const defaultTrickle = time.Millisecond

// faults is one parsed fault spec. The zero value injects nothing. Counts use -1 for "not set".
type faults struct {
	spec string

	status             int           // status=CODE; 0 = none
	closeBeforeHeaders bool          // close-before-headers
	closeAfterHeaders  bool          // close-after-headers
	closeAfter         int           // close-after=N; -1 = none
	stallBeforeHeaders bool          // stall-before-headers[=DUR]
	stallBeforeFor     time.Duration // DUR of stall-before-headers; 0 = until the client leaves
	stallAfter         int           // stall-after=N; -1 = none
	resetAfter         int           // reset-after=N; -1 = none
	errorAfter         int           // error-after=N; -1 = none
	drainAfter         int           // drain-after=N; -1 = none
	cutAt              int           // cut-at=N; -1 = none (see resolveAt)
	resetAt            int           // reset-at=N; -1 = none
	stallAt            int           // stall-at=N; -1 = none
	slowHeaders        time.Duration // slow-headers=DUR
	malformed          bool          // malformed
	trickle            time.Duration // trickle[=DUR]; -1 = off
	keepAlive          bool          // keepalive[=DUR]
	keepAliveEvery     time.Duration // DUR of keepalive; 0 = once per wait
	noContent          bool          // no-content
	reasoning          int           // reasoning=N; 0 = none
	toolCall           bool          // tool-call
	errorBody          string        // error-body=KIND: one of the errorBody* kinds; "" = json
	retryAfter         int           // retry-after=SECONDS; -1 = none
	truncate           bool          // truncate
	poweredBy          bool          // powered-by
	kvNoParams         bool          // kv-no-params
	kvPullFail         bool          // kv-pull-fail
}

// Error body kinds of the error-body fault.
const (
	errorBodyJSON  = "json"  // vLLM's error JSON (the default)
	errorBodyHTML  = "html"  // a reverse proxy's or crashed worker's HTML error page
	errorBodyText  = "text"  // a plain-text Python traceback
	errorBodyEmpty = "empty" // no body at all
)

// noFaults is the parsed empty spec.
var noFaults = &faults{closeAfter: -1, stallAfter: -1, resetAfter: -1, errorAfter: -1, drainAfter: -1, cutAt: -1, resetAt: -1, stallAt: -1, trickle: -1, retryAfter: -1}

// parseFaults parses a comma-separated fault spec such as "close-after=3,trickle=2ms".
// Whitespace around items is ignored; unknown keys, missing or extra values and out-of-range
// values are errors wrapping [ErrBadFault].
func parseFaults(spec string) (*faults, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return noFaults, nil
	}
	f := *noFaults
	f.spec = spec
	var errs []error
	for item := range strings.SplitSeq(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, val, hasVal := strings.Cut(item, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if err := f.set(key, val, hasVal); err != nil {
			errs = append(errs, fmt.Errorf("%w: %q: %w", ErrBadFault, item, err))
		}
	}
	// error-body and retry-after shape the status fault's response; alone they would
	// silently do nothing, so they are errors.
	if f.status == 0 {
		if f.errorBody != "" {
			errs = append(errs, fmt.Errorf("%w: %q: needs status=CODE", ErrBadFault, "error-body="+f.errorBody))
		}
		if f.retryAfter >= 0 {
			errs = append(errs, fmt.Errorf("%w: %q: needs status=CODE", ErrBadFault, "retry-after="+strconv.Itoa(f.retryAfter)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &f, nil
}

// set applies one key[=value] item to f.
func (f *faults) set(key, val string, hasVal bool) error {
	needVal := func() error {
		if !hasVal || val == "" {
			return errors.New("needs a value")
		}
		return nil
	}
	noVal := func() error {
		if hasVal {
			return errors.New("takes no value")
		}
		return nil
	}
	var err error
	switch key {
	case "status":
		if err = needVal(); err == nil {
			f.status, err = strconv.Atoi(val)
			if err == nil && (f.status < 400 || f.status > 599) {
				err = errors.New("status must be 400..599")
			}
		}
	case "close-before-headers":
		f.closeBeforeHeaders, err = true, noVal()
	case "close-after-headers":
		f.closeAfterHeaders, err = true, noVal()
	case "close-after":
		if err = needVal(); err == nil {
			f.closeAfter, err = parseCount(val)
		}
	case "stall-before-headers":
		f.stallBeforeHeaders = true
		if hasVal {
			f.stallBeforeFor, err = parseDur(val)
		}
	case "stall-after":
		if err = needVal(); err == nil {
			f.stallAfter, err = parseCount(val)
		}
	case "reset-after":
		if err = needVal(); err == nil {
			f.resetAfter, err = parseCount(val)
		}
	case "error-after":
		if err = needVal(); err == nil {
			f.errorAfter, err = parseCount(val)
		}
	case "drain-after":
		if err = needVal(); err == nil {
			f.drainAfter, err = parseCount(val)
		}
	case "cut-at", "reset-at", "stall-at":
		var n int
		if err = needVal(); err == nil {
			if n, err = parseCount(val); err == nil && n == 0 {
				err = errors.New("must be at least 1")
			}
		}
		switch key {
		case "cut-at":
			f.cutAt = n
		case "reset-at":
			f.resetAt = n
		default:
			f.stallAt = n
		}
	case "slow-headers":
		if err = needVal(); err == nil {
			f.slowHeaders, err = parseDur(val)
		}
	case "malformed":
		f.malformed, err = true, noVal()
	case "trickle":
		f.trickle = defaultTrickle
		if hasVal {
			f.trickle, err = parseDur(val)
		}
	case "keepalive":
		f.keepAlive = true
		if hasVal {
			f.keepAliveEvery, err = parseDur(val)
			if err == nil && f.keepAliveEvery == 0 {
				err = errors.New("interval must be positive")
			}
		}
	case "no-content":
		f.noContent, err = true, noVal()
	case "reasoning":
		if err = needVal(); err == nil {
			f.reasoning, err = parseCount(val)
		}
	case "tool-call":
		f.toolCall, err = true, noVal()
	case "error-body":
		if err = needVal(); err == nil {
			switch val {
			case errorBodyJSON, errorBodyHTML, errorBodyText, errorBodyEmpty:
				f.errorBody = val
			default:
				err = errors.New("kind must be json, html, text or empty")
			}
		}
	case "retry-after":
		if err = needVal(); err == nil {
			var n int
			if n, err = parseCount(val); err == nil {
				f.retryAfter = n
			}
		}
	case "truncate":
		f.truncate, err = true, noVal()
	case "powered-by":
		f.poweredBy, err = true, noVal()
	case "kv-no-params":
		f.kvNoParams, err = true, noVal()
	case "kv-pull-fail":
		f.kvPullFail, err = true, noVal()
	default:
		err = errors.New("unknown fault")
	}
	return err
}

// resolveAt returns f with its absolute-index faults (cut-at, reset-at, stall-at) turned
// into the per-request ones (close-after, reset-after, stall-after) for a generation whose
// first content token is the answer's content token start (a continuation's resume index,
// else 0), streamed after lead leading token events (reasoning): N becomes N-start+lead
// when start < N, and nothing when the generation starts at N or later, so a continuation
// that resumes at N passes. An after-fault also set keeps the earlier of the two. f itself
// is never changed (it may be shared); f is returned as is when it has no such fault.
func (f *faults) resolveAt(start, lead int) *faults {
	if f.cutAt < 0 && f.resetAt < 0 && f.stallAt < 0 {
		return f
	}
	g := *f
	g.cutAt, g.resetAt, g.stallAt = -1, -1, -1
	at := func(after, n int) int {
		if n < 0 || start >= n {
			return after
		}
		if rel := n - start + lead; after < 0 || rel < after {
			return rel
		}
		return after
	}
	g.closeAfter = at(f.closeAfter, f.cutAt)
	g.resetAfter = at(f.resetAfter, f.resetAt)
	g.stallAfter = at(f.stallAfter, f.stallAt)
	return &g
}

func parseCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, errors.New("not an integer")
	}
	if n < 0 {
		return 0, errors.New("must not be negative")
	}
	return n, nil
}

func parseDur(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("not a duration (e.g. 250ms)")
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}
