package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// zmq4 v0.17.0's PUB socket starts a writer goroutine (pubMWriter.run) that its Close
	// never stops; the KV-events publisher's PUB socket leaves one per closed engine.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
}

// fastConfig is a small, fast engine configuration for tests.
func fastConfig() Config {
	return Config{
		Models: []string{"m1", "m2"},
		TTFT:   2 * time.Millisecond,
		ITL:    time.Millisecond,
	}
}

// startEngine serves a new engine for cfg on a real TCP listener, closed at test cleanup.
func startEngine(t *testing.T, cfg Config) (*Engine, *httptest.Server) {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	return e, srv
}

// send posts body to path with the given headers (a nil ctx means a background one).
func send(t *testing.T, ctx context.Context, srv *httptest.Server, method, path, body string, hdr map[string]string) (*http.Response, error) {
	t.Helper()
	if ctx == nil {
		ctx = context.Background()
	}
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return srv.Client().Do(req)
}

// mustSend is send that fails the test on a transport error.
func mustSend(t *testing.T, srv *httptest.Server, method, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	resp, err := send(t, nil, srv, method, path, body, hdr)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// fault returns the header map selecting spec.
func fault(spec string) map[string]string { return map[string]string{FaultHeader: spec} }

// sseEvent is one parsed SSE event: a data payload (with its event name, if any) or a
// comment line.
type sseEvent struct {
	event   string
	data    string
	comment string
}

// readEvents parses an SSE body until EOF (returned as nil) or a read error (returned with
// the events read so far).
func readEvents(r io.Reader) ([]sseEvent, error) {
	br := bufio.NewReader(r)
	var evs []sseEvent
	var data []string
	name := ""
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err == io.EOF && line == "" {
				return evs, nil
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return evs, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if data != nil {
				evs = append(evs, sseEvent{event: name, data: strings.Join(data, "\n")})
				data, name = nil, ""
			}
		case strings.HasPrefix(line, ":"):
			evs = append(evs, sseEvent{comment: line})
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
}

// dataEvents returns the data payloads of evs, skipping comments.
func dataEvents(evs []sseEvent) []string {
	var out []string
	for _, e := range evs {
		if e.comment == "" {
			out = append(out, e.data)
		}
	}
	return out
}

// chunkHead returns the id and created fields of a JSON chunk.
func chunkHead(t *testing.T, data string) (string, int64) {
	t.Helper()
	var h struct {
		ID      string `json:"id"`
		Created int64  `json:"created"`
	}
	if err := json.Unmarshal([]byte(data), &h); err != nil {
		t.Fatalf("chunk %q: %v", data, err)
	}
	return h.ID, h.Created
}

// waitIdle waits until e has no running or waiting sequences and checks that every received
// request was accounted for exactly once.
func waitIdle(t *testing.T, e *Engine, rejected int64) Stats {
	t.Helper()
	var s Stats
	testutil.Eventually(t, 2*time.Second, func() bool {
		s = e.Stats()
		return s.Running == 0 && s.Waiting == 0 && s.Completed+s.Aborted+s.Faulted+rejected == s.Received
	}, "engine idle")
	if got := e.kvBlocks.Load(); got != 0 {
		t.Errorf("KV blocks held when idle = %d, want 0", got)
	}
	return s
}

// startEngineWith is startEngine with setup applied to the engine before it serves (for the
// test hooks: onDelay, now).
func startEngineWith(t *testing.T, cfg Config, setup func(*Engine)) (*Engine, *httptest.Server) {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	setup(e)
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	return e, srv
}

// sendRaw sends body with Content-Type ct, failing the test on a transport error.
func sendRaw(t *testing.T, srv *httptest.Server, method, path, ct string, body []byte, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// formField is one multipart field; file fields carry their content in value.
type formField struct {
	name, value string
	file        bool
}

// multipartBody encodes fields, in order, as multipart/form-data.
func multipartBody(t *testing.T, fields ...formField) (ct string, body []byte) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, f := range fields {
		var err error
		if f.file {
			var fw io.Writer
			if fw, err = mw.CreateFormFile(f.name, "audio.wav"); err == nil {
				_, err = io.WriteString(fw, f.value)
			}
		} else {
			err = mw.WriteField(f.name, f.value)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), b.Bytes()
}

// decode unmarshals b into a value of type T, failing the test on error.
func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return v
}
