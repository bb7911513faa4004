// Package clock provides the clocks the stores read. It has the system clock, a
// monotonic one, a fake one for tests, and a coarse one that trades precision for speed.
package clock

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock tells the time.
type Clock interface {
	Now() time.Time
}

// Real is the system clock, time.Now. Its zero value is ready to use.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Monotonic is the wall time at its creation plus the monotonic time elapsed since.
// It never jumps. It does not follow steps of the system clock, such as an administrator
// or NTP setting the time. It follows only the clock's rate. It reads one clock where
// time.Now reads two.
//
// A Monotonic is safe for concurrent use. The zero value is not usable: call
// NewMonotonic.
type Monotonic struct {
	base     time.Time // with its monotonic reading, which time.Since uses
	baseNano int64
}

// NewMonotonic returns a Monotonic clock that starts at time.Now().
func NewMonotonic() Monotonic {
	now := time.Now() // not rounded: rounding would strip the monotonic reading
	return Monotonic{base: now, baseNano: now.UnixNano()}
}

// Now returns the wall time at creation plus the monotonic time since.
func (m Monotonic) Now() time.Time { return m.base.Add(time.Since(m.base)) }

// Start is the instant the clock started at, with its monotonic reading.
// Now() is Start().Add(time.Since(Start())).
func (m Monotonic) Start() time.Time { return m.base }

// UnixNano is Now().UnixNano(), without building a time.Time.
func (m Monotonic) UnixNano() int64 { return m.baseNano + int64(time.Since(m.base)) }

// UnixNano is c.Now().UnixNano(). It is cheaper for a Monotonic or a Coarse clock.
func UnixNano(c Clock) int64 {
	switch c := c.(type) {
	case Monotonic:
		return c.UnixNano()
	case *Coarse:
		return c.UnixNano()
	}
	return c.Now().UnixNano()
}

// Fake is a clock that moves only when told to. It is safe for concurrent use.
// The zero value stands at the zero time.Time.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a Fake clock standing at start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the clock by d, which may be negative.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// Set moves the clock to t, which may be earlier than now.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
}

// Coarse is a clock that reads the system clock once per resolution, in a goroutine of
// its own. Its Now takes a few nanoseconds, against tens for Monotonic and time.Now.
//
// Now lags real time by up to resolution, and so do the decisions made on it. A client
// that waits exactly RetryAfter may be denied once more, up to resolution later.
//
// Stop ends the goroutine. After Stop, Now keeps returning the last time read.
type Coarse struct {
	// nanos is the time of the last tick. Now is one atomic load of it, where a read of
	// the system clock costs tens of nanoseconds: go test -run '^$' -bench Read ./clock.
	nanos atomic.Int64
	stop  chan struct{}
	once  sync.Once
}

// NewCoarse starts a Coarse clock that ticks every resolution, and returns it.
// A resolution under 100µs counts as 100µs. A millisecond is a good choice.
func NewCoarse(resolution time.Duration) *Coarse {
	resolution = max(resolution, 100*time.Microsecond)
	c := &Coarse{stop: make(chan struct{})}
	c.nanos.Store(time.Now().UnixNano())
	go c.run(resolution)
	return c
}

func (c *Coarse) run(resolution time.Duration) {
	t := time.NewTicker(resolution)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.nanos.Store(now.UnixNano())
		}
	}
}

// Now returns the time read at the last tick.
func (c *Coarse) Now() time.Time { return time.Unix(0, c.nanos.Load()) }

// UnixNano is Now().UnixNano(), without building a time.Time.
func (c *Coarse) UnixNano() int64 { return c.nanos.Load() }

// Stop stops the ticking goroutine. It is safe to call more than once.
func (c *Coarse) Stop() { c.once.Do(func() { close(c.stop) }) }
