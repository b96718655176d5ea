package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Prefill/decode disaggregation with vLLM's NixlConnector, in pull mode (see the package
// documentation, "Prefill and decode"). The contract follows vLLM's sources:
//
//   - vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py and the pull scheduler
//     (vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py):
//     request_finished returns the params below only when the prefill finished with
//     length or stop, and delays freeing the blocks until the decode engine has read them
//     or the lease (kv_lease_duration, 30 s) expires;
//   - tests/v1/kv_connector/nixl_integration/toy_proxy_server.py: the router sends the
//     prefill leg with "kv_transfer_params": {"do_remote_decode": true, ...}, stream false
//     and max_tokens 1, then the original request to the decode engine with the returned
//     params;
//   - vllm/v1/core/sched/scheduler.py: with kv_load_failure_policy "fail" a request whose
//     KV load failed is finished with RequestStatus.FINISHED_ERROR, which the OpenAI server
//     answers as any generation error (OpenAIServing._raise_if_error: 500
//     InternalServerError "Internal server error"; in a stream the in-band error event and
//     [DONE]); with "recompute" the decode engine computes the prompt itself.
//
// The NIXL side channel and the RDMA read are modelled by one HTTP call from the decode
// engine to the prefill engine's POST /sim/kv/pull.

// kvPullPath is the simulator-only route a decode engine pulls a prompt's KV from.
const kvPullPath = "/sim/kv/pull"

// kvTransferParams is the kv_transfer_params object of a request, as far as the simulator
// reads it: the prefill leg's do_remote_decode, the decode leg's do_remote_prefill and the
// remote_* fields a pull needs.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
}

// kvParamsOut is the kv_transfer_params of a prefill leg's response, in the order of the
// dict vLLM's pull scheduler's request_finished returns (the fields of a single-rank
// engine: tp_size 1).
type kvParamsOut struct {
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteRequestID string `json:"remote_request_id"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	TPSize          int    `json:"tp_size"`
	RemoteNumTokens int    `json:"remote_num_tokens"`
	TransferMode    string `json:"transfer_mode"`
}

// kvPullRequest is the body of POST /sim/kv/pull.
type kvPullRequest struct {
	RemoteRequestID string `json:"remote_request_id"`
	RemoteEngineID  string `json:"remote_engine_id"`
}

// kvPullResponse is the 200 answer of POST /sim/kv/pull: what was read.
type kvPullResponse struct {
	RemoteRequestID string `json:"remote_request_id"`
	RemoteNumTokens int    `json:"remote_num_tokens"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
}

// kvHold is a prefill leg's KV blocks, held for a decode engine until expiry.
type kvHold struct {
	tokens int
	blocks []int
	expiry time.Time
}

// kvState is an engine's side of the KV transfers: the blocks it holds for decode engines
// and its counters.
type kvState struct {
	mu        sync.Mutex
	held      map[string]*kvHold // by remote_request_id
	nextBlock int                // the next block id handed out, under mu

	client *http.Client // the decode side's pulls

	paramsSent, pullsServed, leasesExpired, pulled, loadFailures, recomputed atomic.Int64
	// failedTransfers counts the load failures that were pulls (not invalid params), for
	// vllm:nixl_num_failed_transfers.
	failedTransfers atomic.Int64
}

func newKVState() *kvState {
	// One connection per pull, straight to the prefill engine (no proxy from the
	// environment): an engine owns no goroutines, and an idle pool would keep some. The
	// address comes from a request body, so the pull is bounded like any call to a peer
	// the engine does not control: a dial and a header timeout, no redirects followed
	// (a redirect would turn the pull into a request to anywhere).
	tr := &http.Transport{
		DisableKeepAlives:     true,
		DialContext:           (&net.Dialer{Timeout: kvPullDialTimeout}).DialContext,
		ResponseHeaderTimeout: kvPullHeaderTimeout,
	}
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &kvState{held: make(map[string]*kvHold), client: client}
}

// The bounds of a pull: vLLM's NIXL handshake and transfer have their own timeouts; these
// keep a decode leg whose prefill engine is unreachable from holding its slot for the
// system's TCP timeout.
const (
	kvPullDialTimeout   = 5 * time.Second
	kvPullHeaderTimeout = 30 * time.Second
)

// validKVHost reports whether host is an IP address or a DNS name (letters, digits, '-',
// '.', '_'; at most 253 bytes): nothing that could add a path, a query or credentials to
// the pull's URL.
func validKVHost(host string) bool {
	if host == "" || len(host) > 253 {
		return false
	}
	if net.ParseIP(host) != nil {
		return true
	}
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// errKVLoadFailed ends a decode request whose KV load failed under the fail policy.
var errKVLoadFailed = errors.New("KV load failed")

// dropHoldLocked frees hold h of request id: its blocks leave the KV
// usage. Called with kv.mu held.
func (e *Engine) dropHoldLocked(id string, h *kvHold) {
	delete(e.kv.held, id)
	e.kvBlocks.Add(-int64(len(h.blocks)))
}

// sweepKVLocked frees the holds whose lease has expired by now. Called with kv.mu held.
func (e *Engine) sweepKVLocked(now time.Time) {
	for id, h := range e.kv.held {
		if !now.Before(h.expiry) {
			e.dropHoldLocked(id, h)
			e.kv.leasesExpired.Add(1)
			slog.Debug("kv lease expired", "engine", e.cfg.Name, "request", id)
		}
	}
}

// kvHeld returns the number of prefill legs whose blocks the engine holds now.
func (e *Engine) kvHeld() int64 {
	e.kv.mu.Lock()
	defer e.kv.mu.Unlock()
	e.sweepKVLocked(e.now())
	return int64(len(e.kv.held))
}

// holdKV holds the prompt blocks of g, a finished prefill leg, under a new request id and
// returns the params that tell a decode engine where to pull them from. It returns nil,
// holding nothing, when vLLM would return no params: the generation did not finish with
// length or stop (an abort or an error), or the kv-no-params fault.
func (e *Engine) holdKV(g *generation) *kvParamsOut {
	if g.f.kvNoParams || g.f.errorAfter >= 0 || (g.finish != finishLength && g.finish != finishStop) {
		return nil
	}
	bs := e.cfg.BlockSize
	n := (g.promptTokens + bs - 1) / bs
	id := g.id + "-" + fmt.Sprintf("%08x", rand.Uint32()) // vLLM randomizes its internal ids
	e.kv.mu.Lock()
	now := e.now()
	e.sweepKVLocked(now)
	blocks := make([]int, n)
	for i := range blocks {
		blocks[i] = e.kv.nextBlock
		e.kv.nextBlock++
	}
	e.kv.held[id] = &kvHold{tokens: g.promptTokens, blocks: blocks, expiry: now.Add(e.cfg.KVLeaseDuration)}
	e.kvBlocks.Add(int64(n))
	e.kv.mu.Unlock()
	e.kv.paramsSent.Add(1)
	return &kvParamsOut{
		DoRemotePrefill: true, RemoteBlockIDs: blocks, RemoteEngineID: e.cfg.KVEngineID,
		RemoteRequestID: id, RemoteHost: g.kvHost, RemotePort: g.kvPort, TPSize: 1,
		RemoteNumTokens: g.promptTokens, TransferMode: "pull",
	}
}

// sideChannel returns the host and port decode engines pull from: the configured ones, else
// the local address of the connection r arrived on.
func (e *Engine) sideChannel(r *http.Request) (string, int) {
	host, port := e.cfg.KVSideChannelHost, e.cfg.KVSideChannelPort
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if h, p, err := net.SplitHostPort(a.String()); err == nil {
			if host == "" {
				host = h
			}
			if port == 0 {
				port, _ = strconv.Atoi(p)
			}
		}
	}
	if host == "" {
		host = "localhost" // vLLM's default VLLM_NIXL_SIDE_CHANNEL_HOST
	}
	return host, port
}

// serveKVPull serves POST /sim/kv/pull, the prefill side of a pull: 200 with what was read,
// freeing the blocks, when the engine holds the request's blocks; 409 when the request names
// another engine; 404 when the request is unknown or its lease expired.
func (e *Engine) serveKVPull(w http.ResponseWriter, r *http.Request) {
	var req kvPullRequest
	if !decodeBody(apiOpenAI, w, r, &req) {
		return
	}
	if req.RemoteEngineID != e.cfg.KVEngineID {
		writeError(w, http.StatusConflict, fmt.Sprintf("engine id %q is not this engine's (%q)", req.RemoteEngineID, e.cfg.KVEngineID))
		return
	}
	e.kv.mu.Lock()
	e.sweepKVLocked(e.now())
	h, ok := e.kv.held[req.RemoteRequestID]
	if ok {
		e.dropHoldLocked(req.RemoteRequestID, h)
	}
	e.kv.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no KV blocks held for request %q", req.RemoteRequestID))
		return
	}
	e.kv.pullsServed.Add(1)
	writeJSON(w, kvPullResponse{RemoteRequestID: req.RemoteRequestID, RemoteNumTokens: h.tokens, RemoteBlockIDs: h.blocks})
}

// pullKV reads p's KV from the prefill engine it names (POST /sim/kv/pull), whose remote_*
// fields are set; ctx cancels it.
func (e *Engine) pullKV(ctx context.Context, p *kvTransferParams) error {
	body, err := json.Marshal(kvPullRequest{RemoteRequestID: *p.RemoteRequestID, RemoteEngineID: *p.RemoteEngineID})
	if err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort)) + kvPullPath
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.kv.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pull from %s: %s", url, resp.Status)
	}
	return nil
}

// loadRemoteKV runs the decode leg's pull in place of the prefill compute, once the
// sequence is admitted: on success it waits the transfer time of the prompt tokens not
// found in the local prefix cache and reports the whole prompt as cached. On failure
// (the kv-pull-fail fault, invalid params, a failed pull) it returns recompute true under
// the recompute policy and errKVLoadFailed under the fail policy.
func (s *seq) loadRemoteKV() (recompute bool, err error) {
	e := s.e
	var perr error
	p := s.kv
	valid := p.RemoteEngineID != nil && p.RemoteRequestID != nil && p.RemoteHost != nil && p.RemotePort != nil &&
		validKVHost(*p.RemoteHost) && *p.RemotePort > 0 && *p.RemotePort <= 65535
	switch {
	case !valid:
		perr = errors.New("kv_transfer_params lack remote_engine_id, remote_request_id, remote_host or remote_port, or name no host and port")
	case s.f.kvPullFail:
		perr = errors.New("injected fault kv-pull-fail")
	default:
		perr = e.pullKV(s.ctx, p)
	}
	if s.ctx.Err() != nil {
		return false, errClientGone
	}
	if perr != nil {
		e.kv.loadFailures.Add(1)
		if valid {
			e.kv.failedTransfers.Add(1)
		}
		slog.Debug("kv load failed", "engine", e.cfg.Name, "policy", e.cfg.KVLoadFailurePolicy, "err", perr)
		if e.cfg.KVLoadFailurePolicy == KVLoadRecompute {
			e.kv.recomputed.Add(1)
			return true, nil
		}
		return false, errKVLoadFailed
	}
	e.kv.pulled.Add(1)
	d := time.Duration(s.promptTokens-s.cached) * e.cfg.KVTransferPerToken
	e.observeDelay(delayKVTransfer, d)
	if err := s.wait(d, nil, true); err != nil {
		return false, err
	}
	s.cached = s.promptTokens
	return false, nil
}
