package tokenbucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// A bucket of 10 tokens refilled at 2 per second.
func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)),
		ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	burst := func(n int) {
		allowed, last := 0, ratelimit.Decision{}
		for range n {
			last, _ = limiter.Allow(ctx, "tenant-42")
			if last.Allowed {
				allowed++
			}
		}
		fmt.Printf("%d of %d allowed, %d left, retry after %v\n", allowed, n, last.Remaining, last.RetryAfter)
	}
	burst(15)
	clk.Advance(3 * time.Second)
	burst(5)
	// Output:
	// 10 of 15 allowed, 0 left, retry after 500ms
	// 5 of 5 allowed, 1 left, retry after 0s
}
