package hotkey

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// BlockCache answers a denied key from memory until its RetryAfter has passed. It does
// so for requests with the same rule and the same n. So an abuser who keeps hammering a
// denied key costs Redis nothing. A decision from the cache is the denial, with the
// RetryAfter and ResetAfter left. A request of another n goes to the next store: a
// larger n would need longer, and a smaller one may fit.
//
// Requests that keep a reserve for more important ones (WithReserves: priorities)
// are blocked apart. Each is blocked only by a denial that kept the same reserve. A
// critical request may fit where a sheddable one did not. What it takes makes the others
// wait longer. So a request admitted through the cache ends the key's blocks, as a
// refund or a reset does.
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
	rule       core.Rule
	n, reserve int64
	until      int64 // UnixNano
	resetUntil int64
	limit      int64 // the Outcome's
	remaining  int64
}

// maxReserves bounds the denials a key's block holds, one per reserve: priorities are few.
const maxReserves = 8

// find is the denial that blocks req at now, or nil; bl.mu is held.
func (bl *block) find(req core.Request, now int64) *denial {
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
func (b *BlockCache) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	if !b.cfg.handles(req) {
		return b.next.Apply(ctx, req)
	}
	if req.Spec.Op == core.OpDebit { // a cost to charge whatever the key has left: to the store
		return b.next.Apply(ctx, req)
	}
	if _, err := req.Spec.Algorithm.Prepare(req.Spec.Rule, req.N); err != nil {
		return core.Outcome{}, err
	}
	now := clock.UnixNano(b.cfg.clock)
	bl := b.blocked.get(algKey{req.Spec.Algorithm, req.Spec.Namespace, req.Key}, now)
	gives := req.Spec.Op == core.OpRefund || req.Spec.Op == core.OpReset // the key may have room after it
	bl.mu.Lock()
	if gives {
		bl.unblock()
	}
	if den := bl.find(req, now); den != nil {
		d := core.Args{Limit: den.limit}.Outcome(false, den.remaining, time.Duration(den.until-now),
			time.Duration(max(den.until, den.resetUntil)-now))
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
	case err == nil && d.Allowed() && req.Spec.Op == core.OpTake && bl.held.Load(): // what it took moves every denial's wait
		bl.mu.Lock()
		bl.unblock()
		bl.mu.Unlock()
	case err == nil && !d.Allowed() && d.Wait > 0 && req.Spec.Op == core.OpTake:
		bl.mu.Lock()
		if bl.gen == gen { // no refund or reset came between the decision and now
			bl.record(denial{rule: req.Spec.Rule, n: req.N, reserve: req.Spec.Reserve, limit: d.Limit(), remaining: d.Remaining,
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

var _ core.Lender = (*BlockCache)(nil)

// Lend lends on the next store, which must lend. So a limiter over a BlockCache grants
// part of a request (ratelimit.AlgorithmLimiter.AllowAtMost), and Leases lend through
// it, as without it. Events granted end the key's blocks, as an admission does. A next
// store that does not lend gives an error wrapping errors.ErrUnsupported.
func (b *BlockCache) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	l, ok := b.next.(core.Lender)
	if !ok {
		return nil, fmt.Errorf("hotkey: BlockCache over %T, which does not lend: %w", b.next, errors.ErrUnsupported)
	}
	lent, err := l.Lend(ctx, loans)
	if err != nil {
		return lent, err
	}
	now := clock.UnixNano(b.cfg.clock)
	for i, loan := range loans {
		if lent[i].N > 0 && loan.Spec != nil {
			bl := b.blocked.get(algKey{loan.Spec.Algorithm, loan.Spec.Namespace, loan.Key}, now)
			bl.mu.Lock()
			bl.unblock()
			bl.mu.Unlock()
		}
	}
	return lent, nil
}
