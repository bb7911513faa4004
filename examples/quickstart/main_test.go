package main

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// TestSimulate pins what each algorithm admits of the quickstart's traffic, 4 per second:
// the burst of 6 at 0.8 s, then one request every 200 ms from 1.0 s to 2.6 s.
func TestSimulate(t *testing.T) {
	want := map[string]result{
		// 4 of the burst; refilled at 1 per 250 ms, so every fifth steady request waits
		"tokenbucket": {burst: "++++..", steady: ".++++.+++", allowed: 11, denied: 4},
		// the same pace, but each admitted request waits its turn in the queue
		"leakybucket": {burst: "++++..", steady: ".++++.+++", allowed: 11, denied: 4, longestDelay: 750 * time.Millisecond},
		// a new window at 1.0 s: 4 more right after the burst, 8 in 200 ms
		"fixedwindow": {burst: "++++..", steady: "++++.++++", allowed: 12, denied: 3},
		// the burst weighs on the next window until its weight decays
		"slidingwindow": {burst: "++++..", steady: "..++++.+.", allowed: 9, denied: 6},
		// nothing until the burst is a full second old, at 1.8 s
		"slidinglog": {burst: "++++..", steady: "....++++.", allowed: 8, denied: 7},
	}
	for _, alg := range algorithms {
		got, err := simulate(alg, ratelimit.PerSecond(4))
		if err != nil {
			t.Fatal(err)
		}
		if got != want[alg.name] {
			t.Errorf("%s: got %+v; want %+v", alg.name, got, want[alg.name])
		}
	}
}
