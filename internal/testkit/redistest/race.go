//go:build race

package redistest

// RaceEnabled says the race detector is on: it slows the code it watches several times
// over, and the tests that measure time against a budget take that into account.
const RaceEnabled = true
