package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redissuite"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// TestSuite runs the tests every Redis must pass (the conformance suite, the parity of
// every algorithm, the cluster's) on redis-server processes; internal/integration runs
// them on containers.
func TestSuite(t *testing.T) { redissuite.Run(t) }

// freshPrefix gives each store of a test its own keys on a shared server.
func freshPrefix() redisstore.Option { return redissuite.FreshPrefix() }

// The conformance suite through go-redis's AutoPipeliner, both its faces (the
// asynchronous one's Process does not wait for the reply).
func TestConformanceAutoPipeliner(t *testing.T) {
	client := redistest.Start(t).Client()
	for name, open := range map[string]func() (*redis.AutoPipeliner, error){
		"blocking": client.AutoPipeline, "async": client.AsyncAutoPipeline,
	} {
		t.Run(name, func(t *testing.T) {
			ap, err := open()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ap.Close() })
			limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
				return redisstore.New(ap, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), freshPrefix())
			})
		})
	}
}

// The same through a Scripter without Process, which the store runs with Script.Run.
func TestConformanceScripterOnly(t *testing.T) {
	client := redistest.Start(t).Client()
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(scripterOnly{client}, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), freshPrefix())
	})
}

type scripterOnly struct{ redis.Scripter }
