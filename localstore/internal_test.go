package localstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// oneShard returns a store with a single shard, so that the test knows which keys share it.
func oneShard(clk clock.Clock, perShard int, opts ...Option) *Store {
	s := New(append(opts, WithClock(clk))...)
	s.shards, s.mask, s.perShard = s.shards[:1], 0, perShard
	return s
}

func take(t *testing.T, s *Store, key string, n int64) core.Outcome {
	t.Helper()
	d, err := s.Apply(context.Background(), core.Request{Key: key, N: n, Spec: &core.Spec{Algorithm: tokenbucket.Algorithm(), Rule: core.Rule(ratelimit.PerMinute(10))}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestIdleKeysExpire: keys back to full are dropped by the next sweep of their shard.
func TestIdleKeysExpire(t *testing.T) {
	clk := clock.NewFake(start)
	s := oneShard(clk, 100, WithSweepInterval(time.Second))
	take(t, s, "a", 10)           // full again in a minute
	clk.Advance(54 * time.Second) // 9 tokens back: the key is kept, not yet full
	take(t, s, "b", 1)
	if d := take(t, s, "a", 10); d.Allowed() || s.Len() != 2 {
		t.Fatalf("a key used up 54s ago: %+v with %d keys; want denied, both keys kept", d, s.Len())
	}
	clk.Advance(time.Minute)
	take(t, s, "c", 1) // triggers the sweep, which drops "a" and "b", then holds "c"
	if s.Len() != 1 {
		t.Errorf("after a sweep, Len = %d; want 1", s.Len())
	}
	if d := take(t, s, "a", 10); !d.Allowed() {
		t.Errorf("an expired key does not come back full: %+v", d)
	}
}

// TestEvictsClosestToFull: in a full shard, a new key evicts the key that would be full
// soonest (all keys are sampled when the shard holds no more than evictSamples).
func TestEvictsClosestToFull(t *testing.T) {
	s := oneShard(clock.NewFake(start), evictSamples)
	apply := func(key string, n int64) core.Outcome { return take(t, s, key, n) }
	keys := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for i, k := range keys {
		apply(k, int64(10-i)) // "h" takes the fewest tokens: it is full soonest
	}
	apply("new", 1)
	if s.Len() != evictSamples {
		t.Fatalf("Len = %d; want %d", s.Len(), evictSamples)
	}
	if d := apply("h", 10); !d.Allowed() {
		t.Errorf("h, the key closest to full, was not the one evicted: %+v", d)
	}
	if d := apply("a", 1); d.Allowed() {
		t.Errorf("a, a used-up key, was evicted: %+v", d)
	}
}

func TestShardsHoldTheCap(t *testing.T) {
	for _, tc := range []struct{ maxKeys, shards, perShard int }{
		{1, 1, 1}, {3, 2, 1}, {8, 8, 1}, {255, 128, 1}, {1000, 256, 3}, {DefaultMaxKeys, 256, DefaultMaxKeys / 256},
	} {
		s := New(WithMaxKeys(tc.maxKeys))
		if len(s.shards) != tc.shards || s.perShard != tc.perShard || len(s.shards)*s.perShard > tc.maxKeys {
			t.Errorf("WithMaxKeys(%d): %d shards of %d; want %d of %d", tc.maxKeys, len(s.shards), s.perShard, tc.shards, tc.perShard)
		}
	}
	// TestNoAllocationsOnExistingKey counts on this: a byte cap of one shard's least
	// makes one shard, whatever the cap on keys
	if s := New(WithMaxBytes(minShardBytes)); len(s.shards) != 1 {
		t.Errorf("WithMaxBytes(%d): %d shards; want 1", minShardBytes, len(s.shards))
	}
}
