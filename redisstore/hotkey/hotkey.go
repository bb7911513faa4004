// Package hotkey is for hot keys: one tenant sending 20,000 requests a second to one key
// makes that key, and the Redis node that holds it, the bottleneck, and every request
// waits for a round trip to it. Three Store decorators take the load off:
//
//   - Leases decides a busy key's requests from events this instance holds on loan from
//     Redis, refilled in the background: no round trip for them, one call per refill for
//     every key refilled at once (token bucket, fixed window, sliding window counter,
//     calendar quotas). Loans are conserved: no event is ever created.
//   - Shard splits one limit over several keys, each with its share of the rule, on
//     different Redis Cluster nodes (any algorithm).
//   - BlockCache answers a key that was just denied without asking Redis until its
//     RetryAfter has passed (any algorithm).
//
// Each wraps any ratelimit.Store (redisstore, or fallback around it; Leases one that
// lends, a core.Lender) and handles only the requests ForRequests selects (all by
// default); the others go straight through.
//
// Each decorator takes only the options that mean something to it, so that a misplaced
// one (a refill interval given to a Shard) does not compile:
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
	only      func(core.Request) bool
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

// ForRequests limits a decorator to the requests f selects (hot keys, or the rules of
// large tenants); the others go straight to the next store. Nil means every request.
func ForRequests(f func(core.Request) bool) Option {
	return anyOption(func(c *hotConfig) { c.only = f })
}

// WithRefill sets the refill interval of Leases (1s by default; 0 or less means the
// default): a lease holds about its key's demand over this interval and a round trip, and
// is renewed at least once in it. A debt, a reset or a rule change reaches every
// instance within it. Four times an interval the refiller looks at every lease (to top it
// up, renew it, give back what it does not need, or end it), and refills a key that had
// less to lend than asked: what the key accrued in that quarter.
func WithRefill(d time.Duration) LeasesOption {
	return leasesOption(func(c *hotConfig) {
		if d > 0 {
			c.refill = d
		}
	})
}

// WithLeaseTTL sets how long a lease of Leases lasts unless renewed (2s by default; 0 or
// less means the default), and so how long it serves through an outage of Redis, and
// how long the events of an instance that died stay out.
func WithLeaseTTL(d time.Duration) LeasesOption {
	return leasesOption(func(c *hotConfig) {
		if d > 0 {
			c.ttl = d
		}
	})
}

// WithInstanceCount tells Leases how many instances share the keys (members.Count, say),
// so that a lease takes no more than a key has left divided by them, and a rule smaller
// than the instances keeps the exact path. Without it, a lease takes no more than the
// key has left divided by the instances holding a lease of it: the rule holds all the
// same (trust is per instance, and loans conserved), but the first instance to ask a
// scarce key gets more of it than its share.
func WithInstanceCount(count func() int) LeasesOption {
	return leasesOption(func(c *hotConfig) { c.instances = count })
}

// WithTrust sets how many events of a key Leases admits on trust at a time (1 by
// default; 0 or less: none): events admitted before the next store counted them, where
// this instance holds no lease of the key, or its lease cannot decide yet. They are
// charged to the next store at once, with the others of the next moments, as debits: a
// key that had none owes them, and repays them from its next events. So beyond the rule,
// at most trust events per instance per key are admitted at any moment. Without trust,
// those requests take the exact path, as without Leases: a round trip each.
func WithTrust(n int) LeasesOption {
	return leasesOption(func(c *hotConfig) { c.trust = int64(max(0, n)) })
}

// WithRetries sets how many other shards Shard tries after a denial (2 by default).
func WithRetries(n int) ShardOption {
	return shardOption(func(c *hotConfig) { c.retries = max(0, n) })
}

// WithClock sets the clock of leases and blocks (clock.NewMonotonic() by default).
func WithClock(c clock.Clock) MemoryOption {
	return memoryOption(func(cfg *hotConfig) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithMaxKeys bounds the keys BlockCache remembers (100,000 by default; past it, the
// expired ones are dropped, and if none is, the oldest half), and the keys Leases leases
// and watches (past it, no key is added until one goes).
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
	return req.Spec.Algorithm != nil && !core.OfLeases(req.Spec.Algorithm) && (c.only == nil || c.only(req))
}
