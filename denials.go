package ratelimit

import (
	"cmp"
	"container/heap"
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Denials answers "who is being limited right now?". It reports the keys denied most over
// the last minute. Its memory is bounded whatever the number of keys, with no metric per
// key.
//
// It counts in six slots of 10 seconds, each of up to Capacity keys. A key denied more
// than a slot's denials divided by Capacity is always among them. Its count is over by
// at most Denied.Error. The counting is the Space-Saving algorithm (Metwally, Agrawal and
// El Abbadi, 2005).
//
// Hand its Observe to Middleware.OnDecision, or call it from a hook of your own. Read Top
// from an admin endpoint:
//
//	denials := &ratelimit.Denials{}
//	mw := &ratelimit.Middleware{Limiter: limiter, Key: key, OnDecision: denials.Observe}
//	top := denials.Top(10)
//
// The zero value is ready to use, with the defaults written beside the fields. The
// fields must not change once it is in use. It is safe for concurrent use.
type Denials struct {
	// Capacity is the number of keys each slot counts: 256 when 0. Memory is about six
	// times Capacity keys.
	Capacity int
	// Clock is the source of time: the system's when nil.
	Clock clock.Clock

	mu    sync.Mutex
	slots [denialSlots]denialSlot
}

// Denied is one key of Denials.Top. The key was denied Count times over the last minute.
// Count may be over by at most Error, which counts the denials of the keys this one
// replaced.
type Denied struct {
	Key   string
	Count int64
	Error int64
}

const (
	denialSlots = 6
	denialSpan  = 10 * time.Second // one slot's span: six make the last minute
)

// denialSlot is one slot's Space-Saving sketch: the counted keys, in a min-heap by count.
type denialSlot struct {
	epoch int64 // the slot's span since the Unix epoch, in denialSpan (negative before 1970)
	used  bool
	index map[string]*denialEntry
	heap  denialHeap
}

type denialEntry struct {
	key          string
	count, error int64
	at           int // its place in the heap
}

// Observe counts e's key once when e is a denial a client saw. That is a rate limit's or
// an in-flight limit's denial, but not a shadowed one. Use it as a Middleware.OnDecision
// hook.
func (d *Denials) Observe(_ context.Context, e Event) {
	if e.Err == nil && !e.Decision.Allowed && !e.Shadowed {
		d.Record(e.Key, 1)
	}
}

// Record counts n denials of key now, from a gRPC interceptor, say. A count that would
// pass the largest int64 stays there.
func (d *Denials) Record(key string, n int64) {
	if n <= 0 {
		return
	}
	epoch := d.epoch()
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &d.slots[slotOf(epoch)]
	if !s.used || s.epoch != epoch { // a slot a minute old: start it again
		s.epoch, s.used = epoch, true
		clear(s.index)
		s.heap = s.heap[:0]
	}
	if s.index == nil {
		s.index = make(map[string]*denialEntry)
	}
	if e := s.index[key]; e != nil {
		e.count = addSat(e.count, n)
		heap.Fix(&s.heap, e.at)
		return
	}
	if len(s.heap) < d.capacity() {
		e := &denialEntry{key: key, count: n}
		s.index[key] = e
		heap.Push(&s.heap, e)
		return
	}
	// the key with the fewest takes the new one's place, and its count: the new key may
	// have been denied that many times while it was not counted
	e := s.heap[0]
	delete(s.index, e.key)
	e.key, e.error = key, e.count
	e.count = addSat(e.count, n)
	s.index[key] = e
	heap.Fix(&s.heap, 0)
}

// Top returns at most n of the keys denied most over the last minute. The most denied
// come first, and ties are in order of key.
func (d *Denials) Top(n int) []Denied {
	epoch := d.epoch()
	sum := map[string]*Denied{}
	d.mu.Lock()
	for i := range d.slots {
		s := &d.slots[i]
		if !s.used || s.epoch <= epoch-denialSlots || s.epoch > epoch {
			continue
		}
		for _, e := range s.heap {
			t := sum[e.key]
			if t == nil {
				t = &Denied{Key: e.key}
				sum[e.key] = t
			}
			t.Count = addSat(t.Count, e.count)
			t.Error = addSat(t.Error, e.error)
		}
	}
	d.mu.Unlock()
	top := make([]Denied, 0, len(sum))
	for _, t := range sum {
		top = append(top, *t)
	}
	slices.SortFunc(top, func(a, b Denied) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return top[:min(max(n, 0), len(top))]
}

func (d *Denials) capacity() int {
	if d.Capacity > 0 {
		return d.Capacity
	}
	return 256
}

// epoch is the span of now since the Unix epoch, in denialSpan, rounded down: negative
// before 1970, and defined for every time.Time (in seconds, which do not overflow).
func (d *Denials) epoch() int64 {
	now := time.Now()
	if d.Clock != nil {
		now = d.Clock.Now()
	}
	return mathx.FloorDiv(now.Unix(), int64(denialSpan/time.Second))
}

// slotOf is the slot of an epoch, for any epoch.
func slotOf(epoch int64) int64 {
	return (epoch%denialSlots + denialSlots) % denialSlots
}

// addSat is a + b for counts, both at least 0, held at the largest int64.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// denialHeap is a min-heap of entries by count.
type denialHeap []*denialEntry

func (h denialHeap) Len() int           { return len(h) }
func (h denialHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h denialHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *denialHeap) Push(x any) {
	e := x.(*denialEntry)
	e.at = len(*h)
	*h = append(*h, e)
}
func (h *denialHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
