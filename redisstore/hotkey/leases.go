package hotkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/trace"
)

// Leases decides the requests of a busy key from events this instance holds on loan from
// the next store, a ratelimit.Lender (redisstore, or fallback around it), and asks for
// the next loan in the background before they run out: a decision from a lease waits
// for no round trip, and Redis sees one call per refill for all the keys this instance
// refills at once (per Redis node), not one per request.
//
// Loans are conserved (see ratelimit.Lender): the events an instance holds were taken
// from the key's state, so the instances together never admit more than the rule, only
// a little later than Redis counted them (up to a lease's length). What an instance does
// not spend goes back to the key: when its demand falls, when the instance closes
// (Close), and with every refill that finds it holds more than it needs. An instance
// that dies takes what it held with it, no more than a lease's worth, and the key
// refills by its rule.
//
// A key is leased once this instance asks of it at least about one event per round trip
// to Redis (its demand times the round trip plus the refill interval, WithRefill); until
// then, and for the quiet keys, every request takes the exact path: the next store
// decides it, as without Leases. A lease holds about the instance's demand times (the
// round trip plus the refill interval), never more than the key has left divided by the
// live instances (WithInstanceCount) or by the holders on record; when it falls below
// what one round trip spends, a refill goes out, coalesced with every other key's, and
// requests spend what is left meanwhile. A key the next store has nothing to lend for
// is denied from memory until one event could be lent (RetryAfter), as BlockCache does.
// Each lease is renewed within half its TTL (WithLeaseTTL, 2s), and given back once its
// key is quiet.
//
// A decision from a lease reports the key's Remaining at the last refill plus what the
// instance holds, and the ResetAfter of the last refill, less the time since. Its
// source, for the middleware's Event, is "lease".
//
// The algorithms that are ratelimit.Algorithm.Lendable (the token bucket, the fixed
// window, the sliding window counter and the calendar quotas) are leased; the others'
// requests, peeks, and the requests that keep a reserve for more important ones take
// the exact path. A refund or a reset of a key drops every instance's lease of it: this
// instance's at once, the others' at their next refill (within one refill interval),
// and so does a change of its rule. With the fallback store under it, a lease keeps
// serving through an outage of Redis until it ends; then the key's requests take the
// exact path, to the fallback's shares.
//
// Leases starts a goroutine of its own: Close stops it, and gives back what it holds.
type Leases struct {
	next   ratelimit.Store
	lender ratelimit.Lender
	cfg    leaseConfig
	holder int64
	table  leaseTable
	asks   chan *lease   // refills asked for at low water
	rtt    atomic.Int64  // the round trip of a refill, nanoseconds, a moving average
	watch  demand        // the exact path's keys, for the ones to lease
	stop   chan struct{} // closed by Close
	done   chan struct{} // closed when the refiller has given back what it held
	closed sync.Once

	// what Stats reports: the decisions of the next store and of leases (takes, each
	// one decision whatever its n), and the refiller's calls
	exact, local             atomic.Int64
	refills, failed, revoked atomic.Int64
}

// LeasesStats is what Leases has done since it was made.
type LeasesStats struct {
	Leases    int           // keys leased now
	Local     int64         // decisions from leases: admissions, and denials from memory
	Exact     int64         // decisions of the next store (the exact path), of leased keys too; peeks, debits, refunds and resets aside
	Refills   int64         // calls to the next store's Lend
	Failed    int64         // of them, the ones that failed
	Revoked   int64         // loans that found this instance's record gone (ended, revoked)
	RoundTrip time.Duration // of a refill, a moving average
}

// Stats is what p has done so far.
func (p *Leases) Stats() LeasesStats {
	return LeasesStats{Leases: p.table.size(), Local: p.local.Load(), Exact: p.exact.Load(),
		Refills: p.refills.Load(), Failed: p.failed.Load(), Revoked: p.revoked.Load(), RoundTrip: time.Duration(p.rtt.Load())}
}

var (
	_ ratelimit.BatchStore = (*Leases)(nil)
	_ ratelimit.Lender     = (*Leases)(nil)
)

// Source is what a decision from a lease reports as its source (ratelimit.Event.Source).
const Source = "lease"

// NewLeases returns Leases over next, and starts its refiller. It returns an error for
// a next that does not lend (a ratelimit.Lender); it panics for a nil next or option.
func NewLeases(next ratelimit.Store, opts ...LeasesOption) (*Leases, error) {
	cfg := newLeaseConfig(next, opts)
	lender, ok := next.(ratelimit.Lender)
	if !ok {
		return nil, fmt.Errorf("hotkey: NewLeases over %T, which does not lend (ratelimit.Lender)", next)
	}
	p := &Leases{next: next, lender: lender, cfg: cfg, holder: newHolder(), asks: make(chan *lease, 4096),
		stop: make(chan struct{}), done: make(chan struct{})}
	p.rtt.Store(int64(time.Millisecond))
	p.watch.init(cfg.maxKeys)
	go p.refill()
	return p, nil
}

// newHolder is a random id, not 0, for this instance's records of loans.
func newHolder() int64 {
	for {
		if h := rand.Int64(); h != 0 {
			return h
		}
	}
}

// Close stops the refiller, and gives back the events this instance holds (within ctx);
// the leases' requests then take the exact path. It is safe to call more than once.
func (p *Leases) Close(ctx context.Context) error {
	p.closed.Do(func() { close(p.stop) })
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Apply decides req from a lease when its key has one, else on the next store.
func (p *Leases) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	sp := req.Spec
	if sp == nil || sp.Algorithm == nil || !sp.Algorithm.Lendable || sp.Reserve != 0 || !p.cfg.handles(req) {
		if sp != nil && sp.Op == "" {
			p.exact.Add(1)
		}
		if sp != nil && sp.Op == "refund" && sp.Algorithm != nil && sp.Algorithm.Lendable && req.Receipt != nil {
			return p.refund(ctx, req) // a take of the exact path or of a lease, whatever the refund's reserve
		}
		if sp != nil && sp.Op == "" && sp.Algorithm != nil && sp.Algorithm.Lendable {
			return p.exactTake(ctx, req)
		}
		return p.next.Apply(ctx, req)
	}
	if sp.Op != "" {
		return p.op(ctx, req)
	}
	now := clock.UnixNano(p.cfg.clock)
	if l := p.table.get(sp, req.Key); l != nil {
		if o, ok := l.take(p, req.N, now); ok {
			p.local.Add(1)
			trace.Set(ctx, Source)
			if r := req.Receipt; r != nil && o.Allowed() { // taken from the lease: given back to it
				r.At, r.Via, r.Next = max(1, now/1000), l.id, nil
			}
			return o, nil
		}
		p.exact.Add(1)
	} else {
		p.watch.note(sp, req.Key, req.N, now)
		p.exact.Add(1)
	}
	return p.exactTake(ctx, req)
}

// exactTake takes req on the next store; its Receipt, if any, says so, and holds the
// next store's own.
func (p *Leases) exactTake(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	outer := req.Receipt
	if outer != nil {
		req.Receipt = &ratelimit.Receipt{}
	}
	o, err := p.next.Apply(ctx, req)
	if err == nil && outer != nil && o.Allowed() {
		outer.At, outer.Via, outer.Next = req.Receipt.At, 0, req.Receipt
	}
	return o, err
}

// ApplyAll decides several limits at once, all or none, on the next store: the exact
// path, atomic as the next store makes it (ratelimit.BatchStore); leases decide one
// request of one key at a time. A next store that is not a BatchStore gives an error
// matching errors.ErrUnsupported, and ratelimit.AllowAll then takes the requests one by
// one.
func (p *Leases) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Outcome, error) {
	bs, ok := p.next.(ratelimit.BatchStore)
	if !ok {
		return nil, fmt.Errorf("hotkey: Leases over %T, which decides one request at a time: %w", p.next, errors.ErrUnsupported)
	}
	p.exact.Add(int64(len(reqs)))
	sent := core.InnerReceipts(reqs) // the exact path's takes: their receipts say so
	os, err := bs.ApplyAll(ctx, sent)
	if err == nil {
		core.WireReceipts(reqs, sent, os, 0, 0)
	}
	return os, err
}

// Lend lends on the next store, so that a limiter over Leases grants part of a request
// (ratelimit.AlgorithmLimiter.AllowAtMost, a loan of holder 0) as it would without them.
func (p *Leases) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
	return p.lender.Lend(ctx, loans)
}

// op is a peek, a debit, a refund or a reset. A peek or a debit goes to the next store
// (a debit takes from the key whatever is out on loan: it is repaid before the next
// loan). A refund goes back where its take came from (see refund). A reset ends this
// instance's lease of the key (what it held dropped: it was taken before), reaches the
// next store, and then revokes every other instance's, which learn it at their next
// refill.
func (p *Leases) op(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	switch req.Spec.Op {
	case "peek", "debit":
		return p.next.Apply(ctx, req)
	case "refund":
		return p.refund(ctx, req)
	}
	for _, l := range p.table.all(req.Spec, req.Key) {
		l.end()
	}
	o, err := p.next.Apply(ctx, req)
	if err != nil {
		return o, err
	}
	// a revoke that fails leaves the other leases to end by themselves, within their TTL
	revoke := ratelimit.Loan{Key: req.Key, Spec: core.WithOp(req.Spec, ""), Holder: p.holder, Share: 1,
		TTL: p.cfg.ttl, Revoke: true}
	_, _ = p.lender.Lend(ctx, []ratelimit.Loan{revoke}) // the op is done either way
	return o, nil
}

// refund gives a take's events back where its receipt says they came from: to this
// instance's lease that lent them, while it holds them still (a lease that ended spent
// them, and nothing comes back), or to the next store, as its receipt there says. The
// other instances' leases go on: what they hold is theirs, and conserved. The answer is
// a peek of 1 on the next store.
func (p *Leases) refund(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	r := req.Receipt
	if r.Via == 0 && r.Next != nil {
		req.Receipt = r.Next
		return p.next.Apply(ctx, req)
	}
	if r.Via != 0 {
		for _, l := range p.table.all(req.Spec, req.Key) {
			if l.id == r.Via && l.giveBack(req.N, r.At*1000) {
				break
			}
		}
	}
	req.N, req.Receipt, req.Spec = 1, nil, core.WithOp(req.Spec, "peek")
	return p.next.Apply(ctx, req)
}
