// Package hotkey is for hot keys: one tenant sending 20,000 requests a second to one key
// makes that key, and the Redis node that holds it, the bottleneck. Three Store
// decorators take the load off:
//
//   - Prefetch takes tokens from Redis in batches and spends them locally, so Redis sees
//     one call per batch (token bucket, fixed window and sliding window).
//   - Shard splits one limit over several keys, each with its share of the rule, on
//     different Redis Cluster nodes (any algorithm).
//   - BlockCache answers a key that was just denied without asking Redis until its
//     RetryAfter has passed (any algorithm).
//
// Each wraps any ratelimit.Store (redisstore, or fallback around it) and handles only
// the requests ForRequests selects (all by default); the others go straight through.
//
// Each decorator takes only the options that mean something to it, so that a misplaced
// one (a grant time given to a Shard) does not compile:
//
//   - ForRequests: all three (Option);
//   - WithClock and WithMaxKeys: Prefetch and BlockCache, which remember keys (MemoryOption);
//   - WithGrantTime: Prefetch only (PrefetchOption);
//   - WithRetries: Shard only (ShardOption).
package hotkey

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/redisx"
)

// PrefetchOption configures a Prefetch.
type PrefetchOption interface{ applyPrefetch(*hotConfig) }

// ShardOption configures a Shard.
type ShardOption interface{ applyShard(*hotConfig) }

// BlockCacheOption configures a BlockCache.
type BlockCacheOption interface{ applyBlockCache(*hotConfig) }

// MemoryOption configures what Prefetch and BlockCache remember of each key.
type MemoryOption interface {
	PrefetchOption
	BlockCacheOption
}

// Option configures any of Prefetch, Shard and BlockCache.
type Option interface {
	PrefetchOption
	ShardOption
	BlockCacheOption
}

type hotConfig struct {
	only      func(ratelimit.Request) bool
	clock     clock.Clock
	grantTime time.Duration
	retries   int
	maxKeys   int
}

// The option types: one per set of decorators an option applies to.
type (
	anyOption      func(*hotConfig)
	memoryOption   func(*hotConfig)
	prefetchOption func(*hotConfig)
	shardOption    func(*hotConfig)
)

func (f anyOption) applyPrefetch(c *hotConfig)      { f(c) }
func (f anyOption) applyShard(c *hotConfig)         { f(c) }
func (f anyOption) applyBlockCache(c *hotConfig)    { f(c) }
func (f memoryOption) applyPrefetch(c *hotConfig)   { f(c) }
func (f memoryOption) applyBlockCache(c *hotConfig) { f(c) }
func (f prefetchOption) applyPrefetch(c *hotConfig) { f(c) }
func (f shardOption) applyShard(c *hotConfig)       { f(c) }

// ForRequests limits a decorator to the requests f selects (hot keys, or the rules of
// large tenants); the others go straight to the next store. Nil means every request.
func ForRequests(f func(ratelimit.Request) bool) Option {
	return anyOption(func(c *hotConfig) { c.only = f })
}

// WithGrantTime sets how long Prefetch may spend the tokens of one fetch, its grant (100ms by default; 0
// or less means the default).
func WithGrantTime(d time.Duration) PrefetchOption {
	return prefetchOption(func(c *hotConfig) {
		if d > 0 {
			c.grantTime = d
		}
	})
}

// WithRetries sets how many other shards Shard tries after a denial (2 by default).
func WithRetries(n int) ShardOption {
	return shardOption(func(c *hotConfig) { c.retries = max(0, n) })
}

// WithClock sets the clock of grants and blocks (clock.NewMonotonic() by default).
func WithClock(c clock.Clock) MemoryOption {
	return memoryOption(func(cfg *hotConfig) {
		if c != nil {
			cfg.clock = c
		}
	})
}

// WithMaxKeys bounds the keys Prefetch and BlockCache remember (100,000 by default); past
// it, the expired ones are dropped, and if none is, the oldest half.
func WithMaxKeys(n int) MemoryOption {
	return memoryOption(func(c *hotConfig) {
		if n > 0 {
			c.maxKeys = n
		}
	})
}

func newHotConfig[O any](name string, next ratelimit.Store, opts []O, apply func(O, *hotConfig)) hotConfig {
	if next == nil {
		panic("hotkey: " + name + " with a nil store")
	}
	c := hotConfig{clock: clock.NewMonotonic(), grantTime: 100 * time.Millisecond, retries: 2, maxKeys: 100_000}
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

type algKey struct {
	alg     *ratelimit.Algorithm
	ns, key string
}

// table is a bounded map of per-key entries, safe for concurrent use. Its lock is held
// only to find or add an entry, never across a call to a store, and an entry's expiry is
// read without the entry's own lock: one slow key never delays another.
type table[V any] struct {
	mu      sync.Mutex
	entries map[algKey]*V
	expiry  func(*V) *atomic.Int64 // the instant the entry is worth nothing (UnixNano)
	max     int
}

func (t *table[V]) get(k algKey, now int64) *V {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.entries == nil {
		t.entries = make(map[algKey]*V)
	}
	v, ok := t.entries[k]
	if !ok {
		if len(t.entries) >= t.max {
			t.prune(now)
		}
		v = new(V)
		t.entries[k] = v
	}
	return v
}

// prune drops the expired entries, or, if none is, half of them (map order is random). A
// call in flight on a dropped entry finishes on it, and what it learns is forgotten.
func (t *table[V]) prune(now int64) {
	for k, v := range t.entries {
		if t.expiry(v).Load() <= now {
			delete(t.entries, k)
		}
	}
	for k := range t.entries {
		if len(t.entries) < t.max/2+1 {
			break
		}
		delete(t.entries, k)
	}
}

// Prefetch takes tokens from the next store in batches and spends them locally, so that
// a hot key costs Redis one call per batch instead of one per request.
//
// A request for a key without tokens in hand asks the next store for batch tokens at once
// (fewer if the rule's capacity is smaller; just the request's own if a batch is not
// left), keeps what it does not use, and spends it on the following requests until the
// grant runs out (WithGrantTime, 100ms) or the rule changes; then what is left lapses. One
// fetch at a time per key: requests that find one in flight and no tokens in hand wait
// for it (each no longer than its context allows) and spend from it. No lock is held
// while the next store decides, so a slow key never delays another.
//
// The bound: every token is counted by Redis when it is fetched, so the cluster never
// admits more than the rule allowed Redis to give out; it may admit them up to a grant
// time later, so in an interval the cluster can admit up to instances x batch more than the
// rule would have in that same interval, and tokens that lapse (at most batch per
// instance per grant) are lost to the key until the bucket or window refills.
//
// A request the next store denies is denied from memory, with the same rule and n, until
// its RetryAfter has passed, as BlockCache does: a key at its limit
// costs Redis two calls per RetryAfter, not two per request.
//
// It handles the algorithms that declare themselves ratelimit.Algorithm.Prefetchable
// (the token bucket, the fixed window and the sliding window counter); the others' requests
// go straight through, as do peeks and the requests that keep a reserve for more
// important ones (Request.Reserve: only the next store sees what the key has left, and
// it counts the tokens in hand as taken); a refund or a reset of a key ends its grant.
// Decisions from a grant report the next store's Remaining at the fetch plus the tokens
// still in hand, and the ResetAfter the next store gave at the fetch, less the time since
// (never 0: the key is not full while its tokens are out).
type Prefetch struct {
	next   ratelimit.Store
	batch  int64
	cfg    hotConfig
	grants table[grant]
}

// grant is the tokens of one key that Prefetch holds from a fetch, and the denial it
// remembers.
type grant struct {
	mu               sync.Mutex
	gen              uint64 // bumped by every refund and reset, before and after it reaches the store
	rule             ratelimit.Rule
	tokens           int64 // fetched and not yet spent
	expires          int64 // UnixNano
	resetUntil       int64 // UnixNano: the next store's ResetAfter at the fetch
	limit, remaining int64 // the rule's Limit, and the next store's Remaining at the fetch
	denied           ratelimit.Outcome
	deniedN          int64 // requests of this n are denied until deniedUntil
	deniedUntil      int64
	fetching         *fetch       // the fetch in flight, nil if none
	until            atomic.Int64 // max(expires, deniedUntil), for the table's prune
}

// fetch is a call in flight that others wait for (a grant's fetch, a script's load);
// done is closed when it ends.
type fetch struct {
	done chan struct{}
	err  error
}

var _ ratelimit.Store = (*Prefetch)(nil)

// NewPrefetch returns a Prefetch of batch tokens (at least 1) over next. It panics for a
// nil next or a nil option.
func NewPrefetch(next ratelimit.Store, batch int64, opts ...PrefetchOption) *Prefetch {
	p := &Prefetch{next: next, batch: max(1, batch),
		cfg: newHotConfig("NewPrefetch", next, opts, PrefetchOption.applyPrefetch)}
	p.grants = table[grant]{max: p.cfg.maxKeys, expiry: func(l *grant) *atomic.Int64 { return &l.until }}
	return p
}

// Apply spends a token in hand, or fetches a new batch.
func (p *Prefetch) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if !p.cfg.handles(req) || !req.Spec.Algorithm.Prefetchable || req.Spec.Reserve != 0 {
		return p.next.Apply(ctx, req)
	}
	a, err := req.Spec.Algorithm.Prepare(req.Spec.Rule, req.N)
	if err != nil {
		return ratelimit.Outcome{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Outcome{}, err
	}
	now := clock.UnixNano(p.cfg.clock)
	l := p.grants.get(algKey{req.Spec.Algorithm, req.Spec.Namespace, req.Key}, now)
	if req.Spec.Op != "" { // peeks go through; a refund or reset ends the grant
		if req.Spec.Op == "peek" {
			return p.next.Apply(ctx, req)
		}
		l.mu.Lock()
		l.end()
		l.mu.Unlock()
		d, err := p.next.Apply(ctx, req)
		l.mu.Lock() // a fetch decided before the refund reached the store must not stand
		l.end()
		l.mu.Unlock()
		return d, err
	}
	for {
		l.mu.Lock()
		if l.rule == req.Spec.Rule && now < l.expires && l.tokens >= req.N {
			l.tokens -= req.N
			d := ratelimit.Outcome{Allowed: true, Remaining: min(l.limit, l.remaining+l.tokens),
				Reset: time.Duration(max(l.resetUntil-now, int64(time.Microsecond)))}
			l.mu.Unlock()
			return d, nil
		}
		if l.rule == req.Spec.Rule && now < l.deniedUntil && req.N == l.deniedN { // denied until then
			d := l.denied
			d.Wait = time.Duration(l.deniedUntil - now)
			d.Reset = max(d.Wait, time.Duration(l.resetUntil-now))
			l.mu.Unlock()
			return d, nil
		}
		if f := l.fetching; f != nil { // wait for the fetch in flight, and spend from it
			l.mu.Unlock()
			select {
			case <-f.done:
				if f.err != nil {
					return ratelimit.Outcome{}, f.err
				}
				now = clock.UnixNano(p.cfg.clock)
				continue
			case <-ctx.Done():
				return ratelimit.Outcome{}, ctx.Err()
			}
		}
		f := &fetch{done: make(chan struct{})}
		l.fetching = f
		gen := l.gen
		l.mu.Unlock()
		d, fetched, err := p.fetch(ctx, req, a)
		l.mu.Lock()
		l.fetching = nil
		if ctx.Err() == nil { // the waiters share the fetch's error, unless it was this caller's end
			f.err = err
		}
		close(f.done)
		if gen != l.gen || err != nil { // a refund or reset came by, or nothing was learned
			l.mu.Unlock()
			return d, err
		}
		l.rule, l.tokens, l.deniedUntil = req.Spec.Rule, 0, 0
		if !d.Allowed { // remember the denial of n until its RetryAfter, like BlockCache
			if fetched == req.N {
				l.denied, l.deniedN, l.deniedUntil = d, req.N, now+int64(d.Wait)
				l.resetUntil = now + int64(d.Reset)
			}
		} else {
			l.tokens, l.expires, l.limit, l.remaining = fetched-req.N, now+int64(p.cfg.grantTime), a.Limit, d.Remaining
			l.resetUntil = now + int64(d.Reset)
			d.Remaining = min(a.Limit, d.Remaining+l.tokens)
		}
		l.until.Store(max(l.expires, l.deniedUntil))
		l.mu.Unlock()
		return d, nil
	}
}

// fetch takes a batch for req from the next store: batch tokens, or what is left if a
// batch is not, or just req's own. It returns the Outcome and how many it asked for.
func (p *Prefetch) fetch(ctx context.Context, req ratelimit.Request, a ratelimit.Args) (ratelimit.Outcome, int64, error) {
	f := req
	f.N = min(max(p.batch, req.N), a.Limit)
	d, err := p.next.Apply(ctx, f)
	if err == nil && !d.Allowed && f.N > req.N { // not a batch left: what is left, or just n
		f.N = max(req.N, d.Remaining)
		d, err = p.next.Apply(ctx, f)
	}
	return d, f.N, err
}

// end drops the tokens in hand and the denial remembered, and makes a fetch in flight
// stale; l.mu is held.
func (l *grant) end() {
	l.tokens, l.deniedUntil = 0, 0
	l.gen++
}

// Shard splits one limit over shards keys, each with 1/shards of the rule (Limit and
// Burst divided, rounded down; a Limit below shards is 1 per a Period stretched to
// fit). Requests go to the shards in turn, and a denied one tries up to
// WithRetries (2) more before the answer is "denied", so a key under its total limit is
// not denied by an uneven spread. Each shard's key has a hash tag of its own, so on Redis
// Cluster the shards of one key sit on different nodes.
//
// Decisions report the whole rule's Limit, and Remaining as the shard's times shards (an
// estimate). A request for more than one shard's capacity is an error wrapping
// ratelimit.ErrInvalidN. A peek or a refund goes to the next shard in turn; a reset
// to every shard.
type Shard struct {
	next   ratelimit.Store
	shards int64
	cfg    hotConfig
	turn   atomic.Uint64
}

var _ ratelimit.Store = (*Shard)(nil)

// NewShard returns a Shard of shards keys (at least 1) over next. It panics for a nil
// next or a nil option.
func NewShard(next ratelimit.Store, shards int, opts ...ShardOption) *Shard {
	return &Shard{next: next, shards: int64(max(1, shards)),
		cfg: newHotConfig("NewShard", next, opts, ShardOption.applyShard)}
}

// Apply decides on the shards in turn.
func (s *Shard) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if !s.cfg.handles(req) {
		return s.next.Apply(ctx, req)
	}
	whole, err := req.Spec.Algorithm.Prepare(req.Spec.Rule, req.N)
	if err != nil {
		return ratelimit.Outcome{}, err
	}
	share := core.Share(req.Spec.Rule, s.shards)
	one, err := req.Spec.Algorithm.Prepare(share, 1)
	if err != nil {
		return ratelimit.Outcome{}, fmt.Errorf("hotkey: shard: %v over %d shards is %v each: %w", req.Spec.Rule, s.shards, share, err)
	}
	if req.N > one.Limit {
		return ratelimit.Outcome{}, fmt.Errorf("hotkey: shard: n = %d, one of %d shards holds %d: %w",
			req.N, s.shards, one.Limit, ratelimit.ErrInvalidN)
	}
	shareSpec := core.WithRule(req.Spec, share)
	if req.Spec.Op == "reset" { // every shard
		var d ratelimit.Outcome
		for i := range uint64(s.shards) {
			sub := req
			sub.Key, sub.Spec = shardKey(req.Key, i), shareSpec
			if d, err = s.next.Apply(ctx, sub); err != nil {
				return ratelimit.Outcome{}, err
			}
		}
		d.Remaining = min(whole.Limit, d.Remaining*s.shards)
		return d, nil
	}
	first := s.turn.Add(1) // a take, or a peek or refund of the next shard in turn
	var best ratelimit.Outcome
	for i := range min(int64(s.cfg.retries)+1, s.shards) {
		sub := req
		sub.Key, sub.Spec = shardKey(req.Key, (first+uint64(i))%uint64(s.shards)), shareSpec
		d, err := s.next.Apply(ctx, sub)
		if err != nil {
			return ratelimit.Outcome{}, err
		}
		if d.Allowed || i == 0 || d.Wait < best.Wait {
			best = d
		}
		if d.Allowed || req.Spec.Op != "" {
			break
		}
	}
	best.Remaining = min(whole.Limit, best.Remaining*s.shards)
	return best, nil
}

// shardKey is the key of shard i of key: a hash tag of its own (the key's digest and
// the shard), so that redisstore keeps it and the cluster spreads the shards; then the
// key itself, so that distinct keys stay distinct.
func shardKey(key string, i uint64) string {
	return redisx.Shard(key, i)
}

// BlockCache answers a key that was denied, with the same rule and the same n, from
// memory until its RetryAfter has passed: an abuser who keeps hammering a denied key
// costs Redis nothing. Decisions from the cache are the denial's, with the RetryAfter and
// ResetAfter left (a larger n would need longer, a smaller one may fit: both are asked).
// Requests that keep a reserve for more important ones (Request.Reserve: priorities) are
// blocked apart, each by a denial that kept the same: a critical request may fit where a
// sheddable one did not, and what it takes makes the others wait longer, so a request
// admitted through the cache ends the key's blocks, as a refund or a reset does.
type BlockCache struct {
	next    ratelimit.Store
	cfg     hotConfig
	blocked table[block]
}

type block struct {
	mu     sync.Mutex
	expiry atomic.Int64 // the latest until, for the table's prune
	gen    uint64       // bumped by every refund and reset, before and after it reaches the store
	by     []denial     // one per reserve, at most maxReserves
	held   atomic.Bool  // len(by) > 0, for the admitted requests' look without the lock
}

// denial is a denied request, which blocks the same until it may fit.
type denial struct {
	rule       ratelimit.Rule
	n, reserve int64
	until      int64 // UnixNano
	resetUntil int64
	remaining  int64
}

// maxReserves bounds the denials a key's block holds, one per reserve: priorities are few.
const maxReserves = 8

// find is the denial that blocks req at now, or nil; bl.mu is held.
func (bl *block) find(req ratelimit.Request, now int64) *denial {
	for i := range bl.by {
		d := &bl.by[i]
		if d.reserve == req.Spec.Reserve && d.rule == req.Spec.Rule && d.n == req.N && now < d.until {
			return d
		}
	}
	return nil
}

// record keeps d, in place of the denial of the same reserve or of the one that ends
// first; bl.mu is held.
func (bl *block) record(d denial) {
	at := -1
	for i := range bl.by {
		if bl.by[i].reserve == d.reserve {
			at = i
			break
		}
	}
	if at < 0 && len(bl.by) < maxReserves {
		bl.by = append(bl.by, d)
	} else {
		if at < 0 {
			at = 0
			for i := range bl.by {
				if bl.by[i].until < bl.by[at].until {
					at = i
				}
			}
		}
		bl.by[at] = d
	}
	bl.held.Store(true)
	bl.expiry.Store(max(bl.expiry.Load(), d.until))
}

var _ ratelimit.Store = (*BlockCache)(nil)

// NewBlockCache returns a BlockCache over next. It panics for a nil next or a nil option.
func NewBlockCache(next ratelimit.Store, opts ...BlockCacheOption) *BlockCache {
	b := &BlockCache{next: next, cfg: newHotConfig("NewBlockCache", next, opts, BlockCacheOption.applyBlockCache)}
	b.blocked = table[block]{max: b.cfg.maxKeys, expiry: func(bl *block) *atomic.Int64 { return &bl.expiry }}
	return b
}

// Apply denies from memory while the key is blocked, else asks the next store.
func (b *BlockCache) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if !b.cfg.handles(req) {
		return b.next.Apply(ctx, req)
	}
	if _, err := req.Spec.Algorithm.Prepare(req.Spec.Rule, req.N); err != nil {
		return ratelimit.Outcome{}, err
	}
	now := clock.UnixNano(b.cfg.clock)
	bl := b.blocked.get(algKey{req.Spec.Algorithm, req.Spec.Namespace, req.Key}, now)
	gives := req.Spec.Op == "refund" || req.Spec.Op == "reset" // the key may have room after it
	bl.mu.Lock()
	if gives {
		bl.unblock()
	}
	if den := bl.find(req, now); den != nil {
		d := ratelimit.Outcome{Remaining: den.remaining, Wait: time.Duration(den.until - now),
			Reset: time.Duration(max(den.until, den.resetUntil) - now)}
		bl.mu.Unlock()
		return d, nil
	}
	gen := bl.gen
	bl.mu.Unlock()
	d, err := b.next.Apply(ctx, req)
	switch {
	case gives:
		// a denial decided before this refund reached the store, and recorded after the
		// unblock above, must not stand: unblock again, and make it stale
		bl.mu.Lock()
		bl.unblock()
		bl.mu.Unlock()
	case err == nil && d.Allowed && req.Spec.Op == "" && bl.held.Load(): // what it took moves every denial's wait
		bl.mu.Lock()
		bl.unblock()
		bl.mu.Unlock()
	case err == nil && !d.Allowed && d.Wait > 0 && req.Spec.Op == "":
		bl.mu.Lock()
		if bl.gen == gen { // no refund or reset came between the decision and now
			bl.record(denial{rule: req.Spec.Rule, n: req.N, reserve: req.Spec.Reserve, remaining: d.Remaining,
				until: now + int64(d.Wait), resetUntil: now + int64(d.Reset)})
		}
		bl.mu.Unlock()
	}
	return d, err
}

// unblock forgets the block, and makes every denial decided before it stale; bl.mu is held.
func (bl *block) unblock() {
	bl.by = bl.by[:0]
	bl.held.Store(false)
	bl.gen++
}
