package fallback

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// latencies is the distribution of the primary's recent answers, in time, and the tail
// a decision waits for: a histogram with buckets a quarter of a power of two wide
// (each at most 25% wider than the one before), counted over the current second and the
// one before, and its 99.5th percentile, computed again at most every tenth of a second
// by whichever answer comes then. Recording an answer is two atomic adds, and a bucket's
// index from the bits of its time.
type latencies struct {
	mu      sync.Mutex // held to start a new second
	second  [2]atomic.Int64
	counts  [2][buckets]atomic.Int64
	tick    atomic.Int64 // the tenth of a second the tail was last computed in
	tail    atomic.Int64 // nanoseconds; 0 while too few answers were seen
	samples atomic.Int64 // answers counted in the tail's computation
}

const (
	buckets = 4 * 40 // up to 2^40 ns: 18 minutes
	// minSamples is how many answers the two seconds must hold before their tail counts
	minSamples = 20
	// tailShare is the share of answers a decision waits for
	tailShare = 0.995
)

// bucket is the index of the bucket of d nanoseconds.
func bucket(d int64) int {
	if d < 4 {
		return int(max(d, 0))
	}
	exp := bits.Len64(uint64(d)) - 1 // d is in [2^exp, 2^(exp+1))
	quarter := int(d>>(exp-2)) & 3
	return min(exp*4+quarter-4, buckets-1) // exp 2 starts at index 4
}

// upper is the largest time bucket i holds, in nanoseconds.
func upper(i int) int64 {
	if i < 4 {
		return int64(i)
	}
	exp, quarter := (i+4)/4, int64((i+4)%4)
	return (4+quarter+1)<<(exp-2) - 1
}

// add counts an answer that took d, at now (nanoseconds on the store's clock).
func (l *latencies) add(d, now int64) {
	sec := now / int64(time.Second)
	g := sec & 1
	if l.second[g].Load() != sec {
		l.mu.Lock()
		if l.second[g].Load() != sec {
			for i := range l.counts[g] {
				l.counts[g][i].Store(0)
			}
			l.second[g].Store(sec)
		}
		l.mu.Unlock()
	}
	l.counts[g][bucket(d)].Add(1)
	if tick := now / int64(100*time.Millisecond); l.tick.Load() != tick && l.tick.Swap(tick) != tick {
		l.compute(sec)
	}
}

// compute sets the tail from the counts of second sec and the one before.
func (l *latencies) compute(sec int64) {
	var sum [buckets]int64
	var total int64
	for g := range l.counts {
		if s := l.second[g].Load(); s != sec && s != sec-1 {
			continue // older: not recent
		}
		for i := range sum {
			c := l.counts[g][i].Load()
			sum[i] += c
			total += c
		}
	}
	l.samples.Store(total)
	if total < minSamples {
		l.tail.Store(0)
		return
	}
	want := int64(float64(total)*tailShare + 0.5)
	var seen int64
	for i, c := range sum {
		if seen += c; seen >= want {
			l.tail.Store(upper(i))
			return
		}
	}
}
