//go:build integration

package integration

// The operator console in a real browser: headless Chromium (Debian's
// chromium package) driven by chromedp over the DevTools protocol, against
// two gateway replicas that share a real Redis (internal/redistest) and
// the stack's two engine simulators. It checks what an operator does:
// sign in with the admin token, watch both engines' in-flight counts rise
// under cmd/loadgen's load and return to 0, drain an engine with its
// button (the next requests avoid it), create a key in the page (it
// serves a request) and revoke it (the second replica answers it 401),
// with no console error and no Content-Security-Policy violation on the
// way. A failing run leaves a screenshot of the page in IT_ARTIFACTS (the
// run directory's artifacts/, kept on failure) or the temp directory.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/switchboard-gw/switchboard/internal/redistest"
	"github.com/switchboard-gw/switchboard/internal/testutil"
)

// chromiumPath finds the browser: IT_CHROMIUM, else chromium or
// chromium-browser on PATH. Without one the test fails rather than
// skips, so a CI machine without it cannot pass by testing nothing.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IT_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH (apt-get install chromium) and IT_CHROMIUM unset")
	return ""
}

// consoleGateway is one replica of the console test.
type consoleGateway struct {
	public, admin string
	proc          *proc
}

// startConsoleGateways starts n gateway replicas in front of the stack's
// engines (sim-a, sim-b), their keys and limits in the Redis at redisAddr
// under a prefix of this run, their admin listeners behind token, with one
// configured API key, key (the load's), under auth.required (the keys API
// keeps its keys in Redis only then).
func startConsoleGateways(t *testing.T, s *stack, n int, redisAddr, token, key string) []*consoleGateway {
	t.Helper()
	if len(s.engines) < 2 {
		t.Fatalf("the console test needs two engines, IT_ENGINE_URLS has %d", len(s.engines))
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix := "switchboard:it-console-" + hex.EncodeToString(b) + ":"
	gws := make([]*consoleGateway, n)
	for i := range gws {
		g := &consoleGateway{public: freePort(t), admin: freePort(t)}
		cfg := fmt.Sprintf(`server:
  listen: %q
  shutdown_timeout: 2s
admin:
  listen: %q
  auth:
    tokens_env: IT_CONSOLE_ADMIN_TOKEN
routing:
  policy: round-robin
auth:
  required: true
  keys:
    - name: it-load
      sha256: %s
      models: ["*"]
limits:
  redis:
    address: %q
    key_prefix: %q
engines:
  - name: sim-a
    url: %s
    models: [%s]
  - name: sim-b
    url: %s
    models: [%s]
`, g.public, g.admin, hashHex(key), redisAddr, prefix, s.engines[0], s.model, s.engines[1], s.model)
		path := filepath.Join(t.TempDir(), "gateway.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		g.proc = start(t, []string{"OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_EXPORTER=none", "IT_CONSOLE_ADMIN_TOKEN=" + token},
			s.gatewayBin, "--config", path)
		gws[i] = g
	}
	for _, g := range gws {
		waitHTTP(t, "http://"+g.public+"/ready", 200)
	}
	return gws
}

// consoleChat sends one short chat request to g with key ("" for none)
// and returns its status and the engine that answered it.
// hashHex is the hex SHA-256 of key, as auth.keys[].sha256 holds it.
func hashHex(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func consoleChat(g *consoleGateway, model, key string) (int, string, error) {
	body := `{"model":"` + model + `","max_tokens":4,"messages":[{"role":"user","content":"hello console"}]}`
	req, err := http.NewRequest(http.MethodPost, "http://"+g.public+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := stackHTTP.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("X-Switchboard-Engine"), nil
}

// pageProblems collects what the page must never produce: uncaught
// exceptions, console.error calls, log entries of the browser's own
// (CSP violations are "security" entries), and the
// securitypolicyviolation events the page raises.
type pageProblems struct {
	mu       sync.Mutex
	list     []string
	signedIn bool // failed loads before sign-in (the 401 that asks for the token) are expected
}

func (p *pageProblems) add(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = append(p.list, s)
}

func (p *pageProblems) all() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.list...)
}

func (p *pageProblems) listen(ev any) {
	switch e := ev.(type) {
	case *runtime.EventExceptionThrown:
		p.add(fmt.Sprintf("exception: %s at %s:%d", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range e.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			p.add("console." + string(e.Type) + ": " + strings.Join(args, " "))
		}
	case *cdplog.EventEntryAdded:
		en := e.Entry
		if en.Level != cdplog.EntryLevelError {
			return
		}
		p.mu.Lock()
		before := !p.signedIn
		p.mu.Unlock()
		if en.Source == cdplog.EntrySourceNetwork && before && strings.Contains(en.Text, "401") {
			return
		}
		p.add(fmt.Sprintf("log %s: %s (%s)", en.Source, en.Text, en.URL))
	}
}

// engineCells is what the engines table shows of one engine.
type engineCells struct {
	State   string `json:"state"`
	Prefill int    `json:"prefill"`
	Decode  int    `json:"decode"`
}

const readEngines = `(() => {
	const out = {};
	for (const tr of document.querySelectorAll('tr[data-engine]')) {
		const cell = f => (tr.querySelector('[data-field="' + f + '"]') || {}).textContent || '';
		out[tr.dataset.engine] = {state: cell('state').trim(), prefill: parseInt(cell('prefill'), 10) || 0, decode: parseInt(cell('decode'), 10) || 0};
	}
	return out;
})()`

// TestConsoleBrowser is the console's end-to-end test in headless
// Chromium (see the file's comment).
func TestConsoleBrowser(t *testing.T) {
	s := needStack(t)
	browser := chromiumPath(t)
	rd := redistest.Start(t)
	tb := make([]byte, 24)
	_, _ = rand.Read(tb)
	token := hex.EncodeToString(tb)
	_, _ = rand.Read(tb)
	loadKey := "sk-it-load-" + hex.EncodeToString(tb)
	gws := startConsoleGateways(t, s, 2, rd.Addr(), token, loadKey)
	a, b := gws[0], gws[1]
	loadgen := build(t, t.TempDir(), "./cmd/loadgen")

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelCtx()
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*time.Minute)
	defer cancelTimeout()

	problems := &pageProblems{}
	if err := chromedp.Listen(ctx, problems.listen); err != nil {
		t.Fatalf("starting %s: %v", browser, err)
	}
	// Every CSP violation the page raises, whatever the browser logs.
	const cspHook = `window.__csp = []; document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));`
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("starting %s: %v", browser, err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspHook}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !t.Failed() {
			return
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Logf("screenshot: %v", err)
			return
		}
		dir := os.Getenv("IT_ARTIFACTS")
		if dir == "" {
			dir = os.TempDir()
		}
		_ = os.MkdirAll(dir, 0o755)
		path := filepath.Join(dir, fmt.Sprintf("console-%s-%d.png", t.Name(), time.Now().Unix()))
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Logf("screenshot: %v", err)
			return
		}
		t.Logf("screenshot of the page: %s", path)
	}()

	// The page's own headers: a strict CSP, no sniffing, no caching.
	resp, err := stackHTTP.Get("http://" + a.admin + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); resp.StatusCode != 200 || !strings.Contains(csp, "default-src 'none'") ||
		!strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
		t.Errorf("GET /console/: %d, Content-Security-Policy %q, want 200 with a strict policy", resp.StatusCode, csp)
	}

	// Sign in: the page finds its data behind the token and asks for it.
	consoleURL := "http://" + a.admin + "/console/"
	if err := chromedp.Do(ctx,
		chromedp.Navigate(consoleURL),
		chromedp.WaitVisible(chromedp.CSS(`#token-form`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), token),
		func(context.Context, *chromedp.Target) (chromedp.Void, error) {
			problems.mu.Lock()
			problems.signedIn = true
			problems.mu.Unlock()
			return chromedp.Void{}, nil
		},
		chromedp.Click(chromedp.CSS(`#token-submit`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-engine="sim-a"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-engine="sim-b"]`)),
	); err != nil {
		t.Fatalf("signing in to %s: %v", consoleURL, err)
	}
	engines := func() map[string]engineCells {
		t.Helper()
		out, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]engineCells](readEngines))
		if err != nil {
			t.Fatalf("reading the engines table: %v", err)
		}
		return out
	}
	if e := engines(); e["sim-a"].State != "ready" || e["sim-b"].State != "ready" {
		t.Fatalf("engines shown %+v, want sim-a and sim-b ready", e)
	}

	// Load: both engines' in-flight counts rise on the page, then return to 0.
	lctx, lcancel := context.WithCancel(context.Background())
	defer lcancel()
	lg := exec.CommandContext(lctx, loadgen, "--url", "http://"+a.public, "--model", s.model, "--stream",
		"--concurrency", "8", "--max-tokens", "150", "--duration", "8s", "--max-error-rate", "0", "--api-key", loadKey)
	lgOut := &strings.Builder{}
	lg.Stdout, lg.Stderr = lgOut, lgOut
	if err := lg.Start(); err != nil {
		t.Fatal(err)
	}
	lgDone := make(chan error, 1)
	go func() { lgDone <- lg.Wait() }()
	peak := map[string]int{}
	if !testutil.Poll(20*time.Second, func() bool {
		for name, c := range engines() {
			peak[name] = max(peak[name], c.Prefill+c.Decode)
		}
		return peak["sim-a"] > 0 && peak["sim-b"] > 0
	}) {
		t.Errorf("in flight under load never rose on both engines: peak %v", peak)
	}
	select {
	case err := <-lgDone:
		if err != nil {
			t.Errorf("loadgen: %v\n%s", err, lgOut)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("loadgen did not end\n%s", lgOut)
	}
	var last map[string]engineCells
	if !testutil.Poll(15*time.Second, func() bool {
		last = engines()
		return last["sim-a"].Prefill+last["sim-a"].Decode+last["sim-b"].Prefill+last["sim-b"].Decode == 0
	}) {
		t.Errorf("in flight after the load: %+v, want 0 on both engines", last)
	}
	t.Logf("peak in flight on the page under load: %v", peak)

	// Drain sim-a with its button: the page shows it draining and the
	// next requests go to sim-b only.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-engine="sim-a"] button[data-action="drain"]`))); err != nil {
		t.Fatalf("clicking drain: %v", err)
	}
	if !testutil.Poll(10*time.Second, func() bool { return engines()["sim-a"].State == "draining" }) {
		t.Errorf("sim-a after the drain button: %+v, want draining", engines()["sim-a"])
	}
	for i := range 10 {
		st, eng, err := consoleChat(a, s.model, loadKey)
		if err != nil || st != 200 || eng != "sim-b" {
			t.Errorf("request %d after the drain: %d from %q (%v), want 200 from sim-b", i, st, eng, err)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`tr[data-engine="sim-a"] button[data-action="undrain"]`))); err != nil {
		t.Fatalf("clicking undrain: %v", err)
	}
	if !testutil.Poll(10*time.Second, func() bool { return engines()["sim-a"].State == "ready" }) {
		t.Errorf("sim-a after the undrain button: %+v, want ready", engines()["sim-a"])
	}

	// A key created in the page serves a request, on either replica; once
	// revoked in the page, the second replica answers it 401.
	const keyName = "it-console-key"
	if err := chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#key-create input[name="name"]`), keyName),
		chromedp.SetValue(chromedp.CSS(`#key-create input[name="models"]`), "*"),
		chromedp.Click(chromedp.CSS(`#key-create button[type="submit"]`)),
	); err != nil {
		t.Fatalf("creating a key in the page: %v", err)
	}
	secret, err := chromedp.Run(ctx, chromedp.Poll[string](`(document.querySelector('#key-secret') || {}).textContent || false`,
		chromedp.WithPollingTimeout(10*time.Second)))
	if err != nil {
		t.Fatalf("waiting for the created key's secret: %v", err)
	}
	secret = strings.TrimSpace(secret)
	if !strings.HasPrefix(secret, "sk-sb-") || len(secret) != len("sk-sb-")+43 {
		t.Fatalf("the page showed %q as the created key's secret, want sk-sb- and 43 base64url characters", secret)
	}
	if st, _, err := consoleChat(a, s.model, secret); err != nil || st != 200 {
		t.Errorf("a request with the created key on the first replica: %d (%v), want 200", st, err)
	}
	if !testutil.Poll(5*time.Second, func() bool { st, _, _ := consoleChat(b, s.model, secret); return st == 200 }) {
		t.Errorf("the created key never served a request on the second replica")
	}
	if st, _, _ := consoleChat(b, s.model, ""); st != 401 {
		t.Errorf("a request without a key: %d, want 401", st)
	}
	var revokedAt time.Time
	row := `tr[data-key="` + keyName + `"]`
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(row)),
		chromedp.Click(chromedp.CSS(row+` button[data-action="revoke"]`)),
		chromedp.WaitVisible(chromedp.CSS(row+` button[data-action="revoke-confirm"]`)),
		chromedp.Click(chromedp.CSS(row+` button[data-action="revoke-confirm"]`)),
		func(context.Context, *chromedp.Target) (chromedp.Void, error) {
			revokedAt = time.Now()
			return chromedp.Void{}, nil
		},
		chromedp.WaitNotPresent(chromedp.CSS(row)),
	); err != nil {
		t.Fatalf("revoking the key in the page: %v", err)
	}
	if !testutil.Poll(5*time.Second, func() bool { st, _, _ := consoleChat(b, s.model, secret); return st == 401 }) {
		t.Errorf("the revoked key is still served by the second replica")
	} else {
		t.Logf("the second replica answered the revoked key 401 %v after the click", time.Since(revokedAt).Round(time.Millisecond))
	}
	if !testutil.Poll(5*time.Second, func() bool { st, _, _ := consoleChat(a, s.model, secret); return st == 401 }) {
		t.Errorf("the revoked key on the first replica is not refused 401")
	}

	// The page itself: the admin token never in its HTML, no console
	// error, no CSP violation.
	csp, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__csp || []`))
	if err != nil {
		t.Fatal(err)
	}
	html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS(`html`)))
	if err != nil {
		t.Fatal(err)
	}
	if len(csp) > 0 {
		t.Errorf("CSP violations: %q", csp)
	}
	if strings.Contains(html, token) || strings.Contains(html, secret) && !strings.Contains(html, `id="key-secret"`) {
		t.Error("the admin token is in the page's DOM")
	}
	// The token lives for the tab only (sessionStorage), never in
	// localStorage or a cookie another tab or a restart would keep.
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(Object.assign({}, localStorage)) + document.cookie`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(kept, token) {
		t.Error("the admin token is kept in localStorage or a cookie")
	}
	for _, p := range problems.all() {
		t.Errorf("the page logged: %s", p)
	}
	if path := os.Getenv("IT_CONSOLE_SCREENSHOT"); path != "" {
		if png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)); err == nil {
			_ = os.WriteFile(path, png, 0o644)
		}
	}
}
