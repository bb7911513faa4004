package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redissuite"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The conformance suite on miniredis, for fast runs without a server.
func TestConformanceMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := miniredisClient(t, mr)
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), redissuite.FreshPrefix())
	})
}

// The same on miniredis's TIME, driven by the fake clock: the scripts' own clock path.
func TestConformanceServerTime(t *testing.T) {
	mr := miniredis.RunT(t)
	client := miniredisClient(t, mr)
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return serverTime{redisstore.New(client, redissuite.FreshPrefix(), redisstore.WithCalendarClock(clk)), mr, clk}
	})
}

// miniredisClient is a client of mr whose callers wait for a connection as long as a
// test may take. miniredis runs one command at a time, and its Lua slowly under -race on
// a busy machine: the suite's 1000 concurrent decisions of several limits, one script
// call each, queue for the pool's connections for longer than go-redis's default pool
// timeout (4s), and the conformance suite checks what is decided, not overload.
func miniredisClient(t *testing.T, mr *miniredis.Miniredis) *redis.Client {
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolTimeout: 5 * time.Minute})
	t.Cleanup(func() { client.Close() })
	return client
}

// serverTime sets miniredis's TIME to the fake clock before each decision, and each
// batch.
type serverTime struct {
	*redisstore.Store
	mr  *miniredis.Miniredis
	clk *clock.Fake
}

func (s serverTime) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	s.mr.SetTime(s.clk.Now())
	return s.Store.Apply(ctx, req)
}

func (s serverTime) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	s.mr.SetTime(s.clk.Now())
	return s.Store.Lend(ctx, loans)
}

func (s serverTime) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	s.mr.SetTime(s.clk.Now())
	return s.Store.ApplyAll(ctx, reqs)
}

// On miniredis TTLs move only when told: here with the fake clock, so both stores forget
// a key at the same instant, and rules may change under any time step.
func TestParityMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	rules := []ratelimit.Rule{
		ratelimit.PerSecond(3),
		{Limit: 7, Period: 1500*time.Millisecond + 3*time.Microsecond, Burst: 11},
		ratelimit.PerMinute(100),
		{Limit: 5, Period: 7 * time.Millisecond, Burst: 2},
		ratelimit.PerDay(1000),
	}
	redissuite.ParityOn(t, func(clk *clock.Fake) ratelimit.Store {
		return &ttlClock{redisstore.New(client, redisstore.WithClock(clk), redissuite.FreshPrefix()), mr, clk, clk.Now()}
	}, rules, true, 997*time.Microsecond, 3000)
}

// On miniredis, whose TTLs move with the fake clock, leases may be short.
func TestInFlightParityMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	clk := clock.NewFake(limitertest.Start)
	store := &ttlClock{redisstore.New(client, redisstore.WithClock(clk), redissuite.FreshPrefix()), mr, clk, clk.Now()}
	redissuite.InFlightParityOn(t, store, clk, 997*time.Microsecond, 5000)
}

// On miniredis, the loans of core.Lender, in Go and in Lua alike.
func TestLendParityMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	clk := clock.NewFake(limitertest.Start)
	store := &ttlClock{redisstore.New(client, redisstore.WithClock(clk), redissuite.FreshPrefix()), mr, clk, clk.Now()}
	redissuite.LendParityOn(t, store, clk, 997*time.Microsecond, 3000)
}

// ttlClock moves miniredis's TTLs with the fake clock before each decision.
type ttlClock struct {
	*redisstore.Store
	mr   *miniredis.Miniredis
	clk  *clock.Fake
	last time.Time
}

func (s *ttlClock) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	now := s.clk.Now()
	s.mr.FastForward(now.Sub(s.last))
	s.last = now
	return s.Store.Apply(ctx, req)
}

func (s *ttlClock) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	now := s.clk.Now()
	s.mr.FastForward(now.Sub(s.last))
	s.last = now
	return s.Store.Lend(ctx, loans)
}

// redisstore's Example, on an in-process miniredis and a fake clock, so that what it
// prints is checked: one limit shared by every instance, and the one key it keeps.
func Example_redisstore() {
	mr, err := miniredis.Run()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, err := tokenbucket.New(redisstore.New(client, redisstore.WithClock(clk)), ratelimit.PerSecond(2),
		ratelimit.WithNamespace("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "{shop-a}:create-order")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter, err)
	}
	fmt.Println(mr.Keys())
	// Output:
	// true 1 0s <nil>
	// true 0 0s <nil>
	// false 0 500ms <nil>
	// [rl:tokenbucket:state:orders:t:{shop-a}:create-order]
}
