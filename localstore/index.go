package localstore

import "sync/atomic"

// index is a hash table of a shard's keys, keyed by the key's hash (the one that chose the
// shard) and the key: a decision hashes its key once, where a Go map would hash it again.
// Open addressing with linear probing, at most 3/4 full, and backward-shift deletion (no
// tombstones), so that a lookup stops at the first empty slot.
//
// Only the shard's lock holder changes it, but get runs without the lock: every slot is
// read and written with atomic operations, a slot is filled entry first and emptied hash
// first, and a larger array replaces the slots whole. A get that races with a change may
// miss a key the index holds (a key being moved back, or added to the array that replaced
// the one it read), never find a wrong one (it compares the entry's own key), and may find
// an entry just removed, which its remover has marked dead first (see dead), or vacant:
// a caller that misses or finds a dead entry looks again under the shard's lock.
type index struct {
	slots atomic.Pointer[[]slot] // nil until the first put
	n     int                    // keys held; under the shard's lock
}

type slot struct {
	hash atomic.Uint64 // the key's hash with its top bit set; 0 in an empty slot
	e    atomic.Pointer[entry]
}

const used = 1 << 63

// vacant is the entry of every emptied slot: dead, so that a decision that finds it (its
// get read the slot's hash before the slot was emptied) looks again under the lock.
var vacant = &entry{expires: dead}

// home is the slot where a key of hash h starts its probe in slots of this mask: from the
// hash's high bits, as its low bits chose the shard.
func home(h uint64, mask int) int { return int(h>>32) & mask }

// array is the slots, none before the first put.
func (ix *index) array() []slot {
	if p := ix.slots.Load(); p != nil {
		return *p
	}
	return nil
}

// get is the entry of key, of hash h, or nil; safe without the shard's lock (see index).
// A probe visits each slot once at most, so that no change can keep it going. It may
// return vacant, dead, for a slot emptied while it looked.
func (ix *index) get(h uint64, key string) *entry {
	p := ix.slots.Load()
	if p == nil {
		return nil
	}
	slots := *p
	h |= used
	mask := uint64(len(slots) - 1)
	for i, n := (h>>32)&mask, len(slots); n > 0; i, n = (i+1)&mask, n-1 {
		if sh := slots[i].hash.Load(); sh == h {
			if e := slots[i].e.Load(); e.key == key {
				return e
			}
		} else if sh == 0 {
			return nil
		}
	}
	return nil
}

// atHome is the entry of key, of hash h, if it sits in its home slot, where most keys
// do; else nil, and get finds it. Small enough to be inlined into a decision.
func (ix *index) atHome(h uint64, key string) *entry {
	if p := ix.slots.Load(); p != nil {
		slots := *p
		if sl := &slots[(h>>32)&uint64(len(slots)-1)]; sl.hash.Load() == h|used {
			if e := sl.e.Load(); e.key == key {
				return e
			}
		}
	}
	return nil
}

// find is the slot of key, of hash h, or -1; under the shard's lock.
func (ix *index) find(h uint64, key string) int {
	slots := ix.array()
	if ix.n == 0 {
		return -1
	}
	h |= used
	mask := len(slots) - 1
	for i := home(h, mask); ; i = (i + 1) & mask {
		s := &slots[i]
		sh := s.hash.Load()
		if sh == 0 {
			return -1
		}
		if sh == h && s.e.Load().key == key {
			return i
		}
	}
}

// put holds e for key, of hash h, which the index does not hold; e is new, seen by no
// other goroutine yet.
func (ix *index) put(h uint64, key string, e *entry) {
	e.key = key
	if (ix.n+1)*4 > len(ix.array())*3 {
		ix.grow()
	}
	insert(ix.array(), h|used, e)
	ix.n++
}

func insert(slots []slot, h uint64, e *entry) {
	mask := len(slots) - 1
	i := home(h, mask)
	for slots[i].hash.Load() != 0 {
		i = (i + 1) & mask
	}
	slots[i].e.Store(e)
	slots[i].hash.Store(h)
}

// grow moves the keys to an array twice as large, and then publishes it: a get still on
// the old one sees it as it was.
func (ix *index) grow() {
	old := ix.array()
	slots := make([]slot, max(8, 2*len(old)))
	for i := range old {
		if h := old[i].hash.Load(); h != 0 {
			insert(slots, h, old[i].e.Load())
		}
	}
	ix.slots.Store(&slots)
}

// del forgets key, of hash h, and reports whether the index held it. The caller has
// marked its entry dead.
func (ix *index) del(h uint64, key string) bool {
	i := ix.find(h, key)
	if i >= 0 {
		ix.removeAt(i)
	}
	return i >= 0
}

// removeAt empties slot i, and moves back the keys after it that would no longer be
// found past the hole.
func (ix *index) removeAt(i int) {
	slots := ix.array()
	mask := len(slots) - 1
	for j := (i + 1) & mask; slots[j].hash.Load() != 0; j = (j + 1) & mask {
		h := slots[j].hash.Load()
		k := home(h, mask)
		// the key at j may move to the hole at i unless its home lies cyclically in (i, j]
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			slots[i].hash.Store(0) // emptied hash first, then filled entry first
			slots[i].e.Store(slots[j].e.Load())
			slots[i].hash.Store(h)
			i = j
		}
	}
	slots[i].hash.Store(0)
	slots[i].e.Store(vacant) // not nil: a get that has read the hash reads an entry
	ix.n--
}

// at is the entry in slot i, which holds one; under the shard's lock.
func (ix *index) at(i int) *entry { return ix.array()[i].e.Load() }

// sweep removes every key whose entry drop says to drop (drop marks it dead), and returns
// each removed key's cost to the caller's accounting through removed.
func (ix *index) sweep(drop func(*entry) bool, removed func(key string)) {
	slots := ix.array()
	for i := 0; i < len(slots); {
		if slots[i].hash.Load() != 0 {
			if e := slots[i].e.Load(); drop(e) {
				removed(e.key)
				ix.removeAt(i) // a key moved back into i is looked at again
				continue
			}
		}
		i++
	}
}

// sample visits up to max occupied slots' indexes, from a place that start picks, while
// visit returns true.
func (ix *index) sample(start uint64, max int, visit func(i int) bool) {
	if ix.n == 0 {
		return
	}
	slots := ix.array()
	mask := len(slots) - 1
	max = min(max, ix.n)
	for i, seen := int(start)&mask, 0; seen < max; i = (i + 1) & mask {
		if slots[i].hash.Load() != 0 {
			seen++
			if !visit(i) {
				return
			}
		}
	}
}
