package enginesim

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image/png"
	"io"
	"math"
	"regexp"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestImages(t *testing.T) {
	cfg := fastConfig()
	cfg.OutputTokens = 4
	e, srv := startEngine(t, cfg)
	resp := mustSend(t, srv, "POST", "/v1/images/generations", `{"model":"m1","prompt":"a red cat","n":2,"size":"256x128"}`, nil)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("got %d %s", resp.StatusCode, b)
	}
	out := decode[struct {
		Created int64 `json:"created"`
		Data    []struct {
			B64JSON string `json:"b64_json"`
		} `json:"data"`
	}](t, b)
	if out.Created == 0 || len(out.Data) != 2 || !regexp.MustCompile(`^\{"created":\d+,"data":\[\{"b64_json":"[^"]+"\},\{"b64_json":"[^"]+"\}\]\}$`).Match(b) {
		t.Fatalf("body %s", b)
	}
	var colours []string
	for i, d := range out.Data {
		raw, err := base64.StdEncoding.DecodeString(d.B64JSON)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(raw))
		if err != nil {
			t.Fatalf("image %d is not a PNG: %v", i, err)
		}
		if bd := img.Bounds(); bd.Dx() != 4 || bd.Dy() != 2 {
			t.Errorf("image %d is %v, want 4x2 (size/64)", i, bd)
		}
		colours = append(colours, fmt.Sprint(img.At(0, 0)))
	}
	if colours[0] == colours[1] {
		t.Errorf("both images have colour %s", colours[0])
	}
	for _, body := range []string{
		`{"prompt":""}`, `{"prompt":"x","n":0}`, `{"prompt":"x","n":11}`, `{"prompt":"x","size":"big"}`,
		`{"prompt":"x","response_format":"url"}`,
	} {
		resp := mustSend(t, srv, "POST", "/v1/images/generations", body, nil)
		if _, _ = io.Copy(io.Discard, resp.Body); resp.StatusCode != 400 {
			t.Errorf("%s: %d, want 400", body, resp.StatusCode)
		}
	}
	s := waitIdle(t, e, 5)
	if s.Completed != 1 || s.PrefixCacheQueries != 3 {
		t.Errorf("stats %+v", s)
	}
	if got := counterValue(t, testutil.Scrape(t, srv.Client(), srv.URL+"/metrics"), MetricGenerationTokens, "m1"); got != 4 {
		t.Errorf("generation steps %v, want Config.OutputTokens (4)", got)
	}
}

func TestRerank(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	body := `{"query":"red cat","documents":["a blue dog","the red cat sat",{"text":"cat"}],"top_n":2}`
	for _, path := range []string{"/v1/rerank", "/v2/rerank", "/rerank"} {
		t.Run(path, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", path, body, nil)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				t.Fatalf("got %d %s", resp.StatusCode, b)
			}
			id := decode[struct {
				ID string `json:"id"`
			}](t, b).ID
			if !regexp.MustCompile(`^rerank-[0-9a-f]{32}$`).MatchString(id) {
				t.Errorf("id %q", id)
			}
			// The prompt: every (query, document) pair, 2+3, 2+4, 2+1 tokens.
			want := fmt.Sprintf(`{"id":"%s","model":"m1","usage":{"prompt_tokens":14,"total_tokens":14},"results":[`+
				`{"index":1,"document":{"text":"the red cat sat"},"relevance_score":%v},`+
				`{"index":2,"document":{"text":"cat"},"relevance_score":%v}]}`,
				id, relevance("m1", "red cat", "the red cat sat"), relevance("m1", "red cat", "cat"))
			if string(b) != want {
				t.Errorf("body:\n%s\nwant:\n%s", b, want)
			}
		})
	}
	all := mustSend(t, srv, "POST", "/rerank", `{"model":"m2","query":"red cat","documents":["a blue dog","the red cat sat","cat"]}`, nil)
	b, _ := io.ReadAll(all.Body)
	res := decode[struct {
		Results []struct {
			Index int     `json:"index"`
			Score float64 `json:"relevance_score"`
		} `json:"results"`
	}](t, b).Results
	if len(res) != 3 || res[0].Index != 1 || res[2].Index != 0 || res[0].Score < res[1].Score || res[1].Score < res[2].Score {
		t.Errorf("top_n 0 returns all, best first: %s", b)
	}
	for _, bad := range []string{`{"documents":["a"]}`, `{"query":"q","documents":[]}`, `{"query":"q","documents":[1]}`, `{"query":"q","documents":["a"],"top_n":-1}`} {
		resp := mustSend(t, srv, "POST", "/v1/rerank", bad, nil)
		if _, _ = io.Copy(io.Discard, resp.Body); resp.StatusCode != 400 {
			t.Errorf("%s: %d", bad, resp.StatusCode)
		}
	}
	s := waitIdle(t, e, 4)
	if s.Completed != 4 || s.PrefixCacheQueries != 0 {
		t.Errorf("stats %+v (pooling does not use the prefix cache)", s)
	}
}

func TestScore(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	tests := []struct {
		name, body string
		pairs      [][2]string
	}{
		{"one against many", `{"text_1":"red cat","text_2":["a red cat","dog"]}`, [][2]string{{"red cat", "a red cat"}, {"red cat", "dog"}}},
		{"pairwise", `{"model":"m1","text_1":["a","b"],"text_2":["a","c"]}`, [][2]string{{"a", "a"}, {"b", "c"}}},
		{"strings", `{"text_1":"x","text_2":"x y"}`, [][2]string{{"x", "x y"}}},
		{"queries and documents", `{"queries":"q","documents":["q","r"]}`, [][2]string{{"q", "q"}, {"q", "r"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", "/v1/score", tc.body, nil)
			b, _ := io.ReadAll(resp.Body)
			id, created := chunkHead(t, string(b))
			var data []string
			tokens := 0
			for i, p := range tc.pairs {
				data = append(data, fmt.Sprintf(`{"index":%d,"object":"score","score":%v}`, i, relevance("m1", p[0], p[1])))
				tokens += pairTokens(p[0], p[1])
			}
			want := fmt.Sprintf(`{"id":"%s","object":"list","created":%d,"model":"m1","data":[%s],`+
				`"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":0,"prompt_tokens_details":null}}`,
				id, created, strings.Join(data, ","), tokens, tokens)
			if resp.StatusCode != 200 || string(b) != want || !strings.HasPrefix(id, "score-") {
				t.Errorf("got %d\n%s\nwant\n%s", resp.StatusCode, b, want)
			}
		})
	}
	resp := mustSend(t, srv, "POST", "/score", `{"text_1":["a","b"],"text_2":["a","b","c"]}`, nil)
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != 400 || !strings.Contains(string(b), "must have the same length") {
		t.Errorf("length mismatch: %d %s", resp.StatusCode, b)
	}
	waitIdle(t, e, 1)
}

func TestPoolingAndClassify(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := mustSend(t, srv, "POST", "/pooling", `{"model":"m2","input":["a b","c"]}`, nil)
	b, _ := io.ReadAll(resp.Body)
	id, created := chunkHead(t, string(b))
	vec := func(k string) string {
		var s []string
		for _, x := range embedding("m2", k, DefaultEmbeddingDim) {
			s = append(s, fmt.Sprint(x))
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	want := fmt.Sprintf(`{"id":"%s","object":"list","created":%d,"model":"m2","data":[`+
		`{"index":0,"object":"pooling","data":%s},{"index":1,"object":"pooling","data":%s}],`+
		`"usage":{"prompt_tokens":3,"total_tokens":3,"completion_tokens":0,"prompt_tokens_details":null}}`,
		id, created, vec("s:a b"), vec("s:c"))
	if resp.StatusCode != 200 || string(b) != want || !strings.HasPrefix(id, "pool-") {
		t.Errorf("pooling:\n%s\nwant\n%s", b, want)
	}

	resp = mustSend(t, srv, "POST", "/classify", `{"input":["good movie","bad movie","good movie"]}`, nil)
	b, _ = io.ReadAll(resp.Body)
	out := decode[struct {
		ID   string `json:"id"`
		Data []struct {
			Index      int       `json:"index"`
			Label      string    `json:"label"`
			Probs      []float64 `json:"probs"`
			NumClasses int       `json:"num_classes"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}](t, b)
	if resp.StatusCode != 200 || !strings.HasPrefix(out.ID, "classify-") || len(out.Data) != 3 || out.Usage.PromptTokens != 6 {
		t.Fatalf("classify %s", b)
	}
	for i, d := range out.Data {
		best := 0
		if d.Probs[1] > d.Probs[0] {
			best = 1
		}
		if d.Index != i || d.NumClasses != 2 || len(d.Probs) != 2 || math.Abs(d.Probs[0]+d.Probs[1]-1) > 1e-9 || d.Label != fmt.Sprintf("LABEL_%d", best) {
			t.Errorf("data[%d] = %+v", i, d)
		}
	}
	if fmt.Sprint(out.Data[0].Probs) != fmt.Sprint(out.Data[2].Probs) || fmt.Sprint(out.Data[0].Probs) == fmt.Sprint(out.Data[1].Probs) {
		t.Errorf("probabilities are not a function of the input: %s", b)
	}
	resp = mustSend(t, srv, "POST", "/classify", `{"model":"nope","input":"x"}`, nil)
	if _, _ = io.Copy(io.Discard, resp.Body); resp.StatusCode != 404 {
		t.Errorf("unknown model: %d", resp.StatusCode)
	}
	if s := waitIdle(t, e, 1); s.Completed != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestTokenize(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	tests := []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"prompt", "/tokenize", `{"model":"m1","prompt":"hello 5 world"}`, 200,
			fmt.Sprintf(`{"count":3,"max_model_len":8192,"tokens":[%d,5,%d],"token_strs":null}`, tokenID("hello"), tokenID("world"))},
		{"messages", "/tokenize", `{"messages":[{"role":"user","content":"a b"},{"role":"assistant","content":[{"type":"text","text":"c"}]}]}`, 200,
			fmt.Sprintf(`{"count":3,"max_model_len":8192,"tokens":[%d,%d,%d],"token_strs":null}`, tokenID("a"), tokenID("b"), tokenID("c"))},
		{"empty prompt", "/tokenize", `{"prompt":""}`, 200, `{"count":0,"max_model_len":8192,"tokens":[],"token_strs":null}`},
		{"nothing", "/tokenize", `{}`, 400, ""},
		{"unknown model", "/tokenize", `{"model":"nope","prompt":"x"}`, 404, ""},
		{"detokenize", "/detokenize", `{"tokens":[1,22,333]}`, 200, `{"prompt":"1 22 333"}`},
		{"detokenize negative", "/detokenize", `{"tokens":[-1]}`, 400, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := mustSend(t, srv, "POST", tc.path, tc.body, nil)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || (tc.want != "" && string(b) != tc.want) {
				t.Errorf("got %d %s, want %d %s", resp.StatusCode, b, tc.status, tc.want)
			}
		})
	}
	if s := e.Stats(); s.Received != 0 {
		t.Errorf("tokenizer requests were counted: %+v", s)
	}
}
