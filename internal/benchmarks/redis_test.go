package benchmarks

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	goredisstore "github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/ulule/limiter/v3"
	ulule "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// callers is the number of goroutines deciding at once in the parallel benchmarks (and
// BenchmarkRedis runs 256 too); poolSize is each client's pool of connections.
const (
	callers  = 32
	poolSize = 32
)

func newClient(b *testing.B, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize})
	b.Cleanup(func() { c.Close() })
	return c
}

func oursRedis(pipeline bool, opts ...redisstore.Option) func(*testing.B, string) allowFunc {
	return func(b *testing.B, addr string) allowFunc {
		var client redis.Scripter = newClient(b, addr)
		if pipeline {
			ap, err := client.(*redis.Client).AutoPipeline()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { ap.Close() })
			client = ap
		}
		return oursOn(b, client, opts...)
	}
}

// oursOn is our token bucket on client, through the ratelimit.Limiter interface.
func oursOn(b *testing.B, client redis.Scripter, opts ...redisstore.Option) allowFunc {
	var l ratelimit.Limiter
	l, err := tokenbucket.New(redisstore.New(client, append(opts, redisstore.WithPrefix("ours"))...), ratelimit.PerSecond(limit))
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context, key string) bool {
		d, err := l.Allow(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		return d.Allowed
	}
}

func redisRate(b *testing.B, addr string) allowFunc { return redisRateOn(b, newClient(b, addr)) }

// redisRateAutoPipeline is redis_rate on go-redis's AutoPipeliner: its scripts, too, ride
// pipelines with other callers'.
func redisRateAutoPipeline(b *testing.B, addr string) allowFunc {
	ap, err := newClient(b, addr).AutoPipeline()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ap.Close() })
	return redisRateOn(b, ap)
}

func redisRateOn(b *testing.B, client redis.Scripter) allowFunc {
	l := redis_rate.NewLimiter(client.(interface {
		redis.Scripter
		Del(ctx context.Context, keys ...string) *redis.IntCmd
	}))
	rate := redis_rate.PerSecond(limit)
	return func(ctx context.Context, key string) bool {
		r, err := l.Allow(ctx, key, rate)
		if err != nil {
			b.Fatal(err)
		}
		return r.Allowed > 0
	}
}

func ululeLimiter(b *testing.B, addr string) allowFunc {
	store, err := ulule.NewStoreWithOptions(newClient(b, addr), limiter.StoreOptions{Prefix: "ulule"})
	if err != nil {
		b.Fatal(err)
	}
	l := limiter.New(store, limiter.Rate{Period: time.Second, Limit: limit})
	return func(ctx context.Context, key string) bool {
		r, err := l.Get(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		return !r.Reached
	}
}

func throttledLimiter(b *testing.B, addr string) allowFunc {
	store, err := goredisstore.NewCtx(newClient(b, addr), "throttled:")
	if err != nil {
		b.Fatal(err)
	}
	l, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{MaxRate: throttled.PerSec(limit), MaxBurst: limit})
	if err != nil {
		b.Fatal(err)
	}
	return func(ctx context.Context, key string) bool {
		limited, _, err := l.RateLimitCtx(ctx, key, 1)
		if err != nil {
			b.Fatal(err)
		}
		return !limited
	}
}

// BenchmarkRedis: decisions on one local redis-server (REDIS_ADDR, or one it starts), serially on one key (latency), and
// from 32 goroutines over 1024 keys (throughput), each implementation with its own client
// and a pool of 32 connections.
func BenchmarkRedis(b *testing.B) {
	addr := redistest.Addr(b) // REDIS_ADDR, or a redis-server started for the run
	for _, impl := range []struct {
		name string
		make func(*testing.B, string) allowFunc
	}{
		{"ratelimit-tokenbucket", oursRedis(false)},
		{"ratelimit-tokenbucket-onebyone", oursRedis(false, redisstore.WithMaxBatch(1))},
		{"ratelimit-tokenbucket-autopipeline", oursRedis(true)},
		{"redis_rate", redisRate},
		{"redis_rate-autopipeline", redisRateAutoPipeline},
		{"ulule-limiter", ululeLimiter},
		{"throttled", throttledLimiter},
	} {
		b.Run(impl.name+"/serial-1key", func(b *testing.B) { serial(b, impl.make(b, addr)) })
		for _, n := range []int{callers, 256} {
			b.Run(impl.name+"/parallel-"+strconv.Itoa(n)+"callers", func(b *testing.B) {
				overKeys(b, impl.make(b, addr), n)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}

// BenchmarkHotKey: 32 callers on one key, with a rule that never denies: redis_rate asks
// Redis for every decision; ours decides from a lease (hotkey.Leases), refilled in the
// background.
func BenchmarkHotKey(b *testing.B) {
	addr := redistest.Addr(b)
	const hot = "tenant-big:search"
	for _, impl := range []struct {
		name string
		make func(*testing.B) allowFunc
	}{
		{"ratelimit-leases", func(b *testing.B) allowFunc {
			p, err := hotkey.NewLeases(redisstore.New(newClient(b, addr), redisstore.WithPrefix("hot")))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { p.Close(context.Background()) })
			var l ratelimit.Limiter
			l, err = tokenbucket.New(p, ratelimit.PerSecond(1e9))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for deadline := time.Now().Add(5 * time.Second); p.Stats().Leases == 0; { // until the key is leased
				if time.Now().After(deadline) {
					b.Fatal("the hot key is not leased after 5s")
				}
				l.Allow(ctx, hot)
			}
			return func(ctx context.Context, key string) bool {
				d, err := l.Allow(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				return d.Allowed
			}
		}},
		{"redis_rate", func(b *testing.B) allowFunc {
			l := redis_rate.NewLimiter(newClient(b, addr))
			return func(ctx context.Context, key string) bool {
				r, err := l.Allow(ctx, key, redis_rate.PerSecond(1e9))
				if err != nil {
					b.Fatal(err)
				}
				return r.Allowed > 0
			}
		}},
	} {
		b.Run(impl.name, func(b *testing.B) {
			allow := impl.make(b)
			ctx := context.Background()
			allow(ctx, hot)
			b.SetParallelism(callers / max(1, testingProcs()))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					allow(ctx, hot)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// BenchmarkRedisLatency: decisions offered at a fixed rate, 20,000 a second over 1024
// keys, each in a goroutine of its own as a server's requests are: the latency of each
// from the instant it was due (so that a client falling behind shows), p50 and p99, for
// our store coalescing, ours one call per decision, and redis_rate. Run it with a fixed
// count: -benchtime 60000x is three seconds of load.
func BenchmarkRedisLatency(b *testing.B) {
	addr := redistest.Addr(b)
	const rate = 20_000
	for _, impl := range []struct {
		name string
		make func(*testing.B, string) allowFunc
	}{
		{"ratelimit-tokenbucket", oursRedis(false)},
		{"ratelimit-tokenbucket-onebyone", oursRedis(false, redisstore.WithMaxBatch(1))},
		{"redis_rate", redisRate},
	} {
		b.Run(impl.name+"/20k-per-second", func(b *testing.B) {
			allow := impl.make(b, addr)
			ctx := context.Background()
			for _, k := range keys {
				allow(ctx, k)
			}
			latency := make([]time.Duration, b.N)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for sent := 0; sent < b.N; {
				due := int(time.Since(start) * rate / time.Second) // offered by now
				for ; sent < min(due+1, b.N); sent++ {
					i, at := sent, start.Add(time.Duration(sent)*time.Second/rate)
					wg.Go(func() {
						allow(ctx, keys[i%len(keys)])
						latency[i] = time.Since(at)
					})
				}
				time.Sleep(200 * time.Microsecond) // the pace of the offered load
			}
			wg.Wait()
			b.StopTimer()
			slices.Sort(latency)
			b.ReportMetric(float64(latency[len(latency)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(latency[len(latency)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkRedisCluster: throughput on a 3-master Redis Cluster started for the run (its
// nodes on the same 2 vCPUs), 32 and 256 callers over 1024 keys spread over the masters:
// ours coalescing per master, ours one call per decision, and redis_rate.
func BenchmarkRedisCluster(b *testing.B) {
	cluster := redistest.StartCluster(b, 3)
	newCluster := func(b *testing.B) *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), PoolSize: poolSize})
		b.Cleanup(func() { c.Close() })
		return c
	}
	ours := func(opts ...redisstore.Option) func(*testing.B) allowFunc {
		return func(b *testing.B) allowFunc { return oursOn(b, newCluster(b), opts...) }
	}
	for _, impl := range []struct {
		name string
		make func(*testing.B) allowFunc
	}{
		{"ratelimit-tokenbucket", ours()},
		{"ratelimit-tokenbucket-onebyone", ours(redisstore.WithMaxBatch(1))},
		{"redis_rate", func(b *testing.B) allowFunc { return redisRateOn(b, newCluster(b)) }},
	} {
		for _, n := range []int{callers, 256} {
			b.Run(impl.name+"/parallel-"+strconv.Itoa(n)+"callers", func(b *testing.B) {
				overKeys(b, impl.make(b), n)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}

// BenchmarkRedisCPU: the CPU Redis spends on what hotkey.Leases asks of it. debits: a
// debit of a quiet key (each a new one), as Leases charges the events it admitted on
// trust, in a Lend of 100 partial debits a call; beside it, Apply's debits alone and 64
// at once (coalesced). loans: a lease's renewal (it gives back 2 and asks 5, numbered)
// of a key every one of 4 or 20 instances holds, 100 keys a Lend. redis-cpu-µs/op is
// Redis's user and system CPU over the debits, or the loans.
func BenchmarkRedisCPU(b *testing.B) {
	srv := redistest.Start(b)
	c := newClient(b, srv.Addr)
	st := redisstore.New(c, redisstore.WithPrefix("cpu"))
	debit := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(seedRule), Op: core.OpDebit}
	ctx := context.Background()
	measure := func(b *testing.B, n int, run func(from int)) {
		_, cpu0 := redisStats(b, c)
		for i := 0; b.Loop(); i++ {
			run(i * n)
		}
		_, cpu1 := redisStats(b, c)
		b.ReportMetric((cpu1-cpu0)/float64(b.N*n), "redis-cpu-µs/op")
	}
	const n = 20000
	b.Run("debits/lend-100", func(b *testing.B) {
		measure(b, n, func(from int) {
			for i := from; i < from+n; i += 100 {
				loans := make([]core.Loan, 100)
				for j := range loans {
					loans[j] = core.Loan{Key: fmt.Sprintf("l%d", i+j), Spec: debit, Want: 1}
				}
				if _, err := st.Lend(ctx, loans); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("debits/apply-alone", func(b *testing.B) {
		measure(b, n, func(from int) {
			for i := from; i < from+n; i++ {
				if _, err := st.Apply(ctx, core.Request{Key: fmt.Sprintf("a%d", i), N: 1, Spec: debit}); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("debits/apply-64", func(b *testing.B) {
		measure(b, n, func(from int) {
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					for i := from + g; i < from+n; i += 64 {
						if _, err := st.Apply(ctx, core.Request{Key: fmt.Sprintf("c%d", i), N: 1, Spec: debit}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	})
	loan := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(100_000))}
	for _, holders := range []int64{4, 20} {
		const keys = 500
		renew := func(seq int64) {
			for h := int64(1); h <= holders; h++ {
				for i := 0; i < keys; i += 100 {
					loans := make([]core.Loan, 100)
					for j := range loans {
						loans[j] = core.Loan{Key: fmt.Sprintf("h%d-%d", holders, i+j), Spec: loan, Holder: h, Want: 5, Give: 2,
							Share: holders, TTL: time.Minute, Seq: seq, Out: 3}
					}
					if _, err := st.Lend(ctx, loans); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		renew(1) // every instance holds every key
		seq := int64(1)
		b.Run(fmt.Sprintf("loans/holders-%d", holders), func(b *testing.B) {
			measure(b, int(holders)*keys, func(int) {
				seq++
				renew(seq)
			})
		})
	}
}
