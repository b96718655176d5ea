package enginesim

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// imageRequest holds the fields the simulator reads from POST /v1/images/generations.
type imageRequest struct {
	Model          string `json:"model"`
	Prompt         string `json:"prompt"`
	N              *int   `json:"n"`
	Size           string `json:"size"`
	ResponseFormat string `json:"response_format"` // "b64_json" (the default); "url" is not served
}

// maxImages is the most images one request may ask for, as in OpenAI's API.
const maxImages = 10

// serveImages serves POST /v1/images/generations: the prompt is prefilled like a chat prompt
// (prefix cache included), then the image takes Config.OutputTokens generation steps (one
// inter-token latency each, counted as generation tokens); the answer is {created,
// data:[{b64_json}]} with n tiny PNGs of one deterministic colour, size/64 pixels a side.
func (e *Engine) serveImages(w http.ResponseWriter, r *http.Request) {
	var req imageRequest
	f, t, ok := admit(e, apiOpenAI, w, r, &req, func(q *imageRequest) string { return q.Model })
	if !ok {
		return
	}
	words := wordList(req.Prompt)
	n := 1
	if req.N != nil {
		n = *req.N
	}
	width, height, err := imageSize(req.Size)
	switch {
	case len(words) == 0:
		err = badRequestf("prompt must not be empty")
	case n < 1 || n > maxImages:
		err = badRequestf("n must be between 1 and %d, got %d", maxImages, n)
	case req.ResponseFormat != "" && req.ResponseFormat != "b64_json":
		err = badRequestf("response_format must be b64_json, got %q", req.ResponseFormat)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s := &seq{
		call:  e.newCall(w, r, f, apiOpenAI, t, false),
		words: words, promptTokens: promptTokens(words), cacheable: true,
		n: min(e.cfg.OutputTokens, e.cfg.MaxOutputTokens), finish: finishStop,
	}
	if f.noContent {
		s.n = 0
	}
	defer s.end(&err)
	err = s.serveUnary("application/json", func() ([]byte, error) {
		type datum struct {
			B64JSON string `json:"b64_json"`
		}
		resp := struct {
			Created int64   `json:"created"`
			Data    []datum `json:"data"`
		}{Created: time.Now().Unix(), Data: make([]datum, n)}
		for i := range resp.Data {
			b, err := tinyPNG(req.Prompt, i, max(1, width/64), max(1, height/64))
			if err != nil {
				return nil, err
			}
			resp.Data[i].B64JSON = base64.StdEncoding.EncodeToString(b)
		}
		return json.Marshal(resp)
	})
}

// imageSize parses a "WxH" size ("" and "auto" are 1024x1024).
func imageSize(size string) (int, int, error) {
	if size == "" || size == "auto" {
		return 1024, 1024, nil
	}
	ws, hs, ok := strings.Cut(size, "x")
	wd, werr := strconv.Atoi(ws)
	ht, herr := strconv.Atoi(hs)
	if !ok || werr != nil || herr != nil || wd < 1 || ht < 1 || wd > 8192 || ht > 8192 {
		return 0, 0, badRequestf("size must be WIDTHxHEIGHT (for example 1024x1024), got %q", size)
	}
	return wd, ht, nil
}

// tinyPNG encodes a w x h PNG of one colour derived from prompt and the image index.
func tinyPNG(prompt string, index, w, h int) ([]byte, error) {
	hs := fnv.New32a()
	fmt.Fprintf(hs, "%d\x00%s", index, prompt)
	v := hs.Sum32()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	c := color.NRGBA{R: uint8(v), G: uint8(v >> 8), B: uint8(v >> 16), A: 255}
	for y := range h {
		for x := range w {
			img.SetNRGBA(x, y, c)
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
