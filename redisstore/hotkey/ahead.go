package hotkey

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// known is what this instance last heard of a key it holds no lease of, for the
// decisions made ahead of the next store's answer (WithOptimistic).
type known struct {
	expiry atomic.Int64 // what it knows is worth nothing after (UnixNano), for the table's prune

	mu        sync.Mutex
	rule      ratelimit.Rule // what it knows is of this rule
	heard     bool           // an answer of the next store came
	heardAt   int64          // when (UnixNano): what it says is trusted for a quarter of the refill interval
	remaining int64          // the key's Remaining at that answer
	resetAt   int64          // and its ResetAfter, as an instant (UnixNano)
	share     int64          // what this instance may still admit ahead of the next answer: its share of remaining, less what it admitted since
	deniedTil int64          // the RetryAfter of a denial, as an instant (UnixNano)
	inflight  int64          // events admitted ahead whose charges have not landed
	open      *charge        // the key's charge queued and not sent yet, which the next admissions join; nil for none
	debt      *charge        // and its debit queued, which the next debits join
	gen       uint64         // bumped by a refund or a reset of the key: an answer from before is stale
}

// instances is how many instances share the keys (WithInstanceCount), 1 when not known.
func (p *Leases) instances() int64 {
	if p.cfg.instances == nil {
		return 1
	}
	return int64(max(1, p.cfg.instances()))
}

// ahead decides req, a take of a key this instance holds no lease of (or whose lease
// cannot decide yet: leased), from what it last heard of the key (WithOptimistic): see
// reserve; an admission is then charged to the next store in the background, with the
// others of the next moments (commit). ok false when neither (the exact path decides).
func (p *Leases) ahead(ctx context.Context, req ratelimit.Request, leased bool, now int64) (ratelimit.Outcome, bool) {
	o, r, ok := p.reserve(req, leased, now)
	if ok && o.Allowed() {
		p.commit(ctx, req, r, now)
	}
	return o, ok
}

// reserved is an admission made ahead of the next store's answer, between reserve and
// commit (or undo).
type reserved struct {
	k        *known
	ofShare  bool // taken from this instance's share of the key's last answer, not on trust
	previous int64
}

// reserve decides req from what this instance last heard of its key: a denial while the
// key's last denial holds; an admission when it fits this instance's share of what the
// key had left at an answer heard within a quarter of the refill interval, less what it
// admitted since (or, of a key not heard of since and not leased, one event on trust,
// while none is in flight), reserved until commit or undo; ok false when neither.
func (p *Leases) reserve(req ratelimit.Request, leased bool, now int64) (o ratelimit.Outcome, r reserved, ok bool) {
	sp := req.Spec
	a, err := sp.Algorithm.Prepare(sp.Rule, req.N)
	if err != nil || sp.Reserve != 0 {
		return o, r, false
	}
	n := p.instances()
	if a.Limit < n { // a rule smaller than the instances: each one's event on trust would be too many
		p.small.Add(1)
		return o, r, false
	}
	k := p.lockKnown(sp, req.Key, now)
	defer k.mu.Unlock()
	limit := ratelimit.Args{Limit: a.Limit}
	r.k = k
	switch {
	case now < k.deniedTil:
		wait, reset := k.deniedTil-now, max(k.resetAt-now, k.deniedTil-now)
		return limit.Outcome(false, 0, time.Duration(wait), time.Duration(reset)), r, true
	case !k.fresh(now, p.cfg.refill) && req.N == 1 && k.inflight == 0 && !leased: // one event on trust, of a key not known to be busy
		o = limit.Outcome(true, a.Limit-1, 0, sp.Rule.Period)
	case k.fresh(now, p.cfg.refill) && req.N <= k.share:
		r.ofShare, r.previous = true, k.remaining
		k.share -= req.N
		k.remaining = max(0, k.remaining-req.N)
		o = limit.Outcome(true, k.remaining, 0, time.Duration(max(k.resetAt-now, int64(time.Microsecond))))
	default:
		return o, r, false
	}
	k.inflight += req.N
	k.expiry.Store(max(k.expiry.Load(), now+int64(p.cfg.refill)))
	return o, r, true
}

// undo gives back r, the admission of req reserved and not committed: another limit of
// its request denied it.
func (p *Leases) undo(req ratelimit.Request, r reserved) {
	k := r.k
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inflight -= req.N
	if r.ofShare {
		k.share += req.N
		k.remaining = max(k.remaining, r.previous)
	}
}

// commit charges req, admitted ahead as r, to the next store in the background: with the
// key's charge queued, if it has one and req has no receipt, or as a charge of its own.
func (p *Leases) commit(ctx context.Context, req ratelimit.Request, r reserved, now int64) {
	k := r.k
	p.aheads.Add(1)
	k.mu.Lock()
	if req.Receipt == nil && p.join(k, req.N) {
		k.mu.Unlock()
		return
	}
	c := &charge{ctx: context.WithoutCancel(ctx), req: req, k: k, gen: k.gen}
	if rc := req.Receipt; rc != nil { // the take's receipt is the next store's, once the charge lands
		c.inner = &ratelimit.Receipt{}
		rc.At, rc.Via, rc.Next = max(1, now/1000), 0, c.inner
		c.landed = make(chan struct{})
		p.pending.Store(c.inner, c.landed)
		c.req.Receipt = c.inner
	} else {
		k.open = c
	}
	k.mu.Unlock()
	p.queue(c)
}

// join adds n events to k's charge queued and not sent yet, if it has one; k.mu is held.
func (p *Leases) join(k *known, n int64) bool { return p.joinTo(k, &k.open, n) }

// joinTo adds n events to *open, a charge of k queued and not sent yet, if there is one;
// k.mu is held.
func (p *Leases) joinTo(k *known, open **charge, n int64) bool {
	c := *open
	if c == nil || c.gen != k.gen {
		return false
	}
	q := &p.charges
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.sent || c.req.N > mathx.MaxExact-n {
		*open = nil
		return false
	}
	c.req.N += n
	return true
}

// debitAhead charges req, a debit (or what this instance's lease of the key could not
// pay of it), with the charges made ahead (WithOptimistic), when what the instance knows
// of the key says it leaves the key at least one event: what it last heard of it (within
// a quarter of the refill interval), or else the rule's Limit, less what this instance
// admitted and debited since. The debit comes off this instance's share at once, so
// that a debt stops its admissions ahead; the answer is the one the instance expects, a
// peek of 1 after the debit. ok false when it does not (a debt, a reserve, a rule
// smaller than the instances): the exact path charges it, and answers.
func (p *Leases) debitAhead(ctx context.Context, req ratelimit.Request, now int64) (ratelimit.Outcome, bool) {
	sp := req.Spec
	a, err := sp.Algorithm.Prepare(sp.Rule, 1)
	if err != nil || sp.Reserve != 0 || req.Receipt != nil || a.Limit < p.instances() {
		return ratelimit.Outcome{}, false
	}
	k := p.lockKnown(sp, req.Key, now)
	left, reset := a.Limit-k.inflight, int64(sp.Rule.Period)
	if k.fresh(now, p.cfg.refill) {
		left, reset = k.remaining, max(k.resetAt-now, int64(time.Microsecond))
	}
	if now < k.deniedTil || left-req.N < 1 {
		k.mu.Unlock()
		return ratelimit.Outcome{}, false
	}
	k.remaining = left - req.N
	k.share -= req.N // below 0: no admission ahead until the next answer
	k.inflight += req.N
	k.expiry.Store(max(k.expiry.Load(), now+int64(p.cfg.refill)))
	o := ratelimit.Args{Limit: a.Limit}.Outcome(true, k.remaining-1, 0, time.Duration(reset))
	if p.joinTo(k, &k.debt, req.N) {
		k.mu.Unlock()
		return o, true
	}
	c := &charge{ctx: context.WithoutCancel(ctx), req: req, k: k, gen: k.gen}
	k.debt = c
	k.mu.Unlock()
	p.queue(c)
	return o, true
}

// charge is an admission made ahead of the next store's answer, to be charged to it.
type charge struct {
	ctx    context.Context
	req    ratelimit.Request
	k      *known
	gen    uint64
	inner  *ratelimit.Receipt // the take's receipt at the next store, nil for none
	landed chan struct{}      // closed when it has landed, nil for none
	sent   bool               // taken from the queue: no admission joins it any more (charges.mu)
}

// charges are the admissions made ahead, waiting to be sent together.
type charges struct {
	mu     sync.Mutex
	queued []*charge
	timer  *time.Timer
	closed bool           // Close has sent the last: a charge queued later goes out at once
	flying sync.WaitGroup // the charges sent before Close and not landed
}

// maxQueued is how many charges wait at most: as many go out at once.
const maxQueued = 128

// chargeEvery is how long the first of the charges queued waits for others, so that they
// ride one call of the next store: a thirty-second of the refill interval (31ms by default).
func (p *Leases) chargeEvery() time.Duration { return p.cfg.refill / 32 }

// queue queues c, to be sent with the others queued within chargeEvery.
func (p *Leases) queue(c *charge) {
	q := &p.charges
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		go p.send(c)
		return
	}
	q.queued = append(q.queued, c)
	switch len(q.queued) {
	case maxQueued:
		q.mu.Unlock()
		p.flush()
		return
	case 1:
		q.timer = time.AfterFunc(p.chargeEvery(), p.flush)
	}
	q.mu.Unlock()
}

// flush sends every charge queued (see sendAll).
func (p *Leases) flush() { p.sendAll(p.charges.take(false)) }

// take takes the charges queued, counted as flying, and stops the timer; closing, it is
// the last take (see charges.closed).
func (q *charges) take(closing bool) []*charge {
	q.mu.Lock()
	defer q.mu.Unlock()
	batch := q.queued
	q.queued = nil
	for _, c := range batch {
		c.sent = true
	}
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	if len(batch) > 0 {
		q.flying.Add(len(batch))
	}
	q.closed = q.closed || closing
	return batch
}

// sendAll sends batch, taken from the queue, in the background: the charges without a
// receipt together, as partial takes of one call to the next store's Lend (a script of
// up to 20 on Redis), and each charge with a receipt as the take it is (its refund needs
// the next store's receipt).
func (p *Leases) sendAll(batch []*charge) {
	var plain []*charge
	for _, c := range batch {
		if c.landed == nil {
			plain = append(plain, c)
			continue
		}
		go func() {
			defer p.charges.flying.Done()
			p.send(c)
		}()
	}
	if len(plain) > 0 {
		go func() {
			defer p.charges.flying.Add(-len(plain))
			p.chargeAll(plain)
		}()
	}
}

// chargeAll charges cs, admissions made ahead without a receipt, as partial takes of one
// call to the next store's Lend, and learns each key's state from its answer: what a
// partial take could not take was admitted beyond the rule (LeasesStats.Excess), and
// what a call that failed charged is not known to have been counted (Uncharged).
func (p *Leases) chargeAll(cs []*charge) {
	loans := make([]ratelimit.Loan, len(cs))
	for i, c := range cs {
		loans[i] = ratelimit.Loan{Key: c.req.Key, Spec: c.req.Spec, Want: c.req.N, Share: 1}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ttl)
	defer cancel()
	lent, err := p.lender.Lend(ctx, loans)
	if err == nil && len(lent) != len(loans) {
		err = fmt.Errorf("hotkey: %d loans lent %d answers", len(loans), len(lent))
	}
	now, n := clock.UnixNano(p.cfg.clock), p.instances()
	for i, c := range cs {
		var o ratelimit.Outcome
		if err != nil {
			p.uncharged.Add(c.req.N)
		} else {
			o = lent[i].Outcome
			if lent[i].N < c.req.N {
				p.excess.Add(c.req.N - lent[i].N)
			}
			if c.req.Spec.Op == "debit" && !o.Allowed() { // a debt: the key's lease stops spending, as on the exact path
				if l := p.table.get(c.req.Spec, c.req.Key); l != nil {
					l.owe(now + int64(o.Wait))
				}
			}
		}
		c.k.answered(c, o, err, now, n)
	}
}

// answered learns from o, the next store's answer to c (or err), at now, n instances
// sharing the key.
func (k *known) answered(c *charge, o ratelimit.Outcome, err error, now, n int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.inflight -= c.req.N
	if k.open == c {
		k.open = nil
	}
	if k.debt == c {
		k.debt = nil
	}
	switch {
	case err != nil:
		k.heard = false // nothing is known: the next request takes the exact path, or one event on trust
	case k.gen == c.gen && k.rule == c.req.Spec.Rule:
		k.learn(o, now, n)
	}
}

// send charges c, and says it has landed.
func (p *Leases) send(c *charge) {
	if c.landed != nil {
		defer func() {
			close(c.landed)
			p.pending.Delete(c.inner)
		}()
	}
	p.charge(c)
}

// landed waits, within ctx, for the charge of an admission made ahead whose receipt at the
// next store is inner, if it is still queued or in flight (it sends the queued ones at
// once): a refund of it needs that receipt.
func (p *Leases) landed(ctx context.Context, inner *ratelimit.Receipt) error {
	v, ok := p.pending.Load(inner)
	if !ok {
		return nil
	}
	p.flush()
	select {
	case <-v.(chan struct{}):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// charge takes req, admitted ahead of the next store's answer, on the next store, and
// learns the key's state from the answer: a denial there is an event admitted beyond the
// rule (LeasesStats.Excess).
func (p *Leases) charge(c *charge) {
	ctx, cancel := context.WithTimeout(c.ctx, p.cfg.ttl)
	defer cancel()
	o, err := p.next.Apply(ctx, c.req)
	switch {
	case err != nil:
		p.uncharged.Add(c.req.N)
	case !o.Allowed():
		p.excess.Add(c.req.N)
	}
	c.k.answered(c, o, err, clock.UnixNano(p.cfg.clock), p.instances())
}

// heard learns from o, the next store's answer to a take of key under spec at now, for
// the decisions made ahead of the next (WithOptimistic).
func (p *Leases) heard(spec *ratelimit.Spec, key string, o ratelimit.Outcome, now int64) {
	k := p.lockKnown(spec, key, now)
	defer k.mu.Unlock()
	k.learn(o, now, p.instances())
}

// forget makes what this instance heard of key stale: a refund or a reset of it, whose
// answer is a peek, not a take's.
func (p *Leases) forget(spec *ratelimit.Spec, key string, now int64) {
	k := p.known.get(algKey{spec.Algorithm, spec.Namespace, key}, now)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.gen++
	k.deniedTil = 0
}

// lockKnown is what this instance knows of key under spec, locked (k.mu), and of
// spec's rule: what it knew under another rule is forgotten.
func (p *Leases) lockKnown(spec *ratelimit.Spec, key string, now int64) *known {
	k := p.known.get(algKey{spec.Algorithm, spec.Namespace, key}, now)
	k.mu.Lock()
	if k.rule != spec.Rule {
		k.under(spec.Rule)
	}
	return k
}

// under forgets what k knew: the key is under another rule now; k.mu is held.
func (k *known) under(rule ratelimit.Rule) {
	k.rule, k.heard, k.deniedTil = rule, false, 0
	k.gen++
}

// fresh reports whether k heard of its key at most a quarter of refill ago: a key leased
// since, or asked again after a while, may have changed since by much.
func (k *known) fresh(now int64, refill time.Duration) bool {
	return k.heard && now-k.heardAt <= int64(refill/4)
}

// learn keeps o, the next store's answer at now, n instances sharing the key: this
// instance may admit its share of what the key has left, less what it admitted ahead
// that the answer does not count yet; k.mu is held.
func (k *known) learn(o ratelimit.Outcome, now, n int64) {
	k.heard, k.heardAt, k.remaining = true, now, o.Remaining
	k.share = max(0, o.Remaining/n-k.inflight)
	k.resetAt = now + int64(o.Reset)
	k.deniedTil = 0
	if !o.Allowed() {
		k.deniedTil = now + int64(o.Wait)
	}
	k.expiry.Store(max(k.resetAt, k.deniedTil))
}
