package localstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/localstore"
)

// A store for one process, holding at most 100,000 keys, on a clock a test controls.
func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := localstore.New(localstore.WithClock(clk), localstore.WithMaxKeys(100_000))
	limiter, err := fixedwindow.New(store, ratelimit.PerMinute(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	for range 3 {
		d, _ := limiter.Allow(ctx, "client-7")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	clk.Advance(time.Minute)
	d, _ := limiter.Allow(ctx, "client-7")
	fmt.Println(d.Allowed, d.Remaining, store.Len())
	// Output:
	// true 1 0s
	// true 0 0s
	// false 0 1m0s
	// true 1 1
}
