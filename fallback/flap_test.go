package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// TestBreakerFlaps: with the primary failing and healing every half second, n instances
// hammering one small key (2 at once, 1 per second) admit no more than the rule allows,
// whichever store decides: the shares are rounded down, and each share has spent what the
// primary admitted (or denied) for its instance. (Without that: 62 for one instance, 121
// for three, against 32 allowed.)
func TestBreakerFlaps(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		clk := clock.NewFake(limitertest.Start)
		p := &primary{local: localstore.New(localstore.WithClock(clk))}
		var instances []*fallback.Store
		for range n {
			instances = append(instances, fallback.New(p, localstore.New(localstore.WithClock(clk)), fallback.WithClock(clk),
				fallback.WithInstances(n), fallback.WithBreaker(fallback.Breaker{OpenFor: 100 * time.Millisecond})))
		}
		rule := ratelimit.Rule{Limit: 1, Period: time.Second, Burst: 2}
		admitted := 0
		for step := range 600 { // 30s in steps of 50ms
			if (step/10)%2 == 1 {
				p.fail(errDown)
			} else {
				p.heal()
			}
			for _, s := range instances {
				d, err := s.Apply(context.Background(), req("shop-a", rule))
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
			}
			clk.Advance(50 * time.Millisecond)
		}
		if allowed := 2 + 30; admitted > allowed || admitted < allowed/2 {
			t.Errorf("%d instances admitted %d in 30s of flapping; the rule allows %d", n, admitted, allowed)
		}
	}
}
