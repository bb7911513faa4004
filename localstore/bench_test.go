package localstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// BenchmarkApply is one decision on an existing key, for every algorithm, straight on the
// store (the limiters add a call); the peer comparison is in internal/benchmarks.
func BenchmarkApply(b *testing.B) {
	coarse := clock.NewCoarse(time.Millisecond)
	defer coarse.Stop()
	for _, c := range []struct {
		name string
		clk  clock.Clock
	}{{"monotonic", clock.NewMonotonic()}, {"coarse", coarse}} {
		for _, k := range limitertest.Kinds {
			b.Run(c.name+"/"+k.Name, func(b *testing.B) {
				s := localstore.New(localstore.WithClock(c.clk))
				req := ratelimit.Request{Algorithm: k.Algorithm, Key: "tenant-1:route", Rule: ratelimit.PerSecond(1000), N: 1}
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					if _, err := s.Apply(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkLimiterAllow(b *testing.B) {
	l, err := tokenbucket.New(localstore.New(), ratelimit.PerSecond(1000))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, "tenant-1:route"); err != nil {
			b.Fatal(err)
		}
	}
}
