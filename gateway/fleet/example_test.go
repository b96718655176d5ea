package fleet_test

import (
	"fmt"

	"github.com/switchboard-gw/switchboard/gateway/fleet"
)

// ExampleParseRole reads llm-d's llm-d.ai/role label values.
func ExampleParseRole() {
	for _, v := range []string{"prefill", "decode", "prefill-decode", ""} {
		r, _ := fleet.ParseRole(v)
		fmt.Printf("%q: %s\n", v, r)
	}
	_, err := fleet.ParseRole("encode")
	fmt.Println(err)
	// Output:
	// "prefill": prefill
	// "decode": decode
	// "prefill-decode": both
	// "": both
	// unknown engine role "encode": want prefill, decode, both or prefill-decode (empty: both)
}
