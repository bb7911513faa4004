// Package localstore is the in-memory ratelimit.Store: the state of every key in one
// process, for limits that need not be shared across instances, for tests, and as the
// fallback when Redis is down.
//
// Keys live in shards, and each key's state behind its own mutex: a decision on an
// existing key finds it without its shard's lock (the shard's table is read with atomic
// loads) and holds only the key's lock, so that cores deciding on different keys write
// no line in common, and it allocates nothing. Adding, removing and sweeping keys take
// the shard's lock. A key is hashed once: the hash chooses its shard and finds it in the
// shard's own open-addressing table. Memory is bounded twice over:
//
//   - Idle keys expire. A key whose state is back to its full allowance (its last
//     Decision's ResetAfter has passed) is worth nothing, and each shard drops such keys
//     in a sweep at most once per sweep interval (WithSweepInterval), run by whichever
//     decision finds the interval passed. No goroutine runs in the background.
//   - The number of keys is capped (WithMaxKeys), and so is their memory in bytes
//     (WithMaxBytes), long keys counting for more. A new key that finds its shard full
//     evicts the key closest to full among a few sampled, expired keys first. An evicted
//     key starts over with its full allowance, so under an attack that rotates keys the
//     cap costs accuracy for the evicted keys, never memory.
//
// A key of 16 bytes costs 128 bytes in all (its string, its entry, its slot):
// TestMemoryBound drives a million of them through a store capped at 100,000 and
// measures the heap they retain. WithMaxBytes counts each key as keyCost (128) plus its
// length, more than it takes.
//
// Time comes from a clock.Clock (WithClock; by default clock.NewMonotonic(), the wall
// clock at New plus the monotonic time since, which never steps back). A key asked at an
// instant before the latest it has seen, by less than its period, is decided at that
// latest instant; by more (a clock set back), its state moves back by whole periods to
// within one (see the package doc of ratelimit, "Time"). The durations of its Decision count from
// the caller's clock, exactly as redisstore does.
package localstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/fast"
)

// Defaults of the options.
const (
	DefaultMaxKeys       = 1 << 20
	DefaultMaxBytes      = 1 << 30
	DefaultSweepInterval = 10 * time.Second
)

const (
	maxShards    = 256
	evictSamples = 8
	// keyCost is what a key costs besides its string, as WithMaxBytes counts it: its
	// entry, its map slot and the string's header (TestMemoryBound measures the total)
	keyCost = 128
	// minShardBytes is the least byte budget of a shard: fewer shards, for a small
	// WithMaxBytes, rather than shards too small for a long key
	minShardBytes = 64 << 10
)

// Store is an in-memory ratelimit.Store. It is safe for concurrent use; the zero value is
// not usable, call New.
type Store struct {
	clock clock.Clock
	// the clock when it is a Monotonic (the sum of Monotonic.UnixNano) or a Coarse, read
	// without its interface
	isMono    bool
	monoStart time.Time
	monoNano  int64
	coarse    *clock.Coarse

	seed       maphash.Seed
	shards     []shard
	mask       uint64
	perShard   int   // the most keys one shard holds
	maxBytes   int64 // the most bytes of keys one shard holds (all shards, until New divides)
	sweepEvery int64 // microseconds

	// every (algorithm, namespace) the store has seen, numbered from 0 in order: the
	// first fewSpaces in a list that a decision scans, the others in a map
	spaces     atomic.Pointer[[]*space]
	moreSpaces sync.Map // spaceKey -> *space
	spacesMu   sync.Mutex
	nSpaces    int // under spacesMu
}

// fewSpaces is how many spaces (most stores have one or two) are found by a scan and keep
// their tables in each shard's slice, at their ordinal; the store keeps any more in maps,
// so that a store of a great many namespaces neither scans them nor gives every shard a
// slot for each.
const fewSpaces = 16

// takeFunc is a space's take: a take of n on key under rule, without a lease.
type takeFunc = func(ctx context.Context, key string, rule ratelimit.Rule, n int64) (o fast.Outcome, limit int64, err error)

type spaceKey struct {
	alg *ratelimit.Algorithm
	ns  string
}

// space is one (algorithm, namespace): its keys are apart from every other space's.
type space struct {
	alg  *ratelimit.Algorithm
	ns   string
	ord  int
	step core.Step // alg's Step, as an Outcome
	take takeFunc  // its takes without a lease (Store.newTake)
}

var _ ratelimit.Store = (*Store)(nil)

// shard is one lock's worth of keys, padded to a multiple of two cache lines so that
// cores working on different shards never share a line. A decision on an existing key
// only reads it (tables, nextSweep); its lock is taken to add, remove or sweep keys.
type shard struct {
	shardState
	_ [128 - unsafe.Sizeof(shardState{})%128]byte
}

type shardState struct {
	mu        sync.Mutex
	tables    [fewSpaces]atomic.Pointer[table] // by space ordinal; nil for one this shard has not seen
	more      map[*space]*table                // of the others
	size      int                              // keys in all tables
	bytes     int64                            // their cost, as WithMaxBytes counts it
	nextSweep atomic.Int64                     // written under mu
	// a copy of a key's state and log for a peek, so that a peek allocates nothing
	scratch    ratelimit.State
	scratchLog eventlog.Log
}

type table struct {
	alg  *ratelimit.Algorithm
	keys index
	// a rule decided in this table and its Args, set under the shard's lock: preparing a
	// rule costs a few divisions, a good part of a decision, and most tables see one
	// rule again and again
	last atomic.Pointer[prepared]
}

type prepared struct {
	rule ratelimit.Rule
	args ratelimit.Args
}

// entry is one key: its state and expiry behind its own lock, taken after the shard's
// when a goroutine holds both. Its fields fill one cache line.
type entry struct {
	mu      sync.Mutex
	state   ratelimit.State
	expires int64  // the instant the state is back to full, and forgotten; dead once removed
	key     string // set before the entry is in the index, never changed
}

// dead is the expires of an entry removed from its index, which a decision that found it
// without the shard's lock must not use.
const dead = math.MinInt64

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithClock sets the clock decisions are made by; clock.NewMonotonic() by default. Nil
// means the default.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) {
		if c != nil {
			s.clock = c
		}
	})
}

// WithMaxKeys caps the number of keys the store holds (DefaultMaxKeys by default; less
// than 1 means the default). One key is one (algorithm, key) pair.
func WithMaxKeys(n int) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.perShard = n // divided among the shards by New
		}
	})
}

// WithMaxBytes caps the memory the keys take, in bytes (DefaultMaxBytes by default; less
// than 1 means the default): each key counts its length plus 128 bytes (its entry, its
// slot in the map, its string's header), which is more than it takes (see the package
// doc). Past it, a new key evicts others as WithMaxKeys does, so long keys
// cost memory only up to the cap, however many come. The cap is divided among the
// shards (at least 64 KiB each); a key longer than its shard's part is still held, alone,
// so the bound is n plus one such key per shard.
func WithMaxBytes(n int64) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.maxBytes = n
		}
	})
}

// WithSweepInterval sets how often each shard drops keys that are back to full
// (DefaultSweepInterval by default; 0 or less means the default). A sweep visits every
// key of one shard, inside that shard's lock.
func WithSweepInterval(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.sweepEvery = max(1, d.Microseconds())
		}
	})
}

// New returns an empty Store. It panics for a nil option, with a message that says so.
func New(opts ...Option) *Store {
	s := &Store{
		clock:      clock.NewMonotonic(),
		seed:       maphash.MakeSeed(),
		perShard:   DefaultMaxKeys,
		maxBytes:   DefaultMaxBytes,
		sweepEvery: DefaultSweepInterval.Microseconds(),
	}
	for _, o := range opts {
		if o == nil {
			panic("localstore: New with a nil option")
		}
		o.apply(s)
	}
	switch c := s.clock.(type) {
	case clock.Monotonic:
		s.isMono, s.monoStart, s.monoNano = true, c.Start(), c.Start().UnixNano()
	case *clock.Coarse:
		s.coarse = c
	}
	maxKeys := s.perShard
	n := 1 << min(bits.Len(uint(maxKeys))-1, bits.Len(maxShards)-1) // a power of two, at most maxKeys
	for n > 1 && s.maxBytes/int64(n) < minShardBytes {              // and shards of at least 64 KiB
		n /= 2
	}
	s.shards = make([]shard, n)
	s.mask = uint64(n - 1)
	s.perShard = maxKeys / n
	s.maxBytes = max(1, s.maxBytes/int64(n))
	return s
}

// Apply decides req against the key's state in memory: it takes, peeks, refunds or
// resets (req.Op). It returns ctx.Err() if ctx has ended, and the error of
// req.Algorithm.Prepare for an invalid rule or n.
func (s *Store) Apply(ctx context.Context, req ratelimit.Request) (ratelimit.Decision, error) {
	sp := findSpace(s.spaces.Load(), req.Algorithm, req.Namespace)
	// a take of nothing but a rule and n: no lease, no reserve, no calendar window
	plain := req.Op == "" && req.Lease == 0 && req.Reserve == 0 && req.Algorithm != nil && req.Algorithm.Window == nil
	if sp != nil && plain { // the common case, in one call
		o, limit, err := sp.take(ctx, req.Key, req.Rule, req.N)
		return core.Decision(o, limit), err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	alg := req.Algorithm
	if err := checkAlgorithm(alg); err != nil {
		return ratelimit.Decision{}, err
	}
	if sp == nil { // not among the few, or not yet made
		sp = s.space(alg, req.Namespace)
	}
	if plain {
		o, limit, err := sp.take(ctx, req.Key, req.Rule, req.N)
		return core.Decision(o, limit), err
	}
	now := s.now()
	h := maphash.String(s.seed, req.Key)
	sh := &s.shards[h&s.mask]

	sh.mu.Lock()
	defer sh.mu.Unlock() // deferred, as the key's below: a third party's Step may panic
	t := sh.table(sp)
	args, err := t.argsFor(req.Rule, req.N)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	args.N = req.N
	if err := core.Extras("localstore", req, &args); err != nil {
		return ratelimit.Decision{}, err
	}
	sh.sweepIfDue(now, s.sweepEvery)
	e := t.keys.get(h, req.Key)
	if e == nil && req.Op == "" { // a take with a lease, a reserve or a window; the others take in sp.take
		e = s.add(sh, &t.keys, h, req.Key, now, &entry{})
	}
	if e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.expires <= now {
			e.reset()
		}
	}
	switch req.Op {
	case "":
		o := sp.step(&e.state, now, args)
		e.expires = now + expiry(o.ResetAfter)
		return core.Decision(o, args.Limit), nil
	case "refund":
		if e != nil {
			alg.Refund(&e.state, now, args) // the key is full no later than before: expires stays
		}
	case "reset":
		if e != nil {
			e.expires = dead
			t.keys.del(h, req.Key)
			sh.size--
			sh.bytes -= cost(req.Key)
			e = nil
		}
	case "extend":
		if alg.Extend == nil {
			return ratelimit.Decision{}, fmt.Errorf("localstore: %s has no leases to extend", alg.Name)
		}
		held := e != nil && alg.Extend(&e.state, now, args)
		d := sh.peek(sp, e, now, args, true)
		d.Allowed = held
		if held {
			e.expires = max(e.expires, now+expiry(d.ResetAfter))
		}
		return d, nil
	case "peek":
		return sh.peek(sp, e, now, args, false), nil
	default:
		return ratelimit.Decision{}, fmt.Errorf("localstore: unknown op %q", req.Op)
	}
	return sh.peek(sp, e, now, args, true), nil
}

// reset empties a state back to full: what is left counts for nothing, whatever the rule
// now.
func (e *entry) reset() {
	e.state = ratelimit.State{Log: e.state.Log}
	if e.state.Log != nil {
		e.state.Log.Clear()
	}
}

// Bind is for the limiters of this module, which call it when they are made: it returns
// the takes of alg in namespace, with the (algorithm, namespace) found once, giving an
// Outcome and the rule's limit rather than a Decision. (Its type names an internal
// package: it is not for other callers, whom Apply serves.)
func (s *Store) Bind(alg *ratelimit.Algorithm, namespace string) func(ctx context.Context, key string, rule ratelimit.Rule, n int64) (fast.Outcome, int64, error) {
	if err := checkAlgorithm(alg); err != nil {
		return func(context.Context, string, ratelimit.Rule, int64) (fast.Outcome, int64, error) {
			return fast.Outcome{}, 0, err
		}
	}
	return s.space(alg, namespace).take
}

// checkAlgorithm is the error for an algorithm this store cannot run, or nil: a space is
// made only for one it can.
func checkAlgorithm(alg *ratelimit.Algorithm) error {
	if alg == nil {
		return errors.New("localstore: request has no algorithm")
	}
	if alg.Prepare == nil || alg.Step == nil || alg.Refund == nil {
		return fmt.Errorf("localstore: algorithm %q has no Prepare, Step or Refund", alg.Name)
	}
	return nil
}

// newTake returns the takes of sp: Apply's path for a take, and a bound limiter's. A
// take of an existing key finds it without the shard's lock and decides holding only the
// key's; a new key or a sweep due takes the shard's lock. The step gets the caller's now,
// and the key's own latest instant in its state: a clock that stepped back is held per
// key, and durations count from the caller's clock.
// (Not inlined: a copy of the closure inlined into addSpace is compiled with less inlined
// into it.)
//
//go:noinline
func (s *Store) newTake(sp *space) takeFunc {
	return func(ctx context.Context, key string, rule ratelimit.Rule, n int64) (fast.Outcome, int64, error) {
		if err := ctx.Err(); err != nil {
			return fast.Outcome{}, 0, err
		}
		var now int64 // s.now(), without its call
		if s.isMono {
			now = (s.monoNano + int64(time.Since(s.monoStart))) / 1000
		} else if s.coarse != nil {
			now = s.coarse.UnixNano() / 1000
		} else {
			now = s.now()
		}
		h := maphash.String(s.seed, key) // chooses the shard, and finds the key in it
		sh := &s.shards[h&s.mask]
		if sp.ord < fewSpaces {
			if t := sh.tables[sp.ord].Load(); t != nil {
				if next := sh.nextSweep.Load(); now < next && now >= next-2*s.sweepEvery {
					var e *entry // t.keys.get(h, key), written out: too large to be inlined
					if ps := t.keys.slots.Load(); ps != nil {
						slots, hu := *ps, h|used
						mask := uint64(len(slots) - 1)
						for i, m := (hu>>32)&mask, len(slots); m > 0; i, m = (i+1)&mask, m-1 {
							if got := slots[i].hash.Load(); got == hu {
								if c := slots[i].e.Load(); c.key == key {
									e = c
									break
								}
							} else if got == 0 {
								break
							}
						}
					}
					if e != nil {
						p := t.last.Load()
						args := p.args
						if rule != p.rule || n < 1 || n > args.Limit {
							// another rule than the table's last: prepared here, not
							// remembered, as the keys of one table may each have their own
							var err error
							if args, err = sp.alg.Prepare(rule, n); err != nil {
								return fast.Outcome{}, 0, err
							}
						}
						args.N = n
						e.mu.Lock()
						if e.expires != dead { // not removed since the lookup found it
							defer e.mu.Unlock() // a third party's Step may panic
							if e.expires <= now {
								e.reset()
							}
							o := sp.step(&e.state, now, args)
							e.expires = now + expiry(o.ResetAfter)
							return o, args.Limit, nil
						}
						e.mu.Unlock() // removed meanwhile: look again under the shard's lock
					}
				}
			}
		}
		sh.mu.Lock()
		defer sh.mu.Unlock() // deferred: a third party's Step that panics must not leave the shard locked
		t := sh.table(sp)
		args, err := t.argsFor(rule, n)
		if err != nil {
			return fast.Outcome{}, 0, err
		}
		args.N = n
		sh.sweepIfDue(now, s.sweepEvery)
		e := t.keys.get(h, key)
		if e == nil {
			e = s.add(sh, &t.keys, h, key, now, &entry{})
		}
		e.mu.Lock()
		defer e.mu.Unlock() // an entry in the index under its shard's lock is not dead
		if e.expires <= now {
			e.reset()
		}
		o := sp.step(&e.state, now, args)
		e.expires = now + expiry(o.ResetAfter)
		return o, args.Limit, nil
	}
}

// peek is the Decision of a take of args on e's state (a fresh state when e is nil),
// changing nothing, on the shard's scratch copy; sh.mu is held. After a refund, a reset
// or an extension (after) it is the answer, as a peek of 1, of a new lease.
func (sh *shard) peek(sp *space, e *entry, now int64, args ratelimit.Args, after bool) ratelimit.Decision {
	if after {
		args.N, args.Lease, args.Reserve = 1, 0, 0
	}
	st := &sh.scratch
	*st = ratelimit.State{}
	if e != nil {
		*st = e.state
	}
	if st.Log != nil {
		sh.scratchLog.CopyFrom(st.Log)
	} else {
		sh.scratchLog.Clear() // for an algorithm that keeps a log, a fresh one
	}
	st.Log = &sh.scratchLog
	return core.Decision(sp.step(st, now, args), args.Limit)
}

// add holds e, new, for a new key in keys, a table of sh, evicting others while the
// shard is full in keys or in bytes; sh.mu is held.
func (s *Store) add(sh *shard, keys *index, h uint64, key string, now int64, e *entry) *entry {
	c := cost(key)
	for sh.size > 0 && (sh.size >= s.perShard || sh.bytes+c > s.maxBytes) {
		if !sh.evict(h, now) {
			break // every key sampled is in use this instant: one over the cap, for now
		}
	}
	keys.put(h, key, e)
	sh.size++
	sh.bytes += c
	return e
}

// cost is what a key counts against WithMaxBytes.
func cost(key string) int64 { return int64(len(key)) + keyCost }

// expiry is how long a state lasts after a decision: until it is back to full, rounded up
// to a whole millisecond, as a Redis TTL is, so that both stores forget a key at the
// same instant (which matters when its rule changes).
func expiry(reset time.Duration) int64 {
	return (reset.Microseconds() + 999) / 1000 * 1000
}

// now reads the clock in microseconds (the default clock without its interface or a
// time.Time).
func (s *Store) now() int64 {
	if s.isMono {
		return (s.monoNano + int64(time.Since(s.monoStart))) / 1000
	}
	return clock.UnixNano(s.clock) / 1000
}

// Len is the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.size
		sh.mu.Unlock()
	}
	return n
}

// space is the space of (alg, ns), added the first time it is asked for.
func (s *Store) space(alg *ratelimit.Algorithm, ns string) *space {
	if sp := findSpace(s.spaces.Load(), alg, ns); sp != nil {
		return sp
	}
	return s.addSpace(alg, ns)
}

func (s *Store) addSpace(alg *ratelimit.Algorithm, ns string) *space {
	key := spaceKey{alg, ns}
	if sp, ok := s.moreSpaces.Load(key); ok {
		return sp.(*space)
	}
	s.spacesMu.Lock()
	defer s.spacesMu.Unlock()
	old := s.spaces.Load()
	if sp := findSpace(old, alg, ns); sp != nil {
		return sp
	}
	if sp, ok := s.moreSpaces.Load(key); ok {
		return sp.(*space)
	}
	sp := &space{alg: alg, ns: ns, ord: s.nSpaces, step: core.StepOf(alg)}
	sp.take = s.newTake(sp)
	s.nSpaces++
	if sp.ord >= fewSpaces {
		s.moreSpaces.Store(key, sp)
		return sp
	}
	var spaces []*space
	if old != nil {
		spaces = *old
	}
	spaces = append(spaces[:len(spaces):len(spaces)], sp) // a new array: readers may hold the old one
	s.spaces.Store(&spaces)
	return sp
}

func findSpace(spaces *[]*space, alg *ratelimit.Algorithm, ns string) *space {
	if spaces == nil {
		return nil
	}
	for _, sp := range *spaces {
		if sp.alg == alg && sp.ns == ns {
			return sp
		}
	}
	return nil
}

// table is this shard's table of sp; sh.mu is held.
func (sh *shard) table(sp *space) *table {
	if sp.ord < fewSpaces {
		if t := sh.tables[sp.ord].Load(); t != nil {
			return t
		}
	}
	return sh.otherTable(sp)
}

// otherTable is table's slow path: a table of the many, or one the shard has not made.
func (sh *shard) otherTable(sp *space) *table {
	if sp.ord >= fewSpaces {
		if t := sh.more[sp]; t != nil {
			return t
		}
		if sh.more == nil {
			sh.more = make(map[*space]*table)
		}
		t := newTable(sp.alg)
		sh.more[sp] = t
		return t
	}
	t := newTable(sp.alg)
	sh.tables[sp.ord].Store(t)
	return t
}

func newTable(alg *ratelimit.Algorithm) *table {
	t := &table{alg: alg}
	t.last.Store(&prepared{}) // a zero rule, which no decision has
	return t
}

// eachTable calls f with every table of the shard; sh.mu is held.
func (sh *shard) eachTable(f func(*table)) {
	for i := range sh.tables {
		if t := sh.tables[i].Load(); t != nil {
			f(t)
		}
	}
	for _, t := range sh.more {
		f(t)
	}
}

// argsFor is t.alg.Prepare(rule, n), remembered for the next request with the same
// rule; sh.mu is held.
func (t *table) argsFor(rule ratelimit.Rule, n int64) (ratelimit.Args, error) {
	if p := t.last.Load(); rule == p.rule && n >= 1 && n <= p.args.Limit {
		return p.args, nil
	}
	a, err := t.alg.Prepare(rule, n)
	if err == nil {
		t.last.Store(&prepared{rule, a})
	}
	return a, err
}

// sweepIfDue sweeps the shard when its sweep is due, or the clock stepped back; sh.mu
// is held.
func (sh *shard) sweepIfDue(now, every int64) {
	if next := sh.nextSweep.Load(); now >= next || now < next-2*every {
		sh.sweep(now)
		sh.nextSweep.Store(now + every)
	}
}

// sweep drops every key that is back to full; sh.mu is held.
func (sh *shard) sweep(now int64) {
	sh.eachTable(func(t *table) {
		t.keys.sweep(func(e *entry) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.expires <= now {
				e.expires = dead
				return true
			}
			return false
		}, func(k string) {
			sh.size--
			sh.bytes -= cost(k)
		})
	})
	for sp, t := range sh.more { // a table of the many is made again when needed
		if t.keys.n == 0 {
			delete(sh.more, sp)
		}
	}
}

// evict drops one key of the largest table: the first expired one among a few sampled
// (from a place the hash of the key coming in picks), or else the sampled one that will
// be full soonest; sh.mu is held. A key whose lock is held this instant (a decision on
// it, or a batch of this goroutine's) is passed over; evict reports whether it dropped
// one.
func (sh *shard) evict(h uint64, now int64) bool {
	var largest *index
	sh.eachTable(func(t *table) {
		if largest == nil || t.keys.n > largest.n {
			largest = &t.keys
		}
	})
	if largest == nil || largest.n == 0 {
		return false
	}
	victim, soonest := -1, int64(0)
	largest.sample(h>>7, evictSamples, func(i int) bool {
		e := largest.at(i)
		if !e.mu.TryLock() {
			return true
		}
		if victim >= 0 && e.expires >= soonest {
			e.mu.Unlock()
			return true
		}
		if victim >= 0 {
			largest.at(victim).mu.Unlock()
		}
		victim, soonest = i, e.expires // held locked until it is dropped or another is chosen
		return soonest > now
	})
	if victim < 0 {
		return false
	}
	e := largest.at(victim)
	e.expires = dead
	e.mu.Unlock()
	sh.size--
	sh.bytes -= cost(e.key)
	largest.removeAt(victim)
	return true
}
