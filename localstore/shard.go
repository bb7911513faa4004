package localstore

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/lend"
)

const (
	evictSamples = 8
	// keyCost is what a key costs besides its string, as WithMaxBytes counts it: its
	// entry, its slot and the string's header
	keyCost = 128
)

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
	scratch    core.State
	scratchLog eventlog.Log
	// the records of loans (Lend) of the keys that have some, apart from the entries (which
	// the keys never lent need not carry), and from their expiry, as on Redis
	loans map[loanKey][]lend.Record
}

// loanKey names the key a record of loans is of.
type loanKey struct {
	sp  *space
	key string
}

// entry is one key: its state and expiry behind its own lock, taken after the shard's
// when a goroutine holds both. Its fields fill one cache line.
type entry struct {
	mu      sync.Mutex
	state   core.State
	expires int64  // the instant the state is back to full, and forgotten; dead once removed
	key     string // set before the entry is in the index, never changed
}

// dead is the expires of an entry removed from its index, which a decision that found it
// without the shard's lock must not use.
const dead = math.MinInt64

// reset empties a state back to full: what is left counts for nothing, whatever the rule
// now.
func (e *entry) reset() {
	e.state = core.State{Log: e.state.Log}
	if e.state.Log != nil {
		e.state.Log.Clear()
	}
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

// sweptBy reports whether the shard needs no sweep at now: its next sweep is later, and
// not so far ahead that the clock must have stepped back.
func (sh *shard) sweptBy(now, every int64) bool {
	next := sh.nextSweep.Load()
	return now < next && now >= next-2*every
}

// sweepIfDue sweeps the shard when its sweep is due, or the clock stepped back; sh.mu
// is held.
func (sh *shard) sweepIfDue(now, every int64) {
	if !sh.sweptBy(now, every) {
		sh.sweep(now)
		sh.nextSweep.Store(now + every)
	}
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
		}, sh.forget)
	})
	for k, recs := range sh.loans {
		if ended(recs, now) {
			delete(sh.loans, k)
		}
	}
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
	sh.forget(e.key)
	largest.removeAt(victim)
	return true
}

// forget takes a key removed from the shard's index out of its size and bytes.
func (sh *shard) forget(key string) {
	sh.size--
	sh.bytes -= cost(key)
}
