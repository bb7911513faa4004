package localstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
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
				req := core.Request{Key: "tenant-1:route", N: 1, Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(ratelimit.PerSecond(1000))}}
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

// BenchmarkAlgorithms compares the five algorithms as an application calls them: each
// one's limiter (1000 a second) on a store of its own, one key serially and 1024 keys
// from every processor. Run it on your own machine:
//
//	go test -run '^$' -bench Algorithms -benchmem ./localstore
func BenchmarkAlgorithms(b *testing.B) {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i) + ":route"
	}
	ctx := context.Background()
	for _, k := range limitertest.Kinds {
		newLimiter := func(b *testing.B) ratelimit.Limiter {
			l, err := k.New(localstore.New(), ratelimit.PerSecond(1000))
			if err != nil {
				b.Fatal(err)
			}
			for _, key := range keys {
				if _, err := l.Allow(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
			return l
		}
		b.Run(k.Name+"/serial-1key", func(b *testing.B) {
			l := newLimiter(b)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.Allow(ctx, keys[0]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(k.Name+"/parallel-1024keys", func(b *testing.B) {
			l := newLimiter(b)
			var worker atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(worker.Add(1)) * 97 // each worker from its own place
				for pb.Next() {
					if _, err := l.Allow(ctx, keys[i%len(keys)]); err != nil {
						b.Error(err)
						return
					}
					i++
				}
			})
		})
	}
}
