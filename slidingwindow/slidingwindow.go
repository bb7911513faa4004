// Package slidingwindow is the sliding window counter. It keeps two fixed windows,
// aligned to multiples of Period since the Unix epoch. The previous window's count is
// weighted by how much of it still overlaps the sliding window:
//
//	estimate = previous * (1 - elapsed/Period) + current
//
// n events are allowed when estimate + n <= Limit. It smooths away the fixed window's 2x
// burst at a boundary, at the cost of one more counter. It assumes the previous window's
// events were spread evenly. Burst is ignored.
//
// Take Limit 100 per minute, 80 events in the previous window and 30 in the current one,
// 15 seconds in. The estimate is 80 * 0.75 + 30 = 90, so a request is allowed.
//
// elapsed is counted in whole milliseconds. It is whole microseconds when Period is not a
// whole number of milliseconds. Limit times Period in those ticks must not exceed 2^52.
// That allows about 52 million per day, or 1.25 billion per hour.
//
// In a Decision, Limit is the limit. Remaining is Limit - ceil(estimate), at least 0.
// RetryAfter is the exact time until the estimate has room for n. ResetAfter is the time
// until the estimate is 0.
//
// A refund takes a take's events off the count they were counted in
// (AlgorithmLimiter.Charge). That is the current window or the previous one, whose weight
// then falls with it. A take two windows old gives nothing back. A debit counts past what
// the estimate allows (AlgorithmLimiter.Debit). The key then denies until the estimate has
// room again.
package slidingwindow

import (
	_ "embed"

	"fmt"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Limiter is a sliding window counter limiter over a Store: two counters per key, all under
// one Rule. Its methods are ratelimit.AlgorithmLimiter's, which every algorithm's
// limiter is. It is safe for concurrent use.
type Limiter = ratelimit.AlgorithmLimiter

// New returns a slidingwindow limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce, and an error for a nil store.
// Its keys are in the rule's namespace unless ratelimit.WithNamespace names one.
func New(store ratelimit.Store, rule ratelimit.Rule, opts ...ratelimit.Option) (*Limiter, error) {
	return ratelimit.NewAlgorithmLimiter(store, algorithm, rule, opts...)
}

// Algorithm is the sliding window counter as stores see it.
func Algorithm() *core.Algorithm { return algorithm }

// advance brings st to now, or to the latest instant it has seen while it counts events,
// shifting the windows that have passed, and returns the start of that instant's window:
// one division, where telling the windows of both instants apart took two.
func advance(st *core.State, now int64, a core.Args) (start int64) {
	st.Level, st.Aux = min(st.Level, a.Limit), min(st.Aux, a.Limit)
	if by := core.Rewind(st, now, a.Period); by > 0 {
		core.SetFloor(st, st.Time+by) // the counts moved back: the takes before are of another moment
	}
	counts := st.Level > 0 || st.Aux > 0
	t := now
	if counts || st.Time != 0 {
		t = max(st.Time, now)
	}
	start = mathx.FloorDiv(t, a.Period) * a.Period
	if counts {
		switch {
		case st.Time >= start: // the same window
		case st.Time >= start-a.Period: // the one before
			st.Aux, st.Level = st.Level, 0
		default:
			st.Aux, st.Level = 0, 0
		}
	}
	st.Time = t
	return start
}

func step(st *core.State, now int64, a core.Args) core.Outcome {
	start := advance(st, now, a)
	t := st.Time
	// the ticks in a window, and the whole ticks into this one; a tick of a millisecond
	// (a period in whole milliseconds, the usual rule) divides by a constant, which the
	// compiler turns into a multiplication
	ticks, elapsed := a.Period, t-start
	switch a.Unit {
	case 1:
	case 1000:
		ticks, elapsed = a.Period/1000, elapsed/1000
	default:
		ticks, elapsed = a.Period/a.Unit, elapsed/a.Unit
	}
	weighted := st.Aux * (ticks - elapsed)

	// estimate + n + keep <= Limit, multiplied through by ticks
	allowed, retry := false, int64(0)
	if need := a.N + a.Keep; st.Level+need <= a.Limit && weighted+(st.Level+need)*ticks <= a.Limit*ticks {
		st.Level += a.N
		allowed = true
	} else {
		retry = retryAt(st, start, ticks, need, a) - now
	}
	// Remaining is 0 after a denied n of 1 without a reserve, without its division: the
	// estimate exceeds Limit - 1, so ceil(weighted / ticks) >= Limit - Level
	remaining := int64(0)
	if allowed || a.N > 1 || a.Keep > 0 {
		remaining = max(0, a.Limit-st.Level-mathx.CeilDiv(weighted, ticks)-a.Keep)
	}
	reset := int64(0)
	switch {
	case st.Level > 0:
		reset = start + 2*a.Period - now
	case st.Aux > 0:
		reset = start + a.Period - now
	}
	return a.Outcome(allowed, remaining, mathx.Micros(retry), mathx.Micros(reset))
}

// debit counts n events in the current window whatever it holds, up to Limit (a window
// counts no more), and returns the time until the estimate is 0: two windows from the
// start of this one.
func debit(st *core.State, now int64, a core.Args) int64 {
	start := advance(st, now, a)
	st.Level = min(st.Level+min(a.N, a.Limit), a.Limit)
	return start + 2*a.Period - now
}

// refund takes n events off the count of the window the take at a.Taken was counted in,
// the current one or the previous one, down to 0 (and none for a take before the key's
// floor).
func refund(st *core.State, now int64, a core.Args) int64 {
	start := advance(st, now, a)
	if a.Taken <= core.Floor(st) || a.Taken > st.Time {
		return 0
	}
	var gave int64
	switch taken := mathx.FloorDiv(a.Taken, a.Period) * a.Period; taken {
	case start:
		gave = min(a.N, max(0, st.Level))
		st.Level -= gave
	case start - a.Period:
		gave = min(a.N, max(0, st.Aux))
		st.Aux -= gave
	}
	return gave
}

// void leaves a reset key empty, with a floor at its latest instant until the next
// window ends: a take before it may be counted in the current window or, then, the
// previous one. A key that counts nothing keeps nothing, unless a floor of this window or
// the previous one is there (an earlier reset's, which a second one keeps).
func void(st *core.State, now int64, a core.Args) int64 {
	start := advance(st, now, a)
	if st.Level == 0 && st.Aux == 0 && mathx.FloorDiv(core.Floor(st), a.Period)*a.Period < start-a.Period {
		return 0
	}
	core.VoidCounts(st)
	return (mathx.FloorDiv(st.Time, a.Period)+2)*a.Period - now
}

// retryAt is the first instant at which a request denied in the window starting at start
// fits with need (its n and what it must leave): previous * (ticks - e) <= room * ticks,
// where room is what the current window leaves, solved for the tick e, in this window if
// room >= 0, else in the next; for a need above Limit, which never fits, the end of the
// next window, when the key is empty.
func retryAt(st *core.State, start, ticks, need int64, a core.Args) int64 {
	prev, room := st.Aux, a.Limit-st.Level-need
	if room < 0 { // wait for the next window, where this one's count is the previous one
		start += a.Period
		prev, room = st.Level, a.Limit-need
		if room < 0 { // more than Limit less its reserve: never; say when the key is empty
			return start + a.Period
		}
	}
	e := ticks - room*ticks/prev
	return start + e*a.Unit
}

// prepare sets Unit to the tick in which elapsed time is weighed, in microseconds.
func prepare(rule core.Rule, n int64) (core.Args, error) {
	period, err := core.Micros(name, rule)
	if err != nil {
		return core.Args{}, err
	}
	tick := int64(1)
	if rule.Period%time.Millisecond == 0 {
		tick = 1000
	}
	if rule.Limit > mathx.MaxExact/(period/tick) {
		return core.Args{}, fmt.Errorf("%s: %v: %w: limit %d is too large to weigh exactly over %v",
			name, rule, ratelimit.ErrInvalidRule, rule.Limit, rule.Period)
	}
	if err := core.CheckN(name, n, rule.Limit); err != nil {
		return core.Args{}, err
	}
	return core.Args{N: n, Limit: rule.Limit, Period: period, Unit: tick}, nil
}

const name = "slidingwindow"

// algorithm is the algorithm of slidingwindow as Algorithm returns it: its step in Go above,
// in Lua in slidingwindow.lua (for redisstore).
//
// The State of a key: Level is the current window's count, Aux the previous window's, Time the latest
// instant, kept while the state is; counts above a lowered Limit are capped at it. A
// reset leaves a floor in Log until the next window ends: the receipts of the takes
// before it give nothing back.
var algorithm = &core.Algorithm{Name: name, Script: script, ScriptKeys: []string{"state"}, Prepare: prepare, Step: step, Refund: refund, Debit: debit, Void: void, Lendable: true, Windowed: true}

//go:embed slidingwindow.lua
var script string
