// Command enginesim serves one simulated vLLM engine (see package internal/enginesim) over
// HTTP, for demos, tests and benchmarks without a GPU.
//
//	enginesim --listen 127.0.0.1:8001 --model llama-8b,qwen-7b --ttft 50ms --itl 20ms
//
// --ttft-per-running and --itl-per-running (default 0, off) make latency grow with the
// number of running sequences; see the package documentation's Scheduling section.
//
// --lora name=path (repeatable, like vLLM's --lora-modules) loads a LoRA adapter on the
// first model at start; more can be loaded at run time with POST /v1/load_lora_adapter.
//
// --otlp-traces-endpoint URL (vLLM's flag) makes it emit vLLM's llm_request span for every
// generation request, parented on the request's traceparent, exported over OTLP/gRPC, or
// over OTLP/HTTP with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (then URL is the full
// http://host:4318/v1/traces); OTEL_SERVICE_NAME names the service (default vllm-server).
//
//	enginesim --model llama-8b --otlp-traces-endpoint http://127.0.0.1:4317
//
// Prefill/decode disaggregation (vLLM's NixlConnector contract, see the package
// documentation's "Prefill and decode" section): every engine answers a prefill leg
// (kv_transfer_params with do_remote_decode) with the params a decode engine pulls the
// prompt's KV with, over the simulator's POST /sim/kv/pull. --kv-engine-id (default a random
// UUID) is its remote_engine_id; --kv-side-channel-host and --kv-side-channel-port (default
// the listener's address) are the remote_host and remote_port it returns; --kv-lease-duration
// (default 30s, vLLM's kv_lease_duration) is how long it holds the blocks;
// --kv-transfer-per-token is a decode engine's pull time per prompt token, in place of the
// prefill compute; --kv-load-failure-policy fail|recompute (vLLM's, default fail) is what a
// decode engine does when the pull fails.
//
//	enginesim --listen 127.0.0.1:8002 --kv-transfer-per-token 20us --kv-load-failure-policy recompute
//
// KV-cache events (vLLM's --kv-events-config, see the package documentation's "KV-cache
// events" section): --kv-events-endpoint tcp://host:port (port 0 picks a free one, logged
// at start as kv_events) turns them on: the simulated prefix cache publishes vLLM's
// BlockStored, BlockRemoved and AllBlocksCleared batches on a ZMQ PUB socket bound there.
// --kv-events-replay-endpoint binds the ROUTER socket that replays the last
// --kv-events-buffer-steps batches (default 10000); --kv-events-encoding map|array picks
// vLLM's event encoding since or before PR #42892 (default map); --kv-events-topic sets the
// topic frame; --kv-events-max-queue-size bounds the batches waiting to be published.
// --kv-events-drop N-M withholds batches N..M from PUB (they stay replayable);
// POST /admin/kv-events/drop (a range as its body, empty to remove), /admin/kv-events/stop,
// /resume and /restart break the stream while the engine runs:
//
//	enginesim --kv-events-endpoint tcp://127.0.0.1:5557 --kv-events-replay-endpoint tcp://127.0.0.1:5558
//	curl -d 10-12 http://127.0.0.1:8001/admin/kv-events/drop
//
// --fault SPEC sets the default fault of requests without an X-Enginesim-Fault header;
// POST /admin/fault with a spec as its body replaces it while the engine runs (an empty
// body removes it), so a benchmark can break a running engine from outside:
//
//	curl -d error-after=8 http://127.0.0.1:8001/admin/fault
//
// Hosted provider mode (see the package documentation's "Hosted providers" section):
// --provider openai|azure|anthropic requires the key read from --provider-key-file (its
// content, surrounding white space trimmed) or, without that flag, from the environment
// variable ENGINESIM_PROVIDER_KEY (never from the command line, where ps would show it);
// --provider-model name=served (repeatable) maps a provider model or Azure deployment name
// to a served model; --provider-rpm N (default 0: none) sets the request rate limit.
// --tls-self-signed serves HTTPS (and HTTP/2) with a new self-signed CA and certificate for
// 127.0.0.1, ::1 and localhost, valid 24 hours, and writes the CA's PEM to the path given by
// --tls-ca-out (required with it) for clients to trust:
//
//	ENGINESIM_PROVIDER_KEY=sk-test enginesim --provider openai --provider-model gpt-4o=sim-model \
//	    --provider-rpm 60 --tls-self-signed --tls-ca-out /tmp/enginesim-ca.pem
//
// It stops on SIGINT or SIGTERM, draining in-flight requests for up to 5 s, then flushes the
// spans still buffered (for up to 5 s more).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// shutdownTimeout bounds the graceful drain on SIGINT/SIGTERM.
const shutdownTimeout = 5 * time.Second

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "enginesim:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	return serve(ctx, os.Args[1:], os.Stderr, log, nil)
}

// options is the parsed command line.
type options struct {
	listen         string
	tracesEndpoint string // --otlp-traces-endpoint; "" for no spans
	tlsSelfSigned  bool   // --tls-self-signed: serve HTTPS with a certificate from NewTestTLS
	tlsCAOut       string // --tls-ca-out: where the CA's PEM is written
	cfg            enginesim.Config
}

// providerKeyEnv is the environment variable the provider key is read from without
// --provider-key-file.
const providerKeyEnv = "ENGINESIM_PROVIDER_KEY"

// parseFlags parses args; usage and flag errors go to out. It returns pflag.ErrHelp for -h.
func parseFlags(args []string, out io.Writer) (options, error) {
	var o options
	fs := pflag.NewFlagSet("enginesim", pflag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8001", "address to listen on (host:port)")
	fs.StringVar(&o.cfg.Name, "name", enginesim.DefaultName, "engine name, for logs")
	fs.StringSliceVar(&o.cfg.Models, "model", []string{enginesim.DefaultModel}, "served model name (repeatable or comma-separated)")
	fs.DurationVar(&o.cfg.TTFT, "ttft", enginesim.DefaultTTFT, "base time to first token (prefill)")
	fs.DurationVar(&o.cfg.TTFTPerPromptToken, "ttft-per-token", 0, "time to first token added per uncached prompt token")
	fs.DurationVar(&o.cfg.TTFTPerRunning, "ttft-per-running", 0, "time to first token added per other running sequence when prefill starts (0: off)")
	fs.DurationVar(&o.cfg.ITL, "itl", enginesim.DefaultITL, "inter-token latency (one decode step)")
	fs.DurationVar(&o.cfg.ITLPerRunning, "itl-per-running", 0, "inter-token latency added per other running sequence, at each token (0: off)")
	fs.IntVar(&o.cfg.OutputTokens, "output-tokens", enginesim.DefaultOutputTokens, "tokens generated when a request sets no max_tokens")
	fs.IntVar(&o.cfg.MaxOutputTokens, "max-output-tokens", enginesim.DefaultMaxOutputTokens, "cap on a request's max_tokens")
	fs.IntVar(&o.cfg.MaxModelLen, "max-model-len", enginesim.DefaultMaxModelLen, "context length: a prompt plus max_tokens over it gets vLLM's 400")
	fs.IntVar(&o.cfg.MaxNumSeqs, "max-num-seqs", enginesim.DefaultMaxNumSeqs, "maximum running sequences; more requests wait in a FIFO queue")
	fs.BoolVar(&o.cfg.PrefillInterference, "prefill-interference", false, "model continuous batching with chunked prefill: a prompt's prefill chunks stretch the decode steps of the other running sequences")
	fs.IntVar(&o.cfg.MaxNumBatchedTokens, "max-num-batched-tokens", enginesim.DefaultMaxNumBatchedTokens, "token budget of one engine step, with --prefill-interference (vLLM's max_num_batched_tokens; at least --max-num-seqs)")
	fs.IntVar(&o.cfg.KVCacheBlocks, "kv-cache-blocks", enginesim.DefaultKVCacheBlocks, "simulated KV cache capacity, in blocks")
	fs.IntVar(&o.cfg.BlockSize, "block-size", enginesim.DefaultBlockSize, "tokens per KV cache block")
	fs.IntVar(&o.cfg.EmbeddingDim, "embedding-dim", enginesim.DefaultEmbeddingDim, "length of embedding vectors")
	fs.StringVar(&o.cfg.KVEngineID, "kv-engine-id", "", "P/D: this engine's remote_engine_id in the kv_transfer_params it returns (default a random UUID)")
	fs.StringVar(&o.cfg.KVSideChannelHost, "kv-side-channel-host", "", "P/D: remote_host decode engines pull KV from, as vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST (default the listener's host)")
	fs.IntVar(&o.cfg.KVSideChannelPort, "kv-side-channel-port", 0, "P/D: remote_port decode engines pull KV from, as vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT (default the listener's port)")
	fs.DurationVar(&o.cfg.KVLeaseDuration, "kv-lease-duration", enginesim.DefaultKVLeaseDuration, "P/D: how long a prefill leg's KV blocks are held for the decode engine's pull (vLLM's kv_lease_duration)")
	fs.DurationVar(&o.cfg.KVTransferPerToken, "kv-transfer-per-token", 0, "P/D: a decode leg's KV pull time per prompt token, in place of the prefill compute")
	fs.StringVar(&o.cfg.KVRole, "kv-role", enginesim.KVRoleBoth, "P/D: vLLM's kv_role: kv_both (either leg), kv_producer (prefill legs only) or kv_consumer (decode legs only)")
	fs.BoolVar(&o.cfg.PromptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens when the prefix cache hits (vLLM's flag)")
	fs.StringVar(&o.cfg.KVLoadFailurePolicy, "kv-load-failure-policy", enginesim.KVLoadFail, "P/D: what a decode leg does when its KV pull fails: fail (vLLM's 500) or recompute (vLLM's kv_load_failure_policy)")
	fs.StringVar(&o.cfg.Fault, "fault", "", "default fault spec for requests without an X-Enginesim-Fault header: comma-separated keys, e.g. status=503,retry-after=2 or close-after=3.\n"+
		"Keys: status=CODE, error-body=json|html|text|empty, retry-after=SECONDS, close-before-headers, close-after-headers, close-after=N,\n"+
		"reset-after=N, error-after=N, drain-after=N, stall-before-headers[=DUR], stall-after=N, slow-headers=DUR, trickle[=DUR], keepalive, malformed, truncate, no-content, reasoning, tool-call, powered-by,\n"+
		"kv-no-params, kv-pull-fail\n"+
		"(go doc ./internal/enginesim says what each does)")
	fs.StringVar(&o.tracesEndpoint, "otlp-traces-endpoint", "", "OTLP endpoint to send vLLM's llm_request spans to, as vLLM's flag (gRPC; OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf for OTLP/HTTP)")
	fs.StringVar(&o.cfg.KVEvents, "kv-events-endpoint", "", "KV-cache events: ZMQ endpoint the PUB socket binds, tcp://host:port (port 0: a free one) or ipc://path (vLLM's kv-events-config endpoint; \"\": off)")
	fs.StringVar(&o.cfg.KVEventsReplay, "kv-events-replay-endpoint", "", "KV-cache events: endpoint of the ROUTER socket that replays buffered batches (vLLM's replay_endpoint; \"\": none)")
	fs.StringVar(&o.cfg.KVEventsEncoding, "kv-events-encoding", enginesim.KVEventsEncodingMap, "KV-cache events: map (events as maps, vLLM since PR #42892) or array (positional arrays, vLLM before)")
	fs.StringVar(&o.cfg.KVEventsTopic, "kv-events-topic", "", "KV-cache events: first frame of every PUB message (vLLM's topic)")
	fs.IntVar(&o.cfg.KVEventsBuffer, "kv-events-buffer-steps", enginesim.DefaultKVEventsBuffer, "KV-cache events: batches kept for replay (vLLM's buffer_steps)")
	fs.IntVar(&o.cfg.KVEventsQueue, "kv-events-max-queue-size", enginesim.DefaultKVEventsQueue, "KV-cache events: batches waiting for the publisher; beyond, a batch is dropped and its seq skipped (vLLM's max_queue_size)")
	fs.StringVar(&o.cfg.KVEventsDrop, "kv-events-drop", "", "KV-cache events fault: N or N-M, the seqs of batches not sent on PUB but kept for replay (POST /admin/kv-events/drop replaces it)")
	loras := fs.StringArray("lora", nil, "LoRA adapter loaded at start on the first model, as name=path (repeatable)")
	fs.StringVar(&o.cfg.Provider.Kind, "provider", "", "hosted provider mode: openai, azure or anthropic (\"\": off, a vLLM engine)")
	keyFile := fs.String("provider-key-file", "", "provider mode: file holding the API key requests must carry (default: the "+providerKeyEnv+" environment variable)")
	provModels := fs.StringArray("provider-model", nil, "provider mode: provider model (or Azure deployment) name mapped to a served model, as name=served (repeatable); served must be one of --model")
	fs.IntVar(&o.cfg.Provider.RequestsPerMinute, "provider-rpm", 0, "provider mode: requests allowed per one-minute window, beyond which the provider's 429 (0: no limit)")
	fs.BoolVar(&o.tlsSelfSigned, "tls-self-signed", false, "serve HTTPS and HTTP/2 with a new self-signed CA and a certificate for 127.0.0.1 and localhost (needs --tls-ca-out)")
	fs.StringVar(&o.tlsCAOut, "tls-ca-out", "", "with --tls-self-signed: file the CA certificate is written to, in PEM")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, l := range *loras {
		name, path, ok := strings.Cut(l, "=")
		if !ok || name == "" || path == "" {
			return o, fmt.Errorf("--lora %q: want name=path", l)
		}
		o.cfg.LoRAs = append(o.cfg.LoRAs, enginesim.LoRA{Name: name, Path: path})
	}
	for _, m := range *provModels {
		name, served, ok := strings.Cut(m, "=")
		if !ok || name == "" || served == "" {
			return o, fmt.Errorf("--provider-model %q: want name=served", m)
		}
		if o.cfg.Provider.Models == nil {
			o.cfg.Provider.Models = make(map[string]string)
		}
		o.cfg.Provider.Models[name] = served
	}
	if o.cfg.Provider.Kind != "" {
		if *keyFile != "" {
			b, err := os.ReadFile(*keyFile)
			if err != nil {
				return o, fmt.Errorf("--provider-key-file: %w", err)
			}
			o.cfg.Provider.Key = strings.TrimSpace(string(b))
		} else {
			o.cfg.Provider.Key = os.Getenv(providerKeyEnv)
		}
	}
	if o.tlsSelfSigned != (o.tlsCAOut != "") {
		return o, errors.New("--tls-self-signed and --tls-ca-out go together")
	}
	return o, nil
}

// serve runs the engine on the address from args until ctx is done, then shuts the server
// down gracefully. ready, if not nil, is called with the listening address once the server
// accepts connections.
func serve(ctx context.Context, args []string, out io.Writer, log *slog.Logger, ready func(net.Addr)) (err error) {
	o, err := parseFlags(args, out)
	if errors.Is(err, pflag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if o.tracesEndpoint != "" {
		tp, terr := newTracerProvider(ctx, o.tracesEndpoint)
		if terr != nil {
			return terr
		}
		// Runs after the server's drain below: the drained requests' spans are flushed too.
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			if serr := tp.Shutdown(sctx); serr != nil {
				err = errors.Join(err, fmt.Errorf("trace export shutdown: %w", serr))
			}
		}()
		o.cfg.TracerProvider = tp
	}
	e, err := enginesim.New(o.cfg)
	if err != nil {
		return err
	}
	// Runs after the server's drain below: the drained requests' KV events are queued.
	defer func() {
		if cerr := e.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("kv events close: %w", cerr))
		}
	}()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	// No WriteTimeout: streams and stall faults run for as long as the client stays.
	srv := &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 10 * time.Second}
	if o.tlsSelfSigned {
		cert, caPEM, terr := enginesim.NewTestTLS()
		if terr == nil {
			terr = os.WriteFile(o.tlsCAOut, caPEM, 0o644)
		}
		if terr != nil {
			_ = ln.Close()
			return fmt.Errorf("tls: %w", terr)
		}
		// ServeTLS adds "h2" to NextProtos: HTTP/2 for clients that offer it.
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	errc := make(chan error, 1)
	go func() {
		if o.tlsSelfSigned {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	log.Info("enginesim listening", "addr", ln.Addr().String(), "name", o.cfg.Name, "models", o.cfg.Models,
		"ttft", o.cfg.TTFT, "itl", o.cfg.ITL, "ttft_per_running", o.cfg.TTFTPerRunning,
		"itl_per_running", o.cfg.ITLPerRunning, "max_num_seqs", o.cfg.MaxNumSeqs,
		"prefill_interference", o.cfg.PrefillInterference, "max_num_batched_tokens", o.cfg.MaxNumBatchedTokens, "fault", o.cfg.Fault,
		"loras", len(o.cfg.LoRAs), "otlp_traces_endpoint", o.tracesEndpoint,
		"kv_events", e.KVEventsAddr(), "kv_events_replay", e.KVReplayAddr(),
		"provider", o.cfg.Provider.Kind, "provider_rpm", o.cfg.Provider.RequestsPerMinute, "tls", o.tlsSelfSigned)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err = srv.Shutdown(sctx); err != nil {
		// Requests still running (a stall fault, a slow client): cut them off.
		err = errors.Join(fmt.Errorf("shutdown: %w", err), srv.Close())
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
