package localstore

// index is a hash table of a shard's keys, keyed by the key's hash (the one that chose the
// shard) and the key: a decision hashes its key once, where a Go map would hash it again.
// Open addressing with linear probing, at most 3/4 full, and backward-shift deletion (no
// tombstones), so that a lookup stops at the first empty slot. Not safe for concurrent
// use: the shard's lock guards it.
type index struct {
	slots []slot
	n     int // keys held
}

type slot struct {
	hash uint64 // the key's hash with its top bit set; 0 in an empty slot
	key  string
	e    *entry
}

const used = 1 << 63

// home is the slot where a key of hash h starts its probe: from the hash's high bits,
// as its low bits chose the shard.
func (ix *index) home(h uint64) int { return int((h >> 32) & uint64(len(ix.slots)-1)) }

// get is the entry of key, of hash h, or nil: find, small enough to be inlined.
func (ix *index) get(h uint64, key string) *entry {
	if ix.n == 0 {
		return nil
	}
	h |= used
	mask := uint64(len(ix.slots) - 1)
	for i := (h >> 32) & mask; ; i = (i + 1) & mask {
		if s := &ix.slots[i]; s.hash == h && s.key == key {
			return s.e
		} else if s.hash == 0 {
			return nil
		}
	}
}

// find is the slot of key, of hash h, or -1.
func (ix *index) find(h uint64, key string) int {
	if ix.n == 0 {
		return -1
	}
	h |= used
	mask := len(ix.slots) - 1
	for i := ix.home(h); ; i = (i + 1) & mask {
		s := &ix.slots[i]
		if s.hash == 0 {
			return -1
		}
		if s.hash == h && s.key == key {
			return i
		}
	}
}

// put holds e for key, of hash h, which the index does not hold.
func (ix *index) put(h uint64, key string, e *entry) {
	if (ix.n+1)*4 > len(ix.slots)*3 {
		ix.grow()
	}
	ix.insert(h|used, key, e)
	ix.n++
}

func (ix *index) insert(h uint64, key string, e *entry) {
	mask := len(ix.slots) - 1
	i := ix.home(h)
	for ix.slots[i].hash != 0 {
		i = (i + 1) & mask
	}
	ix.slots[i] = slot{hash: h, key: key, e: e}
}

func (ix *index) grow() {
	old := ix.slots
	ix.slots = make([]slot, max(8, 2*len(old)))
	for _, s := range old {
		if s.hash != 0 {
			ix.insert(s.hash, s.key, s.e)
		}
	}
}

// del forgets key, of hash h, and reports whether the index held it.
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
	mask := len(ix.slots) - 1
	for j := (i + 1) & mask; ix.slots[j].hash != 0; j = (j + 1) & mask {
		k := ix.home(ix.slots[j].hash)
		// the key at j may move to the hole at i unless its home lies cyclically in (i, j]
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			ix.slots[i] = ix.slots[j]
			i = j
		}
	}
	ix.slots[i] = slot{}
	ix.n--
}

// sweep removes every key whose entry drop says to drop, and returns each removed key's
// cost to the caller's accounting through removed.
func (ix *index) sweep(drop func(*entry) bool, removed func(key string)) {
	for i := 0; i < len(ix.slots); {
		s := &ix.slots[i]
		if s.hash != 0 && drop(s.e) {
			removed(s.key)
			ix.removeAt(i) // a key moved back into i is looked at again
			continue
		}
		i++
	}
}

// sample returns up to max occupied slots' indexes, from a place that start picks.
func (ix *index) sample(start uint64, max int, visit func(i int) bool) {
	if ix.n == 0 {
		return
	}
	mask := len(ix.slots) - 1
	max = min(max, ix.n)
	for i, seen := int(start)&mask, 0; seen < max; i = (i + 1) & mask {
		if ix.slots[i].hash != 0 {
			seen++
			if !visit(i) {
				return
			}
		}
	}
}
