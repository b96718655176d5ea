package gateway

// observeOutcome is told the outcome of every engine attempt when it ends
// (attempt.end, the single release path): the engine, the engine's
// response status (0 when no response headers arrived) and the attempt's
// error type ("" for success; the ErrType* values or an engine status).
// Outlier detection hangs off it.
func (p *Pool) observeOutcome(e *engine, status int, errType string) {}
