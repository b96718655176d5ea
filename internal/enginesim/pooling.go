package enginesim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/internal/stablehash"
)

// poolingUsage is vLLM's UsageInfo as the score, pooling and classify responses dump it.
type poolingUsage struct {
	PromptTokens        int       `json:"prompt_tokens"`
	TotalTokens         int       `json:"total_tokens"`
	CompletionTokens    int       `json:"completion_tokens"`
	PromptTokensDetails *struct{} `json:"prompt_tokens_details"`
}

func newPoolingUsage(tokens int) poolingUsage {
	return poolingUsage{PromptTokens: tokens, TotalTokens: tokens}
}

// relevance is the simulated cross-encoder score of the pair (a, b) for model, in (0, 1):
// mostly the share of a's distinct words found in b (case-insensitive), so documents that
// share the query's words rank first, plus a small deterministic jitter from a hash.
func relevance(model, a, b string) float64 {
	aw, bw := wordSet(a), wordSet(b)
	overlap := 0.0
	if len(aw) > 0 {
		hit := 0
		for w := range aw {
			if bw[w] {
				hit++
			}
		}
		overlap = float64(hit) / float64(len(aw))
	}
	return 0.05 + 0.85*overlap + 0.1*unitHash(model, a, b)
}

// wordSet returns the distinct lower-cased words of s.
func wordSet(s string) map[string]bool {
	set := make(map[string]bool)
	for _, w := range strings.Fields(strings.ToLower(s)) {
		set[w] = true
	}
	return set
}

// unitHash maps its parts to [0, 1) deterministically.
func unitHash(parts ...string) float64 {
	h := fnv.New64a()
	for _, p := range parts {
		_, _ = h.Write([]byte(p))
		_, _ = h.Write([]byte{0})
	}
	return float64(stablehash.Mix64(h.Sum64())>>11) / (1 << 53)
}

// textList decodes a string or an array of strings (also documents given as {"text": ...}
// objects).
func textList(raw json.RawMessage, field string) ([]string, error) {
	if isNull(raw) {
		return nil, badRequestf("%s is required", field)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequestf("%s must be a string or an array of strings", field)
	}
	out := make([]string, len(items))
	for i, it := range items {
		if json.Unmarshal(it, &out[i]) == nil {
			continue
		}
		var doc struct {
			Text *string `json:"text"`
		}
		if json.Unmarshal(it, &doc) != nil || doc.Text == nil {
			return nil, badRequestf("%s[%d] must be a string or an object with text", field, i)
		}
		out[i] = *doc.Text
	}
	return out, nil
}

// pairTokens is the prompt tokens of scoring the pair (a, b) with a cross-encoder: both
// texts' tokens.
func pairTokens(a, b string) int {
	return promptTokens(wordList(a)) + promptTokens(wordList(b))
}

type rerankRequest struct {
	Model     string          `json:"model"`
	Query     json.RawMessage `json:"query"`
	Documents json.RawMessage `json:"documents"`
	TopN      int             `json:"top_n"`
}

type rerankResult struct {
	Index          int       `json:"index"`
	Document       rerankDoc `json:"document"`
	RelevanceScore float64   `json:"relevance_score"`
}

type rerankDoc struct {
	Text string `json:"text"`
}

// serveRerank serves POST /v1/rerank, /v2/rerank and /rerank (Jina/Cohere style): the
// documents scored against the query, best first, the top_n of them when 0 < top_n.
func (e *Engine) serveRerank(w http.ResponseWriter, r *http.Request) {
	var req rerankRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *rerankRequest) string { return q.Model })
	if !ok {
		return
	}
	var query string
	err := json.Unmarshal(req.Query, &query)
	if isNull(req.Query) || err != nil {
		writeError(w, http.StatusBadRequest, "query must be a string")
		return
	}
	docs, err := textList(req.Documents, "documents")
	if err == nil && len(docs) == 0 {
		err = badRequestf("documents must not be empty")
	}
	if err == nil && req.TopN < 0 {
		err = badRequestf("top_n must not be negative, got %d", req.TopN)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tokens := 0
	for _, d := range docs {
		tokens += pairTokens(query, d)
	}
	c := e.newCall(w, r, f, apiOpenAI, t, false)
	defer c.end(&err)
	err = c.pool(tokens, func() any {
		results := make([]rerankResult, len(docs))
		for i, d := range docs {
			results[i] = rerankResult{Index: i, Document: rerankDoc{Text: d}, RelevanceScore: relevance(c.model, query, d)}
		}
		slices.SortStableFunc(results, func(a, b rerankResult) int { return cmp.Compare(b.RelevanceScore, a.RelevanceScore) })
		if req.TopN > 0 && req.TopN < len(results) {
			results = results[:req.TopN]
		}
		return struct {
			ID      string         `json:"id"`
			Model   string         `json:"model"`
			Usage   embeddingUsage `json:"usage"`
			Results []rerankResult `json:"results"`
		}{ID: newID("rerank-"), Model: c.model, Usage: embeddingUsage{tokens, tokens}, Results: results}
	})
}

type scoreRequest struct {
	Model     string          `json:"model"`
	Text1     json.RawMessage `json:"text_1"`
	Text2     json.RawMessage `json:"text_2"`
	Queries   json.RawMessage `json:"queries"`
	Documents json.RawMessage `json:"documents"`
	Data1     json.RawMessage `json:"data_1"`
	Data2     json.RawMessage `json:"data_2"`
}

// pair returns the request's two sides, whichever spelling it used (text_1/text_2,
// queries/documents or data_1/data_2), and their field names.
func (q *scoreRequest) pair() (a, b json.RawMessage, an, bn string) {
	switch {
	case !isNull(q.Queries):
		return q.Queries, q.Documents, "queries", "documents"
	case !isNull(q.Data1):
		return q.Data1, q.Data2, "data_1", "data_2"
	}
	return q.Text1, q.Text2, "text_1", "text_2"
}

type scoreDatum struct {
	Index  int     `json:"index"`
	Object string  `json:"object"`
	Score  float64 `json:"score"`
}

// serveScore serves POST /v1/score and /score: text_1 (one string, paired with every
// text_2, or a list as long as text_2) scored against text_2.
func (e *Engine) serveScore(w http.ResponseWriter, r *http.Request) {
	var req scoreRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *scoreRequest) string { return q.Model })
	if !ok {
		return
	}
	ra, rb, an, bn := req.pair()
	as, err := textList(ra, an)
	var bs []string
	if err == nil {
		bs, err = textList(rb, bn)
	}
	switch {
	case err != nil:
	case len(as) == 0 || len(bs) == 0:
		err = badRequestf("%s and %s must not be empty", an, bn)
	case len(as) == 1:
		as = slices.Repeat(as, len(bs))
	case len(as) != len(bs):
		err = badRequestf("%s (%d items) and %s (%d items) must have the same length, or %s one item", an, len(as), bn, len(bs), an)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tokens := 0
	for i := range as {
		tokens += pairTokens(as[i], bs[i])
	}
	c := e.newCall(w, r, f, apiOpenAI, t, false)
	defer c.end(&err)
	err = c.pool(tokens, func() any {
		data := make([]scoreDatum, len(as))
		for i := range as {
			data[i] = scoreDatum{Index: i, Object: "score", Score: relevance(c.model, as[i], bs[i])}
		}
		return poolingList[scoreDatum]{
			ID: newID("score-"), Object: "list", Created: time.Now().Unix(), Model: c.model, Data: data,
			Usage: newPoolingUsage(tokens),
		}
	})
}

// poolingList is the envelope of the score, pooling and classify responses.
type poolingList[T any] struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Data    []T          `json:"data"`
	Usage   poolingUsage `json:"usage"`
}

// poolInput is the body of POST /pooling and /classify: input like embeddings', or chat
// messages (one item).
type poolInput struct {
	Model    string          `json:"model"`
	Input    json.RawMessage `json:"input"`
	Messages []chatMessage   `json:"messages"`
}

// items returns the request's items and a key per item identifying its content.
func (q *poolInput) items() ([][]string, []string, error) {
	if len(q.Messages) > 0 {
		words, err := chatPromptWords(q.Messages)
		return [][]string{words}, []string{"m:" + strings.Join(words, " ")}, err
	}
	return inputItems(q.Input, "input")
}

type poolingDatum struct {
	Index  int       `json:"index"`
	Object string    `json:"object"`
	Data   []float32 `json:"data"`
}

// servePooling serves POST /pooling: one vector per input item, the same as /v1/embeddings
// returns for it.
func (e *Engine) servePooling(w http.ResponseWriter, r *http.Request) {
	e.servePoolInput(w, r, func(c *call, keys []string, tokens int) any {
		data := make([]poolingDatum, len(keys))
		for i, k := range keys {
			data[i] = poolingDatum{Index: i, Object: "pooling", Data: embedding(c.model, k, e.cfg.EmbeddingDim)}
		}
		return poolingList[poolingDatum]{
			ID: newID("pool-"), Object: "list", Created: time.Now().Unix(), Model: c.model, Data: data,
			Usage: newPoolingUsage(tokens),
		}
	})
}

// servePoolInput serves a pooling route whose body is a poolInput: it admits the request,
// reads its items and answers, after the pooling latency, the body build makes from the
// items' keys and their token count.
func (e *Engine) servePoolInput(w http.ResponseWriter, r *http.Request, build func(c *call, keys []string, tokens int) any) {
	var req poolInput
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *poolInput) string { return q.Model })
	if !ok {
		return
	}
	items, keys, err := req.items()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tokens := itemTokens(items)
	c := e.newCall(w, r, f, apiOpenAI, t, false)
	defer c.end(&err)
	err = c.pool(tokens, func() any { return build(c, keys, tokens) })
}

type classifyDatum struct {
	Index      int       `json:"index"`
	Label      string    `json:"label"`
	Probs      []float64 `json:"probs"`
	NumClasses int       `json:"num_classes"`
}

// numClasses is the simulated classifier's class count; its labels are LABEL_0, LABEL_1
// (a model config without id2label names).
const numClasses = 2

// serveClassify serves POST /classify: per input item, deterministic class probabilities
// and the most probable label.
func (e *Engine) serveClassify(w http.ResponseWriter, r *http.Request) {
	e.servePoolInput(w, r, func(c *call, keys []string, tokens int) any {
		data := make([]classifyDatum, len(keys))
		for i, k := range keys {
			probs := classProbs(c.model, k)
			best := 0
			for j, p := range probs {
				if p > probs[best] {
					best = j
				}
			}
			data[i] = classifyDatum{Index: i, Label: fmt.Sprintf("LABEL_%d", best), Probs: probs, NumClasses: numClasses}
		}
		return poolingList[classifyDatum]{
			ID: newID("classify-"), Object: "list", Created: time.Now().Unix(), Model: c.model, Data: data,
			Usage: newPoolingUsage(tokens),
		}
	})
}

// classProbs returns the softmax of deterministic logits in [-2, 2) for the input key.
func classProbs(model, key string) []float64 {
	probs := make([]float64, numClasses)
	sum := 0.0
	for j := range probs {
		probs[j] = math.Exp(4*unitHash(model, key, fmt.Sprint(j)) - 2)
		sum += probs[j]
	}
	for j := range probs {
		probs[j] /= sum
	}
	return probs
}
