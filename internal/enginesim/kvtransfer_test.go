package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// pdPrompt is a prompt of 20 words: 20 tokens, two blocks of 16 (one full, one partial).
const pdPrompt = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19"

const pdPromptTokens = 20

// pdPair is a prefill engine on a fake clock and a decode engine whose computed waits are
// logged, each on its own httptest server.
type pdPair struct {
	p, d       *Engine
	psrv, dsrv *httptest.Server
	clk        *testutil.Clock
	dlog       *delayLog
}

func startPD(t *testing.T, dcfg func(*Config)) *pdPair {
	t.Helper()
	pc := fastConfig()
	pc.KVEngineID = "engine-p"
	pp := &pdPair{clk: testutil.NewClock(time.Unix(1_800_000_000, 0)), dlog: &delayLog{}}
	pp.p, pp.psrv = startEngineWith(t, pc, func(e *Engine) { e.now = pp.clk.Now })
	dc := fastConfig()
	dc.KVEngineID = "engine-d"
	dc.KVTransferPerToken = time.Microsecond
	if dcfg != nil {
		dcfg(&dc)
	}
	pp.d, pp.dsrv = startEngineWith(t, dc, func(e *Engine) { e.onDelay = pp.dlog.hook })
	return pp
}

// hostPort returns srv's host and port.
func hostPort(t *testing.T, srv *httptest.Server) (string, int) {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	h, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// prefillBody is the prefill leg of body (a JSON object without its closing brace) as the
// router builds it: stream false, max_tokens 1 and the do_remote_decode params.
func prefillBody(body string) string {
	return body + `,"stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,` +
		`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`
}

// prefill sends the prefill leg of body to path on srv and returns the response body and
// its raw kv_transfer_params.
func prefill(t *testing.T, srv *httptest.Server, path, body string, hdr map[string]string) ([]byte, json.RawMessage) {
	t.Helper()
	resp := mustSend(t, srv, "POST", path, prefillBody(body), hdr)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("prefill: %d %s", resp.StatusCode, b)
	}
	var v struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("prefill body %s: %v", b, err)
	}
	return b, v.KV
}

// decodeLeg is body (without its closing brace) with the params kv.
func decodeLeg(body string, kv json.RawMessage) string {
	return body + `,"kv_transfer_params":` + string(kv) + `}`
}

var remoteReqIDRe = regexp.MustCompile(`"remote_request_id":"((?:chatcmpl|cmpl)-r1-[0-9a-f]{8})"`)

func TestKVPrefillParams(t *testing.T) {
	pp := startPD(t, nil)
	host, port := hostPort(t, pp.psrv)
	for i, tc := range []struct{ path, body, prefix string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + pdPrompt + `"}]`, "chatcmpl-r1"},
		{"/v1/completions", `{"prompt":"` + pdPrompt + `"`, "cmpl-r1"},
	} {
		b, kv := prefill(t, pp.psrv, tc.path, tc.body, map[string]string{"X-Request-Id": "r1"})
		m := remoteReqIDRe.FindSubmatch(kv)
		if m == nil || !strings.HasPrefix(string(m[1]), tc.prefix+"-") {
			t.Fatalf("%s: remote_request_id in %s", tc.path, kv)
		}
		want := fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[%d,%d],`+
			`"remote_engine_id":"engine-p","remote_request_id":%q,"remote_host":%q,"remote_port":%d,"tp_size":1,`+
			`"remote_num_tokens":20,"transfer_mode":"pull"}`, 2*i, 2*i+1, m[1], host, port)
		if string(kv) != want {
			t.Errorf("%s: kv_transfer_params\n got %s\nwant %s", tc.path, kv, want)
		}
		// The rest of the body is the usual one: one token, finish_reason length.
		if !strings.Contains(string(b), `"finish_reason":"length"`) || !strings.Contains(string(b), `"prompt_tokens_details":null`) {
			t.Errorf("%s: body %s", tc.path, b)
		}
		if s := pp.p.Stats(); s.KVHeld != int64(i+1) || s.KVParamsSent != int64(i+1) {
			t.Errorf("%s: stats %+v", tc.path, s)
		}
	}
	// The prefill engine's KV usage counts the held blocks.
	if got := pp.p.kvBlocks.Load(); got != 4 {
		t.Errorf("held KV blocks = %d, want 4", got)
	}
	// A configured side channel replaces the listener's address; a stream prefill leg
	// carries no params and holds nothing.
	cfg := fastConfig()
	cfg.KVSideChannelHost, cfg.KVSideChannelPort = "10.0.0.7", 5600
	e, srv := startEngine(t, cfg)
	_, kv := prefill(t, srv, "/v1/completions", `{"prompt":"a b"`, nil)
	if !strings.Contains(string(kv), `"remote_host":"10.0.0.7","remote_port":5600`) {
		t.Errorf("configured side channel: %s", kv)
	}
	resp := mustSend(t, srv, "POST", "/v1/completions", `{"prompt":"a","stream":true,"kv_transfer_params":{"do_remote_decode":true}}`, nil)
	_, _ = io.ReadAll(resp.Body)
	if s := e.Stats(); s.KVHeld != 1 || s.KVParamsSent != 1 {
		t.Errorf("after a stream prefill leg: %+v", s)
	}
	resp = mustSend(t, srv, "POST", "/v1/completions", `{"prompt":"a","kv_transfer_params":[1]}`, nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 400 || !strings.Contains(string(b), "kv_transfer_params must be an object") {
		t.Errorf("kv_transfer_params not an object: %d %s", resp.StatusCode, b)
	}
}

// kinds returns the kinds of the waits in recs.
func kinds(recs []delayRec) map[delayKind][]time.Duration {
	m := map[delayKind][]time.Duration{}
	for _, r := range recs {
		m[r.kind] = append(m[r.kind], r.d)
	}
	return m
}

func TestKVPrefillThenDecode(t *testing.T) {
	pp := startPD(t, nil)
	chat := `{"messages":[{"role":"user","content":"` + pdPrompt + `"}],"max_tokens":3`
	wantContent := "tok0 tok1 tok2 "

	// Non-stream decode.
	_, kv := prefill(t, pp.psrv, "/v1/chat/completions", chat, nil)
	if s := pp.p.Stats(); s.KVHeld != 1 {
		t.Fatalf("held before the pull: %+v", s)
	}
	pp.dlog.take()
	resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", decodeLeg(chat, kv), nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("decode: %d %s", resp.StatusCode, b)
	}
	var body struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage json.RawMessage `json:"usage"`
		KV    json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	if body.Choices[0].Message.Content != wantContent || string(body.KV) != "null" {
		t.Errorf("decode body %s", b)
	}
	if want := `{"prompt_tokens":20,"total_tokens":23,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":20}}`; string(body.Usage) != want {
		t.Errorf("decode usage %s, want %s", body.Usage, want)
	}
	if s := pp.p.Stats(); s.KVHeld != 0 || s.KVPullsServed != 1 {
		t.Errorf("prefill engine after the pull: %+v", s)
	}
	if got := pp.p.kvBlocks.Load(); got != 0 {
		t.Errorf("prefill engine's KV blocks after the pull = %d", got)
	}
	// The decode's time: the transfer of 20 tokens, no prefill compute, then 2 ITLs.
	k := kinds(pp.dlog.take())
	if len(k[delayTTFT]) != 0 || len(k[delayKVTransfer]) != 1 || k[delayKVTransfer][0] != 20*time.Microsecond || len(k[delayITL]) != 2 {
		t.Errorf("decode waits %v", k)
	}
	if s := pp.d.Stats(); s.KVPulled != 1 || s.KVLoadFailures != 0 || s.Completed != 1 {
		t.Errorf("decode engine stats %+v", s)
	}

	// Stream decode (completions), with the usage chunk.
	cmpl := `{"prompt":"` + pdPrompt + `","max_tokens":3`
	_, kv = prefill(t, pp.psrv, "/v1/completions", cmpl, nil)
	resp = mustSend(t, pp.dsrv, "POST", "/v1/completions",
		decodeLeg(cmpl+`,"stream":true,"stream_options":{"include_usage":true}`, kv), nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	var text strings.Builder
	for _, d := range data[:len(data)-2] {
		var c struct{ Choices []struct{ Text string } }
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatal(err)
		}
		text.WriteString(c.Choices[0].Text)
	}
	if text.String() != wantContent || data[len(data)-1] != "[DONE]" ||
		!strings.Contains(data[len(data)-2], `"usage":{"prompt_tokens":20,"total_tokens":23,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":20}}`) {
		t.Errorf("decode stream %q", data)
	}
	k = kinds(pp.dlog.take())
	if len(k[delayTTFT]) != 0 || len(k[delayKVTransfer]) != 1 {
		t.Errorf("stream decode waits %v", k)
	}
	if s := pp.p.Stats(); s.KVHeld != 0 || s.KVPullsServed != 2 {
		t.Errorf("prefill engine after the second pull: %+v", s)
	}
	waitIdle(t, pp.p, 0)
	waitIdle(t, pp.d, 0)
}

// vllmGenerationError is vLLM's answer to a request finished with an error.
const vllmGenerationError = `{"error":{"message":"Internal server error","type":"InternalServerError","param":null,"code":500}}`

// decodeFails checks that the decode leg of chat with kv fails as vLLM's policy fail does:
// 500 non-stream, the in-band error and [DONE] in a stream.
func decodeFails(t *testing.T, pp *pdPair, chat string, kv json.RawMessage, stream bool) {
	t.Helper()
	if !stream {
		resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", decodeLeg(chat, kv), nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 500 || strings.TrimSpace(string(b)) != vllmGenerationError {
			t.Errorf("decode with %s: %d %s", kv, resp.StatusCode, b)
		}
		return
	}
	resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", decodeLeg(chat+`,"stream":true`, kv), nil)
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	data := dataEvents(evs)
	if resp.StatusCode != 200 || len(data) != 3 || !strings.Contains(data[0], `"role":"assistant"`) ||
		data[1] != vllmGenerationError || data[2] != "[DONE]" {
		t.Errorf("stream decode with %s: %d %q", kv, resp.StatusCode, data)
	}
}

func TestKVLoadFailurePolicies(t *testing.T) {
	chat := `{"messages":[{"role":"user","content":"` + pdPrompt + `"}],"max_tokens":2`
	for _, policy := range []string{"", KVLoadFail, KVLoadRecompute} {
		t.Run("policy="+policy, func(t *testing.T) {
			pp := startPD(t, func(c *Config) { c.KVLoadFailurePolicy = policy })
			host, port := hostPort(t, pp.psrv)
			_, expired := prefill(t, pp.psrv, "/v1/chat/completions", chat, nil)
			pp.clk.Advance(30*time.Second - time.Nanosecond)
			if s := pp.p.Stats(); s.KVHeld != 1 {
				t.Fatalf("just before the lease ends: %+v", s)
			}
			pp.clk.Advance(time.Nanosecond)
			if s := pp.p.Stats(); s.KVHeld != 0 || s.KVLeasesExpired != 1 || pp.p.kvBlocks.Load() != 0 {
				t.Fatalf("after the lease: %+v", s)
			}
			if m := scrape(t, pp.psrv); !strings.Contains(m, "\nvllm:nixl_num_kv_expired_reqs_total{engine=\"0\",model_name=\"m1\"} 1\n") {
				t.Errorf("prefill /metrics:\n%s", m)
			}
			_, live := prefill(t, pp.psrv, "/v1/chat/completions", chat, nil)
			unknown := json.RawMessage(fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0,1],`+
				`"remote_engine_id":"engine-p","remote_request_id":"nope","remote_host":%q,"remote_port":%d,"tp_size":1,`+
				`"remote_num_tokens":20,"transfer_mode":"pull"}`, host, port))
			otherEngine := json.RawMessage(strings.Replace(string(live), `"engine-p"`, `"engine-x"`, 1))
			invalid := json.RawMessage(`{"do_remote_prefill":true,"remote_engine_id":"engine-p"}`)
			// A host that would add a path, a query or credentials to the pull's URL, and
			// ports outside 1..65535, are invalid params: no request is made.
			hostile := json.RawMessage(strings.Replace(string(live), fmt.Sprintf(`"remote_host":%q`, host), `"remote_host":"evil.example/x?"`, 1))
			portZero := json.RawMessage(strings.Replace(string(live), fmt.Sprintf(`"remote_port":%d`, port), `"remote_port":0`, 1))
			cases := []struct {
				name string
				kv   json.RawMessage
			}{{"expired", expired}, {"unknown", unknown}, {"engine mismatch", otherEngine}, {"invalid", invalid},
				{"hostile host", hostile}, {"port 0", portZero}}
			for i, c := range cases {
				pp.dlog.take()
				if policy != KVLoadRecompute {
					decodeFails(t, pp, chat, c.kv, i%2 == 1)
					if k := kinds(pp.dlog.take()); len(k[delayTTFT])+len(k[delayKVTransfer])+len(k[delayITL]) != 0 {
						t.Errorf("%s: failed decode waited %v", c.name, k)
					}
					continue
				}
				resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", decodeLeg(chat, c.kv), nil)
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"tok0 tok1 "`) {
					t.Errorf("%s: recompute: %d %s", c.name, resp.StatusCode, b)
				}
				// The prompt is computed: a prefill wait, no transfer.
				if k := kinds(pp.dlog.take()); len(k[delayTTFT]) != 1 || len(k[delayKVTransfer]) != 0 {
					t.Errorf("%s: recompute waits %v", c.name, k)
				}
			}
			s := pp.d.Stats()
			n := int64(len(cases))
			if s.KVLoadFailures != n || s.KVPulled != 0 {
				t.Errorf("decode stats %+v", s)
			}
			if policy == KVLoadRecompute {
				if s.KVRecomputed != n || s.Completed != n {
					t.Errorf("recompute stats %+v", s)
				}
			} else if s.KVRecomputed != 0 || s.Faulted != n {
				t.Errorf("fail stats %+v", s)
			}
			// The live hold was not pulled by the mismatched engine id.
			if s := pp.p.Stats(); s.KVHeld != 1 || s.KVPullsServed != 0 {
				t.Errorf("prefill stats %+v", s)
			}
			waitIdle(t, pp.d, 0)
		})
	}
}

func TestKVPullTwice(t *testing.T) {
	pp := startPD(t, nil)
	chat := `{"messages":[{"role":"user","content":"` + pdPrompt + `"}],"max_tokens":2`
	_, kv := prefill(t, pp.psrv, "/v1/chat/completions", chat, nil)
	resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", decodeLeg(chat, kv), nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
		t.Fatalf("first decode: %d %s", resp.StatusCode, b)
	}
	decodeFails(t, pp, chat, kv, false) // the blocks were freed by the first pull
	if s := pp.d.Stats(); s.KVPulled != 1 || s.KVLoadFailures != 1 {
		t.Errorf("decode stats %+v", s)
	}
	// The side channel itself: 404 for the freed request, 409 for another engine's id.
	var p kvParamsOut
	if err := json.Unmarshal(kv, &p); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		engine string
		want   int
	}{{"engine-p", 404}, {"engine-x", 409}} {
		resp := mustSend(t, pp.psrv, "POST", kvPullPath,
			fmt.Sprintf(`{"remote_request_id":%q,"remote_engine_id":%q}`, p.RemoteRequestID, c.engine), nil)
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != c.want {
			t.Errorf("pull from %s: %d %s, want %d", c.engine, resp.StatusCode, b, c.want)
		}
	}
}

func TestKVFaults(t *testing.T) {
	pp := startPD(t, nil)
	chat := `{"messages":[{"role":"user","content":"` + pdPrompt + `"}],"max_tokens":2`
	// kv-no-params: the prefill answers as an aborted prefill does, without params.
	_, kv := prefill(t, pp.psrv, "/v1/chat/completions", chat, fault("kv-no-params"))
	if string(kv) != "null" {
		t.Errorf("kv-no-params: kv_transfer_params %s", kv)
	}
	if s := pp.p.Stats(); s.KVHeld != 0 || s.KVParamsSent != 0 || s.Completed != 1 {
		t.Errorf("kv-no-params: prefill stats %+v", s)
	}
	// kv-pull-fail: the decode's pull fails (policy fail: vLLM's error); the prefill engine
	// keeps the blocks until the lease ends.
	_, kv = prefill(t, pp.psrv, "/v1/chat/completions", chat, nil)
	resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", decodeLeg(chat, kv), fault("kv-pull-fail"))
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 500 || strings.TrimSpace(string(b)) != vllmGenerationError {
		t.Errorf("kv-pull-fail: %d %s", resp.StatusCode, b)
	}
	if s := pp.p.Stats(); s.KVHeld != 1 || s.KVPullsServed != 0 {
		t.Errorf("kv-pull-fail: prefill stats %+v", s)
	}
	if s := pp.d.Stats(); s.KVLoadFailures != 1 || s.Faulted != 1 {
		t.Errorf("kv-pull-fail: decode stats %+v", s)
	}
	if m := scrape(t, pp.dsrv); !strings.Contains(m, "\nvllm:nixl_num_failed_transfers_total{engine=\"0\",model_name=\"m1\"} 1\n") {
		t.Errorf("decode /metrics:\n%s", m)
	}
	// The error-after fault on a prefill leg ends it with an error: no params held.
	resp = mustSend(t, pp.psrv, "POST", "/v1/chat/completions", prefillBody(`{"messages":[{"role":"user","content":"a"}]`), fault("error-after=0"))
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 500 {
		t.Errorf("error-after prefill: %d %s", resp.StatusCode, b)
	}
	if s := pp.p.Stats(); s.KVHeld != 1 || s.KVParamsSent != 1 {
		t.Errorf("error-after prefill: stats %+v", s)
	}
	// Parse errors.
	for _, spec := range []string{"kv-no-params=1", "kv-pull-fail=x"} {
		if _, err := parseFaults(spec); !errors.Is(err, ErrBadFault) || !strings.Contains(err.Error(), "takes no value") {
			t.Errorf("parseFaults(%q) = %v", spec, err)
		}
		resp := mustSend(t, pp.dsrv, "POST", "/v1/chat/completions", chat+"}", fault(spec))
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 400 {
			t.Errorf("header %q: %d %s", spec, resp.StatusCode, b)
		}
	}
}

func TestKVDecodeCancelledDuringPull(t *testing.T) {
	chat := `{"messages":[{"role":"user","content":"` + pdPrompt + `"}],"max_tokens":2`

	t.Run("transfer", func(t *testing.T) {
		pp := startPD(t, nil)
		// A decode engine of its own, whose hook signals the start of the transfer.
		_, kv := prefill(t, pp.psrv, "/v1/chat/completions", chat, nil)
		started := make(chan struct{})
		d, dsrv := startEngineWith(t, func() Config {
			c := fastConfig()
			c.KVTransferPerToken = time.Hour
			return c
		}(), func(e *Engine) {
			e.onDelay = func(k delayKind, _ time.Duration) {
				if k == delayKVTransfer {
					close(started)
				}
			}
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			resp, err := send(t, ctx, dsrv, "POST", "/v1/chat/completions", decodeLeg(chat, kv), nil)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			done <- err
		}()
		<-started
		if s := d.Stats(); s.Running != 1 {
			t.Errorf("during the transfer: %+v", s)
		}
		cancel()
		if err := <-done; err == nil {
			t.Error("cancelled decode: no error")
		}
		s := waitIdle(t, d, 0)
		if s.Aborted != 1 || s.Running != 0 {
			t.Errorf("after the cancel: %+v", s)
		}
	})

	t.Run("hung side channel", func(t *testing.T) {
		entered := make(chan struct{})
		hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body) // net/http watches the connection once the body is read
			close(entered)
			<-r.Context().Done()
		}))
		t.Cleanup(hung.Close)
		host, port := hostPort(t, hung)
		kv := json.RawMessage(fmt.Sprintf(`{"do_remote_prefill":true,"remote_engine_id":"e","remote_request_id":"r",`+
			`"remote_host":%q,"remote_port":%d,"remote_block_ids":[0]}`, host, port))
		d, dsrv := startEngine(t, fastConfig())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			resp, err := send(t, ctx, dsrv, "POST", "/v1/chat/completions", decodeLeg(chat+`,"stream":true`, kv), nil)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
			}
			done <- err
		}()
		<-entered
		if s := d.Stats(); s.Running != 1 {
			t.Errorf("during the pull: %+v", s)
		}
		cancel()
		<-done
		s := waitIdle(t, d, 0)
		if s.Aborted != 1 || s.Running != 0 || s.KVLoadFailures != 0 {
			t.Errorf("after the cancel: %+v", s)
		}
	})
}

// scrape returns srv's /metrics.
func scrape(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	resp := mustSend(t, srv, "GET", "/metrics", "", nil)
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestKVPullFollowsNoRedirect: a pull answered with a redirect fails; the redirect's target
// gets no request (the pull's address comes from a request body, so a redirect would let it
// reach anywhere).
func TestKVPullFollowsNoRedirect(t *testing.T) {
	var reached atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) }))
	t.Cleanup(target.Close)
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/anything", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(redirector.Close)
	pp := startPD(t, nil)
	chat := `{"messages":[{"role":"user","content":"` + pdPrompt + `"}],"max_tokens":2`
	host, port := hostPort(t, redirector)
	kv := json.RawMessage(fmt.Sprintf(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0],`+
		`"remote_engine_id":"engine-p","remote_request_id":"r","remote_host":%q,"remote_port":%d,"tp_size":1}`, host, port))
	decodeFails(t, pp, chat, kv, false)
	if n := reached.Load(); n != 0 {
		t.Errorf("the redirect's target got %d requests", n)
	}
	if s := pp.d.Stats(); s.KVLoadFailures != 1 {
		t.Errorf("decode stats %+v", s)
	}
	waitIdle(t, pp.d, 0)
}

// TestPromptTokensDetails checks vLLM's --enable-prompt-tokens-details: off, a plain
// request's usage has no prompt_tokens_details; on, a prompt that hits the prefix cache
// reports its cached tokens, and a cold one still none (vLLM writes a non-zero count only).
func TestPromptTokensDetails(t *testing.T) {
	prompt := strings.Repeat("w ", 64)
	body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	for _, on := range []bool{false, true} {
		e, err := New(Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond, PromptTokensDetails: on})
		if err != nil {
			t.Fatal(err)
		}
		for turn := range 2 {
			rec := httptest.NewRecorder()
			e.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
			var v struct {
				Usage struct {
					PromptTokens        int `json:"prompt_tokens"`
					PromptTokensDetails *struct {
						CachedTokens int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				}
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
				t.Fatalf("%v: %s", err, rec.Body)
			}
			d := v.Usage.PromptTokensDetails
			switch {
			case !on || turn == 0:
				if d != nil {
					t.Errorf("on=%t turn %d: details %+v, want null", on, turn, *d)
				}
			case d == nil || d.CachedTokens == 0 || d.CachedTokens > v.Usage.PromptTokens:
				t.Errorf("on=%t turn %d: details %v of %d prompt tokens, want a cached count", on, turn, d, v.Usage.PromptTokens)
			}
		}
	}
}

// TestKVRole checks vLLM's kv_role: a kv_consumer answers a prefill leg without params and
// holds nothing; a kv_producer computes a decode leg's prompt itself and pulls nothing; a
// kv_both engine does either.
func TestKVRole(t *testing.T) {
	prompt := strings.Repeat("w ", 40)
	prefillBody := `{"model":"m","max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false},"prompt":"` + prompt + `"}`
	for _, role := range []string{KVRoleBoth, KVRoleProducer, KVRoleConsumer} {
		t.Run(role, func(t *testing.T) {
			e, err := New(Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond, KVRole: role})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(e.Handler())
			defer srv.Close()
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(prefillBody))
			if err != nil {
				t.Fatal(err)
			}
			var v struct {
				KVTransferParams json.RawMessage `json:"kv_transfer_params"`
			}
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			produced := string(v.KVTransferParams) != "null"
			if want := role != KVRoleConsumer; produced != want || (e.Stats().KVHeld == 1) != want {
				t.Errorf("prefill leg: params %s, held %d; want produced %t", v.KVTransferParams, e.Stats().KVHeld, want)
			}
			if !produced {
				return
			}
			// A decode leg on the same engine with those params.
			decodeBody := `{"model":"m","max_tokens":2,"kv_transfer_params":` + string(v.KVTransferParams) + `,"prompt":"` + prompt + `"}`
			resp, err = http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(decodeBody))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if want := int64(1); role == KVRoleProducer {
				if n := e.Stats().KVPulled; n != 0 || resp.StatusCode != http.StatusOK {
					t.Errorf("kv_producer decode leg: status %d, pulled %d; want 200, 0", resp.StatusCode, n)
				}
			} else if n := e.Stats().KVPulled; n != want || resp.StatusCode != http.StatusOK {
				t.Errorf("decode leg: status %d, pulled %d; want 200, 1", resp.StatusCode, n)
			}
		})
	}
}
