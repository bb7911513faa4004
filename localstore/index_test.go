package localstore

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestIndexAgainstMap: random puts, gets, deletions and sweeps agree with a Go map, with
// hashes drawn from a small set so that probes collide, wrap around the table's end, and
// deletions shift keys back.
func TestIndexAgainstMap(t *testing.T) {
	for _, hashes := range []uint64{1, 3, 64, 1 << 40} {
		rng := rand.New(rand.NewPCG(hashes, 9))
		var ix index
		model := map[string]*entry{}
		hashOf := func(key string) uint64 { // many keys share a hash
			n, _ := strconv.Atoi(key)
			return uint64(n) % hashes << 32
		}
		for step := range 20000 {
			key := strconv.Itoa(rng.IntN(300))
			h := hashOf(key)
			switch op := rng.IntN(10); {
			case op < 4:
				if model[key] == nil {
					e := &entry{expires: int64(rng.IntN(100))}
					ix.put(h, key, e)
					model[key] = e
				}
			case op < 7:
				if got := ix.del(h, key); got != (model[key] != nil) {
					t.Fatalf("step %d: del(%s) = %v; the map held it: %v", step, key, got, model[key] != nil)
				}
				delete(model, key)
			case op < 9:
			default:
				cut := int64(rng.IntN(100))
				removed := 0
				ix.sweep(func(e *entry) bool { return e.expires < cut }, func(string) { removed++ })
				want := 0
				for k, e := range model {
					if e.expires < cut {
						delete(model, k)
						want++
					}
				}
				if removed != want {
					t.Fatalf("step %d: sweep removed %d; want %d", step, removed, want)
				}
			}
			if got := ix.get(h, key); got != model[key] {
				t.Fatalf("step %d: get(%s) = %p; want %p", step, key, got, model[key])
			}
			if ix.n != len(model) {
				t.Fatalf("step %d: %d keys; want %d", step, ix.n, len(model))
			}
		}
		for k, e := range model {
			if got := ix.get(hashOf(k), k); got != e {
				t.Fatalf("at the end: get(%s) = %p; want %p", k, got, e)
			}
		}
	}
}
