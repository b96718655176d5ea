package enginesim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Speech-to-text limits and the simulated audio model.
const (
	// maxAudioBytes caps an uploaded audio file, as vLLM's VLLM_MAX_AUDIO_CLIP_FILESIZE_MB
	// (25 MB) does; larger files are answered with 413.
	maxAudioBytes = 25 << 20
	// maxFormValue caps a multipart form field other than the file.
	maxFormValue = 1 << 20
	// audioBytesPerSecond is the byte rate assumed for a file that is not a PCM WAV: 16 kHz
	// 16-bit mono.
	audioBytesPerSecond = 32000
	// audioTokensPerSecond is the number of prompt tokens per second of audio (Whisper's
	// encoder produces 1500 positions per 30 s).
	audioTokensPerSecond = 50
	// wordsPerSecond is the transcript's speaking rate, in words.
	wordsPerSecond = 2
)

// speech-to-text tasks.
type sttTask int

const (
	taskTranscribe sttTask = iota
	taskTranslate
)

// transcriptVocabulary are the words transcripts are made of.
var transcriptVocabulary = strings.Fields(`the a to of and in is it you that he was for on are with as
I his they be at one have this from or had by word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many then them write
would like so these her long make thing see him two has look more day could go come did number
sound no most people my over know water than call first who may down side been now find`)

// sttForm is the parsed multipart form of a transcription or translation request.
type sttForm struct {
	model, language, prompt, format string
	temperature                     float64
	stream, includeUsage            bool
	maxTokens                       *int
	size                            int    // file bytes
	hash                            uint64 // FNV-1a of the file
	header                          []byte // the file's first 44 bytes
}

// duration returns the audio's length: from a PCM WAV header's byte rate when the file has
// one, otherwise at audioBytesPerSecond.
func (f *sttForm) duration() time.Duration {
	rate, data := audioBytesPerSecond, f.size
	h := f.header
	if len(h) >= 44 && string(h[0:4]) == "RIFF" && string(h[8:12]) == "WAVE" {
		if r := int(binary.LittleEndian.Uint32(h[28:32])); r > 0 {
			rate, data = r, f.size-44
		}
	}
	return time.Duration(float64(max(data, 0)) / float64(rate) * float64(time.Second))
}

// readSTTForm reads a multipart transcription request: the file part (required; read once,
// hashed and counted, never held in memory) and the fields, in any order.
func readSTTForm(w http.ResponseWriter, r *http.Request) (*sttForm, int, error) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return nil, http.StatusBadRequest, errors.New("the request body must be multipart/form-data with a file part")
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("invalid multipart body: %v", err)
	}
	f := &sttForm{format: "json"}
	fields := map[string]string{}
	gotFile := false
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, bodyErrStatus(err), fmt.Errorf("invalid multipart body: %v", err)
		}
		name := part.FormName()
		if name == "file" {
			h := fnv.New64a()
			var head bytes.Buffer
			n, err := io.Copy(io.MultiWriter(h, &limitedBuffer{b: &head, n: 44}), io.LimitReader(part, maxAudioBytes+1))
			if err != nil {
				return nil, bodyErrStatus(err), fmt.Errorf("failed to read file: %v", err)
			}
			if n > maxAudioBytes {
				return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("Maximum file size exceeded: the limit is %d MB", maxAudioBytes>>20)
			}
			gotFile, f.size, f.hash, f.header = true, int(n), h.Sum64(), head.Bytes()
			continue
		}
		v, err := io.ReadAll(io.LimitReader(part, maxFormValue+1))
		if err != nil {
			return nil, bodyErrStatus(err), fmt.Errorf("failed to read field %s: %v", name, err)
		}
		if len(v) > maxFormValue {
			return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("field %s is longer than %d bytes", name, maxFormValue)
		}
		fields[name] = string(v)
	}
	if !gotFile {
		return nil, http.StatusBadRequest, errors.New("file is required")
	}
	if f.size == 0 {
		return nil, http.StatusBadRequest, errors.New("file is empty")
	}
	return f, 0, f.setFields(fields)
}

// setFields parses the form fields into f. Errors are client errors (400).
func (f *sttForm) setFields(fields map[string]string) error {
	f.model, f.language, f.prompt = fields["model"], fields["language"], fields["prompt"]
	if v, ok := fields["response_format"]; ok && v != "" {
		f.format = v
	}
	switch f.format {
	case "json", "text", "verbose_json":
	default:
		return errors.New("Currently only support response_format: `text`, `json` or `verbose_json`")
	}
	var err error
	parseBool := func(name string) bool {
		v, ok := fields[name]
		if !ok || v == "" || err != nil {
			return false
		}
		b, perr := strconv.ParseBool(v)
		if perr != nil {
			err = fmt.Errorf("%s must be true or false, got %q", name, v)
		}
		return b
	}
	f.stream = parseBool("stream")
	f.includeUsage = parseBool("stream_include_usage")
	if err != nil {
		return err
	}
	if v := fields["temperature"]; v != "" {
		if f.temperature, err = strconv.ParseFloat(v, 64); err != nil {
			return fmt.Errorf("temperature must be a number, got %q", v)
		}
	}
	if v := fields["max_completion_tokens"]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("max_completion_tokens must be a positive integer, got %q", v)
		}
		f.maxTokens = &n
	}
	if f.includeUsage && !f.stream {
		return errors.New("Stream options can only be defined when `stream=True`.")
	}
	if f.format == "verbose_json" && f.stream {
		return errors.New("verbose_json format doesn't support streaming case")
	}
	return nil
}

// limitedBuffer keeps the first n bytes written to it and discards the rest.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// bodyErrStatus is 413 for a body over maxBodyBytes, 400 otherwise.
func bodyErrStatus(err error) int {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// transcript returns the n words of the deterministic transcript of a file with FNV-1a hash
// h: words of transcriptVocabulary drawn by a PCG seeded with h.
func transcript(h uint64, n int) []string {
	rng := rand.New(rand.NewPCG(h, h^0x9e3779b97f4a7c15))
	words := make([]string, n)
	for i := range words {
		words[i] = transcriptVocabulary[rng.IntN(len(transcriptVocabulary))]
	}
	return words
}

// transcriber renders a transcription or translation: vLLM's speech-to-text SSE stream
// (one chunk per word, the last with finish_reason and stop_reason, the usage chunk when
// stream_include_usage is true, then data: [DONE]) or one of the non-stream bodies.
type transcriber struct {
	*seq
	task    sttTask
	form    *sttForm
	id      string
	created int64
	words   []string // the transcript
	dur     time.Duration
}

var _ streamer = (*transcriber)(nil)

type sttChunk struct {
	ID      string           `json:"id"`
	Object  string           `json:"object"`
	Created int64            `json:"created"`
	Model   string           `json:"model"`
	Choices []sttChunkChoice `json:"choices"`
	Usage   *sttUsage        `json:"usage,omitempty"`
}

type sttChunkChoice struct {
	Delta        sttDelta        `json:"delta"`
	FinishReason *string         `json:"finish_reason,omitempty"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"` // null on the last chunk
}

type sttDelta struct {
	Content string `json:"content"`
}

// sttUsage is vLLM's UsageInfo as its usage chunk serializes it (no null fields).
type sttUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	TotalTokens      int `json:"total_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// word returns the text of transcript token i.
func (t *transcriber) word(i int) string { return t.words[i] + " " }

// text returns the whole transcript.
func (t *transcriber) text() string {
	var b strings.Builder
	for i := range t.n {
		b.WriteString(t.word(i))
	}
	return b.String()
}

func (t *transcriber) object() string {
	if t.task == taskTranslate {
		return "translation.chunk"
	}
	return "transcription.chunk"
}

// chunk is the stream chunk of content; the last one also has the finish reason and a null
// stop_reason, as vLLM sets them together.
func (t *transcriber) chunk(content string, last bool) sttChunk {
	ch := sttChunkChoice{Delta: sttDelta{Content: content}}
	if last {
		reason := t.finish
		ch.FinishReason, ch.StopReason = &reason, json.RawMessage("null")
	}
	return sttChunk{ID: t.id, Object: t.object(), Created: t.created, Model: t.model, Choices: []sttChunkChoice{ch}}
}

// open implements streamer.
func (t *transcriber) open() error { return nil }

// lead implements streamer.
func (t *transcriber) lead() (bool, error) { return false, nil }

// token implements streamer.
func (t *transcriber) token(i int) error { return t.event(t.chunk(t.word(i), i == t.n-1)) }

// close implements streamer: a finish chunk when nothing was generated, then the usage
// chunk when asked for.
func (t *transcriber) close() error {
	if t.n == 0 {
		if err := t.event(t.chunk("", true)); err != nil {
			return err
		}
	}
	if !t.form.includeUsage {
		return nil
	}
	return t.event(sttChunk{
		ID: t.id, Object: t.object(), Created: t.created, Model: t.model, Choices: []sttChunkChoice{},
		Usage: &sttUsage{PromptTokens: t.promptTokens, TotalTokens: t.promptTokens + t.n, CompletionTokens: t.n},
	})
}

// terminator implements streamer.
func (t *transcriber) terminator() ([]byte, error) { return []byte(doneEvent), nil }

// malformed implements streamer.
func (t *transcriber) malformed() string { return malformedEvent }

// midError implements streamer: vLLM's streaming error event, then [DONE].
func (t *transcriber) midError() ([]byte, error) { return openAIStreamError() }

// sttSegment is vLLM's TranscriptionSegment.
type sttSegment struct {
	ID               int     `json:"id"`
	AvgLogprob       float64 `json:"avg_logprob"`
	CompressionRatio float64 `json:"compression_ratio"`
	End              float64 `json:"end"`
	NoSpeechProb     float64 `json:"no_speech_prob"`
	Seek             int     `json:"seek"`
	Start            float64 `json:"start"`
	Temperature      float64 `json:"temperature"`
	Text             string  `json:"text"`
	Tokens           []int   `json:"tokens"`
}

// body returns the non-stream response and its Content-Type: text/plain for "text"; for
// "json" {"text","usage":{"type":"duration","seconds"}} (translations have no usage, as in
// vLLM); for "verbose_json" vLLM's verbose body with one segment.
func (t *transcriber) body() ([]byte, error) {
	text := t.text()
	switch t.form.format {
	case "text":
		return []byte(text), nil
	case "verbose_json":
		tokens := make([]int, t.n)
		for i := range tokens {
			tokens[i] = tokenID(t.words[i])
		}
		var lang *string
		if t.form.language != "" {
			lang = &t.form.language
		}
		secs := t.dur.Seconds()
		return json.Marshal(struct {
			Duration string       `json:"duration"`
			Language *string      `json:"language"`
			Text     string       `json:"text"`
			Segments []sttSegment `json:"segments"`
			Words    []struct{}   `json:"words"`
		}{
			Duration: strconv.FormatFloat(secs, 'f', -1, 64), Language: lang, Text: text,
			Segments: []sttSegment{{
				AvgLogprob: -0.25, CompressionRatio: 1, End: secs, Start: 0, Temperature: t.form.temperature,
				Text: text, Tokens: tokens,
			}},
		})
	}
	if t.task == taskTranslate {
		return json.Marshal(struct {
			Text string `json:"text"`
		}{text})
	}
	type usage struct {
		Type    string `json:"type"`
		Seconds int    `json:"seconds"`
	}
	return json.Marshal(struct {
		Text  string `json:"text"`
		Usage usage  `json:"usage"`
	}{text, usage{"duration", int(math.Ceil(t.dur.Seconds()))}})
}

// serveSpeechToText serves POST /v1/audio/transcriptions and /v1/audio/translations: a
// multipart form with the audio file (required) and the fields model, language, prompt,
// response_format, temperature, stream, stream_include_usage and max_completion_tokens, in
// any order. The transcript is deterministic: wordsPerSecond words of audio (at least one)
// drawn from the file's hash; the prompt is the prompt field's words plus
// audioTokensPerSecond tokens per second of audio, never found in the prefix cache.
func (e *Engine) serveSpeechToText(w http.ResponseWriter, r *http.Request, task sttTask) {
	f, ok := e.begin(apiOpenAI, w, r)
	if !ok {
		return
	}
	form, status, err := readSTTForm(w, r)
	if err != nil {
		if status == 0 {
			status = http.StatusBadRequest
		}
		writeError(w, status, err.Error())
		return
	}
	t, ok := e.resolve(apiOpenAI, w, form.model)
	if !ok || !e.awake(apiOpenAI, w) {
		return
	}
	dur := form.duration()
	natural := min(max(1, int(math.Round(dur.Seconds()*wordsPerSecond))), e.cfg.MaxOutputTokens)
	n, finish := natural, finishStop
	if form.maxTokens != nil && *form.maxTokens < natural {
		n, finish = *form.maxTokens, finishLength
	}
	if f.noContent {
		n, finish = 0, finishStop
	}
	prefix := "transcribe-"
	if task == taskTranslate {
		prefix = "translate-"
	}
	prompt := wordList(form.prompt)
	tr := &transcriber{
		seq: &seq{
			call:         e.newCall(w, r, f, apiOpenAI, t, form.stream),
			words:        prompt,
			promptTokens: len(prompt) + max(1, int(math.Ceil(dur.Seconds()*audioTokensPerSecond))),
			n:            n, finish: finish,
		},
		task: task, form: form, id: newID(prefix), created: time.Now().Unix(),
		words: transcript(form.hash, n), dur: dur,
	}
	defer tr.end(&err)
	if form.stream {
		err = tr.serveStream(tr)
		return
	}
	ct := "application/json"
	if form.format == "text" {
		ct = "text/plain; charset=utf-8"
	}
	err = tr.serveUnary(ct, tr.body)
}

// speechRequest holds the fields the simulator reads from POST /v1/audio/speech.
type speechRequest struct {
	Model          string `json:"model"`
	Input          string `json:"input"`
	Voice          string `json:"voice"`
	ResponseFormat string `json:"response_format"` // "wav" (default) or "pcm"
}

// Speech output: 24 kHz 16-bit mono (OpenAI's pcm format), speechTokenSamples samples per
// generated token.
const (
	speechSampleRate   = 24000
	speechTokenSamples = speechSampleRate / 20 // 50 ms
)

// serveSpeech serves POST /v1/audio/speech: one generated token per input word (at least
// one), then a deterministic tone of 50 ms per token, as a WAV file (audio/wav) or raw
// 16-bit PCM (audio/pcm).
func (e *Engine) serveSpeech(w http.ResponseWriter, r *http.Request) {
	var req speechRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *speechRequest) string { return q.Model })
	if !ok {
		return
	}
	words := wordList(req.Input)
	if len(words) == 0 {
		writeError(w, http.StatusBadRequest, "input must not be empty")
		return
	}
	ct := "audio/wav"
	switch req.ResponseFormat {
	case "", "wav":
	case "pcm":
		ct = "audio/pcm"
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("response_format must be wav or pcm, got %q", req.ResponseFormat))
		return
	}
	s := &seq{
		call:  e.newCall(w, r, f, apiOpenAI, t, false),
		words: words, promptTokens: promptTokens(words), cacheable: true,
		n: min(len(words), e.cfg.MaxOutputTokens), finish: finishStop,
	}
	if f.noContent {
		s.n = 0
	}
	var err error
	defer s.end(&err)
	err = s.serveUnary(ct, func() ([]byte, error) {
		pcm := speechPCM(s.n*speechTokenSamples, req.Voice)
		if ct == "audio/pcm" {
			return pcm, nil
		}
		return wavFile(pcm, speechSampleRate), nil
	})
}

// speechPCM returns samples 16-bit little-endian samples of a quiet tone whose pitch
// depends on the voice.
func speechPCM(samples int, voice string) []byte {
	h := fnv.New32a()
	_, _ = h.Write([]byte(voice))
	freq := 200 + float64(h.Sum32()%400)
	b := make([]byte, 2*samples)
	for i := range samples {
		v := int16(2000 * math.Sin(2*math.Pi*freq*float64(i)/speechSampleRate))
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	}
	return b
}

// wavFile wraps 16-bit mono PCM in a RIFF/WAVE header.
func wavFile(pcm []byte, rate int) []byte {
	b := make([]byte, 0, 44+len(pcm))
	b = append(b, "RIFF"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(36+len(pcm)))
	b = append(b, "WAVEfmt "...)
	b = binary.LittleEndian.AppendUint32(b, 16)             // fmt chunk size
	b = binary.LittleEndian.AppendUint16(b, 1)              // PCM
	b = binary.LittleEndian.AppendUint16(b, 1)              // mono
	b = binary.LittleEndian.AppendUint32(b, uint32(rate))   // sample rate
	b = binary.LittleEndian.AppendUint32(b, uint32(2*rate)) // byte rate
	b = binary.LittleEndian.AppendUint16(b, 2)              // block align
	b = binary.LittleEndian.AppendUint16(b, 16)             // bits per sample
	b = append(b, "data"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pcm)))
	return append(b, pcm...)
}
