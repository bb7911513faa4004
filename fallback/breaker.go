package fallback

import (
	"sync/atomic"
	"time"

	"github.com/ratelimit-go/ratelimit/clock"
)

// BreakerState is the state of the breaker around the primary store.
type BreakerState int32

const (
	// Closed: decisions go to the primary.
	Closed BreakerState = iota
	// Open: decisions go to the secondary, and none waits for the primary.
	Open
	// HalfOpen: one probe goes to the primary; the others go to the secondary until it
	// answers. A success closes the breaker, a failure opens it again.
	HalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// Breaker configures the circuit breaker. A zero field means its default.
type Breaker struct {
	// Failures is how many consecutive failures of the primary open the breaker (5).
	Failures int
	// OpenFor is how long the breaker stays open before it lets a probe through (1s).
	OpenFor time.Duration
}

// breaker is a consecutive-failure circuit breaker. Closed, it costs one atomic load per
// call and reads no clock. Only failures, and calls while open, read the clock.
type breaker struct {
	state    atomic.Int32
	failures atomic.Int64 // consecutive, while closed
	openedAt atomic.Int64 // UnixNano on clock when it last opened
	limit    int64
	openFor  time.Duration
	clock    clock.Clock
	onChange func(from, to BreakerState)
}

// allow says whether a call may go to the primary, and whether it is the half-open probe.
func (b *breaker) allow() (ok, probe bool) {
	switch BreakerState(b.state.Load()) {
	case Closed:
		return true, false
	case Open:
		if clock.UnixNano(b.clock)-b.openedAt.Load() < int64(b.openFor) {
			return false, false
		}
		if b.move(Open, HalfOpen) { // one caller wins the probe
			return true, true
		}
	}
	return false, false
}

// success records a decision of the primary.
func (b *breaker) success(probe bool) {
	if probe {
		b.failures.Store(0)
		b.move(HalfOpen, Closed)
	} else if b.failures.Load() != 0 {
		b.failures.Store(0)
	}
}

// failure records that the primary was unavailable.
func (b *breaker) failure(probe bool) {
	if probe {
		b.openedAt.Store(clock.UnixNano(b.clock))
		b.move(HalfOpen, Open)
		return
	}
	if b.failures.Add(1) >= b.limit && BreakerState(b.state.Load()) == Closed {
		b.openedAt.Store(clock.UnixNano(b.clock))
		b.move(Closed, Open)
	}
}

// abandon gives the probe back when its caller gave up, so that the next call probes.
func (b *breaker) abandon(probe bool) {
	if probe {
		b.move(HalfOpen, Open) // openedAt unchanged: the open period is already over
	}
}

// retryAfter is how long until the breaker next lets a probe through, at least 1ms.
func (b *breaker) retryAfter() time.Duration {
	if BreakerState(b.state.Load()) == Closed {
		return b.openFor
	}
	left := time.Duration(b.openedAt.Load()+int64(b.openFor)-clock.UnixNano(b.clock)) + time.Millisecond - 1
	return max(time.Millisecond, left.Truncate(time.Millisecond))
}

func (b *breaker) move(from, to BreakerState) bool {
	if !b.state.CompareAndSwap(int32(from), int32(to)) {
		return false
	}
	if b.onChange != nil {
		b.onChange(from, to)
	}
	return true
}
