package gateway

import (
	"bytes"
	"io"
	"strconv"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// outBody is the body sent to an engine: the client's bytes with at most
// two edits (the model an alias stands for, the usage option), as up to
// five slices of the original body and constants, so nothing is copied.
type outBody struct {
	parts [7][]byte // up to three edits
	n     int64
	// injected is set when the usage option was added for a client that
	// did not ask for usage: the usage chunk is then kept from it.
	injected bool
	// replays counts net/http's re-sends of the current leg's request
	// (rewind); send resets it for each leg.
	replays int
}

// reader returns a reader over the whole body.
func (b *outBody) reader() io.Reader {
	return &partsReader{parts: b.parts}
}

// maxFlatBody is the largest spliced body sendReader copies into one
// buffer.
const maxFlatBody = 64 << 10

// sendReader returns the body for the engine request as a *bytes.Reader
// when it is small or unedited: net/http then writes the request's headers
// and body with one write (for a reader it does not know to be in memory,
// it flushes the headers first: one more syscall per request). A body that
// is not edited is read in place; an edited one up to maxFlatBody is
// copied into one buffer; a larger one is read part by part.
func (b *outBody) sendReader() io.Reader {
	if b.n > maxFlatBody {
		only, ok := b.single()
		if !ok {
			return b.reader()
		}
		return bytes.NewReader(only)
	}
	return bytes.NewReader(b.flat())
}

// single returns b's only non-empty part (nil for an empty body); ok is
// false when b has several.
func (b *outBody) single() (only []byte, ok bool) {
	parts := 0
	for _, p := range b.parts {
		if len(p) > 0 {
			only = p
			parts++
		}
	}
	return only, parts <= 1
}

// flat returns b's bytes in one slice: its only part (not a copy) when it
// has one, else a new slice.
func (b *outBody) flat() []byte {
	if only, ok := b.single(); ok {
		return only
	}
	flat := make([]byte, 0, b.n)
	for _, p := range b.parts {
		flat = append(flat, p...)
	}
	return flat
}

// partsReader reads byte slices in order.
type partsReader struct {
	parts [7][]byte // up to three edits
	i     int
}

// Read copies the next bytes of the parts into out; io.EOF after the last.
func (p *partsReader) Read(out []byte) (int, error) {
	n := 0
	for n < len(out) && p.i < len(p.parts) {
		c := copy(out[n:], p.parts[p.i])
		p.parts[p.i] = p.parts[p.i][c:]
		n += c
		if len(p.parts[p.i]) == 0 {
			p.i++
		}
	}
	if n == 0 && p.i >= len(p.parts) {
		return 0, io.EOF
	}
	return n, nil
}

// edit replaces body[at:end] with ins.
type edit struct {
	at, end int
	ins     []byte
}

// splice builds the outBody of body with edits, which are in body order
// and do not overlap.
func splice(body []byte, edits ...edit) outBody {
	var out outBody
	prev, k := 0, 0
	for _, e := range edits {
		out.parts[k], out.parts[k+1] = body[prev:e.at], e.ins
		k += 2
		prev = e.end
	}
	out.parts[k] = body[prev:]
	for _, p := range out.parts {
		out.n += int64(len(p))
	}
	return out
}

// Usage options inserted into a streamed request body whose client did not
// ask for usage (stream_options absent, null, {} or include_usage
// false/null).
var (
	usageOption       = []byte(`,"stream_options":{"include_usage":true}}`)               // replaces the body's closing brace
	streamUsageOption = []byte(`,"stream":true,"stream_options":{"include_usage":true}}`) // the same, for a body without stream
	jsonTrue          = []byte(`true`)
	usageMember       = []byte(`,"include_usage":true`) // added last in a non-empty stream_options
	usageMemberAlone  = []byte(`"include_usage":true`)  // into an empty one
	// tokenIDsOption asks vLLM for the prompt and generated token ids
	// (return_token_ids), replacing the body's closing brace.
	tokenIDsOption     = []byte(`,"return_token_ids":true}`)
	tokenIDsWithUsage  = []byte(`,"return_token_ids":true,"stream_options":{"include_usage":true}}`)
	tokenIDsWithStream = []byte(`,"return_token_ids":true,"stream":true,"stream_options":{"include_usage":true}}`)
	// streamOption asks for a stream, replacing the body's closing brace:
	// for vLLM's /v1/messages, which takes no stream_options and streams
	// its usage anyway (vllm/entrypoints/anthropic/serving.py
	// _handle_streaming_options).
	streamOption = []byte(`,"stream":true}`)
)

// tokenIDsOptionWith returns the closing edit ins with return_token_ids
// added (ins is one of the closing options).
func tokenIDsOptionWith(ins []byte) []byte {
	switch {
	case bytes.Equal(ins, usageOption):
		return tokenIDsWithUsage
	case bytes.Equal(ins, streamUsageOption):
		return tokenIDsWithStream
	}
	return tokenIDsOption
}

// outgoing returns the engine body of a request: the client's bytes, with
// the model replaced when the client named an alias, and, with
// Config.InjectUsage on a route that allows it, a stream whose client did
// not ask for usage (and did not set continuous_usage_stats) given
// stream_options.include_usage=true: added as the last member of its
// stream_options object (the last duplicate key wins in every JSON parser
// engines use, so a false include_usage before it is overridden and other
// options such as continuous_usage_stats stay), or as a new stream_options
// in place of the body's closing brace when it has none (or null).
//
// With tokenIDs set (a generation that may be continued, migration.go),
// vLLM's return_token_ids is asked for too, as the body's last member.
func (s *Server) outgoing(op *operation, in *inbound, tokenIDs bool) outBody {
	body := in.body
	var edits [3]edit
	n := 0
	if in.rename != nil {
		switch op.body {
		case bodyJSON:
			if in.req.ModelEnd > 0 {
				edits[n] = edit{in.req.ModelStart, in.req.ModelEnd, in.rename}
				n++
			}
		case bodyForm:
			if in.form.ModelEnd > 0 {
				edits[n] = edit{in.form.ModelStart, in.form.ModelEnd, in.rename}
				n++
			}
		}
	}
	req := &in.req
	// closing is the edit that replaces the body's closing brace (the
	// parser checked the object) with ins.
	closing := func(ins []byte) edit {
		end := len(body)
		for end > 0 && (body[end-1] == ' ' || body[end-1] == '\n' || body[end-1] == '\r' || body[end-1] == '\t') {
			end--
		}
		return edit{end - 1, len(body), ins}
	}
	// With vLLM's continuous_usage_stats every chunk would carry usage the
	// client did not ask for, and only usage-only chunks can be kept from
	// it: such a stream is left as the client sent it.
	inject := in.set.cfg.InjectUsage && op.injectUsage && op.body == bodyJSON && req.Stream && !req.IncludeUsage && !req.ContinuousUsage
	switch {
	case in.observe && op.framing != frameOpenAI:
		// A non-streaming Messages or Responses request asked for as a
		// stream (their streams carry usage without asking).
		if req.StreamEnd > 0 {
			edits[n] = edit{req.StreamStart, req.StreamEnd, jsonTrue}
		} else {
			edits[n] = closing(streamOption)
		}
		n++
	case in.observe:
		// A non-streaming request asked for as a stream with usage; it
		// has no stream_options (in.observe requires it).
		if req.StreamEnd > 0 {
			edits[n] = edit{req.StreamStart, req.StreamEnd, jsonTrue}
			n++
			edits[n] = closing(usageOption)
		} else {
			edits[n] = closing(streamUsageOption)
		}
		n++
	case inject:
		if req.HasStreamOptions {
			at := req.StreamOptionsEnd
			ins := usageMember
			if req.StreamOptionsEmpty {
				ins = usageMemberAlone
			}
			edits[n] = edit{at, at, ins}
		} else {
			edits[n] = closing(usageOption)
		}
		n++
	}
	if tokenIDs {
		// At the closing brace: after any return_token_ids of the
		// client's (the last duplicate key wins), and with the usage
		// option when that is added there too.
		if n > 0 && edits[n-1].end == len(body) {
			edits[n-1].ins = tokenIDsOptionWith(edits[n-1].ins)
		} else {
			edits[n] = closing(tokenIDsOption)
			n++
		}
	}
	if in.capOut > 0 {
		// The output cap a spend budget's reservation holds: a member
		// added last (after any max_tokens null or 0 of the client's: the
		// last duplicate key wins), with the other closing additions.
		// OpenAI's and Azure's chat take max_completion_tokens (their
		// reasoning models refuse max_tokens).
		name := `,"max_tokens":`
		switch {
		case op.name == "responses":
			name = `,"max_output_tokens":`
		case in.capCompletion && op.name == "chat":
			name = `,"max_completion_tokens":`
		}
		member := strconv.AppendInt([]byte(name), in.capOut, 10)
		if n > 0 && edits[n-1].end == len(body) {
			edits[n-1].ins = append(member, edits[n-1].ins...)
		} else {
			edits[n] = closing(append(member, '}'))
			n++
		}
	}
	// In body order (insertion sort of at most three).
	for i := 1; i < n; i++ {
		for j := i; j > 0 && edits[j].at < edits[j-1].at; j-- {
			edits[j], edits[j-1] = edits[j-1], edits[j]
		}
	}
	out := splice(body, edits[:n]...)
	out.injected = inject || in.observe
	return out
}

// jsonContentType is the Content-Type value of every engine request: the
// body has been checked to be a JSON object, whatever the client declared.
var jsonContentType = []string{"application/json"}

// engineOut returns the body of a leg on eng when it differs from the
// request's: the engine's own name for the model (EngineConfig.ModelMap;
// an Azure deployment), and for a provider never vLLM's return_token_ids
// (tokenIDs false) and the spend cap as max_completion_tokens on OpenAI's
// and Azure's chat. The usage option and the spend cap are as for any
// engine.
func (s *Server) engineOut(op *operation, in *inbound, eng *fleet.Engine, tokenIDs bool) outBody {
	saved, savedCap := in.rename, in.capCompletion
	if name, quoted, ok := eng.MapModel(in.target); ok {
		if op.body == bodyForm {
			in.rename = []byte(name)
		} else {
			in.rename = quoted
		}
	}
	k := eng.Provider()
	in.capCompletion = k == fleet.ProviderOpenAI || k == fleet.ProviderAzure
	out := s.outgoing(op, in, tokenIDs)
	in.rename, in.capCompletion = saved, savedCap
	return out
}
