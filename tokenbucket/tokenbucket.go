// Package tokenbucket is the token bucket. A bucket holds Burst tokens, or Limit when
// Burst is 0. It refills continuously at Limit per Period, and starts full. An event
// takes a token, and AllowN takes n tokens or none. The bucket allows bursts up to its
// capacity and a long-run rate of Limit per Period. It is the usual choice for APIs.
//
// Take capacity 10 and 2 tokens per second. 15 requests at once admit 10 and deny 5.
// Each denied request is told to retry after 500ms. 3 seconds later, 5 more are all
// admitted and 1 token is left.
//
// In a Decision, Limit is the capacity and Remaining the whole tokens left. RetryAfter
// is (n - tokens) / rate, and ResetAfter is (capacity - tokens) / rate. Delay is 0.
//
// A refund puts a take's tokens back (AlgorithmLimiter.Charge). It gives back no more
// than the bucket would still hold. That is never above the capacity, and never more than
// the least the bucket has lacked of full since the take. Take capacity 100 at 100 a
// minute, with 100 taken at 0:00 and refunded at 1:00. The bucket was full again at 1:00,
// so nothing comes back.
//
// A debit takes tokens whatever the bucket holds, even below empty
// (AlgorithmLimiter.Debit). Take 10 a second, and a debit of 25 on a full bucket of 10.
// The bucket then holds -15. A request of 1 is told to retry after 1.6s, when it has
// earned 16 back.
package tokenbucket

import (
	_ "embed"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Limiter is a token bucket limiter over a Store: one bucket per key, all under
// one Rule. Its methods are ratelimit.AlgorithmLimiter's, which every algorithm's
// limiter is. It is safe for concurrent use.
type Limiter = ratelimit.AlgorithmLimiter

// New returns a tokenbucket limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce, and an error for a nil store.
// Its keys are in the rule's namespace unless ratelimit.WithNamespace names one.
func New(store ratelimit.Store, rule ratelimit.Rule, opts ...ratelimit.Option) (*Limiter, error) {
	return ratelimit.NewAlgorithmLimiter(store, algorithm, rule, opts...)
}

// Algorithm is the token bucket as stores see it.
func Algorithm() *core.Algorithm { return algorithm }

// advance brings st to now, or to the latest instant it has seen, and returns how far that
// is ahead of now.
func advance(st *core.State, now int64, a core.Args) (lag int64) {
	full := a.Limit * a.Unit
	switch st.Aux {
	case a.Unit:
		st.Level = min(st.Level, full)
	case 0: // a key never seen, or reset (whose time is the reset's): a full bucket
		st.Level, st.Aux = full, a.Unit
		if st.Time == 0 {
			st.Time = now
		}
	default: // the rule's unit changed: keep the whole tokens
		st.Level = min(mathx.FloorDiv(st.Level, st.Aux), a.Limit) * a.Unit // a debt's fraction rounded down
		st.Aux = a.Unit
		st.Log = nil // the deficits of another unit: no earlier take is refunded
	}
	if by := core.Rewind(st, now, a.Period); by > 0 {
		core.VoidDeficits(st, st.Time+by) // the takes before are of another moment
	}
	t := max(st.Time, now)
	if elapsed := t - st.Time; elapsed > 0 {
		st.Level = mathx.AddCapped(st.Level, elapsed, a.Rate, full)
		st.Time = t
	}
	if st.Level == full {
		core.ForgetDeficits(st, t)
	}
	if a.Taken == core.TakenNow {
		t = core.ReceiptAt(st, t)
		st.Time = t
	}
	return t - now
}

func step(st *core.State, now int64, a core.Args) core.Outcome {
	full := a.Limit * a.Unit
	level, t := st.Level, st.Time
	if st.Aux == a.Unit && t < now && st.Log == nil && a.Taken == 0 { // the common case: advance as advance does, on locals
		level = mathx.AddCapped(min(level, full), now-t, a.Rate, full)
		t = now
	} else {
		advance(st, now, a)
		level, t = st.Level, st.Time
	}
	st.Time = t
	lag := t - now
	allowed, retry := false, int64(0)
	take := a.N * a.Unit
	if need := take + a.Keep*a.Unit; level >= need {
		core.NoteRise(st, t, full-level)
		level -= take
		allowed = true
	} else {
		retry = lag + mathx.CeilDiv(need-level, a.Rate)
	}
	st.Level = level
	reset := int64(0)
	if level < full {
		reset = lag + mathx.CeilDiv(full-level, a.Rate)
	}
	remaining := int64(0)
	if level > 0 { // a debit may take it below 0
		remaining = max(0, int64(uint64(level)/uint64(a.Unit))-a.Keep) // both positive: an unsigned division is cheaper
	}
	return a.Outcome(allowed, remaining, mathx.Micros(retry), mathx.Micros(reset))
}

// debit takes n tokens whatever the bucket holds, to no deeper than mathx.MaxExact units
// below empty, and returns the time until it is full again.
func debit(st *core.State, now int64, a core.Args) int64 {
	lag := advance(st, now, a)
	take := int64(2 * mathx.MaxExact) // past the deepest debt: as the script's doubles have it
	if a.N <= take/a.Unit {
		take = a.N * a.Unit
	}
	core.NoteRise(st, st.Time, a.Limit*a.Unit-st.Level)
	st.Level = max(st.Level-take, -mathx.MaxExact)
	return lag + mathx.CeilDiv(a.Limit*a.Unit-st.Level, a.Rate)
}

// refund puts back the n tokens of the take at a.Taken, as far as the bucket would still
// hold them: no more than the least it has lacked of full since.
func refund(st *core.State, now int64, a core.Args) int64 {
	advance(st, now, a)
	lack := a.Limit*a.Unit - st.Level
	give := min(a.N*a.Unit, core.LeastDeficit(st, a.Taken, lack))
	if give <= 0 {
		return 0
	}
	st.Level += give
	core.NoteRefund(st, a.Taken, st.Time, give, lack-give)
	return give / a.Unit
}

// void leaves a reset bucket full, with a record of deficits that gives nothing back to
// the takes before, for a period (a take with a receipt in the same microsecond, on a
// clock that stands still, would otherwise start a record that counts older receipts as
// its own); a bucket full already keeps nothing.
func void(st *core.State, now int64, a core.Args) int64 {
	advance(st, now, a)
	if st.Level == a.Limit*a.Unit && !core.Recording(st) {
		return 0
	}
	core.VoidBucket(st)
	return a.Period
}

// prepare rejects a rule whose capacity in units of 1/Unit token exceeds 2^52: with
// the Period in microseconds reduced by the gcd of Limit and Period, that allows, for
// example, a capacity of 4.5 billion at 1 per second and of 52 million at 1 per day.
func prepare(rule core.Rule, n int64) (core.Args, error) {
	return core.BucketArgs(name, rule, n)
}

const name = "tokenbucket"

// algorithm is the algorithm of tokenbucket as Algorithm returns it: its step in Go above,
// in Lua in tokenbucket.lua (for redisstore).
//
// The State of a key: Level is the tokens in units of 1/Unit token (below 0 after a debit), Aux is
// that Unit. When a rule changes the unit, the whole tokens are kept and the fraction
// dropped (a debt's rounded up), and no earlier take is refunded. Log, from a take with a
// Receipt until the bucket is next forgotten, is the record of the least it has lacked of
// full since each instant (internal/core's record of deficits).
var algorithm = &core.Algorithm{Name: name, Script: script, ScriptKeys: []string{"state"}, Prepare: prepare, Step: step, Refund: refund, Debit: debit, Void: void, Lendable: true}

//go:embed tokenbucket.lua
var script string
