package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
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
		return NewConversations(c.SystemPrompts, c.SystemPromptWords, c.Conversations, c.Turns, c.PromptWords, c.SessionHeader, c.Seed)
	}
	return NewFixed(c.PromptWords, c.Seed)
}

// Fixed sends the same single-message prompt every time.
type Fixed struct {
	messages []Message
}

// NewFixed returns a Fixed workload whose prompt has words words.
func NewFixed(words int, seed uint64) *Fixed {
	return &Fixed{messages: []Message{{Role: "user", Content: text(words, seed, 0)}}}
}

// Next returns the fixed prompt; it never blocks.
func (f *Fixed) Next(context.Context) (*Request, error) {
	return &Request{Messages: f.messages}, nil
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
type Conversations struct {
	system  []string
	turns   int
	words   int
	header  string
	seed    uint64
	idle    chan *conversation
	counter chan int // a token holding the next conversation number
}

type conversation struct {
	id       string
	n        int // conversation number
	messages []Message
	turn     int // user turns sent and answered
}

// NewConversations returns a Conversations workload with systemPrompts
// system prompts of systemWords words, conversations conversations of turns
// turns, user messages of userWords words and the session header header.
func NewConversations(systemPrompts, systemWords, conversations, turns, userWords int, header string, seed uint64) *Conversations {
	w := &Conversations{
		turns:   turns,
		words:   userWords,
		header:  header,
		seed:    seed,
		idle:    make(chan *conversation, conversations),
		counter: make(chan int, 1),
	}
	for k := range systemPrompts {
		w.system = append(w.system, "System prompt "+fmt.Sprint(k)+": "+text(systemWords, seed, uint64(k)+1))
	}
	for n := range conversations {
		w.idle <- w.newConversation(n)
	}
	w.counter <- conversations
	return w
}

func (w *Conversations) newConversation(n int) *conversation {
	return &conversation{
		id:       fmt.Sprintf("conv-%d", n),
		n:        n,
		messages: []Message{{Role: "system", Content: w.system[n%len(w.system)]}},
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
	user := Message{Role: "user", Content: fmt.Sprintf("Turn %d of %s: %s", c.turn+1, c.id, text(w.words, w.seed, uint64(1<<32+c.n*w.turns+c.turn)))}
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
	if c.Stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	return json.Marshal(body)
}
