//go:build integration

package integration

// Tests for the Grafana dashboard in deploy/grafana/switchboard.json.
//
// TestDashboardJSONValid needs nothing running: the JSON parses, panel ids
// are unique, every panel has a title, a description, a grid position and at
// least one PromQL target, every variable an expression uses is one the
// dashboard (or Grafana) defines, and every selector filters by job.
//
// TestDashboardPanelsReturnData runs against the real stack that
// integration/run.sh starts (gateway -> collector -> Prometheus 3's OTLP
// receiver): it sends traffic through the gateway and polls Prometheus
// until every panel query returns data: at least one series whose value is
// a number (not NaN) and, for a query over a rate window, above 0. It needs
// IT_PROM_URL (Prometheus' base URL), IT_GATEWAY_URL (the gateway's public
// base URL), IT_SERVICE (the gateway's service.name, which Prometheus' OTLP
// receiver turns into the job label) and IT_MODEL (a model the engines
// serve). IT_DASHBOARD_TIMEOUT (a Go duration, default 60s) bounds the
// polling. The gateway must export metrics every few seconds
// (OTEL_METRIC_EXPORT_INTERVAL), or the 1m rate windows stay empty.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// dashboardPath is the dashboard file, relative to this package's directory
// (go test runs in it).
var dashboardPath = filepath.Join("..", "deploy", "grafana", "switchboard.json")

// dashboard is the part of Grafana's dashboard JSON model the tests read.
type dashboard struct {
	UID           string      `json:"uid"`
	Title         string      `json:"title"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	// Rows is the pre-5.0 layout (schemaVersion < 16), walked too.
	Rows []struct {
		Title  string      `json:"title"`
		Panels []dashPanel `json:"panels"`
	} `json:"rows"`
	Templating struct {
		List []dashVariable `json:"list"`
	} `json:"templating"`
}

type dashPanel struct {
	ID          *int         `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Description string       `json:"description"`
	Datasource  *dashDS      `json:"datasource"`
	GridPos     *dashGridPos `json:"gridPos"`
	Collapsed   bool         `json:"collapsed"`
	Targets     []dashTarget `json:"targets"`
	// Panels are a row's panels (Grafana nests them while the row is
	// collapsed).
	Panels []dashPanel `json:"panels"`
}

type dashDS struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type dashGridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type dashTarget struct {
	RefID      string  `json:"refId"`
	Expr       string  `json:"expr"`
	Datasource *dashDS `json:"datasource"`
}

type dashVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": ...} from the Prometheus query editor
	Definition string          `json:"definition"`
	Datasource *dashDS         `json:"datasource"`
}

// queryText returns the variable's query whichever way it is stored.
func (v dashVariable) queryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(v.Query, &o) == nil && o.Query != "" {
		return o.Query
	}
	return v.Definition
}

// dashQuery is one target of one panel.
type dashQuery struct {
	Panel string // the panel's title, with its row's: "Latency / TTFT ..."
	RefID string
	Expr  string
}

func (q dashQuery) String() string { return fmt.Sprintf("%q (%s)", q.Panel, q.RefID) }

func loadDashboard(t *testing.T, path string) *dashboard {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read dashboard: %v", err)
	}
	return parseDashboard(t, b)
}

func parseDashboard(t *testing.T, b []byte) *dashboard {
	t.Helper()
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("dashboard JSON: data after the top-level object")
	}
	return &d
}

// walkDashboard calls fn for every panel, rows and the panels nested in
// rows included, depth first, in file order. path is the titles of the
// enclosing rows and the panel, joined by " / ".
func walkDashboard(d *dashboard, fn func(p *dashPanel, path string)) {
	var walk func(ps []dashPanel, prefix string)
	walk = func(ps []dashPanel, prefix string) {
		row := prefix
		for i := range ps {
			p := &ps[i]
			if p.Type == "row" {
				row = joinPath(prefix, p.Title)
				fn(p, row)
				walk(p.Panels, row)
				continue
			}
			fn(p, joinPath(row, p.Title))
			walk(p.Panels, joinPath(row, p.Title))
		}
	}
	walk(d.Panels, "")
	for _, r := range d.Rows {
		walk(r.Panels, r.Title)
	}
}

func joinPath(prefix, title string) string {
	if prefix == "" {
		return title
	}
	return prefix + " / " + title
}

// dashboardQueries returns every target of every panel.
func dashboardQueries(d *dashboard) []dashQuery {
	var qs []dashQuery
	walkDashboard(d, func(p *dashPanel, path string) {
		for _, tg := range p.Targets {
			qs = append(qs, dashQuery{Panel: path, RefID: tg.RefID, Expr: tg.Expr})
		}
	})
	return qs
}

// dashVarRe matches Grafana's variable syntaxes: ${name}, ${name:format},
// [[name]], [[name:format]] and $name.
var dashVarRe = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)`)

// substituteDashVars replaces the variables in expr with their values in
// vars and returns the variables it found no value for. Numbered references
// ($1, used by label_replace) are not variables and are left alone.
func substituteDashVars(expr string, vars map[string]string) (string, []string) {
	var unknown []string
	out := dashVarRe.ReplaceAllStringFunc(expr, func(m string) string {
		sub := dashVarRe.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		if v, ok := vars[name]; ok {
			return v
		}
		if _, err := strconv.Atoi(name); err != nil {
			unknown = append(unknown, m)
		}
		return m
	})
	return out, unknown
}

// dashVars are the values the tests give the dashboard's variables and
// Grafana's built-in ones: job matches exactly service (as a regex, inside
// a PromQL string), engine and model match everything.
func dashVars(service string) map[string]string {
	return map[string]string{
		"job":             promStringEscape(regexp.QuoteMeta(service)),
		"engine":          ".*",
		"model":           ".*",
		"__rate_interval": "1m",
		"__interval":      "15s",
		"__interval_ms":   "15000",
		"__range":         "1h",
		"__range_s":       "3600",
		"__range_ms":      "3600000",
	}
}

// promStringEscape escapes s for a double-quoted PromQL string.
func promStringEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s)
}

// promScan splits a PromQL expression into what lies outside string
// literals (strings replaced by "") and checks the brackets balance.
func promScan(expr string) (code string, err error) {
	var b strings.Builder
	var stack []byte
	pairs := map[byte]byte{')': '(', '}': '{', ']': '['}
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch c {
		case '"', '\'', '`':
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' {
					j++
				}
			}
			if j >= len(expr) {
				return "", fmt.Errorf("unterminated string at offset %d", i)
			}
			b.WriteString(`""`)
			i = j
			continue
		case '(', '{', '[':
			stack = append(stack, c)
		case ')', '}', ']':
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				return "", fmt.Errorf("unbalanced %q at offset %d", c, i)
			}
			stack = stack[:len(stack)-1]
		case '#':
			return "", fmt.Errorf("comment at offset %d", i)
		}
		b.WriteByte(c)
	}
	if len(stack) > 0 {
		return "", fmt.Errorf("unclosed %q", stack[len(stack)-1])
	}
	return b.String(), nil
}

var (
	// dashSelectorRe matches a metric name and its label matchers.
	dashSelectorRe = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	// dashRangeRe matches a range selector's duration.
	dashRangeRe = regexp.MustCompile(`\[([^\]]*)\]`)
	// dashJobRe is the job matcher every selector needs.
	dashJobRe = regexp.MustCompile(`(^|[,{\s])job\s*=~\s*"\$job"`)
)

// dashboardMetrics are the metrics the dashboard must chart, as Prometheus'
// OTLP receiver names them (UnderscoreEscapingWithSuffixes).
var dashboardMetrics = []string{
	"switchboard_engine_active_requests",
	"switchboard_engine_time_to_first_token_seconds_bucket",
	"switchboard_engine_inter_token_latency_seconds_bucket",
	"switchboard_engine_request_duration_seconds_bucket",
	"switchboard_engine_request_duration_seconds_count",
	"gen_ai_client_token_usage_sum",
	"switchboard_gateway_overhead_seconds_bucket",
	"switchboard_gateway_step_duration_seconds_bucket",
	"switchboard_engine_time_to_first_byte_seconds_bucket",
	"switchboard_engine_stream_max_gap_seconds_bucket",
	"switchboard_engine_queue_depth",
	"switchboard_engine_kv_cache_usage_ratio",
	"switchboard_engine_prefix_cache_hit_ratio",
	"switchboard_engine_accounting_drift",
	"switchboard_engine_state_ratio",
}

func TestDashboardJSONValid(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(raw) {
		t.Fatal("deploy/grafana/switchboard.json is not valid JSON")
	}
	d := parseDashboard(t, raw)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both are needed", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want 36 or later (datasource references by uid)", d.SchemaVersion)
	}

	// Variables: a Prometheus data source variable, and job, engine, model.
	known := dashVars("svc")
	vars := map[string]dashVariable{}
	for _, v := range d.Templating.List {
		if _, dup := vars[v.Name]; dup {
			t.Errorf("variable %q defined twice", v.Name)
		}
		vars[v.Name] = v
		if _, ok := known[v.Name]; !ok {
			known[v.Name] = "x"
		}
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || v.queryText() != "prometheus" {
		t.Errorf("want a variable datasource of type datasource with query prometheus, got %+v", v)
	}
	for name, want := range map[string]string{
		"job":    "label_values(switchboard_engine_active_requests, job)",
		"engine": "engine)",
		"model":  "model)",
	} {
		v, ok := vars[name]
		switch {
		case !ok:
			t.Errorf("variable %q missing", name)
		case v.Type != "query" || !strings.HasPrefix(v.queryText(), "label_values(") || !strings.Contains(v.queryText(), want):
			t.Errorf("variable %q: type %q query %q, want a label_values query containing %q", name, v.Type, v.queryText(), want)
		case v.Datasource == nil || v.Datasource.UID != "${datasource}":
			t.Errorf("variable %q: datasource %+v, want uid ${datasource}", name, v.Datasource)
		}
	}

	// Panels.
	ids := map[int]string{}
	top := d.Panels
	walkDashboard(d, func(p *dashPanel, path string) {
		if p.ID == nil || *p.ID <= 0 {
			t.Errorf("panel %q: no positive id", path)
		} else if other, dup := ids[*p.ID]; dup {
			t.Errorf("panel %q: id %d already used by %q", path, *p.ID, other)
		} else {
			ids[*p.ID] = path
		}
		if strings.TrimSpace(p.Title) == "" {
			t.Errorf("panel %q (id %v): no title", path, p.ID)
		}
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v, want w and h > 0 within the 24 columns", path, g)
		}
		if p.Type == "row" {
			if len(p.Targets) > 0 {
				t.Errorf("row %q has targets", path)
			}
			return
		}
		if p.Type != "timeseries" && p.Type != "stat" {
			t.Errorf("panel %q: type %q, want timeseries or stat", path, p.Type)
		}
		if strings.TrimSpace(p.Description) == "" {
			t.Errorf("panel %q: no description", path)
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want {prometheus ${datasource}}", path, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no targets", path)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or repeated", path, tg.RefID)
			}
			refs[tg.RefID] = true
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q (%s): empty expr", path, tg.RefID)
			}
			if tg.Datasource != nil && tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q (%s): target datasource %+v, want uid ${datasource}", path, tg.RefID, tg.Datasource)
			}
		}
	})
	// Top-level panels must not overlap on the grid.
	for i := range top {
		for j := i + 1; j < len(top); j++ {
			a, b := top[i].GridPos, top[j].GridPos
			if a != nil && b != nil && a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q and %q overlap: %+v %+v", top[i].Title, top[j].Title, *a, *b)
			}
		}
	}

	// Expressions.
	qs := dashboardQueries(d)
	if len(qs) == 0 {
		t.Fatal("no queries")
	}
	t.Log("github.com/prometheus/prometheus is not in go.mod: PromQL is checked for variables, " +
		"brackets, strings, job matchers and range durations, not parsed")
	all := ""
	for _, q := range qs {
		all += q.Expr + "\n"
		sub, unknown := substituteDashVars(q.Expr, known)
		if len(unknown) > 0 {
			t.Errorf("%v: undefined variables %v in %s", q, unknown, q.Expr)
		}
		if strings.Contains(sub, "$") {
			t.Errorf("%v: a $ is left after substitution: %s", q, sub)
		}
		code, err := promScan(q.Expr)
		if err != nil {
			t.Errorf("%v: %v: %s", q, err, q.Expr)
			continue
		}
		// Range selectors use Grafana's intervals, so the panels follow
		// the scrape interval and the time range.
		for _, m := range dashRangeRe.FindAllStringSubmatch(code, -1) {
			if m[1] != "$__rate_interval" && m[1] != "$__range" && m[1] != "$__interval" {
				t.Errorf("%v: range [%s], want [$__rate_interval] or [$__range]: %s", q, m[1], q.Expr)
			}
		}
		sels := dashSelectorRe.FindAllStringSubmatchIndex(q.Expr, -1)
		if len(sels) == 0 {
			t.Errorf("%v: no selector with label matchers: %s", q, q.Expr)
		}
		for _, m := range sels {
			name, matchers := q.Expr[m[2]:m[3]], q.Expr[m[4]:m[5]]
			if !dashJobRe.MatchString(matchers) {
				t.Errorf("%v: selector %s{%s} does not filter by job=~\"$job\"", q, name, matchers)
			}
		}
	}
	for _, m := range dashboardMetrics {
		if !regexp.MustCompile(`(^|[^a-zA-Z0-9_:])` + regexp.QuoteMeta(m) + `\s*\{`).MatchString(all) {
			t.Errorf("no panel queries %s", m)
		}
	}

	t.Run("walker", func(t *testing.T) {
		// A collapsed row nests its panels; old dashboards have rows.
		d := parseDashboard(t, []byte(`{"panels":[
			{"id":1,"type":"timeseries","title":"a","targets":[{"refId":"A","expr":"up{job=~\"$job\"}"}]},
			{"id":2,"type":"row","title":"r","collapsed":true,"panels":[
				{"id":3,"type":"stat","title":"b","targets":[{"refId":"A","expr":"x{job=~\"${job}\"}[$__rate_interval]"},{"refId":"B","expr":"[[model]]"}]}]},
			{"id":4,"type":"stat","title":"c","targets":[{"refId":"A","expr":"y"}]}],
			"rows":[{"title":"old","panels":[{"id":5,"type":"graph","title":"d","targets":[{"refId":"A","expr":"z[$__range]"}]}]}]}`))
		var got []string
		for _, q := range dashboardQueries(d) {
			sub, unknown := substituteDashVars(q.Expr, dashVars("sw.it"))
			got = append(got, fmt.Sprintf("%s|%s|%s|%v", q.Panel, q.RefID, sub, unknown))
		}
		want := []string{
			`a|A|up{job=~"sw\\.it"}|[]`,
			`r / b|A|x{job=~"sw\\.it"}[1m]|[]`,
			`r / b|B|.*|[]`,
			`r / c|A|y|[]`,
			`old / d|A|z[1h]|[]`,
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("walk:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if _, unknown := substituteDashVars(`label_replace(x, "a", "$1", "b", "(.*)") + $nope`, nil); len(unknown) != 1 || unknown[0] != "$nope" {
			t.Errorf("unknown variables: %v, want [$nope]", unknown)
		}
		if _, err := promScan(`sum(rate(x{a="}"}[1m])`); err == nil {
			t.Error("promScan accepted an unclosed parenthesis")
		}
	})
}

func TestDashboardPanelsReturnData(t *testing.T) {
	prom, gw := strings.TrimRight(os.Getenv("IT_PROM_URL"), "/"), strings.TrimRight(os.Getenv("IT_GATEWAY_URL"), "/")
	service, model := os.Getenv("IT_SERVICE"), os.Getenv("IT_MODEL")
	if prom == "" || gw == "" || service == "" || model == "" {
		t.Skip("IT_PROM_URL, IT_GATEWAY_URL, IT_SERVICE and IT_MODEL are not all set: run integration/run.sh, which starts Prometheus and a gateway")
	}
	timeout := 60 * time.Second
	if s := os.Getenv("IT_DASHBOARD_TIMEOUT"); s != "" {
		var err error
		if timeout, err = time.ParseDuration(s); err != nil {
			t.Fatalf("IT_DASHBOARD_TIMEOUT: %v", err)
		}
	}
	d := loadDashboard(t, dashboardPath)
	vars := dashVars(service)
	var qs []dashQuery
	for _, q := range dashboardQueries(d) {
		sub, unknown := substituteDashVars(q.Expr, vars)
		if len(unknown) > 0 {
			t.Fatalf("%v: undefined variables %v", q, unknown)
		}
		q.Expr = sub
		qs = append(qs, q)
	}

	client := &http.Client{Timeout: 30 * time.Second}
	dashWaitOK(t, client, gw+"/health")
	dashWaitOK(t, client, prom+"/-/ready")

	// One round checked, so a broken gateway fails here and not as empty
	// panels: streamed and non-streamed chats, an engine error, and a
	// stream with an event that does not parse (stream parse errors).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	round := func(ctx context.Context) []error {
		var errs []error
		check := func(what string, stream bool, fault string, ok func(status int, body string) bool) {
			status, body, err := dashChat(ctx, client, gw, model, stream, fault)
			if err == nil && !ok(status, body) {
				err = fmt.Errorf("status %d: %.300s", status, body)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
			}
		}
		check("streamed chat", true, "", func(s int, b string) bool { return s == 200 && strings.Contains(b, "[DONE]") })
		check("chat", false, "", func(s int, b string) bool { return s == 200 && strings.Contains(b, `"usage"`) })
		check("engine error (status=500)", false, "status=500", func(s int, _ string) bool { return s >= 500 })
		check("malformed stream", true, "malformed", func(s int, _ string) bool { return s == 200 })
		return errs
	}
	if errs := round(ctx); len(errs) > 0 {
		t.Fatalf("traffic through %s: %v", gw, errors.Join(errs...))
	}
	// Traffic keeps flowing while Prometheus is polled, so every rate
	// window sees increments (a counter's first sample is not one) and
	// the quantiles are numbers, not NaN.
	var wg sync.WaitGroup
	var failed []error
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, err := range round(ctx) {
				if ctx.Err() == nil {
					failed = append(failed, err)
				}
			}
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
		if len(failed) > 0 {
			t.Logf("%d background requests failed, first: %v", len(failed), failed[0])
		}
	}()

	// A query over a rate window must also show activity (a value above
	// 0): a counter series' first sample is no increase to rate(), so a
	// panel can have series and still chart nothing but zeros.
	type outcome struct {
		series, numbers, positive int
		err                       error
	}
	last := map[int]outcome{}
	pending := map[int]bool{}
	for i := range qs {
		pending[i] = true
	}
	start := time.Now()
	for {
		for i := range qs {
			if !pending[i] {
				continue
			}
			series, numbers, positive, err := dashPromQuery(ctx, client, prom, qs[i].Expr)
			last[i] = outcome{series, numbers, positive, err}
			var bad *dashBadQuery
			switch {
			case errors.As(err, &bad):
				delete(pending, i) // will not get better
			case err == nil && numbers > 0 && (positive > 0 || !dashOverWindow(qs[i].Expr)):
				delete(pending, i)
			}
		}
		if len(pending) == 0 || time.Since(start) > timeout {
			break
		}
		time.Sleep(2 * time.Second)
	}

	var report []string
	for i, q := range qs {
		o := last[i]
		var why string
		switch {
		case o.err != nil:
			why = "error: " + o.err.Error()
		case o.series == 0:
			why = "empty result"
		case o.numbers == 0:
			why = fmt.Sprintf("%d series, all NaN", o.series)
		case o.positive == 0 && dashOverWindow(q.Expr):
			why = fmt.Sprintf("%d series, none above 0 (no increase in the window)", o.series)
		default:
			continue
		}
		report = append(report, fmt.Sprintf("%v: %s\n\t%s", q, why, q.Expr))
	}
	if len(report) > 0 {
		t.Errorf("%d of %d dashboard queries returned no data after %v (job %q):\n%s",
			len(report), len(qs), time.Since(start).Round(time.Second), service, strings.Join(report, "\n"))
	} else {
		t.Logf("all %d dashboard queries returned data after %v", len(qs), time.Since(start).Round(time.Second))
	}
}

// dashOverWindow reports whether expr computes over a range window
// (rate, increase, ...), outside its strings.
func dashOverWindow(expr string) bool {
	code, err := promScan(expr)
	return err == nil && strings.Contains(code, "[")
}

// dashWaitOK waits up to 15 s for url to answer 200.
func dashWaitOK(t *testing.T, c *http.Client, url string) {
	t.Helper()
	var err error
	if !testutil.Poll(15*time.Second, func() bool {
		var resp *http.Response
		if resp, err = c.Get(url); err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		return err == nil
	}) {
		t.Fatalf("%s: %v", url, err)
	}
}

// dashChat sends one chat completion through the gateway, with the engine
// simulator's fault header when fault is not empty, and returns the status
// and the first 64 KiB of the body.
func dashChat(ctx context.Context, c *http.Client, base, model string, stream bool, fault string) (int, string, error) {
	req := map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": "dashboard test traffic"}},
		"max_tokens": 4,
	}
	if stream {
		req["stream"] = true
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	body, _ := json.Marshal(req)
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	r.Header.Set("Content-Type", "application/json")
	if fault != "" {
		r.Header.Set("X-Enginesim-Fault", fault)
	}
	resp, err := c.Do(r)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), err
}

// dashBadQuery is Prometheus refusing a query (bad_data): retrying will not
// help.
type dashBadQuery struct{ msg string }

func (e *dashBadQuery) Error() string { return e.msg }

// dashPromQuery runs an instant query and returns how many series (or
// scalars) it returned, how many of them are numbers (not NaN) and how many
// are above 0.
func dashPromQuery(ctx context.Context, c *http.Client, prom, expr string) (series, numbers, positive int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodGet, prom+"/api/v1/query?"+url.Values{"query": {expr}}.Encode(), nil)
	if err != nil {
		return 0, 0, 0, err
	}
	resp, err := c.Do(r)
	if err != nil {
		return 0, 0, 0, err
	}
	defer resp.Body.Close()
	var pr struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&pr); err != nil {
		return 0, 0, 0, fmt.Errorf("status %d: %w", resp.StatusCode, err)
	}
	if pr.Status != "success" {
		msg := fmt.Sprintf("%s: %s", pr.ErrorType, pr.Error)
		if pr.ErrorType == "bad_data" {
			return 0, 0, 0, &dashBadQuery{msg}
		}
		return 0, 0, 0, errors.New(msg)
	}
	var values []string
	switch pr.Data.ResultType {
	case "vector":
		var v []struct {
			Value [2]any `json:"value"`
		}
		if err := json.Unmarshal(pr.Data.Result, &v); err != nil {
			return 0, 0, 0, err
		}
		for _, s := range v {
			values = append(values, fmt.Sprint(s.Value[1]))
		}
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(pr.Data.Result, &v); err != nil {
			return 0, 0, 0, err
		}
		values = append(values, fmt.Sprint(v[1]))
	case "matrix":
		var m []struct {
			Values [][2]any `json:"values"`
		}
		if err := json.Unmarshal(pr.Data.Result, &m); err != nil {
			return 0, 0, 0, err
		}
		for _, s := range m {
			if len(s.Values) > 0 {
				values = append(values, fmt.Sprint(s.Values[len(s.Values)-1][1]))
			}
		}
	default:
		return 0, 0, 0, fmt.Errorf("result type %q", pr.Data.ResultType)
	}
	for _, s := range values {
		if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsNaN(f) {
			numbers++
			if f > 0 {
				positive++
			}
		}
	}
	return len(values), numbers, positive, nil
}
