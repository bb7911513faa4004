package redisstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// One limit shared by every instance, on Redis's own clock. It needs a Redis at
// localhost:6379, so go test compiles it without running it; internal/integration runs
// the same steps on miniredis and a fake clock, and checks what they print.
func Example() {
	client := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: "localhost:6379"}))
	defer client.Close()
	store := redisstore.New(client)
	if err := store.LoadScripts(context.Background()); err != nil { // every algorithm's, before serving
		fmt.Println(err)
	}

	limiter, err := tokenbucket.New(store, ratelimit.PerSecond(2),
		ratelimit.WithNamespace("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "{shop-a}:create-order")
		if errors.Is(err, ratelimit.ErrUnavailable) {
			fmt.Println("Redis is unreachable: decide locally (see package fallback)")
			return
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	// The keys, one per limiter key, expire once the bucket is full again:
	// rl:tokenbucket:state:orders:t:{shop-a}:create-order
}

// A client with the settings a rate limiter wants (a decision's deadline honoured,
// reconnections and a saturated pool failing fast, no retried scripts), keeping the
// address, credentials and pool the application chose.
func ExampleRecommended() {
	o := redisstore.Recommended(&redis.Options{Addr: "redis.internal:6379", PoolSize: 50})
	fmt.Println(o.Addr, o.PoolSize, o.ContextTimeoutEnabled, o.DialTimeout, o.DialerRetries, o.PoolTimeout, o.MaxRetries)
	// Output: redis.internal:6379 50 true 100ms 1 10ms -1
}
