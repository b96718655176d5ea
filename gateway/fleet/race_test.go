//go:build race

package fleet

// raceEnabled is true when the race detector is on (it allocates, so the
// allocation tests skip).
const raceEnabled = true
