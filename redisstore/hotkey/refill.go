package hotkey

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

const (
	maxRefill = 1000                 // the most leases one refill asks for at once
	ticks     = 4                    // the refiller's looks at every lease in a refill interval
	coalesce  = 2 * time.Millisecond // how long an ask at low water waits for others
)

// refill is the refiller: it lends what decisions ask for at low water, coalesced, and
// four times a refill interval looks at every lease and at the exact path's keys. When
// Close stops it, it gives back what the leases hold.
func (p *Leases) refill() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.refill / ticks)
	defer tick.Stop()
	last := clock.UnixNano(p.cfg.clock)
	for {
		select {
		case <-p.stop:
			p.sendAll(p.charges.take(true)) // what was admitted ahead is charged before what the leases hold goes back
			p.charges.flying.Wait()
			p.giveBack()
			return
		case l := <-p.asks:
			batch := []*lease{l}
			time.Sleep(min(coalesce, time.Duration(p.rtt.Load()))) // the asks of the next moments ride along
			for len(batch) < maxRefill {
				select {
				case l := <-p.asks:
					batch = append(batch, l)
					continue
				default:
				}
				break
			}
			p.lend(batch, nil)
		case <-tick.C:
			now := clock.UnixNano(p.cfg.clock)
			p.tick(now, max(1, now-last))
			last = now
		}
	}
}

// horizon is how long a lease should last, in seconds: a round trip and a refill
// interval.
func (p *Leases) horizon() float64 {
	return (time.Duration(p.rtt.Load()) + p.cfg.refill).Seconds()
}

// tick leases the exact path's busy keys, measures every lease's demand over elapsed
// (nanoseconds), and refills, shrinks or ends each as it needs.
func (p *Leases) tick(now, elapsed int64) {
	secs, horizon := float64(elapsed)/1e9, p.horizon()
	var refills, drops, gone, could []*lease
	p.table.each(func(l *lease) {
		if l.ended.Load() { // by a refund or a reset, which revoked its record
			gone = append(gone, l)
			return
		}
		d := l.demand.Load()
		l.rate = (l.rate + float64(d-l.lastDemand)/secs) / 2
		l.lastDemand = d
		if l.rate*horizon < 0.5 {
			l.quiet++
		} else {
			l.quiet = 0
		}
		target, low := p.sizes(l)
		l.low.Store(low)
		switch tokens := l.tokens.Load(); {
		case l.quiet >= ticks:
			drops = append(drops, l)
		case l.asking.Load():
		case l.owes.Load() && tokens > 0, tokens < target/2 && now >= l.deniedUntil.Load(), tokens > 2*target, l.until.Load()-now < int64(p.cfg.ttl)/2,
			now-l.lentAt >= int64(p.cfg.refill): // a debt, a revoke or a new rule reaches the lease within a refill interval
			l.asking.Store(true)
			refills = append(refills, l)
		case tokens < target*3/4 && now >= l.deniedUntil.Load(), now-l.lentAt >= int64(p.cfg.refill)/2:
			could = append(could, l)
		}
	})
	if len(refills)+len(drops) > 0 { // a call goes out: the leases that would need one soon ride along
		for _, l := range could {
			if l.asking.CompareAndSwap(false, true) {
				refills = append(refills, l)
			}
		}
	}
	p.table.remove(gone...)
	for _, k := range p.watch.busy(now, secs, p.hotHorizon, p.cfg.maxKeys-p.table.size()) {
		l := &lease{spec: k.spec, key: k.key, id: leaseIDs.Add(1), rate: k.rate}
		_, low := p.sizes(l)
		l.low.Store(low)
		l.asking.Store(true)
		if p.table.add(l) { // unless a decision leased it just before
			refills = append(refills, l)
		}
	}
	p.lend(refills, drops)
}

// sizes are how many events l should hold after a refill, and below how many it asks for
// the next at once: its demand over a horizon, and over two round trips and the wait of
// a coalesced ask.
func (p *Leases) sizes(l *lease) (target, low int64) {
	low = int64(math.Ceil(l.rate*(2*time.Duration(p.rtt.Load())+coalesce).Seconds())) + 1
	return int64(math.Ceil(l.rate*p.horizon())) + low, low
}

// lend asks the next store for what refills need, and gives back what drops hold
// (ending them), in one call.
func (p *Leases) lend(refills, drops []*lease) {
	if len(refills)+len(drops) == 0 {
		return
	}
	share := int64(1)
	if p.cfg.instances != nil {
		share = int64(max(1, p.cfg.instances()))
	}
	loans := make([]ratelimit.Loan, 0, len(refills)+len(drops))
	gives := make([]int64, len(refills))
	for i, l := range refills {
		target, _ := p.sizes(l)
		held := l.tokens.Load()
		switch {
		case l.owes.Load(): // all of it, to pay the key's debt
			gives[i] = l.giveOut(held)
		case held > 2*target:
			gives[i] = l.giveOut(held - target)
		}
		sh := share
		if l.dry.Load() { // the key is at its rule: its refill goes to the instances that ask, divided by the holders
			sh = 1
		}
		loans = append(loans, ratelimit.Loan{Key: l.key, Spec: l.spec, Holder: p.holder, Give: gives[i],
			Want: max(0, target-held+gives[i]), Share: sh, TTL: p.cfg.ttl})
	}
	for _, l := range drops {
		give := l.tokens.Swap(0)
		l.end()
		loans = append(loans, ratelimit.Loan{Key: l.key, Spec: l.spec, Holder: p.holder, Give: give, Share: share, TTL: p.cfg.ttl})
	}
	p.table.remove(drops...)
	sent := clock.UnixNano(p.cfg.clock)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ttl)
	got, err := p.lender.Lend(ctx, loans)
	cancel()
	p.refills.Add(1)
	if err != nil { // what the key has is not known: the exact path decides what the leases cannot
		p.failed.Add(1)
		for _, l := range refills {
			l.dry.Store(false)
			l.owes.Store(false)
		}
	} else {
		now := clock.UnixNano(p.cfg.clock)
		p.rtt.Store((p.rtt.Load()*3 + now - sent) / 4)
		for i, l := range refills {
			if !got[i].Kept && l.out > 0 {
				p.revoked.Add(1)
			}
			dry := got[i].N < loans[i].Want
			l.lent(got[i], gives[i], sent, now, dry, int64(p.cfg.refill/ticks))
			l.lentAt = now
			if p.cfg.optimistic { // what the key has beyond the leases, for the moments this lease cannot decide
				p.heard(l.spec, l.key, got[i].Outcome, now)
			}
		}
	}
	for _, l := range refills {
		l.asking.Store(false)
	}
}

// giveOut takes up to n events out of what l holds, to give back, and returns how many.
func (l *lease) giveOut(n int64) int64 {
	for {
		held := l.tokens.Load()
		give := min(n, held)
		if give <= 0 || l.tokens.CompareAndSwap(held, held-give) {
			return max(0, give)
		}
	}
}

// lent applies what the next store lent l, asked at sent and answered at now, which gave
// back give; dry says it lent less than asked, and so the lease denies what it lacks
// until the next refill, at the refiller's next look, an interval later.
func (l *lease) lent(r ratelimit.Lent, give, sent, now int64, dry bool, interval int64) {
	l.limit.Store(r.Limit())
	l.remaining.Store(r.Remaining)
	l.resetAt.Store(sent + int64(r.Reset))
	if r.Kept {
		l.tokens.Add(r.N)
		l.out += r.N - give
	} else { // the record was gone (ended, revoked): what l held went with it, and the takes of it give nothing back
		l.since.Store(now)
		l.tokens.Store(r.N)
		l.out = r.N
	}
	l.until.Store(sent + int64(r.For))
	// a key that could not lend one event before the next refill owes (a debt): what the
	// lease holds goes back to it
	l.owes.Store(dry && r.N == 0 && int64(r.Wait) > interval)
	l.dry.Store(dry)
	if dry { // the key lent what it has: spent at an even pace until the next refill
		next := sent + max(interval, int64(r.Wait))
		l.paceN.Store(0)
		l.paceFrom.Store(now)
		l.paceOver.Store(next - now)
		l.paceN.Store(l.tokens.Load())
		l.deniedUntil.Store(next)
	} else {
		l.paceN.Store(0)
		l.deniedUntil.Store(0)
	}
}

// giveBack ends every lease and gives back what it holds, as Close asks.
func (p *Leases) giveBack() {
	var all []*lease
	p.table.each(func(l *lease) { all = append(all, l) })
	for len(all) > 0 {
		n := min(len(all), maxRefill)
		p.lend(nil, all[:n])
		all = all[n:]
	}
}

// demand counts what the exact path asks of each key, for the refiller to lease the
// keys that ask enough.
type demand struct {
	mu     sync.Mutex
	keys   map[watchKey]*watched
	max    int
	tickAt int64 // the last tick (UnixNano)
}

type watchKey struct {
	spec *ratelimit.Spec
	key  string
}

type watched struct {
	asked    int64   // events since the last tick
	requests int64   // and requests
	rate     float64 // events a second, a moving average
}

func (d *demand) init(max int, now int64) {
	d.keys, d.max, d.tickAt = map[watchKey]*watched{}, max, now
}

// note counts n events asked of key under spec at now, and reports whether the key
// turned hot (then it is no longer watched), and at what rate: its rate, the moving
// average with what it asked since the last tick (over rtt at least, nanoseconds), and
// measured over span at least, times horizon (seconds) reaches one event, asked by two
// requests at least.
func (d *demand) note(spec *ratelimit.Spec, key string, n, now int64, horizon float64, rtt, span int64) (bool, float64) {
	k := watchKey{spec, key}
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.keys[k]
	if w == nil {
		if len(d.keys) >= d.max {
			return false, 0
		}
		w = &watched{}
		d.keys[k] = w
	}
	w.asked += n
	w.requests++
	since := max(now-d.tickAt, rtt, 1)
	rateOver := func(ns int64) float64 { return (w.rate + float64(w.asked)*1e9/float64(ns)) / 2 }
	if w.requests < 2 || rateOver(max(since, span))*horizon < 1 {
		return false, 0
	}
	delete(d.keys, k)
	return true, rateOver(since)
}

// forget stops watching key under spec.
func (d *demand) forget(spec *ratelimit.Spec, key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.keys, watchKey{spec, key})
}

// busy measures every key's rate over secs to now, and returns (and stops watching) up
// to room keys whose rate times their horizon (seconds) reaches one event, asked in this tick
// and the one before (a lone request is no demand); it forgets the keys that asked
// nothing.
func (d *demand) busy(now int64, secs float64, horizonOf func(*ratelimit.Spec) float64, room int) []struct {
	watchKey
	rate float64
} {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tickAt = now
	var out []struct {
		watchKey
		rate float64
	}
	for k, w := range d.keys {
		horizon := horizonOf(k.spec)
		prev := w.rate
		w.rate = (w.rate + float64(w.asked)/secs) / 2
		switch {
		case w.rate*horizon >= 1 && w.asked > 0 && prev*horizon >= 1 && len(out) < room: // asked in two ticks running
			out = append(out, struct {
				watchKey
				rate float64
			}{k, w.rate})
			delete(d.keys, k)
		case w.asked == 0 && w.rate*horizon < 0.01:
			delete(d.keys, k)
		}
		w.asked, w.requests = 0, 0
	}
	return out
}
