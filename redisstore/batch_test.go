package redisstore_test

import (
	"context"
	"testing"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// TestMultiIsOneRoundTrip: a decision under three limits is one script on Redis.
func TestMultiIsOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	store := redisstore.New(client)
	daily, _ := tokenbucket.New(store, ratelimit.PerDay(10000))
	route, _ := slidingwindow.New(store, ratelimit.Rule{Limit: 100, Period: 1e9, Burst: 200})
	user, _ := fixedwindow.New(store, ratelimit.PerSecond(10))
	parts := []ratelimit.Part{{Limiter: daily, Key: "shop-a"}, {Limiter: route, Key: "shop-a"}, {Limiter: user, Key: "shop-a"}}
	ctx := context.Background()
	if _, err := ratelimit.AllowAll(ctx, 1, parts...); err != nil { // loads the script
		t.Fatal(err)
	}
	before := redistest.ScriptCalls(t, client)
	for range 20 {
		if _, err := ratelimit.AllowAll(ctx, 1, parts...); err != nil {
			t.Fatal(err)
		}
	}
	if calls := redistest.ScriptCalls(t, client) - before; calls != 20 {
		t.Errorf("20 decisions under 3 limits ran %d scripts; want 20, one each", calls)
	}
}
