package hotkey_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
)

func TestBlockCacheLocal(t *testing.T) {
	clk := clock.NewFake(limitertest.Start)
	next := &counting{Store: localstore.New(localstore.WithClock(clk))}
	b := hotkey.NewBlockCache(next, hotkey.WithClock(clk))
	req := core.Request{Key: "k", N: 5, Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(5))}}
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
	req := core.Request{Key: "abuser", N: 1, Spec: &core.Spec{Algorithm: fixedwindow.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(3))}}
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

// gated holds the first take that reaches it, after the store below has decided it, until
// release is closed: a decision in flight while other calls go by.
type gated struct {
	ratelimit.Store
	once             sync.Once
	reached, release chan struct{}
}

func (g *gated) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	d, err := g.Store.Apply(ctx, req)
	if req.Spec.Op == core.OpTake {
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
	taken.Receipt = &core.Receipt{}
	if d, err := local.Apply(ctx, taken); err != nil || !d.Allowed() { // the one token, spent
		t.Fatal(d, err)
	}
	g := &gated{Store: local, reached: make(chan struct{}), release: make(chan struct{})}
	b := hotkey.NewBlockCache(g, hotkey.WithClock(clk))
	done := make(chan core.Outcome)
	go func() {
		d, _ := b.Apply(ctx, tb("k", rule))
		done <- d
	}()
	<-g.reached // denied by the store, not yet recorded
	refund := tb("k", rule)
	refund.Spec.Op, refund.Receipt = core.OpRefund, taken.Receipt
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
