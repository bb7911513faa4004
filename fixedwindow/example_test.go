package fixedwindow_test

import (
	"context"
	"fmt"
	"time"
	_ "time/tzdata" // the example's zone, on a machine without a zone database

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// 3 per second, in windows that start on the second.
func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 900_000_000, time.UTC))
	limiter, err := fixedwindow.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerSecond(3))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	d, _ := limiter.AllowN(ctx, "client", 3)
	fmt.Printf("at .900: 3 allowed: %v, window resets after %v\n", d.Allowed, d.ResetAfter)
	d, _ = limiter.Allow(ctx, "client")
	fmt.Printf("at .900: 1 more allowed: %v, retry after %v\n", d.Allowed, d.RetryAfter)
	clk.Advance(100 * time.Millisecond)
	d, _ = limiter.AllowN(ctx, "client", 3)
	fmt.Printf("at 1.000: 3 allowed: %v (6 in 100ms: the boundary burst)\n", d.Allowed)
	// Output:
	// at .900: 3 allowed: true, window resets after 100ms
	// at .900: 1 more allowed: false, retry after 100ms
	// at 1.000: 3 allowed: true (6 in 100ms: the boundary burst)
}

// A plan of 3 calls a month in New York: the month ends at midnight there, not on an
// epoch boundary.
func ExampleNewQuota() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		fmt.Println(err)
		return
	}
	clk := clock.NewFake(time.Date(2027, 1, 31, 23, 59, 0, 0, ny))
	quota, err := fixedwindow.NewQuota(localstore.New(localstore.WithClock(clk)),
		fixedwindow.Quota{Limit: 3, Per: fixedwindow.Month, In: ny})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	for range 4 {
		d, _ := quota.Allow(ctx, "tenant-42")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	clk.Set(time.Date(2027, 2, 1, 0, 0, 0, 0, ny))
	d, _ := quota.Allow(ctx, "tenant-42")
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter, quota.Quota())
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 1m0s
	// true 2 672h0m0s 3 per month in America/New_York
}
