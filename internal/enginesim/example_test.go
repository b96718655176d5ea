package enginesim_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/switchboard-gw/switchboard/internal/enginesim"
)

func ExampleNew() {
	e, err := enginesim.New(enginesim.Config{Models: []string{"demo"}, TTFT: time.Millisecond, ITL: time.Millisecond})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()

	body := `{"model":"demo","prompt":"say something","max_tokens":3}`
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, strings.Contains(string(b), `"text":"tok0 tok1 tok2 "`))
	fmt.Printf("%+v\n", e.Stats())
	// Output:
	// 200 true
	// {Received:1 Running:0 Waiting:0 Completed:1 Aborted:0 Faulted:0 PrefixCacheQueries:2 PrefixCacheHits:0 KVParamsSent:0 KVHeld:0 KVPullsServed:0 KVLeasesExpired:0 KVPulled:0 KVLoadFailures:0 KVRecomputed:0}
}

// The Messages API and the Responses API run on the same scheduler as chat; a LoRA adapter
// is served under its own name.
func ExampleNew_messages() {
	e, err := enginesim.New(enginesim.Config{
		Models: []string{"demo"}, TTFT: time.Millisecond, ITL: time.Millisecond, OutputTokens: 2,
		LoRAs: []enginesim.LoRA{{Name: "demo-sql", Path: "/loras/sql"}},
	})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(e.Handler())
	defer srv.Close()

	post := func(path, body string) string {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	msg := post("/v1/messages", `{"model":"demo-sql","max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`)
	fmt.Println(strings.Contains(msg, `"model":"demo-sql","content":[{"type":"text","text":"tok0 tok1 "}],"stop_reason":"end_turn"`))
	resp := post("/v1/responses", `{"model":"demo","input":"hi","max_output_tokens":1}`)
	fmt.Println(strings.Contains(resp, `"status":"incomplete"`), strings.Contains(resp, `"text":"tok0 "`))
	fmt.Printf("%+v\n", e.Stats())
	// Output:
	// true
	// true true
	// {Received:2 Running:0 Waiting:0 Completed:2 Aborted:0 Faulted:0 PrefixCacheQueries:2 PrefixCacheHits:0 KVParamsSent:0 KVHeld:0 KVPullsServed:0 KVLeasesExpired:0 KVPulled:0 KVLoadFailures:0 KVRecomputed:0}
}
