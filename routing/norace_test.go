//go:build !race

package routing

// raceEnabled is true when the race detector is on.
const raceEnabled = false
