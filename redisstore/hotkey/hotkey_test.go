package hotkey_test

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
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/leakybucket"
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

func TestPrefetch(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	next := &counting{Store: localstore.New(localstore.WithClock(clk))}
	p := hotkey.NewPrefetch(next, 10, hotkey.WithGrantTime(time.Second), hotkey.WithClock(clk))
	ctx := context.Background()
	rule := ratelimit.PerHour(1000)
	for i := range 25 {
		d, err := p.Apply(ctx, tb("k", rule))
		if err != nil || !d.Allowed() || d.Remaining != int64(999-i) {
			t.Fatalf("request %d: %+v, %v; want allowed, %d left", i, d, err, 999-i)
		}
	}
	if next.calls.Load() != 3 {
		t.Errorf("25 requests cost %d calls; want 3 batches of 10", next.calls.Load())
	}
	clk.Advance(time.Second) // the lease runs out: the 5 tokens in hand lapse
	p.Apply(ctx, tb("k", rule))
	if next.calls.Load() != 4 {
		t.Errorf("after the lease: %d calls; want a new batch", next.calls.Load())
	}
	p.Apply(ctx, tb("k", ratelimit.PerHour(999))) // a changed rule never spends the old tokens
	if next.calls.Load() != 5 {
		t.Errorf("after a rule change: %d calls; want a new batch", next.calls.Load())
	}
	if _, err := p.Apply(ctx, ratelimit.Request{Key: "k", N: 1, Spec: &ratelimit.Spec{Algorithm: leakybucket.Algorithm(), Rule: rule}}); err != nil || next.calls.Load() != 6 {
		t.Errorf("the leaky bucket must go straight through: %v, %d calls", err, next.calls.Load())
	}
}

// TestPrefetchNearTheLimit: a key with less than a batch left still gets every token,
// and once it has none, denials come from memory until their RetryAfter.
func TestPrefetchNearTheLimit(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	next := &counting{Store: localstore.New(localstore.WithClock(clk))}
	p := hotkey.NewPrefetch(next, 10, hotkey.WithGrantTime(time.Hour), hotkey.WithClock(clk))
	rule := ratelimit.PerHour(15)
	admitted := 0
	for range 40 {
		d, err := p.Apply(context.Background(), tb("k", rule))
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed() {
			admitted++
		} else if d.Wait != 4*time.Minute {
			t.Fatalf("denied with RetryAfter %v; want 4m (one token at 15 per hour)", d.Wait)
		}
	}
	// a batch of 10; a batch denied and the 5 left taken instead; a batch denied and the
	// exact request denied, remembered for the 24 requests after it
	if admitted != 15 || next.calls.Load() != 5 {
		t.Errorf("admitted %d of 15 with %d calls; want all 15 with 5", admitted, next.calls.Load())
	}
	clk.Advance(4 * time.Minute) // one token back: a batch denied, then the one token
	if d, _ := p.Apply(context.Background(), tb("k", rule)); !d.Allowed() || next.calls.Load() != 7 {
		t.Errorf("after RetryAfter: %+v with %d calls; want allowed after 2 more calls", d, next.calls.Load())
	}
}

func TestForRequests(t *testing.T) {
	next := &counting{Store: localstore.New()}
	p := hotkey.NewPrefetch(next, 100, hotkey.ForRequests(func(r ratelimit.Request) bool {
		return strings.HasPrefix(r.Key, "hot:")
	}))
	for range 10 {
		p.Apply(context.Background(), tb("hot:a", ratelimit.PerHour(1000)))
		p.Apply(context.Background(), tb("cold:b", ratelimit.PerHour(1000)))
	}
	if next.calls.Load() != 1+10 {
		t.Errorf("%d calls; want 1 for the hot key and 10 for the cold one", next.calls.Load())
	}
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

// TestPrefetchOnRedis: 4 instances with batches of 50 drive one hot key; Redis sees at
// most 1/40 of the decisions, and the admitted total stays within the bound.
func TestPrefetchOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	rule := ratelimit.PerHour(5000)
	const instances, perInstance = 4, 2000
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range instances {
		p := hotkey.NewPrefetch(redisstore.New(srv.Client(), redisstore.WithPrefix("hot")), 50)
		for range 8 {
			wg.Go(func() {
				for range perInstance / 8 {
					d, err := p.Apply(context.Background(), tb("tenant-big", rule))
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed() {
						admitted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	calls := redistest.ScriptCalls(t, srv.Client())
	t.Logf("%d decisions, %d admitted, %d scripts on Redis", instances*perInstance, admitted.Load(), calls)
	if calls > instances*perInstance/40 {
		t.Errorf("Redis ran %d scripts for %d decisions; want at most 1/40", calls, instances*perInstance)
	}
	// every token was counted by Redis; at most a batch per instance lapsed unspent
	if a := admitted.Load(); a > rule.Limit || a < rule.Limit-instances*50 {
		t.Errorf("admitted %d; want between %d and %d", a, rule.Limit-instances*50, rule.Limit)
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
// algorithm the same way (Prefetch changes when tokens are counted, so it has its own).
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

func TestPrefetchOps(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	next := &counting{Store: localstore.New(localstore.WithClock(clk))}
	p := hotkey.NewPrefetch(next, 10, hotkey.WithClock(clk))
	ctx := context.Background()
	rule := ratelimit.PerHour(100)
	p.Apply(ctx, tb("k", rule)) // a lease of 10: 9 in hand, 90 left in the store
	peek := tb("k", rule)
	peek.Spec.Op = "peek"
	if d, _ := p.Apply(ctx, peek); d.Remaining != 89 {
		t.Errorf("a peek through the lease: %+v; want the store's own view", d)
	}
	reset := tb("k", rule)
	reset.Spec.Op = "reset"
	p.Apply(ctx, reset)
	calls := next.calls.Load()
	if d, _ := p.Apply(ctx, tb("k", rule)); d.Remaining != 99 || next.calls.Load() != calls+1 {
		t.Errorf("after a reset: %+v, %d calls; want a new lease from a full key", d, next.calls.Load()-calls)
	}
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
	if req.Spec.Op == "" {
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
	if d, err := local.Apply(ctx, tb("k", rule)); err != nil || !d.Allowed() { // the one token, spent
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
	refund.Spec.Op = "refund"
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
	if req.Spec.Op == "" && b.slow[req.Key] {
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

// TestPrefetchNoLockAcrossIO: a fetch in flight delays no other key (even when the table
// is full and pruned), nor a request of its own key that has tokens in hand; a request
// that must wait for it waits no longer than its context.
func TestPrefetchNoLockAcrossIO(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	b := &blocking{Store: localstore.New(localstore.WithClock(clk)), slow: map[string]bool{},
		reached: make(chan string, 10), release: make(chan struct{})}
	defer close(b.release)
	p := hotkey.NewPrefetch(b, 3, hotkey.WithClock(clk), hotkey.WithMaxKeys(2))
	ctx := context.Background()
	rule := ratelimit.PerHour(100)
	for _, k := range []string{"a", "b"} {
		if d, err := p.Apply(ctx, tb(k, rule)); err != nil || !d.Allowed() { // 2 in hand each
			t.Fatal(d, err)
		}
	}
	b.slow["a"] = true
	go p.Apply(ctx, ratelimit.Request{Key: "a", N: 3, Spec: &ratelimit.Spec{Algorithm: tokenbucket.Algorithm(), Rule: rule}}) // 2 in hand, 3 asked: a fetch
	<-b.reached
	d := within(t, "a token in hand of the same key", func() ratelimit.Outcome { d, _ := p.Apply(ctx, tb("a", rule)); return d })
	if !d.Allowed() || d.Reset <= 0 {
		t.Errorf("a token in hand while its key fetches: %+v; want allowed with a ResetAfter", d)
	}
	d = within(t, "another key, in a full table", func() ratelimit.Outcome { d, _ := p.Apply(ctx, tb("c", rule)); return d })
	if !d.Allowed() {
		t.Errorf("another key while one fetches: %+v; want allowed", d)
	}
	d = within(t, "another key's tokens in hand", func() ratelimit.Outcome { d, _ := p.Apply(ctx, tb("b", rule)); return d })
	if !d.Allowed() {
		t.Errorf("another key's token in hand while one fetches: %+v; want allowed", d)
	}
	short, cancel := context.WithCancel(ctx)
	cancel()
	err := within(t, "a cancelled wait", func() error {
		_, err := p.Apply(short, ratelimit.Request{Key: "a", N: 3, Spec: &ratelimit.Spec{Algorithm: tokenbucket.Algorithm(), Rule: rule}})
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled caller waiting for the fetch in flight: %v; want context.Canceled", err)
	}
}

// TestPrefetchResetAfter: decisions from a grant say when the key is full again, counting
// down from the next store's answer at the fetch, and never 0 while tokens are out.
func TestPrefetchResetAfter(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	p := hotkey.NewPrefetch(localstore.New(localstore.WithClock(clk)), 10,
		hotkey.WithClock(clk), hotkey.WithGrantTime(time.Minute))
	rule := ratelimit.PerHour(3600) // a token a second
	first, err := p.Apply(context.Background(), tb("k", rule))
	if err != nil || !first.Allowed() || first.Reset != 10*time.Second {
		t.Fatalf("the fetch: %+v, %v; want allowed, full again in 10s (10 tokens taken)", first, err)
	}
	clk.Advance(4 * time.Second)
	if d, _ := p.Apply(context.Background(), tb("k", rule)); !d.Allowed() || d.Reset != 6*time.Second {
		t.Errorf("from the lease 4s later: %+v; want allowed, ResetAfter 6s", d)
	}
	clk.Advance(20 * time.Second)
	if d, _ := p.Apply(context.Background(), tb("k", rule)); !d.Allowed() || d.Reset <= 0 {
		t.Errorf("from the lease 24s later: %+v; want allowed, ResetAfter above 0", d)
	}
}

// TestHotOptionsApart: each decorator accepts only its own options.
func TestHotOptionsApart(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		opt                     any
		prefetch, shard, blocks bool
	}{
		{"ForRequests", hotkey.ForRequests(nil), true, true, true},
		{"WithClock", hotkey.WithClock(nil), true, false, true},
		{"WithMaxKeys", hotkey.WithMaxKeys(1), true, false, true},
		{"WithGrantTime", hotkey.WithGrantTime(time.Second), true, false, false},
		{"WithRetries", hotkey.WithRetries(1), false, true, false},
	} {
		_, p := tc.opt.(hotkey.PrefetchOption)
		_, s := tc.opt.(hotkey.ShardOption)
		_, b := tc.opt.(hotkey.BlockCacheOption)
		if p != tc.prefetch || s != tc.shard || b != tc.blocks {
			t.Errorf("%s: for Prefetch %v, Shard %v, BlockCache %v; want %v, %v, %v", tc.name, p, s, b, tc.prefetch, tc.shard, tc.blocks)
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
