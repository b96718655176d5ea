package testutil

// RefusedAddr is a loopback address that refuses connections: port 1,
// which no test can listen on (the kernel never hands a privileged port to
// a listener on port 0, and no service of a test machine takes tcpmux).
// Tests that need an engine that is down use it rather than the port of a
// listener they closed, which a test running beside them may be given
// next (its server would then answer: a 404 where a refusal was meant).
const RefusedAddr = "127.0.0.1:1"

// RefusedURL is RefusedAddr as an http URL.
const RefusedURL = "http://" + RefusedAddr
