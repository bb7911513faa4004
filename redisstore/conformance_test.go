package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// prefixes gives each store of a test its own keys on a shared server.
var prefixes atomic.Int64

func freshPrefix() redisstore.Option {
	return redisstore.WithPrefix("test" + strconv.FormatInt(prefixes.Add(1), 10))
}

// The conformance suite of localstore, unchanged, on a real Redis with the fake clock.
func TestConformance(t *testing.T) {
	client := redistest.Start(t).Client()
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), freshPrefix())
	})
}

// The same on a real 3-master Redis Cluster.
func TestConformanceCluster(t *testing.T) {
	client := redistest.StartCluster(t, 3).Client(t)
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), freshPrefix())
	})
}

// The same through go-redis's AutoPipeliner, both its faces (the asynchronous one's
// Process does not wait for the reply).
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
				return redisstore.New(ap, redisstore.WithClock(clk), freshPrefix())
			})
		})
	}
}

// The same on miniredis, for fast runs without a server.
func TestConformanceMiniredis(t *testing.T) {
	mr := miniredis.RunT(t)
	client := miniredisClient(t, mr)
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), freshPrefix())
	})
}

// The same on miniredis's TIME, driven by the fake clock: the scripts' own clock path.
func TestConformanceServerTime(t *testing.T) {
	mr := miniredis.RunT(t)
	client := miniredisClient(t, mr)
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return serverTime{redisstore.New(client, freshPrefix()), mr, clk}
	})
}

// miniredisClient is a client of mr whose callers wait for a connection as long as a
// test may take. miniredis runs one command at a time, and its Lua slowly under -race on
// a busy machine: the suite's 1000 concurrent decisions of several limits, one script
// call each, queue for the pool's connections for longer than go-redis's default pool
// timeout (4s), and the conformance suite checks what is decided, not overload.
func miniredisClient(t *testing.T, mr *miniredis.Miniredis) *redis.Client {
	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolTimeout: 5 * time.Minute})
	t.Cleanup(func() { client.Close() })
	return client
}

// serverTime sets miniredis's TIME to the fake clock before each decision.
type serverTime struct {
	*redisstore.Store
	mr  *miniredis.Miniredis
	clk *clock.Fake
}

func (s serverTime) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	s.mr.SetTime(s.clk.Now())
	return s.Store.Apply(ctx, req)
}

// The same through a Scripter without Process, which the store runs with Script.Run.
func TestConformanceScripterOnly(t *testing.T) {
	client := redistest.Start(t).Client()
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(scripterOnly{client}, redisstore.WithClock(clk), freshPrefix())
	})
}

type scripterOnly struct{ redis.Scripter }
