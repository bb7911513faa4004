// Package localstore is the in-memory ratelimit.Store. It keeps the state of every key
// in one process. Use it for limits that need not be shared across instances, for
// tests, and as the fallback when Redis is down.
//
// A decision on a key the store already holds takes only that key's lock, and
// allocates nothing. Adding, removing and sweeping keys lock the keys' shard.
//
// Memory is bounded twice over:
//
//   - Idle keys expire. A key is back to its full allowance once its last Decision's
//     ResetAfter has passed, and is then worth nothing. Each shard drops such keys in a
//     sweep, at most once per sweep interval (WithSweepInterval). The decision that
//     finds the interval passed runs the sweep. No goroutine runs in the background.
//   - The number of keys is capped (WithMaxKeys), and so is their memory in bytes
//     (WithMaxBytes). Long keys count for more. A new key that finds its shard full
//     evicts another. Among a few sampled keys, it evicts an expired one, or else the
//     one closest to full. An evicted key starts over with its full allowance. Under an
//     attack that rotates keys, the cap so costs accuracy, never memory.
//
// A key of 16 bytes costs about 128 bytes in all. WithMaxBytes counts each key as 128
// bytes plus its length, which is more than it takes.
//
// Time comes from a clock.Clock, set by WithClock. The default is clock.NewMonotonic():
// the wall clock at New plus the monotonic time since, which never steps back. A key
// may be asked at an instant before the latest it has seen. If it is earlier by less
// than the key's period, the key is decided at that latest instant. If it is earlier by
// more, as when a clock is set back, the key's state moves back by whole periods to
// within one. See the package doc of ratelimit, "Time". The durations of a Decision
// count from the caller's clock, as in redisstore.
package localstore

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
)

// Defaults of the options.
const (
	DefaultMaxKeys       = 1 << 20
	DefaultMaxBytes      = 1 << 30
	DefaultSweepInterval = 10 * time.Second
)

const (
	maxShards = 256
	// minShardBytes is the least byte budget of a shard: fewer shards, for a small
	// WithMaxBytes, rather than shards too small for a long key
	minShardBytes = 64 << 10
)

// Store is an in-memory ratelimit.Store. It is safe for concurrent use. The zero value is
// not usable: call New.
type Store struct {
	clock clock.Clock
	// the clock when it is a Monotonic (the sum of Monotonic.UnixNano) or a Coarse, read
	// without its interface
	isMono    bool
	monoStart time.Time
	monoNano  int64
	coarse    *clock.Coarse

	// Keys live in shards, each key's state behind its own mutex. A key is hashed once:
	// the hash chooses its shard and finds it in the shard's own open-addressing table.
	// A decision on an existing key reads that table with atomic loads, without the
	// shard's lock, and holds only the key's lock. Cores deciding on different keys so
	// write no cache line in common. Adding, removing and sweeping keys take the shard's
	// lock.
	hash       hasher
	shards     []shard
	mask       uint64
	perShard   int   // the most keys one shard holds
	maxBytes   int64 // the most bytes of keys one shard holds (all shards, until New divides)
	sweepEvery int64 // microseconds

	spaces spaces // every (algorithm, namespace) seen
	specs  specs  // what the decisions of the Specs seen lately need
}

var _ ratelimit.Store = (*Store)(nil)

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// WithClock sets the clock decisions are made by. The default is clock.NewMonotonic().
// Nil means the default.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) {
		if c != nil {
			s.clock = c
		}
	})
}

// WithMaxKeys caps the number of keys the store holds, DefaultMaxKeys by default. Less
// than 1 means the default. One key is one (algorithm, namespace, key).
func WithMaxKeys(n int) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.perShard = n // divided among the shards by New
		}
	})
}

// WithMaxBytes caps the memory the keys take, in bytes, DefaultMaxBytes by default.
// Less than 1 means the default. Each key counts as its length plus 128 bytes, which is
// more than it takes (see the package doc).
//
// Past the cap, a new key evicts others, as with WithMaxKeys. Long keys so cost memory
// only up to the cap, however many come. The cap is divided among the shards, at least
// 64 KiB each. A key longer than its shard's part is still held, alone. The bound is
// so n plus one such key per shard.
func WithMaxBytes(n int64) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.maxBytes = n
		}
	})
}

// WithSweepInterval sets how often each shard drops the keys that are back to full,
// DefaultSweepInterval by default. 0 or less means the default. A sweep visits every key
// of one shard, inside that shard's lock.
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
		hash:       newHasher(),
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

// now reads the clock in microseconds: the default clock and a Coarse without the
// interface or a time.Time.
func (s *Store) now() int64 {
	if s.isMono {
		return (s.monoNano + int64(time.Since(s.monoStart))) / 1000
	}
	return s.otherNow()
}

func (s *Store) otherNow() int64 {
	if s.coarse != nil {
		return s.coarse.UnixNano() / 1000
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

// spaces are the (algorithm, namespace) pairs a store has seen, numbered from 0 in
// order: the first fewSpaces in a list that a decision scans, the others in a map.
type spaces struct {
	few  atomic.Pointer[[]*space]
	more sync.Map // spaceKey -> *space
	mu   sync.Mutex
	n    int // under mu
}
