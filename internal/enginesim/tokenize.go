package enginesim

import (
	"encoding/json"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
)

// vocabSize bounds the token ids of prompt words that are neither decimal numbers nor
// generated tokens.
const vocabSize = 32000

// Generated tokens have ids that name their index, so that a prompt made of a generation's
// token ids (a continuation after a cut stream) tells where the generation stopped: content
// token i ([ContentToken], "tok<i>") has id contentIDBase+i, reasoning token i
// ([ReasoningToken], "think<i>") reasoningIDBase+i.
const (
	contentIDBase   = vocabSize
	reasoningIDBase = 1 << 30
)

// contentTokenID is the token id of content token i.
func contentTokenID(i int) int { return contentIDBase + i }

// reasoningTokenID is the token id of reasoning token i.
func reasoningTokenID(i int) int { return reasoningIDBase + i }

// tokenID is the simulator's token id of a word: a non-negative decimal number is its own
// id (so a completions token-id prompt keeps its ids), "tok<i>" and "think<i>" (the
// generated tokens' words, i without leading zeros) their generated ids, any other word a
// hash below vocabSize.
func tokenID(word string) int {
	if n, err := strconv.Atoi(word); err == nil && n >= 0 {
		return n
	}
	if i, ok := generatedIndex(word, "tok"); ok && i < reasoningIDBase-contentIDBase {
		return contentTokenID(i)
	}
	if i, ok := generatedIndex(word, "think"); ok && i < reasoningIDBase {
		return reasoningTokenID(i)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(word))
	return int(h.Sum32() % vocabSize)
}

// generatedIndex parses word as prefix followed by a canonical decimal index (no sign, no
// leading zero).
func generatedIndex(word, prefix string) (int, bool) {
	digits, ok := strings.CutPrefix(word, prefix)
	if !ok || digits == "" || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

// tokenWord is the word of token id: the generated token's word (without its trailing
// space) for a generated id, else the id's decimal form.
func tokenWord(id int) string {
	switch {
	case id >= reasoningIDBase:
		return "think" + strconv.Itoa(id-reasoningIDBase)
	case id >= contentIDBase:
		return "tok" + strconv.Itoa(id-contentIDBase)
	}
	return strconv.Itoa(id)
}

// promptTokenIDs returns the token ids of a prompt of words: one per word, and for an empty
// prompt (counted as one token by [promptTokens]) the single id 0, so that there are always
// promptTokens(words) of them.
func promptTokenIDs(words []string) []int {
	if len(words) == 0 {
		return []int{0}
	}
	ids := make([]int, len(words))
	for i, w := range words {
		ids[i] = tokenID(w)
	}
	return ids
}

// resumeIndex returns k when ids end with the content token ids of tokens 0..k-1 in order
// (a generation cut after k tokens, sent back as the prompt of its continuation), else 0.
func resumeIndex(ids []int) int {
	if len(ids) == 0 {
		return 0
	}
	last := ids[len(ids)-1]
	if last < contentIDBase || last >= reasoningIDBase {
		return 0
	}
	k := last - contentIDBase + 1
	if k > len(ids) {
		return 0
	}
	for j, id := range ids[len(ids)-k:] {
		if id != contentTokenID(j) {
			return 0
		}
	}
	return k
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
		}{len(tokens), e.cfg.MaxModelLen, tokens, nil})
	})
}

type detokenizeRequest struct {
	Model  string `json:"model"`
	Tokens []int  `json:"tokens"`
}

// serveDetokenize serves POST /detokenize {tokens, model?}: {prompt}, the ids' words joined
// by spaces: a generated token's word ("tok<i>", "think<i>") for a generated id, else the
// decimal form (the word a completions token-id prompt stands for), so that /tokenize of
// the result gives the ids back.
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
		words[i] = tokenWord(id)
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("application/json", func() ([]byte, error) {
		return json.Marshal(struct {
			Prompt string `json:"prompt"`
		}{strings.Join(words, " ")})
	})
}
