package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`    // "system", "user" or "assistant"
	Content string `json:"content"` // the message text
}

// Request is one request a Workload wants sent.
type Request struct {
	// Messages is the chat history to send.
	Messages []Message
	// Header holds extra request headers (the session header); may be nil.
	Header http.Header
	// Kind names the request's class in a mixed workload ("long" or
	// "short"), reported apart; "" outside one.
	Kind string
	// MaxTokens, when > 0, replaces Config.MaxTokens for this request.
	MaxTokens int

	conv *conversation // the conversation the request belongs to, if any
}

// Workload produces the requests of a run. Implementations must be safe for
// concurrent use.
type Workload interface {
	// Next returns the next request to send. It may block until one is
	// ready (a conversation waits for its previous turn); it returns
	// ctx.Err() when ctx ends first.
	Next(ctx context.Context) (*Request, error)
	// Complete reports the result of a request returned by Next. It is
	// called exactly once per such request, after the request ends.
	Complete(req *Request, res *Result)
}

var (
	_ Workload = (*Fixed)(nil)
	_ Workload = (*Conversations)(nil)
)

// newWorkload builds the workload that c names.
func newWorkload(c *Config) Workload {
	if c.Workload == ConversationsName {
		return NewConversations(c)
	}
	f := NewFixed(c.PromptWords, c.Seed)
	if c.LongShare > 0 {
		f.Mix(c.LongShare, c.LongPromptWords, c.LongMaxTokens, c.Seed)
	}
	return f
}

// Request kinds of a mixed Fixed workload.
const (
	KindShort = "short"
	KindLong  = "long"
)

// Fixed sends the same single-message prompt every time, or, mixed (see
// Mix), that prompt or a long one of its own.
type Fixed struct {
	messages []Message

	// Mixed only: a request is long with probability longShare, drawn
	// from rng; n numbers the long requests.
	longShare     float64
	longText      string
	longMaxTokens int
	mu            sync.Mutex
	rng           *rand.Rand
	n             int
}

// NewFixed returns a Fixed workload whose prompt has words words.
func NewFixed(words int, seed uint64) *Fixed {
	return &Fixed{messages: []Message{{Role: "user", Content: text(words, seed, 0)}}}
}

// longStream is the text stream of a mixed workload's long prompt (the fixed
// prompt is stream 0).
const longStream uint64 = 1 << 56

// Mix makes f a mix of long and short requests: each request is long with
// probability share (drawn from a source seeded with seed, so a run's
// sequence of kinds is the same every time), and then its prompt is
// "Long request N: " and words words, N counting the long requests from 1,
// so no two long prompts share a prefix block, and its max_tokens is
// maxTokens (0: Config.MaxTokens). The others are the fixed prompt (which a
// server's prefix cache keeps). Requests carry their kind, KindLong or
// KindShort, and the report gives each kind's statistics apart. Call it
// before the run.
func (f *Fixed) Mix(share float64, words, maxTokens int, seed uint64) {
	f.longShare, f.longMaxTokens = share, maxTokens
	f.longText = text(words, seed, longStream)
	f.rng = rand.New(rand.NewPCG(seed, longStream))
}

// Next returns the fixed prompt, or in a mix a long prompt; it never blocks.
func (f *Fixed) Next(context.Context) (*Request, error) {
	if f.rng == nil {
		return &Request{Messages: f.messages}, nil
	}
	f.mu.Lock()
	long := f.rng.Float64() < f.longShare
	if long {
		f.n++
	}
	n := f.n
	f.mu.Unlock()
	if !long {
		return &Request{Messages: f.messages, Kind: KindShort}, nil
	}
	msg := Message{Role: "user", Content: fmt.Sprintf("Long request %d: %s", n, f.longText)}
	return &Request{Messages: []Message{msg}, Kind: KindLong, MaxTokens: f.longMaxTokens}, nil
}

// Complete does nothing: the prompt does not depend on results.
func (f *Fixed) Complete(*Request, *Result) {}

// Conversations runs multi-turn chats. Each conversation starts with one of
// a few shared system prompts (so the server can reuse their prefix) and
// carries all its previous turns: a request sends the system prompt, every
// earlier user message with the assistant reply received for it, and one
// new user message. Each request has a session header whose value is the
// conversation id.
//
// A conversation has at most one request in flight, so at most
// conversations requests run at once whatever the concurrency or rate:
// Next waits for an idle conversation. After turns turns, or after a failed
// turn (like a user giving up), a conversation is replaced by a fresh one
// with a new id.
//
// Staggered, the first conversations start at turns spread evenly from 1 to
// turns (conversation n at turn n*turns/conversations + 1), each with a
// made-up history of the turns before (the user messages it would have
// sent, and replies of replyWords words), as in a service whose
// conversations are at every stage. Without it they all start at turn 1 and
// move in loose step: every prompt is short at first and long at the end,
// and a server's cache needs swing with them.
type Conversations struct {
	system     []string
	turns      int
	words      int
	replyWords int
	header     string
	seed       uint64
	idle       chan *conversation
	counter    chan int // a token holding the next conversation number
}

type conversation struct {
	id       string
	n        int // conversation number
	messages []Message
	turn     int // user turns sent and answered
}

// NewConversations returns the Conversations workload that c describes:
// c.SystemPrompts system prompts of c.SystemPromptWords words,
// c.Conversations conversations of c.Turns turns, user messages of
// c.PromptWords words, the session header c.SessionHeader, texts from
// c.Seed, and, when c.Stagger is set, first conversations at staggered turns
// with replies of c.MaxTokens words.
func NewConversations(c *Config) *Conversations {
	w := &Conversations{
		turns:      c.Turns,
		words:      c.PromptWords,
		replyWords: c.MaxTokens,
		header:     c.SessionHeader,
		seed:       c.Seed,
		idle:       make(chan *conversation, c.Conversations),
		counter:    make(chan int, 1),
	}
	for k := range c.SystemPrompts {
		w.system = append(w.system, "System prompt "+fmt.Sprint(k)+": "+text(c.SystemPromptWords, c.Seed, uint64(k)+1))
	}
	for n := range c.Conversations {
		conv := w.newConversation(n)
		if c.Stagger {
			w.age(conv, n*c.Turns/c.Conversations)
		}
		w.idle <- conv
	}
	w.counter <- c.Conversations
	return w
}

func (w *Conversations) newConversation(n int) *conversation {
	return &conversation{
		id:       fmt.Sprintf("conv-%d", n),
		n:        n,
		messages: []Message{{Role: "system", Content: w.system[n%len(w.system)]}},
	}
}

// The text streams of user messages and made-up replies, by conversation
// number × turns + turn; system prompts take 1..SystemPrompts. Unsigned, so
// the constants fit on 32-bit targets too.
const (
	userStream  uint64 = 1 << 32
	replyStream uint64 = 1 << 48
)

// userMessage is the user message of conversation c's next turn.
func (w *Conversations) userMessage(c *conversation) Message {
	return Message{Role: "user", Content: fmt.Sprintf("Turn %d of %s: %s", c.turn+1, c.id, text(w.words, w.seed, userStream+uint64(c.n*w.turns+c.turn)))}
}

// age gives a fresh conversation turns earlier turns: the user messages it
// would have sent, each answered by a made-up reply.
func (w *Conversations) age(c *conversation, turns int) {
	for range turns {
		reply := text(w.replyWords, w.seed, replyStream+uint64(c.n*w.turns+c.turn))
		c.messages = append(c.messages, w.userMessage(c), Message{Role: "assistant", Content: reply})
		c.turn++
	}
}

// Next takes an idle conversation and returns its next turn.
func (w *Conversations) Next(ctx context.Context) (*Request, error) {
	var c *conversation
	select {
	case c = <-w.idle:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	user := w.userMessage(c)
	// The request owns its slice: the conversation appends to its own
	// history only in Complete, after the request has been sent.
	msgs := make([]Message, len(c.messages), len(c.messages)+1)
	copy(msgs, c.messages)
	msgs = append(msgs, user)
	h := http.Header{}
	h.Set(w.header, c.id)
	return &Request{Messages: msgs, Header: h, conv: c}, nil
}

// Complete appends the turn and the assistant reply to the conversation and
// makes it idle again (replaced by a new conversation when it is over).
func (w *Conversations) Complete(req *Request, res *Result) {
	c := req.conv
	if c == nil {
		return
	}
	if res.OK() {
		c.messages = append(req.Messages, Message{Role: "assistant", Content: res.text})
		c.turn++
	}
	if !res.OK() || c.turn >= w.turns {
		n := <-w.counter
		w.counter <- n + 1
		c = w.newConversation(n)
	}
	w.idle <- c
}

// vocabulary is the word list of generated texts.
var vocabulary = strings.Fields(`the a of to and in is it that for on with as was at by
an be this from or are not but have had they you were their one all we can her has there
been if more when will would who so no model token cache prefix engine route request load
time first stream batch queue decode prefill gateway latency value system user reply`)

// text returns words deterministic pseudo-random words for (seed, stream).
func text(words int, seed, stream uint64) string {
	r := rand.New(rand.NewPCG(seed, stream))
	var b strings.Builder
	for i := range words {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
	}
	return b.String()
}

// chatRequest is the JSON body of a chat completion request.
type chatRequest struct {
	Model         string         `json:"model,omitempty"`
	Messages      []Message      `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

func encodeRequest(c *Config, req *Request) ([]byte, error) {
	body := chatRequest{Model: c.Model, Messages: req.Messages, MaxTokens: c.MaxTokens, Stream: c.Stream}
	if req.MaxTokens > 0 {
		body.MaxTokens = req.MaxTokens
	}
	if c.Stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return json.Marshal(body)
}
