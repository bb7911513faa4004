package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/lend"
	"github.com/ratelimit-go/ratelimit/internal/script"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// lendHook watches the calls of lend.lua (the evalsha calls with a loan's values for
// each loan): how many run at once, and the most loans one decides.
type lendHook struct {
	now, most, loans atomic.Int64
}

func (*lendHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lendHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		isLend := cmd.Name() == "evalsha" && len(cmd.Args()) > 40 // a decision's call has far fewer arguments
		if isLend {
			n := h.now.Add(1)
			for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
			}
			defer h.now.Add(-1)
		}
		err := next(ctx, cmd)
		if isLend { // evalsha, its hash, 1, a key, then each loan's step index and values
			loans := int64(len(cmd.Args())-4) / int64(1+len(script.Values{})+lend.ArgFields)
			for m := h.loans.Load(); loans > m && !h.loans.CompareAndSwap(m, loans); m = h.loans.Load() {
			}
		}
		return err
	}
}
func (*lendHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLendLeavesThePool: a refill of 2,000 loans (an instance with thousands of leased
// keys) goes to Redis two calls at a time, of 20 loans at most (about a millisecond of
// Redis each), so that it holds two connections of a pool of 3 while 8 callers decide
// beside it, none waiting out the pool's timeout.
func TestLendLeavesThePool(t *testing.T) {
	client := redistest.Start(t).Client(func(o *redis.Options) { o.PoolSize, o.PoolTimeout = 3, 500*time.Millisecond })
	hook := &lendHook{}
	client.AddHook(hook)
	s := redisstore.New(client)
	spec := &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerSecond(1000))}
	loans := make([]core.Loan, 2000)
	for i := range loans {
		loans[i] = core.Loan{Key: fmt.Sprintf("tenant-%d", i), Spec: spec, Holder: 7, Want: 10, Share: 1, TTL: time.Minute}
	}
	ctx := context.Background()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var decided atomic.Int64
	for c := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if _, err := s.Apply(ctx, core.Request{Key: fmt.Sprintf("caller-%d-%d", c, i%10), N: 1, Spec: spec}); err != nil {
					t.Errorf("a decision beside the refill: %v", err)
					return
				}
				decided.Add(1)
			}
		})
	}
	for range 3 {
		got, err := s.Lend(ctx, loans)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range got {
			if l.N != 10 {
				t.Fatalf("loan %d lent %d; want 10", i, l.N)
			}
		}
	}
	close(done)
	wg.Wait()
	if most, loans := hook.most.Load(), hook.loans.Load(); most > 2 || loans > 20 || loans == 0 {
		t.Errorf("%d calls of loans at once, of %d loans at most; want 2 at a time, of 20 at most", most, loans)
	}
	t.Logf("%d decisions beside 3 refills of 2,000 loans", decided.Load())
}

// evalCounter counts a client's evalsha calls.
type evalCounter struct{ calls atomic.Int64 }

func (*evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (*evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLendDebits: a Lend of partial debits alone (what Leases sends for the events it
// admitted on trust) answers each as Apply answers the debit, in order, a key named
// three times included, and lends each all it wants. It runs in the batch script of
// coalesced decisions, 128 debits a call (300 in 3 calls), not in lend.lua, which costs
// Redis twice as much a loan.
func TestLendDebits(t *testing.T) {
	srv := redistest.Start(t)
	lc, ac := srv.Client(), srv.Client()
	calls := &evalCounter{}
	lc.AddHook(calls)
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	// keys kept an hour: Redis expires them in its own time, which passes while the fake
	// clock stands still, and a key gone between two debits would answer as a fresh one
	lender := redisstore.New(lc, redisstore.WithPrefix("lend"), redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour))
	applier := redisstore.New(ac, redisstore.WithPrefix("apply"), redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour))
	ctx := context.Background()
	algs := map[string]*core.Algorithm{"tokenbucket": tokenbucket.Algorithm(), "fixedwindow": fixedwindow.Algorithm(),
		"slidingwindow": slidingwindow.Algorithm()}
	for name, alg := range algs {
		debit := &core.Spec{Algorithm: alg, Namespace: name, Rule: core.Rule{Limit: 10, Period: time.Second, Burst: 10}, Op: core.OpDebit}
		loans := make([]core.Loan, 300)
		for i := range loans {
			loans[i] = core.Loan{Key: fmt.Sprintf("k%d", i%100), Spec: debit, Want: int64(1 + i%4)}
		}
		before := calls.calls.Load()
		lent, err := lender.Lend(ctx, loans)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := calls.calls.Load() - before; n != 3 {
			t.Errorf("%s: 300 debits in %d calls; want 3 (lend.lua takes 20 a call: 15)", name, n)
		}
		for i, l := range loans {
			o, err := applier.Apply(ctx, core.Request{Key: l.Key, N: l.Want, Spec: debit})
			if err != nil {
				t.Fatal(err)
			}
			if want := (core.Lent{Outcome: o, N: l.Want}); lent[i] != want {
				t.Fatalf("%s: debit %d (%d of %s) lent %+v; want %+v, as Apply's debit", name, i, l.Want, l.Key, lent[i], want)
			}
		}
		clk.Advance(time.Second)
	}
}
