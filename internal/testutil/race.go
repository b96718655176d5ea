//go:build race

package testutil

// RaceEnabled is true when the race detector is on: it allocates, so
// allocation tests skip.
const RaceEnabled = true
