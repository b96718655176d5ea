// Command blackhole accepts TCP connections on --listen and never answers
// nor closes them: a collector that is up but hung, for
// bench/telemetry/run.sh. It stops on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "blackhole:", err)
		os.Exit(1)
	}
	go func() {
		var held []net.Conn // kept open, never read: the peer's writes fill the buffers and stall
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
}
