package enginesim

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestSleepWake(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 2
	e, srv := startEngine(t, cfg)
	state := func(t *testing.T) map[string]float64 {
		t.Helper()
		mf := testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")[MetricEngineSleepState]
		got := map[string]float64{}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if len(labels) != 3 || labels["model_name"] != "m1" || labels["engine"] != "0" {
				t.Errorf("series labels %v", labels)
			}
			got[labels["sleep_state"]] = m.GetGauge().GetValue()
		}
		return got
	}
	wantState := func(t *testing.T, awake, offloaded, discarded float64) {
		t.Helper()
		want := map[string]float64{"awake": awake, "weights_offloaded": offloaded, "discard_all": discarded}
		if got := state(t); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s = %v, want %v", MetricEngineSleepState, got, want)
		}
	}
	isSleeping := func(t *testing.T) string {
		t.Helper()
		resp := mustSend(t, srv, "GET", "/is_sleeping", "", nil)
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	admin := func(t *testing.T, path string, want int) {
		t.Helper()
		resp := mustSend(t, srv, "POST", path, "", nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		if want == 200 && (len(b) != 0 || resp.Header.Get("Content-Type") != "") {
			t.Errorf("POST %s: body %q, Content-Type %q; want an empty 200", path, b, resp.Header.Get("Content-Type"))
		}
	}
	complete := func(t *testing.T, prompt string) int {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/v1/completions", `{"prompt":"`+prompt+`","max_tokens":1}`, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}

	if got := isSleeping(t); got != `{"is_sleeping":false}` {
		t.Errorf("is_sleeping %s", got)
	}
	wantState(t, 1, 0, 0)
	// Five tokens: two whole blocks and a tail, so a hit covers both
	// blocks (a prompt found whole has its last token computed again).
	complete(t, "a b c d e")
	complete(t, "a b c d e")
	if s := e.Stats(); s.PrefixCacheHits != 4 {
		t.Fatalf("warm cache: %+v", s)
	}

	admin(t, "/sleep?level=1", 200)
	if got := isSleeping(t); got != `{"is_sleeping":true}` {
		t.Errorf("is_sleeping %s", got)
	}
	wantState(t, 0, 1, 0)
	asleep := []struct {
		path, body string
		anthropic  bool
		multipart  bool
	}{
		{"/v1/chat/completions", chatUnaryBody, false, false},
		{"/v1/completions", `{"prompt":"x"}`, false, false},
		{"/v1/embeddings", embedBody, false, false},
		{"/v1/responses", `{"input":"x"}`, false, false},
		{"/v1/messages", `{"model":"m1","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`, true, false},
		{"/v1/audio/transcriptions", "", false, true},
		{"/v1/audio/speech", `{"input":"x"}`, false, false},
		{"/v1/images/generations", `{"prompt":"x"}`, false, false},
		{"/v1/rerank", `{"query":"q","documents":["d"]}`, false, false},
		{"/score", `{"text_1":"a","text_2":"b"}`, false, false},
		{"/pooling", `{"input":"x"}`, false, false},
		{"/classify", `{"input":"x"}`, false, false},
	}
	for _, tc := range asleep {
		var resp *http.Response
		if tc.multipart {
			ct, body := multipartBody(t, formField{name: "file", value: wav2s, file: true})
			resp = sendRaw(t, srv, "POST", tc.path, ct, body, nil)
		} else {
			resp = mustSend(t, srv, "POST", tc.path, tc.body, nil)
		}
		b, _ := io.ReadAll(resp.Body)
		want := `{"error":{"message":"` + errSleeping + `","type":"ServiceUnavailableError","param":null,"code":503}}`
		if tc.anthropic {
			want = `{"type":"error","error":{"type":"overloaded_error","message":"` + errSleeping + `"}}`
		}
		if resp.StatusCode != 503 || string(b) != want {
			t.Errorf("%s while asleep: %d %s", tc.path, resp.StatusCode, b)
		}
	}
	for _, get := range []string{"/health", "/v1/models", "/metrics"} {
		if resp := mustSend(t, srv, "GET", get, "", nil); resp.StatusCode != 200 {
			t.Errorf("GET %s while asleep: %d", get, resp.StatusCode)
		}
	}
	if resp := mustSend(t, srv, "POST", "/tokenize", `{"prompt":"x"}`, nil); resp.StatusCode != 200 {
		t.Errorf("tokenize while asleep: %d", resp.StatusCode)
	}

	// Partial wake-ups: serving resumes only once both parts are awake.
	admin(t, "/wake_up?tags=weights", 200)
	if got := isSleeping(t); got != `{"is_sleeping":true}` {
		t.Errorf("after waking the weights: %s", got)
	}
	if code := complete(t, "x"); code != 503 {
		t.Errorf("completion with the KV cache asleep: %d", code)
	}
	admin(t, "/wake_up?tags=kv_cache", 200)
	if got := isSleeping(t); got != `{"is_sleeping":false}` {
		t.Errorf("after waking the KV cache: %s", got)
	}
	wantState(t, 1, 0, 0)
	// Sleeping discarded the KV cache: the prompt is cold again.
	complete(t, "a b c d")
	if s := e.Stats(); s.PrefixCacheHits != 4 {
		t.Errorf("hits after sleeping: %+v, want still 4", s)
	}

	admin(t, "/sleep?level=2", 200)
	wantState(t, 0, 0, 1)
	admin(t, "/wake_up", 200)
	wantState(t, 1, 0, 0)

	admin(t, "/sleep?level=3", 400)
	admin(t, "/wake_up?tags=gpu", 400)
	if got := isSleeping(t); got != `{"is_sleeping":false}` {
		t.Errorf("after rejected requests: %s", got)
	}
	if resp := mustSend(t, srv, "GET", "/sleep", "", nil); resp.StatusCode != 405 {
		t.Errorf("GET /sleep: %d", resp.StatusCode)
	}
	s := waitIdle(t, e, int64(len(asleep))+1)
	if s.Completed != 3 {
		t.Errorf("stats %+v", s)
	}
}

func TestResetPrefixCache(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 2
	e, srv := startEngine(t, cfg)
	run := func() {
		resp := mustSend(t, srv, "POST", "/v1/completions", `{"prompt":"a b c d e","max_tokens":1}`, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	run()
	run()
	resp := mustSend(t, srv, "POST", "/reset_prefix_cache", "", nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 || len(b) != 0 {
		t.Errorf("reset: %d %q", resp.StatusCode, b)
	}
	run()
	if s := e.Stats(); s.PrefixCacheHits != 4 || s.PrefixCacheQueries != 15 {
		t.Errorf("stats %+v: want the third run to miss", s)
	}
	// A status fault answers without resetting.
	run()
	resp = mustSend(t, srv, "POST", "/reset_prefix_cache", "", fault("status=500"))
	if _, _ = io.Copy(io.Discard, resp.Body); resp.StatusCode != 500 {
		t.Errorf("faulted reset: %d", resp.StatusCode)
	}
	run()
	if s := e.Stats(); s.PrefixCacheHits != 12 {
		t.Errorf("stats %+v: a faulted reset must not reset", s)
	}
}

func TestLoRA(t *testing.T) {
	cfg := fastConfig()
	cfg.BlockSize = 2
	cfg.LoRAs = []LoRA{{Name: "pre", Path: "/loras/pre", Base: "m2"}}
	e, srv := startEngine(t, cfg)
	type card struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen *int    `json:"max_model_len"`
		Permission  []struct {
			Object string `json:"object"`
		} `json:"permission"`
	}
	models := func(t *testing.T) []string {
		t.Helper()
		resp := mustSend(t, srv, "GET", "/v1/models", "", nil)
		b, _ := io.ReadAll(resp.Body)
		list := decode[struct {
			Data []card `json:"data"`
		}](t, b)
		var out []string
		for _, c := range list.Data {
			parent, maxLen := "null", "null"
			if c.Parent != nil {
				parent = *c.Parent
			}
			if c.MaxModelLen != nil {
				maxLen = fmt.Sprint(*c.MaxModelLen)
			}
			if c.Object != "model" || c.OwnedBy != "vllm" || c.Created == 0 || len(c.Permission) != 1 || c.Permission[0].Object != "model_permission" {
				t.Errorf("card %+v", c)
			}
			out = append(out, c.ID+" root="+c.Root+" parent="+parent+" max_model_len="+maxLen)
		}
		return out
	}
	post := func(t *testing.T, path, body string) (int, string, string) {
		t.Helper()
		resp := mustSend(t, srv, "POST", path, body, nil)
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	base := []string{"m1 root=m1 parent=null max_model_len=8192", "m2 root=m2 parent=null max_model_len=8192"}
	if got := models(t); strings.Join(got, "\n") != strings.Join(append(base, "pre root=/loras/pre parent=m2 max_model_len=null"), "\n") {
		t.Errorf("models at start:\n%s", strings.Join(got, "\n"))
	}

	code, ct, body := post(t, "/v1/load_lora_adapter", `{"lora_name":"ad","lora_path":"/loras/ad"}`)
	if code != 200 || ct != "text/plain; charset=utf-8" || body != "Success: LoRA adapter 'ad' added successfully." {
		t.Errorf("load: %d %q %s", code, ct, body)
	}
	want := append(base, "pre root=/loras/pre parent=m2 max_model_len=null", "ad root=/loras/ad parent=m1 max_model_len=null")
	if got := models(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("models after load:\n%s", strings.Join(got, "\n"))
	}
	loadErrors := []struct{ body, want string }{
		{`{"lora_name":"ad","lora_path":"/loras/other"}`, `{"error":{"message":"The lora adapter 'ad' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.","type":"InvalidUserInput","param":null,"code":400}}`},
		{`{"lora_name":"x"}`, `{"error":{"message":"Both 'lora_name' and 'lora_path' must be provided.","type":"InvalidUserInput","param":null,"code":400}}`},
		{`{"lora_name":"m1","lora_path":"/p"}`, `{"error":{"message":"The lora adapter 'm1' has the name of a served model.","type":"InvalidUserInput","param":null,"code":400}}`},
	}
	for _, tc := range loadErrors {
		if code, _, body := post(t, "/v1/load_lora_adapter", tc.body); code != 400 || body != tc.want {
			t.Errorf("load %s: %d %s", tc.body, code, body)
		}
	}
	if code, _, _ := post(t, "/v1/load_lora_adapter", `{"lora_name":"ad","lora_path":"/loras/ad2","load_inplace":true}`); code != 200 {
		t.Errorf("load in place: %d", code)
	}
	want[3] = "ad root=/loras/ad2 parent=m1 max_model_len=null"
	if got := models(t); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("models after load in place:\n%s", strings.Join(got, "\n"))
	}

	// Requests on adapters run on the base model and echo the adapter; the adapter's prefix
	// blocks are its own.
	for _, m := range []string{"m1", "ad", "ad", "pre"} {
		code, _, body := post(t, "/v1/chat/completions", `{"model":"`+m+`","messages":[{"role":"user","content":"a b c d e"}],"max_tokens":1}`)
		if code != 200 || !strings.Contains(body, `"model":"`+m+`"`) {
			t.Errorf("chat on %s: %d %s", m, code, body)
		}
	}
	if s := e.Stats(); s.PrefixCacheHits != 4 {
		t.Errorf("prefix hits %d, want 4 (the second request on ad only)", s.PrefixCacheHits)
	}
	mfs := testutil.Scrape(t, srv.Client(), srv.URL+"/metrics")
	if got := counterValue(t, mfs, MetricGenerationTokens, "m1"); got != 3 {
		t.Errorf("m1 generation tokens %v, want 3 (m1 and ad)", got)
	}
	if got := counterValue(t, mfs, MetricGenerationTokens, "m2"); got != 1 {
		t.Errorf("m2 generation tokens %v, want 1 (pre)", got)
	}

	code, ct, body = post(t, "/v1/unload_lora_adapter", `{"lora_name":"ad"}`)
	if code != 200 || ct != "text/plain; charset=utf-8" || body != "Success: LoRA adapter 'ad' removed successfully." {
		t.Errorf("unload: %d %q %s", code, ct, body)
	}
	if got := models(t); len(got) != 3 {
		t.Errorf("models after unload:\n%s", strings.Join(got, "\n"))
	}
	code, _, body = post(t, "/v1/chat/completions", `{"model":"ad","messages":[{"role":"user","content":"a"}]}`)
	if code != 404 || !strings.Contains(body, "The model `ad` does not exist.") {
		t.Errorf("chat on an unloaded adapter: %d %s", code, body)
	}
	for _, tc := range []struct {
		body string
		code int
		want string
	}{
		{`{"lora_name":"ad"}`, 404, `{"error":{"message":"The lora adapter 'ad' cannot be found.","type":"NotFoundError","param":null,"code":404}}`},
		{`{}`, 400, `{"error":{"message":"'lora_name' needs to be provided to unload a LoRA adapter.","type":"InvalidUserInput","param":null,"code":400}}`},
	} {
		if code, _, body := post(t, "/v1/unload_lora_adapter", tc.body); code != tc.code || body != tc.want {
			t.Errorf("unload %s: %d %s", tc.body, code, body)
		}
	}
	s := waitIdle(t, e, 1)
	if s.Completed != 4 {
		t.Errorf("stats %+v", s)
	}
}

func TestLoRAConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"empty name", Config{LoRAs: []LoRA{{Path: "/p"}}}, "lora 0 has an empty name"},
		{"twice", Config{LoRAs: []LoRA{{Name: "a", Path: "/p"}, {Name: "a", Path: "/q"}}}, `lora "a" listed twice`},
		{"no path", Config{LoRAs: []LoRA{{Name: "a"}}}, `lora "a" has an empty path`},
		{"served name", Config{Models: []string{"m"}, LoRAs: []LoRA{{Name: "m", Path: "/p"}}}, `lora "m" has the name of a served model`},
		{"unknown base", Config{Models: []string{"m"}, LoRAs: []LoRA{{Name: "a", Path: "/p", Base: "x"}}}, `base model "x" is not served`},
		{"default model as base", Config{LoRAs: []LoRA{{Name: "a", Path: "/p", Base: DefaultModel}}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Errorf("Validate() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	e, err := New(Config{Models: []string{"a", "b"}, LoRAs: []LoRA{{Name: "l", Path: "/p"}}})
	if err != nil {
		t.Fatal(err)
	}
	if tg, ok := e.target("l"); !ok || tg.m.name != "a" || tg.name != "l" || e.cfg.LoRAs[0].Base != "a" {
		t.Errorf("a LoRA without Base runs on the first model: %+v %v %+v", tg, ok, e.cfg.LoRAs)
	}
}

// TestAdminFault: POST /admin/fault sets the default fault of the requests that follow
// (not of one with its own header), an empty body removes it, a bad spec is a 400 that
// leaves the default alone, and the route itself ignores faults.
func TestAdminFault(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	admin := func(t *testing.T, spec string, want int) {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/admin/fault", spec, map[string]string{FaultHeader: "status=500"})
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("POST /admin/fault %q: %d %s, want %d", spec, resp.StatusCode, b, want)
		}
		if want == 400 && !strings.Contains(string(b), "invalid fault spec") {
			t.Errorf("POST /admin/fault %q: body %s, want the parse error", spec, b)
		}
	}
	status := func(t *testing.T, hdr map[string]string) int {
		t.Helper()
		resp := mustSend(t, srv, "POST", "/v1/completions", `{"model":"m1","prompt":"hi","max_tokens":2}`, hdr)
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := status(t, nil); got != 200 {
		t.Fatalf("before: %d, want 200", got)
	}
	admin(t, "status=503\n", 200)
	if got := status(t, nil); got != 503 {
		t.Errorf("with status=503 set: %d, want 503", got)
	}
	if got := status(t, map[string]string{FaultHeader: ""}); got != 200 {
		t.Errorf("with status=503 set and an empty header: %d, want 200", got)
	}
	admin(t, "bogus=1", 400)
	if got := status(t, nil); got != 503 {
		t.Errorf("after a bad spec: %d, want the default unchanged (503)", got)
	}
	admin(t, "", 200)
	if got := status(t, nil); got != 200 {
		t.Errorf("after clearing: %d, want 200", got)
	}
	resp := mustSend(t, srv, "GET", "/admin/fault", "", nil)
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /admin/fault: %d, want 405", resp.StatusCode)
	}
}
