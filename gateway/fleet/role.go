package fleet

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrUnknownRole wraps the error [ParseRole] returns for a value that
// names no role.
var ErrUnknownRole = errors.New("unknown engine role")

// Role is an engine's part in prefill/decode disaggregation (vLLM's
// NixlConnector P/D, as llm-d runs it): a prefill engine computes a
// prompt's KV cache and hands it over, a decode engine generates from a KV
// cache it pulls, and an engine of RoleBoth does whole generations. The
// zero value is RoleBoth, so an engine configured without a role serves
// whole generations as before.
type Role uint8

// The roles, in the order [Role.String] names them.
const (
	// RoleBoth does whole generations, prefill and decode (the default;
	// llm-d's label value "prefill-decode").
	RoleBoth Role = iota
	// RolePrefill does the prefill of disaggregated requests only: it
	// takes no whole generation while the route has another engine.
	RolePrefill
	// RoleDecode does the decode of disaggregated requests, and whole
	// generations.
	RoleDecode
)

// Role names as [ParseRole] takes them and [Role.String] gives them.
const (
	RoleBothName    = "both"
	RolePrefillName = "prefill"
	RoleDecodeName  = "decode"
	// RolePrefillDecodeName is llm-d's llm-d.ai/role label value for an
	// engine doing both, taken as RoleBoth.
	RolePrefillDecodeName = "prefill-decode"
)

// String returns "both", "prefill" or "decode" (the value of
// /admin/engines' role and of the switchboard.engine.role attribute), and
// "Role(n)" for a value out of range.
func (r Role) String() string {
	switch r {
	case RoleBoth:
		return RoleBothName
	case RolePrefill:
		return RolePrefillName
	case RoleDecode:
		return RoleDecodeName
	}
	return "Role(" + strconv.Itoa(int(r)) + ")"
}

// ParseRole returns the role named s: "" or "both" (RoleBoth),
// "prefill", "decode", or llm-d's "prefill-decode" (RoleBoth). Any other
// value is an error wrapping [ErrUnknownRole] that names it and the
// accepted ones.
func ParseRole(s string) (Role, error) {
	switch s {
	case "", RoleBothName, RolePrefillDecodeName:
		return RoleBoth, nil
	case RolePrefillName:
		return RolePrefill, nil
	case RoleDecodeName:
		return RoleDecode, nil
	}
	return RoleBoth, fmt.Errorf("%w %q: want %s, %s, %s or %s (empty: %s)", ErrUnknownRole, s,
		RolePrefillName, RoleDecodeName, RoleBothName, RolePrefillDecodeName, RoleBothName)
}
