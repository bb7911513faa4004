package benchmarks

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// inFlightOn is one acquire of a lease of our in-flight limit on store and its release,
// as an allowFunc: a request's whole cost of the limit.
func inFlightOn(b *testing.B, store ratelimit.Store) allowFunc {
	l, err := ratelimit.NewInFlight(store, limit, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context, key string) bool {
		lease, _, err := l.Acquire(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			b.Fatal(err)
		}
		return lease != nil
	}
}

// chanSemaphore is the usual answer in one process, which no peer library packages: a
// buffered channel per key, in a sync.Map. It holds no lease that expires, and counts
// in one process only.
func chanSemaphore(*testing.B) allowFunc {
	var m sync.Map
	return func(_ context.Context, key string) bool {
		v, ok := m.Load(key)
		if !ok {
			v, _ = m.LoadOrStore(key, make(chan struct{}, limit))
		}
		sem := v.(chan struct{})
		select {
		case sem <- struct{}{}:
			<-sem
			return true
		default:
			return false
		}
	}
}

// BenchmarkInFlight: one acquire and its release per op, with a limit of 1000 leases that
// never runs out: in memory, serially on one key and in parallel over 1024 keys, beside
// a channel semaphore per key; on Redis (REDIS_ADDR, or a server it starts), serially and
// from 32 callers, coalescing (the default) and one call at a time. Each op is two
// decisions: acquires+releases/s counts ops.
func BenchmarkInFlight(b *testing.B) {
	for _, impl := range []struct {
		name string
		make func(*testing.B) allowFunc
	}{
		{"memory/ratelimit-inflight", func(b *testing.B) allowFunc { return inFlightOn(b, localstore.New()) }},
		{"memory/chan-semaphore", chanSemaphore},
	} {
		b.Run(impl.name+"/serial-1key", func(b *testing.B) { serial(b, impl.make(b)) })
		b.Run(impl.name+"/parallel-1024keys", func(b *testing.B) {
			overKeys(b, impl.make(b), 0)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acquires+releases/s")
		})
	}
	addr := redistest.Addr(b)
	for _, impl := range []struct {
		name string
		opts []redisstore.Option
	}{
		{"redis/ratelimit-inflight", nil},
		{"redis/ratelimit-inflight-onebyone", []redisstore.Option{redisstore.WithMaxBatch(1)}},
	} {
		make := func(b *testing.B) allowFunc {
			return inFlightOn(b, redisstore.New(newClient(b, addr), append(impl.opts, redisstore.WithPrefix("inflight"))...))
		}
		b.Run(impl.name+"/serial-1key", func(b *testing.B) { serial(b, make(b)) })
		b.Run(impl.name+"/parallel-32callers", func(b *testing.B) {
			overKeys(b, make(b), callers)
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "acquires+releases/s")
		})
	}
}
