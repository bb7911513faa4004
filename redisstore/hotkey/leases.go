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
	"github.com/ratelimit-go/ratelimit/internal/mathx"
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
// A key is leased once this instance asks it twice within a quarter of a refill
// interval (WithRefill), or in two quarters running, at once: the lease's first loan goes
// out with the next coalesced refill, a round trip later (with WithOptimistic, once it
// asks a quarter of this instance's share of the rule: see there). Until then, and for
// the quiet keys, every request takes the exact path: the next store decides it, as
// without Leases. A lease holds about the instance's demand times (the round trip plus
// the refill interval), never more than the key has left divided by the live instances
// (WithInstanceCount) or by the holders on record (but one event, so that a key's last
// few are lent too); when it falls below what two round trips spend, a refill goes out,
// coalesced with every other key's, and requests spend what is left meanwhile. Each
// lease is renewed at least once a refill interval, and given back once its key is
// quiet.
//
// A key asked more than its rule is decided from memory too, denials and admissions
// alike: a refill that gets less than it asked (the key is at its rule) is spent at an
// even pace until the next one, a quarter of a refill interval later, which lends what
// the key accrued since; what the lease lacks meanwhile is denied from memory, with the
// time until the pace or the next refill releases it.
//
// Several limits of one request (ApplyAll: ratelimit.AllowAll, Middleware.Policies) are
// decided from memory, all or none, when this instance leases each of them (or, with
// WithOptimistic, can decide each ahead where it has no lease); otherwise on the next
// store, and the request counts towards leasing its keys, together. A
// request that keeps a reserve for more important ones (priorities) is decided on the
// lease of its key, keeping the reserve of the key's Remaining as the last refill
// reported it plus what the lease holds.
//
// A decision from a lease reports the key's Remaining at the last refill plus what the
// instance holds, and the ResetAfter of the last refill, less the time since. Its
// source, for the middleware's Event, is "lease".
//
// The algorithms that are ratelimit.Algorithm.Lendable (the token bucket, the fixed
// window, the sliding window counter and the calendar quotas) are leased; the others'
// requests, and peeks, take the exact path (LeasesStats.Unleased counts the decisions
// no lease may decide). A debit is charged to this instance's lease of the key first
// (and counts in the lease's demand, so that its refills hold what the debits spend),
// the rest to the next store; a debit that leaves the key in debt stops this lease from
// spending, and the others' at their next refill, within a refill interval, where they
// give back what they hold to pay it. A refund goes back to the lease that made its take
// while it holds it. A reset drops every instance's lease of the key: this instance's at
// once, the others' at their next refill. A request under another rule than its key's
// lease (a rule change) ends that lease the moment this instance decides under the new
// rule, what it held spent by no one, and the other instances' at their next refill:
// the cluster admits no more than the new rule's burst plus its rate since the change.
// With the fallback store under it, a lease keeps serving through an outage of Redis
// until what it holds is spent or it ends; then the key's requests take the exact path,
// to the fallback's shares, from which the fallback took what the lease was lent: the
// two together admit the rule.
//
// With WithOptimistic, the requests of the keys without a lease are decided from memory
// too, within the bound its doc states; without it they take the exact path.
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
	exact, local, unleased   atomic.Int64
	aheads, excess, small    atomic.Int64
	uncharged                atomic.Int64
	refills, failed, revoked atomic.Int64

	known   table[known] // what this instance heard of the keys it holds no lease of (WithOptimistic)
	pending sync.Map     // *ratelimit.Receipt -> chan struct{}: the admissions made ahead with a receipt, closed once charged
	charges charges      // the admissions made ahead, waiting to be charged together
}

// LeasesStats is what Leases has done since it was made.
type LeasesStats struct {
	Leases    int           // keys leased now
	Local     int64         // decisions from leases: admissions, and denials from memory
	Exact     int64         // decisions of the next store (the exact path), of leased keys too; peeks, debits, refunds and resets aside
	Unleased  int64         // of them, the decisions of limits no lease may decide: an algorithm that does not lend, a request ForRequests leaves out
	Small     int64         // of them, the decisions of rules whose Limit is less than the instances, kept exact (WithOptimistic)
	Ahead     int64         // admissions of keys without a lease made from memory ahead of the next store's answer (WithOptimistic), in Local
	Excess    int64         // of the events they admitted, those the next store then denied: beyond the rule
	Uncharged int64         // events admitted ahead, or debited with them, whose charge failed (the next store's error): never counted there
	Refills   int64         // calls to the next store's Lend
	Failed    int64         // of them, the ones that failed
	Revoked   int64         // loans that found this instance's record gone (ended, revoked)
	RoundTrip time.Duration // of a refill, a moving average
}

// Stats is what p has done so far.
func (p *Leases) Stats() LeasesStats {
	return LeasesStats{Leases: p.table.size(), Local: p.local.Load(), Exact: p.exact.Load(), Unleased: p.unleased.Load(),
		Small: p.small.Load(), Ahead: p.aheads.Load(), Excess: p.excess.Load(), Uncharged: p.uncharged.Load(),
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
	p.watch.init(cfg.maxKeys, clock.UnixNano(cfg.clock))
	p.known = table[known]{max: cfg.maxKeys, expiry: func(k *known) *atomic.Int64 { return &k.expiry }}
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
	if !p.leasable(req) {
		if sp != nil && sp.Op == "" {
			p.exact.Add(1)
			p.unleased.Add(1)
		}
		if sp != nil && sp.Algorithm != nil && sp.Algorithm.Lendable {
			switch {
			case sp.Op == "":
				return p.exactTake(ctx, req)
			case sp.Op == "refund" && req.Receipt != nil: // a take of the exact path or of a lease, whatever selects it now
				return p.refund(ctx, req)
			}
		}
		return p.next.Apply(ctx, req)
	}
	if sp.Op != "" {
		return p.op(ctx, req)
	}
	now := clock.UnixNano(p.cfg.clock)
	l := p.lookup(sp, req.Key)
	if l != nil {
		if o, ok := l.take(p, req.N, keep(sp, l), now); ok {
			p.local.Add(1)
			trace.Set(ctx, Source)
			if r := req.Receipt; r != nil && o.Allowed() { // taken from the lease: given back to it
				r.At, r.Via, r.Next = max(1, now/1000), l.id, nil
			}
			return o, nil
		}
	} else if hot, rate := p.watch.note(sp, req.Key, req.N, now, p.hotHorizon(sp), p.rtt.Load(), p.hotSpan()); hot {
		p.leaseNow([]*ratelimit.Spec{sp}, []string{req.Key}, rate)
	}
	if p.cfg.optimistic { // no lease, or one that cannot decide yet (not lent, or ran low before its refill)
		if o, ok := p.ahead(ctx, req, l != nil, now); ok {
			p.local.Add(1)
			trace.Set(ctx, Source)
			return o, nil
		}
	}
	p.exact.Add(1)
	o, err := p.exactTake(ctx, req)
	if err == nil && p.cfg.optimistic {
		p.heard(sp, req.Key, o, now)
	}
	return o, err
}

// leasable says whether req's key may be decided from a lease: an algorithm that lends,
// a request ForRequests selects. A refund goes where its receipt says, and a peek to
// the next store, whatever their Spec.
func (p *Leases) leasable(req ratelimit.Request) bool {
	sp := req.Spec
	return sp != nil && sp.Algorithm != nil && sp.Algorithm.Lendable && p.cfg.handles(req)
}

// keep is what sp's reserve keeps back of the key's Remaining, under l's Limit.
func keep(sp *ratelimit.Spec, l *lease) int64 {
	if sp.Reserve == 0 {
		return 0
	}
	return mathx.Keep(l.limit.Load(), sp.Reserve)
}

// lookup is the lease of key under sp's rule, or nil. A lease of the key under another
// rule ends: the instance decides under the new rule from now on, and the old lease's
// events are spent by no one (giving them back would step the key's state under the old
// rule). The other instances' leases of the old rule end at their next refill, which
// finds their records dropped by the new rule's loans.
func (p *Leases) lookup(sp *ratelimit.Spec, key string) *lease {
	l := p.table.get(sp, key)
	if l == nil || l.spec == sp || l.spec.Rule == sp.Rule {
		return l
	}
	l.end()
	p.table.remove(l)
	return nil
}

// leaseNow leases the keys of specs at once (a refill asked for now, coalesced with the
// others'), each at rate events a second, as many as WithMaxKeys leaves room for.
func (p *Leases) leaseNow(specs []*ratelimit.Spec, keys []string, rate float64) {
	for i, sp := range specs {
		if p.table.size() >= p.cfg.maxKeys {
			return
		}
		l := &lease{spec: sp, key: keys[i], id: leaseIDs.Add(1), rate: rate}
		_, low := p.sizes(l)
		l.low.Store(low)
		if p.table.add(l) {
			p.ask(l)
		}
	}
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

// ApplyAll decides several limits at once, all or none: from memory when this instance
// holds a lease of every one (each answers as it would alone; when one denies, what the
// others took goes back to their leases), else on the next store, atomic as the next
// store makes it (ratelimit.BatchStore). A request that takes the exact path counts
// towards leasing its keys, and when one of them turns hot they are leased together. A
// next store that is not a BatchStore gives an error matching errors.ErrUnsupported, and
// ratelimit.AllowAll then takes the requests one by one.
func (p *Leases) ApplyAll(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Outcome, error) {
	if os, ok := p.applyLocal(ctx, reqs); ok {
		return os, nil
	}
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

// applyLocal decides reqs from memory, all or none, when each can be: from this
// instance's lease of its key, or, WithOptimistic, ahead of the next store's answer
// (reserve) where it holds none or its lease cannot decide yet. It notes the demand of
// the keys without a lease, and leases them together when one turns hot. Not ok when one
// of them cannot be decided from memory: nothing was taken.
func (p *Leases) applyLocal(ctx context.Context, reqs []ratelimit.Request) ([]ratelimit.Outcome, bool) {
	now := clock.UnixNano(p.cfg.clock)
	ls := make([]*lease, len(reqs))
	missing := false
	for i, r := range reqs {
		if !p.leasable(r) || r.Spec.Op != "" {
			p.unleased.Add(int64(len(reqs)))
			return nil, false
		}
		if ls[i] = p.lookup(r.Spec, r.Key); ls[i] == nil {
			missing = true
		}
	}
	if missing {
		p.noteAll(reqs, ls, now)
		if !p.cfg.optimistic {
			return nil, false
		}
	}
	os := make([]ratelimit.Outcome, len(reqs))
	rs := make([]reserved, len(reqs)) // rs[i].k nil: decided by ls[i]
	// back gives back what reqs[:upTo] took
	back := func(upTo int) {
		for j := range upTo {
			switch {
			case !os[j].Allowed():
			case rs[j].k != nil:
				p.undo(reqs[j], rs[j])
			default:
				ls[j].tokens.Add(reqs[j].N)
			}
		}
	}
	all := true
	for i, r := range reqs {
		var o ratelimit.Outcome
		ok := false
		if ls[i] != nil {
			o, ok = ls[i].take(p, r.N, keep(r.Spec, ls[i]), now)
		}
		if !ok && p.cfg.optimistic {
			o, rs[i], ok = p.reserve(r, ls[i] != nil, now)
			if ok && !o.Allowed() {
				rs[i].k = nil // a denial reserved nothing
			}
		}
		if !ok {
			back(i)
			return nil, false
		}
		os[i], all = o, all && o.Allowed()
	}
	if !all { // none counted
		back(len(reqs))
	}
	for i, r := range reqs {
		switch {
		case !all:
		case rs[i].k != nil:
			p.commit(ctx, r, rs[i], now)
		case r.Receipt != nil:
			r.Receipt.At, r.Receipt.Via, r.Receipt.Next = max(1, now/1000), ls[i].id, nil
		}
	}
	p.local.Add(int64(len(reqs)))
	trace.Set(ctx, Source)
	return os, true
}

// noteAll counts the demand of the requests whose keys have no lease (ls[i] nil), and
// when one of them turns hot, leases them all.
func (p *Leases) noteAll(reqs []ratelimit.Request, ls []*lease, now int64) {
	hot, rate := false, 0.0
	for i, r := range reqs {
		if ls[i] == nil {
			if h, rt := p.watch.note(r.Spec, r.Key, r.N, now, p.hotHorizon(r.Spec), p.rtt.Load(), p.hotSpan()); h {
				hot, rate = true, max(rate, rt)
			}
		}
	}
	if !hot {
		return
	}
	var specs []*ratelimit.Spec
	var keys []string
	for i, r := range reqs {
		if ls[i] == nil {
			p.watch.forget(r.Spec, r.Key)
			specs, keys = append(specs, r.Spec), append(keys, r.Key)
		}
	}
	p.leaseNow(specs, keys, rate)
}

// Lend lends on the next store, so that a limiter over Leases grants part of a request
// (ratelimit.AlgorithmLimiter.AllowAtMost, a loan of holder 0) as it would without them.
func (p *Leases) Lend(ctx context.Context, loans []ratelimit.Loan) ([]ratelimit.Lent, error) {
	return p.lender.Lend(ctx, loans)
}

// op is a peek, a debit, a refund or a reset. A peek goes to the next store. A debit is
// charged to this instance's lease of the key first (what it holds was taken from the
// key already), the rest to the next store; a debit that leaves the key nothing to lend
// (a debt) stops this instance's lease from spending until the key could lend again; the
// others' learn of the debt at their next refill, within a refill interval, and give
// back what they hold, which pays it. A refund goes back
// where its take came from (see refund). A reset ends this instance's lease of the key
// (what it held dropped: it was taken before), reaches the next store, and then revokes
// every other instance's, which learn it at their next refill, within a refill interval.
func (p *Leases) op(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	switch req.Spec.Op {
	case "peek":
		return p.next.Apply(ctx, req)
	case "refund":
		return p.refund(ctx, req)
	case "debit":
		return p.debit(ctx, req)
	}
	if l := p.table.get(req.Spec, req.Key); l != nil {
		l.end()
		p.table.remove(l)
	}
	o, err := p.next.Apply(ctx, req)
	if p.cfg.optimistic {
		p.forget(req.Spec, req.Key, clock.UnixNano(p.cfg.clock))
	}
	if err != nil {
		return o, err
	}
	p.revoke(ctx, req)
	return o, nil
}

// debit charges req to this instance's lease of its key first, then to the next store;
// the lease's next refills hold what its debits spend too. A debit the key cannot pay
// at once (its answer a denial) stops the lease from spending until the key could lend
// again: the key owes. With WithOptimistic, a debit (or what the lease could not pay of
// it) that leaves the key something, as far as this instance knows, is charged with the
// charges made ahead (debitAhead).
func (p *Leases) debit(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	l := p.lookup(req.Spec, req.Key)
	now := clock.UnixNano(p.cfg.clock)
	if l != nil && !l.ended.Load() && now < l.until.Load() {
		l.demand.Add(req.N) // what the key's costs spend, the lease holds next
		req.N -= l.giveOut(req.N)
		if req.N > 0 {
			p.ask(l)
		}
		if req.N == 0 { // all of it from the lease: the answer is a peek of 1 on what is left
			held, limit := l.tokens.Load(), ratelimit.Args{Limit: l.limit.Load()}
			reset := time.Duration(max(l.resetAt.Load()-now, int64(time.Microsecond)))
			return limit.Outcome(held >= 1, min(limit.Limit, l.remaining.Load()+max(0, held-1)), 0, reset), nil
		}
	}
	if p.cfg.optimistic {
		if o, ok := p.debitAhead(ctx, req, now); ok {
			return o, nil
		}
	}
	o, err := p.next.Apply(ctx, req)
	if err == nil && l != nil && !o.Allowed() {
		l.owe(now + int64(o.Wait))
	}
	if err == nil && p.cfg.optimistic { // a debt denies the admissions made ahead too
		p.heard(req.Spec, req.Key, o, now)
	}
	return o, err
}

// revoke drops every instance's record of req's key at the next store; the others learn
// it at their next refill. One that fails leaves the other leases to end by themselves,
// within their TTL: the op is done either way.
func (p *Leases) revoke(ctx context.Context, req ratelimit.Request) {
	revoke := ratelimit.Loan{Key: req.Key, Spec: core.WithOp(req.Spec, ""), Holder: p.holder, Share: 1,
		TTL: p.cfg.ttl, Revoke: true}
	_, _ = p.lender.Lend(ctx, []ratelimit.Loan{revoke})
}

// refund gives a take's events back where its receipt says they came from: to this
// instance's lease that lent them, while it holds them still (a lease that ended spent
// them, and nothing comes back), or to the next store, as its receipt there says. The
// other instances' leases go on: what they hold is theirs, and conserved. The answer is
// a peek of 1 on the next store.
func (p *Leases) refund(ctx context.Context, req ratelimit.Request) (ratelimit.Outcome, error) {
	if p.cfg.optimistic { // the key has more after it than this instance heard
		p.forget(req.Spec, req.Key, clock.UnixNano(p.cfg.clock))
	}
	r := req.Receipt
	if r == nil {
		return p.next.Apply(ctx, req)
	}
	if r.Via == 0 && r.Next != nil {
		if err := p.landed(ctx, r.Next); err != nil { // admitted ahead: its charge lands first
			return ratelimit.Outcome{}, err
		}
		if r.Next.At > 0 {
			req.Receipt = r.Next
			return p.next.Apply(ctx, req)
		}
		// the charge failed, or the next store denied it: nothing of it was counted
	}
	if l := p.table.get(req.Spec, req.Key); r.Via != 0 && l != nil && l.id == r.Via {
		l.giveBack(req.N, r.At*1000)
	}
	req.N, req.Receipt, req.Spec = 1, nil, core.WithOp(req.Spec, "peek")
	return p.next.Apply(ctx, req)
}

// hotHorizon is the horizon over which a key under sp must ask this instance one event
// to be leased (see demand): a lease's (p.horizon); with WithOptimistic, that divided by
// a quarter of this instance's share of the rule's Limit, at least one event. A key
// asked less is decided ahead (WithOptimistic) from this instance's share of what it
// has left, its charges riding the calls of the others': a lease would cost Redis more,
// a call to lend it, its renewals, and another when it ends.
func (p *Leases) hotHorizon(sp *ratelimit.Spec) float64 {
	h := p.horizon()
	if p.cfg.optimistic {
		h /= max(1, float64(sp.Rule.Limit)/float64(4*p.instances()))
	}
	return h
}

// hotSpan is the shortest span over which the exact path's demand of a key says it is
// hot: a round trip (a key that turns hot is leased within one); with WithOptimistic, a
// quarter of a refill interval at least, so that two requests of a quiet key close
// together do not lease it, only for the refiller to end the lease a second later.
func (p *Leases) hotSpan() int64 {
	if p.cfg.optimistic {
		return max(p.rtt.Load(), int64(p.cfg.refill/4))
	}
	return p.rtt.Load()
}
