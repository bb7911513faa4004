package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// One limit shared by every instance: here on an in-process miniredis and a fake clock,
// in production on redis.NewClient(&redis.Options{Addr: ...}) and Redis's own clock.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	limiter, err := tokenbucket.New(redisstore.New(client, redisstore.WithClock(clk)), ratelimit.PerSecond(2),
		ratelimit.WithNamespace("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "{shop-a}:create-order")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter, err)
	}
	fmt.Println(mr.Keys())
	// Output:
	// true 1 0s <nil>
	// true 0 0s <nil>
	// false 0 500ms <nil>
	// [rl:tokenbucket:state:orders:t:{shop-a}:create-order]
}
