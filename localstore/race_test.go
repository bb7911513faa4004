//go:build race

package localstore_test

const raceEnabled = true
