package localstore

import (
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The benchmarks of this file weigh each of the store's own structures against what a
// maintainer would write without it, on the same keys: the hasher against hash/maphash,
// the index read without a lock against a map under its shard's read lock, and the cache
// of Specs against a sync.Map. BENCHMARKS.md keeps their figures, and the instructions of
// each serial one (internal/benchmarks/instructions.sh with PKG=localstore).

// benchKeys are 1024 keys shaped as a gateway's: a tenant and a route.
func benchKeys() []string {
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "tenant-" + strconv.Itoa(i) + ":/v1/chat"
	}
	return keys
}

var sink uint64

func BenchmarkKeyHash(b *testing.B) {
	keys := benchKeys()
	b.Run("own/serial", func(b *testing.B) {
		h := newHasher()
		i := 0
		for b.Loop() {
			sink += h.sum(keys[i&1023])
			i++
		}
	})
	b.Run("maphash/serial", func(b *testing.B) {
		seed := maphash.MakeSeed()
		i := 0
		for b.Loop() {
			sink += maphash.String(seed, keys[i&1023])
			i++
		}
	})
}

// mapShard is the plain design: a Go map of a shard's keys under a read-write lock.
type mapShard struct {
	mu   sync.RWMutex
	keys map[string]*entry
	_    [64]byte
}

func BenchmarkKeyIndex(b *testing.B) {
	keys := benchKeys()
	const shards = 64
	h := newHasher()
	seed := maphash.MakeSeed()
	var own [shards]index
	var plain [shards]mapShard
	for i := range plain {
		plain[i].keys = map[string]*entry{}
	}
	for _, k := range keys {
		hk := h.sum(k)
		own[hk&(shards-1)].put(hk, k, &entry{})
		plain[maphash.String(seed, k)&(shards-1)].keys[k] = &entry{key: k}
	}
	findOwn := func(i int) *entry {
		k := keys[i&1023]
		hk := h.sum(k)
		ix := &own[hk&(shards-1)]
		if e := ix.atHome(hk, k); e != nil {
			return e
		}
		return ix.get(hk, k)
	}
	findPlain := func(i int) *entry {
		k := keys[i&1023]
		sh := &plain[maphash.String(seed, k)&(shards-1)]
		sh.mu.RLock()
		e := sh.keys[k]
		sh.mu.RUnlock()
		return e
	}
	finds(b, "own", findOwn)
	finds(b, "shardedmap", findPlain)
}

func BenchmarkSpecLookup(b *testing.B) {
	s := New()
	var m sync.Map
	specs := make([]*core.Spec, 4) // a limiter's few: one a priority
	for i := range specs {
		specs[i] = &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule{Limit: 100, Period: 1e9}, Reserve: int64(10 * i)}
		k, err := s.know(specs[i])
		if err != nil {
			b.Fatal(err)
		}
		m.Store(specs[i], k)
	}
	findOwn := func(i int) *known { // as Apply: derived anew when its slots were taken
		if k := s.specs.find(specs[i&3]); k != nil {
			return k
		}
		k, _ := s.know(specs[i&3])
		return k
	}
	findMap := func(i int) *known {
		k, _ := m.Load(specs[i&3])
		return k.(*known)
	}
	finds(b, "own", findOwn)
	finds(b, "syncmap", findMap)
}

// finds runs find, which must find something, on one goroutine and on every processor.
func finds[T any](b *testing.B, name string, find func(int) *T) {
	b.Run(name+"/serial", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if find(i) == nil {
				b.Fatal("not found")
			}
			i++
		}
	})
	b.Run(name+"/parallel", func(b *testing.B) {
		var worker atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(worker.Add(1)) * 97 // each worker from its own place
			for pb.Next() {
				if find(i) == nil {
					b.Error("not found")
					return
				}
				i++
			}
		})
	})
}
