// Package h1 is a lean HTTP/1.1 client for the gateway's engines: a
// [Transport] implementing http.RoundTripper over plain TCP, with
// keep-alive pools per host:port, meant to replace http.Transport behind
// gateway.WithTransport without changing what the gateway sees.
//
// http.Transport runs two goroutines per connection (a read loop and a
// write loop) and hands every request, response and body end between them
// and the caller over channels, with per-request bookkeeping on the way;
// that is more than half of the gateway's CPU per request. Here the caller's
// goroutine does everything: it checks a connection out, writes the request,
// reads the response head, and later reads the body. No goroutine belongs to
// a connection and no channel is used outside the wait for a free slot.
//
// # What it handles
//
// Requests with the "http" scheme, over HTTP/1.1. Everything else goes to
// the fallback RoundTripper given to [New] (an *http.Transport): https (TLS
// engines and hosted providers), CONNECT, Upgrade, Expect: 100-continue,
// request trailers, a Transfer-Encoding other than chunked, non-ASCII
// hosts, a body of unknown length on GET-like methods (net/http probes it),
// Request.Cancel without a context deadline (http.Client's Timeout sets
// Cancel and a deadline no later: the deadline is what is watched here).
// httptrace hooks are not called, and responses are never
// decompressed (the gateway turns compression off; no Accept-Encoding is
// added).
//
// # Requests
//
// The request is written as net/http's Request.write writes it
// (net/http/request.go, transfer.go): the request line with
// URL.RequestURI(), Host (Request.Host or the URL's, sent empty when
// invalid, zone removed), User-Agent "Go-http-client/1.1" unless the header
// has a User-Agent key (an empty one sends none), Connection: close for
// Request.Close, Content-Length when the length is known and positive (and
// 0 for a body-less POST, PUT or PATCH), Transfer-Encoding: chunked for a
// body of unknown length, then the header's fields but Host, User-Agent,
// Content-Length, Transfer-Encoding and Trailer, skipping keys with no
// values (the gateway's nil Idempotency-Key). Header names and values are
// validated first (Transport.roundTrip's validateHeaders). Unlike net/http
// the fields are not sorted. The head is appended into a pooled buffer, so
// it costs no allocation; a body that fits behind it goes out in the same
// write, a larger in-memory body (one with WriteTo, which io.NopCloser
// keeps) in one writev with it, any other in buffer-sized writes. A chunked
// body is sent one chunk per Read, each written at once. The request body
// is always closed. A body longer or shorter than its ContentLength fails the
// request, with net/http's messages; only the announced bytes are sent.
//
// The whole request is written before the response is read. net/http
// writes in a goroutine of its own while it reads, so an engine that
// answers early (a 413) and stops reading still gets its answer through;
// here the write blocks until the engine reads on or the context ends, and
// an engine that closes the connection instead makes the round trip fail
// with the write's error. vLLM reads every request body before answering,
// and nginx drains a body it refused (lingering close).
//
// # Responses
//
// The head is parsed as net/http's ReadResponse and readTransfer parse it
// (response.go, transfer.go, net/textproto): the status line (HTTP/1.x
// only), header keys in canonical form (common ones interned), values
// trimmed, obs-fold lines joined, Pragma: no-cache read as Cache-Control;
// malformed lines, status lines, versions, framing and chunked encodings
// fail with an error wrapping [ErrMalformedResponse]. A key with a space
// before its colon is rejected (textproto keeps it uncanonicalized). 1xx
// heads but 101 are skipped; a 101 is an error (no request here asks for an
// upgrade). The head, 1xx heads included, is bounded by
// [WithMaxResponseHeaderBytes] ([ErrResponseHeaderTooLarge]).
//
// The Response has Status, StatusCode, Proto, ProtoMajor and ProtoMinor,
// Header, ContentLength (-1 for chunked or close-delimited bodies; a HEAD
// response's Content-Length), TransferEncoding (a shared []string{"chunked"}:
// do not modify it), Close, Trailer (declared keys; values filled at the
// end of the body) and Request (the caller's request, also after a replay).
// Transfer-Encoding is removed from Header, Connection too when it says
// close, Content-Length when the body is chunked, as net/http does. HEAD,
// 1xx, 204 and 304 responses and zero-length bodies get http.NoBody and free
// the connection at once.
//
// Bodies are framed by Content-Length (a cut returns
// io.ErrUnexpectedEOF), chunked encoding (trailers read into
// Response.Trailer; net/http's bound on framing overhead) or the
// connection's close (then it is not reused). Reads return what has arrived
// without waiting for more, so a stream's events pass as they come. io.EOF
// comes with the last bytes when the end is already buffered.
//
// # Connection reuse
//
// A body's Close returns the connection to its pool only when the body was
// read to its clean end, neither side asked to close, no byte follows the
// response, and the context did not end. Any error, a body closed before its
// end, or a cancelled context closes the connection: the engine sees the
// disconnect (vLLM aborts the request and frees its KV-cache blocks).
// net/http does the same (bodyEOFSignal; it does not drain a body either).
// Close is idempotent and safe during a Read from another goroutine.
//
// Pools are per "host:port" (URL hosts spelled with or without the default
// port share one). Idle connections are reused newest first; each host has
// a timer that closes connections idle for [WithIdleConnTimeout], and a
// checkout discards timed-out ones too. [Transport.CloseIdleConnections]
// closes every idle connection (and the fallback's). [WithMaxConnsPerHost]
// bounds the connections of a host, dialing, busy and idle; a request that
// finds none free waits until one is released or its context ends.
// [Transport.ConnCounts] reports active, idle and waiting counts per host.
//
// # Cancellation
//
// The request's context ends the round trip in every phase: while waiting
// for a connection slot, dialing (net.Dialer.DialContext), writing the
// request, waiting for the response head (minutes for a non-streaming vLLM
// answer) and reading the body. For the whole exchange a context.AfterFunc
// is registered that closes the connection, which unblocks the read or
// write in progress; it is stopped when the body ends, and a connection
// whose AfterFunc ran is never reused. Like net/http (Transport.roundTrip,
// getConn, persistConn.roundTrip, bodyEOFSignal), a round trip or body read
// ended by the context returns context.Cause(ctx) itself, which the gateway's
// classify relies on. A failed dial returns the dialer's *net.OpError (Op
// "dial"; Timeout() is true for the connect timeout), unwrapped. A request
// body whose Read blocks is not interrupted (the connection still closes);
// the gateway's bodies are in memory.
//
// # Stale connections
//
// An engine closes idle keep-alive connections (uvicorn, vLLM's server,
// after 5 s idle; all of them when it stops). net/http notices the close in
// its read loop; here, at checkout, a connection idle for a second or more
// is checked with a non-blocking one-byte MSG_PEEK (on Linux, the BSDs and
// macOS; a syscall a busy pool, reusing connections sooner, does not pay):
// one the engine closed, reset or wrote to unasked (a 408 before closing)
// is dropped and the next one tried.
//
// What that cannot catch (a close crossing the request on the wire, a
// connection idle less than a second, other systems) is the keep-alive
// race, handled as net/http handles it: when a connection that served a
// response before fails before any byte of the response arrived, and not
// because of the context or the request body, the request is sent again on
// a new connection, once more at most per failure (a new connection that
// fails is the engine's failure), when net/http would replay it
// (persistConn.shouldRetryRequest, Request.isReplayable): nothing of it was
// written and it has no body or a GetBody; or it is a GET, HEAD, OPTIONS or
// TRACE, or has an Idempotency-Key or X-Idempotency-Key header (even with no
// values, which the gateway sets), and it has no body or a GetBody, which is
// called for the new body (the gateway's caps its re-sends and returns an
// error to stop them: that error is returned). A failed write on a reused
// connection counts as such a failure too (net/http replays it only when
// nothing was written). Unlike net/http, which tries the next idle
// connection, the replay always dials: the failed one was the newest idle
// connection, so the others are at least as likely to be stale.
//
// Bytes that follow a response and are already buffered keep its
// connection from being reused; bytes an engine sends to an idle
// connection reused within a second of its last response (or where it
// cannot be checked) are read as the next response.
//
// # Errors
//
// Besides the context's cause and dial errors: [ErrMalformedResponse],
// [ErrResponseHeaderTooLarge], [ErrNoFallback], request errors with
// net/http's messages ("net/http: invalid header field name ...",
// "http: ContentLength=... with Body length ..."), and connection errors
// wrapped as "h1: writing the request: ..." or "h1: reading the response:
// ..." (io.EOF or a reset: what the gateway classifies as
// engine_disconnect). Body reads return the connection's error, or
// io.ErrUnexpectedEOF.
package h1
