package gateway

import "github.com/switchboard-gw/switchboard/routing"

// outcomeOf classifies an attempt's end for outlier detection (see
// routing.Outcome; the attempt reports it with fleet.Fleet.Report): status
// is the engine's response status (0 before headers), errType the
// attempt's error.type ("" for success, an ErrType* value, or the engine's
// status in decimal). Allocation-free.
func outcomeOf(status int, errType string) routing.Outcome {
	switch errType {
	case "":
		return routing.OutcomeSuccess
	case ErrTypeConnect:
		return routing.OutcomeConnectFailure
	case ErrTypeHeaderTimeout, ErrTypeFirstToken, ErrTypeIdleTimeout, ErrTypeAttemptTimeout:
		return routing.OutcomeTimeout
	case ErrTypeEngineDisconnect, ErrTypeStreamError:
		return routing.OutcomeServerError
	}
	// The engine's own error status: 5xx counts; 4xx (429 included: the
	// engine shedding load is overload, for retries and circuit breaking)
	// says nothing about the engine.
	if status >= 500 && status <= 599 && isStatus(errType, status) {
		return routing.OutcomeServerError
	}
	// client_cancelled, client_stalled, server_shutdown, request_timeout
	// (the whole request's budget, spent partly elsewhere), panic and
	// _OTHER (the gateway's own faults), 4xx.
	return routing.OutcomeNeutral
}

// isStatus reports whether s is the three-digit decimal status.
func isStatus(s string, status int) bool {
	return len(s) == 3 && s[0] == byte('0'+status/100) && s[1] == byte('0'+status/10%10) && s[2] == byte('0'+status%10)
}
