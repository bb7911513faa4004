package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/envoyrules"
	"github.com/ratelimit-go/ratelimit/internal/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// benchRules never deny: what is measured is the cost of a decision.
const benchRules = `
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`

// BenchmarkShouldRateLimit: ShouldRateLimit through the gRPC server over the loopback,
// with go-control-plane's generated client, from 64 callers over 1000 API keys, each
// request with three descriptors (api_key; api_key and path; path), decided together.
// On localstore (the server and gRPC alone) and on a redis-server (REDIS_ADDR, or one
// it starts), coalescing. It reports calls/s and each call's latency, p50 and p99.
//
//	cd examples && go test -run '^$' -bench ShouldRateLimit -benchtime 20000x ./rls
func BenchmarkShouldRateLimit(b *testing.B) {
	d, err := envoyrules.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	rules, err := envoyrules.New(d)
	if err != nil {
		b.Fatal(err)
	}
	stores := []struct {
		name string
		make func(*testing.B) ratelimit.Store
	}{
		{"localstore", func(*testing.B) ratelimit.Store { return localstore.New() }},
		{"redis", func(b *testing.B) ratelimit.Store {
			c := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 32})
			b.Cleanup(func() { c.Close() })
			return redisstore.New(c, redisstore.WithPrefix(fmt.Sprintf("rlsbench%d", time.Now().UnixNano())))
		}},
	}
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			client := serve(b, newServer(st.make(b), rules, newMetrics(), true, quiet()))
			reqs := make([]*rlsv3.RateLimitRequest, 1000)
			for i := range reqs {
				key := fmt.Sprintf("tenant-%d", i)
				reqs[i] = request(1, "api_key="+key, "api_key="+key+",path=/orders", "path=/orders")
				reqs[i].Domain = "bench"
			}
			var next atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				own := make([]time.Duration, 0, 1024)
				for pb.Next() {
					r := reqs[next.Add(1)%int64(len(reqs))]
					start := time.Now()
					if _, err := client.ShouldRateLimit(context.Background(), r); err != nil {
						b.Error(err)
						return
					}
					own = append(own, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, own...)
				mu.Unlock()
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}
