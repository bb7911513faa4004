package hotkey_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// counting counts the calls that reach a store.
type counting struct {
	ratelimit.Store
	calls atomic.Int64
}

func (c *counting) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	c.calls.Add(1)
	return c.Store.Apply(ctx, req)
}

func tb(key string, rule ratelimit.Rule) ratelimit.Request {
	return ratelimit.Request{Key: key, N: 1, Spec: &ratelimit.Spec{Algorithm: tokenbucket.Algorithm(), Rule: rule}}
}

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

func TestBlockCacheLocal(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	next := &counting{Store: localstore.New(localstore.WithClock(clk))}
	b := hotkey.NewBlockCache(next, hotkey.WithClock(clk))
	req := ratelimit.Request{Key: "k", N: 5, Spec: &ratelimit.Spec{Algorithm: fixedwindow.Algorithm(), Rule: ratelimit.PerMinute(5)}}
	b.Apply(context.Background(), req)
	req.N = 1
	d, _ := b.Apply(context.Background(), req) // denied until the minute ends
	if d.Allowed() || d.Wait != time.Minute {
		t.Fatalf("%+v", d)
	}
	calls := next.calls.Load()
	clk.Advance(30 * time.Second)
	for range 100 {
		if d, _ := b.Apply(context.Background(), req); d.Allowed() || d.Wait != 30*time.Second || d.Limit() != 5 {
			t.Fatalf("blocked: %+v", d)
		}
	}
	if next.calls.Load() != calls {
		t.Errorf("a blocked key cost %d calls", next.calls.Load()-calls)
	}
	clk.Advance(30 * time.Second)
	if d, _ := b.Apply(context.Background(), req); !d.Allowed() || next.calls.Load() != calls+1 {
		t.Errorf("after RetryAfter: %+v, %d calls", d, next.calls.Load()-calls)
	}
}

// TestBlockCacheOnRedis: a key hammered while denied costs Redis nothing until its
// RetryAfter passes.
func TestBlockCacheOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	clk := clock.NewFake(limitertest.Start)
	b := hotkey.NewBlockCache(redisstore.New(client, redisstore.WithClock(clk)), hotkey.WithClock(clk))
	req := ratelimit.Request{Key: "abuser", N: 1, Spec: &ratelimit.Spec{Algorithm: fixedwindow.Algorithm(), Rule: ratelimit.PerMinute(3)}}
	for range 4 {
		b.Apply(context.Background(), req)
	}
	before := redistest.ScriptCalls(t, client)
	for range 1000 {
		if d, err := b.Apply(context.Background(), req); err != nil || d.Allowed() {
			t.Fatalf("hammering: %+v, %v", d, err)
		}
	}
	if calls := redistest.ScriptCalls(t, client) - before; calls != 0 {
		t.Errorf("1000 blocked requests ran %d scripts; want 0", calls)
	}
	clk.Advance(time.Minute)
	if d, err := b.Apply(context.Background(), req); err != nil || !d.Allowed() || redistest.ScriptCalls(t, client)-before != 1 {
		t.Errorf("after RetryAfter: %+v, %v; want allowed by Redis", d, err)
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

// TestShardNothingCreatesAllowance: a Shard of 3 splits a rule in shares that together
// admit no more than the rule, whichever shard takes, refunds (to the shard its receipt
// names), owes a debit, or resets; a request for more than one shard holds is refused.
func TestShardNothingCreatesAllowance(t *testing.T) {
	limitertest.RunAllowance(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return hotkey.NewShard(localstore.New(localstore.WithClock(clk)), 3)
	})
}

// gated holds the first take that reaches it, after the store below has decided it, until
// release is closed: a decision in flight while other calls go by.
type gated struct {
	ratelimit.Store
	once             sync.Once
	reached, release chan struct{}
}

func (g *gated) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	d, err := g.Store.Apply(ctx, req)
	if req.Spec.Op == ratelimit.OpTake {
		g.once.Do(func() {
			close(g.reached)
			<-g.release
		})
	}
	return d, err
}

// TestBlockCacheRefundRace: a denial decided before a refund reached the store, and
// recorded after it, does not block the key while the store below has room.
func TestBlockCacheRefundRace(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	local := localstore.New(localstore.WithClock(clk))
	rule := ratelimit.PerHour(1)
	ctx := context.Background()
	taken := tb("k", rule)
	taken.Receipt = &ratelimit.Receipt{}
	if d, err := local.Apply(ctx, taken); err != nil || !d.Allowed() { // the one token, spent
		t.Fatal(d, err)
	}
	g := &gated{Store: local, reached: make(chan struct{}), release: make(chan struct{})}
	b := hotkey.NewBlockCache(g, hotkey.WithClock(clk))
	done := make(chan ratelimit.Outcome)
	go func() {
		d, _ := b.Apply(ctx, tb("k", rule))
		done <- d
	}()
	<-g.reached // denied by the store, not yet recorded
	refund := tb("k", rule)
	refund.Spec.Op, refund.Receipt = ratelimit.OpRefund, taken.Receipt
	if _, err := b.Apply(ctx, refund); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if d := <-done; d.Allowed() {
		t.Fatalf("the take in flight: %+v; want denied (it was decided before the refund)", d)
	}
	if d, err := b.Apply(ctx, tb("k", rule)); err != nil || !d.Allowed() {
		t.Errorf("after the refund: %+v, %v; want allowed, the store holds a token", d, err)
	}
}

// blocking holds every take of the keys in slow, after the store below has decided it,
// until release is closed; reached gets one value per take held.
type blocking struct {
	ratelimit.Store
	slow    map[string]bool
	reached chan string
	release chan struct{}
}

func (b *blocking) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	d, err := b.Store.Apply(ctx, req)
	if req.Spec.Op == ratelimit.OpTake && b.slow[req.Key] {
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

// TestShardInvalidShare: a rule whose share is not a valid rule is an invalid rule, not
// "n exceeds".
func TestShardInvalidShare(t *testing.T) {
	s := hotkey.NewShard(localstore.New(), 7)
	_, err := s.Apply(context.Background(), tb("k", ratelimit.Rule{Limit: 1e12, Period: time.Second}))
	if !errors.Is(err, ratelimit.ErrInvalidRule) || errors.Is(err, ratelimit.ErrInvalidN) {
		t.Errorf("a share that cannot be counted: %v; want ErrInvalidRule", err)
	}
	_, err = s.Apply(context.Background(), ratelimit.Request{Key: "k", N: 11, Spec: &ratelimit.Spec{Algorithm: tokenbucket.Algorithm(), Rule: ratelimit.PerSecond(70)}})
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
