package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/telemetry"
)

func simText(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "tok%d ", i)
	}
	return b.String()
}

func newOpenAIClient(h *harness) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(h.srv.URL+"/v1"),
		option.WithAPIKey("client-key"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(h.client),
	)
}

// TestOpenAIClientEndToEnd drives the gateway with the official Go OpenAI
// client, streaming and not, against two simulated engines.
func TestOpenAIClientEndToEnd(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Name: "s1", Models: []string{"m"}})
	_, s2 := sim(t, enginesim.Config{Name: "s2", Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL}, fleet.EngineConfig{Name: "e2", URL: s2.URL}))
	c := newOpenAIClient(h)
	ctx := context.Background()

	t.Run("chat stream", func(t *testing.T) {
		stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         "m",
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("one two three")},
			MaxTokens:     openai.Int(5),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		var finish string
		var usage openai.CompletionUsage
		events := 0
		for stream.Next() {
			ch := stream.Current()
			events++
			for _, c := range ch.Choices {
				text.WriteString(c.Delta.Content)
				if c.FinishReason != "" {
					finish = c.FinishReason
				}
			}
			if ch.Usage.TotalTokens > 0 {
				usage = ch.Usage
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if got, want := text.String(), simText(5); got != want {
			t.Errorf("content %q, want %q", got, want)
		}
		if finish != "length" {
			t.Errorf("finish_reason %q, want length", finish)
		}
		if usage.PromptTokens != 3 || usage.CompletionTokens != 5 || usage.TotalTokens != 8 {
			t.Errorf("usage %+v, want 3/5/8", usage)
		}
		// role chunk + 5 content + finish + usage
		if events != 8 {
			t.Errorf("got %d chunks, want 8", events)
		}
	})

	t.Run("chat", func(t *testing.T) {
		resp, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "m",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := resp.Choices[0].Message.Content, simText(16); got != want {
			t.Errorf("content %q, want %q", got, want)
		}
		if resp.Choices[0].FinishReason != "stop" {
			t.Errorf("finish_reason %q, want stop", resp.Choices[0].FinishReason)
		}
		if resp.Usage.PromptTokens != 2 || resp.Usage.CompletionTokens != 16 {
			t.Errorf("usage %+v, want 2/16", resp.Usage)
		}
	})

	t.Run("completion stream", func(t *testing.T) {
		stream := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:     "m",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("a b c d")},
			MaxTokens: openai.Int(3),
		})
		var text strings.Builder
		var finish string
		for stream.Next() {
			for _, c := range stream.Current().Choices {
				text.WriteString(c.Text)
				if c.FinishReason != "" {
					finish = string(c.FinishReason)
				}
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != simText(3) || finish != "length" {
			t.Errorf("text %q finish %q, want %q length", text.String(), finish, simText(3))
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		resp, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "m",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"x y", "z"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Data) != 2 || len(resp.Data[0].Embedding) != 16 || resp.Usage.PromptTokens != 3 {
			t.Errorf("got %d vectors of %d, usage %+v; want 2 of 16, 3 prompt tokens", len(resp.Data), len(resp.Data[0].Embedding), resp.Usage)
		}
	})

	h.waitIdle()
	// One streamed chat, one streamed completion and the non-streaming
	// chat, observed (read as a stream: it may be continued): three TTFT
	// samples; the embeddings none.
	if n := h.histCount(telemetry.TimeToFirstTokenName); n != 3 {
		t.Errorf("TTFT samples = %d, want 3", n)
	}
	if n := h.histCount(telemetry.RequestDurationName); n != 4 {
		t.Errorf("duration samples = %d, want 4", n)
	}
	if et := h.errorTypes(); et[""] != 4 {
		t.Errorf("error types %v, want 4 successes", et)
	}
	// 5 tokens stream -> 4 ITL samples; 3 tokens -> 2; the observed 16
	// -> 15.
	if n := h.histCount(telemetry.InterTokenLatencyName); n != 21 {
		t.Errorf("ITL samples = %d, want 21", n)
	}
}

// TestChatStreamThroughCurlShape checks the raw bytes a client sees: the
// engine's events unchanged, ending in [DONE].
func TestChatStreamRawBytes(t *testing.T) {
	_, s1 := sim(t, enginesim.Config{Models: []string{"m"}})
	h := newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: s1.URL}))
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("event stream has Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	body := b.String()
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("stream does not end with [DONE]: %q", body)
	}
	if c := strings.Count(body, `"content":"tok`); c != 2 {
		t.Errorf("%d content events, want 2: %q", c, body)
	}
	h.waitIdle()
}
