package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
)

// simFleet starts n simulated engines serving model m and returns them with
// their engine configs.
func simFleet(t *testing.T, n int) ([]*enginesim.Engine, []fleet.EngineConfig) {
	t.Helper()
	var engines []*enginesim.Engine
	var cfgs []fleet.EngineConfig
	for i := range n {
		name := fmt.Sprintf("e%d", i)
		e, srv := sim(t, enginesim.Config{Name: name, Models: []string{"m"}})
		engines = append(engines, e)
		cfgs = append(cfgs, fleet.EngineConfig{Name: name, URL: srv.URL, Models: []string{"m"}})
	}
	return engines, cfgs
}

func policyFor(t *testing.T, name string, edit func(*routing.Config)) routing.Policy {
	t.Helper()
	c := routing.DefaultConfig()
	c.Policy = name
	if edit != nil {
		edit(&c)
	}
	p, err := routing.NewPolicy(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// servedBy sends body with the header pairs and returns the engine that
// answered.
func servedBy(t *testing.T, h *harness, body string, hdr ...string) string {
	t.Helper()
	resp := h.post("/v1/chat/completions", body, hdr...)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("X-Switchboard-Engine")
}

// TestSessionAffinityKeys: the session header routes a session to one
// engine; the header named in routing.session_affinity.header is the one
// read; without it the body's user field is the key; with neither, the
// fallback spreads requests.
func TestSessionAffinityKeys(t *testing.T) {
	_, cfgs := simFleet(t, 4)
	h := newHarness(t, testConfig(cfgs...), withPolicy(policyFor(t, routing.SessionAffinityName, func(c *routing.Config) {
		c.SessionAffinity.Header = "X-Conversation"
		c.SessionAffinity.Fallback = routing.RoundRobinName
	})))
	body := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	withUser := `{"model":"m","max_tokens":1,"user":"%s","messages":[{"role":"user","content":"hi"}]}`

	homes := map[string]bool{}
	for s := range 16 {
		key := fmt.Sprintf("session-%d", s)
		first := servedBy(t, h, body, "x-conversation", key)
		homes[first] = true
		for range 3 {
			if got := servedBy(t, h, body, "X-Conversation", key); got != first {
				t.Fatalf("session %s: %s then %s", key, first, got)
			}
			// The same key in the body's user field lands on the same
			// engine, and the header wins over a different user.
			if got := servedBy(t, h, fmt.Sprintf(withUser, key)); got != first {
				t.Fatalf("user %s: %s, the header sent it to %s", key, got, first)
			}
			if got := servedBy(t, h, fmt.Sprintf(withUser, "someone-else"), "X-Conversation", key); got != first {
				t.Fatalf("session %s with another user: %s, want %s", key, got, first)
			}
		}
	}
	if len(homes) < 3 {
		t.Errorf("16 sessions used only engines %v of 4", homes)
	}
	// x-session-id is not this gateway's header: it is not a key, so the
	// round-robin fallback takes turns.
	seen := map[string]bool{}
	for range 4 {
		seen[servedBy(t, h, body, "x-session-id", "fixed")] = true
	}
	if len(seen) != 4 {
		t.Errorf("no session key: engines %v, want all 4 in turn", seen)
	}
	h.waitIdle()
}

// conversation returns the body of turn k (1-based) of a chat with a long
// shared system prompt: every turn repeats the earlier ones.
func conversation(id string, k int) string {
	return conversationWith(strings.Repeat("You are a careful assistant. ", 40), id, k)
}

// conversationWith is conversation with the given system prompt.
func conversationWith(system, id string, k int) string {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i := 1; i <= k; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("%s question %d: %s", id, i, strings.Repeat("more words ", 20))})
		if i < k {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d", i)})
		}
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": msgs})
	return string(b)
}

// TestPrefixRetryForgetsFailedEngine: an attempt that fails before the
// engine answers (429 here, retried on the other engine) is forgotten by
// the prefix policies, so the conversation's next turns go straight to the
// engine that computed its prefix instead of back to the failing one half
// of the time.
func TestPrefixRetryForgetsFailedEngine(t *testing.T) {
	for _, policy := range []string{routing.PrefixAwareName, routing.ScorerName} {
		t.Run(policy, func(t *testing.T) {
			bad, badSrv := sim(t, enginesim.Config{Name: "bad", Models: []string{"m"}, Fault: "status=429"})
			_, goodSrv := sim(t, enginesim.Config{Name: "good", Models: []string{"m"}})
			cfg := testConfig(fleet.EngineConfig{Name: "bad", URL: badSrv.URL, Models: []string{"m"}},
				fleet.EngineConfig{Name: "good", URL: goodSrv.URL, Models: []string{"m"}})
			h := newHarness(t, cfg, withPolicy(policyFor(t, policy, nil)))
			// A system prompt of its own per conversation: no shared
			// prefix draws a first turn to either engine.
			turn := func(c, k int) string {
				return conversationWith(fmt.Sprintf("conversation %d: %s", c, strings.Repeat("a distinct system prompt ", 20)), fmt.Sprint("conv-", c), k)
			}
			const conversations = 20
			for c := range conversations {
				if got := servedBy(t, h, turn(c, 1)); got != "good" { // tried bad first half of the time
					t.Fatalf("conversation %d turn 1 served by %s", c, got)
				}
				before := bad.Stats().Received
				for k := 2; k <= 3; k++ {
					if got := servedBy(t, h, turn(c, k)); got != "good" {
						t.Fatalf("conversation %d turn %d served by %s", c, k, got)
					}
				}
				if n := bad.Stats().Received - before; n != 0 {
					t.Errorf("conversation %d: turns 2-3 tried the failing engine %d times, want 0", c, n)
				}
			}
			// The case was exercised: some first turns went to bad first
			// (each does with probability 1/2).
			if bad.Stats().Received == 0 {
				t.Fatalf("no first turn of %d tried the failing engine", conversations)
			}
			h.waitIdle()
		})
	}
}

// TestPrefixPoliciesKeepConversations: prefix-aware and scorer send every
// turn of a conversation to the engine holding its prefix (the gateway
// hashes the prompt blocks only for them), and the engines' prefix caches
// hit far more than under round-robin.
func TestPrefixPoliciesKeepConversations(t *testing.T) {
	hitRate := func(t *testing.T, policy string) float64 {
		engines, cfgs := simFleet(t, 4)
		h := newHarness(t, testConfig(cfgs...), withPolicy(policyFor(t, policy, nil)))
		for c := range 8 {
			id := fmt.Sprintf("conv-%d", c)
			first := servedBy(t, h, conversation(id, 1))
			for k := 2; k <= 5; k++ {
				got := servedBy(t, h, conversation(id, k))
				if policy != routing.RoundRobinName && got != first {
					t.Fatalf("%s: %s turn %d went to %s, turn 1 to %s", policy, id, k, got, first)
				}
			}
		}
		h.waitIdle()
		var hits, queries int64
		for _, e := range engines {
			st := e.Stats()
			hits += st.PrefixCacheHits
			queries += st.PrefixCacheQueries
		}
		return float64(hits) / float64(queries)
	}
	rr := hitRate(t, routing.RoundRobinName)
	for _, p := range []string{routing.PrefixAwareName, routing.ScorerName} {
		got := hitRate(t, p)
		t.Logf("%s: prefix cache hit rate %.3f, round-robin %.3f", p, got, rr)
		// Round-robin recomputes every earlier turn three times in four;
		// these recompute only each turn's new message: under half the
		// prompt tokens missed.
		if miss, rrMiss := 1-got, 1-rr; miss > 0.5*rrMiss {
			t.Errorf("%s: prefix cache missed %.3f of prompt tokens, round-robin %.3f", p, miss, rrMiss)
		}
	}
}
