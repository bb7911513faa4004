package hotkey

import (
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
	since       atomic.Int64 // the takes it may give back were made since (UnixNano): its record last began
	remaining   atomic.Int64 // the key's Remaining at the last refill
	resetAt     atomic.Int64 // and its ResetAfter, as an instant (UnixNano)
	limit       atomic.Int64 // its Limit
	ended       atomic.Bool  // dropped from the table: a refund or reset, or no demand

	// the refiller's alone
	out        int64   // what the key's record holds for this instance, at least what it holds
	rate       float64 // events a second asked of the lease, a moving average
	lastDemand int64
	quiet      int // refills in a row that found too little demand to keep the lease
}

// take spends n events from the lease at now: an admission from what it holds, a denial
// from memory while the key has nothing to lend; ok false when neither (the exact path
// decides). Either way the events count as asked of the lease.
func (l *lease) take(p *Leases, n, now int64) (o ratelimit.Outcome, ok bool) {
	if l.ended.Load() {
		return o, false
	}
	l.demand.Add(n)
	limit := ratelimit.Args{Limit: l.limit.Load()}
	du := l.deniedUntil.Load()
	if now < l.until.Load() {
		if left := l.tokens.Add(-n); left >= 0 {
			if left < l.low.Load() && now >= du {
				p.ask(l)
			}
			reset := time.Duration(max(l.resetAt.Load()-now, int64(time.Microsecond)))
			return limit.Outcome(true, min(limit.Limit, l.remaining.Load()+left), 0, reset), true
		}
		l.tokens.Add(n) // not enough in hand
	}
	if now < du { // the key lent less than asked: the next refill is at the next tick
		return limit.Outcome(false, 0, time.Duration(du-now), time.Duration(max(l.resetAt.Load(), du)-now)), true
	}
	p.ask(l)
	return o, false
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

// leaseTable finds a key's lease by its request's Spec and its key, without a lock: two
// maps, each replaced whole when it changes (leases come and go at the refiller's pace,
// not the requests').
type leaseTable struct {
	specs atomic.Pointer[map[*ratelimit.Spec]*specLeases]
	mu    sync.Mutex // held to change either map
	n     int        // leases held; under mu
}

type specLeases struct {
	keys atomic.Pointer[map[string]*lease]
}

// get is the lease of key under spec, or nil.
func (t *leaseTable) get(spec *ratelimit.Spec, key string) *lease {
	specs := t.specs.Load()
	if specs == nil {
		return nil
	}
	sl := (*specs)[spec]
	if sl == nil {
		return nil
	}
	return (*sl.keys.Load())[key]
}

// add holds ls, in one copy of each map they go into; under the refiller.
func (t *leaseTable) add(ls []*lease) {
	if len(ls) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	specs := map[*ratelimit.Spec]*specLeases{}
	if old := t.specs.Load(); old != nil {
		specs = *old
	}
	bySpec := map[*ratelimit.Spec][]*lease{}
	for _, l := range ls {
		bySpec[l.spec] = append(bySpec[l.spec], l)
	}
	next := specs
	for spec, add := range bySpec {
		sl := specs[spec]
		if sl == nil {
			if len(next) == len(specs) { // the first new Spec: copy the map once
				next = make(map[*ratelimit.Spec]*specLeases, len(specs)+len(bySpec))
				for k, v := range specs {
					next[k] = v
				}
			}
			sl = &specLeases{}
			empty := map[string]*lease{}
			sl.keys.Store(&empty)
			next[spec] = sl
		}
		old := *sl.keys.Load()
		keys := make(map[string]*lease, len(old)+len(add))
		for k, v := range old {
			keys[k] = v
		}
		for _, l := range add {
			if keys[l.key] == nil {
				t.n++
			}
			keys[l.key] = l
		}
		sl.keys.Store(&keys)
	}
	t.specs.Store(&next)
}

// remove drops the leases of drop from the table, in one copy of each map they are in.
func (t *leaseTable) remove(drop []*lease) {
	if len(drop) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	bySpec := map[*ratelimit.Spec][]*lease{}
	for _, l := range drop {
		bySpec[l.spec] = append(bySpec[l.spec], l)
	}
	specs := *t.specs.Load()
	for spec, ls := range bySpec {
		sl := specs[spec]
		old := *sl.keys.Load()
		keys := make(map[string]*lease, len(old))
		for k, v := range old {
			keys[k] = v
		}
		for _, l := range ls {
			if keys[l.key] == l {
				delete(keys, l.key)
				t.n--
			}
		}
		sl.keys.Store(&keys)
	}
}

// all is every lease of key under a Spec of spec's algorithm and namespace (a refund's
// or a reset's Spec is not the takes').
func (t *leaseTable) all(spec *ratelimit.Spec, key string) []*lease {
	specs := t.specs.Load()
	if specs == nil {
		return nil
	}
	var ls []*lease
	for s, sl := range *specs {
		if s.Algorithm == spec.Algorithm && s.Namespace == spec.Namespace {
			if l := (*sl.keys.Load())[key]; l != nil {
				ls = append(ls, l)
			}
		}
	}
	return ls
}

// each calls f with every lease.
func (t *leaseTable) each(f func(*lease)) {
	specs := t.specs.Load()
	if specs == nil {
		return
	}
	for _, sl := range *specs {
		for _, l := range *sl.keys.Load() {
			f(l)
		}
	}
}

// size is the leases held.
func (t *leaseTable) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}
