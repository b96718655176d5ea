//go:build race

package routing

// raceEnabled is true when the race detector is on: every atomic operation
// then costs about a microsecond, so the heaviest loops take a cheaper path.
const raceEnabled = true
