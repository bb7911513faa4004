package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// applyOnly hides localstore's Bind, so that a limiter on it goes through Apply.
type applyOnly struct{ s *localstore.Store }

func (a applyOnly) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	return a.s.Apply(ctx, req)
}

// A limiter on localstore, bound to its takes, which build Decisions from Outcomes,
// decides exactly as one on Apply: Delay, RetryAfter and Limit included, by Allow, AllowN
// and AllowRule.
func TestBoundTakesAsApply(t *testing.T) {
	ctx := context.Background()
	type limiter interface {
		ratelimit.Limiter
		AllowRule(ctx context.Context, key string, rule ratelimit.Rule, n int64) (ratelimit.Decision, error)
	}
	for _, alg := range []struct {
		name string
		new  func(ratelimit.Store, ratelimit.Rule) (limiter, error)
	}{
		{"leakybucket", func(s ratelimit.Store, r ratelimit.Rule) (limiter, error) {
			return leakybucket.New(s, r)
		}},
		{"tokenbucket", func(s ratelimit.Store, r ratelimit.Rule) (limiter, error) {
			return tokenbucket.New(s, r)
		}},
	} {
		t.Run(alg.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1700000000, 0))
			rule, other := ratelimit.PerSecond(4), ratelimit.PerSecond(2)
			bound, err := alg.new(localstore.New(localstore.WithClock(clk)), rule)
			if err != nil {
				t.Fatal(err)
			}
			plain, err := alg.new(applyOnly{localstore.New(localstore.WithClock(clk))}, rule)
			if err != nil {
				t.Fatal(err)
			}
			delays, denials := 0, 0
			for i := range 12 {
				clk.Advance(time.Duration(i%3) * 70 * time.Millisecond)
				calls := []func(l limiter) (ratelimit.Decision, error){
					func(l limiter) (ratelimit.Decision, error) { return l.Allow(ctx, "k") },
					func(l limiter) (ratelimit.Decision, error) { return l.AllowN(ctx, "k", 2) },
					func(l limiter) (ratelimit.Decision, error) { return l.AllowRule(ctx, "k", other, 1) },
					func(l limiter) (ratelimit.Decision, error) { return l.AllowN(ctx, "k", 5) }, // above the limit
				}
				call := calls[i%len(calls)]
				got, gotErr := call(bound)
				want, wantErr := call(plain)
				if got != want || (gotErr == nil) != (wantErr == nil) {
					t.Fatalf("call %d: bound %+v, %v; through Apply %+v, %v", i, got, gotErr, want, wantErr)
				}
				if got.Delay > 0 {
					delays++
				}
				if !got.Allowed && gotErr == nil {
					denials++
				}
			}
			if denials == 0 || (alg.name == "leakybucket" && delays == 0) {
				t.Fatalf("%d denials, %d delays: the sequence must show both halves of Outcome.Wait", denials, delays)
			}
		})
	}
}
