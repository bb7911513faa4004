// Package eventlog is the sliding log's state: a queue of admitted events in time order.
// It is internal so that the root package's documentation shows only what users and store
// authors touch; stores hold a *Log inside core.State without looking into it.
package eventlog

import "math/bits"

// Event is n events admitted at one instant (microseconds since the Unix epoch).
type Event struct {
	At, N int64
}

// Log is a queue of Events in time order, grown as needed and never shrunk below what it
// holds. The zero Log is empty and ready to use.
//
// It is a ring: its buffer's length is 0 or a power of two, so that an entry's place is
// a mask away rather than a division (a division by a length the compiler cannot know
// costs tens of cycles, several times a decision). Beside the ring it keeps a copy of its
// oldest entry and its newest entry's instant, which are all that a denied decision of
// the sliding log reads: such a decision touches the Log's own 64 bytes, not the ring's
// two ends, far apart in memory once the log holds many events.
type Log struct {
	buf        []Event
	head, size int
	first      Event // the oldest entry, while size > 0
	lastAt     int64 // the newest entry's instant, while size > 0
}

// Oldest is the oldest entry, At(0); the Log must not be empty.
func (l *Log) Oldest() Event { return l.first }

// NewestAt is the newest entry's instant, At(Len()-1).At; the Log must not be empty.
func (l *Log) NewestAt() int64 { return l.lastAt }

// sync sets the copies of the ends from the ring, after an operation that may move them.
func (l *Log) sync() {
	if l.size > 0 {
		l.first, l.lastAt = l.buf[l.head], l.buf[l.slot(l.size-1)].At
	}
}

// slot is where the i-th entry from head sits in buf, which must not be empty.
func (l *Log) slot(i int) int { return (l.head + i) & (len(l.buf) - 1) }

// ringSize is the buffer length for n entries: a power of two, at least 4.
func ringSize(n int) int {
	if n <= 4 {
		return 4
	}
	return 1 << bits.Len(uint(n-1))
}

// Len is the number of entries.
func (l *Log) Len() int { return l.size }

// At is the i-th entry, the oldest being 0.
func (l *Log) At(i int) Event { return l.buf[l.slot(i)] }

// Push appends n events at instant at, merged into the newest entry when it has the same
// instant. Instants must not decrease.
func (l *Log) Push(at, n int64) {
	if l.size > 0 && l.lastAt == at {
		l.buf[l.slot(l.size-1)].N += n
		if l.size == 1 {
			l.first.N += n
		}
		return
	}
	l.Append(Event{At: at, N: n})
}

// Shift moves every entry's instant by d.
func (l *Log) Shift(d int64) {
	for i := range l.size {
		l.buf[l.slot(i)].At += d
	}
	l.sync()
}

// Clamp sets every entry's instant after at to at.
func (l *Log) Clamp(at int64) {
	for i := range l.size {
		if e := &l.buf[l.slot(i)]; e.At > at {
			e.At = at
		}
	}
	l.sync()
}

// Append appends e as an entry of its own, never merged, in whatever order: for a Log
// used as a set (the leases of an in-flight limit), not as a queue in time order.
func (l *Log) Append(e Event) {
	if l.size == len(l.buf) {
		l.grow()
	}
	l.buf[l.slot(l.size)] = e
	if l.size == 0 {
		l.first = e
	}
	l.lastAt = e.At
	l.size++
}

// Set replaces the i-th entry.
func (l *Log) Set(i int, e Event) {
	l.buf[l.slot(i)] = e
	l.sync()
}

// Expire removes every entry whose At is at or before t, keeping the others in order.
func (l *Log) Expire(t int64) {
	kept := 0
	for i := 0; i < l.size; i++ {
		if e := l.At(i); e.At > t {
			l.buf[l.slot(kept)] = e
			kept++
		}
	}
	l.size = kept
	l.sync()
}

// Remove removes the i-th entry, keeping the others in order.
func (l *Log) Remove(i int) {
	for ; i < l.size-1; i++ {
		l.buf[l.slot(i)] = l.At(i + 1)
	}
	l.size--
	l.sync()
}

// Clear empties the Log, keeping its memory.
func (l *Log) Clear() { l.head, l.size = 0, 0 }

// TrimNewest removes up to n events from the newest entries and returns how many it
// removed.
func (l *Log) TrimNewest(n int64) int64 {
	removed := int64(0)
	for removed < n && l.size > 0 {
		last := &l.buf[l.slot(l.size-1)]
		take := min(n-removed, last.N)
		last.N -= take
		removed += take
		if last.N == 0 {
			l.size--
		}
	}
	l.sync()
	return removed
}

// Pop removes the oldest entry and returns it; the Log must not be empty.
func (l *Log) Pop() Event {
	e := l.first
	l.head = l.slot(1)
	l.size--
	if l.size > 0 {
		l.first = l.buf[l.head]
	}
	return e
}

// CopyFrom makes l a copy of src, reusing l's memory: for a scratch Log, copied into
// again and again.
func (l *Log) CopyFrom(src *Log) {
	if len(l.buf) < src.size {
		l.buf = make([]Event, ringSize(src.size))
	}
	for i := 0; i < src.size; i++ {
		l.buf[i] = src.At(i)
	}
	l.head, l.size = 0, src.size
	l.sync()
}

// Clone returns a copy of l that shares no memory with it; nil for nil.
func (l *Log) Clone() *Log {
	if l == nil {
		return nil
	}
	c := &Log{size: l.size}
	if l.size > 0 {
		c.buf = make([]Event, ringSize(l.size))
	}
	for i := range l.size {
		c.buf[i] = l.At(i)
	}
	c.sync()
	return c
}

func (l *Log) grow() {
	buf := make([]Event, ringSize(2*len(l.buf)))
	for i := 0; i < l.size; i++ {
		buf[i] = l.At(i)
	}
	l.buf, l.head = buf, 0
}
