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
// lends, a ratelimit.Lender) and handles only the requests ForRequests selects (all by
// default); the others go straight through.
//
// Each decorator takes only the options that mean something to it, so that a misplaced
// one (a refill interval given to a Shard) does not compile:
//
//   - ForRequests: all three (Option);
//   - WithClock and WithMaxKeys: Leases and BlockCache, which remember keys (MemoryOption);
//   - WithRefill, WithLeaseTTL and WithInstanceCount: Leases only (LeasesOption);
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
	only       func(ratelimit.Request) bool
	clock      clock.Clock
	retries    int
	maxKeys    int
	refill     time.Duration // Leases: the refill interval
	ttl        time.Duration // Leases: a lease's TTL
	instances  func() int    // Leases: the live instances, nil for none known
	optimistic bool          // Leases: keys without a lease decided from memory too (WithOptimistic)
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
func ForRequests(f func(ratelimit.Request) bool) Option {
	return anyOption(func(c *hotConfig) { c.only = f })
}

// WithRefill sets the refill interval of Leases (1s by default; 0 or less means the
// default): a lease holds about its key's demand over this interval and a round trip, is
// renewed at least once in it, and a key is leased once it is asked twice in a quarter
// of it (or in two quarters running). Four times an interval the refiller looks at every
// lease (to top it up, renew it, give back what it does not need, or end it) and at the
// exact path's keys (to lease the busy ones), and refills a key that had less to lend
// than asked: what the key accrued in that quarter.
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
// so that a lease takes no more than a key has left divided by them; without it, by the
// instances holding a lease of the key.
func WithInstanceCount(count func() int) LeasesOption {
	return leasesOption(func(c *hotConfig) { c.instances = count })
}

// WithOptimistic makes Leases decide from memory the requests of the keys it holds no
// lease of too (quiet keys, a key's first requests on this instance, and a leased key's
// requests while its lease cannot decide yet), within a bound:
//
//   - An admission is made without waiting when it fits this instance's share of what
//     the key had left at the next store's latest answer (its Remaining divided by
//     WithInstanceCount's instances, less what the instance admitted since), an answer
//     heard within a quarter of the refill interval: from a take, a charge or a loan.
//   - A key not heard of within that time, and not leased, admits one event on trust,
//     while none of its admissions made ahead is in flight.
//   - A key denied is denied from memory until its RetryAfter.
//   - The admissions are charged to the next store in the background, together: a
//     thirty-second of the refill interval after the first (31ms by default), as partial
//     takes of one Lend call (one script for up to 20 on Redis), and the answers are what
//     the instance knows of the keys next. What a charge could not take was admitted
//     beyond the rule, and LeasesStats.Excess counts it; what a charge that failed (an
//     error of the next store: over the fallback store, whose partial takes fall back
//     to its shares, none does) could not charge, LeasesStats.Uncharged counts.
//   - A debit (a cost known after the answer: AlgorithmLimiter.Debit, Middleware.Cost)
//     of a key without a lease, that leaves the key at least one event as far as the
//     instance knows (what it heard within that time, else the rule's Limit, less what
//     it admitted and debited since), is charged with them, in the same call, and comes
//     off the instance's share at once; its answer is that estimate. A debit that would
//     not leave the key one event, or that keeps a reserve, goes to the next store at
//     once, and its answer (a debt) denies the key's admissions from memory until its
//     RetryAfter.
//
// So the instances together admit ahead at most what the key had left at the answers they
// heard, and beyond the rule only the events on trust (one per instance per key in the
// charge's 31ms and round trip: with 20 instances, a key of 100 a second admits at most
// 20 more in the moments it runs out) and what the leases and the exact path took from the
// key since those answers. In the lease harness (BENCHMARKS.md: four instances, 8,000
// requests a second for 15s) that was 17 to 59 events of 120,000.
//
// Leases then lease only the keys that pay for it: a key asked of an instance a quarter
// of its share of the rule or more (the rule's Limit over 4 x WithInstanceCount's
// instances, over a refill interval; measured over a quarter of one at least), the
// others decided ahead, their charges riding the calls of the others' (a lease costs a
// call to lend it, its renewals, and one when it ends).
//
// A rule whose Limit is less than the instances (a login limit of 5 a minute on 20
// instances) keeps the exact path. Several limits of one request (ApplyAll) are decided
// so together, all or none, each from its lease where it has one that can decide, else
// ahead. A take with a receipt (a Charge, every ratelimit.Middleware decision) is charged
// as a take of its own, and a refund of it (a Charge settled below its estimate, the
// Middleware refunding a request it refused) sends it at once, waits for it to land,
// then gives back as the next store's receipt says.
func WithOptimistic() LeasesOption {
	return leasesOption(func(c *hotConfig) { c.optimistic = true })
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
		refill: time.Second, ttl: 2 * time.Second}
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
func (c *hotConfig) handles(req ratelimit.Request) bool {
	return req.Spec.Algorithm != nil && !core.OfLeases(req.Spec.Algorithm) && (c.only == nil || c.only(req))
}
