// Command goproxy is Go's floor in bench/proxy/run.sh: a bare
// net/http/httputil.ReverseProxy in front of one engine, with nothing of the
// gateway's (no routing, no parsing, no telemetry, no logging). What it costs
// per request, any Go proxy built on net/http pays as well.
//
//	goproxy --listen 127.0.0.1:0 --upstream http://127.0.0.1:8001 [--client lean]
//
// With --client lean the ReverseProxy's Transport is the gateway's own
// engine client (internal/h1, over the same http.Transport for what it does
// not speak): the floor of a net/http server with that client, which is
// Switchboard's floor since it ships with it (server.engine_client: lean).
//
// FlushInterval is -1 (every write reaches the client at once, as the gateway
// streams) and the Transport keeps up to 256 idle connections to the engine,
// so 64 client connections never open new upstream ones; each request is
// served full duplex (see main). It logs one line,
// msg="goproxy listening" addr=HOST:PORT, once it listens, and stops on
// SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/switchboard-gw/switchboard/internal/h1"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (host:port; port 0 picks a free one)")
	upstream := flag.String("upstream", "http://127.0.0.1:8001", "engine base URL")
	client := flag.String("client", "net/http", "engine client: net/http (http.Transport) or lean (internal/h1)")
	flag.Parse()

	target, err := url.Parse(*upstream)
	if err != nil || target.Host == "" {
		log.Fatalf("--upstream %q: not a URL", *upstream)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = 1024
	transport.MaxIdleConnsPerHost = 256
	transport.ForceAttemptHTTP2 = false
	var rt http.RoundTripper = transport
	switch *client {
	case "net/http":
	case "lean":
		rt = h1.New(transport)
	default:
		log.Fatalf("--client %q: want net/http or lean", *client)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
		Transport:     rt,
		ErrorLog:      log.New(os.Stderr, "", log.LstdFlags),
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	// Full duplex: without it, net/http's HTTP/1 server closes the request body
	// as soon as the response starts, and when a fast engine answers before the
	// Transport has made its last read of that body (the check that it is no
	// longer than its Content-Length), the Transport drops the engine
	// connection mid-stream: "invalid Read on closed Body", then "read error
	// during body copy: use of closed network connection" (golang/go#40747).
	// About 3% of 16-token streams were cut this way without it.
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: proxy.ErrorLog}
	fmt.Fprintf(os.Stderr, "msg=\"goproxy listening\" addr=%s upstream=%s\n", ln.Addr(), target)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
