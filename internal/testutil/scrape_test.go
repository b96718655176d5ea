package testutil

import (
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

const exposition = `# HELP switchboard_engine_active_requests Requests in flight.
# TYPE switchboard_engine_active_requests gauge
switchboard_engine_active_requests{engine="e1",phase="prefill"} 2
switchboard_engine_active_requests{engine="e1",phase="decode"} 1
switchboard_engine_active_requests{engine="e2",phase="decode"} 0
# TYPE switchboard_config_reloads_total counter
switchboard_config_reloads_total{result="success"} 3
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE bare untyped
bare 7
`

func metricsHandler(status int, body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
}

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(metricsHandler(http.StatusOK, exposition))
	defer srv.Close()
	for name, mfs := range map[string]map[string]*dto.MetricFamily{
		"Scrape":        Scrape(t, srv.Client(), srv.URL+"/metrics"),
		"ScrapeHandler": ScrapeHandler(t, metricsHandler(http.StatusOK, exposition)),
	} {
		if len(mfs) != 4 {
			t.Errorf("%s: %d families, want 4", name, len(mfs))
		}
		got := Samples(mfs, "switchboard_engine_active_requests", "engine", "phase")
		if want := map[string]float64{"e1/prefill": 2, "e1/decode": 1, "e2/decode": 0}; !maps.Equal(got, want) {
			t.Errorf("%s: active requests %v, want %v", name, got, want)
		}
		if got, want := Samples(mfs, "switchboard_config_reloads_total", "result"), map[string]float64{"success": 3}; !maps.Equal(got, want) {
			t.Errorf("%s: reloads %v, want %v", name, got, want)
		}
		kv := mfs["vllm:kv_cache_usage_perc"].GetMetric()[0]
		if Label(kv, "model_name") != "m" || Label(kv, "engine") != "" || Value(kv) != 0.25 {
			t.Errorf("%s: kv usage %v", name, kv)
		}
		if v := Value(mfs["bare"].GetMetric()[0]); v != 7 {
			t.Errorf("%s: bare = %v, want 7", name, v)
		}
		if got := Samples(mfs, "absent", "engine"); len(got) != 0 {
			t.Errorf("%s: samples of an absent family %v, want none", name, got)
		}
	}
}

func TestScrapeFails(t *testing.T) {
	bad := httptest.NewServer(metricsHandler(http.StatusServiceUnavailable, ""))
	defer bad.Close()
	garbled := httptest.NewServer(metricsHandler(http.StatusOK, "# TYPE x gauge\nx{ 1\n"))
	defer garbled.Close()
	for _, c := range []struct {
		name string
		fn   func(testing.TB)
	}{
		{"status", func(tb testing.TB) { Scrape(tb, bad.Client(), bad.URL) }},
		{"parse", func(tb testing.TB) { Scrape(tb, garbled.Client(), garbled.URL) }},
		{"handler status", func(tb testing.TB) { ScrapeHandler(tb, metricsHandler(http.StatusInternalServerError, "")) }},
		{"transport", func(tb testing.TB) { Scrape(tb, http.DefaultClient, "http://127.0.0.1:0/metrics") }},
	} {
		if f := run(t, c.fn); !f.failed {
			t.Errorf("%s: Scrape did not fail the test", c.name)
		} else {
			t.Logf("%s: %s", c.name, f.msg)
		}
	}
}
