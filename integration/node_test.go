//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nodeResult is what integration/node/clients.mjs prints on success.
type nodeResult struct {
	Chat struct {
		Content       string `json:"content"`
		ContentChunks int    `json:"contentChunks"`
		FinishReason  string `json:"finishReason"`
		Usage         struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		} `json:"usage"`
	} `json:"chat"`
	Responses struct {
		Text   string `json:"text"`
		Deltas int    `json:"deltas"`
		First  string `json:"first"`
		Last   string `json:"last"`
		Status string `json:"status"`
		Usage  struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	} `json:"responses"`
}

// TestNodeOpenAIClient runs integration/node/clients.mjs, which uses the
// official openai npm package (pinned in integration/node/package.json),
// against the gateway binary in front of two engine simulator processes:
// a streamed chat completion with include_usage and a streamed Responses
// API call must parse in the Node client and carry the simulator's tokens.
// It needs node and the installed packages (integration/run.sh and .ci/run
// run npm ci first).
func TestNodeOpenAIClient(t *testing.T) {
	node := nodeWithClient(t)

	dir := t.TempDir()
	gwBin := build(t, dir, "./cmd/gateway")
	simBin := build(t, dir, "./cmd/enginesim")
	col := newCollector(t)
	const model, outputTokens = "it-model", 4
	var engines []string
	for i := range 2 {
		addr := freePort(t)
		start(t, nil, simBin, "--listen", addr, "--name", fmt.Sprintf("sim%d", i), "--model", model,
			"--ttft", "5ms", "--itl", "2ms", "--output-tokens", fmt.Sprint(outputTokens))
		waitHTTP(t, "http://"+addr+"/health", 200)
		engines = append(engines, fmt.Sprintf("  - name: sim%d\n    url: http://%s\n", i, addr))
	}
	public := freePort(t)
	cfgPath := filepath.Join(dir, "gateway.yaml")
	cfg := "server:\n  listen: \"" + public + "\"\nadmin:\n  listen: \"\"\nengines:\n" + strings.Join(engines, "")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + col.srv.URL, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"}, gwBin, "--config", cfgPath)
	waitHTTP(t, "http://"+public+"/ready", 200)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// No output limit: both calls end naturally ("stop", "completed") after
	// the engines' outputTokens tokens.
	var got nodeResult
	printed := runNode(t, ctx, node, "clients.mjs", &got, "SB_URL=http://"+public, "SB_MODEL="+model)

	var want strings.Builder
	for i := range outputTokens {
		fmt.Fprintf(&want, "tok%d ", i)
	}
	// "hello from node": three prompt tokens to the simulator.
	c := got.Chat
	if c.Content != want.String() || c.ContentChunks != outputTokens || c.FinishReason != "stop" {
		t.Errorf("chat: content %q in %d chunks, finish %q; want %q in %d, stop", c.Content, c.ContentChunks, c.FinishReason, want.String(), outputTokens)
	}
	if c.Usage.PromptTokens != 3 || c.Usage.CompletionTokens != outputTokens || c.Usage.TotalTokens != 3+outputTokens {
		t.Errorf("chat usage %+v, want 3 prompt and %d completion tokens", c.Usage, outputTokens)
	}
	r := got.Responses
	if r.Text != want.String() || r.Deltas != outputTokens || r.First != "response.created" || r.Last != "response.completed" || r.Status != "completed" {
		t.Errorf("responses: text %q in %d deltas, events %s..%s, status %q; want %q in %d, response.created..response.completed, completed",
			r.Text, r.Deltas, r.First, r.Last, r.Status, want.String(), outputTokens)
	}
	if r.Usage.InputTokens != 3 || r.Usage.OutputTokens != outputTokens || r.Usage.TotalTokens != 3+outputTokens {
		t.Errorf("responses usage %+v, want 3 input and %d output tokens", r.Usage, outputTokens)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("clients.mjs: %s", printed)
	}
}

// nodeWithClient returns the node binary, skipping the test when node is
// not installed and failing it when integration/node's packages are not
// (integration/run.sh and .ci/run install them).
func nodeWithClient(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the Node client test needs node (v20 or later) and npm")
	}
	if _, err := os.Stat(filepath.Join("node", "node_modules", "openai", "package.json")); err != nil {
		t.Fatalf("integration/node/node_modules has no openai package (%v): run `(cd integration/node && npm ci)`, or integration/run.sh, which does it", err)
	}
	return node
}

// runNode runs integration/node/script with node and env added to a clean
// environment, and decodes the one JSON line it prints into out; a
// failed run or output that is not that JSON fails the test, with the
// script's stderr. It returns what the script printed (stdout, then
// stderr).
func runNode(t *testing.T, ctx context.Context, node, script string, out any, env ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, node, filepath.Join("node", script))
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("node %s exited %d:\n%s%s", script, exit.ExitCode(), stderr.String(), stdout.String())
		}
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), out); err != nil {
		t.Fatalf("%s printed %q: %v (stderr %q)", script, stdout.String(), err, stderr.String())
	}
	return stdout.String() + stderr.String()
}
