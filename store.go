package ratelimit

import (
	"context"
	"strconv"
)

// Store keeps the state of every key and applies an Algorithm to it, one atomic decision
// at a time. A store knows nothing of any particular algorithm: it runs the Algorithm it is
// handed, in Go (Algorithm.Step, as localstore does) or as a server-side script
// (Algorithm.Script, as redisstore does). Because it sees the Rule of every call, a
// decorator store can change it on the way (fallback divides it across instances).
//
// Apply validates the request with Algorithm.Prepare before it touches any state, so an
// invalid rule or n returns an error wrapping ErrInvalidRule, ErrInvalidN or
// ErrNExceedsLimit and consumes nothing. Any other error is a failure of the store's
// backend. A denial is a Decision with Allowed false, never an error.
//
// Implementations are safe for concurrent use.
type Store interface {
	Apply(ctx context.Context, req Request) (Decision, error)
}

// Request is one decision asked of a Store.
type Request struct {
	Algorithm *Algorithm
	Key       string // any string, the empty one included; two different strings never share state
	Rule      Rule
	N         int64 // events to admit (or to refund), all or none
	Op        Op    // Take unless said otherwise
}

// Op is what a Request does to its key.
type Op uint8

const (
	// Take admits N events, all or none: AllowN. The zero Op.
	Take Op = iota
	// Peek gives the Decision Take would give, and changes nothing.
	Peek
	// Refund gives back N events taken before (a request the upstream failed, say), never
	// above the key's full allowance. Its Decision is what Peek with N = 1 gives after it.
	Refund
	// Reset forgets the key: its next decision sees it full. Its Decision is what Peek
	// with N = 1 gives after it.
	Reset
)

func (o Op) String() string {
	switch o {
	case Take:
		return "take"
	case Peek:
		return "peek"
	case Refund:
		return "refund"
	case Reset:
		return "reset"
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Algorithm is one rate-limiting algorithm as stores see it: the integers it needs from a
// rule, its decision step in Go, and the same step as a Lua script. Stores keep one state
// per (Algorithm, key), so limiters of different algorithms can share a store and keys.
//
// The five algorithms of this module each export theirs from their package.
type Algorithm struct {
	// Name is short and stable ("tokenbucket"); stores may use it in their keys.
	Name string

	// Script is the Lua source of the step, for stores that run it server-side: given the
	// Args as ARGV (N, Limit, Period, Unit, Rate, then the time in microseconds or an empty
	// string for the server's clock, then the Op: "take" or empty, "peek", "refund" or
	// "reset"), it reads and writes the state in KEYS and returns {allowed (0 or 1),
	// remaining, retry after, reset after, delay}, durations in microseconds. Its state
	// is back to full, and may expire, after reset after.
	Script string

	// ScriptKeys names the keys the Script uses for one limiter key, in the order of KEYS.
	// A store maps each (name, limiter key) to one of its own keys, all in one hash slot.
	ScriptKeys []string

	// Prepare validates rule and n and derives the integers one decision needs. Its
	// errors wrap ErrInvalidRule, ErrInvalidN or ErrNExceedsLimit.
	Prepare func(rule Rule, n int64) (Args, error)

	// Step decides one request against st at now (microseconds since the Unix epoch) and
	// updates st. It is a pure function of its inputs, and the Script computes the same.
	// Args must come from Prepare.
	Step func(st *State, now int64, a Args) Decision

	// Refund gives a.N events back to st at now, never above its full allowance.
	Refund func(st *State, now int64, a Args)
}

// Ops other than Take are asked of a store with the same Args; Peek is Step on a copy of
// the state, Reset is the zero State.

// Args are the integers one decision needs, as Algorithm.Prepare derives them from a Rule
// and n. Stores hand them unchanged to Step, or to the script, so both compute the same.
type Args struct {
	N      int64 // events asked for
	Limit  int64 // Decision.Limit: the most ever allowed at once
	Period int64 // Rule.Period in microseconds
	Unit   int64 // algorithm-defined (the size of one event in Level's units, or a tick)
	Rate   int64 // algorithm-defined (Level's units gained or drained per microsecond)
}

// State is one key's state as a Store keeps it for Step. The zero State is a key never
// seen, and a state whose last Decision had ResetAfter 0 is worth no more than the zero
// State, so a store may drop it. The meaning of the fields is the algorithm's.
type State struct {
	Time  int64 // the latest instant the key has seen, in microseconds since the Unix epoch
	Level int64 // tokens, queued work, or events counted, in the algorithm's units
	Aux   int64 // a second number: the unit of Level, or the previous window's count
	Log   *Log  // the events of a sliding log; nil for the other algorithms
}

// Clone returns a deep copy of s.
func (s State) Clone() State {
	if s.Log != nil {
		l := s.Log.clone()
		s.Log = &l
	}
	return s
}

// Event is n events admitted at one instant (microseconds since the Unix epoch).
type Event struct {
	At, N int64
}

// Log is a queue of Events in time order, grown as needed and never shrunk below what it
// holds: the sliding log's state. The zero Log is empty and ready to use.
type Log struct {
	buf        []Event
	head, size int
}

// Len is the number of entries.
func (l *Log) Len() int { return l.size }

// At is the i-th entry, the oldest being 0.
func (l *Log) At(i int) Event { return l.buf[(l.head+i)%len(l.buf)] }

// Push appends n events at instant at, merged into the newest entry when it has the same
// instant. Instants must not decrease.
func (l *Log) Push(at, n int64) {
	if l.size > 0 {
		last := &l.buf[(l.head+l.size-1)%len(l.buf)]
		if last.At == at {
			last.N += n
			return
		}
	}
	if l.size == len(l.buf) {
		l.grow()
	}
	l.buf[(l.head+l.size)%len(l.buf)] = Event{At: at, N: n}
	l.size++
}

// Clear empties the Log, keeping its memory.
func (l *Log) Clear() { l.head, l.size = 0, 0 }

// TrimNewest removes up to n events from the newest entries and returns how many it
// removed.
func (l *Log) TrimNewest(n int64) int64 {
	removed := int64(0)
	for removed < n && l.size > 0 {
		last := &l.buf[(l.head+l.size-1)%len(l.buf)]
		take := min(n-removed, last.N)
		last.N -= take
		removed += take
		if last.N == 0 {
			l.size--
		}
	}
	return removed
}

// Pop removes the oldest entry and returns it; the Log must not be empty.
func (l *Log) Pop() Event {
	e := l.buf[l.head]
	l.head = (l.head + 1) % len(l.buf)
	l.size--
	return e
}

func (l *Log) grow() {
	buf := make([]Event, max(4, 2*len(l.buf)))
	for i := 0; i < l.size; i++ {
		buf[i] = l.At(i)
	}
	l.buf, l.head = buf, 0
}

func (l *Log) clone() Log {
	c := Log{buf: make([]Event, l.size), size: l.size}
	for i := range c.buf {
		c.buf[i] = l.At(i)
	}
	return c
}
