package enginesim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
)

// serveEmbeddings serves POST /v1/embeddings.
func (e *Engine) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *embeddingRequest) string { return q.Model })
	if !ok {
		return
	}
	items, keys, err := inputItems(req.Input, "input")
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var b64 bool
	switch req.EncodingFormat {
	case "", "float":
	case "base64":
		b64 = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("encoding_format must be float or base64, got %q", req.EncodingFormat))
		return
	}
	c := e.newCall(w, r, f, apiOpenAI, t, false)
	defer c.end(&err)
	tokens := itemTokens(items)
	err = c.pool(tokens, func() any {
		resp := embeddingList{
			Object: "list",
			Data:   make([]embeddingData, len(keys)),
			Model:  c.model,
			Usage:  embeddingUsage{PromptTokens: tokens, TotalTokens: tokens},
		}
		for i, k := range keys {
			var v any = embedding(c.model, k, c.e.cfg.EmbeddingDim)
			if b64 {
				v = encodeBase64(v.([]float32))
			}
			resp.Data[i] = embeddingData{Object: "embedding", Index: i, Embedding: v}
		}
		return resp
	})
}

// itemTokens is the number of prompt tokens of items, each at least 1.
func itemTokens(items [][]string) int {
	tokens := 0
	for _, it := range items {
		tokens += promptTokens(it)
	}
	return tokens
}

// pool runs an admitted pooling request (embeddings, rerank, score, pooling, classify) of
// tokens prompt tokens: it takes a running slot and waits one prefill (TTFT plus
// TTFTPerRunning per other running sequence, no prefix cache), then answers with body's
// JSON.
func (c *call) pool(tokens int, body func() any) error {
	if handled, err := c.preHeaders(); handled || err != nil {
		return err
	}
	c.closeAfterHeaders("application/json")
	if _, err := c.admit(nil, tokens, false); err != nil {
		return err
	}
	if err := c.wait(c.prefillDelay(0), nil, false); err != nil {
		return err
	}
	c.m.promptTokens.Add(float64(tokens))
	b, err := json.Marshal(body())
	if err != nil {
		return err
	}
	return c.writeBody(b, finishStop)
}

// embedding returns the deterministic unit-length vector of dim elements for the input
// identified by key: normally distributed values from a PCG seeded with the FNV-1a hash of
// the model name and the input, divided by their Euclidean norm.
func embedding(model, key string, dim int) []float32 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(model))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(key))
	seed := h.Sum64()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	v := make([]float64, dim)
	var norm float64
	for i := range v {
		v[i] = rng.NormFloat64()
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	out := make([]float32, dim)
	for i, x := range v {
		out[i] = float32(x / norm)
	}
	return out
}

// encodeBase64 encodes v as OpenAI's base64 embedding format: little-endian float32s.
func encodeBase64(v []float32) string {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}
