package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/trace"

	"github.com/switchboard-gw/switchboard/internal/oai"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// Continuation of a broken generation (migration).
//
// When an engine fails after a generation's first tokens reached the
// client (a reset or EOF before the end, silence past Timeouts.Idle, an
// in-band error event, a finish_reason "abort" from an engine shutting
// down), the gateway continues the generation on another engine that
// serves the model: it has asked every engine for token ids (vLLM's
// return_token_ids), kept the prompt ids and the ids generated so far,
// and re-issues them as a token prompt on /v1/completions with the same
// sampling parameters and max_tokens reduced by what was generated (the
// mechanism of NVIDIA Dynamo's request migration). The continuation's
// chunks are reshaped into the client's framing: the same id, created and
// model, no second role chunk, no token repeated or missing, the whole
// answer's finish_reason and usage. It is the same model and sampling
// continuing from the same tokens, not a bit-identical replay: a seeded
// sampler starts again from its seed at the seam.
//
// Requests whose continuation could not reproduce what the client asked
// for are excluded (migrationExclusion); their break ends as without
// continuation, with the explicit error event.

// MigrationConfig configures the continuation of broken generations
// (docs/resilience.md, "Continuation").
type MigrationConfig struct {
	// Limit is how many continuations one request may have. 0 turns
	// continuation off (no return_token_ids is asked of the engines, and
	// a non-streaming request is not observed for it). Above 0, a
	// continuable non-streaming chat, completions, Messages or Responses
	// request is sent to its engine as a stream and reassembled
	// (Config.ObserveNonStreaming says how), so that it can be continued
	// and its client gets one whole body, unless NonStreaming is false or
	// Config.MaxResponseBufferBytes is 0.
	// Default 1: each continuation re-prefills the prompt and everything
	// generated so far on another engine, which is the cost of the whole
	// context again; one covers the failure that matters (an engine
	// dying, drained or stalled under a request), while a request whose
	// continuation breaks too is more likely hitting a fleet-wide or
	// request-borne fault, which further continuations would multiply.
	// (Dynamo's --migration-limit defaults to 0 and its docs suggest 3.)
	Limit int `koanf:"limit"`
	// On lists the failures a generation is continued after:
	// engine_disconnect (the engine closed or reset the stream before
	// its end), idle_timeout (silent past Timeouts.Idle), stream_error
	// (the engine's in-band error event), engine_abort (finish_reason
	// "abort": the engine aborted the request, as vLLM does when it shuts
	// down) and first_token_timeout (a stream that started but produced
	// no content in Timeouts.FirstToken). Default: all but
	// first_token_timeout.
	On []string `koanf:"on"`
	// MaxTokens bounds the token ids held for one request, prompt and
	// generated (4 bytes each): a request whose prompt and answer pass it
	// stops being tracked and is not continued (exclusion max_tokens), as
	// Dynamo's --migration-max-seq-len. Default 32768.
	MaxTokens int `koanf:"max_tokens"`
	// NonStreaming, when true (the default), reads every continuable
	// non-streaming request as a stream (see Limit) so that a generation
	// its engine breaks can be continued; the gateway then pays for
	// reassembling the answer (BENCHMARKS.md: the non-streaming row, read
	// as a stream), and the request gets TTFT and ITL as a stream does.
	// False sends non-streaming requests as they came (unless
	// Config.ObserveNonStreaming): a break before the answer is lost, as
	// without continuation (a 502, retried only under server.retry).
	NonStreaming bool `koanf:"non_streaming"`
	// ResponsesStore says the engines store Responses API responses by
	// default (vLLM started with VLLM_ENABLE_RESPONSES_API_STORE=1, where
	// a request without "store" is stored): a Responses request that does
	// not set store false is then not continued (exclusion stored_state),
	// since the engine that finishes a continued answer stores nothing
	// and the one that broke keeps a cut one under its id. Default false,
	// as vLLM's default: without that variable it stores nothing, and a
	// request that sets store true explicitly is not continued either way.
	ResponsesStore bool `koanf:"responses_store"`
}

// The failure kinds of MigrationConfig.On.
const (
	migrateDisconnect = ErrTypeEngineDisconnect
	migrateIdle       = ErrTypeIdleTimeout
	migrateStreamErr  = ErrTypeStreamError
	migrateAbort      = "engine_abort"
	migrateFirstToken = ErrTypeFirstToken
)

// migrationKinds are the values MigrationConfig.On accepts.
var migrationKinds = []string{migrateDisconnect, migrateIdle, migrateStreamErr, migrateAbort, migrateFirstToken}

// DefaultMigrationConfig returns the defaults documented on
// MigrationConfig.
func DefaultMigrationConfig() MigrationConfig {
	return MigrationConfig{Limit: 1, On: []string{migrateDisconnect, migrateIdle, migrateStreamErr, migrateAbort}, MaxTokens: 32768, NonStreaming: true}
}

// validate reports each bad setting, wrapping ErrInvalidConfig.
func (c MigrationConfig) validate() []error {
	var errs []error
	if c.Limit < 0 {
		errs = append(errs, fmt.Errorf("%w: migration.limit must be >= 0, got %d", ErrInvalidConfig, c.Limit))
	}
	if c.MaxTokens < 1 {
		errs = append(errs, fmt.Errorf("%w: migration.max_tokens must be >= 1, got %d", ErrInvalidConfig, c.MaxTokens))
	}
	for _, k := range c.On {
		if !slices.Contains(migrationKinds, k) {
			errs = append(errs, fmt.Errorf("%w: migration.on: unknown failure kind %q (want one of %v)", ErrInvalidConfig, k, migrationKinds))
		}
	}
	return errs
}

// on reports whether failure kind k is continued.
func (c *MigrationConfig) on(k string) bool { return slices.Contains(c.On, k) }

// migrateKind is how an operation-table row's generations are continued.
type migrateKind uint8

const (
	migrateNone       migrateKind = iota // not continued
	migrateChat                          // chat completions: chunks reshaped from completions
	migrateCompletion                    // completions: the same framing
	// migrateMessages: Anthropic Messages streams; vLLM returns no token
	// ids there, so the continuation tokenizes the prompt and the text so
	// far through the engine's /tokenize, and its chunks become
	// content_block_delta events.
	migrateMessages
	// migrateResponses: Responses API streams, as Messages ones (no token
	// ids from vLLM): its chunks become response.output_text.delta events
	// and the gateway sends the end (migration_responses.go).
	migrateResponses
)

// Exclusions: why a broken generation is not continued
// (telemetry.AttrMigrationExclusion).
const (
	exclStructured = "structured_output" // response_format with a schema, guided_*, structured_outputs: the grammar would restart at its root
	exclTools      = "tools"             // tools offered, or tool calls streamed: the server's tool parser keeps per-stream state
	exclReasoning  = "reasoning"         // reasoning streamed: the server's reasoning parser keeps per-stream state
	exclN          = "n"                 // n or best_of > 1, or several prompts: several sequences in one stream
	exclLogprobs   = "logprobs"          // logprobs or top_logprobs: the continuation's are of another prompt
	exclEcho       = "echo"              // echo: the prompt would be echoed again
	exclStop       = "stop"              // stop strings: vLLM holds back text that may start one while it sends the token ids, so the ids can be ahead of what the client has
	exclMultimodal = "multimodal"        // images, audio, video or embeddings in the prompt: token ids alone lose them
	exclMaxTokens  = "max_tokens"        // prompt and answer passed MigrationConfig.MaxTokens
	exclNoTokenIDs = "no_token_ids"      // the engine sent no token ids (a vLLM before return_token_ids)
	exclProvider   = "provider"          // the leg went to a hosted provider, which sends no token ids
)

// excludeKeys are the body members whose presence needs a closer look
// (excludedBy); a body with none of them is continuable as it is. They are
// looked for as bytes first, so most bodies are never decoded.
var excludeKeys = [][]byte{
	[]byte(`"n"`), []byte(`"best_of"`), []byte(`"logprobs"`), []byte(`"top_logprobs"`), []byte(`"echo"`),
	[]byte(`"response_format"`), []byte(`"guided_`), []byte(`"structured_outputs"`), []byte(`"tools"`),
	[]byte(`"functions"`), []byte(`"prompt_embeds"`), []byte(`"multi_modal_data"`), []byte(`"image_url"`),
	[]byte(`"input_audio"`), []byte(`"audio_url"`), []byte(`"video_url"`), []byte(`"image_embeds"`),
	[]byte(`"file"`), []byte(`"prompt"`), []byte(`"stop"`),
}

// isSet reports whether a body member is given a value that means
// something: not absent, null, false, 0, [] or "".
func isSet(v json.RawMessage) bool {
	switch string(v) {
	case "", "null", "false", "0", "[]", `""`:
		return false
	}
	return true
}

// excludedBy returns why a request body cannot be continued, "" when it
// can; storedResponses is MigrationConfig.ResponsesStore (a Responses
// request is stored unless it says store false). A chat or completions
// body without any of excludeKeys is not decoded; any other is decoded
// once.
func excludedBy(k migrateKind, body []byte, storedResponses bool) string {
	found := false
	for _, key := range excludeKeys {
		if bytes.Contains(body, key) {
			found = true
			break
		}
	}
	if !found && k != migrateMessages && k != migrateResponses { // Anthropic content blocks and Responses input are always looked at
		return ""
	}
	var b struct {
		responsesFields
		N             json.RawMessage        `json:"n"`
		BestOf        json.RawMessage        `json:"best_of"`
		Logprobs      json.RawMessage        `json:"logprobs"`
		TopLogprobs   json.RawMessage        `json:"top_logprobs"`
		Echo          json.RawMessage        `json:"echo"`
		Stop          json.RawMessage        `json:"stop"`
		StopSequences json.RawMessage        `json:"stop_sequences"`
		Thinking      *struct{ Type string } `json:"thinking"`
		OutputConfig  *struct {
			Format json.RawMessage `json:"format"`
		} `json:"output_config"`
		System         json.RawMessage        `json:"system"`
		ResponseFormat *struct{ Type string } `json:"response_format"`
		Structured     json.RawMessage        `json:"structured_outputs"`
		Tools          json.RawMessage        `json:"tools"`
		Functions      json.RawMessage        `json:"functions"`
		ToolChoice     json.RawMessage        `json:"tool_choice"`
		PromptEmbeds   json.RawMessage        `json:"prompt_embeds"`
		MultiModal     json.RawMessage        `json:"multi_modal_data"`
		Prompt         json.RawMessage        `json:"prompt"`
		Messages       []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Guided map[string]json.RawMessage `json:"-"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return exclStructured // unreadable here: not continued (the engine judges the body)
	}
	if k == migrateResponses {
		if why := b.responsesFields.excluded(storedResponses, b.Prompt, b.Tools); why != "" {
			return why
		}
	}
	set := isSet
	more := func(v json.RawMessage) bool {
		n, err := strconv.ParseFloat(string(v), 64)
		return set(v) && (err != nil || n > 1)
	}
	switch {
	case more(b.N) || more(b.BestOf):
		return exclN
	case set(b.Logprobs) || set(b.TopLogprobs):
		return exclLogprobs
	case set(b.Echo):
		return exclEcho
	case set(b.Stop) || set(b.StopSequences):
		return exclStop
	case b.Thinking != nil && b.Thinking.Type != "" && b.Thinking.Type != "disabled":
		return exclReasoning
	case b.OutputConfig != nil && set(b.OutputConfig.Format):
		return exclStructured
	case b.ResponseFormat != nil && b.ResponseFormat.Type != "" && b.ResponseFormat.Type != "text", set(b.Structured), hasGuided(body):
		return exclStructured
	case (set(b.Tools) || set(b.Functions)) && string(b.ToolChoice) != `"none"`:
		return exclTools
	case set(b.PromptEmbeds) || set(b.MultiModal):
		return exclMultimodal
	}
	if len(b.System) > 0 && b.System[0] == '[' && hasMedia(b.System) {
		return exclMultimodal
	}
	for _, m := range b.Messages {
		if len(m.Content) > 0 && m.Content[0] == '[' && hasMedia(m.Content) {
			return exclMultimodal
		}
	}
	if k == migrateCompletion && len(b.Prompt) > 0 && b.Prompt[0] == '[' {
		// A list of prompts (strings, or lists of ids) is several
		// sequences; one list of ids is one prompt.
		var many []json.RawMessage
		if json.Unmarshal(b.Prompt, &many) == nil && len(many) > 0 {
			if c := many[0][0]; c == '"' || c == '[' {
				if len(many) > 1 {
					return exclN
				}
			}
		}
	}
	return ""
}

// hasGuided reports whether a body has a top-level guided_* member set
// (vLLM's guided decoding parameters).
func hasGuided(body []byte) bool {
	if !bytes.Contains(body, []byte(`"guided_`)) {
		return false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return true
	}
	for k, v := range m {
		if len(k) > 7 && k[:7] == "guided_" && string(v) != "null" {
			return true
		}
	}
	return false
}

// hasMedia reports whether a message's content parts include anything but
// text.
func hasMedia(content json.RawMessage) bool {
	var parts []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(content, &parts) != nil {
		return true
	}
	for _, p := range parts {
		if p.Type != "text" && p.Type != "input_text" && p.Type != "output_text" {
			return true
		}
	}
	return false
}

// carry is what a continuable request keeps across its legs: the token
// ids, what the client has been sent, and the framing its continuation's
// chunks are reshaped into. It lives on the request's stack (proxy).
type carry struct {
	kind migrateKind
	cfg  *MigrationConfig
	// body is the client's request body (the sampling parameters are
	// read from it when a continuation is built).
	body []byte
	// clientIDs: the client asked for return_token_ids itself, so the
	// token id fields are forwarded; otherwise they are cut.
	clientIDs bool
	// usage: the client asked for the usage chunk (not the gateway).
	usage bool
	// excluded is why the request cannot be continued ("" while it can);
	// set at arrival from the body (arrival), or mid-stream (tool calls
	// or reasoning streamed, too many tokens).
	excluded, arrival string

	prompt, gen []int32 // token ids: the prompt's, and those generated so far
	sawPrompt   bool
	// promptLen is len(prompt) once seen, kept when an exclusion lets go
	// of the ids: the whole answer's usage counts it.
	promptLen int
	// id, created and model are the client's answer's, from the first
	// leg's first chunk (raw JSON values).
	id, created, model []byte
	// continued counts the continuation legs started; engines names
	// their engines, for the access log.
	continued int
	engines   []string
	// others: another engine of the model could take a continuation (the
	// plan says so before each leg), so an end the engine sends itself
	// (an error event, an abort) is worth holding back.
	others bool
	// aborted: the leg being relayed ended with finish_reason "abort"
	// that was not held back (a continuation leg at the limit).
	aborted bool
	// text is a Messages or Responses stream's text so far (framed), and
	// finish its continuation's finish reason until the usage chunk.
	text   []byte
	finish string
	// ended: a Messages or Responses continuation has sent its end
	// events; blockStarted: the client has the text block's
	// content_block_start (Messages) or the output_text part's
	// content_part.added (Responses).
	ended, blockStarted bool
	// A Responses stream's: resp is response.created's response object
	// (the one response.completed completes), itemID its message item's
	// id (a JSON string), seq the next event's sequence_number.
	resp, itemID []byte
	seq          int64
	// keepText: the text the client got is kept in text (always for
	// Responses; for chat and completions when the model has
	// models.fallbacks), so a continuation can cross to a fallback model,
	// whose tokenizer need not read this one's ids; crossing: the next
	// continuation leg is on a fallback model and tokenizes the prompt
	// and text there first (cross).
	keepText, crossing bool
	// link is the span of the leg that broke, linked from the next; cut
	// how it broke.
	link trace.SpanContext
	cut  *cut
	// genCap is the first capacity of gen: max_tokens, within bounds.
	genCap int
	// legGen is the number of tokens generated before the leg being
	// relayed (a continuation's usage adds its own).
	legGen int
	// ra reassembles a non-streaming client's answer across its legs
	// (observes); answer is the event bytes it holds, buffered the bytes
	// of the buffered-bytes budget the request's legs took, given back
	// when the request ends.
	ra               answerer
	answer, buffered int64
}

// newCarry returns the carry of a request, or nil when its route is not
// continued or continuation is off.
func newCarry(op *operation, in *inbound) *carry {
	cfg := &in.set.cfg.Migration
	if op.migrate == migrateNone || cfg.Limit == 0 || !in.stream && !in.observe {
		return nil
	}
	// A whole answer (observed as a stream) always gets its usage: the
	// reassembled body has it.
	c := &carry{kind: op.migrate, cfg: cfg, body: in.body, clientIDs: bytes.Contains(in.body, []byte(`"return_token_ids"`)) && returnTokenIDs(in.body),
		usage: in.req.IncludeUsage || in.observe}
	c.excluded = in.exclusion(op.migrate)
	c.arrival = c.excluded
	c.keepText = op.migrate == migrateResponses
	c.genCap = 256
	if m := in.req.MaxTokens; m > 0 && m < 4096 {
		c.genCap = int(m)
	}
	return c
}

// restart forgets what a leg that reached nothing of the client learned
// (its answer's id, its token ids, a mid-stream exclusion): the next leg
// (a retry, a fallback model) starts the answer afresh.
func (c *carry) restart() {
	if c == nil {
		return
	}
	c.excluded = c.arrival
	c.prompt, c.gen, c.sawPrompt, c.promptLen = c.prompt[:0], c.gen[:0], false, 0
	c.id, c.created, c.model = nil, nil, nil
	c.ra, c.answer = nil, 0
	c.text, c.finish, c.ended, c.blockStarted = c.text[:0], "", false, false
	c.resp, c.itemID, c.seq = c.resp[:0], nil, 0
}

// asksIDs reports whether the engine is asked for token ids
// (return_token_ids): a continuable chat or completions request whose
// client did not ask itself.
func (c *carry) asksIDs() bool {
	return c.continuable() && !c.clientIDs && !c.framed()
}

// framed reports whether reshape returns whole events (Anthropic's or the
// Responses API's, with their event lines) rather than the data of one;
// these routes' engines send no token ids, so the continuation tokenizes
// the text the client got (tokenizeContinuation).
func (c *carry) framed() bool { return c.kind == migrateMessages || c.kind == migrateResponses }

// returnTokenIDs reports whether the body sets return_token_ids true.
func returnTokenIDs(body []byte) bool {
	var b struct {
		R bool `json:"return_token_ids"`
	}
	return json.Unmarshal(body, &b) == nil && b.R
}

// held is the number of token ids held.
func (c *carry) held() int { return len(c.prompt) + len(c.gen) }

// appendIDs parses a JSON array of token ids (raw) onto ids. ok is false
// when raw is not an array of non-negative integers.
func appendIDs(ids []int32, raw []byte) ([]int32, bool) {
	i := 0
	skip := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\n' || raw[i] == '\t' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if bytes.Equal(raw[i:], []byte("null")) {
		return ids, true
	}
	if i >= len(raw) || raw[i] != '[' {
		return ids, false
	}
	i++
	skip()
	if i < len(raw) && raw[i] == ']' {
		return ids, true
	}
	for {
		skip()
		start := i
		var n int64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			n = n*10 + int64(raw[i]-'0')
			if n > 1<<31-1 {
				return ids, false
			}
			i++
		}
		if i == start {
			return ids, false
		}
		ids = append(ids, int32(n))
		skip()
		if i >= len(raw) {
			return ids, false
		}
		switch raw[i] {
		case ',':
			i++
		case ']':
			return ids, true
		default:
			return ids, false
		}
	}
}

// The token id members of a chunk: both keys end with tokenIDsTail, which
// take searches for once (tokenIDKeys).
const (
	promptIDsKey = `"prompt_token_ids":`
	tokenIDsKey  = `"token_ids":`
)

var tokenIDsTail = []byte(`token_ids":`)

// tokenIDKeys returns the positions in data of the first "prompt_token_ids":
// and the first "token_ids": (-1 when absent), in one scan for the tail
// both end with: a hit preceded by "prompt_ is the former's, one preceded
// by a plain quote the latter's, any other ("xtoken_ids":) neither's. The
// tail cannot overlap itself, so the hits are all its occurrences.
func tokenIDKeys(data []byte) (p, t int) {
	p, t = -1, -1
	for i := 0; p < 0 || t < 0; {
		k := bytes.Index(data[i:], tokenIDsTail)
		if k < 0 {
			break
		}
		at := i + k
		switch {
		case p < 0 && at >= 8 && string(data[at-8:at]) == `"prompt_`:
			p = at - 8
		case t < 0 && at >= 1 && data[at-1] == '"':
			t = at - 1
		}
		i = at + len(tokenIDsTail)
	}
	return p, t
}

// tokenIDsAfterCut returns the position of the first "token_ids": in out,
// which is data with data[from:to] (a member) cut, given t, the first's in
// data (-1: none).
func tokenIDsAfterCut(out []byte, t, from, to int) int {
	const n = len(tokenIDsKey)
	if t >= 0 && t+n <= from {
		return t // before the cut: not moved
	}
	// One the cut joined, across from (only in what is not JSON): it is
	// the first.
	lo, hi := max(from-n+1, 0), min(from+n-1, len(out))
	if k := bytes.Index(out[lo:hi], []byte(tokenIDsKey)); k >= 0 {
		return lo + k
	}
	switch {
	case t >= to:
		return t - (to - from) // after the cut: moved back
	case t < 0:
		return -1
	}
	// t was cut with the member (inside its value, only in what is not
	// JSON): the next one after.
	if k := bytes.Index(out[from:], []byte(tokenIDsKey)); k >= 0 {
		return from + k
	}
	return -1
}

// memberAt reads the member whose key, "key": (klen bytes), is at data[at]
// in the JSON object text data (the key found by a byte search: a key's
// quotes cannot occur unescaped inside a string): data[from:to] is the
// member with its separating comma, data[v:end] its value. ok is false
// when at < 0 (no key), when what precedes the key is neither the
// object's '{' nor a comma, or when its value is neither an array of
// numbers nor null.
func memberAt(data []byte, at, klen int) (from, to, v, end int, ok bool) {
	if at < 0 {
		return 0, 0, 0, 0, false
	}
	// What precedes the key, past any whitespace: the object's '{' or
	// the comma after the member before it.
	before := at - 1
	for before >= 0 && isJSONSpace(data[before]) {
		before--
	}
	if before < 0 || data[before] != ',' && data[before] != '{' {
		return 0, 0, 0, 0, false
	}
	v = at + klen
	for v < len(data) && isJSONSpace(data[v]) {
		v++
	}
	switch {
	case v < len(data) && data[v] == '[':
		e := bytes.IndexByte(data[v:], ']')
		if e < 0 {
			return 0, 0, 0, 0, false
		}
		end = v + e + 1
	case bytes.HasPrefix(data[v:], []byte("null")):
		end = v + 4
	default:
		return 0, 0, 0, 0, false
	}
	from, to = at, end
	if data[before] == ',' {
		from = before // the comma before, and the space after it
	} else {
		// The first member: the comma after it goes, with the space
		// that follows.
		for to < len(data) && isJSONSpace(data[to]) {
			to++
		}
		if to < len(data) && data[to] == ',' {
			to++
			for to < len(data) && isJSONSpace(data[to]) {
				to++
			}
		}
	}
	return from, to, v, end, true
}

// isJSONSpace reports whether c is JSON whitespace.
func isJSONSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// cutRange removes data[from:to] in place.
func cutRange(data []byte, from, to int) []byte {
	n := copy(data[from:], data[to:])
	return data[:from+n]
}

// keepChunkText appends the text of a chat or completions chunk to c.text,
// bounded by migration.max_tokens x 16 bytes (past it, the text is let go
// of and no crossing to a fallback model is possible).
func (c *carry) keepChunkText(data []byte) {
	var v struct {
		Choices []struct {
			Text  *string `json:"text"`
			Delta struct {
				Content *string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if json.Unmarshal(data, &v) != nil || len(v.Choices) != 1 {
		c.keepText, c.text = false, nil
		return
	}
	t := v.Choices[0].Text
	if t == nil {
		t = v.Choices[0].Delta.Content
	}
	if t != nil {
		c.keep(*t)
	}
}

// keep appends t to the text kept for a crossing to a fallback model
// while the whole stays within migration.max_tokens x 16 bytes; past that
// the text is let go of and no longer kept, so that a later, shorter
// chunk cannot leave a hole in it.
func (c *carry) keep(t string) {
	if len(c.text)+len(t) > 16*c.cfg.MaxTokens {
		c.keepText, c.text = false, nil
		return
	}
	c.text = append(c.text, t...)
}

// crossable reports whether a break could be continued on another model
// (from the text the client got): chat, completions and Responses, not
// Messages, whose stream names its model only in message_start, which
// the client has, so nothing after the seam could say that another model
// finished the answer.
func (c *carry) crossable() bool {
	return c != nil && c.keepText && c.kind != migrateMessages && c.excluded == ""
}

// cross switches the carry to continue on the fallback model named model
// (its configured name): the next continuation leg tokenizes the prompt
// and the text on it, and the chunks (the Responses object) after the
// seam name it.
func (c *carry) cross(model string) {
	c.crossing = true
	c.model, _ = json.Marshal(model)
	if c.ra != nil {
		c.ra.SetModel(c.model) // a whole answer names the model that finished it
	}
}

// textPrompt reports whether a completions body's prompt is one string
// (the text a fallback model's tokenizer can read), not token ids.
func textPrompt(body []byte) bool {
	var b struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	return json.Unmarshal(body, &b) == nil && len(b.Prompt) > 0 && b.Prompt[0] == '"'
}

// continuable reports whether the request can still be continued.
func (c *carry) continuable() bool { return c != nil && c.excluded == "" }

// exclude marks the request as not continuable for why (the first reason
// stays) and lets go of its token ids.
func (c *carry) exclude(why string) {
	if c.excluded == "" {
		c.excluded = why
	}
	c.prompt, c.gen = nil, nil
}

// take reads one chunk of the first leg (data, as ch inspected it): it
// keeps the answer's id, created and model, the prompt and generated token
// ids, watches for what excludes a continuation, and returns the data to
// forward: without the token id fields the client did not ask for, cut
// from data in place (data itself when nothing was cut).
func (c *carry) take(data []byte, ch *oai.Chunk) []byte {
	content := ch.Content
	if c.id == nil && ch.ID != nil {
		c.head(data, ch)
	}
	if content && c.keepText && c.excluded == "" {
		c.keepChunkText(data)
	}
	if content && c.excluded == "" {
		// What the chunk's parse found (oai.Chunk): no byte search of
		// the event.
		switch {
		case ch.ToolCalls:
			c.exclude(exclTools)
		case ch.Reasoning:
			c.exclude(exclReasoning)
		}
	}
	// One scan finds both members' keys (tokenIDKeys). The prompt ids'
	// member is read and cut first, and the generated ids' read in what
	// is left, its key's position moved to match (tokenIDsAfterCut): what
	// its cut takes can depend on the first cut (the comma after an
	// object's first member).
	out := data
	p, t := tokenIDKeys(out)
	if from, to, v, end, ok := memberAt(out, p, len(promptIDsKey)); ok {
		if c.excluded == "" && !c.sawPrompt {
			if n := bytes.Count(out[v:end], []byte{','}) + 1; cap(c.prompt) < n {
				c.prompt = make([]int32, 0, n)
			}
			var good bool
			c.prompt, good = appendIDs(c.prompt[:0], out[v:end])
			c.sawPrompt, c.promptLen = good, len(c.prompt)
		}
		if !c.clientIDs {
			out = cutRange(out, from, to)
			t = tokenIDsAfterCut(out, t, from, to)
		}
	}
	if from, to, v, end, ok := memberAt(out, t, len(tokenIDsKey)); ok {
		if c.excluded == "" {
			if c.gen == nil {
				c.gen = make([]int32, 0, c.genCap)
			}
			n := len(c.gen)
			var good bool
			if c.gen, good = appendIDs(c.gen, out[v:end]); !good || (content && len(c.gen) == n) {
				c.exclude(exclNoTokenIDs)
			}
		}
		if !c.clientIDs {
			out = cutRange(out, from, to)
		}
	} else if content && c.excluded == "" {
		// Content without its ids: the generated ids are incomplete.
		c.exclude(exclNoTokenIDs)
	}
	if c.excluded == "" && c.held() > c.cfg.MaxTokens {
		c.exclude(exclMaxTokens)
	}
	return out
}

// mayResume reports whether a stream broken by failure kind k could be
// continued, as far as the request itself says (the planner also needs
// another engine): the relay then holds back the engine's own end.
func (c *carry) mayResume(k string) bool {
	if c == nil || !c.cfg.on(k) {
		return false
	}
	exclusion, outcome := c.verdict()
	return exclusion == "" && outcome == ""
}

// verdict is why a break cannot be continued now: the request's exclusion,
// or, when it has none, the continuation outcome migrationLimit or
// migrationNoEngine (others: another engine serves the model); both ""
// when it can be. plan.resume and the relay (an end the engine sends
// itself) decide and count with it.
func (c *carry) verdict() (exclusion, outcome string) {
	switch why := c.ready(); {
	case why != "":
		return why, ""
	case c.continued >= c.cfg.Limit:
		return "", migrationLimit
	case !c.others:
		return "", migrationNoEngine
	}
	return "", ""
}

// count records a break of kind that verdict says cannot be continued.
func (c *carry) count(ctx context.Context, m *telemetry.Metrics, kind, exclusion, outcome string) {
	switch {
	case exclusion != "":
		m.RecordMigrationExclusion(ctx, exclusion)
	case outcome != "":
		m.RecordMigration(ctx, kind, outcome)
	}
}

// head keeps the first chunk's id, created and model (ch is data's
// inspection), as raw JSON values in one allocation.
func (c *carry) head(data []byte, ch *oai.Chunk) {
	created := []byte("null")
	if at := bytes.Index(data, []byte(`"created":`)); at >= 0 {
		v := at + len(`"created":`)
		end := v
		for end < len(data) && (data[end] >= '0' && data[end] <= '9' || data[end] == ' ') {
			end++
		}
		if end > v {
			created = bytes.TrimSpace(data[v:end])
		}
	}
	buf := make([]byte, 0, len(ch.ID)+len(ch.Model)+len(created)+4)
	buf = append(append(append(buf, '"'), ch.ID...), '"')
	c.id = buf[:len(buf):len(buf)]
	buf = append(buf, created...)
	c.created = buf[len(c.id):len(buf):len(buf)]
	if ch.Model != nil {
		at := len(buf)
		buf = append(append(append(buf, '"'), ch.Model...), '"')
		c.model = buf[at:]
	}
}

// ready reports why the request cannot be continued now ("" when it can):
// its exclusion, or no prompt ids seen.
func (c *carry) ready() string {
	switch {
	case c.excluded != "":
		return c.excluded
	case c.kind == migrateMessages && c.id != nil, c.kind == migrateResponses && c.id != nil && c.itemID != nil:
		return "" // the ids come from /tokenize at the continuation
	case !c.sawPrompt || c.id == nil:
		return exclNoTokenIDs
	}
	return ""
}

// contChunk is the part of an engine's /v1/completions chunk a
// continuation reads.
type contChunk struct {
	Choices []struct {
		Text         json.RawMessage `json:"text"`
		FinishReason json.RawMessage `json:"finish_reason"`
		StopReason   json.RawMessage `json:"stop_reason"`
		TokenIDs     json.RawMessage `json:"token_ids"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// reshape turns one chunk of a continuation leg (an engine's
// /v1/completions chunk) into the client's framing: the first leg's id,
// created and model; a chat chunk's delta (never a role) or a completion
// chunk's text; the finish and stop reasons as the engine sent them; the
// token ids only for a client that asked for them; and, for the usage
// chunk, the whole answer's usage (the prompt once, every leg's
// completion tokens), or nothing when the client did not ask for usage.
// It keeps the generated ids for a further continuation. A chunk it cannot
// read is dropped (drop true).
func (c *carry) reshape(b []byte, data []byte) (out []byte, drop bool) {
	var cc contChunk
	if err := json.Unmarshal(data, &cc); err != nil {
		return b, true
	}
	if c.framed() {
		if len(cc.Choices) == 1 {
			var t string
			switch {
			case json.Unmarshal(cc.Choices[0].Text, &t) != nil:
			case len(c.text)+len(t) > 16*c.cfg.MaxTokens && c.kind != migrateResponses:
				// Past the bound: no further continuation, and the text
				// is let go of.
				c.exclude(exclMaxTokens)
				c.text = nil
			default:
				// For a further continuation, and for the done events
				// of a Responses answer, which repeat its whole text as
				// vLLM's do (past the bound it is kept for those: it is
				// the answer the client got, and the request is no
				// longer continued).
				c.text = append(c.text, t...)
				if len(c.text) > 16*c.cfg.MaxTokens {
					c.exclude(exclMaxTokens)
				}
			}
		}
		return c.reshapeFramed(b, &cc)
	}
	if cc.Usage != nil && len(cc.Choices) == 0 {
		if !c.usage {
			return b, true
		}
		p, gen := int64(c.promptLen), int64(c.legGen)+cc.Usage.CompletionTokens
		b = c.chunkHead(b)
		b = append(b, `"choices":[],"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, p, 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, p+gen, 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, gen, 10)
		return append(b, "}}"...), false
	}
	if len(cc.Choices) != 1 {
		return b, true
	}
	ch := cc.Choices[0]
	if c.keepText {
		var t string
		if json.Unmarshal(ch.Text, &t) == nil {
			c.keep(t) // for a continuation on a fallback model
		}
	}
	if c.excluded == "" && len(ch.TokenIDs) > 0 {
		var good bool
		if c.gen, good = appendIDs(c.gen, ch.TokenIDs); !good {
			c.exclude(exclNoTokenIDs)
		} else if c.held() > c.cfg.MaxTokens {
			c.exclude(exclMaxTokens)
		}
	}
	b = c.chunkHead(b)
	text := ch.Text
	if len(text) == 0 || string(text) == "null" {
		text = []byte(`""`)
	}
	if c.kind == migrateChat {
		b = append(b, `"choices":[{"index":0,"delta":`...)
		if string(text) == `""` {
			b = append(b, "{}"...)
		} else {
			b = append(append(append(b, `{"content":`...), text...), '}')
		}
		b = append(b, `,"logprobs":null,"finish_reason":`...)
	} else {
		b = append(append(append(b, `"choices":[{"index":0,"text":`...), text...), `,"logprobs":null,"finish_reason":`...)
	}
	b = appendRaw(b, ch.FinishReason)
	if len(ch.StopReason) > 0 && (c.kind == migrateCompletion || string(ch.FinishReason) != "null" && len(ch.FinishReason) > 0) {
		b = appendRaw(append(b, `,"stop_reason":`...), ch.StopReason)
	}
	if c.clientIDs && len(ch.TokenIDs) > 0 {
		b = append(append(b, `,"token_ids":`...), ch.TokenIDs...)
	}
	return append(b, "}]}"...), false
}

// appendRaw appends a raw JSON value, null when it is absent.
func appendRaw(b, v []byte) []byte {
	if len(v) == 0 {
		return append(b, "null"...)
	}
	return append(b, v...)
}

// chunkHead appends the start of a reshaped chunk: `{"id":..,"object":..,
// "created":..,"model":..,`.
func (c *carry) chunkHead(b []byte) []byte {
	b = append(append(b, `{"id":`...), c.id...)
	if c.kind == migrateChat {
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = appendRaw(b, c.created)
	b = appendRaw(append(b, `,"model":`...), c.model)
	return append(b, ',')
}

// vllmCompletionMaxTokens is the max_tokens of a vLLM /v1/completions
// request that sets none (CompletionRequest.max_tokens = 16,
// vllm/entrypoints/openai/protocol.py).
const vllmCompletionMaxTokens = 16

// continuedParams are the request members a continuation carries over to
// its /v1/completions request: the sampling parameters vLLM's
// CompletionRequest shares with ChatCompletionRequest
// (vllm/entrypoints/openai/protocol.py). max_tokens and min_tokens are
// reduced by what was generated; everything else (the messages, tools,
// response format, chat template options) is already in the prompt ids or
// excluded.
var continuedParams = []string{
	"temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
	"frequency_penalty", "presence_penalty", "repetition_penalty", "length_penalty",
	"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
	"include_stop_str_in_output", "bad_words", "logit_bias", "allowed_token_ids",
	"priority", "user", "vllm_xargs", "cache_salt",
}

// messagesParams are the Messages request members vLLM's /v1/messages
// passes on to sampling (vllm/entrypoints/anthropic/protocol.py): a
// continuation carries these only.
var messagesParams = []string{"temperature", "top_p", "top_k"}

// request builds the body of a continuation leg for model (the served
// model's name): the prompt and generated ids as one token prompt, a
// stream with usage and token ids, max_tokens (and min_tokens) reduced by
// what was generated, and the client's sampling parameters. done is true
// when the answer needs no more tokens (max_tokens already reached).
func (c *carry) request(model string, maxTokens int64) (body []byte, done bool) {
	k := int64(len(c.gen))
	var orig map[string]json.RawMessage
	_ = json.Unmarshal(c.body, &orig) // the parser checked it is an object
	b := make([]byte, 0, 256+8*c.held())
	mq, _ := json.Marshal(model)
	b = append(append(append(b, `{"model":`...), mq...), `,"prompt":[`...)
	n := 0
	for _, ids := range [][]int32{c.prompt, c.gen} {
		for _, id := range ids {
			if n > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(id), 10)
			n++
		}
	}
	b = append(b, `],"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true`...)
	if maxTokens == 0 && c.kind == migrateCompletion {
		// vLLM's CompletionRequest.max_tokens default.
		maxTokens = vllmCompletionMaxTokens
	}
	switch {
	case maxTokens > 0 && maxTokens-k <= 0:
		return nil, true
	case maxTokens > 0:
		b = strconv.AppendInt(append(b, `,"max_tokens":`...), maxTokens-k, 10)
	default:
		// A chat answer without a limit runs to the context's end: on
		// /v1/completions that is max_tokens null (its default is 16).
		b = append(b, `,"max_tokens":null`...)
	}
	if v, ok := orig["min_tokens"]; ok {
		if m, err := strconv.ParseInt(string(v), 10, 64); err == nil && m-k > 0 {
			b = strconv.AppendInt(append(b, `,"min_tokens":`...), m-k, 10)
		}
	}
	params := continuedParams
	switch c.kind {
	case migrateMessages:
		params = messagesParams
	case migrateResponses:
		params = responsesParams
	}
	for _, p := range params {
		if v, ok := orig[p]; ok {
			b = append(append(append(append(b, `,"`...), p...), `":`...), v...)
		}
	}
	return append(b, '}'), false
}
