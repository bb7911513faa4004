package hotkey

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

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
// It handles the algorithms that declare themselves ratelimit.Algorithm.Lendable
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
	if !p.cfg.handles(req) || !req.Spec.Algorithm.Lendable || req.Spec.Reserve != 0 {
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
		if d, ok := l.inHand(req, now); ok {
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
		return p.refill(ctx, l, req, a, now) // with l.mu held
	}
}

// inHand is the Outcome of req from what l holds at now: a token in hand, or a denial
// remembered; ok false when l has neither for it. l.mu is held.
func (l *grant) inHand(req ratelimit.Request, now int64) (ratelimit.Outcome, bool) {
	if l.rule == req.Spec.Rule && now < l.expires && l.tokens >= req.N {
		l.tokens -= req.N
		return ratelimit.Args{Limit: l.limit}.Outcome(true, min(l.limit, l.remaining+l.tokens), 0,
			time.Duration(max(l.resetUntil-now, int64(time.Microsecond)))), true
	}
	if l.rule == req.Spec.Rule && now < l.deniedUntil && req.N == l.deniedN { // denied until then
		d := l.denied
		d.Wait = time.Duration(l.deniedUntil - now)
		d.Reset = max(d.Wait, time.Duration(l.resetUntil-now))
		return d, true
	}
	return ratelimit.Outcome{}, false
}

// refill fetches a batch for req, which l cannot serve, and keeps what req does not
// spend; l.mu is held when it is called, and released before it returns. Requests of the
// key that come meanwhile wait for it (l.fetching).
func (p *Prefetch) refill(ctx context.Context, l *grant, req ratelimit.Request, a ratelimit.Args, now int64) (ratelimit.Outcome, error) {
	f := &fetch{done: make(chan struct{})}
	l.fetching = f
	gen := l.gen
	l.mu.Unlock()
	d, fetched, err := p.fetch(ctx, req, a)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fetching = nil
	if ctx.Err() == nil { // the waiters share the fetch's error, unless it was this caller's end
		f.err = err
	}
	close(f.done)
	if gen != l.gen || err != nil { // a refund or reset came by, or nothing was learned
		return d, err
	}
	l.rule, l.tokens, l.deniedUntil = req.Spec.Rule, 0, 0
	if !d.Allowed() { // remember the denial of n until its RetryAfter, like BlockCache
		if fetched == req.N {
			l.denied, l.deniedN, l.deniedUntil = d, req.N, now+int64(d.Wait)
			l.resetUntil = now + int64(d.Reset)
		}
	} else {
		l.tokens, l.expires, l.limit, l.remaining = fetched-req.N, now+int64(p.cfg.grantTime), d.Limit(), d.Remaining
		l.resetUntil = now + int64(d.Reset)
		d.Remaining = min(d.Limit(), d.Remaining+l.tokens)
	}
	l.until.Store(max(l.expires, l.deniedUntil))
	return d, nil
}

// fetch takes a batch for req from the next store: batch tokens, or what is left if a
// batch is not, or just req's own. It returns the Outcome and how many it asked for.
func (p *Prefetch) fetch(ctx context.Context, req ratelimit.Request, a ratelimit.Args) (ratelimit.Outcome, int64, error) {
	f := req
	f.N = min(max(p.batch, req.N), a.Limit)
	d, err := p.next.Apply(ctx, f)
	if err == nil && !d.Allowed() && f.N > req.N { // not a batch left: what is left, or just n
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
