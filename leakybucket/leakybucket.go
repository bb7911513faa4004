// Package leakybucket is the leaky bucket as a queue. Requests join a queue of Burst
// places, or Limit when Burst is 0. The queue drains at Limit per Period, one request
// every interval of Period/Limit. An admitted request gets a Delay, its wait in the
// queue. A caller that waits it out turns any burst into an evenly paced stream
// (ratelimit.Wait does). A request that finds the queue full is denied. Choose it to
// shape traffic towards a fragile upstream, not merely to cap it.
//
// The k-th request of a burst gets a Delay of k intervals, counting from 0. At most Burst
// requests are pending at once, the one leaking now included. Take Limit 2 per second
// and Burst 3. Five requests at once get Delays 0, 500ms and 1s. The 4th and 5th are
// denied with RetryAfter 500ms. 500ms later, one more is admitted with Delay 1s. AllowN
// takes n places at once. Its Delay is the wait until the first of them leaks.
//
// In a Decision, Limit is the queue size and Remaining the free places. RetryAfter is
// the time until enough places free. ResetAfter is the time until the queue is empty.
//
// A refund takes a take's requests out of the queue (AlgorithmLimiter.Charge). It takes
// no more than the queue still holds of them. That is never more than the least work the
// queue has held since the take. A queue that emptied since holds none of it.
//
// It takes no debts. A debit would queue requests that are already served. So
// AlgorithmLimiter.Debit returns an error wrapping errors.ErrUnsupported. Charge such
// costs to a token bucket or a window.
package leakybucket

import (
	_ "embed"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Limiter is a leaky bucket limiter over a Store: one queue per key, all under
// one Rule. Its methods are ratelimit.AlgorithmLimiter's, which every algorithm's
// limiter is. It is safe for concurrent use.
type Limiter = ratelimit.AlgorithmLimiter

// New returns a leakybucket limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce, and an error for a nil store.
// Its keys are in the rule's namespace unless ratelimit.WithNamespace names one.
func New(store ratelimit.Store, rule ratelimit.Rule, opts ...ratelimit.Option) (*Limiter, error) {
	return ratelimit.NewAlgorithmLimiter(store, algorithm, rule, opts...)
}

// Algorithm is the leaky bucket as stores see it.
func Algorithm() *core.Algorithm { return algorithm }

// advance brings st to now, or to the latest instant it has seen, and returns how far that
// is ahead of now.
func advance(st *core.State, now int64, a core.Args) (lag int64) {
	full := a.Limit * a.Unit
	switch st.Aux {
	case a.Unit:
		st.Level = min(st.Level, full)
	case 0: // a key never seen, or reset (whose time is the reset's): an empty queue
		st.Level, st.Aux = 0, a.Unit
		if st.Time == 0 {
			st.Time = now
		}
	default: // the rule's unit changed: keep the queued requests whole
		st.Level = min(mathx.CeilDiv(st.Level, st.Aux), a.Limit) * a.Unit
		st.Aux = a.Unit
		st.Log = nil // the work of another unit: no earlier take is refunded
	}
	if by := core.Rewind(st, now, a.Period); by > 0 {
		core.VoidDeficits(st, st.Time+by) // the takes before are of another moment
	}
	t := max(st.Time, now)
	if elapsed := t - st.Time; elapsed > 0 {
		st.Level = full - mathx.AddCapped(full-st.Level, elapsed, a.Rate, full)
		st.Time = t
	}
	if st.Level == 0 {
		core.ForgetDeficits(st, t)
	}
	if a.Taken == core.TakenNow {
		t = core.ReceiptAt(st, t)
		st.Time = t
	}
	return t - now
}

func step(st *core.State, now int64, a core.Args) core.Outcome {
	lag := advance(st, now, a)
	full := a.Limit * a.Unit
	allowed, wait := false, int64(0) // the Delay when allowed, the RetryAfter when denied
	need := (a.N + a.Keep) * a.Unit  // the slots it takes, and those it must leave
	if st.Level+need <= full {
		allowed, wait = true, lag+mathx.CeilDiv(st.Level, a.Rate)
		core.NoteRise(st, st.Time, st.Level)
		st.Level += a.N * a.Unit
	} else {
		wait = lag + mathx.CeilDiv(st.Level+need-full, a.Rate)
	}
	reset := int64(0)
	if st.Level > 0 {
		reset = lag + mathx.CeilDiv(st.Level, a.Rate)
	}
	return a.Outcome(allowed, max(0, (full-st.Level)/a.Unit-a.Keep), mathx.Micros(wait), mathx.Micros(reset))
}

// refund takes the n requests of the take at a.Taken out of the queue (they did not go
// after all), as far as the queue still holds their work: no more than the least it has
// held since.
func refund(st *core.State, now int64, a core.Args) int64 {
	advance(st, now, a)
	give := min(a.N*a.Unit, core.LeastDeficit(st, a.Taken, st.Level))
	if give <= 0 {
		return 0
	}
	st.Level -= give
	core.NoteRefund(st, a.Taken, st.Time, give, st.Level)
	return give / a.Unit
}

// void leaves a reset queue empty, with a record that gives nothing back to the takes
// before, for a period (see the token bucket's); a queue empty already keeps nothing.
func void(st *core.State, now int64, a core.Args) int64 {
	advance(st, now, a)
	if st.Level == 0 && !core.Recording(st) {
		return 0
	}
	core.VoidBucket(st)
	return a.Period
}

// prepare rejects a rule whose queue in units of 1/Unit request exceeds 2^52, as the
// token bucket does for its capacity.
func prepare(rule core.Rule, n int64) (core.Args, error) {
	return core.BucketArgs(name, rule, n)
}

const name = "leakybucket"

// algorithm is the algorithm of leakybucket as Algorithm returns it: its step in Go above,
// in Lua in leakybucket.lua (for redisstore).
//
// The State of a key: Level is the queued work in units of 1/Unit request, Aux is that Unit. When a
// rule changes the unit, queued requests are kept whole, at most the new queue size, and
// no earlier take is refunded. Log, from a take with a Receipt until the queue is next
// forgotten, is the record of the least work it has held since each instant
// (internal/core's record of deficits).
var algorithm = &core.Algorithm{Name: name, Script: script, ScriptKeys: []string{"state"}, Prepare: prepare, Step: step, Refund: refund, Void: void}

//go:embed leakybucket.lua
var script string
