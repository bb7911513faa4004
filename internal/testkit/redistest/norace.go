//go:build !race

package redistest

// RaceEnabled says the race detector is on (see race.go).
const RaceEnabled = false
