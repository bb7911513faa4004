package localstore

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
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

// TestIndexGetWhileChanging: gets without the lock, beside a writer that adds and removes
// keys under it (probes collide, wrap and shift back, and the table grows), find either
// nothing, a dead entry, or the entry of the very key asked for; a key held throughout is
// found once the writer is done. Run under -race, it also checks that every access to a
// slot is atomic.
func TestIndexGetWhileChanging(t *testing.T) {
	var (
		ix     index
		mu     sync.Mutex // the shard's lock
		done   atomic.Bool
		wg     sync.WaitGroup
		stable = map[string]*entry{}
	)
	hashOf := func(key string) uint64 {
		n, _ := strconv.Atoi(key)
		return uint64(n%37) << 32
	}
	for k := range 64 { // held throughout
		key := strconv.Itoa(k)
		e := &entry{}
		ix.put(hashOf(key), key, e)
		stable[key] = e
	}
	for r := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 1))
			for !done.Load() {
				key := strconv.Itoa(rng.IntN(2000))
				e := ix.get(hashOf(key), key)
				if e == nil {
					continue
				}
				e.mu.Lock() // as a decision does, before it reads expires
				gone := e.expires == dead
				e.mu.Unlock()
				switch {
				case gone:
				case e.key != key:
					t.Errorf("get(%s) found the entry of %s", key, e.key)
					return
				case stable[key] != nil && e != stable[key]:
					t.Errorf("get(%s) found another entry than the one it holds", key)
					return
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(7, 7))
	held := map[string]*entry{}
	for range 20000 {
		key := strconv.Itoa(64 + rng.IntN(1900))
		mu.Lock()
		if e := held[key]; e != nil {
			e.mu.Lock() // as a remover does, before the index forgets it
			e.expires = dead
			e.mu.Unlock()
			ix.del(hashOf(key), key)
			delete(held, key)
		} else {
			e := &entry{}
			ix.put(hashOf(key), key, e)
			held[key] = e
		}
		mu.Unlock()
	}
	done.Store(true)
	wg.Wait()
	for key, e := range stable {
		if got := ix.get(hashOf(key), key); got != e {
			t.Errorf("after the changes, get(%s) = %p; want %p", key, got, e)
		}
	}
	for key, e := range held {
		if got := ix.get(hashOf(key), key); got != e {
			t.Errorf("after the changes, get(%s) = %p; want %p", key, got, e)
		}
	}
}
