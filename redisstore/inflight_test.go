package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// Each key's leases are one sorted set under the key's hash tag, whose TTL follows its
// latest lease, and which is gone once every lease has expired or been released.
func TestInFlightKeysAndTTL(t *testing.T) {
	client := redistest.Start(t).Client()
	ctx := context.Background()
	clk := clock.NewFake(limitertest.Start)
	l, err := ratelimit.NewInFlight(redisstore.New(client, redisstore.WithClock(clk), redisstore.WithPrefix("ttl")),
		5, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pttl := func(name string) time.Duration {
		t.Helper()
		d, err := client.PTTL(ctx, name).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	first, _, err := l.Acquire(ctx, "tenant")
	if err != nil || first == nil {
		t.Fatalf("Acquire = %v, %v", first, err)
	}
	keys, err := client.Keys(ctx, "ttl:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || !strings.HasSuffix(keys[0], ":{tenant}") || !strings.HasPrefix(keys[0], "ttl:inflight:leases:") {
		t.Fatalf("keys = %q; want one ttl:inflight:leases:<namespace>:{tenant}", keys)
	}
	name := keys[0]
	if got := pttl(name); got <= 9*time.Second || got > 10*time.Second {
		t.Errorf("TTL after the first lease = %v; want its 10s", got)
	}
	clk.Advance(4 * time.Second)
	second, _, err := l.Acquire(ctx, "tenant")
	if err != nil || second == nil {
		t.Fatalf("Acquire = %v, %v", second, err)
	}
	if got := pttl(name); got <= 9*time.Second || got > 10*time.Second {
		t.Errorf("TTL after a later lease = %v; want 10s again (the latest lease's)", got)
	}
	clk.Advance(4 * time.Second)
	if held, err := first.Extend(ctx); err != nil || !held {
		t.Fatalf("Extend = %v, %v", held, err)
	}
	if got := pttl(name); got <= 9*time.Second || got > 10*time.Second {
		t.Errorf("TTL after an extension = %v; want 10s (the extended lease's)", got)
	}
	if n, err := client.ZCard(ctx, name).Result(); err != nil || n != 2 {
		t.Errorf("ZCARD = %d, %v; want 2 leases", n, err)
	}
	for _, x := range []*ratelimit.Lease{first, second} {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := client.Exists(ctx, name).Result(); err != nil || n != 0 {
		t.Errorf("after every release, EXISTS = %d, %v; want the key gone", n, err)
	}
}

// A Redis restarted empty loses the leases it held, and no more: the limit then admits
// that many more (the holders are still at work), the old leases' releases free nobody's
// place, and each release of a new lease lets exactly one more in.
func TestInFlightRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	ctx := context.Background()
	store := redisstore.New(client, freshPrefix())
	l, err := ratelimit.NewInFlight(store, 10, time.Minute, ratelimit.WithNamespace("x"))
	if err != nil {
		t.Fatal(err)
	}
	acquire := func(n int) (got []*ratelimit.Lease) {
		t.Helper()
		for range n {
			lease, _, err := l.Acquire(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			if lease != nil {
				got = append(got, lease)
			}
		}
		return got
	}
	before := acquire(4)
	if len(before) != 4 {
		t.Fatalf("admitted %d of 4", len(before))
	}
	srv.Kill()
	srv.Restart()
	redistest.Eventually(t, "the store deciding again", func() bool {
		_, err := store.Apply(ctx, core.Request{Key: "k", N: 1, Spec: &core.Spec{Algorithm: concurrency.Algorithm(), Namespace: "x", Rule: core.Rule(l.Rule()), Op: core.OpPeek}})
		return err == nil
	})
	after := acquire(15)
	if len(after) != 10 {
		t.Fatalf("after the restart, 15 acquires admitted %d; want the whole limit, 10", len(after))
	}
	for _, x := range before {
		if err := x.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := acquire(5); len(got) != 0 {
		t.Fatalf("releases of leases lost in the restart let %d in; want 0", len(got))
	}
	if err := after[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := acquire(5); len(got) != 1 {
		t.Fatalf("one release let %d in; want 1", len(got))
	}
}
