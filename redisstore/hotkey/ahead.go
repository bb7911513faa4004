package hotkey

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

// known is what this instance last heard of a key it holds no lease of, for the
// decisions made ahead of the next store's answer (WithOptimistic).
type known struct {
	expiry atomic.Int64 // what it knows is worth nothing after (UnixNano), for the table's prune

	mu        sync.Mutex
	rule      ratelimit.Rule // what it knows is of this rule
	heard     bool           // an answer of the next store came
	remaining int64          // the key's Remaining at that answer
	limit     int64          // and its Limit
	resetAt   int64          // and its ResetAfter, as an instant (UnixNano)
	deniedTil int64          // the RetryAfter of a denial, as an instant (UnixNano)
	ahead     bool           // an admission made ahead of its answer is in flight
	gen       uint64         // bumped by a refund or a reset of the key: an answer from before is stale
}

// instances is how many instances share the keys (WithInstanceCount), 1 when not known.
func (p *Leases) instances() int64 {
	if p.cfg.instances == nil {
		return 1
	}
	return int64(max(1, p.cfg.instances()))
}

// ahead decides req, a take of a key this instance holds no lease of, from what it last
// heard of the key (WithOptimistic): a denial while the key's last denial holds, an
// admission when it fits this instance's share of what the key had left (or, of a key
// never heard of, one event on trust), charged to the next store in the background; ok
// false when neither (the exact path decides).
func (p *Leases) ahead(ctx context.Context, req ratelimit.Request, now int64) (o ratelimit.Outcome, ok bool) {
	sp := req.Spec
	a, err := sp.Algorithm.Prepare(sp.Rule, req.N)
	if err != nil || sp.Reserve != 0 {
		return o, false
	}
	n := p.instances()
	if a.Limit < n { // a rule smaller than the instances: each one's event on trust would be too many
		p.small.Add(1)
		return o, false
	}
	k := p.known.get(algKey{sp.Algorithm, sp.Namespace, req.Key}, now)
	k.mu.Lock()
	if k.rule != sp.Rule {
		k.under(sp.Rule)
	}
	limit := ratelimit.Args{Limit: a.Limit}
	switch {
	case now < k.deniedTil:
		wait, reset := k.deniedTil-now, max(k.resetAt-now, k.deniedTil-now)
		k.mu.Unlock()
		return limit.Outcome(false, 0, time.Duration(wait), time.Duration(reset)), true
	case k.ahead:
		k.mu.Unlock()
		return o, false
	case !k.heard && req.N == 1:
		o = limit.Outcome(true, a.Limit-1, 0, sp.Rule.Period)
	case k.heard && req.N <= k.remaining/n:
		k.remaining -= req.N
		o = limit.Outcome(true, k.remaining, 0, time.Duration(max(k.resetAt-now, int64(time.Microsecond))))
	default:
		k.mu.Unlock()
		return o, false
	}
	k.ahead = true
	k.expiry.Store(max(k.expiry.Load(), now+int64(p.cfg.refill)))
	gen := k.gen
	k.mu.Unlock()
	p.aheads.Add(1)
	if r := req.Receipt; r != nil { // the take's receipt is the next store's, once the charge lands
		inner := &ratelimit.Receipt{}
		r.At, r.Via, r.Next = max(1, now/1000), 0, inner
		landed := make(chan struct{})
		p.pending.Store(inner, landed)
		req.Receipt = inner
		go func() {
			defer func() {
				close(landed)
				p.pending.Delete(inner)
			}()
			p.charge(context.WithoutCancel(ctx), req, k, gen)
		}()
		return o, true
	}
	go p.charge(context.WithoutCancel(ctx), req, k, gen)
	return o, true
}

// landed waits, within ctx, for the charge of an admission made ahead whose receipt at the
// next store is inner, if it is still in flight: a refund of it needs that receipt.
func (p *Leases) landed(ctx context.Context, inner *ratelimit.Receipt) error {
	v, ok := p.pending.Load(inner)
	if !ok {
		return nil
	}
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
func (p *Leases) charge(ctx context.Context, req ratelimit.Request, k *known, gen uint64) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ttl)
	defer cancel()
	o, err := p.next.Apply(ctx, req)
	if err == nil && !o.Allowed() {
		p.excess.Add(req.N)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ahead = false
	if err != nil {
		k.heard = false // nothing is known: the next request takes the exact path, or one event on trust
		return
	}
	if k.gen == gen && k.rule == req.Spec.Rule {
		k.learn(o, clock.UnixNano(p.cfg.clock))
	}
}

// heard learns from o, the next store's answer to a take of key under spec at now, for
// the decisions made ahead of the next (WithOptimistic).
func (p *Leases) heard(spec *ratelimit.Spec, key string, o ratelimit.Outcome, now int64) {
	k := p.known.get(algKey{spec.Algorithm, spec.Namespace, key}, now)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.rule != spec.Rule {
		k.under(spec.Rule)
	}
	k.learn(o, now)
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

// under forgets what k knew: the key is under another rule now; k.mu is held.
func (k *known) under(rule ratelimit.Rule) {
	k.rule, k.heard, k.deniedTil = rule, false, 0
	k.gen++
}

// learn keeps o, the next store's answer at now; k.mu is held.
func (k *known) learn(o ratelimit.Outcome, now int64) {
	k.heard, k.remaining, k.limit = true, o.Remaining, o.Limit()
	k.resetAt = now + int64(o.Reset)
	k.deniedTil = 0
	if !o.Allowed() {
		k.deniedTil = now + int64(o.Wait)
	}
	k.expiry.Store(max(k.resetAt, k.deniedTil))
}
