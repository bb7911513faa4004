package hotkey

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

// entry is what this instance knows and holds of one key (of one algorithm and
// namespace, under one rule): the events lent to it (its lease), what the next store
// last said of the key (its terms), and the events it admitted on trust whose charge has
// not been answered. A decision reads and spends it with atomic operations alone.
//
// The invariant an entry keeps, with every other instance's entry of the key: the events
// it admits are the events it holds on loan (taken from the key before), and at most
// Leases' trust events at a time that it has not (charged to the key at once, as debits:
// the key owes them if it had none).
type entry struct {
	spec   *core.Spec // of its rule; a request under another rule ends it (see Leases.lookup)
	key    string
	limit  int64     // the rule's Args.Limit: what its decisions say
	args   core.Args // the rule's, of one event: a rule its algorithm reads the same is the same
	id     int64     // names its lease in the receipts of its takes (Receipt.Via), never 0
	holder int64     // names its records at the next store (Loan.Holder): its own, never an earlier entry's
	// the next store's receipt of the first loan that lent of its current record (a new
	// record's, a window's): a refund of a take from its lease after the lease ended goes
	// there, as of that loan
	began atomic.Pointer[core.Receipt]

	tokens  atomic.Int64           // events held on loan: taken from the key, not yet admitted
	pending atomic.Int64           // events admitted on trust, their charge not yet answered
	demand  atomic.Int64           // events asked of it, ever: the refiller's measure of its rate
	terms   atomic.Pointer[terms]  // never nil
	low     atomic.Int64           // below this many held, a refill is asked for
	asking  atomic.Bool            // a refill is queued or in flight (see startAsk)
	flight  atomic.Pointer[flight] // while asking: the refill, for decisions to wait on
	leased  atomic.Bool            // the refiller looks after it: it holds a lease, or asked for one
	ended   atomic.Bool            // out of the table (a reset, a rule change, its lease given back): it decides nothing
	window  atomic.Int64           // the start of the span its demand is counted in (UnixNano), for leasing it
	asked   atomic.Int64           // and the events asked in it
	calls   atomic.Int64           // and the requests that asked them
	missed  atomic.Int64           // and its requests memory could not decide
	probing atomic.Bool            // a probe of the key is queued or in flight
	seed    atomic.Uint64          // the rate busy measured as it leased the key (float64 bits), for the refiller
	seen    atomic.Int64           // its latest decision (UnixNano), for the table's prune

	mu      sync.Mutex // held to publish terms, to join or open charge, and for flights
	charge  *charge    // the charge of its admissions on trust, queued and not sent; nil for none
	flights []*charge  // the charges of its admissions on trust not answered yet

	// the refiller's alone (see takeSeed)
	out        int64   // what the key's record holds for this instance, at least what it holds
	rate       float64 // events a second asked of it, a moving average
	lastDemand int64
	quiet      int   // ticks in a row with too little demand to keep the lease
	lentAt     int64 // the latest loan's answer (UnixNano)
	lentDemand int64 // and demand then
	recordEnds int64 // the latest its record at the next store may end (UnixNano), once a give-back of it went unanswered
	lost       bool  // a loan of it went unanswered: it may still land, so its last loan leaves the record to end (Loan.End)
}

// startAsk marks a refill of e queued at now, unless one is queued or in flight, and
// reports whether it did. Until endAsk, a decision the lease cannot make may wait for
// its answer (await).
func (e *entry) startAsk(now int64) bool {
	if !e.asking.CompareAndSwap(false, true) {
		return false
	}
	e.flight.Store(&flight{at: now, done: make(chan struct{})})
	return true
}

// endAsk marks e's refill answered (or dropped), and wakes the decisions waiting for it.
func (e *entry) endAsk() {
	f := e.flight.Swap(nil) // before asking is cleared: a next ask's flight is its own
	e.asking.Store(false)
	if f != nil {
		close(f.done)
	}
}

// await waits for e's refill in flight to be answered, until patience after it was
// asked for (UnixNano), and reports whether it was: false when none was in flight, ctx
// ended, or the time passed. A refill that stalls delays the decisions of its first
// moments alone.
func (e *entry) await(ctx context.Context, now int64, patience time.Duration) bool {
	f := e.flight.Load()
	if f == nil {
		return false
	}
	wait := f.at + int64(patience) - now
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(time.Duration(wait))
	defer t.Stop()
	select {
	case <-f.done:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// flight is a refill of an entry, asked for at (UnixNano): done is closed once it is
// answered.
type flight struct {
	at   int64
	done chan struct{}
}

// terms is what the next store last said of a key, as one value that decisions read at
// once and nobody changes: every answer publishes new terms.
type terms struct {
	heard     int64 // when (UnixNano); 0 for never
	remaining int64 // the key's Remaining then
	resetAt   int64 // when the key is full (UnixNano)
	denied    int64 // decisions are denials from memory until then (UnixNano): a denial, a debt, a dry lease's wait
	retryAt   int64 // and the earliest they may be admitted (UnixNano)
	until     int64 // the lease's events may be spent before (UnixNano); 0 for no lease
	since     int64 // the takes from the lease since then may be given back to it (UnixNano)
	dry       bool  // the latest loan lent less than asked: the key is at its rule
	owes      bool  // the key is in debt: the lease spends nothing, and gives back what it holds
	pace      pace  // a dry loan's events, spent evenly until the next refill
}

// pace spends the n events a dry loan lent at from evenly over the next over: those of
// the part of over not yet passed are held back, less one (a lone request is not
// delayed).
type pace struct{ from, over, n int64 }

// heldBack is how many events the pace holds back at now.
func (p pace) heldBack(now int64) int64 {
	passed := now - p.from
	if p.n == 0 || passed >= p.over || p.over <= 0 {
		return 0
	}
	return p.n - 1 - int64(float64(p.n)*float64(passed)/float64(p.over))
}

// release is how long until the pace releases n of held events, at least a microsecond.
func (p pace) release(n, held, now int64) int64 {
	if p.n <= 0 || p.over <= 0 {
		return int64(time.Microsecond)
	}
	// heldBack at t is n-1-n*(t-from)/over; it must fall to held-n
	at := p.from + int64(float64(p.n-1-(held-n))*float64(p.over)/float64(p.n))
	return max(at-now, int64(time.Microsecond))
}

// publish replaces e's terms by what change makes of a copy of them; e.mu is held by none.
func (e *entry) publish(change func(t *terms)) {
	e.mu.Lock()
	t := *e.terms.Load()
	change(&t)
	e.terms.Store(&t)
	e.mu.Unlock()
}

// fresh reports whether t was heard within d of now: a key may have changed by much since.
func (t *terms) fresh(now int64, d time.Duration) bool {
	return t.heard != 0 && now-t.heard <= int64(d)
}

// resetIn is the time until t's key is full, at least a microsecond.
func (t *terms) resetIn(now int64) time.Duration {
	return time.Duration(max(t.resetAt-now, int64(time.Microsecond)))
}

// fromLease decides n events (keeping keep of the key's Remaining for more important
// requests) from what e holds on loan: ok true with an admission, false when the lease
// cannot (none, ran out, or must wait: the caller decides otherwise).
func (e *entry) fromLease(p *Leases, t *terms, n, keep, now int64) (o core.Outcome, ok bool) {
	if now >= t.until || t.owes {
		return o, false
	}
	left := e.tokens.Add(-n)
	if left < 0 || left < t.pace.heldBack(now) || keep > 0 && t.remaining+left < keep {
		e.tokens.Add(n)
		return o, false
	}
	if left < e.low.Load() && now >= t.denied {
		p.ask(e, now)
	}
	return core.Args{Limit: e.limit}.Outcome(true, min(e.limit, t.remaining+left), 0, t.resetIn(now)), true
}

// denial is the denial from memory of n events by a key e knows has none for them now
// (a denial, a debt, a dry lease waiting for its pace or its next refill); ok false when
// it knows no such thing.
func (e *entry) denial(p *Leases, t *terms, n, keep, now int64) (o core.Outcome, ok bool) {
	if now >= t.denied && !(t.dry && now < t.until) {
		return o, false
	}
	wait := max(t.retryAt-now, p.rtt.Load())
	if held := e.tokens.Load(); t.dry && now < t.until && held >= n && t.remaining+held-n >= keep && !t.owes {
		wait = t.pace.release(n, held, now) // the pace holds them back
	}
	return core.Args{Limit: e.limit}.Outcome(false, 0, time.Duration(wait), time.Duration(max(t.resetAt-now, wait))), true
}

// give puts back n events a take with a receipt took from e's lease at at (UnixNano),
// while the lease holds them still (it is not ended, and the take was made since its
// loans last ran out); events of a lease that ended were spent, and come back to no one.
func (e *entry) give(n, at int64) bool {
	e.mu.Lock() // not while end takes what e holds: the events would be lost
	defer e.mu.Unlock()
	t := e.terms.Load()
	if e.ended.Load() || at < t.since || at >= t.until {
		return false
	}
	e.tokens.Add(n)
	return true
}

// giveOut takes up to n events out of what e holds, to give back or to pay a debit,
// and returns how many.
func (e *entry) giveOut(n int64) int64 {
	for {
		held := e.tokens.Load()
		give := min(n, held)
		if give <= 0 || e.tokens.CompareAndSwap(held, held-give) {
			return max(0, give)
		}
	}
}

// end takes e out of use, and returns what it held: spent by no one, unless the caller
// gives it back.
func (e *entry) end() int64 {
	e.mu.Lock()
	e.ended.Store(true)
	held := e.tokens.Swap(0)
	e.mu.Unlock()
	e.publish(func(t *terms) { t.until = 0 })
	return held
}

// entryIDs numbers the entries of every Leases of the process: a receipt names its lease.
var entryIDs atomic.Int64

// leaseTable finds a leased key's entry, of an algorithm in a namespace, whatever its
// rule (an entry holds the key under one rule, its Spec's; another Spec of that rule
// decides on it too, and a request under another rule ends it: see Leases.lookup),
// without a lock or a second hash of the key: its entries in entryShards maps of key ->
// the entries of that key (one per algorithm and namespace, most often one), a shard
// chosen by the key's last bytes; each map is replaced whole (a copy) when an entry
// comes or goes, which happens at the pace keys turn busy and quiet, not at the
// requests'.
type leaseTable struct {
	shards [entryShards]entryShard
	n      atomic.Int64
}

const entryShards = 256

type entryShard struct {
	m  atomic.Pointer[map[string][]*entry]
	mu sync.Mutex // held to replace m
}

// shard is key's shard: a multiplicative hash of its last 8 bytes and its length, cheap
// beside the map's own hash, and enough to spread keys that differ in their ends.
func (t *leaseTable) shard(key string) *entryShard {
	h := uint64(len(key))
	for i := max(0, len(key)-8); i < len(key); i++ {
		h = h<<8 | uint64(key[i])
	}
	return &t.shards[(h*0x9E3779B97F4A7C15)>>56]
}

// get is the entry of key of spec's algorithm and namespace, under any rule, or nil.
func (t *leaseTable) get(spec *core.Spec, key string) *entry {
	m := t.shard(key).m.Load()
	if m == nil {
		return nil
	}
	return entryOf((*m)[key], spec)
}

// entryOf is the entry among es (a key's) of spec's algorithm and namespace, or nil.
func entryOf(es []*entry, spec *core.Spec) *entry {
	for _, e := range es {
		if e.spec.Algorithm == spec.Algorithm && e.spec.Namespace == spec.Namespace {
			return e
		}
	}
	return nil
}

// add holds e, unless its key has an entry already, which it returns instead.
func (t *leaseTable) add(e *entry) *entry {
	sh := t.shard(e.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var m map[string][]*entry
	if old := sh.m.Load(); old != nil {
		if had := entryOf((*old)[e.key], e.spec); had != nil {
			return had
		}
		m = maps.Clone(*old)
	} else {
		m = map[string][]*entry{}
	}
	m[e.key] = append(slices.Clip(m[e.key]), e)
	sh.m.Store(&m)
	t.n.Add(1)
	return e
}

// remove drops each of es from the table, if it is still there.
func (t *leaseTable) remove(es ...*entry) {
	for _, e := range es {
		sh := t.shard(e.key)
		sh.mu.Lock()
		if old := sh.m.Load(); old != nil && slices.Contains((*old)[e.key], e) {
			m := maps.Clone(*old)
			if rest := slices.DeleteFunc(slices.Clone(m[e.key]), func(o *entry) bool { return o == e }); len(rest) > 0 {
				m[e.key] = rest
			} else {
				delete(m, e.key)
			}
			sh.m.Store(&m)
			t.n.Add(-1)
		}
		sh.mu.Unlock()
	}
}

// each calls f with every entry.
func (t *leaseTable) each(f func(*entry)) {
	for i := range t.shards {
		if m := t.shards[i].m.Load(); m != nil {
			for _, es := range *m {
				for _, e := range es {
					f(e)
				}
			}
		}
	}
}

// size is the entries held.
func (t *leaseTable) size() int { return int(t.n.Load()) }

// entryMap holds every entry, leased or not, by algorithm, namespace and key, in shards
// under a lock each, at most max of them: past it, the entries worth nothing (neither
// leased nor waiting for a charge, and not asked for a refill interval) go, and if none,
// the oldest half of those not leased.
type entryMap struct {
	shards [mapShards]entryMapShard
	max    int // per shard
}

const mapShards = 64

type entryMapShard struct {
	mu sync.Mutex
	m  map[algKey]*entry
}

func (m *entryMap) init(max int) {
	m.max = max/mapShards + 1
	for i := range m.shards {
		m.shards[i].m = map[algKey]*entry{}
	}
}

func (m *entryMap) shard(k algKey) *entryMapShard {
	h := uint64(len(k.key))
	for i := max(0, len(k.key)-8); i < len(k.key); i++ {
		h = h<<8 | uint64(k.key[i])
	}
	return &m.shards[(h*0x9E3779B97F4A7C15)>>58]
}

// get is k's entry, or nil.
func (m *entryMap) get(k algKey) *entry {
	sh := m.shard(k)
	sh.mu.Lock()
	e := sh.m[k]
	sh.mu.Unlock()
	return e
}

// getOrAdd is k's entry, or the one make makes, added; nil when the shard is full of
// entries still of use (the caller takes the exact path).
func (m *entryMap) getOrAdd(k algKey, now, idle int64, make func() *entry) *entry {
	sh := m.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[k]; e != nil {
		return e
	}
	if len(sh.m) >= m.max && !sh.prune(now, idle, m.max) {
		return nil
	}
	e := make()
	sh.m[k] = e
	return e
}

// prune drops the entries worth nothing at now (not leased, no charge waiting, not asked
// for idle nanoseconds), or if none, half of those not leased and with no charge
// waiting; it reports whether there is room after. sh.mu is held.
func (sh *entryMapShard) prune(now, idle int64, max int) bool {
	for k, e := range sh.m {
		if e.idle(now, idle) {
			delete(sh.m, k)
			e.ended.Store(true)
		}
	}
	for k, e := range sh.m {
		if len(sh.m) < max/2+1 {
			break
		}
		if !e.leased.Load() && e.pending.Load() == 0 {
			delete(sh.m, k)
			e.ended.Store(true)
		}
	}
	return len(sh.m) < max
}

// remove drops e, if it is still there.
func (m *entryMap) remove(e *entry) {
	k := algKey{e.spec.Algorithm, e.spec.Namespace, e.key}
	sh := m.shard(k)
	sh.mu.Lock()
	if sh.m[k] == e {
		delete(sh.m, k)
	}
	sh.mu.Unlock()
}

// idle reports whether e is worth nothing at now: neither leased nor waiting for a
// charge, and not asked for idle nanoseconds.
func (e *entry) idle(now, idle int64) bool {
	return !e.leased.Load() && e.pending.Load() == 0 && now-e.seen.Load() > idle
}

// takeSeed starts the refiller's measure of e's rate from what busy measured as it
// leased e, if it has not yet.
func (e *entry) takeSeed() {
	if s := e.seed.Swap(0); s != 0 {
		e.rate = max(e.rate, math.Float64frombits(s))
	}
}
