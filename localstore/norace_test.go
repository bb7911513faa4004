//go:build !race

package localstore_test

const raceEnabled = false
