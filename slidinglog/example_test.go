package slidinglog_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/slidinglog"
)

// At most 3 login attempts in any minute.
func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, err := slidinglog.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerMinute(3))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, at := range []time.Duration{0, 20 * time.Second, 40 * time.Second, 50 * time.Second, time.Minute} {
		clk.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(at))
		d, _ := limiter.Allow(context.Background(), "login:alice")
		fmt.Printf("attempt at %v: allowed %v, retry after %v\n", at, d.Allowed, d.RetryAfter)
	}
	// Output:
	// attempt at 0s: allowed true, retry after 0s
	// attempt at 20s: allowed true, retry after 0s
	// attempt at 40s: allowed true, retry after 0s
	// attempt at 50s: allowed false, retry after 10s
	// attempt at 1m0s: allowed true, retry after 0s
}
