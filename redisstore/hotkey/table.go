package hotkey

import (
	"sync"
	"sync/atomic"

	"github.com/ratelimit-go/ratelimit/internal/core"
)

type algKey struct {
	alg     *core.Algorithm
	ns, key string
}

// table is a bounded map of per-key entries, safe for concurrent use. Its lock is held
// only to find or add an entry, never across a call to a store, and an entry's expiry is
// read without the entry's own lock: one slow key never delays another.
type table[V any] struct {
	mu      sync.Mutex
	entries map[algKey]*V
	expiry  func(*V) *atomic.Int64 // the instant the entry is worth nothing (UnixNano)
	max     int
}

func (t *table[V]) get(k algKey, now int64) *V {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.entries == nil {
		t.entries = make(map[algKey]*V)
	}
	v, ok := t.entries[k]
	if !ok {
		if len(t.entries) >= t.max {
			t.prune(now)
		}
		v = new(V)
		t.entries[k] = v
	}
	return v
}

// prune drops the expired entries, or, if none is, half of them (map order is random). A
// call in flight on a dropped entry finishes on it, and what it learns is forgotten.
func (t *table[V]) prune(now int64) {
	for k, v := range t.entries {
		if t.expiry(v).Load() <= now {
			delete(t.entries, k)
		}
	}
	for k := range t.entries {
		if len(t.entries) < t.max/2+1 {
			break
		}
		delete(t.entries, k)
	}
}
