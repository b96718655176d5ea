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
	// {Received:1 Running:0 Waiting:0 Completed:1 Aborted:0 Faulted:0 PrefixCacheQueries:2 PrefixCacheHits:0}
}
