//go:build integration

package integration

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// TestProviderOverflowNode runs the gateway binary in front of a
// self-hosted engine simulator process (tier 0, max_in_flight 1) and a
// provider simulator process (OpenAI mode over TLS with HTTP/2, its own
// CA, a key and a model name of its own; tier 1). With the self-hosted
// engine's one slot held by a stream that stalls after its first token,
// the official openai Node client (integration/node/chat_stream.mjs)
// streams a chat completion with include_usage: it overflows to the
// provider, and the client parses the provider's answer, its content and
// its usage. The overflow shows on /admin/engines (tier 1 overflows_in 1),
// the provider simulator served exactly one request, and the provider's
// key appears nowhere in the gateway's output (logged at debug).
func TestProviderOverflowNode(t *testing.T) {
	node := nodeWithClient(t)

	dir := t.TempDir()
	gwBin := build(t, dir, "./cmd/gateway")
	simBin := build(t, dir, "./cmd/enginesim")
	const model, provModel, outputTokens = "it-model", "gpt-it", 4
	var raw [12]byte
	if _, err := rand.Read(raw[:]); err != nil {
		t.Fatal(err)
	}
	key := "sk-it-provider-" + hex.EncodeToString(raw[:])
	keyPath := filepath.Join(dir, "provider.key")
	if err := os.WriteFile(keyPath, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	local := freePort(t)
	start(t, nil, simBin, "--listen", local, "--name", "local", "--model", model, "--ttft", "5ms", "--itl", "20ms")
	waitHTTP(t, "http://"+local+"/health", 200)

	prov, caPath := freePort(t), filepath.Join(dir, "provider-ca.pem")
	start(t, nil, simBin, "--listen", prov, "--name", "provider", "--model", model, "--ttft", "5ms", "--itl", "2ms",
		"--output-tokens", fmt.Sprint(outputTokens), "--provider", "openai", "--provider-key-file", keyPath,
		"--provider-model", provModel+"="+model, "--tls-self-signed", "--tls-ca-out", caPath)
	var provClient *http.Client
	if !testutil.Poll(20*time.Second, func() bool {
		if provClient == nil {
			provClient = trustingClient(caPath)
			if provClient == nil {
				return false // the CA file is not written yet
			}
		}
		resp, err := provClient.Get("https://" + prov + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK && resp.ProtoMajor == 2
	}) {
		t.Fatalf("the provider simulator did not answer /health over HTTP/2 in time")
	}
	t.Cleanup(provClient.CloseIdleConnections)

	public, admin := freePort(t), freePort(t)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	cfg := fmt.Sprintf(`server:
  listen: %q
admin:
  listen: %q
log:
  level: debug
engines:
  - name: local
    url: http://%s
    models: [%s]
    max_in_flight: 1
  - name: openai
    provider: openai
    url: https://%s/v1
    ca_file: %s
    api_key_file: %s
    model_map: {%s: %s}
    tier: 1
`, public, admin, local, model, prov, caPath, keyPath, model, provModel)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	gw := start(t, nil, gwBin, "--config", cfgPath)
	waitHTTP(t, "http://"+public+"/ready", 200)

	// Hold the self-hosted engine's one slot: a stream that stalls after
	// its first token until its client leaves.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	heldCtx, release := context.WithCancel(ctx)
	defer release()
	req, _ := http.NewRequestWithContext(heldCtx, http.MethodPost, "http://"+public+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","stream":true,"messages":[{"role":"user","content":"hold the slot"}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Enginesim-Fault", "stall-after=1")
	held, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Body.Close()
	if held.StatusCode != http.StatusOK || held.Header.Get("X-Switchboard-Engine") != "local" {
		t.Fatalf("held stream: %d on %q, want 200 on local", held.StatusCode, held.Header.Get("X-Switchboard-Engine"))
	}
	br := bufio.NewReader(held.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("held stream ended before its first token: %v", err)
		}
		if strings.Contains(line, `"content":"tok0`) {
			break
		}
	}

	var got struct {
		Model         string `json:"model"`
		Content       string `json:"content"`
		ContentChunks int    `json:"contentChunks"`
		FinishReason  string `json:"finishReason"`
		Usage         struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	}
	printed := runNode(t, ctx, node, "chat_stream.mjs", &got, "SB_URL=http://"+public, "SB_MODEL="+model)
	var want strings.Builder
	for i := range outputTokens {
		fmt.Fprintf(&want, "tok%d ", i)
	}
	if got.Content != want.String() || got.ContentChunks != outputTokens || got.FinishReason != "stop" {
		t.Errorf("chat: content %q in %d chunks, finish %q; want %q in %d, stop", got.Content, got.ContentChunks, got.FinishReason, want.String(), outputTokens)
	}
	// "hello from node": three prompt tokens to the simulator.
	if got.Usage.PromptTokens != 3 || got.Usage.CompletionTokens != outputTokens || got.Usage.TotalTokens != 3+outputTokens {
		t.Errorf("chat usage %+v, want 3 prompt and %d completion tokens", got.Usage, outputTokens)
	}

	// The held stream is still on local: the Node request could only
	// have overflowed. Let it go.
	release()
	held.Body.Close()

	var engines struct {
		Tiers []struct {
			Tier         int   `json:"tier"`
			Legs         int64 `json:"legs"`
			OverflowsIn  int64 `json:"overflows_in"`
			OverflowsOut int64 `json:"overflows_out"`
		} `json:"tiers"`
	}
	b := getBody(t, http.DefaultClient, "http://"+admin+"/admin/engines")
	if err := json.Unmarshal(b, &engines); err != nil {
		t.Fatalf("/admin/engines: %v: %s", err, b)
	}
	if len(engines.Tiers) != 2 || engines.Tiers[1].Tier != 1 || engines.Tiers[1].OverflowsIn != 1 || engines.Tiers[1].Legs != 1 ||
		engines.Tiers[0].OverflowsOut != 1 || engines.Tiers[0].Legs != 1 {
		t.Errorf("/admin/engines tiers %+v, want tier 0 with 1 leg and 1 overflow out, tier 1 with 1 leg and 1 overflow in", engines.Tiers)
	}
	// The provider simulator served exactly that one request.
	m := string(getBody(t, provClient, "https://"+prov+"/metrics"))
	if n := sampleSum(m, "vllm:request_success_total"); n != 1 {
		t.Errorf("the provider simulator finished %v requests, want 1", n)
	}
	// And the gateway's Prometheus endpoint counted the overflow.
	if n := sampleSum(string(getBody(t, http.DefaultClient, "http://"+admin+"/metrics")), "switchboard_tier_overflows"); n != 1 {
		t.Errorf("switchboard_tier_overflows* on the admin /metrics sum to %v, want 1", n)
	}

	out := gw.output()
	for _, secret := range []string{key, key[len(key)-8:]} {
		if strings.Contains(out, secret) {
			t.Errorf("the gateway's output holds the provider key (or its end %q)", secret)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("chat_stream.mjs: %s", printed)
	}
}

// trustingClient returns an HTTP/2-capable client trusting only the CA
// in caPath, or nil when the file holds no certificate yet.
func trustingClient(caPath string) *http.Client {
	pem, err := os.ReadFile(caPath)
	if err != nil {
		return nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil
	}
	return &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
}

// getBody GETs url with c and returns its body, failing the test unless
// it answers 200.
func getBody(t *testing.T, c *http.Client, url string) []byte {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v: %s", url, resp.StatusCode, err, b)
	}
	return b
}

// sampleSum sums the values of the Prometheus text exposition samples in
// text whose metric name starts with prefix (counter suffixes such as
// _total included), or -1 when there is none.
func sampleSum(text, prefix string) float64 {
	sum, found := 0.0, false
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscanf(line[i+1:], "%g", &v); err != nil {
			continue
		}
		sum, found = sum+v, true
	}
	if !found {
		return -1
	}
	return sum
}
