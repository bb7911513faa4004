package slidingwindow_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
)

// 100 per minute: 80 events in the previous window and 30 in this one, 15 seconds in.
func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	limiter, err := slidingwindow.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerMinute(100))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	limiter.AllowN(ctx, "client", 80) // in the window 00:00-01:00
	clk.Advance(45 * time.Second)     // 00:01:15, 15 s into the next window
	limiter.AllowN(ctx, "client", 30)
	d, _ := limiter.Allow(ctx, "client")
	fmt.Printf("estimate 80*45/60 + 30 = 90: one more allowed: %v, %d left\n", d.Allowed, d.Remaining)
	d, _ = limiter.AllowN(ctx, "client", 10)
	fmt.Printf("10 more allowed: %v, retry after %v\n", d.Allowed, d.RetryAfter)
	// Output:
	// estimate 80*45/60 + 30 = 90: one more allowed: true, 9 left
	// 10 more allowed: false, retry after 750ms
}
