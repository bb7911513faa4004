//go:build race

package main

// raceEnabled says the race detector is on: it slows the code it watches several times
// over, miniredis's Lua interpreter included.
const raceEnabled = true
