package integration_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redissuite"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// The server's clock chooses a quota's window. The store places the windows by the
// application's clock (time.Now, without WithClock); the scripts read the server's TIME,
// here miniredis's, set 5 minutes away from the application's, across a midnight 2
// minutes away from it (a zone made to put it there): a daily quota of 1 decides as the
// server's day says, and resets when the server's day ends.
func TestQuotaServerClockDecides(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, redissuite.FreshPrefix())
	ctx := context.Background()
	now := time.Now().Truncate(time.Second)
	for _, c := range []struct {
		name             string
		midnight, server time.Time
		reset            time.Duration // until the server's day ends
	}{
		{"the server in the next day", now.Add(2 * time.Minute), now.Add(5 * time.Minute), 24*time.Hour - 3*time.Minute},
		{"the server in the day before", now.Add(-2 * time.Minute), now.Add(-5 * time.Minute), 3 * time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			zone := time.FixedZone(fmt.Sprintf("skew-%d", c.midnight.Unix()), -int(c.midnight.Unix()%86400))
			mr.SetTime(c.server)
			l, err := fixedwindow.NewQuota(store, fixedwindow.Quota{Limit: 1, Per: fixedwindow.Day, In: zone})
			require.NoError(t, err)
			d, err := l.Allow(ctx, "tenant")
			require.NoError(t, err)
			assert.Equal(t, ratelimit.Decision{Allowed: true, Limit: 1, ResetAfter: c.reset}, d)
			d, err = l.Allow(ctx, "tenant")
			require.NoError(t, err)
			assert.Equal(t, ratelimit.Decision{Limit: 1, RetryAfter: c.reset, ResetAfter: c.reset}, d)
			mr.SetTime(c.server.Add(c.reset)) // the server's next day
			d, err = l.Allow(ctx, "tenant")
			require.NoError(t, err)
			assert.True(t, d.Allowed, "after the server's day ended: %+v", d)
		})
	}
}

// The quota parity on miniredis, whose TTLs move with the fake clock.
func TestQuotaParityMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { client.Close() })
	redissuite.QuotaParityOn(t, func(clk *clock.Fake) ratelimit.Store {
		return &ttlClock{redisstore.New(client, redisstore.WithClock(clk), redissuite.FreshPrefix()), mr, clk, clk.Now()}
	})
}
