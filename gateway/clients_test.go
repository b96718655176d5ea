package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

// The tests in this file call the gateway through the official clients
// (openai-go and anthropic-sdk-go), as users do, against a simulated
// engine: every field a client needs must be there and every event must
// parse, and a broken stream must surface as the client's error.

// clientOutputTokens is how many tokens the simulator generates when a
// request sets no limit (or a limit above it).
const clientOutputTokens = 5

// slashModel is a served model whose id has a slash, as Hugging Face ids do.
const slashModel = "org/sim-7b"

// clientHarness starts a simulated engine serving "m" and slashModel (fast:
// a few ms per request) behind a gateway.
func clientHarness(t *testing.T) (*harness, *bodyRecorder) {
	t.Helper()
	models := []string{"m", slashModel}
	_, rec, srv := recordedSim(t, enginesim.Config{Models: models, OutputTokens: clientOutputTokens})
	return newHarness(t, testConfig(fleet.EngineConfig{Name: "e1", URL: srv.URL, Models: models})), rec
}

// openAIClient returns an openai-go client pointed at the gateway.
func openAIClient(h *harness, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(h.srv.URL + "/v1/"),
		option.WithAPIKey("unused"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(h.client),
	}, opts...)...)
}

// anthropicClient returns an anthropic-sdk-go client pointed at the gateway.
func anthropicClient(h *harness, opts ...anthropicoption.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]anthropicoption.RequestOption{
		anthropicoption.WithBaseURL(h.srv.URL),
		anthropicoption.WithAPIKey("unused"),
		anthropicoption.WithMaxRetries(0),
		anthropicoption.WithHTTPClient(h.client),
	}, opts...)...)
}

// clientCtx bounds a client call, so a hung stream fails the test instead
// of the whole run.
func clientCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestOpenAIClientChat sends a chat completion with openai-go, without and
// with streaming: the content is the simulator's tokens, the usage counts
// the prompt's words and the generated tokens, and a stream's chunks
// accumulate to the same completion.
func TestOpenAIClientChat(t *testing.T) {
	h, _ := clientHarness(t)
	client := openAIClient(h)
	params := openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there gateway")},
	}

	t.Run("non-streaming", func(t *testing.T) {
		c, err := client.Chat.Completions.New(clientCtx(t), params)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Choices) != 1 {
			t.Fatalf("%d choices, want 1: %s", len(c.Choices), c.RawJSON())
		}
		ch := c.Choices[0]
		if ch.Message.Content != simText(clientOutputTokens) || ch.FinishReason != "stop" || ch.Message.Role != "assistant" {
			t.Errorf("choice %q finish %q role %q, want %q stop assistant", ch.Message.Content, ch.FinishReason, ch.Message.Role, simText(clientOutputTokens))
		}
		if c.Model != "m" || c.Object != "chat.completion" || c.ID == "" {
			t.Errorf("model %q object %q id %q", c.Model, c.Object, c.ID)
		}
		if u := c.Usage; u.PromptTokens != 3 || u.CompletionTokens != clientOutputTokens || u.TotalTokens != 3+clientOutputTokens {
			t.Errorf("usage %+v, want 3 prompt and %d completion tokens", u, clientOutputTokens)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		p := params
		p.MaxCompletionTokens = openai.Int(3)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(clientCtx(t), p)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		var content strings.Builder
		contentChunks, usageChunks := 0, 0
		for stream.Next() {
			chunk := stream.Current()
			if !acc.AddChunk(chunk) {
				t.Fatalf("the accumulator refused chunk %s", chunk.RawJSON())
			}
			for _, c := range chunk.Choices {
				if c.Delta.Content != "" {
					contentChunks++
					content.WriteString(c.Delta.Content)
				}
			}
			if chunk.JSON.Usage.Valid() && chunk.Usage.TotalTokens > 0 {
				usageChunks++
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream error: %v", err)
		}
		if content.String() != simText(3) || contentChunks != 3 {
			t.Errorf("content %q in %d chunks, want %q in 3", content.String(), contentChunks, simText(3))
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != simText(3) || acc.Choices[0].FinishReason != "length" {
			t.Errorf("accumulated %+v, want %q finish length", acc.Choices, simText(3))
		}
		if usageChunks != 1 || acc.Usage.PromptTokens != 3 || acc.Usage.CompletionTokens != 3 || acc.Usage.TotalTokens != 6 {
			t.Errorf("%d usage chunks, usage %+v, want one with 3 prompt and 3 completion tokens", usageChunks, acc.Usage)
		}
	})

	t.Run("streaming without include_usage", func(t *testing.T) {
		// The gateway asks the engine for usage itself; the client did not
		// ask and must not get a usage chunk (its choices would be empty).
		stream := client.Chat.Completions.NewStreaming(clientCtx(t), params)
		defer stream.Close()
		var content strings.Builder
		for stream.Next() {
			chunk := stream.Current()
			if len(chunk.Choices) == 0 {
				t.Errorf("a chunk without choices the client did not ask for: %s", chunk.RawJSON())
			}
			for _, c := range chunk.Choices {
				content.WriteString(c.Delta.Content)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream error: %v", err)
		}
		if content.String() != simText(clientOutputTokens) {
			t.Errorf("content %q, want %q", content.String(), simText(clientOutputTokens))
		}
	})
	h.waitIdle()
}

// TestOpenAIClientChatErrors checks that openai-go raises the gateway's
// errors: an unknown model is a 404 *openai.Error, and a stream the engine
// breaks after two tokens ends with an error from stream.Err, after the
// two tokens.
func TestOpenAIClientChatErrors(t *testing.T) {
	h, _ := clientHarness(t)
	client := openAIClient(h)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}

	t.Run("unknown model", func(t *testing.T) {
		_, err := client.Chat.Completions.New(clientCtx(t), openai.ChatCompletionNewParams{Model: "nope", Messages: msgs})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Message == "" {
			t.Fatalf("got %v, want a 404 *openai.Error with a message", err)
		}
	})

	t.Run("broken stream", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(clientCtx(t), openai.ChatCompletionNewParams{Model: "m", Messages: msgs},
			option.WithHeader(enginesim.FaultHeader, "close-after=2"))
		defer stream.Close()
		var content strings.Builder
		for stream.Next() {
			for _, c := range stream.Current().Choices {
				content.WriteString(c.Delta.Content)
			}
		}
		if stream.Err() == nil {
			t.Fatalf("a stream cut after 2 tokens ended without an error (content %q)", content.String())
		}
		if content.String() != simText(2) {
			t.Errorf("content before the error %q, want %q", content.String(), simText(2))
		}
		// The gateway's error event, not a cut connection.
		var se *ssestream.StreamError
		if !errors.As(stream.Err(), &se) || !strings.Contains(string(se.Event.Data), `"error"`) {
			t.Errorf("stream error %v (%T), want the gateway's error event", stream.Err(), stream.Err())
		}
	})
	h.waitIdle()
}

// TestOpenAIClientResponses calls the Responses API with openai-go,
// without and with streaming: the output text is the simulator's tokens,
// the usage counts them, and a stream's events parse, carry the text in
// response.output_text.delta and end with response.completed. A response
// cut by max_output_tokens is "incomplete" (reason max_output_tokens); its
// stream still ends with response.completed, as vLLM's does.
func TestOpenAIClientResponses(t *testing.T) {
	h, _ := clientHarness(t)
	client := openAIClient(h)
	for _, tc := range []struct {
		name   string
		limit  int64 // max_output_tokens; 0: none
		tokens int
		status responses.ResponseStatus
		reason string // incomplete_details.reason
	}{
		{"natural end", 0, clientOutputTokens, responses.ResponseStatusCompleted, ""},
		{"max_output_tokens", 3, 3, responses.ResponseStatusIncomplete, "max_output_tokens"},
	} {
		params := responses.ResponseNewParams{
			Model: "m",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello there gateway")},
		}
		if tc.limit > 0 {
			params.MaxOutputTokens = openai.Int(tc.limit)
		}
		check := func(t *testing.T, r *responses.Response) {
			t.Helper()
			if got := r.OutputText(); got != simText(tc.tokens) {
				t.Errorf("output text %q, want %q (%s)", got, simText(tc.tokens), r.RawJSON())
			}
			if r.Model != "m" || r.Object != "response" || !strings.HasPrefix(r.ID, "resp") {
				t.Errorf("model %q object %q id %q", r.Model, r.Object, r.ID)
			}
			if r.Status != tc.status || string(r.IncompleteDetails.Reason) != tc.reason {
				t.Errorf("status %q incomplete_details %q, want %q %q", r.Status, r.IncompleteDetails.Reason, tc.status, tc.reason)
			}
			if u := r.Usage; u.InputTokens != 3 || u.OutputTokens != int64(tc.tokens) || u.TotalTokens != 3+int64(tc.tokens) {
				t.Errorf("usage %+v, want 3 input and %d output tokens", u, tc.tokens)
			}
		}

		t.Run("non-streaming "+tc.name, func(t *testing.T) {
			r, err := client.Responses.New(clientCtx(t), params)
			if err != nil {
				t.Fatal(err)
			}
			check(t, r)
		})

		t.Run("streaming "+tc.name, func(t *testing.T) {
			stream := client.Responses.NewStreaming(clientCtx(t), params)
			defer stream.Close()
			var types []string
			var text strings.Builder
			var completed responses.Response
			for stream.Next() {
				ev := stream.Current()
				types = append(types, ev.Type)
				switch ev.Type {
				case "response.output_text.delta":
					text.WriteString(ev.Delta)
				case "response.completed":
					completed = ev.AsResponseCompleted().Response
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream error after %v: %v", types, err)
			}
			if len(types) < 3 || types[0] != "response.created" || types[len(types)-1] != "response.completed" {
				t.Fatalf("events %v, want response.created first and response.completed last", types)
			}
			if text.String() != simText(tc.tokens) {
				t.Errorf("deltas %q, want %q", text.String(), simText(tc.tokens))
			}
			check(t, &completed)
		})
	}

	t.Run("broken stream", func(t *testing.T) {
		stream := client.Responses.NewStreaming(clientCtx(t), responses.ResponseNewParams{
			Model: "m",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		}, option.WithHeader(enginesim.FaultHeader, "close-after=2"))
		defer stream.Close()
		var text strings.Builder
		for stream.Next() {
			if ev := stream.Current(); ev.Type == "response.output_text.delta" {
				text.WriteString(ev.Delta)
			}
		}
		if stream.Err() == nil {
			t.Fatalf("a stream cut after 2 tokens ended without an error (text %q)", text.String())
		}
		if text.String() != simText(2) {
			t.Errorf("text before the error %q, want %q", text.String(), simText(2))
		}
	})
	h.waitIdle()
}

// TestOpenAIClientEmbeddings embeds two inputs with openai-go: two unit
// vectors in input order, the same vectors the engine gives directly.
func TestOpenAIClientEmbeddings(t *testing.T) {
	h, _ := clientHarness(t)
	client := openAIClient(h)
	res, err := client.Embeddings.New(clientCtx(t), openai.EmbeddingNewParams{
		Model: "m",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"one two", "three"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Data) != 2 || res.Model != "m" {
		t.Fatalf("%d embeddings for model %q, want 2 for m", len(res.Data), res.Model)
	}
	for i, d := range res.Data {
		var norm float64
		for _, x := range d.Embedding {
			norm += x * x
		}
		if d.Index != int64(i) || len(d.Embedding) != enginesim.DefaultEmbeddingDim || math.Abs(norm-1) > 1e-5 {
			t.Errorf("embedding %d: index %d, %d dims, norm² %v", i, d.Index, len(d.Embedding), norm)
		}
	}
	if res.Data[0].Embedding[0] == res.Data[1].Embedding[0] {
		t.Errorf("two inputs got the same vector")
	}
	if res.Usage.PromptTokens != 3 || res.Usage.TotalTokens != 3 {
		t.Errorf("usage %+v, want 3 prompt tokens", res.Usage)
	}
	// The simulator's vectors are a hash of the model and the input, so one
	// served directly is the vector the gateway must have passed through.
	direct := directEmbedding(t, "one two")
	for i := range direct {
		if float32(res.Data[0].Embedding[i]) != direct[i] {
			t.Fatalf("element %d through the gateway %v, directly %v", i, res.Data[0].Embedding[i], direct[i])
		}
	}
	h.waitIdle()
}

// directEmbedding asks a simulated engine serving "m" (no gateway) for
// the embedding of input.
func directEmbedding(t *testing.T, input string) []float32 {
	t.Helper()
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}})
	resp, err := http.Post(srv.URL+"/v1/embeddings", "application/json", strings.NewReader(`{"model":"m","input":"`+input+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Data []struct {
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Data) != 1 {
		t.Fatalf("direct embedding: %v %+v", err, out)
	}
	return out.Data[0].Embedding
}

// wav returns a PCM WAV file (16 kHz, 16-bit, mono) of silence lasting d.
func wav(d time.Duration) []byte {
	const rate, bytesPerSample = 16000, 2
	data := int(d.Seconds() * rate * bytesPerSample)
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	b.WriteString("RIFF")
	le(uint32(36 + data))
	b.WriteString("WAVEfmt ")
	le(uint32(16))                    // fmt chunk size
	le(uint16(1))                     // PCM
	le(uint16(1))                     // mono
	le(uint32(rate))                  // sample rate
	le(uint32(rate * bytesPerSample)) // byte rate
	le(uint16(bytesPerSample))        // block align
	le(uint16(8 * bytesPerSample))    // bits per sample
	b.WriteString("data")
	le(uint32(data))
	b.Write(make([]byte, data))
	return b.Bytes()
}

// TestOpenAIClientTranscription uploads a WAV file with openai-go's
// multipart encoder through the gateway: the transcript is the one the
// engine makes for that file (its words depend on the file's bytes), two
// words per second of audio.
func TestOpenAIClientTranscription(t *testing.T) {
	h, rec := clientHarness(t)
	client := openAIClient(h)
	audio := wav(2 * time.Second)
	res, err := client.Audio.Transcriptions.New(clientCtx(t), openai.AudioTranscriptionNewParams{
		File:  openai.File(bytes.NewReader(audio), "hello.wav", "audio/wav"),
		Model: "m",
	})
	if err != nil {
		t.Fatal(err)
	}
	text := res.AsTranscription().Text
	if n := len(strings.Fields(text)); n != 4 {
		t.Errorf("transcript %q has %d words, want 4 (2 s at 2 words/s)", text, n)
	}
	got := rec.last()
	if got.path != "/v1/audio/transcriptions" || !strings.HasPrefix(got.contentType, "multipart/form-data; boundary=") || !bytes.Contains(got.body, audio) {
		t.Errorf("the engine got %s %q with %d bytes, want the client's multipart form with the file", got.path, got.contentType, len(got.body))
	}
	// The same file sent to the engine directly gives the same transcript.
	_, srv := sim(t, enginesim.Config{Models: []string{"m"}, OutputTokens: clientOutputTokens})
	direct := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	want, err := direct.Audio.Transcriptions.New(clientCtx(t), openai.AudioTranscriptionNewParams{
		File:  openai.File(bytes.NewReader(audio), "hello.wav", "audio/wav"),
		Model: "m",
	})
	if err != nil {
		t.Fatal(err)
	}
	if text != want.AsTranscription().Text {
		t.Errorf("transcript through the gateway %q, directly %q", text, want.AsTranscription().Text)
	}
	h.waitIdle()
}

// TestOpenAIClientModels retrieves models with openai-go: a plain id, an id
// with a slash (the client escapes it as %2F), and an unknown one (404).
func TestOpenAIClientModels(t *testing.T) {
	h, _ := clientHarness(t)
	client := openAIClient(h)
	for _, id := range []string{"m", slashModel} {
		m, err := client.Models.Get(clientCtx(t), id)
		if err != nil {
			t.Errorf("get %q: %v", id, err)
			continue
		}
		if m.ID != id || m.Object != "model" || m.OwnedBy == "" || m.Created == 0 {
			t.Errorf("get %q: %s", id, m.RawJSON())
		}
	}
	_, err := client.Models.Get(clientCtx(t), "org/nope")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %v, want a 404 *openai.Error", err)
	}
	page, err := client.Models.List(clientCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	if strings.Join(ids, ",") != "m,"+slashModel {
		t.Errorf("listed %v, want m and %s", ids, slashModel)
	}
	h.waitIdle()
}

// messageParams is a Messages API request for model with max_tokens.
func messageParams(model string, maxTokens int64) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{
		Model:     anthropic.Model(model),
		MaxTokens: maxTokens,
		Messages:  []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello there gateway"))},
	}
}

// messageText joins the text blocks of a message.
func messageText(m *anthropic.Message) string {
	var b strings.Builder
	for _, c := range m.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// TestAnthropicClientMessages sends /v1/messages with anthropic-sdk-go,
// without and with streaming: the text is the simulator's tokens, the
// stop_reason follows max_tokens, the usage counts the prompt's words and
// the generated tokens, and a stream accumulates to the same message.
func TestAnthropicClientMessages(t *testing.T) {
	h, _ := clientHarness(t)
	client := anthropicClient(h)
	for _, tc := range []struct {
		name      string
		maxTokens int64
		tokens    int
		stop      anthropic.StopReason
	}{
		{"end_turn", 64, clientOutputTokens, anthropic.StopReasonEndTurn},
		{"max_tokens", 2, 2, anthropic.StopReasonMaxTokens},
	} {
		t.Run("non-streaming "+tc.name, func(t *testing.T) {
			m, err := client.Messages.New(clientCtx(t), messageParams("m", tc.maxTokens))
			if err != nil {
				t.Fatal(err)
			}
			if got := messageText(m); got != simText(tc.tokens) || len(m.Content) != 1 {
				t.Errorf("text %q in %d blocks, want %q in 1", got, len(m.Content), simText(tc.tokens))
			}
			if m.StopReason != tc.stop || m.Role != "assistant" || m.Type != "message" || string(m.Model) != "m" || m.ID == "" {
				t.Errorf("stop_reason %q role %q type %q model %q id %q, want %s", m.StopReason, m.Role, m.Type, m.Model, m.ID, tc.stop)
			}
			if m.Usage.InputTokens != 3 || m.Usage.OutputTokens != int64(tc.tokens) {
				t.Errorf("usage %d in / %d out, want 3 / %d", m.Usage.InputTokens, m.Usage.OutputTokens, tc.tokens)
			}
		})
		t.Run("streaming "+tc.name, func(t *testing.T) {
			stream := client.Messages.NewStreaming(clientCtx(t), messageParams("m", tc.maxTokens))
			defer stream.Close()
			var acc anthropic.Message
			var types []string
			for stream.Next() {
				ev := stream.Current()
				types = append(types, ev.Type)
				if err := acc.Accumulate(ev); err != nil {
					t.Fatalf("accumulate %s: %v", ev.RawJSON(), err)
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream error after %v: %v", types, err)
			}
			if len(types) < 2 || types[0] != "message_start" || types[len(types)-1] != "message_stop" {
				t.Errorf("events %v, want message_start first and message_stop last", types)
			}
			if got := messageText(&acc); got != simText(tc.tokens) {
				t.Errorf("accumulated text %q, want %q", got, simText(tc.tokens))
			}
			if acc.StopReason != tc.stop {
				t.Errorf("stop_reason %q, want %s", acc.StopReason, tc.stop)
			}
			if acc.Usage.InputTokens != 3 || acc.Usage.OutputTokens != int64(tc.tokens) {
				t.Errorf("usage %d in / %d out, want 3 / %d", acc.Usage.InputTokens, acc.Usage.OutputTokens, tc.tokens)
			}
		})
	}
	h.waitIdle()
}

// TestAnthropicClientErrors checks that anthropic-sdk-go reads the
// gateway's errors on /v1/messages as Anthropic errors: an unknown model
// (the gateway's own 404), an engine's 500, and a stream the engine breaks
// after two tokens (an error from stream.Err, after the two tokens).
func TestAnthropicClientErrors(t *testing.T) {
	h, _ := clientHarness(t)
	client := anthropicClient(h)
	for _, tc := range []struct {
		name, model, fault string
		status             int
		typ                string
	}{
		{"unknown model", "nope", "", http.StatusNotFound, "not_found_error"},
		{"engine 500", "m", "status=500", http.StatusInternalServerError, "api_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []anthropicoption.RequestOption
			if tc.fault != "" {
				opts = append(opts, anthropicoption.WithHeader(enginesim.FaultHeader, tc.fault))
			}
			_, err := client.Messages.New(clientCtx(t), messageParams(tc.model, 8), opts...)
			var apiErr *anthropic.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("got %v (%T), want an *anthropic.Error", err, err)
			}
			if apiErr.StatusCode != tc.status || string(apiErr.Type()) != tc.typ || apiErr.Message == "" {
				t.Errorf("status %d type %q message %q, want %d %s with a message (%s)", apiErr.StatusCode, apiErr.Type(), apiErr.Message, tc.status, tc.typ, apiErr.RawJSON())
			}
		})
	}
	t.Run("broken stream", func(t *testing.T) {
		stream := client.Messages.NewStreaming(clientCtx(t), messageParams("m", 8),
			anthropicoption.WithHeader(enginesim.FaultHeader, "close-after=2"))
		defer stream.Close()
		var acc anthropic.Message
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatalf("accumulate: %v", err)
			}
		}
		err := stream.Err()
		if err == nil {
			t.Fatalf("a stream cut after 2 tokens ended without an error (text %q)", messageText(&acc))
		}
		if got := messageText(&acc); got != simText(2) {
			t.Errorf("text before the error %q, want %q", got, simText(2))
		}
		var apiErr *anthropic.Error
		if !errors.As(err, &apiErr) || string(apiErr.Type()) != "api_error" {
			t.Errorf("stream error %v (%T), want an *anthropic.Error of type api_error", err, err)
		}
	})
	h.waitIdle()
}
