package main

import (
	"context"
	"fmt"
	"os"
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
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
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

// target is one server of the protocol under test, and what it decides on.
type target struct {
	name   string
	client func(*testing.B) rlsv3.RateLimitServiceClient
}

// targets are our server on localstore (the server and gRPC alone) and on a
// redis-server (REDIS_ADDR, or one it starts), coalescing; with RLS_ADDR=host:port, also
// another server of the protocol (envoyproxy/ratelimit, say) that serves benchRules, as
// "external".
func targets(b *testing.B) []target {
	d, err := envoyrules.Parse("bench.yaml", []byte(benchRules))
	if err != nil {
		b.Fatal(err)
	}
	rules, err := envoyrules.New(d)
	if err != nil {
		b.Fatal(err)
	}
	ours := func(store func(*testing.B) ratelimit.Store) func(*testing.B) rlsv3.RateLimitServiceClient {
		return func(b *testing.B) rlsv3.RateLimitServiceClient {
			return serve(b, newServer(store(b), rules, newMetrics(), true, quiet()))
		}
	}
	ts := []target{
		{"localstore", ours(func(*testing.B) ratelimit.Store { return localstore.New() })},
		{"redis", ours(func(b *testing.B) ratelimit.Store {
			c := redis.NewClient(&redis.Options{Addr: redistest.Addr(b), PoolSize: 32})
			b.Cleanup(func() { c.Close() })
			return redisstore.New(c, redisstore.WithPrefix(fmt.Sprintf("rlsbench%d", time.Now().UnixNano())))
		})},
	}
	if addr := os.Getenv("RLS_ADDR"); addr != "" {
		ts = append(ts, target{"external", func(b *testing.B) rlsv3.RateLimitServiceClient { return newClient(b, addr) }})
	}
	return ts
}

// benchRequests are requests of 1000 API keys, each with three descriptors (api_key;
// api_key and path; path), decided together.
func benchRequests() []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		key := fmt.Sprintf("tenant-%d", i)
		reqs[i] = request(1, "api_key="+key, "api_key="+key+",path=/orders", "path=/orders")
		reqs[i].Domain = "bench"
	}
	return reqs
}

// BenchmarkShouldRateLimit: throughput, ShouldRateLimit through each target over the
// loopback with go-control-plane's generated client, from 64 callers, each waiting for
// its answer before the next call (calls/s, and each call's latency, p50 and p99).
//
//	cd examples && go test -run '^$' -bench 'ShouldRateLimit$' -benchtime 20000x ./rls
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, tg := range targets(b) {
		b.Run(tg.name, func(b *testing.B) {
			client, reqs := tg.client(b), benchRequests()
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
			reportPercentiles(b, lat)
		})
	}
}

// BenchmarkShouldRateLimitLatency: latency at a fixed offered load, 2,000 calls a second
// (6,000 descriptors), each in a goroutine of its own as a proxy's requests are, measured
// from the instant it was due. Run it with a fixed count: -benchtime 6000x is three
// seconds of load.
func BenchmarkShouldRateLimitLatency(b *testing.B) {
	const rate = 2_000
	for _, tg := range targets(b) {
		b.Run(tg.name+"/2k-per-second", func(b *testing.B) {
			client, reqs := tg.client(b), benchRequests()
			for _, r := range reqs[:10] { // connected and warm
				if _, err := client.ShouldRateLimit(context.Background(), r); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, b.N)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for sent := 0; sent < b.N; {
				due := int(time.Since(start) * rate / time.Second)
				for ; sent < min(due+1, b.N); sent++ {
					i, at := sent, start.Add(time.Duration(sent)*time.Second/rate)
					wg.Go(func() {
						if _, err := client.ShouldRateLimit(context.Background(), reqs[i%len(reqs)]); err != nil {
							b.Error(err)
						}
						lat[i] = time.Since(at)
					})
				}
				time.Sleep(200 * time.Microsecond) // the pace of the offered load
			}
			wg.Wait()
			b.StopTimer()
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
