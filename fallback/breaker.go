package fallback

import (
	"sync"
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
	// HalfOpen: one probe goes to the primary. The others go to the secondary until it
	// answers. A success closes the breaker, and a failure opens it again.
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
//
// The breaker opens when at least MinCalls calls of the primary ended in the last
// Window, and at least FailureRate of them failed. A call fails when it returns an error
// wrapping ratelimit.ErrUnavailable, or stays unanswered for Unanswered.
//
// Under a CPU spike, callers time out together. A rate over a window keeps such a burst
// from opening the breaker. Timeouts without an error open it only once they last into a
// second tenth of the Window. A burst of them within a tenth does not open it, even with
// no answer beside them. That is the process starved of CPU as a load starts.
type Breaker struct {
	// FailureRate is the share of failed calls that opens the breaker, in (0, 1] (0.5).
	FailureRate float64
	// MinCalls is how many calls the window must hold before its rate counts (20).
	MinCalls int
	// Window is how far back calls count (1s).
	Window time.Duration
	// OpenFor is how long the breaker stays open before it lets a probe through (1s).
	OpenFor time.Duration
	// Unanswered is how long a call of the primary may go unanswered before it counts
	// as a failure (100ms). It is never less than the timeout's maximum (WithMaxTimeout).
	// A call the decision stopped waiting for at the timeout may still be answered within
	// Unanswered. That is a slow primary, not a failed one, and counts as an answer.
	Unanswered time.Duration
}

// slices is how many slices of Breaker.Window the breaker counts calls in. They age out
// one by one, and a burst of timeouts within one slice does not open it (see tripped).
const slices = 10

// breaker is a failure-rate circuit breaker. Closed, a call costs a clock read and two
// atomic adds; the rate is summed only when a call fails.
type breaker struct {
	state    atomic.Int32
	openedAt atomic.Int64 // UnixNano on clock when it last opened
	rate     float64
	minCalls int64
	slice    int64 // Window / slices, in nanoseconds
	openFor  time.Duration
	// how long a call may go unanswered before it counts as a failure (Breaker.Unanswered)
	unanswered time.Duration
	clock      clock.Clock
	onChange   func(from, to BreakerState)
	mu         sync.Mutex // held to start a new slice
	window     [slices]struct {
		start           atomic.Int64 // which slice of time it counts (UnixNano / slice)
		calls, failures atomic.Int64
		errors          atomic.Int64 // the failures that were errors, not timeouts
	}
}

// callResult is how a call of the primary ended, for the breaker.
type callResult int

const (
	answered callResult = iota
	timedOut            // no answer within the timeout: down, or slow for a moment
	failed              // an error wrapping ratelimit.ErrUnavailable: down
)

// record counts a call of the primary that ended at now.
func (b *breaker) record(now int64, o callResult) {
	i := now / b.slice
	w := &b.window[i%slices]
	if w.start.Load() != i {
		b.mu.Lock()
		if w.start.Load() != i {
			w.calls.Store(0)
			w.failures.Store(0)
			w.start.Store(i)
		}
		b.mu.Unlock()
	}
	w.calls.Add(1)
	if o != answered {
		w.failures.Add(1)
	}
	if o == failed {
		w.errors.Add(1)
	}
}

// tripped reports whether the window's failure rate opens the breaker at now. Timeouts
// alone open it only once they have lasted into a second slice of the window: a burst of
// them within one tenth of it is the process starved of CPU for a moment (a load's
// start, a pause), more likely than a Redis that went away; an error says so at once.
func (b *breaker) tripped(now int64) bool {
	i := now / b.slice
	var calls, failures, errs, failing int64
	for j := range b.window {
		w := &b.window[j]
		if s := w.start.Load(); s > i-slices && s <= i {
			calls += w.calls.Load()
			f := w.failures.Load()
			failures += f
			errs += w.errors.Load()
			if f > 0 {
				failing++
			}
		}
	}
	return calls >= b.minCalls && float64(failures) >= b.rate*float64(calls) && (errs > 0 || failing >= 2)
}

// forget clears the window, when the breaker closes: the failures before it are history.
func (b *breaker) forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for j := range b.window {
		b.window[j].start.Store(-1)
	}
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
		b.forget()
		b.move(HalfOpen, Closed)
		return
	}
	b.record(clock.UnixNano(b.clock), answered)
}

// failure records that the primary was unavailable (o is timedOut or failed).
func (b *breaker) failure(probe bool, o callResult) {
	now := clock.UnixNano(b.clock)
	if probe {
		b.openedAt.Store(now)
		b.move(HalfOpen, Open)
		return
	}
	b.record(now, o)
	if BreakerState(b.state.Load()) == Closed && b.tripped(now) {
		b.openedAt.Store(now)
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
