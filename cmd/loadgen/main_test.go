package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// recorded is one request as the server received it.
type recorded struct {
	header http.Header
	body   chatRequest
}

// recorder wraps a handler and keeps every chat request it receives.
type recorder struct {
	next http.Handler
	// got, when non-nil, receives a value as each request arrives.
	got chan struct{}

	mu   sync.Mutex
	reqs []recorded
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var cr chatRequest
	if err := json.Unmarshal(body, &cr); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, recorded{header: r.Header.Clone(), body: cr})
	rec.mu.Unlock()
	if rec.got != nil {
		rec.got <- struct{}{}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	rec.next.ServeHTTP(w, r)
}

func (rec *recorder) requests() []recorded {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]recorded(nil), rec.reqs...)
}

// newSim returns a fast simulated engine serving model "m".
func newSim(t *testing.T) http.Handler {
	t.Helper()
	e, err := enginesim.New(enginesim.Config{Models: []string{"m"}, TTFT: time.Millisecond, ITL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return e.Handler()
}

// serve serves h, closed at test cleanup.
func serve(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// load runs a load described by command-line args against url and returns
// the results and the report.
func load(t *testing.T, ctx context.Context, url string, args ...string) ([]*Result, *Report) {
	t.Helper()
	cfg, err := parseFlags(append([]string{"--url", url, "--model", "m"}, args...), io.Discard)
	if err != nil {
		t.Fatalf("parseFlags(%q): %v", args, err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	r := NewRunner(cfg, newWorkload(cfg), NewClient(cfg, &http.Client{Transport: tr}))
	results, window := r.Run(ctx)
	return results, Aggregate(cfg, results, window, r.Warmup())
}

func TestFixedClosedLoop(t *testing.T) {
	srv := serve(t, newSim(t))
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"stream", []string{"--stream"}},
		{"non-stream", nil},
		{"stream split across reads", []string{"--stream", "--fault", "trickle=0s"}},
		{"stream with keep-alives and reasoning", []string{"--stream", "--fault", "keepalive,reasoning=2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n, maxTokens = 12, 5
			args := append([]string{"--requests", "12", "--concurrency", "3", "--max-tokens", "5"}, tc.args...)
			results, rep := load(t, context.Background(), srv.URL, args...)
			if len(results) != n {
				t.Fatalf("got %d results, want %d", len(results), n)
			}
			stream := len(tc.args) > 0
			for i, res := range results {
				if !res.OK() {
					t.Fatalf("result %d failed: %s %v", i, res.Class, res.Err)
				}
				if res.OutputTokens != maxTokens {
					t.Errorf("result %d: %d output tokens, want %d", i, res.OutputTokens, maxTokens)
				}
				if stream && (!res.HasTTFT || len(res.ITL) != maxTokens-1) {
					t.Errorf("result %d: HasTTFT %t, %d ITL samples, want true, %d", i, res.HasTTFT, len(res.ITL), maxTokens-1)
				}
				if !stream && (res.HasTTFT || len(res.ITL) != 0) {
					t.Errorf("result %d: non-stream has TTFT or ITL", i)
				}
			}
			if rep.Succeeded != n || rep.Failed != 0 || rep.OutputTokens != n*maxTokens || rep.EndToEnd.Count != n {
				t.Errorf("report: %+v", rep)
			}
			if stream && (rep.TTFT.Count != n || rep.ITL.Count != n*(maxTokens-1)) {
				t.Errorf("report TTFT count %d, ITL count %d", rep.TTFT.Count, rep.ITL.Count)
			}
		})
	}
}

// TestLongShare: --long-share mixes long prompts of their own, with
// --long-max-tokens, into the fixed workload, in a sequence the seed fixes,
// and the report gives each kind apart.
func TestLongShare(t *testing.T) {
	rec := &recorder{next: newSim(t)}
	srv := serve(t, rec)
	const n = 40
	results, rep := load(t, context.Background(), srv.URL, "--stream", "--requests", "40", "--concurrency", "4",
		"--prompt-words", "7", "--max-tokens", "3", "--long-share", "0.5", "--long-prompt-words", "50", "--long-max-tokens", "6",
		"--expect-canonical")
	reqs := rec.requests()
	if len(results) != n || len(reqs) != n {
		t.Fatalf("%d results, %d requests, want %d", len(results), len(reqs), n)
	}
	long, seen := 0, map[string]bool{}
	for i, r := range reqs {
		content := r.body.Messages[0].Content
		words := strings.Fields(content)
		switch {
		case strings.HasPrefix(content, "Long request "):
			long++
			if len(words) != 53 || r.body.MaxTokens != 6 || seen[strings.Join(words[:3], " ")] {
				t.Errorf("long request %d: %d words, max_tokens %d, label %q seen before: %t", i, len(words), r.body.MaxTokens, words[:3], seen[strings.Join(words[:3], " ")])
			}
			seen[strings.Join(words[:3], " ")] = true
		case len(words) != 7 || r.body.MaxTokens != 3:
			t.Errorf("short request %d: %d words, max_tokens %d", i, len(words), r.body.MaxTokens)
		}
	}
	if long == 0 || long == n {
		t.Fatalf("%d long requests of %d: not a mix", long, n)
	}
	if rep.Failed != 0 {
		t.Fatalf("failures: %v %v", rep.Errors, rep.ErrorSamples)
	}
	l, s := rep.Kinds[KindLong], rep.Kinds[KindShort]
	if len(rep.Kinds) != 2 || l == nil || s == nil {
		t.Fatalf("kinds: %+v", rep.Kinds)
	}
	if l.Requests != long || s.Requests != n-long || l.OutputTokens != 6*long || s.OutputTokens != 3*(n-long) ||
		l.TTFT.Count != long || l.ITL.Count != 5*long || s.ITL.Count != 2*(n-long) || rep.OutputTokens != l.OutputTokens+s.OutputTokens {
		t.Errorf("kinds: long %+v, short %+v (%d long)", l, s, long)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"long requests", "short itl", "long ttft"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	// The same seed draws the same kinds; without --long-share there are none.
	kinds := func(share float64) []string {
		f := NewFixed(7, 9)
		if share > 0 {
			f.Mix(share, 50, 0, 9)
		}
		var out []string
		for range 20 {
			req, err := f.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, req.Kind)
		}
		return out
	}
	if a, b := kinds(0.3), kinds(0.3); strings.Join(a, ",") != strings.Join(b, ",") {
		t.Errorf("kinds differ for one seed: %v, %v", a, b)
	}
	if k := kinds(0); strings.Join(k, "") != "" {
		t.Errorf("kinds without a mix: %v", k)
	}
}

func TestConversations(t *testing.T) {
	rec := &recorder{next: newSim(t)}
	srv := serve(t, rec)
	const turns, maxTokens = 3, 4
	results, rep := load(t, context.Background(), srv.URL, "--stream", "--workload", "conversations",
		"--conversations", "3", "--turns", "3", "--system-prompts", "2", "--system-prompt-words", "50",
		"--prompt-words", "7", "--requests", "14", "--concurrency", "4", "--max-tokens", "4",
		"--session-header", "x-conv", "--stagger=false")
	if len(results) != 14 || rep.Failed != 0 {
		t.Fatalf("%d results, %d failed, want 14, 0", len(results), rep.Failed)
	}
	reqs := rec.requests()
	if len(reqs) != 14 {
		t.Fatalf("server got %d requests, want 14", len(reqs))
	}
	var reply strings.Builder
	for i := range maxTokens {
		reply.WriteString(enginesim.ContentToken(i))
	}
	sessions := map[string][]chatRequest{}
	systems := map[string]bool{}
	for _, r := range reqs {
		id := r.header.Get("x-conv")
		if id == "" {
			t.Fatal("request without the session header")
		}
		sessions[id] = append(sessions[id], r.body)
	}
	for id, bodies := range sessions {
		if len(bodies) > turns {
			t.Errorf("%s: %d turns, want at most %d", id, len(bodies), turns)
		}
		for i, b := range bodies {
			if len(b.Messages) != 2+2*i {
				t.Fatalf("%s turn %d: %d messages, want %d", id, i, len(b.Messages), 2+2*i)
			}
			if b.Messages[0].Role != "system" || len(strings.Fields(b.Messages[0].Content)) < 50 {
				t.Errorf("%s turn %d: first message %q is not a long system prompt", id, i, b.Messages[0].Role)
			}
			systems[b.Messages[0].Content] = true
			if last := b.Messages[len(b.Messages)-1]; last.Role != "user" || !strings.Contains(last.Content, id) {
				t.Errorf("%s turn %d: last message %+v, want this conversation's user turn", id, i, last)
			}
			if i == 0 {
				continue
			}
			prev := bodies[i-1].Messages
			want := append(append([]Message(nil), prev...), Message{Role: "assistant", Content: reply.String()})
			if !equalMessages(b.Messages[:len(want)], want) {
				t.Errorf("%s turn %d does not extend turn %d with the assistant reply:\n%+v", id, i, i-1, b.Messages)
			}
		}
	}
	// 14 turns over conversations of at most 3 turns: at least 5 ids.
	if len(sessions) < 5 {
		t.Errorf("%d conversations, want at least 5", len(sessions))
	}
	if len(systems) != 2 {
		t.Errorf("%d distinct system prompts, want 2 shared ones", len(systems))
	}
}

// TestConversationsStaggered: staggered conversations start at turns spread
// evenly over the conversation (each start in 1..turns, the counts per start
// within one of each other, in order of conversation number), with the
// earlier turns an unstaggered conversation would have sent and the same
// made-up replies every time, and are replaced at their usual last turn by
// fresh conversations.
func TestConversationsStaggered(t *testing.T) {
	for _, tc := range []struct{ conversations, turns int }{
		{8, 4}, {64, 16}, {3, 16}, {5, 4}, {1, 1}, {6, 1},
	} {
		t.Run(fmt.Sprintf("%dx%d", tc.conversations, tc.turns), func(t *testing.T) {
			testStaggered(t, tc.conversations, tc.turns)
		})
	}
}

func testStaggered(t *testing.T, conversations, turns int) {
	const replyWords = 3
	cfg := &Config{SystemPrompts: 2, SystemPromptWords: 10, Conversations: conversations, Turns: turns,
		PromptWords: 6, MaxTokens: replyWords, SessionHeader: "x-session-id", Seed: 3}
	fresh := NewConversations(cfg)
	cfg.Stagger = true
	staggered, again := NewConversations(cfg), NewConversations(cfg)
	ctx := context.Background()
	next := func(w *Conversations) *Request {
		t.Helper()
		req, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return req
	}

	// What each fresh conversation sends, turn by turn, answered with "ok".
	sent := map[string][][]Message{}
	for range conversations * turns {
		req := next(fresh)
		id := req.Header.Get("x-session-id")
		sent[id] = append(sent[id], req.Messages)
		fresh.Complete(req, &Result{text: "ok"})
	}

	starts := map[int]int{}      // first conversations by their earlier turns
	requests := map[string]int{} // requests by conversation
	first := map[string]int{}    // earlier turns of each conversation's first request
	prevStart := 0
	for range 2 * conversations * turns {
		req := next(staggered)
		id := req.Header.Get("x-session-id")
		requests[id]++
		if requests[id] > 1 {
			if want := first[id] + requests[id] - 1; (len(req.Messages)-2)/2 != want {
				t.Errorf("%s request %d: %d earlier turns, want %d", id, requests[id], (len(req.Messages)-2)/2, want)
			}
			staggered.Complete(req, &Result{text: "ok"})
			continue
		}
		var n int
		if _, err := fmt.Sscanf(id, "conv-%d", &n); err != nil {
			t.Fatalf("session id %q", id)
		}
		start := (len(req.Messages) - 2) / 2
		first[id] = start
		staggered.Complete(req, &Result{text: "ok"})
		if n >= conversations { // a replacement: fresh, at turn 1
			if start != 0 {
				t.Errorf("%s, a replacement, starts at turn %d, want 1", id, start+1)
			}
			continue
		}
		starts[start]++
		if start < 0 || start >= turns || start < prevStart {
			t.Errorf("%s starts at turn %d: want a turn in 1..%d, not before conv-%d's %d", id, start+1, turns, n-1, prevStart+1)
		}
		prevStart = start
		want := sent[id][start]
		if len(req.Messages) != len(want) {
			t.Fatalf("%s: %d messages, want %d", id, len(req.Messages), len(want))
		}
		// The same made-up history every time (texts from the seed).
		replay := next(again)
		if !equalMessages(replay.Messages, req.Messages) {
			t.Errorf("%s: a second staggered workload sends another history:\n%+v\n%+v", id, replay.Messages, req.Messages)
		}
		for i, m := range req.Messages {
			if m.Role != want[i].Role {
				t.Errorf("%s message %d: role %q, want %q", id, i, m.Role, want[i].Role)
			}
			if m.Role != "assistant" && m.Content != want[i].Content {
				t.Errorf("%s message %d: %q, want %q", id, i, m.Content, want[i].Content)
			}
			if got := strings.Fields(m.Content); m.Role == "assistant" && (len(got) != replyWords || m.Content == req.Messages[2].Content && i != 2) {
				t.Errorf("%s message %d: made-up reply %q, want %d words differing from the first reply", id, i, m.Content, replyWords)
			}
		}
	}
	// Evenly spread: every start turn has the same number of conversations,
	// give or take one, and as many turns are used as there can be.
	lo, hi := conversations, 0
	for start := range min(turns, conversations) {
		lo, hi = min(lo, starts[start]), max(hi, starts[start])
	}
	if hi-lo > 1 || len(starts) != min(turns, conversations) {
		t.Errorf("conversations by start turn - 1: %v, want %d turns used, within one of each other", starts, min(turns, conversations))
	}
	// A conversation is replaced after its last turn, wherever it started.
	for n := range conversations {
		id := fmt.Sprintf("conv-%d", n)
		if got, want := requests[id], turns-first[id]; got != want {
			t.Errorf("%s: %d requests, want %d (turns %d to %d)", id, got, want, first[id]+1, turns)
		}
	}
}

func TestStaggerDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--requests", "1"}, true},
		{[]string{"--requests", "1", "--stagger=false"}, false},
	} {
		cfg, err := parseFlags(tc.args, io.Discard)
		if err != nil || cfg.Stagger != tc.want {
			t.Errorf("parseFlags(%q): stagger %v, %v; want %v", tc.args, cfg != nil && cfg.Stagger, err, tc.want)
		}
	}
}

func equalMessages(a, b []Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// scripted serves a fixed SSE body for every request.
func scripted(body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, body)
	})
}

func TestErrorClasses(t *testing.T) {
	sim := serve(t, newSim(t))
	errorEvent := serve(t, scripted("data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"+
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"+
		"data: {\"error\":{\"message\":\"engine died\",\"type\":\"internal_error\",\"code\":500}}\n\n"+
		"data: [DONE]\n\n"))
	closed := struct{ URL string }{testutil.RefusedURL}
	for _, tc := range []struct {
		name   string
		url    string
		args   []string
		class  string
		status int
	}{
		{"status 500", sim.URL, []string{"--fault", "status=500"}, ClassHTTP5xx, 500},
		{"status 503 streaming", sim.URL, []string{"--stream", "--fault", "status=503,error-body=html"}, ClassHTTP5xx, 503},
		{"status 429", sim.URL, []string{"--stream", "--fault", "status=429"}, ClassHTTP4xx, 429},
		{"unknown model", sim.URL, []string{"--model", "nope"}, ClassHTTP4xx, 404},
		{"mid-stream close", sim.URL, []string{"--stream", "--fault", "close-after=2"}, ClassStreamNoDone, 200},
		{"stream without done", sim.URL, []string{"--stream", "--fault", "truncate"}, ClassStreamNoDone, 200},
		{"error event", errorEvent.URL, []string{"--stream"}, ClassStreamErrorEvent, 200},
		{"timeout before headers", sim.URL, []string{"--stream", "--timeout", "20ms", "--fault", "stall-before-headers"}, ClassTimeout, 0},
		{"timeout mid-stream", sim.URL, []string{"--stream", "--timeout", "20ms", "--fault", "stall-after=1"}, ClassTimeout, 200},
		{"connect", closed.URL, nil, ClassConnect, 0},
		{"closed before headers", sim.URL, []string{"--fault", "close-before-headers"}, ClassOther, 0},
		{"truncated body", sim.URL, []string{"--fault", "truncate"}, ClassOther, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--requests", "3", "--concurrency", "2", "--max-tokens", "4"}, tc.args...)
			results, rep := load(t, context.Background(), tc.url, args...)
			if len(results) != 3 {
				t.Fatalf("got %d results, want 3", len(results))
			}
			for _, res := range results {
				if res.Class != tc.class || res.Status != tc.status || res.Err == nil {
					t.Errorf("class %q status %d err %v, want %q %d", res.Class, res.Status, res.Err, tc.class, tc.status)
				}
			}
			if rep.Failed != 3 || rep.Errors[tc.class] != 3 || rep.ErrorSamples[tc.class] == "" {
				t.Errorf("report failed %d, errors %v, samples %v", rep.Failed, rep.Errors, rep.ErrorSamples)
			}
			if tc.class == ClassHTTP4xx || tc.class == ClassHTTP5xx {
				if got := rep.Statuses[strconv.Itoa(tc.status)]; got != 3 {
					t.Errorf("statuses %v, want 3 x %d", rep.Statuses, tc.status)
				}
			}
		})
	}
}

// TestExpectCanonical: with --expect-canonical the simulator's whole answer
// succeeds, streamed or not, and an answer that ends cleanly but is short,
// has a token wrong or no finish_reason is a wrong_answer.
func TestExpectCanonical(t *testing.T) {
	sim := serve(t, newSim(t))
	chunk := func(delta, finish string) string {
		return fmt.Sprintf("data: {\"choices\":[{\"delta\":%s,\"finish_reason\":%s}]}\n\n", delta, finish)
	}
	role := chunk(`{"role":"assistant","content":""}`, "null")
	tok := func(s string) string { return chunk(fmt.Sprintf("{\"content\":%q}", s), "null") }
	for _, tc := range []struct {
		name  string
		url   string
		args  []string
		class string
	}{
		{"simulator stream", sim.URL, []string{"--stream"}, ""},
		{"simulator body", sim.URL, nil, ""},
		{"aborted after 2 tokens", serve(t, scripted(role+tok("tok0 ")+tok("tok1 ")+chunk("{}", `"abort"`)+"data: [DONE]\n\n")).URL, []string{"--stream"}, ClassWrongAnswer},
		{"a token lost", serve(t, scripted(role+tok("tok0 ")+tok("tok2 ")+tok("tok3 ")+chunk("{}", `"length"`)+"data: [DONE]\n\n")).URL, []string{"--stream"}, ClassWrongAnswer},
		{"no finish_reason", serve(t, scripted(role+tok("tok0 ")+tok("tok1 ")+tok("tok2 ")+"data: [DONE]\n\n")).URL, []string{"--stream"}, ClassWrongAnswer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--requests", "2", "--max-tokens", "3", "--expect-canonical", "--max-error-rate", "1"}, tc.args...)
			results, _ := load(t, context.Background(), tc.url, args...)
			for _, res := range results {
				if res.Class != tc.class {
					t.Errorf("class %q (%v), want %q", res.Class, res.Err, tc.class)
				}
			}
		})
	}
}
