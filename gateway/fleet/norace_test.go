//go:build !race

package fleet

// raceEnabled is true when the race detector is on.
const raceEnabled = false
