package redisstore

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/leakybucket"
	"github.com/ratelimit-go/ratelimit/slidinglog"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// Recommended sets in o the go-redis settings of a client that decides rate limits, and
// returns o. A nil o gets a new Options.
//
//	client := redis.NewClient(redisstore.Recommended(&redis.Options{Addr: addr}))
//
// With these settings, a decision's timeout (fallback.WithTimeout) stops the work as well
// as the wait. An outage then piles up neither connections nor goroutines. The settings
// are these:
//   - ContextTimeoutEnabled: stop waiting for a connection at the decision's deadline.
//   - A DialTimeout of 100ms and one DialerRetries: reconnections fail fast.
//   - ReadTimeout and WriteTimeout of 1s: how long a late reply is waited for.
//   - A PoolTimeout of 10ms: a saturated pool fails fast.
//   - No MaxRetries: a take resent after a lost reply would count twice.
//
// Recommended keeps everything else of o: the address, credentials, TLS, the pool's size.
func Recommended(o *redis.Options) *redis.Options {
	if o == nil {
		o = &redis.Options{}
	}
	o.ContextTimeoutEnabled = true
	o.DialTimeout, o.DialerRetries = 100*time.Millisecond, 1
	o.ReadTimeout, o.WriteTimeout = time.Second, time.Second
	o.PoolTimeout = 10 * time.Millisecond
	o.MaxRetries = -1
	return o
}

// RecommendedCluster is Recommended for a Redis Cluster. It sets the same settings, and
// has the client reload the cluster's map of slots every 5s (ClusterStateReloadInterval).
// A slot that moves announces itself by no error to a client that does not retry.
// The store also reloads the map at once when a master fails (see New, "Redis Cluster").
func RecommendedCluster(o *redis.ClusterOptions) *redis.ClusterOptions {
	if o == nil {
		o = &redis.ClusterOptions{}
	}
	o.ContextTimeoutEnabled = true
	o.DialTimeout, o.DialerRetries = 100*time.Millisecond, 1
	o.ReadTimeout, o.WriteTimeout = time.Second, time.Second
	o.PoolTimeout = 10 * time.Millisecond
	o.MaxRetries = -1
	o.ClusterStateReloadInterval = 5 * time.Second
	return o
}

// builtIn are the algorithms of this module, whose scripts LoadScripts loads when it is
// given none: the five, the calendar quotas (one script for every calendar and zone) and
// the in-flight limit.
func builtIn() []*core.Algorithm {
	quota, _ := fixedwindow.Quota{Limit: 1, Per: fixedwindow.Month}.Algorithm() // valid: no error
	return []*core.Algorithm{tokenbucket.Algorithm(), leakybucket.Algorithm(), fixedwindow.Algorithm(),
		slidingwindow.Algorithm(), slidinglog.Algorithm(), quota, concurrency.Algorithm()}
}
