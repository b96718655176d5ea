// Package sse frames a Server-Sent Events byte stream into complete events so
// a proxy can forward each one as soon as it is whole and inspect it on the
// way through.
//
// The gateway reads an engine's streaming response in arbitrary chunks and
// hands each chunk to [Scanner.Push]. Push returns the bytes of every event
// the chunk completed, ready to write and flush to the client unchanged, and
// calls back once per event with its parsed fields, so TTFT, inter-token
// latency and usage are taken from complete events only. Nothing is ever
// rewritten: the client receives the engine's stream byte for byte, comments
// and keep-alives included.
//
// # Framing
//
// Framing follows the WHATWG HTML "server-sent events" parsing rules. Lines
// end with "\n", "\r\n" or "\r"; a blank line ends an event. A line starting
// with ':' is a comment. Other lines are fields: the name is everything up to
// the first ':', and the value is the rest with one leading space removed.
// "data" values are joined with "\n" into [Event.Data]; the last "event"
// value is [Event.Name]; "id", "retry" and unknown fields are framed but not
// reported. An event made only of comments, such as ": keep-alive", is
// reported with [Event.Comment] set. A leading UTF-8 byte order mark is
// ignored.
//
// Events may be split anywhere across reads, including inside a multi-byte
// UTF-8 sequence or between the "\r" and "\n" of a line terminator: a line
// that ends with a '\r' at the end of the available bytes is re-examined when
// the next read arrives, so "\r"+"\n" is never mistaken for two line ends.
// The one exception is a blank line that is a bare '\r' at the end of a read:
// it completes its event at once (waiting could delay the event for as long as
// the engine is silent), and a "\n" that follows it in the next read is
// forwarded on its own, as the SSE spec's empty dispatch.
//
// # Limits
//
// [NewScanner] takes the largest event to parse. A longer event is counted by
// [Scanner.Overflows] and forwarded as its bytes arrive without a callback,
// and the Scanner resynchronises at the next blank line, so one oversized or
// malformed event bounds memory without breaking the stream.
//
// # Allocation
//
// Push copies each read into one buffer that is reused for the whole stream
// (and across streams via [Scanner.Reset]); it grows only to the largest
// event plus one read. Events are slices of that buffer, valid during the
// callback: single-line data aliases it, and multi-line data is joined in a
// reused scratch buffer, so a stream in steady state allocates nothing.
// Finding line ends uses [bytes.IndexByte] and each byte is searched once,
// however an event is split.
//
// A Scanner is not safe for concurrent use: use one per stream.
package sse
