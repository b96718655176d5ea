package gateway

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
	"github.com/switchboard-gw/switchboard/routing"
	"github.com/switchboard-gw/switchboard/telemetry"
)

// clientStream is what a streaming client got, read as the OpenAI clients
// read it.
type clientStream struct {
	ids      map[string]int // chunk ids seen, with their counts
	models   map[string]int
	created  map[int64]int
	roles    int    // chunks with a role
	text     string // content (chat) or text (completions), concatenated
	finishes []string
	usage    *struct{ Prompt, Completion, Total int64 }
	tokenIDs int      // chunks with token_ids or prompt_token_ids
	errors   []string // error events' messages
	done     bool     // [DONE] seen
	after    int      // events after [DONE]
}

// readClientStream reads an SSE body to its end.
func readClientStream(t *testing.T, resp *http.Response) clientStream {
	t.Helper()
	defer resp.Body.Close()
	cs := clientStream{ids: map[string]int{}, models: map[string]int{}, created: map[int64]int{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if cs.done {
			cs.after++
		}
		if data == "[DONE]" {
			cs.done = true
			continue
		}
		var ch struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Created int64  `json:"created"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
				TokenIDs     []int   `json:"token_ids"`
			} `json:"choices"`
			PromptTokenIDs []int `json:"prompt_token_ids"`
			Usage          *struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
				Total      int64 `json:"total_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("unreadable event %q: %v", data, err)
		}
		if ch.Error != nil {
			cs.errors = append(cs.errors, ch.Error.Message)
			continue
		}
		cs.ids[ch.ID]++
		cs.models[ch.Model]++
		cs.created[ch.Created]++
		if ch.PromptTokenIDs != nil || strings.Contains(data, "token_ids") {
			cs.tokenIDs++
		}
		for _, c := range ch.Choices {
			if c.Delta != nil {
				if c.Delta.Role != "" {
					cs.roles++
				}
				cs.text += c.Delta.Content
			}
			if c.Text != nil {
				cs.text += *c.Text
			}
			if c.FinishReason != nil {
				cs.finishes = append(cs.finishes, *c.FinishReason)
			}
		}
		if ch.Usage != nil {
			cs.usage = &struct{ Prompt, Completion, Total int64 }{ch.Usage.Prompt, ch.Usage.Completion, ch.Usage.Total}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return cs
}

// canonical is the simulator's whole answer of n content tokens.
func canonical(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(enginesim.ContentToken(i))
	}
	return b.String()
}

// migrations returns switchboard.request.migrations by "reason/outcome".
func (h *harness) migrations() map[string]int64 {
	h.t.Helper()
	out := map[string]int64{}
	m, ok := findMetric(h.collect(), telemetry.MigrationsName)
	if !ok {
		return out
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		r, _ := dp.Attributes.Value(telemetry.AttrMigrationReason)
		o, _ := dp.Attributes.Value(telemetry.AttrMigrationOutcome)
		out[r.AsString()+"/"+o.AsString()] += dp.Value
	}
	return out
}

// exclusions returns switchboard.request.migration_exclusions by exclusion.
func (h *harness) exclusions() map[string]int64 {
	h.t.Helper()
	out := map[string]int64{}
	m, ok := findMetric(h.collect(), telemetry.MigrationExclusionsName)
	if !ok {
		return out
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		v, _ := dp.Attributes.Value(telemetry.AttrMigrationExclusion)
		out[v.AsString()] += dp.Value
	}
	return out
}

// TestContinuationCompletesAnswer: a stream whose engine fails after its
// first tokens is continued on the other engine, and the client gets the
// whole canonical answer once, in one stream: one id, created and model,
// one role chunk, no token repeated or missing, one finish_reason, the
// whole answer's usage, no token ids it did not ask for, and both
// engines' slots released from decode.
func TestContinuationCompletesAnswer(t *testing.T) {
	const n = 8
	for _, tc := range []struct {
		name, fault, reason string
		tune                func(*Config)
	}{
		{"eof", "close-after=3", "engine_disconnect", nil},
		{"idle timeout", "stall-after=3", "idle_timeout", func(c *Config) { c.Timeouts.Idle = 100 * time.Millisecond }},
		{"eof before the first token", "close-after=0", "engine_disconnect", func(c *Config) { c.Retry.On = nil }},
		{"reset", "reset-after=3", "engine_disconnect", nil},
		{"error event", "error-after=3", "stream_error", nil},
		{"engine drained", "drain-after=3", "engine_abort", nil},
	} {
		routes := []string{"chat", "completions"}
		if tc.fault == "close-after=0" {
			routes = routes[:1] // a completions stream has sent nothing yet: a retry's business
		}
		for _, route := range routes {
			t.Run(tc.name+"/"+route, func(t *testing.T) {
				rh := newRetryHarness(t, tc.fault, "", tc.tune)
				path, body := "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a b c d"}],"max_tokens":`+strconv.Itoa(n)+`,"stream":true,"stream_options":{"include_usage":true}}`
				if route == "completions" {
					path, body = "/v1/completions", `{"model":"m","prompt":"a b c d","max_tokens":`+strconv.Itoa(n)+`,"stream":true,"stream_options":{"include_usage":true}}`
				}
				resp := rh.post(path, body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				cs := readClientStream(t, resp)
				if cs.text != canonical(n) {
					t.Errorf("answer %q, want %q", cs.text, canonical(n))
				}
				if len(cs.errors) != 0 || !cs.done || cs.after != 0 {
					t.Errorf("errors %v, done %v, events after [DONE] %d", cs.errors, cs.done, cs.after)
				}
				if len(cs.ids) != 1 || len(cs.models) != 1 || len(cs.created) != 1 || cs.models["m"] == 0 {
					t.Errorf("ids %v models %v created %v: want one of each", cs.ids, cs.models, cs.created)
				}
				if wantRoles := map[string]int{"chat": 1, "completions": 0}[route]; cs.roles != wantRoles {
					t.Errorf("%d role chunks, want %d", cs.roles, wantRoles)
				}
				if len(cs.finishes) != 1 || cs.finishes[0] != "length" {
					t.Errorf("finish reasons %v, want [length]", cs.finishes)
				}
				if cs.usage == nil || cs.usage.Prompt != 4 || cs.usage.Completion != n || cs.usage.Total != 4+n {
					t.Errorf("usage %+v, want prompt 4, completion %d, total %d", cs.usage, n, 4+n)
				}
				if cs.tokenIDs != 0 {
					t.Errorf("%d chunks carried token ids the client did not ask for", cs.tokenIDs)
				}
				rh.waitIdle()
				rel := rh.releases()
				if got := rel["e1"]; len(got) != 1 {
					t.Errorf("e1 released %v, want one release", got)
				}
				if got := rel["e2"]; len(got) != 1 || got[0] != routing.PhaseDecode {
					t.Errorf("e2 released %v, want one release from decode", got)
				}
				if got := rh.migrations(); got[tc.reason+"/rescued"] != 1 || len(got) != 1 {
					t.Errorf("migrations %v, want %s/rescued 1", got, tc.reason)
				}
				if got := rh.histCount(telemetry.TimeToFirstTokenName); got != 1 {
					t.Errorf("%d TTFT samples, want the client's one", got)
				}
				if got := rh.histCount(telemetry.MigrationGapName, attribute.String("engine", "e2")); got != 1 && tc.name != "eof before the first token" {
					t.Errorf("%d seam gap samples on e2, want 1", got)
				}
			})
		}
	}
}
