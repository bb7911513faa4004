package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Behind Redis Sentinel (redis.NewFailoverClient, a *redis.Client to the master the
// sentinels name): decisions coalesce and AllowAll is one script, as on one server; when
// the master is killed under traffic, the sentinel promotes its replica and decisions are
// made again within seconds, on the new master.
func TestSentinelFailover(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	sentinel := redistest.StartSentinel(t, master, 1)
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    sentinel.Master,
		SentinelAddrs: []string{sentinel.Addr},
		MaxRetries:    -1,
		DialTimeout:   200 * time.Millisecond,
		ReadTimeout:   time.Second,
		WriteTimeout:  time.Second,
	})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, freshPrefix())
	limiter, err := tokenbucket.New(store, ratelimit.PerSecond(1_000_000), ratelimit.WithNamespace("sentinel"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := tokenbucket.New(store, ratelimit.PerHour(2), ratelimit.WithNamespace("plan"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// a failover client is one server at a time: two keys of different tags in one script
	for range 2 {
		if d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: limiter, Key: "a"}, ratelimit.Part{Limiter: other, Key: "b"}); err != nil || !d.Allowed {
			t.Fatalf("AllowAll behind the sentinel: %+v, %v", d, err)
		}
	}
	reqs := []core.Request{
		{Key: "b", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "plan", Rule: core.Rule(ratelimit.PerHour(2))}},
		{Key: "c", N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "sentinel", Rule: core.Rule(ratelimit.PerSecond(1_000_000))}}}
	if ds, err := store.ApplyAll(ctx, reqs); err != nil || ds[0].Allowed() || !ds[1].Allowed() {
		t.Fatalf("one script behind the sentinel: %+v, %v; want the plan's denial, atomic", ds, err)
	}

	var ok, failed atomic.Int64
	var lastOK atomic.Int64 // UnixNano of the latest decision made
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 { // traffic throughout
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				_, err := limiter.Allow(dctx, "hot")
				cancel()
				if err == nil {
					ok.Add(1)
					lastOK.Store(time.Now().UnixNano())
				} else {
					failed.Add(1)
				}
			}
		})
	}
	redistest.Eventually(t, "decisions under traffic", func() bool { return ok.Load() > 100 })
	master.Kill()
	killed := time.Now()
	redistest.Eventually(t, "the sentinel promoting the replica", func() bool {
		addr, err := sentinel.MasterAddr(ctx)
		return err == nil && addr == replica.Addr
	})
	redistest.Eventually(t, "decisions on the new master", func() bool {
		return lastOK.Load() > killed.UnixNano() && lastOK.Load() > time.Now().Add(-time.Second).UnixNano()
	})
	back := time.Since(killed)
	close(stop)
	wg.Wait()
	t.Logf("decisions back %v after the master was killed (%d made, %d failed meanwhile)", back.Round(time.Millisecond), ok.Load(), failed.Load())
	if failed.Load() == 0 {
		t.Error("no decision failed while the master was dead: the test did not see the failover")
	}
	role, err := replica.Client().Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Errorf("the replica's role after the failover: %v, %v", role, err)
	}
}

// Behind a Ring (redis.NewRing, keys sharded over servers by their hash tag): one call
// per decision, no coalescing; AllowAll is one atomic script when its keys share a hash
// tag, and otherwise taken one by one with refunds: all or none in the end, not atomic.
func TestRing(t *testing.T) {
	a, b := redistest.Start(t), redistest.Start(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.Addr, "b": b.Addr}, MaxRetries: -1})
	t.Cleanup(func() { ring.Close() })
	store := redisstore.New(ring, freshPrefix())
	plan, err := tokenbucket.New(store, ratelimit.PerHour(100), ratelimit.WithNamespace("plan"))
	if err != nil {
		t.Fatal(err)
	}
	rate, err := tokenbucket.New(store, ratelimit.PerHour(2), ratelimit.WithNamespace("rate"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// two keys that the ring puts on different servers
	ca := a.Client()
	onA, onB := "", ""
	for i := 0; onA == "" || onB == ""; i++ {
		if i > 200 {
			t.Fatal("no two keys on different shards among 200")
		}
		key := "tenant-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if _, err := plan.Allow(ctx, key); err != nil {
			t.Fatal(err)
		}
		inA := keysMatching(t, ca, key) > 0
		switch {
		case inA && onA == "":
			onA = key
		case !inA && onB == "":
			onB = key
		}
	}
	reqs := []core.Request{
		{Key: onA, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "plan", Rule: core.Rule(ratelimit.PerHour(100))}},
		{Key: onB, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "rate", Rule: core.Rule(ratelimit.PerHour(2))}}}
	if _, err := store.ApplyAll(ctx, reqs); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("ApplyAll of keys on two shards: %v; want errors.ErrUnsupported (AllowAll then goes one by one)", err)
	}
	for i := range 3 {
		d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: plan, Key: onA}, ratelimit.Part{Limiter: rate, Key: onB})
		if err != nil || d.Allowed != (i < 2) {
			t.Fatalf("AllowAll %d across shards: %+v, %v", i, d, err)
		}
	}
	if d, _ := plan.PeekN(ctx, onA, 1); d.Remaining != 100-1-2-1 { // the first Allow, two AllowAll; the denied one refunded
		t.Errorf("the plan after a denied AllowAll across shards: %+v; want its take refunded", d)
	}
	tagged := []core.Request{ // one tag: one shard, one script
		{Key: redisstore.TaggedKey("t", "x"), N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "plan", Rule: core.Rule(ratelimit.PerHour(100))}},
		{Key: redisstore.TaggedKey("t", "y"), N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Namespace: "rate", Rule: core.Rule(ratelimit.PerHour(2))}}}
	if ds, err := store.ApplyAll(ctx, tagged); err != nil || !ds[0].Allowed() || !ds[1].Allowed() {
		t.Fatalf("ApplyAll of one tag on a ring: %+v, %v", ds, err)
	}
}

// keysMatching is how many keys of c's server hold key in their name.
func keysMatching(t *testing.T, c *redis.Client, key string) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), "*{"+key+"}*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}
