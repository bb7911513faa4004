package hotkey

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/lend"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

const (
	maxRefill = 1000                 // the most leases one refill asks for at once
	ticks     = 4                    // the refiller's looks at every lease in a refill interval
	coalesce  = 2 * time.Millisecond // how long an ask at low water waits for others
)

// refill is the refiller: it lends what decisions ask for at low water, coalesced, and
// four times a refill interval looks at every lease. A look tops a lease up, renews it,
// gives back what it does not need, or ends it. It also refills a key that had less to
// lend than asked: what the key accrued in that quarter. When Close stops the refiller,
// it charges what was admitted on trust, then gives back what the leases hold.
func (p *Leases) refill() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.refill / ticks)
	defer tick.Stop()
	last := clock.UnixNano(p.cfg.clock)
	for {
		select {
		case <-p.stop:
			failed, uncharged := p.stats.failed.Load(), p.stats.uncharged.Load()
			if batch := p.charges.take(true); len(batch) > 0 {
				p.sendAll(batch)
			}
			p.charges.flying.Wait()
			p.giveBack()
			p.settle(clock.UnixNano(p.cfg.clock)) // once more, what a give-back failed to settle
			if f, u := len(p.unsettled), p.stats.uncharged.Load()-uncharged; f > 0 || u > 0 {
				p.closeErr = fmt.Errorf("hotkey: closing, the give-backs of %d keys and the charges of %d events failed (%d calls): %w",
					f, u, p.stats.failed.Load()-failed, ratelimit.ErrUnavailable)
			}
			return
		case e := <-p.asks:
			batch := []*entry{e}
			time.Sleep(coalesce) // the asks of the next moments ride along (low water counts this wait)
			for len(batch) < maxRefill {
				select {
				case e := <-p.asks:
					batch = append(batch, e)
					continue
				default:
				}
				break
			}
			p.lend(p.dueSoon(batch), nil)
		case <-tick.C:
			now := clock.UnixNano(p.cfg.clock)
			p.tick(now, max(1, now-last))
			p.settle(now)
			last = now
		}
	}
}

// busy counts n events asked of e at now (missed: a request memory could not decide,
// which took the exact path), and leases e once it is asked enough to pay for a lease:
// over a quarter of a refill interval, two requests memory could not decide, or a
// quarter of this instance's share of the rule (its Limit over 4 x the instances, per
// Period), two requests at least. A lease costs the next store a call to lend it, its
// refills, and one when it ends; the quieter keys are decided on trust, their charges
// riding the calls of the others'. Its first loan goes out at once for a key asked four
// times that, or that memory missed twice; else at the refiller's next look, with the
// others' (or at its next request): a key that turns busy by chance, then quiet again,
// costs no call of its own.
func (p *Leases) busy(e *entry, n, now int64, missed bool) {
	if e.leased.Load() {
		return
	}
	span := int64(p.cfg.refill / ticks)
	if w := e.window.Load(); now-w >= span && e.window.CompareAndSwap(w, now) {
		e.asked.Store(0)
		e.calls.Store(0)
		e.missed.Store(0)
	}
	asked, calls, misses := e.asked.Add(n), e.calls.Add(1), e.missed.Load()
	if missed {
		misses = e.missed.Add(1)
	}
	enough := max(2, float64(e.spec.Rule.Limit)/float64(4*p.instances())*float64(span)/float64(e.spec.Rule.Period))
	// one request is never busy: a large one (a model's tokens) would strand a lease
	if calls >= 2 && (misses >= 2 || float64(asked) >= enough) && p.leased.size() < p.cfg.maxKeys && e.leased.CompareAndSwap(false, true) {
		rate := float64(asked) * 1e9 / float64(max(now-e.window.Load(), span/ticks, 1))
		e.seed.Store(math.Float64bits(rate))
		e.low.Store(p.low(rate))
		p.leased.add(e)
		if misses >= 2 || float64(asked) >= 4*enough { // else the refiller's next look lends it, with the others'
			p.ask(e, now)
		}
	}
}

// ask queues a refill of e at now, unless one is queued or in flight.
func (p *Leases) ask(e *entry, now int64) {
	if e.leased.Load() && e.startAsk(now) {
		select {
		case p.asks <- e:
		default: // the queue is full: the next tick refills it
			e.endAsk()
		}
	}
}

// horizon is how long a lease should last, in seconds: a round trip and a refill
// interval.
func (p *Leases) horizon() float64 {
	return (time.Duration(p.rtt.Load()) + p.cfg.refill).Seconds()
}

// tick measures every lease's demand over elapsed (nanoseconds), and refills, shrinks or
// ends each as it needs.
func (p *Leases) tick(now, elapsed int64) {
	secs, horizon := float64(elapsed)/1e9, p.horizon()
	var refills, drops, could []*entry
	p.leased.each(func(e *entry) {
		if e.ended.Load() {
			drops = append(drops, e)
			return
		}
		e.takeSeed()
		d := e.demand.Load()
		e.rate = (e.rate + float64(d-e.lastDemand)/secs) / 2
		e.lastDemand = d
		if e.rate*horizon < 0.5 {
			e.quiet++
		} else {
			e.quiet = 0
		}
		target, low := p.sizes(e)
		e.low.Store(low)
		t := e.terms.Load()
		switch tokens := e.tokens.Load(); {
		case e.quiet >= ticks:
			drops = append(drops, e)
		case e.asking.Load():
		case t.owes && tokens > 0, tokens < target/2 && now >= t.denied, tokens > 2*target, t.until-now < int64(p.cfg.ttl)/2,
			now-e.lentAt >= int64(p.cfg.refill*11/16),                          // a debt, a revoke or a new rule reaches the lease within a refill interval: at the first look 11/16 of it after its loan, 15/16 at most
			(t.dry || now < t.denied) && now-e.lentAt >= int64(p.cfg.refill/2): // a key denied from memory: a reset reaches it sooner
			if e.startAsk(now) {
				refills = append(refills, e)
			}
		case tokens < target*3/4 && now >= t.denied, now-e.lentAt >= int64(p.cfg.refill)/2:
			could = append(could, e)
		}
	})
	if len(refills)+len(drops) > 0 { // a call goes out: the leases that would need one soon ride along
		for _, e := range could {
			if e.startAsk(now) {
				refills = append(refills, e)
			}
		}
	}
	p.lend(refills, drops)
}

// dueSoon adds to batch, a refill about to go out, the dry keys whose next refill is
// due within half a refill interval's look: they ride along, and their refills come
// together, not one call each.
func (p *Leases) dueSoon(batch []*entry) []*entry {
	now := clock.UnixNano(p.cfg.clock)
	p.leased.each(func(e *entry) {
		if len(batch) >= maxRefill {
			return
		}
		if t := e.terms.Load(); t.dry && now >= t.denied-p.dryEvery(e, now)/2 && !e.ended.Load() && e.startAsk(now) {
			batch = append(batch, e)
		}
	})
	return batch
}

// sizes are how many events e should hold after a refill, and below how many it asks
// for the next at once: its demand over a horizon, and over two round trips and the wait
// of a coalesced ask.
func (p *Leases) sizes(e *entry) (target, low int64) {
	low = p.low(e.rate)
	return int64(math.Ceil(e.rate*p.horizon())) + low, low
}

// low is below how many events a lease asked rate events a second asks for a refill at
// once: its demand over two round trips and the wait of a coalesced ask.
func (p *Leases) low(rate float64) int64 {
	return int64(math.Ceil(rate*(2*time.Duration(p.rtt.Load())+coalesce).Seconds())) + 1
}

// lend asks the next store for what refills need, and gives back what drops hold
// (ending them), in one call.
func (p *Leases) lend(refills, drops []*entry) {
	live := refills[:0:0] // an entry that ended since it asked (a reset, a rule change) wants nothing
	for _, e := range refills {
		if e.ended.Load() {
			e.endAsk()
			continue
		}
		live = append(live, e)
	}
	refills = live
	if len(refills)+len(drops) == 0 {
		return
	}
	share := int64(1)
	if p.cfg.instances != nil {
		share = p.instances()
	}
	loans := make([]core.Loan, 0, len(refills)+len(drops))
	gives := make([]int64, len(refills))
	sent := clock.UnixNano(p.cfg.clock)
	for i, e := range refills {
		e.takeSeed()
		if e.lentAt != 0 { // a key asked faster since its last loan than its rate says: lent for that
			since := max(sent-e.lentAt, p.rtt.Load(), int64(coalesce))
			e.rate = max(e.rate, float64(e.demand.Load()-e.lentDemand)*1e9/float64(since))
		}
		target, low := p.sizes(e)
		e.low.Store(low)
		held, t := e.tokens.Load(), e.terms.Load()
		spend := target // what e spends before its loan ends
		if _, end, ok := lend.Window(e.spec.Algorithm, sent/1000, e.spec.Rule.Period.Microseconds()); ok && e.rate > 0 {
			// a window's loan ends with it: what e would not spend by then goes back, to
			// another instance, or to the next window (a sliding window's)
			spend = int64(min(float64(target), e.rate*float64(end*1000-sent)/1e9)) // in float: a month's window at a high rate is past int64
		}
		switch {
		case t.owes: // all of it, to pay the key's debt
			gives[i] = e.giveOut(held)
		case held > 2*target:
			gives[i] = e.giveOut(held - target)
		case held > spend && spend < target:
			gives[i] = e.giveOut(held - spend)
		}
		sh, want := share, max(0, spend-held+gives[i])
		if sh > 1 && t.heard != 0 && !t.owes && !t.dry {
			// no more than its share of what the key has, what it holds counted, or what
			// the key accrues in two refill intervals: the next store divides what it has
			// left, and an instance asked as a spammer asks, its refills a round trip
			// apart, would take a part of the rest at each
			fair := max(mathx.CeilDiv(max(0, t.remaining)+held, sh), int64(math.Ceil(2*e.accrues(p.cfg.refill)))) - held
			want = min(want, max(0, fair)+gives[i])
		}
		if t.dry {
			// the key is at its rule: its refill goes to the instances that ask, divided by
			// the holders, and no more than twice what it accrues in a refill interval: a
			// reset since restored the key, whose holders' records it revoked, and one
			// instance asked as a spammer asks would take it all
			sh, want = 1, min(want, int64(math.Ceil(2*e.accrues(p.cfg.refill))))
		}
		p.seq++
		var rc *core.Receipt
		if want > 0 { // the receipt of a record's first loan, for the refunds of its takes (see lent)
			rc = &core.Receipt{}
		}
		loans = append(loans, core.Loan{Key: e.key, Spec: e.spec, Holder: e.holder, Give: gives[i],
			Want: want, Share: sh, TTL: p.cfg.ttl, Seq: p.seq, Out: e.out, Receipt: rc})
	}
	dropGives := make([]int64, len(drops))
	for i, e := range drops {
		dropGives[i] = e.end()
		e.leased.Store(false)
		p.seq++
		loans = append(loans, core.Loan{Key: e.key, Spec: e.spec, Holder: e.holder, Give: dropGives[i], Share: share,
			TTL: p.cfg.ttl, Seq: p.seq, Out: e.out, End: !e.lost})
	}
	p.leased.remove(drops...)
	for _, e := range drops {
		p.entries.remove(e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ttl)
	got, err := p.lender.Lend(ctx, loans)
	cancel()
	p.stats.refills.Add(1)
	p.stats.loans.Add(int64(len(loans)))
	if err != nil { // what the key has is not known: the exact path decides what the leases cannot
		p.stats.failed.Add(1)
		// what was given back counted as given, and what was lent as not: the entry's next
		// loan (numbered, and counting this out) settles either at the next store
		ends := clock.UnixNano(p.cfg.clock) + int64(p.cfg.ttl) // a lost loan renewed the record no later
		for i, e := range refills {
			e.out -= gives[i]
			e.lost = true
			e.publish(func(t *terms) { t.dry, t.owes, t.denied = false, false, 0 })
			if e.ended.Load() { // it ended during the call: no loan of its own will settle it
				e.recordEnds = ends
				p.unsettled = append(p.unsettled, e)
			}
		}
		for i, e := range drops {
			e.out -= dropGives[i]
			e.recordEnds = ends
			p.unsettled = append(p.unsettled, e)
		}
	} else {
		now := clock.UnixNano(p.cfg.clock)
		p.rtt.Store((p.rtt.Load()*3 + now - sent) / 4)
		for i, e := range refills {
			if !got[i].Kept && e.out > 0 {
				p.stats.revoked.Add(1)
			}
			if rc := loans[i].Receipt; rc != nil && rc.At > 0 && (!got[i].Kept || e.began.Load() == nil) {
				// the takes from now on are of this record's loans (a new record's, in a
				// window's the window's): refunded as of its first
				e.began.Store(rc)
			}
			if e.ended.Load() { // it ended during the call (a reset, a rule change): what was lent goes back
				e.out = got[i].Out - got[i].N
				e.recordEnds = now + int64(p.cfg.ttl)
				p.unsettled = append(p.unsettled, e)
				continue
			}
			e.lent(got[i], loans[i].Want, sent, now, p.dryEvery(e, now), p.cfg.refill)
		}
	}
	for _, e := range refills {
		e.endAsk()
	}
}

// lent applies what the next store lent e, wanting want, asked at sent and answered at
// now, which gave back give. A loan that lent less than it wanted, of a key that had less
// than its rule accrues in a refill interval (dry: the key is at its rule, not only
// short of a burst), is spent at an even pace until the next refill, an interval later
// (dryEvery), and what the lease lacks is denied from memory until then. A key with more
// (a day's budget, a window's) is spent as it is asked.
func (e *entry) lent(r core.Lent, want, sent, now, interval int64, refill time.Duration) {
	e.lentAt, e.lentDemand = now, e.demand.Load()
	dry := r.N < want && float64(r.Remaining+r.N) < e.accrues(refill)
	e.out = r.Out
	if r.Kept {
		e.tokens.Add(r.N)
	} else { // the record was gone (ended, revoked): what e held went with it, and the takes of it give nothing back
		e.tokens.Store(r.N)
	}
	e.publish(func(t *terms) {
		t.heard, t.remaining, t.resetAt = now, r.Remaining, sent+int64(r.Reset)
		if !r.Kept {
			t.since = now
		}
		t.until = sent + int64(r.For)
		// a key that could not lend one event before the next refill owes (a debt): what
		// the lease holds goes back to it
		t.owes = dry && r.N == 0 && int64(r.Wait) > interval
		t.dry = dry
		t.pace = pace{}
		t.denied, t.retryAt = 0, 0
		if dry { // the key lent what it has: spent at an even pace until the next refill
			next := e.dryNext(sent+max(interval, int64(r.Wait)), now)
			t.pace = pace{from: now, over: next - now, n: e.tokens.Load()}
			t.denied, t.retryAt = next, next
		}
	})
}

// dryNext is when a dry lease of e, lent at now, is refilled next, if next is its time
// by its pace: no later than its window's end, when the key's loan ends. In the window's
// last quarter, at half the time left (10ms at least): what a sliding window frees there
// is lent before the window ends (TestLeasesWindowsAskedBeyond).
func (e *entry) dryNext(next, now int64) int64 {
	start, end, ok := lend.Window(e.spec.Algorithm, now/1000, e.spec.Rule.Period.Microseconds())
	if !ok {
		return next
	}
	start, end = start*1000, end*1000
	if (end-now)*4 <= end-start {
		next = min(next, now+max((end-now)/2, int64(10*time.Millisecond)))
	}
	return min(next, max(end, now+1))
}

// settle sends again, as numbered loans that give nothing and want nothing, the
// give-backs of ended entries that went unanswered: each loan gives back what its record
// holds beyond what the entry counts out, whether the lost one landed or not. An entry
// whose record has ended by now needs none: its events were counted as spent.
func (p *Leases) settle(now int64) {
	if len(p.unsettled) == 0 {
		return
	}
	var loans []core.Loan
	var es, later []*entry
	for _, e := range p.unsettled {
		switch {
		case e.recordEnds <= now: // its events were counted as spent
		case len(loans) < maxRefill:
			p.seq++
			loans = append(loans, core.Loan{Key: e.key, Spec: e.spec, Holder: e.holder, Share: 1, TTL: p.cfg.ttl,
				Seq: p.seq, Out: e.out})
			es = append(es, e)
		default:
			later = append(later, e)
		}
	}
	p.unsettled = later
	if len(loans) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ttl)
	got, err := p.lender.Lend(ctx, loans)
	cancel()
	p.stats.refills.Add(1)
	if err != nil {
		p.stats.failed.Add(1)
		ends := clock.UnixNano(p.cfg.clock) + int64(p.cfg.ttl)
		for _, e := range es {
			e.recordEnds = ends
		}
		p.unsettled = append(p.unsettled, es...)
		return
	}
	for i, e := range es {
		e.out = got[i].Out
	}
}

// dryEvery is how often a dry key (one at its rule) is refilled at now, in nanoseconds:
// at the refiller's looks; or twice in the time its key fills from empty, when that is
// shorter (a bucket of 500 a second holding 100 fills in 200ms, and what it accrues
// beyond its burst between refills would be lost); or in the time this instance was
// asked dryAsks requests of it since its last loan, when that is shorter still. Every
// 10ms at most.
func (p *Leases) dryEvery(e *entry, now int64) int64 {
	every := int64(p.cfg.refill / ticks)
	if r := e.spec.Rule; r.Limit > 0 && r.Period > 0 {
		burst := r.Burst
		if burst <= 0 {
			burst = r.Limit
		}
		every = min(every, int64(float64(burst)*float64(r.Period)/float64(r.Limit)/2))
	}
	if asked := e.demand.Load() - e.lentDemand; e.lentAt != 0 && asked > 0 && now > e.lentAt {
		every = min(every, int64(float64(now-e.lentAt)*dryAsks/float64(asked)))
	}
	return max(every, int64(10*time.Millisecond))
}

// dryAsks is how many requests of a dry key an instance is asked, at most, for each
// refill: a key asked far beyond its rule gets what it accrued sooner, at a call of the
// next store per 50 requests. A key turning hot at 20,000 requests a second over four
// instances admitted its burst and nothing of its rate in its first 300ms, when its
// refills came 250ms apart, and their events were spent over the next 250ms.
const dryAsks = 50

// accrues is what e's key accrues under its rule in a refill interval, at least one event.
func (e *entry) accrues(refill time.Duration) float64 {
	return max(1, float64(e.spec.Rule.Limit)*float64(refill)/float64(e.spec.Rule.Period))
}

// giveBack ends every lease and gives back what it holds, as Close asks.
func (p *Leases) giveBack() {
	var all []*entry
	p.leased.each(func(e *entry) { all = append(all, e) })
	for len(all) > 0 {
		n := min(len(all), maxRefill)
		p.lend(nil, all[:n])
		all = all[n:]
	}
}
