// Package redissuite holds the tests of redisstore that every Redis the harness can
// start must pass: the conformance suite, the Go/Lua parity of every algorithm, the case
// study's 1,000 parallel requests, and the cluster's. redisstore's tests run them on
// redis-server processes; internal/integration's run the same functions on containers
// (and the parity on miniredis). Each starts its servers with redistest, so it runs on
// whatever Launcher the test binary chose.
package redissuite

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// Tests are the suite, in the order Run runs them.
var Tests = []struct {
	Name string
	Run  func(*testing.T)
}{
	{"Conformance", Conformance},
	{"ConformanceCluster", ConformanceCluster},
	{"Parity", Parity},
	{"InFlightParity", InFlightParity},
	{"QuotaParity", QuotaParity},
	{"LendParity", LendParity},
	{"LendParityCluster", LendParityCluster},
	{"QuotaTTL", QuotaTTL},
	{"Atomicity", Atomicity},
	{"ClusterSpread", ClusterSpread},
	{"AllowAllAcrossSlots", AllowAllAcrossSlots},
	{"ClusterFailover", ClusterFailover},
}

// Run runs every test of the suite as a subtest of t.
func Run(t *testing.T) {
	for _, test := range Tests {
		t.Run(test.Name, test.Run)
	}
}

// prefixes gives each store of a test its own keys on a shared server.
var prefixes atomic.Int64

// FreshPrefix is a key prefix no other store of this test binary uses.
func FreshPrefix() redisstore.Option {
	return redisstore.WithPrefix("test" + strconv.FormatInt(prefixes.Add(1), 10))
}

func apply(t *testing.T, s ratelimit.Store, alg *core.Algorithm, key string, rule ratelimit.Rule, n int64) (core.Outcome, error) {
	t.Helper()
	return s.Apply(context.Background(), core.Request{Key: key, N: n, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(rule)}})
}

// Conformance runs the conformance suite of localstore, unchanged, on a real Redis with
// the fake clock.
func Conformance(t *testing.T) {
	client := redistest.Start(t).Client()
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), FreshPrefix())
	})
}

// ConformanceCluster runs the same on a real 3-master Redis Cluster.
func ConformanceCluster(t *testing.T) {
	client := redistest.StartCluster(t, 3).Client(t)
	limitertest.Run(t, func(t *testing.T, clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), FreshPrefix())
	})
}

// Atomicity: 1000 parallel requests from 8 clients on one key, on the server's clock,
// admit exactly the limit for every algorithm (it cannot refill in an hour).
func Atomicity(t *testing.T) {
	srv := redistest.Start(t)
	var stores []*redisstore.Store
	for range 8 {
		stores = append(stores, redisstore.New(srv.Client(), redisstore.WithPrefix("atomic")))
	}
	rule := ratelimit.PerHour(100)
	for _, k := range limitertest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for i := range 1000 {
				wg.Go(func() {
					d, err := apply(t, stores[i%8], k.Algorithm, "hot", rule, 1)
					if err != nil {
						t.Error(err)
					} else if d.Allowed() {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			if admitted.Load() != rule.Limit {
				t.Errorf("admitted %d of 1000; want exactly %d", admitted.Load(), rule.Limit)
			}
		})
	}
}
