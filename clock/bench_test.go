package clock_test

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
)

var sink int64

// BenchmarkRead is the cost of reading each clock as the stores do, through a Clock held
// once: go test -run '^$' -bench Read ./clock
func BenchmarkRead(b *testing.B) {
	b.ReportAllocs()
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			sink += time.Now().UnixNano()
		}
	})
	b.Run("Monotonic", func(b *testing.B) {
		var c clock.Clock = clock.NewMonotonic() // held as a Clock, as the stores hold it
		for b.Loop() {
			sink += clock.UnixNano(c)
		}
	})
	b.Run("Coarse", func(b *testing.B) {
		coarse := clock.NewCoarse(time.Millisecond) // its goroutine only runs here
		defer coarse.Stop()
		var c clock.Clock = coarse
		for b.Loop() {
			sink += clock.UnixNano(c)
		}
	})
}
