package routing

import (
	"context"
	"errors"
)

// ErrNoEndpoint is returned by a policy when no candidate can take the
// request. The gateway answers it with 503 and a Retry-After header.
var ErrNoEndpoint = errors.New("no engine available")

// Request is what a policy may look at: the routing fields parsed once from
// the request body, never the *http.Request.
type Request struct {
	// Model is the requested model name, already known to be served by
	// every candidate.
	Model string
	// Stream is true for a streamed (SSE) request.
	Stream bool
	// SessionKey identifies a conversation for session affinity: the
	// session header's value, else the body's "user" field ("" when the
	// client sent neither).
	SessionKey string
	// PromptBytes is the prompt's size in bytes (a proxy for prefill cost).
	PromptBytes int
	// PrefixHashes are the chained hashes of the prompt's leading
	// fixed-size blocks (see oai.Parser): PrefixHashes[i] identifies the
	// whole prompt up to the end of block i, so two prompts share their
	// first k hashes exactly when they share their first k blocks. Empty
	// when the prompt is shorter than one block or hashing is off.
	PrefixHashes []uint64
	// TokenKeys are the gateway's keys of the prompt's leading full token
	// blocks (internal/stablehash.TokenBlocks over its token ids, cut at
	// [KVRouter.KVBlockSize]), the keys a [KVIndex] holds the engines'
	// reported blocks under; set by the gateway for a [KVRouter] when it
	// knows the prompt's tokens: all its full blocks, or the leading ones
	// it shares with an earlier prompt whose tokens it knows (a
	// conversation's previous turn). nil when unknown: the policy then
	// measures every engine on PrefixHashes.
	TokenKeys []uint64
	// TokenBlocks is the prompt's number of full token blocks: exact when
	// TokenKeys covers the whole prompt, else an estimate, never below
	// len(TokenKeys). A precise match is a fraction of it.
	TokenBlocks int

	// known is how many leading PrefixHashes the engine picked last was
	// already recorded for when the pick recorded the rest: what a
	// [Forgetter]'s Forget keeps. Set by the prefix policies' Pick, so a
	// Request belongs to one request and is not shared by concurrent picks.
	known int
	// predicted is one more than the prompt tokens the last Pick of a
	// [KVRouter] found cached on its engine from the engine's own reports;
	// 0 when it measured that engine otherwise (or nothing picked).
	predicted int
}

// PredictedCached returns the prompt tokens the engine chosen by the last
// Pick of a [KVRouter] had reported holding in its KV cache (matched
// blocks x block size), to be checked against the cached_tokens the engine
// then reports in its usage; -1 when that Pick did not measure the engine
// on its reports (no token keys, its events stale, or another policy).
func (r *Request) PredictedCached() int { return r.predicted - 1 }

// Known returns how many leading [Request.PrefixHashes] the engine chosen
// by the last Pick of a prefix policy ([PrefixAware], [Scorer]) had
// recently been sent before that Pick: the gateway's estimate of the
// prompt's blocks cached on that engine (prefill/decode disaggregation
// asks it of the decode engine). 0 when no prefix policy picked.
func (r *Request) Known() int { return r.known }

// Policy picks one endpoint for a request.
//
// candidates holds the healthy endpoints that serve req.Model; it is never
// modified by the policy and may be empty, in which case Pick returns
// [ErrNoEndpoint]. Implementations must be safe for concurrent use and should
// not allocate: Pick runs once per request attempt. Pick may note in req's
// unexported state what a later [Forgetter.Forget] for it needs, so a
// Request is not shared by concurrent picks.
type Policy interface {
	Pick(ctx context.Context, req *Request, candidates []*Endpoint) (*Endpoint, error)
}

// PrefixHasher is implemented by policies that route on
// [Request.PrefixHashes]; the gateway asks it how to cut prompts into
// blocks and computes the hashes only for such a policy.
type PrefixHasher interface {
	// PrefixBlocks returns the block size in bytes and the most blocks to
	// hash per prompt.
	PrefixBlocks() (blockBytes, maxBlocks int)
}

// Forgetter is implemented by policies that learn from where they route:
// [PrefixAware] and [Scorer] record a prompt's blocks against the engine
// they pick, as if it had cached them. The gateway calls Forget with the
// request and the engine of an attempt that ended before anything reached
// the client and that it is about to retry elsewhere (or on the same engine,
// which then records the prompt again): the engine that serves the retry
// computes the whole prompt, and the failing or slow one should not tie
// with it for the prompt's next turn. It must be safe for concurrent use
// and must not allocate.
type Forgetter interface {
	// Forget undoes what the Pick that returned e for req recorded: the
	// blocks beyond those e was already known to hold. req must be the
	// Request that Pick was given, before any other Pick with it.
	Forget(req *Request, e *Endpoint)
}

// SessionKeyed is implemented by policies that route on
// [Request.SessionKey]; the gateway reads the key from the header it names
// (else from the body's "user" field).
type SessionKeyed interface {
	// SessionHeader returns the header carrying the session key.
	SessionHeader() string
}
