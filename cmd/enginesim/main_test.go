package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket starts a writer goroutine (pubMWriter.run) that its Close
	// never stops; an engine with KV events leaves one behind.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		listen  string
		cfg     enginesim.Config
		wantErr bool
	}{
		{
			name:   "defaults",
			listen: "127.0.0.1:8001",
			cfg: enginesim.Config{
				Name: "enginesim", Models: []string{"sim-model"}, TTFT: 20 * time.Millisecond, ITL: 10 * time.Millisecond,
				OutputTokens: 16, MaxOutputTokens: 4096, MaxModelLen: 8192, MaxNumSeqs: 256, KVCacheBlocks: 1024, BlockSize: 16, EmbeddingDim: 16,
				KVLeaseDuration: 30 * time.Second, KVLoadFailurePolicy: "fail", MaxNumBatchedTokens: 2048, KVRole: "kv_both",
				KVEventsEncoding: "map", KVEventsBuffer: 10000, KVEventsQueue: 4096,
			},
		},
		{
			name: "all",
			args: []string{
				"--listen", ":9000", "--name", "e1", "--model", "a,b", "--model", "c", "--ttft", "1s",
				"--ttft-per-token", "2ms", "--itl=30ms", "--output-tokens", "5", "--max-output-tokens", "50",
				"--max-num-seqs", "2", "--max-model-len", "100", "--kv-cache-blocks", "64", "--block-size", "8", "--embedding-dim", "4",
				"--fault", "status=503", "--ttft-per-running", "5ms", "--itl-per-running", "1ms",
				"--lora", "sql=/loras/sql", "--lora", "chat=/loras/chat=v2",
				"--kv-engine-id", "p0", "--kv-side-channel-host", "10.0.0.7", "--kv-side-channel-port", "5600",
				"--kv-lease-duration", "5s", "--kv-transfer-per-token", "20us", "--kv-load-failure-policy", "recompute",
				"--prefill-interference", "--max-num-batched-tokens", "512", "--kv-role", "kv_producer", "--enable-prompt-tokens-details",
				"--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://*:5558", "--kv-events-encoding", "array",
				"--kv-events-topic", "kv@p0@a", "--kv-events-buffer-steps", "100", "--kv-events-max-queue-size", "10", "--kv-events-drop", "3-4",
			},
			listen: ":9000",
			cfg: enginesim.Config{
				Name: "e1", Models: []string{"a", "b", "c"}, TTFT: time.Second, TTFTPerPromptToken: 2 * time.Millisecond,
				ITL: 30 * time.Millisecond, OutputTokens: 5, MaxOutputTokens: 50, MaxModelLen: 100, MaxNumSeqs: 2, KVCacheBlocks: 64,
				BlockSize: 8, EmbeddingDim: 4, Fault: "status=503",
				TTFTPerRunning: 5 * time.Millisecond, ITLPerRunning: time.Millisecond,
				LoRAs:      []enginesim.LoRA{{Name: "sql", Path: "/loras/sql"}, {Name: "chat", Path: "/loras/chat=v2"}},
				KVEngineID: "p0", KVSideChannelHost: "10.0.0.7", KVSideChannelPort: 5600,
				KVLeaseDuration: 5 * time.Second, KVTransferPerToken: 20 * time.Microsecond, KVLoadFailurePolicy: "recompute",
				PrefillInterference: true, MaxNumBatchedTokens: 512, KVRole: "kv_producer", PromptTokensDetails: true,
				KVEvents: "tcp://*:5557", KVEventsReplay: "tcp://*:5558", KVEventsEncoding: "array", KVEventsTopic: "kv@p0@a",
				KVEventsBuffer: 100, KVEventsQueue: 10, KVEventsDrop: "3-4",
			},
		},
		{name: "unknown flag", args: []string{"--nope"}, wantErr: true},
		{name: "bad duration", args: []string{"--ttft", "fast"}, wantErr: true},
		{name: "stray argument", args: []string{"extra"}, wantErr: true},
		{name: "lora without path", args: []string{"--lora", "sql"}, wantErr: true},
		{name: "lora without name", args: []string{"--lora", "=/p"}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr {
				if err == nil {
					t.Errorf("parseFlags(%q) = nil error", tc.args)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.listen != tc.listen || !reflect.DeepEqual(o.cfg, tc.cfg) {
				t.Errorf("got %q %+v\nwant %q %+v", o.listen, o.cfg, tc.listen, tc.cfg)
			}
		})
	}
	if _, err := parseFlags([]string{"-h"}, io.Discard); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestServe(t *testing.T) {
	sv := startServe(t, "--listen", "127.0.0.1:0", "--model", "m", "--ttft", "1ms", "--itl", "1ms")
	addr, logs := sv.addr, sv.logs
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	resp, err := client.Get("http://" + addr.String() + "/health")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/health: %d", resp.StatusCode)
	}
	resp, err = client.Post("http://"+addr.String()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"text":"tok0 tok1 "`) {
		t.Errorf("completion: %d %s", resp.StatusCode, b)
	}

	sv.stop()
	if n := strings.Count(logs.String(), "\n"); n != 1 || !strings.Contains(logs.String(), "enginesim listening") {
		t.Errorf("logs = %q, want one start line", logs.String())
	}
}

// served is serve running on a goroutine for a test: its address, its
// logs, and stop, which cancels it and checks that it returns cleanly
// within 5 s.
type served struct {
	addr net.Addr
	logs *bytes.Buffer
	stop func()
}

// startServe runs serve with args and waits for its listener.
func startServe(t *testing.T, args ...string) served {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logs := &bytes.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, args, io.Discard, log, func(a net.Addr) { addrc <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("serve returned early: %v", err)
	}
	stopped := false
	stop := func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("serve did not return after cancellation")
		}
	}
	t.Cleanup(stop)
	return served{addr: addr, logs: logs, stop: stop}
}

func TestServeErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"invalid config", []string{"--itl", "-1s", "--listen", "127.0.0.1:0"}, "itl must not be negative"},
		{"bad fault", []string{"--fault", "explode", "--listen", "127.0.0.1:0"}, "unknown fault"},
		{"bad kv policy", []string{"--kv-load-failure-policy", "retry", "--listen", "127.0.0.1:0"}, "kv load failure policy"},
		{"bad kv port", []string{"--kv-side-channel-port", "70000", "--listen", "127.0.0.1:0"}, "kv side channel port"},
		{"lora with a model's name", []string{"--model", "m", "--lora", "m=/p", "--listen", "127.0.0.1:0"}, "has the name of a served model"},
		{"bad listen", []string{"--listen", "127.0.0.1:-5"}, "invalid port"},
		{"bad kv events encoding", []string{"--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-encoding", "json"}, "kv events encoding"},
		{"bad kv events endpoint", []string{"--kv-events-endpoint", "127.0.0.1:5557"}, "want tcp://host:port"},
		{"bad flag", []string{"--bogus"}, "unknown flag"},
		{"tls without ca out", []string{"--tls-self-signed", "--listen", "127.0.0.1:0"}, "--tls-self-signed and --tls-ca-out go together"},
		{"bad provider model", []string{"--provider", "openai", "--provider-model", "gpt"}, "want name=served"},
		{"provider without key", []string{"--provider", "azure", "--provider-key-file", "/nonexistent/key"}, "--provider-key-file"},
		{"bad provider", []string{"--provider", "gemini", "--listen", "127.0.0.1:0"}, "provider kind must be"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := serve(context.Background(), tc.args, io.Discard, slog.New(slog.DiscardHandler), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("serve(%q) = %v, want error containing %q", tc.args, err, tc.want)
			}
		})
	}
	if err := serve(context.Background(), []string{"--help"}, io.Discard, slog.New(slog.DiscardHandler), nil); err != nil {
		t.Errorf("--help: %v", err)
	}
}

func TestServeKVEvents(t *testing.T) {
	sv := startServe(t, "--listen", "127.0.0.1:0", "--kv-events-endpoint", "tcp://127.0.0.1:0",
		"--kv-events-replay-endpoint", "tcp://127.0.0.1:0")
	sv.stop()
	logs := sv.logs
	for _, key := range []string{"kv_events=tcp://127.0.0.1:", "kv_events_replay=tcp://127.0.0.1:"} {
		if !strings.Contains(logs.String(), key) {
			t.Errorf("logs = %q, want %s<port>", logs.String(), key)
		}
	}
}

func TestServeProviderTLS(t *testing.T) {
	dir := t.TempDir()
	keyFile, caFile := filepath.Join(dir, "key"), filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(keyFile, []byte("sk-cmd-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sv := startServe(t, "--listen", "127.0.0.1:0", "--model", "m", "--ttft", "1ms", "--itl", "1ms",
		"--provider", "openai", "--provider-key-file", keyFile, "--provider-model", "gpt-4o=m", "--provider-rpm", "10",
		"--tls-self-signed", "--tls-ca-out", caFile)
	addr, logs := sv.addr, sv.logs
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA file %q holds no certificate", caPEM)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, tc := range []struct {
		auth   string
		status int
		want   string
	}{
		{"Bearer sk-cmd-secret", 200, `"model":"gpt-4o"`},
		{"Bearer sk-other", 401, `"code":"invalid_api_key"`},
	} {
		req, _ := http.NewRequest(http.MethodPost, "https://"+addr.String()+"/v1/completions",
			strings.NewReader(`{"model":"gpt-4o","prompt":"hi","max_tokens":2}`))
		req.Header.Set("Authorization", tc.auth)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.want) || resp.ProtoMajor != 2 {
			t.Errorf("%s: %s %d %s, want HTTP/2 %d with %s", tc.auth, resp.Proto, resp.StatusCode, b, tc.status, tc.want)
		}
		if tc.status == 200 && resp.Header.Get("x-ratelimit-remaining-requests") != "9" {
			t.Errorf("x-ratelimit-remaining-requests %q, want 9", resp.Header.Get("x-ratelimit-remaining-requests"))
		}
	}
	sv.stop()
	if strings.Contains(logs.String(), "sk-cmd-secret") || !strings.Contains(logs.String(), "provider=openai") {
		t.Errorf("logs = %q, want the provider and not its key", logs.String())
	}
}

func TestParseFlagsProviderKeyEnv(t *testing.T) {
	t.Setenv("ENGINESIM_PROVIDER_KEY", "sk-env")
	o, err := parseFlags([]string{"--provider", "anthropic", "--provider-model", "claude=m", "--model", "m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := enginesim.ProviderConfig{Kind: "anthropic", Key: "sk-env", Models: map[string]string{"claude": "m"}}
	if !reflect.DeepEqual(o.cfg.Provider, want) {
		t.Errorf("provider %+v, want %+v", o.cfg.Provider, want)
	}
}
