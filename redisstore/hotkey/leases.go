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

// Leases decides a key's requests in memory, on every instance, without waiting for the
// next store. Every instance shares the next store, which lends: redisstore, or
// fallback around it. Leases starts a goroutine of its own. Close stops it, charges
// what it admitted on trust, and gives back what it holds.
//
// Leases works for the algorithms that lend: the token bucket, the fixed window, the
// sliding window counter and the calendar quotas. Other algorithms and peeks take the
// exact path, on the next store. So do rules whose Limit is smaller
// than the instances, such as 5 a minute on 20 instances. LeasesStats.Exact counts them.
//
// # The bound
//
// The instances together admit what the rule allows, and few events more. Over any
// interval, they admit beyond the rule only:
//
//   - the events each instance admits on trust, WithTrust's per key at a time (1 by
//     default). They
//     are charged to the next store at once, as debits. A key admitted beyond its rule
//     owes them, and repays them from its next events.
//   - the events the instances hold on loan at the interval's start. The key counted
//     them when it lent them, before the interval. A lease holds about a key's demand
//     over a refill interval, and at most what the key had left divided by the
//     instances.
//   - what debits of costs known after the answer add (AlgorithmLimiter.Debit,
//     Charge), as without Leases.
//   - what the next store admits without Redis. A fallback.Store decides a call that
//     misses its timeout on the instance's share. That is at most the rule's burst
//     divided by the instances. The key pays it back once Redis counts it (see
//     fallback.Store).
//
// Nothing is lost. With nothing failing, what the instances admitted, hold on loan and
// give back at Close adds up to what the rule allowed. A key asked
// beyond its rule is admitted its rule. A refill or a give-back whose answer is lost,
// say to a timeout, loses nothing either. Each loan is numbered, and the
// key's next loan settles it.
//
// # How a request is decided
//
// Leases decides a request in the first of these ways that applies:
//
//   - from the events this instance holds on loan for its key (its lease), when it
//     holds enough;
//   - denied from memory, while the key is known to have none. That follows a denial, a
//     debt, or a refill that got less than asked. It lasts until the lease's pace or its
//     next refill.
//   - on trust, while fewer than WithTrust events of the key are admitted here and not
//     yet charged;
//   - else on the next store, as without Leases (the exact path).
//
// A request memory cannot decide while its key's refill is on its way waits for that
// refill first. It waits up to 100ms, or a quarter of the refill interval if shorter.
// So a key turning busy costs the next store one loan, not a call per request.
//
// A key asked more than its trust serves gets a lease. Its first loan goes out with its
// next request, in one call with other keys' loans. Its refills are asked for before it
// runs out. A lease holds about the instance's demand over a refill interval
// (WithRefill) and a round trip. It never holds more than the key has left divided by the
// instances (WithInstanceCount). It is renewed at least once a refill interval, and what
// it does not need goes back.
//
// A key asked more than its rule is decided from memory too, denials and admissions
// alike. A refill that gets less than asked means the key is at its rule. The lease then
// spends it at an even pace, and denies the rest from memory. The next refill lends what
// the key accrued since. It comes a quarter of a refill interval later, or after 50
// requests of the key, but at most every 10ms. A window's lease holds no more than it
// spends before the window ends.
//
// Several limits of one request (ApplyAll: ratelimit.AllowAll, Middleware.Policies) are
// decided from memory, all or none, when each can be. Otherwise they go to the next
// store. A request that keeps a reserve for more important ones (priorities) is decided
// on its key's lease. It keeps the reserve of what the key had left at the last refill,
// plus what the lease holds. Without a lease, it goes to the next store.
//
// A decision from memory reports the rule's Limit. Its Remaining is the key's at the
// next store's last answer, plus what the lease holds. Its time until the key is full is
// as that answer put it. Its source, for the middleware's Event, is "lease" (Source).
//
// # Debits, refunds, resets and rule changes
//
// A debit is paid from this instance's lease of the key first. The rest is charged to
// the next store with the charges on trust. It is sent at once when this instance knows
// it leaves the key in debt, or when it names a take's receipt. A key in debt is denied
// from memory until it has repaid, on every instance within a refill interval.
//
// A refund goes back to the lease that made its take, while that lease holds it.
// Otherwise it goes to the next store, as its receipt says.
//
// A reset drops this instance's entry of the key at once. The other instances drop
// their leases at their next refill. So the key is restored everywhere within a refill
// interval. A rule change does the same. A request under another rule than its key's
// entry ends that entry here. It ends the other instances' leases at their next refill.
type Leases struct {
	next   ratelimit.Store
	lender core.Lender
	cfg    leaseConfig
	holder int64 // names this instance at the next store; each entry's holder is it and the entry's number
	seq    int64 // the refiller's: the latest Loan.Seq it sent
	// the refiller's: entries that ended but whose last give-back went unanswered, sent
	// again (a numbered loan settles it) until one is answered or their records end
	unsettled []*entry

	leased  leaseTable // the entries the refiller looks after (a lease, or one asked for)
	entries entryMap   // every entry
	asks    chan *entry
	rtt     atomic.Int64 // the round trip of a refill, nanoseconds, a moving average
	charges charges      // the admissions on trust and the debits, waiting to be charged together
	pending sync.Map     // *core.Receipt -> chan struct{}: a take on trust with a receipt, closed once charged
	paid    sync.Map     // *core.Receipt -> int64: what a lease paid of a settlement whose rest failed

	stop     chan struct{} // closed by Close
	done     chan struct{} // closed when the refiller has given back what it held
	stopped  atomic.Bool   // Close was called: requests take the exact path
	closeErr error         // what the last charges and give-backs lost, written before done closes
	closed   sync.Once

	stats leasesCounts
}

// leasesCounts are what Stats reports, counted as it happens.
type leasesCounts struct {
	local, exact, trusted, short, uncharged atomic.Int64
	refills, loans, failed, revoked         atomic.Int64
}

// LeasesStats is what Leases has done since it was made.
type LeasesStats struct {
	Leases    int           // keys leased now
	Local     int64         // decisions made in memory: from a lease, denials, and admissions on trust
	Exact     int64         // decisions of the next store (the exact path); peeks, debits, refunds and resets aside
	Trusted   int64         // admissions on trust, in Local: events not yet counted by the next store
	Short     int64         // of them, those whose charge found the key spent after it: owed by it (a debt it repays), or its last
	Uncharged int64         // events admitted on trust, or debited, whose charge failed (the next store's error)
	Refills   int64         // calls to the next store's Lend for leases
	Loans     int64         // loans in them: a lease's first, its refills and renewals, and its give-back when it ends
	Failed    int64         // of them, the ones that failed
	Revoked   int64         // loans that found this instance's record gone (ended, revoked)
	RoundTrip time.Duration // of a refill, a moving average
}

// Stats is what p has done so far.
func (p *Leases) Stats() LeasesStats {
	c := &p.stats
	return LeasesStats{Leases: p.leased.size(), Local: c.local.Load(), Exact: c.exact.Load(), Trusted: c.trusted.Load(),
		Short: c.short.Load(), Uncharged: c.uncharged.Load(), Refills: c.refills.Load(), Loans: c.loans.Load(), Failed: c.failed.Load(),
		Revoked: c.revoked.Load(), RoundTrip: time.Duration(p.rtt.Load())}
}

var (
	_ core.BatchStore = (*Leases)(nil)
	_ core.Lender     = (*Leases)(nil)
)

// Source is what a decision made in memory reports as its source (ratelimit.Event.Source).
const Source = "lease"

// NewLeases returns Leases over next, and starts its refiller. It returns an error for
// a next that does not lend (localstore, redisstore and fallback do). It panics for a nil next or option.
func NewLeases(next ratelimit.Store, opts ...LeasesOption) (*Leases, error) {
	cfg := newLeaseConfig(next, opts)
	lender, ok := next.(core.Lender)
	if !ok {
		return nil, fmt.Errorf("hotkey: NewLeases over %T, which does not lend (core.Lender)", next)
	}
	p := &Leases{next: next, lender: lender, cfg: cfg, holder: newHolder(), asks: make(chan *entry, 4096),
		stop: make(chan struct{}), done: make(chan struct{})}
	p.rtt.Store(int64(time.Millisecond))
	p.entries.init(cfg.maxKeys)
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

// Close stops the refiller, charges what this instance admitted on trust, and gives back
// what it holds, within ctx. The keys' requests then take the exact path. It returns an
// error wrapping ratelimit.ErrUnavailable when a charge or a give-back failed. What it
// held is then lost to the key until its records end. It is safe to call more than once.
func (p *Leases) Close(ctx context.Context) error {
	p.closed.Do(func() {
		p.stopped.Store(true)
		close(p.stop)
	})
	select {
	case <-p.done:
		return p.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// instances is how many instances share the keys (WithInstanceCount), 1 when not known.
func (p *Leases) instances() int64 {
	if p.cfg.instances == nil {
		return 1
	}
	return int64(max(1, p.cfg.instances()))
}

// Apply decides req in memory when it can (see Leases), else on the next store.
func (p *Leases) Apply(ctx context.Context, req core.Request) (core.Outcome, error) {
	sp := req.Spec
	if !p.decides(req) {
		if sp != nil && sp.Op == core.OpRefund && req.Receipt != nil && sp.Algorithm != nil && sp.Algorithm.Lendable {
			return p.refund(ctx, req) // a take from memory, whatever selects it now
		}
		if sp != nil && sp.Op == core.OpTake {
			p.stats.exact.Add(1)
		}
		return p.next.Apply(ctx, req)
	}
	switch sp.Op {
	case core.OpTake:
	case core.OpRefund:
		return p.refund(ctx, req)
	case core.OpDebit:
		return p.debit(ctx, req)
	case core.OpReset:
		return p.reset(ctx, req)
	default: // a peek
		return p.next.Apply(ctx, req)
	}
	now := clock.UnixNano(p.cfg.clock)
	e := p.lookup(sp, req.Key, now)
	if e != nil {
		o, how, ok := p.fromMemory(e, req, now, false)
		if !ok && e.await(ctx, now, p.patience()) { // a refill was on its way: decide on what it lent
			now = clock.UnixNano(p.cfg.clock)
			o, how, ok = p.fromMemory(e, req, now, true)
		}
		if ok {
			p.stats.local.Add(1)
			trace.Set(ctx, Source)
			if o.Allowed() {
				p.admitted(ctx, e, req, how, now)
			}
			return o, nil
		}
	}
	p.stats.exact.Add(1)
	return p.exactTake(ctx, e, req, now)
}

// patience is how long after a refill was asked for a decision the lease cannot make
// waits for it, before it takes the exact path: 100ms, as long as a fallback.Store waits
// for Redis before its share denies, and a quarter of a refill interval at most. Waiting
// spares the next store a call per request until the loan lands. A spammer's first
// moments sent 10,000 takes a second, past the fallback's timeout, and its shares
// admitted 100 events beyond the burst; waiting 5ms was too short for a loan then.
func (p *Leases) patience() time.Duration {
	return min(p.cfg.refill/4, 100*time.Millisecond)
}

// How a decision in memory admitted a request.
const (
	fromLease = iota + 1
	onTrust
)

// fromMemory decides req (a take) from what e holds and knows: from its lease, a
// denial, or on trust (how); ok false when none of them can (the exact path decides).
// Again is a second look, after a refill: its demand is counted.
func (p *Leases) fromMemory(e *entry, req core.Request, now int64, again bool) (o core.Outcome, how int, ok bool) {
	if e.ended.Load() {
		return o, 0, false
	}
	e.seen.Store(now)
	if !again {
		e.demand.Add(req.N)
	}
	keep := keepOf(req.Spec, e.limit)
	t := e.terms.Load()
	if o, ok := e.fromLease(p, t, req.N, keep, now); ok {
		return o, fromLease, true
	}
	if e.leased.Load() && now >= t.denied {
		p.ask(e, now) // it ran low, or out of time: a refill is due
	}
	if o, ok := e.denial(p, t, req.N, keep, now); ok {
		if !e.leased.Load() && now-t.heard >= int64(p.cfg.refill/2) {
			p.probe(e) // what it knows is old: a reset may have restored the key since
		}
		return o, 0, true
	}
	if keep == 0 && p.trusts(e, t, req.N) {
		remaining := max(0, e.limit-req.N)
		if t.fresh(now, p.cfg.refill/4) {
			remaining = max(0, min(e.limit, t.remaining)-e.pending.Load())
		}
		return core.Args{Limit: e.limit}.Outcome(true, remaining, 0, req.Spec.Rule.Period), onTrust, true
	}
	p.busy(e, req.N, now, true)
	return o, 0, false
}

// trusts reports whether e may admit n more events on trust, knowing t, and if so counts
// them as pending: while fewer than WithTrust events of the key are admitted and not yet
// charged, the key is not known to be short of them (a dry lease, a debt, an answer that
// left less than n for each instance: a key once spent is asked on the exact path until
// an answer says it has more), and the rule admits at least one event per instance.
func (p *Leases) trusts(e *entry, t *terms, n int64) bool {
	trust := p.cfg.trust
	switch {
	case trust <= 0 || n > trust || t.dry || t.owes || e.limit < p.instances():
		return false
	case t.heard != 0 && t.remaining-e.pending.Load() < n*p.instances():
		return false
	}
	for {
		pending := e.pending.Load()
		if pending+n > trust {
			return false
		}
		if e.pending.CompareAndSwap(pending, pending+n) {
			break
		}
	}
	// a charge that landed since t was read published its answer before it counted its
	// events off pending: read again, or a debt it found would go unseen
	if now := e.terms.Load(); now != t && (now.dry || now.owes || now.heard != 0 && now.remaining-e.pending.Load()+n < n*p.instances()) {
		e.pending.Add(-n)
		return false
	}
	return true
}

// admitted does what an admission from memory (how) asks: a take from the lease with a
// receipt says so, to be given back to it; one on trust is charged.
func (p *Leases) admitted(ctx context.Context, e *entry, req core.Request, how int, now int64) {
	switch how {
	case fromLease:
		if r := req.Receipt; r != nil { // given back to the lease, or once it ended, to the next store as of its record's first loan
			r.At, r.Via, r.Next = max(1, now/1000), e.id, e.began.Load()
		}
		p.busy(e, req.N, now, false)
	case onTrust:
		p.stats.trusted.Add(req.N)
		p.chargeTrust(ctx, e, req, now)
		p.busy(e, req.N, now, false)
	}
}

// decides says whether Leases decides req, or passes it to the next store: an algorithm
// that lends, a request ForRequests selects.
func (p *Leases) decides(req core.Request) bool {
	sp := req.Spec
	return sp != nil && sp.Algorithm != nil && sp.Algorithm.Lendable && p.cfg.handles(req) && !p.stopped.Load()
}

// keepOf is what sp's reserve keeps back of a key's Remaining under limit.
func keepOf(sp *core.Spec, limit int64) int64 {
	if sp.Reserve == 0 {
		return 0
	}
	return mathx.Keep(limit, sp.Reserve)
}

// lookup is the entry of key under sp's rule, made if it has none (nil when the table is
// full, or sp's rule is one it cannot count). An entry of the key under another rule
// (one its algorithm reads otherwise) ends: the instance decides under the new rule from
// now on, and the old lease's events are spent by no one (giving them back would step
// the key's state under the old rule).
// The other instances' leases of the old rule end at their next refill, which finds their
// records dropped by the new rule's loans.
func (p *Leases) lookup(sp *core.Spec, key string, now int64) *entry {
	e := p.leased.get(sp, key)
	if e == nil {
		e = p.entries.get(algKey{sp.Algorithm, sp.Namespace, key})
	}
	if e != nil && e.spec.Rule == sp.Rule && !e.ended.Load() {
		return e
	}
	a, err := sp.Algorithm.Prepare(sp.Rule, 1)
	if e != nil && err == nil && a == e.args && !e.ended.Load() { // a rule its algorithm reads the same (a window's Burst)
		return e
	}
	if e != nil {
		p.drop(e)
	}
	if err != nil {
		return nil
	}
	return p.entries.getOrAdd(algKey{sp.Algorithm, sp.Namespace, key}, now, int64(p.cfg.refill), func() *entry {
		// the key and its rule alone: the request that made the entry may be a debit, a
		// refund or keep a reserve, which its loans must not (a store refuses them)
		spec := &core.Spec{Algorithm: sp.Algorithm, Namespace: sp.Namespace, Rule: sp.Rule}
		id := entryIDs.Add(1)
		// a holder of its own: the records of an earlier entry of the key (what its lease
		// spent, until they end) are not this one's, nor its give-backs sent again
		holder := p.holder ^ id
		if holder == 0 {
			holder = p.holder
		}
		e := &entry{spec: spec, key: key, limit: a.Limit, args: a, id: id, holder: holder}
		e.terms.Store(&terms{})
		e.seen.Store(now)
		return e
	})
}

// drop takes e out of both tables: what it holds is spent by no one.
func (p *Leases) drop(e *entry) {
	e.end()
	p.leased.remove(e)
	p.entries.remove(e)
}

// exactTake takes req on the next store, and learns the key's state from the answer; its
// Receipt, if any, says so, and holds the next store's own.
func (p *Leases) exactTake(ctx context.Context, e *entry, req core.Request, now int64) (core.Outcome, error) {
	if e != nil {
		p.settled(ctx, e)
	}
	outer := req.Receipt
	if outer != nil {
		req.Receipt = &core.Receipt{}
	}
	o, err := p.next.Apply(ctx, req)
	if err != nil {
		return o, err
	}
	if outer != nil && o.Allowed() {
		outer.At, outer.Via, outer.Next = req.Receipt.At, 0, req.Receipt
	}
	if e != nil {
		p.heard(e, o, now, toTake)
	}
	return o, nil
}

// What an answer of the next store answered (heard).
const (
	toTake  = iota // a take: its Outcome is after it
	toPeek         // a peek of 1, changing nothing
	toDebit        // a debit: its Outcome is a peek of 1 after it
)

// heard learns from o, the next store's answer of e's key (to what) asked at now: what
// the key has left, and a denial, which denies from memory until its RetryAfter (the
// refiller asks again within a refill interval, in case another instance reset the key).
// A debit's denial is a debt: this instance's lease spends nothing, and gives back what
// it holds to pay it. An admission asked before the latest answer heard says nothing
// new: answers may come back out of order, and an old one would hide a newer denial.
func (p *Leases) heard(e *entry, o core.Outcome, now int64, what int) {
	debt, peek := what == toDebit && !o.Allowed(), what != toTake
	e.publish(func(t *terms) {
		if o.Allowed() && now < t.heard {
			return
		}
		t.heard, t.remaining, t.resetAt = max(t.heard, now), o.Remaining, now+int64(o.Reset)
		switch {
		case !o.Allowed():
			t.retryAt = now + int64(o.Wait)
			t.denied = t.retryAt
			t.remaining = 0
			t.owes = t.owes || debt && now < t.until
		case peek:
			t.remaining++ // the peek took one
			fallthrough
		case t.until == 0:
			t.denied, t.retryAt = 0, 0
		}
	})
	if debt {
		p.ask(e, now)
	}
}

// ApplyAll decides several limits at once, all or none. It decides in memory when each
// can be, from its lease or on trust. Each then answers as it would alone, and when one
// denies, what the others took goes back. Otherwise it decides on the next store, as
// atomically as the next store makes it. A next store that cannot batch gives an error
// matching errors.ErrUnsupported. Then ratelimit.AllowAll takes
// the requests one by one.
func (p *Leases) ApplyAll(ctx context.Context, reqs []core.Request) ([]core.Outcome, error) {
	now := clock.UnixNano(p.cfg.clock)
	es := make([]*entry, len(reqs))
	for i, r := range reqs {
		if p.decides(r) && r.Spec.Op == core.OpTake {
			es[i] = p.lookup(r.Spec, r.Key, now)
		}
		if es[i] == nil {
			es = nil
			break
		}
	}
	if es != nil {
		if os, ok := p.allFromMemory(ctx, es, reqs, now); ok {
			return os, nil
		}
	}
	bs, ok := p.next.(core.BatchStore)
	if !ok {
		return nil, fmt.Errorf("hotkey: Leases over %T, which decides one request at a time: %w", p.next, errors.ErrUnsupported)
	}
	for _, e := range es {
		if e != nil {
			p.settled(ctx, e)
		}
	}
	p.stats.exact.Add(int64(len(reqs)))
	sent := core.InnerReceipts(reqs) // the exact path's takes: their receipts say so
	os, err := bs.ApplyAll(ctx, sent)
	if err != nil {
		return os, err
	}
	core.WireReceipts(reqs, sent, os, 0, 0)
	for i, o := range os {
		if es != nil && es[i] != nil && (o.Allowed() || !allAllowed(os)) {
			p.heard(es[i], o, now, toTake)
		}
	}
	return os, nil
}

// allAllowed reports whether every one of os was allowed.
func allAllowed(os []core.Outcome) bool {
	for _, o := range os {
		if !o.Allowed() {
			return false
		}
	}
	return true
}

// allFromMemory decides reqs in memory, all or none, when each can be; ok false when one
// cannot, having taken nothing.
func (p *Leases) allFromMemory(ctx context.Context, es []*entry, reqs []core.Request, now int64) ([]core.Outcome, bool) {
	os := make([]core.Outcome, len(reqs))
	hows := make([]int, len(reqs))
	undo := func(upTo int) { // what reqs[:upTo] took goes back
		for j := range upTo {
			switch {
			case !os[j].Allowed():
			case hows[j] == fromLease:
				es[j].tokens.Add(reqs[j].N)
			case hows[j] == onTrust:
				es[j].pending.Add(-reqs[j].N)
			}
		}
	}
	all := true
	for i, r := range reqs {
		o, how, ok := p.fromMemory(es[i], r, now, false)
		if !ok {
			undo(i)
			return nil, false
		}
		os[i], hows[i], all = o, how, all && o.Allowed()
	}
	if !all { // none counted; each says what it would alone
		undo(len(reqs))
	} else {
		for i, r := range reqs {
			p.admitted(ctx, es[i], r, hows[i], now)
		}
	}
	p.stats.local.Add(int64(len(reqs)))
	trace.Set(ctx, Source)
	return os, true
}

// Lend lends on the next store. So a limiter over Leases grants part of a request as it
// would without them (ratelimit.AlgorithmLimiter.AllowAtMost, a loan of holder 0). Lend
// learns the keys' state from the answers.
func (p *Leases) Lend(ctx context.Context, loans []core.Loan) ([]core.Lent, error) {
	lent, err := p.lender.Lend(ctx, loans)
	if err != nil || len(lent) != len(loans) {
		return lent, err
	}
	now := clock.UnixNano(p.cfg.clock)
	for i, l := range loans {
		if l.Holder == 0 && l.Spec != nil && p.decides(core.Request{Key: l.Key, Spec: l.Spec}) {
			if e := p.lookup(l.Spec, l.Key, now); e != nil {
				what := toTake
				switch {
				case l.Spec.Op == core.OpDebit:
					what = toDebit
				case lent[i].N == 0:
					what = toPeek
				}
				p.heard(e, lent[i].Outcome, now, what)
			}
		}
	}
	return lent, nil
}

// reset ends this instance's entry of the key (what its lease held dropped: it was taken
// before), resets the key on the next store, and revokes every instance's record of it
// there: the others find theirs gone at their next refill, within a refill interval, and
// drop what they hold.
func (p *Leases) reset(ctx context.Context, req core.Request) (core.Outcome, error) {
	// the charges of what was admitted before the reset land before it, not on the
	// restored key
	if e := p.leased.get(req.Spec, req.Key); e != nil {
		p.settled(ctx, e)
		p.drop(e)
	}
	if e := p.entries.get(algKey{req.Spec.Algorithm, req.Spec.Namespace, req.Key}); e != nil {
		p.settled(ctx, e)
		p.drop(e)
	}
	// the loans revoked first: a refill between a reset and its revoke would take from
	// the restored key, and its record revoked after, what it took would be lost
	revoke := core.Loan{Key: req.Key, Spec: core.WithOp(req.Spec, core.OpTake), Holder: p.holder, Share: 1,
		TTL: p.cfg.ttl, Revoke: true}
	_, _ = p.lender.Lend(ctx, []core.Loan{revoke}) // one that fails leaves the others' leases to end with their TTL
	return p.next.Apply(ctx, req)
}

// refund gives a take's events back where its receipt says they came from: to this
// instance's lease that lent them, while it holds them still; once it ended, to the next
// store as of the first loan of the lease's record; or to the next store, as its receipt there says (a
// take on trust once its charge has landed, a take of the exact path). The answer is a peek
// of 1: the lease's, or the next store's.
func (p *Leases) refund(ctx context.Context, req core.Request) (core.Outcome, error) {
	r := req.Receipt
	if r == nil {
		return p.next.Apply(ctx, req)
	}
	if r.Via == 0 && r.Next != nil {
		if err := p.landed(ctx, r.Next); err != nil { // a take on trust: its charge lands first
			return core.Outcome{}, err
		}
		if r.Next.At <= 0 { // its charge failed: nothing of it was counted, nothing to give back
			req.N, req.Receipt, req.Spec = 1, nil, core.WithOp(req.Spec, core.OpPeek)
		} else {
			req.Receipt = r.Next
		}
		o, err := p.next.Apply(ctx, req)
		if e := p.lookup(req.Spec, req.Key, clock.UnixNano(p.cfg.clock)); err == nil && e != nil {
			e.publish(func(t *terms) { t.heard = 0 }) // the key has more now than it last said
		}
		return o, err
	}
	now := clock.UnixNano(p.cfg.clock)
	e := p.leased.get(req.Spec, req.Key)
	if r.Via != 0 && e != nil && e.id == r.Via && e.give(req.N, r.At*1000) {
		t := e.terms.Load()
		held := e.tokens.Load()
		return core.Args{Limit: e.limit}.Outcome(held >= 1, min(e.limit, t.remaining+max(0, held-1)), 0, t.resetIn(now)), nil
	}
	if r.Via != 0 && r.Next != nil {
		// the lease ended, or its record did (what it held then was spent, or given
		// back): the events were counted at the next store since its record's first loan,
		// and go back there as a take of then would (no more than the key would hold)
		req.Receipt = r.Next
		return p.next.Apply(ctx, req)
	}
	req.N, req.Receipt, req.Spec = 1, nil, core.WithOp(req.Spec, core.OpPeek) // taken where nothing records it: nothing comes back
	return p.next.Apply(ctx, req)
}

// debit pays req from this instance's lease of the key first (what it holds was taken
// from the key already; the lease's refills hold what the debits spend too), and charges
// the rest to the next store: with the charges on trust when this instance knows it
// leaves the key something, at once when it may leave it in debt (whose answer then
// denies the key from memory) or names a take's receipt. A settlement tried again
// (Spec.Retry) goes to the next store, which applies it once, less what the lease paid
// of its first attempt.
func (p *Leases) debit(ctx context.Context, req core.Request) (core.Outcome, error) {
	now := clock.UnixNano(p.cfg.clock)
	e := p.lookup(req.Spec, req.Key, now)
	if req.Spec.Retry && req.Receipt != nil { // what the lease paid of its first attempt stays paid
		if paid, ok := p.paid.Load(req.Receipt); ok {
			req.N -= paid.(int64)
		}
		o, err := p.exactDebit(ctx, e, req, now)
		if err == nil {
			p.paid.Delete(req.Receipt)
		}
		return o, err
	}
	if e == nil || req.Spec.Retry || req.Spec.Reserve != 0 || req.Receipt != nil && req.Receipt.At == 0 {
		return p.exactDebit(ctx, e, req, now)
	}
	e.demand.Add(req.N) // what the key's costs spend, the lease holds next
	t := e.terms.Load()
	var paid int64
	if now < t.until && !t.owes {
		paid = e.giveOut(req.N)
		req.N -= paid
		if req.N == 0 { // all of it from the lease: the answer is a peek of 1 on what is left
			held := e.tokens.Load()
			return core.Args{Limit: e.limit}.Outcome(held >= 1, min(e.limit, t.remaining+max(0, held-1)), 0, t.resetIn(now)), nil
		}
		p.ask(e, now)
	}
	left := e.limit - e.pending.Load()
	if t.heard != 0 {
		left = t.remaining - e.pending.Load()
	}
	if req.Receipt != nil || now < t.denied || left-req.N < 1 { // a settlement, or a debt for all it knows: at once
		o, err := p.exactDebit(ctx, e, req, now)
		if err != nil && req.Receipt != nil && paid > 0 { // its retry charges the rest alone
			p.paid.Store(req.Receipt, paid)
		}
		return o, err
	}
	e.publish(func(t *terms) { t.remaining -= req.N })
	p.chargeDebit(e, req)
	return core.Args{Limit: e.limit}.Outcome(true, max(0, left-req.N-1), 0, t.resetIn(now)), nil
}

// exactDebit charges req, a debit, to the next store at once (after the charges of e's
// admissions on trust), and learns the key's state from the answer.
func (p *Leases) exactDebit(ctx context.Context, e *entry, req core.Request, now int64) (core.Outcome, error) {
	if e != nil {
		p.settled(ctx, e)
	}
	o, err := p.next.Apply(ctx, req)
	if err == nil && e != nil {
		p.heard(e, o, now, toDebit)
	}
	return o, err
}
