// Package hotkey provides Store decorators that take the load of hot keys off Redis. A
// hot key is one key asked many times a second, such as one tenant sending 20,000
// requests a second. That key, and the Redis node that holds it, become the bottleneck.
// Every request waits for a round trip to it.
//
// Leases admits beyond the rule at most WithTrust's events per instance and key, one by
// default, and what its doc's bound lists. BlockCache and Shard admit nothing beyond it,
// but see Shard for small rules. The three decorators are:
//
//   - Leases decides a busy key's requests from events this instance holds on loan from
//     Redis. So those requests make no round trip. It refills its loans in the
//     background, in one call for every key refilled at once. Loans are conserved: no
//     event is ever created. It works for the token bucket, the fixed window, the
//     sliding window counter and the calendar quotas.
//   - Shard splits one limit over several keys, each with its share of the rule, on
//     different Redis Cluster nodes. It works for any algorithm.
//   - BlockCache answers a key that was just denied without asking Redis, until its
//     RetryAfter has passed. It works for any algorithm.
//
// Each wraps any ratelimit.Store: redisstore, or fallback around it. Leases needs one
// that lends: localstore, redisstore or fallback. Each handles only the requests ForRequests selects, all by
// default. The others go straight through.
//
// Each decorator takes only the options that mean something to it. So a misplaced one,
// such as a refill interval given to a Shard, does not compile:
//
//   - ForRequests: all three (Option);
//   - WithClock and WithMaxKeys: Leases and BlockCache, which remember keys (MemoryOption);
//   - WithRefill, WithLeaseTTL, WithInstanceCount and WithTrust: Leases only (LeasesOption);
//   - WithRetries: Shard only (ShardOption).
package hotkey

import (
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// LeasesOption configures Leases.
type LeasesOption interface{ applyLeases(*hotConfig) }

// ShardOption configures a Shard.
type ShardOption interface{ applyShard(*hotConfig) }

// BlockCacheOption configures a BlockCache.
type BlockCacheOption interface{ applyBlockCache(*hotConfig) }

// MemoryOption configures what Leases and BlockCache remember of each key.
type MemoryOption interface {
	LeasesOption
	BlockCacheOption
}

// Option configures any of Leases, Shard and BlockCache.
type Option interface {
	LeasesOption
	ShardOption
	BlockCacheOption
}

type hotConfig struct {
	only      func(namespace, key string) bool
	clock     clock.Clock
	retries   int
	maxKeys   int
	refill    time.Duration // Leases: the refill interval
	ttl       time.Duration // Leases: a lease's TTL
	instances func() int    // Leases: the live instances, nil for none known
	trust     int64         // Leases: the events of a key admitted on trust at a time (WithTrust)
}

// The option types: one per set of decorators an option applies to.
type (
	anyOption    func(*hotConfig)
	memoryOption func(*hotConfig)
	leasesOption func(*hotConfig)
	shardOption  func(*hotConfig)
)

func (f anyOption) applyShard(c *hotConfig)         { f(c) }
func (f anyOption) applyLeases(c *hotConfig)        { f(c) }
func (f memoryOption) applyLeases(c *hotConfig)     { f(c) }
func (f leasesOption) applyLeases(c *hotConfig)     { f(c) }
func (f anyOption) applyBlockCache(c *hotConfig)    { f(c) }
func (f memoryOption) applyBlockCache(c *hotConfig) { f(c) }
func (f shardOption) applyShard(c *hotConfig)       { f(c) }

// ForRequests limits a decorator to the requests f selects, by the limiter's namespace
// and the key: hot keys, or the rules of large tenants. The others go straight to the
// next store. Nil means every request.
func ForRequests(f func(namespace, key string) bool) Option {
	return anyOption(func(c *hotConfig) { c.only = f })
}

// WithRefill sets the refill interval of Leases. The default is 1s; 0 or less means the
// default. A lease holds about its key's demand over this interval and a round trip. It
// is renewed at least once in it. A debt, a reset or a rule change reaches every
// instance within it.
func WithRefill(d time.Duration) LeasesOption {
	return leasesOption(func(c *hotConfig) {
		if d > 0 {
			c.refill = d
		}
	})
}

// WithLeaseTTL sets how long a lease of Leases lasts unless renewed. The default is 2s;
// 0 or less means the default. A lease serves that long through an outage of Redis. The
// events of an instance that died stay out that long too.
func WithLeaseTTL(d time.Duration) LeasesOption {
	return leasesOption(func(c *hotConfig) {
		if d > 0 {
			c.ttl = d
		}
	})
}

// WithInstanceCount tells Leases how many instances share the keys (members.Count, say).
// A lease then takes no more than a key has left divided by them. A rule smaller than
// the instances keeps the exact path.
//
// Without it, a lease takes no more than the key has left divided by the instances
// holding a lease of it. The rule holds all the same, since trust is per instance and
// loans are conserved. But the first instance to ask a scarce key gets more of it than
// its share.
func WithInstanceCount(count func() int) LeasesOption {
	return leasesOption(func(c *hotConfig) { c.instances = count })
}

// WithTrust sets how many events of a key Leases admits on trust at a time. The default
// is 1; 0 or less means none. Events on trust are admitted before the next store counted
// them. That happens where this instance holds no lease of the key, or its lease cannot
// decide yet.
//
// They are charged to the next store at once, as debits. A key that had none left owes
// them, and repays them from its next events. So beyond the rule, at most n events per
// instance per key are admitted at any moment. Without trust, those requests take the
// exact path, as without Leases: a round trip each.
func WithTrust(n int) LeasesOption {
	return leasesOption(func(c *hotConfig) { c.trust = int64(max(0, n)) })
}

// WithRetries sets how many other shards Shard tries after a denial (2 by default).
func WithRetries(n int) ShardOption {
	return shardOption(func(c *hotConfig) { c.retries = max(0, n) })
}

// WithClock sets the clock of leases and blocks. The default is clock.NewMonotonic().
func WithClock(c clock.Clock) MemoryOption {
	return memoryOption(func(cfg *hotConfig) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithMaxKeys bounds the keys BlockCache remembers, and the keys Leases leases and
// watches. The default is 100,000. Past it, BlockCache drops the expired keys, then
// others at random until half are left. Past it, Leases adds no key until one goes.
func WithMaxKeys(n int) MemoryOption {
	return memoryOption(func(c *hotConfig) {
		if n > 0 {
			c.maxKeys = n
		}
	})
}

// leaseConfig is the configuration of Leases.
type leaseConfig = hotConfig

func newLeaseConfig(next ratelimit.Store, opts []LeasesOption) leaseConfig {
	return newHotConfig("NewLeases", next, opts, LeasesOption.applyLeases)
}

func newHotConfig[O any](name string, next ratelimit.Store, opts []O, apply func(O, *hotConfig)) hotConfig {
	if next == nil {
		panic("hotkey: " + name + " with a nil store")
	}
	c := hotConfig{clock: clock.NewMonotonic(), retries: 2, maxKeys: 100_000,
		refill: time.Second, ttl: 2 * time.Second, trust: 1}
	for _, o := range opts {
		if any(o) == nil {
			panic("hotkey: " + name + " with a nil option")
		}
		apply(o, &c)
	}
	return c
}

// handles reports whether a decorator works on req, or passes it straight through: the
// leases of an in-flight limit always pass, as a lease must be released where it was
// taken, and a release on another instance frees it before any RetryAfter.
func (c *hotConfig) handles(req core.Request) bool {
	return req.Spec.Algorithm != nil && !core.OfLeases(req.Spec.Algorithm) && (c.only == nil || c.only(req.Spec.Namespace, req.Key))
}
