package hotkey_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func TestShardLocal(t *testing.T) {
	next := &counting{Store: localstore.New()}
	s := hotkey.NewShard(next, 10)
	rule := ratelimit.PerHour(1000)
	for i := range 900 { // 90% of the limit: never denied
		if d, err := s.Apply(context.Background(), tb("k", rule)); err != nil || !d.Allowed() || d.Limit() != 1000 {
			t.Fatalf("request %d at 90%%: %+v, %v", i, d, err)
		}
	}
	admitted := 900
	for range 300 {
		if d, _ := s.Apply(context.Background(), tb("k", rule)); d.Allowed() {
			admitted++
		}
	}
	if admitted != 1000 {
		t.Errorf("10 shards of 100 admitted %d; want 1000", admitted)
	}
	big := tb("k", rule)
	big.N = 101
	if _, err := s.Apply(context.Background(), big); !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("n over one shard's capacity: %v; want ErrInvalidN", err)
	}
}

// TestShardOnCluster: 10 shards of one key sit on all 3 masters; a tenant at 90% of its
// limit is never denied, and the total admitted is the rule's.
func TestShardOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	s := hotkey.NewShard(redisstore.New(cluster.Client(t), redisstore.WithPrefix("shard")), 10)
	rule := ratelimit.PerHour(1000)
	for i := range 900 {
		if d, err := s.Apply(context.Background(), tb("{tenant-big}:search", rule)); err != nil || !d.Allowed() {
			t.Fatalf("request %d at 90%%: %+v, %v", i, d, err)
		}
	}
	admitted := 900
	for range 300 {
		if d, err := s.Apply(context.Background(), tb("{tenant-big}:search", rule)); err != nil {
			t.Fatal(err)
		} else if d.Allowed() {
			admitted++
		}
	}
	if admitted < 970 || admitted > 1000 {
		t.Errorf("admitted %d; want the rule's 1000, within 3%%", admitted)
	}
	for _, m := range cluster.Masters {
		keys := redis.NewClient(&redis.Options{Addr: m.Addr}).Keys(context.Background(), "shard:*").Val()
		if len(keys) == 0 {
			t.Errorf("master %s holds none of the 10 shards", m.Addr)
		}
	}
}

// TestShardNothingCreatesAllowance: a Shard of 3 splits a rule in shares that together
// admit no more than the rule, whichever shard takes, refunds (to the shard its receipt
// names), owes a debit, or resets; a request for more than one shard holds is refused.
func TestShardNothingCreatesAllowance(t *testing.T) {
	limitertest.RunAllowance(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return hotkey.NewShard(localstore.New(localstore.WithClock(clk)), 3)
	})
}

// TestShardInvalidShare: a rule whose share is not a valid rule is an invalid rule, not
// "n exceeds".
func TestShardInvalidShare(t *testing.T) {
	s := hotkey.NewShard(localstore.New(), 7)
	_, err := s.Apply(context.Background(), tb("k", ratelimit.Rule{Limit: 1e12, Period: time.Second}))
	if !errors.Is(err, ratelimit.ErrInvalidRule) || errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("a share that cannot be counted: %v; want ErrInvalidRule", err)
	}
	_, err = s.Apply(context.Background(), core.Request{Key: "k", N: 11, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(70))}})
	if !errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("n above one shard's capacity: %v; want ErrInvalidN", err)
	}
}

// TestShardDebit: a debit through a Shard is owed by every shard, so the key denies as
// it does unsharded. Capacity 10 at 2 a second over two shards (5 at 1 a second each): a
// debit of 15 on a full key leaves both in debt (-3 and -2), and no request of the next
// ten is admitted at once (one debited shard alone let the other admit 5); 3s later the
// shard that owed 2 admits one.
func TestShardDebit(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	s := hotkey.NewShard(localstore.New(localstore.WithClock(clk)), 2)
	l, err := tokenbucket.New(s, ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 10}, ratelimit.WithNamespace("debt"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d, err := l.Debit(ctx, "k", 15)
	if err != nil || d.Allowed || d.Remaining != 0 {
		t.Fatalf("a debit of 15 on a full key: %+v, %v; want a denial, none left", d, err)
	}
	for i := range 10 {
		if d, err := l.Allow(ctx, "k"); err != nil || d.Allowed {
			t.Fatalf("request %d after the debit: %+v, %v; want denied", i, d, err)
		}
	}
	clk.Advance(3 * time.Second)
	admitted := 0
	for range 4 {
		if d, _ := l.Allow(ctx, "k"); d.Allowed {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("3s later: %d admitted; want 1 (-2 and -3 earned back to 1 and 0)", admitted)
	}
}
