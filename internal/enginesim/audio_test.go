package enginesim

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// wav2s is a valid 2 s 16 kHz 16-bit mono WAV: 4 transcript words, 100 audio tokens.
var wav2s = string(wavFile(make([]byte, 64000), 16000))

func TestTranscriptions(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	file := formField{name: "file", value: wav2s, file: true}
	text := strings.Join(transcript(fnvHash(wav2s), 4), " ") + " "
	tests := []struct {
		name, path string
		fields     []formField
		ct, want   string
	}{
		{
			name: "json, model after the file", path: "/v1/audio/transcriptions",
			fields: []formField{file, {name: "model", value: "m2"}, {name: "language", value: "en"}},
			ct:     "application/json", want: `{"text":"` + text + `","usage":{"type":"duration","seconds":2}}`,
		},
		{
			name: "text", path: "/v1/audio/transcriptions",
			fields: []formField{{name: "response_format", value: "text"}, file},
			ct:     "text/plain; charset=utf-8", want: text,
		},
		{
			name: "verbose_json", path: "/v1/audio/transcriptions",
			fields: []formField{file, {name: "response_format", value: "verbose_json"}, {name: "language", value: "de"}, {name: "temperature", value: "0.2"}},
			ct:     "application/json",
			want: `{"duration":"2","language":"de","text":"` + text + `","segments":[{"id":0,"avg_logprob":-0.25,"compression_ratio":1,` +
				`"end":2,"no_speech_prob":0,"seek":0,"start":0,"temperature":0.2,"text":"` + text + `","tokens":TOKENS}],"words":null}`,
		},
		{
			name: "translation json has no usage", path: "/v1/audio/translations",
			fields: []formField{file},
			ct:     "application/json", want: `{"text":"` + text + `"}`,
		},
		{
			name: "max_completion_tokens cuts", path: "/v1/audio/transcriptions",
			fields: []formField{file, {name: "max_completion_tokens", value: "1"}, {name: "response_format", value: "text"}},
			ct:     "text/plain; charset=utf-8", want: strings.Fields(text)[0] + " ",
		},
	}
	var tokens []string
	for _, w := range strings.Fields(text) {
		tokens = append(tokens, fmt.Sprint(tokenID(w)))
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ct, body := multipartBody(t, tc.fields...)
			resp := sendRaw(t, srv, "POST", tc.path, ct, body, nil)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != tc.ct {
				t.Fatalf("got %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
			}
			want := strings.Replace(tc.want, "TOKENS", "["+strings.Join(tokens, ",")+"]", 1)
			if string(b) != want {
				t.Errorf("body:\n%s\nwant:\n%s", b, want)
			}
		})
	}
	// Deterministic: the same audio gives the same words; other audio, others.
	other := string(wavFile(make([]byte, 64002), 16000))
	if strings.Join(transcript(fnvHash(other), 4), " ") == strings.TrimSpace(text) {
		t.Errorf("different audio, same transcript")
	}
	s := waitIdle(t, e, 0)
	if s.Completed != int64(len(tests)) {
		t.Errorf("stats %+v", s)
	}
	if got := counterValue(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricPromptTokens, "m2"); got != 100 {
		t.Errorf("prompt tokens of 2 s of audio = %v, want 100", got)
	}
}

// fnvHash is the file hash transcripts are drawn from: FNV-1a.
func fnvHash(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

func TestTranscriptionStream(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	ct, body := multipartBody(t,
		formField{name: "file", value: wav2s, file: true},
		formField{name: "stream", value: "true"},
		formField{name: "stream_include_usage", value: "true"},
		formField{name: "prompt", value: "a b"},
		formField{name: "model", value: "m1"},
	)
	resp := sendRaw(t, srv, "POST", "/v1/audio/transcriptions", ct, body, nil)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("got %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	id, created := chunkHead(t, data[0])
	if !regexp.MustCompile(`^transcribe-[0-9a-f]{32}$`).MatchString(id) {
		t.Errorf("id %q", id)
	}
	words := transcript(fnvHash(wav2s), 4)
	head := fmt.Sprintf(`{"id":"%s","object":"transcription.chunk","created":%d,"model":"m1","choices":[`, id, created)
	var want []string
	for i, w := range words {
		end := `}]}`
		if i == len(words)-1 {
			end = `,"finish_reason":"stop","stop_reason":null}]}`
		}
		want = append(want, head+`{"delta":{"content":"`+w+` "}`+end)
	}
	want = append(want, head+`],"usage":{"prompt_tokens":102,"total_tokens":106,"completion_tokens":4}}`, "[DONE]")
	if strings.Join(data, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(data, "\n"), strings.Join(want, "\n"))
	}

	// Translations stream translation.chunk objects.
	ct, body = multipartBody(t, formField{name: "file", value: wav2s, file: true}, formField{name: "stream", value: "true"})
	resp = sendRaw(t, srv, "POST", "/v1/audio/translations", ct, body, nil)
	evs, _ = readEvents(resp.Body)
	if d := dataEvents(evs); len(d) != 5 || !strings.Contains(d[0], `"object":"translation.chunk"`) ||
		!strings.Contains(d[0], `"id":"translate-`) || d[4] != "[DONE]" {
		t.Errorf("translation stream %q", d)
	}
	wantOutcome(t, e, 2, 0, 0)
}

func TestTranscriptionErrors(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	file := formField{name: "file", value: wav2s, file: true}
	form := func(fields ...formField) (string, []byte) { return multipartBody(t, fields...) }
	type errCase struct {
		name   string
		status int
		msg    string
		ct     string
		body   []byte
	}
	var tests []errCase
	add := func(name string, status int, msg string, ct string, body []byte) {
		tests = append(tests, errCase{name, status, msg, ct, body})
	}
	ct, b := form(formField{name: "model", value: "m1"})
	add("no file", 400, "file is required", ct, b)
	add("JSON body", 400, "must be multipart/form-data", "application/json", []byte(`{"file":"x"}`))
	add("no content type", 400, "must be multipart/form-data", "", []byte(`x`))
	ct, b = form(formField{name: "file", value: "", file: true})
	add("empty file", 400, "file is empty", ct, b)
	ct, b = form(file, formField{name: "response_format", value: "srt"})
	add("srt", 400, "Currently only support response_format", ct, b)
	ct, b = form(file, formField{name: "response_format", value: "verbose_json"}, formField{name: "stream", value: "true"})
	add("verbose stream", 400, "verbose_json format doesn't support streaming case", ct, b)
	ct, b = form(file, formField{name: "stream_include_usage", value: "true"})
	add("usage without stream", 400, "Stream options can only be defined when `stream=True`.", ct, b)
	ct, b = form(file, formField{name: "stream", value: "maybe"})
	add("bad stream", 400, "stream must be true or false", ct, b)
	ct, b = form(file, formField{name: "temperature", value: "hot"})
	add("bad temperature", 400, "temperature must be a number", ct, b)
	ct, b = form(formField{name: "model", value: "nope"}, file)
	add("unknown model", 404, "The model `nope` does not exist.", ct, b)
	add("broken multipart", 400, "invalid multipart body", "multipart/form-data; boundary=x", []byte("--x\r\nbroken"))
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := sendRaw(t, srv, "POST", "/v1/audio/transcriptions", tc.ct, tc.body, nil)
			b, _ := io.ReadAll(resp.Body)
			eb := decode[errorBody](t, b)
			if resp.StatusCode != tc.status || eb.Error.Code != tc.status || !strings.Contains(eb.Error.Message, tc.msg) {
				t.Errorf("got %d %s, want %d %q", resp.StatusCode, b, tc.status, tc.msg)
			}
		})
	}
	waitIdle(t, e, int64(len(tests)))
}

func TestSpeech(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	for _, tc := range []struct {
		body, ct string
		samples  int
	}{
		{`{"model":"m1","input":"hello world","voice":"alloy"}`, "audio/wav", 2 * speechTokenSamples},
		{`{"input":"one two three four five","response_format":"wav"}`, "audio/wav", 5 * speechTokenSamples},
		{`{"input":"one two three","response_format":"pcm"}`, "audio/pcm", 3 * speechTokenSamples},
	} {
		resp := mustSend(t, srv, "POST", "/v1/audio/speech", tc.body, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != tc.ct {
			t.Fatalf("%s: %d %q", tc.body, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		pcm := b
		if tc.ct == "audio/wav" {
			if len(b) < 44 || string(b[0:4]) != "RIFF" || string(b[8:16]) != "WAVEfmt " || string(b[36:40]) != "data" ||
				binary.LittleEndian.Uint32(b[4:8]) != uint32(len(b)-8) ||
				binary.LittleEndian.Uint32(b[24:28]) != speechSampleRate ||
				binary.LittleEndian.Uint16(b[34:36]) != 16 ||
				binary.LittleEndian.Uint32(b[40:44]) != uint32(len(b)-44) {
				t.Errorf("%s: not a valid WAV header: % x", tc.body, b[:min(44, len(b))])
			}
			pcm = b[44:]
		}
		if len(pcm) != 2*tc.samples {
			t.Errorf("%s: %d bytes of samples, want %d", tc.body, len(pcm), 2*tc.samples)
		}
	}
	for _, body := range []string{`{"input":""}`, `{"input":"x","response_format":"mp3"}`} {
		resp := mustSend(t, srv, "POST", "/v1/audio/speech", body, nil)
		if _, _ = io.Copy(io.Discard, resp.Body); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d", body, resp.StatusCode)
		}
	}
	s := waitIdle(t, e, 2)
	if s.Completed != 3 {
		t.Errorf("stats %+v", s)
	}
	if got := counterValue(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricGenerationTokens, "m1"); got != 10 {
		t.Errorf("generation tokens %v, want one per input word (10)", got)
	}
}
