package fallback_test

import (
	"context"
	"fmt"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// With the primary down, each of 4 instances admits its quarter of the rule.
func Example() {
	redisDown := newPrimary() // stands in for redisstore.New(client) while Redis is down
	redisDown.fail(errDown)
	store := fallback.New(redisDown, localstore.New(), fallback.WithInstances(4),
		fallback.WithHooks(fallback.Hooks{OnStateChange: func(from, to fallback.BreakerState) {
			fmt.Println("breaker:", from, "->", to)
		}}))
	limiter, err := tokenbucket.New(store, ratelimit.PerHour(100))
	if err != nil {
		fmt.Println(err)
		return
	}
	admitted := 0
	for range 40 {
		if d, err := limiter.Allow(context.Background(), "tenant-42"); err == nil && d.Allowed {
			admitted++
		}
	}
	fmt.Println("admitted", admitted, "of 40")
	// Output:
	// breaker: closed -> open
	// admitted 25 of 40
}
