package hotkey_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// counting counts the calls that reach a store.
type counting struct {
	ratelimit.Store
	calls atomic.Int64
}

func (c *counting) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	c.calls.Add(1)
	return c.Store.Apply(ctx, req)
}

func tb(key string, rule ratelimit.Rule) core.Request {
	return core.Request{Key: key, N: 1, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(rule)}}
}

// TestDecoratorsConform: the conformance suite through each decorator that handles every
// algorithm the same way (Leases changes when events are counted, so it has its own).
func TestDecoratorsConform(t *testing.T) {
	t.Run("shard of 1", func(t *testing.T) {
		limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
			return hotkey.NewShard(localstore.New(localstore.WithClock(clk)), 1)
		})
	})
	t.Run("block cache", func(t *testing.T) {
		limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
			return hotkey.NewBlockCache(localstore.New(localstore.WithClock(clk)), hotkey.WithClock(clk))
		})
	})
}

// blocking holds every take of the keys in slow, after the store below has decided it,
// until release is closed; reached gets one value per take held.
type blocking struct {
	ratelimit.Store
	slow    map[string]bool
	reached chan string
	release chan struct{}
}

func (b *blocking) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	d, err := b.Store.Apply(ctx, req)
	if req.Spec.Op == core.OpTake && b.slow[req.Key] {
		b.reached <- req.Key
		<-b.release
	}
	return d, err
}

// within waits for f's result, failing the test if it takes longer than a generous bound:
// the calls it checks must not wait for a fetch that never ends.
func within[T any](t *testing.T, what string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s is blocked behind a fetch in flight", what)
		panic("unreachable")
	}
}

// TestHotOptionsApart: each decorator accepts only its own options.
func TestHotOptionsApart(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		opt                   any
		leases, shard, blocks bool
	}{
		{"ForRequests", hotkey.ForRequests(nil), true, true, true},
		{"WithClock", hotkey.WithClock(nil), true, false, true},
		{"WithMaxKeys", hotkey.WithMaxKeys(1), true, false, true},
		{"WithRefill", hotkey.WithRefill(time.Second), true, false, false},
		{"WithLeaseTTL", hotkey.WithLeaseTTL(time.Second), true, false, false},
		{"WithInstanceCount", hotkey.WithInstanceCount(nil), true, false, false},
		{"WithRetries", hotkey.WithRetries(1), false, true, false},
	} {
		_, l := tc.opt.(hotkey.LeasesOption)
		_, s := tc.opt.(hotkey.ShardOption)
		_, b := tc.opt.(hotkey.BlockCacheOption)
		if l != tc.leases || s != tc.shard || b != tc.blocks {
			t.Errorf("%s: for Leases %v, Shard %v, BlockCache %v; want %v, %v, %v", tc.name, l, s, b, tc.leases, tc.shard, tc.blocks)
		}
	}
}

// TestDecoratorsGrantPart: AllowAtMost through a Shard and a BlockCache grants what the
// key has left, as without them.
func TestDecoratorsGrantPart(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	for name, s := range map[string]ratelimit.Store{
		"shard":       hotkey.NewShard(localstore.New(localstore.WithClock(clk)), 2),
		"block cache": hotkey.NewBlockCache(localstore.New(localstore.WithClock(clk)), hotkey.WithClock(clk)),
	} {
		l, err := tokenbucket.New(s, ratelimit.PerMinute(10), ratelimit.WithNamespace("part"))
		if err != nil {
			t.Fatal(err)
		}
		got, d, err := l.AllowAtMost(context.Background(), "k", 7)
		if err != nil || got != 7 || !d.Allowed || d.Limit != 10 {
			t.Errorf("%s: the first 7 of 10: %d, %+v, %v", name, got, d, err)
		}
		got, d, err = l.AllowAtMost(context.Background(), "k", 7)
		if err != nil || got != 3 || !d.Allowed {
			t.Errorf("%s: 7 more: %d, %+v, %v; want the 3 left", name, got, d, err)
		}
		got, d, err = l.AllowAtMost(context.Background(), "k", 1)
		if err != nil || got != 0 || d.Allowed || d.RetryAfter <= 0 {
			t.Errorf("%s: one more: %d, %+v, %v; want none, and a wait", name, got, d, err)
		}
	}
}
