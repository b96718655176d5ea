package enginesim

import (
	"encoding/json"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
)

// vocabSize bounds the token ids of words that are not decimal numbers.
const vocabSize = 32000

// tokenID is the simulator's token id of a word: a non-negative decimal number is its own
// id (so detokenize of a completions token-id prompt returns its words), any other word a
// hash below vocabSize.
func tokenID(word string) int {
	if n, err := strconv.Atoi(word); err == nil && n >= 0 {
		return n
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(word))
	return int(h.Sum32() % vocabSize)
}

type tokenizeRequest struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []chatMessage   `json:"messages"`
}

// serveTokenize serves POST /tokenize {prompt | messages, model?}: {count, max_model_len,
// tokens, token_strs: null}, one token per word, at once (no running slot; served while
// asleep).
func (e *Engine) serveTokenize(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	var req tokenizeRequest
	if !decodeBody(apiOpenAI, w, r, &req) {
		return
	}
	if _, ok := e.resolve(apiOpenAI, w, req.Model); !ok {
		return
	}
	var (
		words []string
		err   error
	)
	switch {
	case len(req.Messages) > 0:
		words, err = chatPromptWords(req.Messages)
	case !isNull(req.Prompt):
		var s string
		if json.Unmarshal(req.Prompt, &s) != nil {
			err = badRequestf("prompt must be a string")
		}
		words = wordList(s)
	default:
		err = badRequestf("prompt or messages is required")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tokens := make([]int, len(words))
	for i, word := range words {
		tokens[i] = tokenID(word)
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("application/json", func() ([]byte, error) {
		return json.Marshal(struct {
			Count       int       `json:"count"`
			MaxModelLen int       `json:"max_model_len"`
			Tokens      []int     `json:"tokens"`
			TokenStrs   *[]string `json:"token_strs"`
		}{len(tokens), MaxModelLen, tokens, nil})
	})
}

type detokenizeRequest struct {
	Model  string `json:"model"`
	Tokens []int  `json:"tokens"`
}

// serveDetokenize serves POST /detokenize {tokens, model?}: {prompt}, the ids' decimal
// forms joined by spaces (the words a completions token-id prompt stands for).
func (e *Engine) serveDetokenize(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	var req detokenizeRequest
	if !decodeBody(apiOpenAI, w, r, &req) {
		return
	}
	if _, ok := e.resolve(apiOpenAI, w, req.Model); !ok {
		return
	}
	words := make([]string, len(req.Tokens))
	for i, id := range req.Tokens {
		if id < 0 {
			writeError(w, http.StatusBadRequest, "tokens must not be negative, got "+strconv.Itoa(id))
			return
		}
		words[i] = strconv.Itoa(id)
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("application/json", func() ([]byte, error) {
		return json.Marshal(struct {
			Prompt string `json:"prompt"`
		}{strings.Join(words, " ")})
	})
}
