package testutil

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Scrape GETs url (a Prometheus /metrics endpoint) with client and returns
// its text exposition parsed into metric families by name. It fails the
// test on a transport error, a status other than 200, or a body that does
// not parse.
func Scrape(t testing.TB, client *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d", url, resp.StatusCode)
	}
	return parse(t, url, resp.Body)
}

// ScrapeHandler is Scrape over h, served in process with a GET /metrics.
func ScrapeHandler(t testing.TB, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", rec.Code)
	}
	return parse(t, "/metrics", rec.Body)
}

func parse(t testing.TB, url string, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return mfs
}

// Label returns the value of m's label name, or "" when m has none.
func Label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Value returns the sample value of a gauge, counter or untyped metric,
// and 0 for any other type.
func Value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

// Samples returns the values (as Value reads them) of the metrics of
// family name in mfs, keyed by the values of labels joined with "/": with
// labels "engine" and "phase", a key is "e1/decode". It is empty when
// mfs has no such family.
func Samples(mfs map[string]*dto.MetricFamily, name string, labels ...string) map[string]float64 {
	out := map[string]float64{}
	vals := make([]string, len(labels))
	for _, m := range mfs[name].GetMetric() {
		for i, l := range labels {
			vals[i] = Label(m, l)
		}
		out[strings.Join(vals, "/")] = Value(m)
	}
	return out
}
