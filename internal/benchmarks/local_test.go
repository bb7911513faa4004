package benchmarks

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"golang.org/x/time/rate"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Every implementation enforces the same rule: 1000 per second, burst 1000.
const limit = 1000

var keys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = "tenant-" + strconv.Itoa(i) + ":route"
	}
	return k
}()

// allowFunc is one decision; the bool is whether it was allowed.
type allowFunc func(ctx context.Context, key string) bool

// ours is a limiter of this library, called through the ratelimit.Limiter interface as
// applications hold it.
func ours[L ratelimit.Limiter](newL func(ratelimit.Store, ratelimit.Rule, ...ratelimit.Option) (L, error), opts ...localstore.Option) func(b *testing.B) allowFunc {
	return func(b *testing.B) allowFunc {
		var l ratelimit.Limiter
		l, err := newL(localstore.New(opts...), ratelimit.PerSecond(limit))
		if err != nil {
			b.Fatal(err)
		}
		return func(ctx context.Context, key string) bool {
			d, err := l.Allow(ctx, key)
			return err == nil && d.Allowed
		}
	}
}

// leased is the token bucket on hotkey.Leases over localstore (standing in for Redis, as
// a core.Lender): every key is asked of until its lease is in hand, so that what is
// measured is a decision from a lease.
func leased(b *testing.B) allowFunc {
	p, err := hotkey.NewLeases(localstore.New())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close(context.Background()) })
	l, err := tokenbucket.New(p, ratelimit.PerSecond(limit))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for deadline := time.Now().Add(5 * time.Second); p.Stats().Leases < len(keys); {
		if time.Now().After(deadline) {
			b.Fatalf("%d keys leased of %d after 5s", p.Stats().Leases, len(keys))
		}
		for _, k := range keys {
			l.Allow(ctx, k)
		}
	}
	return func(ctx context.Context, key string) bool {
		d, err := l.Allow(ctx, key)
		return err == nil && d.Allowed
	}
}

func xrate(b *testing.B) allowFunc {
	var m sync.Map
	return func(_ context.Context, key string) bool {
		v, ok := m.Load(key)
		if !ok {
			v, _ = m.LoadOrStore(key, rate.NewLimiter(limit, limit))
		}
		return v.(*rate.Limiter).Allow()
	}
}

func sethvargo(b *testing.B) allowFunc {
	store, err := memorystore.New(&memorystore.Config{Tokens: limit, Interval: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close(context.Background()) })
	return func(ctx context.Context, key string) bool {
		_, _, _, ok, err := store.Take(ctx, key)
		return err == nil && ok
	}
}

func localImplementations(b *testing.B) []struct {
	name string
	make func(*testing.B) allowFunc
} {
	coarse := clock.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	return []struct {
		name string
		make func(*testing.B) allowFunc
	}{
		{"ratelimit-tokenbucket", ours(tokenbucket.New)},
		{"ratelimit-tokenbucket-coarseclock", ours(tokenbucket.New, localstore.WithClock(coarse))},
		{"ratelimit-leakybucket", ours(leakybucket.New)},
		{"ratelimit-fixedwindow", ours(fixedwindow.New)},
		{"ratelimit-slidingwindow", ours(slidingwindow.New)},
		{"ratelimit-slidinglog", ours(slidinglog.New)},
		{"ratelimit-tokenbucket-leases", leased},
		{"x-time-rate-syncmap", xrate},
		{"sethvargo-memorystore", sethvargo},
	}
}

// BenchmarkLocal: in-memory decisions, one key serially and 1024 keys in parallel.
func BenchmarkLocal(b *testing.B) {
	for _, impl := range localImplementations(b) {
		b.Run(impl.name+"/serial-1key", func(b *testing.B) { serial(b, impl.make(b)) })
		b.Run(impl.name+"/parallel-1024keys", func(b *testing.B) { overKeys(b, impl.make(b), 0) })
	}
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }

// serial runs allow on one key, one call after another.
func serial(b *testing.B, allow allowFunc) {
	ctx := context.Background()
	allow(ctx, keys[0])
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		allow(ctx, keys[0])
	}
}

// overKeys runs allow in parallel over the 1024 keys, each decided once first: from
// callers goroutines, or GOMAXPROCS when callers is 0.
func overKeys(b *testing.B, allow allowFunc, callers int) {
	ctx := context.Background()
	for _, k := range keys {
		allow(ctx, k)
	}
	var worker atomic.Int64
	if callers > 0 {
		b.SetParallelism(callers / max(1, testingProcs()))
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)) * 97
		for pb.Next() {
			allow(ctx, keys[i%len(keys)])
			i++
		}
	})
}
