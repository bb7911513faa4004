package fixedwindow_test

import (
	"context"
	"fmt"
	"time"

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
