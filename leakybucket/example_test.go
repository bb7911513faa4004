package leakybucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// A queue of 3 drained at 2 per second turns a burst into a paced stream.
func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, err := leakybucket.New(localstore.New(localstore.WithClock(clk)),
		ratelimit.Rule{Limit: 2, Period: time.Second, Burst: 3})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := range 5 {
		d, _ := limiter.Allow(context.Background(), "upstream")
		if d.Allowed {
			fmt.Printf("request %d: go after %v\n", i, d.Delay)
		} else {
			fmt.Printf("request %d: queue full, retry after %v\n", i, d.RetryAfter)
		}
	}
	// Output:
	// request 0: go after 0s
	// request 1: go after 500ms
	// request 2: go after 1s
	// request 3: queue full, retry after 500ms
	// request 4: queue full, retry after 500ms
}
