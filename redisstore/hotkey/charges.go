package hotkey

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// charge is events admitted before the next store counted them (on trust), or debited,
// to be charged to it as a debit: a take whatever the key has left, so that a key that
// had none owes them.
type charge struct {
	e      *entry
	req    core.Request  // a debit of the events
	trust  int64         // of them, the events admitted on trust (pending in e)
	inner  *core.Receipt // the debit's receipt at the next store, for a take with a receipt; nil for the others
	landed chan struct{} // closed once it has landed
	probe  bool          // no charge: a look at a key denied from memory for long (see probe)
	sent   bool          // out of the queue: nothing joins it any more (charges.mu)
}

// charges are the charges waiting to go out together.
type charges struct {
	mu     sync.Mutex
	queued []*charge
	timer  *time.Timer
	closed bool           // Close has sent the last: a charge queued later goes out at once
	flying sync.WaitGroup // the charges sent and not landed
}

// maxQueued is how many charges wait at most: as many go out at once.
const maxQueued = 512

// chargeEvery is how long the first of the charges queued waits for others, so that they
// ride one call of the next store: a thirty-second of the refill interval (31ms by
// default).
func (p *Leases) chargeEvery() time.Duration { return p.cfg.refill / 32 }

// chargeTrust charges req, admitted on trust: joined to e's charge queued, if it has one
// and req has no receipt, or as a charge of its own. A take with a receipt is charged as
// a debit with a receipt of its own (a take whatever the key has), the caller's saying
// so, so that its refund waits for it, and goes where it lands.
func (p *Leases) chargeTrust(ctx context.Context, e *entry, req core.Request, now int64) {
	debit := req
	debit.Spec = core.WithOp(req.Spec, core.OpDebit)
	debit.Receipt = nil
	if rc := req.Receipt; rc != nil {
		c := &charge{e: e, req: debit, trust: req.N, inner: &core.Receipt{}, landed: make(chan struct{})}
		c.req.Receipt = c.inner
		rc.At, rc.Via, rc.Next = max(1, now/1000), 0, c.inner
		p.pending.Store(c.inner, c.landed)
		e.mu.Lock()
		e.flights = append(e.flights, c)
		e.mu.Unlock()
		p.queue(c)
		return
	}
	p.join(e, debit, req.N)
}

// chargeDebit charges req, a debit, with the charges queued: joined to e's charge, if it
// has one, or as a charge of its own.
func (p *Leases) chargeDebit(e *entry, req core.Request) { p.join(e, req, 0) }

// join adds the debit req (of which trust events were admitted on trust) to e's charge
// queued and not sent, or queues a charge of it.
func (p *Leases) join(e *entry, req core.Request, trust int64) {
	e.mu.Lock()
	if c := e.charge; c != nil {
		q := &p.charges
		q.mu.Lock()
		if !c.sent && c.req.N <= mathx.MaxExact-req.N {
			c.req.N += req.N
			if c.trust == 0 && trust > 0 {
				e.flights = append(e.flights, c)
			}
			c.trust += trust
			q.mu.Unlock()
			e.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
	c := &charge{e: e, req: req, trust: trust, landed: make(chan struct{})}
	e.charge = c
	if trust > 0 {
		e.flights = append(e.flights, c)
	}
	e.mu.Unlock()
	p.queue(c)
}

// probe asks the next store, with the charges, what e's key has now: e denies from
// memory on an answer half a refill interval old or more, and another instance may have reset
// the key since. One at a time per key.
func (p *Leases) probe(e *entry) {
	if !e.probing.CompareAndSwap(false, true) {
		return
	}
	p.queue(&charge{e: e, req: core.Request{Key: e.key, Spec: core.WithOp(e.spec, core.OpTake)}, probe: true, landed: make(chan struct{})})
}

// queue queues c, to be sent with the others queued within chargeEvery.
func (p *Leases) queue(c *charge) {
	q := &p.charges
	q.mu.Lock()
	if q.closed {
		q.flying.Add(1)
		q.mu.Unlock()
		go p.sendAll([]*charge{c})
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

// flush sends every charge queued.
func (p *Leases) flush() {
	if batch := p.charges.take(false); len(batch) > 0 {
		go p.sendAll(batch)
	}
}

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
	q.flying.Add(len(batch))
	q.closed = q.closed || closing
	return batch
}

// sendAll charges batch, taken from the queue: the charges without a receipt together,
// as partial debits of one call to the next store's Lend, each with a receipt as the
// debit it is (its refund needs the next store's receipt); and learns each key's state
// from its answer.
func (p *Leases) sendAll(batch []*charge) {
	var plain, probes []*charge
	var wg sync.WaitGroup
	for _, c := range batch {
		if c.probe {
			probes = append(probes, c)
			continue
		}
		if c.inner == nil {
			plain = append(plain, c)
			continue
		}
		wg.Go(func() {
			defer p.charges.flying.Done()
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ttl)
			defer cancel()
			sent := clock.UnixNano(p.cfg.clock)
			o, err := p.next.Apply(ctx, c.req)
			p.pending.Delete(c.inner)
			p.answered(c, o, err, sent)
		})
	}
	// the debits and the probes apart: a store that decides partial takes within a
	// timeout (fallback) waits for the debits
	for _, cs := range [][]*charge{plain, probes} {
		if len(cs) == 0 {
			continue
		}
		loans := make([]core.Loan, len(cs))
		for i, c := range cs {
			loans[i] = core.Loan{Key: c.req.Key, Spec: c.req.Spec, Want: c.req.N}
		}
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ttl)
		sent := clock.UnixNano(p.cfg.clock)
		lent, err := p.lender.Lend(ctx, loans)
		cancel()
		if err == nil && len(lent) != len(loans) {
			err = fmt.Errorf("hotkey: %d charges answered %d times", len(loans), len(lent))
		}
		for i, c := range cs {
			var o core.Outcome
			if err == nil {
				o = lent[i].Outcome
			}
			p.answered(c, o, err, sent)
		}
		p.charges.flying.Add(-len(cs))
	}
	wg.Wait()
}

// answered learns from o, the next store's answer to c sent at sent (a peek of 1 after
// its debit), or its error: the events on trust are charged (those of a key spent after
// it may be owed); the key's state is what o says, and a debt denies it from memory until
// it is repaid, as on the exact path.
func (p *Leases) answered(c *charge, o core.Outcome, err error, sent int64) {
	e := c.e
	defer close(c.landed)
	e.mu.Lock()
	if e.charge == c {
		e.charge = nil
	}
	e.flights = slices.DeleteFunc(e.flights, func(f *charge) bool { return f == c })
	e.mu.Unlock()
	if c.probe {
		e.probing.Store(false)
		if err == nil {
			p.heard(e, o, sent, toPeek)
		}
		return
	}
	if err != nil { // nothing is known of the key: no more on trust, the exact path decides
		p.stats.uncharged.Add(c.req.N)
		e.publish(func(t *terms) { t.heard, t.remaining = max(t.heard, sent), 0 })
	} else {
		if !o.Allowed() && c.trust > 0 {
			p.stats.short.Add(c.trust)
		}
		p.heard(e, o, sent, toDebit)
	}
	e.pending.Add(-c.trust)
}

// settled waits, within ctx, for the charges of e's admissions on trust to land (it sends
// the queued ones at once): a decision of the exact path then sees them counted, so that
// one instance never admits beyond the rule what it admitted on trust and the exact path
// together.
func (p *Leases) settled(ctx context.Context, e *entry) {
	e.mu.Lock()
	flights := slices.Clone(e.flights)
	e.mu.Unlock()
	if len(flights) == 0 {
		return
	}
	p.flush()
	wait := time.NewTimer(p.cfg.ttl) // a charge stalled longer: the exact path goes on without it
	defer wait.Stop()
	for _, c := range flights {
		select {
		case <-c.landed:
		case <-ctx.Done():
			return
		case <-wait.C:
			return
		}
	}
}

// landed waits, within ctx, for the charge of a take on trust whose receipt at the next
// store is inner, if it is still queued or in flight (it sends the queued ones at once):
// a refund of it needs that receipt.
func (p *Leases) landed(ctx context.Context, inner *core.Receipt) error {
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
