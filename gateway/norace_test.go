//go:build !race

package gateway

// raceEnabled is true when the race detector is on.
const raceEnabled = false
