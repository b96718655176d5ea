// Command fastproxy is the fasthttp floors in bench/proxy/run.sh: a proxy
// in front of one engine whose engine client is fasthttp's HostClient
// (github.com/valyala/fasthttp), served either by fasthttp's own server
// (--server fasthttp: the fasthttp floor, what a gateway built on fasthttp
// end to end, as Bifrost is, pays) or by net/http's server
// (--server net/http: the floor of a net/http server, which chi needs, with
// fasthttp's client, to set beside go-proxy-lean, the same server with the
// gateway's own client, internal/h1). Nothing of the gateway's: no
// routing, parsing, telemetry or logging.
//
//	fastproxy --listen 127.0.0.1:0 --upstream 127.0.0.1:8001 --server fasthttp
//
// Responses are streamed (HostClient.StreamResponseBody): an event stream
// reaches the client event by event, flushed. It logs one line,
// msg="fastproxy listening" addr=HOST:PORT, once it listens, and stops on
// SIGTERM or SIGINT. It is its own module so that the gateway's go.mod does
// not depend on fasthttp.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (host:port; port 0 picks a free one)")
	upstream := flag.String("upstream", "127.0.0.1:8001", "engine host:port")
	server := flag.String("server", "fasthttp", "the server side: fasthttp or net/http")
	flag.Parse()

	client := &fasthttp.HostClient{
		Addr:               *upstream,
		MaxConns:           1024,
		StreamResponseBody: true,
		ReadTimeout:        60 * time.Second,
		WriteTimeout:       60 * time.Second,
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "msg=\"fastproxy listening\" addr=%s upstream=%s server=%s\n", ln.Addr(), *upstream, *server)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	switch *server {
	case "fasthttp":
		srv := &fasthttp.Server{Handler: fastHandler(client), StreamRequestBody: false, ReadTimeout: 60 * time.Second}
		go func() { <-ctx.Done(); _ = srv.Shutdown() }()
		if err := srv.Serve(ln); err != nil {
			log.Fatal(err)
		}
	case "net/http":
		srv := &http.Server{Handler: netHandler(client), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	default:
		log.Fatalf("--server %q: want fasthttp or net/http", *server)
	}
}

// fastHandler proxies with fasthttp on both sides: the request as it came,
// the answer streamed back with a flush after every read.
func fastHandler(client *fasthttp.HostClient) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		req := fasthttp.AcquireRequest()
		ctx.Request.CopyTo(req)
		req.SetHost(client.Addr)
		resp := fasthttp.AcquireResponse()
		if err := client.Do(req, resp); err != nil {
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			return
		}
		fasthttp.ReleaseRequest(req)
		ctx.SetStatusCode(resp.StatusCode())
		ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
		body := resp.BodyStream()
		if body == nil {
			ctx.SetBody(resp.Body())
			fasthttp.ReleaseResponse(resp)
			return
		}
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer fasthttp.ReleaseResponse(resp)
			buf := make([]byte, 32<<10)
			for {
				n, err := body.Read(buf)
				if n > 0 {
					if _, werr := w.Write(buf[:n]); werr != nil || w.Flush() != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// netHandler proxies with net/http's server and fasthttp's client.
func netHandler(client *fasthttp.HostClient) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		req.Header.SetMethod(r.Method)
		req.SetRequestURI(r.URL.RequestURI())
		req.SetHost(client.Addr)
		for k, vs := range r.Header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req.SetBody(b)
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		if err := client.Do(req, resp); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", string(resp.Header.ContentType()))
		body := resp.BodyStream()
		if body == nil {
			w.Header().Set("Content-Length", fmt.Sprint(len(resp.Body())))
			w.WriteHeader(resp.StatusCode())
			_, _ = w.Write(resp.Body())
			return
		}
		w.WriteHeader(resp.StatusCode())
		rc := http.NewResponseController(w)
		buf := make([]byte, 32<<10)
		for {
			n, err := body.Read(buf)
			if n > 0 {
				if _, werr := w.Write(buf[:n]); werr != nil || rc.Flush() != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
}
