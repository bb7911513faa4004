package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) // or leave the real clock out
	limiter, err := tokenbucket.New(localstore.New(localstore.WithClock(clk)), ratelimit.PerSecond(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "tenant-42")
		switch {
		case err != nil:
			fmt.Println("limiter failed:", err)
		case d.Allowed:
			fmt.Printf("allowed, %d of %d left\n", d.Remaining, d.Limit)
		default:
			fmt.Printf("denied, retry after %v\n", d.RetryAfter)
		}
	}
	// Output:
	// allowed, 1 of 2 left
	// allowed, 0 of 2 left
	// denied, retry after 500ms
}

func ExampleRule_String() {
	fmt.Println(ratelimit.PerMinute(60))
	fmt.Println(ratelimit.Rule{Limit: 100, Period: time.Second, Burst: 200})
	// Output:
	// 60 per 1m0s
	// 100 per 1s, burst 200
}
