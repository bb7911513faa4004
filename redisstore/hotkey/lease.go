package hotkey

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
)

// lease is what this instance holds of one key, under one Spec. A decision reads and
// spends it with atomic operations alone; the refiller alone changes the rest.
type lease struct {
	spec *ratelimit.Spec
	key  string
	id   int64 // names it in the receipts of its takes (Receipt.Via), never 0

	tokens      atomic.Int64 // events in hand
	until       atomic.Int64 // they may be spent before (UnixNano)
	low         atomic.Int64 // a refill is asked for when tokens fall below
	asking      atomic.Bool  // a refill is queued or in flight
	demand      atomic.Int64 // events asked of the lease, ever: its rate, for the refiller
	deniedUntil atomic.Int64 // the key had less to lend than asked: what the lease lacks is denied until then (UnixNano)
	dry         atomic.Bool  // the last refill lent less than asked: the key is at its rule, and what the lease lacks is denied from memory
	since       atomic.Int64 // the takes it may give back were made since (UnixNano): its record last began
	remaining   atomic.Int64 // the key's Remaining at the last refill
	resetAt     atomic.Int64 // and its ResetAfter, as an instant (UnixNano)
	limit       atomic.Int64 // its Limit
	owes        atomic.Bool  // the key is in debt: the lease spends nothing, and gives back what it holds
	ended       atomic.Bool  // dropped from the table: a reset, a rule change, or no demand

	// A dry lease spends what its refill lent at an even pace until the next one (a
	// trickle of the key's refill, not a lump): of paceN events lent at paceFrom, those
	// of the part of paceOver not yet passed are held back.
	paceFrom, paceOver, paceN atomic.Int64

	// the refiller's alone
	out        int64   // what the key's record holds for this instance, at least what it holds
	rate       float64 // events a second asked of the lease, a moving average
	lastDemand int64
	quiet      int   // refills in a row that found too little demand to keep the lease
	lentAt     int64 // the last refill's answer (UnixNano)
}

// take spends n events from the lease at now, keeping keep of the key's Remaining for
// more important requests (a reserve): an admission from what it holds, a denial from
// memory while the key has nothing more to lend; ok false when neither (the exact path
// decides). Either way the events count as asked of the lease.
func (l *lease) take(p *Leases, n, keep, now int64) (o ratelimit.Outcome, ok bool) {
	if l.ended.Load() {
		return o, false
	}
	l.demand.Add(n)
	limit := ratelimit.Args{Limit: l.limit.Load()}
	du, live := l.deniedUntil.Load(), now < l.until.Load()
	if live {
		left := l.tokens.Add(-n)
		if left >= 0 && !l.owes.Load() && left >= l.heldBack(now) && (keep == 0 || l.remaining.Load()+left >= keep) {
			if left < l.low.Load() && now >= du {
				p.ask(l)
			}
			reset := time.Duration(max(l.resetAt.Load()-now, int64(time.Microsecond)))
			return limit.Outcome(true, min(limit.Limit, l.remaining.Load()+left), 0, reset), true
		}
		l.tokens.Add(n) // not enough in hand, or not yet
	}
	if now >= du {
		p.ask(l)
		if !l.dry.Load() { // the key had more (the lease ran low, or ran out of time): the exact path decides
			return o, false
		}
	}
	// denied from memory: until the pace releases n, or the next refill
	wait := max(du-now, p.rtt.Load())
	if held := l.tokens.Load(); live && held >= n && l.remaining.Load()+held-n >= keep && !l.owes.Load() {
		wait = l.paced(n, held, now)
	}
	return limit.Outcome(false, 0, time.Duration(wait), time.Duration(max(l.resetAt.Load()-now, wait))), true
}

// owe stops the lease from spending until at least until (UnixNano): its key is in debt.
func (l *lease) owe(until int64) {
	l.owes.Store(true)
	l.dry.Store(true)
	for du := l.deniedUntil.Load(); du < until && !l.deniedUntil.CompareAndSwap(du, until); du = l.deniedUntil.Load() {
	}
}

// heldBack is how many of the events a dry refill lent the pace holds back at now: those
// of the part of its interval not yet passed, less one (a lone request is not delayed).
func (l *lease) heldBack(now int64) int64 {
	n := l.paceN.Load()
	if n == 0 {
		return 0
	}
	over, passed := l.paceOver.Load(), now-l.paceFrom.Load()
	if passed >= over || over <= 0 {
		return 0
	}
	return n - 1 - int64(float64(n)*float64(passed)/float64(over))
}

// paced is how long until the pace releases n of held events, at least a microsecond.
func (l *lease) paced(n, held, now int64) int64 {
	pn, over := l.paceN.Load(), l.paceOver.Load()
	if pn <= 0 || over <= 0 {
		return int64(time.Microsecond)
	}
	// heldBack at t is pn-1-pn*(t-from)/over; it must fall to held-n
	at := l.paceFrom.Load() + int64(float64(pn-1-(held-n))*float64(over)/float64(pn))
	return max(at-now, int64(time.Microsecond))
}

// giveBack puts back n events a take with a receipt took from the lease at at, while
// the lease holds them still (it is not ended, and the take was made since its loans
// last ran out: see lent); events of a lease that ended were spent, and come back to no
// one.
func (l *lease) giveBack(n, at int64) bool {
	if l.ended.Load() || at < l.since.Load() || at >= l.until.Load() {
		return false
	}
	l.tokens.Add(n)
	return true
}

// leaseIDs numbers the leases of every Leases of the process: a receipt names its lease.
var leaseIDs atomic.Int64

// end drops the lease: what it holds is spent by no one.
func (l *lease) end() {
	l.ended.Store(true)
	l.tokens.Store(0)
	l.until.Store(0)
}

// ask queues a refill of l, unless one is queued or in flight.
func (p *Leases) ask(l *lease) {
	if l.asking.CompareAndSwap(false, true) {
		select {
		case p.asks <- l:
		default: // the queue is full: the next tick refills it
			l.asking.Store(false)
		}
	}
}

// leaseTable finds a key's lease, of an algorithm in a namespace, whatever its rule (a
// lease holds the key under one rule, its Spec's; another Spec of that rule decides on
// it too, and a request under another rule ends it: see lookup), without a lock or a
// second hash of the key: its leases in leaseShards maps of key -> the leases of that key
// (one per algorithm and namespace, most often one), a shard chosen by the key's last
// bytes; each map is replaced whole (a copy of a few entries) when a lease comes or goes,
// which happens at the refiller's pace and as keys turn hot, not at the requests'.
type leaseTable struct {
	shards [leaseShards]leaseShard
	n      atomic.Int64
}

const leaseShards = 256

type leaseShard struct {
	m  atomic.Pointer[map[string][]*lease]
	mu sync.Mutex // held to replace m
}

// shard is key's shard: a multiplicative hash of its last 8 bytes and its length, cheap
// beside the map's own hash, and enough to spread keys that differ in their ends.
func (t *leaseTable) shard(key string) *leaseShard {
	h := uint64(len(key))
	for i := max(0, len(key)-8); i < len(key); i++ {
		h = h<<8 | uint64(key[i])
	}
	return &t.shards[(h*0x9E3779B97F4A7C15)>>56]
}

// get is the lease of key of spec's algorithm and namespace, under any rule, or nil.
func (t *leaseTable) get(spec *ratelimit.Spec, key string) *lease {
	m := t.shard(key).m.Load()
	if m == nil {
		return nil
	}
	return leaseOf((*m)[key], spec)
}

// leaseOf is the lease among ls (a key's) of spec's algorithm and namespace, or nil.
func leaseOf(ls []*lease, spec *ratelimit.Spec) *lease {
	for _, l := range ls {
		if l.spec.Algorithm == spec.Algorithm && l.spec.Namespace == spec.Namespace {
			return l
		}
	}
	return nil
}

// add holds l, unless its key has a lease already; it reports whether it did.
func (t *leaseTable) add(l *lease) bool {
	if t.get(l.spec, l.key) != nil {
		return false
	}
	sh := t.shard(l.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var m map[string][]*lease
	if old := sh.m.Load(); old != nil {
		if leaseOf((*old)[l.key], l.spec) != nil {
			return false
		}
		m = maps.Clone(*old)
	} else {
		m = map[string][]*lease{}
	}
	m[l.key] = append(slices.Clip(m[l.key]), l)
	sh.m.Store(&m)
	t.n.Add(1)
	return true
}

// remove drops each of ls from the table, if it is still there.
func (t *leaseTable) remove(ls ...*lease) {
	for _, l := range ls {
		sh := t.shard(l.key)
		sh.mu.Lock()
		if old := sh.m.Load(); old != nil && slices.Contains((*old)[l.key], l) {
			m := maps.Clone(*old)
			if rest := slices.DeleteFunc(slices.Clone(m[l.key]), func(o *lease) bool { return o == l }); len(rest) > 0 {
				m[l.key] = rest
			} else {
				delete(m, l.key)
			}
			sh.m.Store(&m)
			t.n.Add(-1)
		}
		sh.mu.Unlock()
	}
}

// each calls f with every lease.
func (t *leaseTable) each(f func(*lease)) {
	for i := range t.shards {
		if m := t.shards[i].m.Load(); m != nil {
			for _, ls := range *m {
				for _, l := range ls {
					f(l)
				}
			}
		}
	}
}

// size is the leases held.
func (t *leaseTable) size() int { return int(t.n.Load()) }
