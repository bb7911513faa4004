// Package fixedwindow is the fixed window counter. Time is cut into windows of Period,
// aligned to multiples of Period since the Unix epoch. Each window admits at most Limit
// events. It is the cheapest algorithm, with one counter per key. It is also the easiest
// to explain to clients: "1000 per hour, reset on the hour". Burst is ignored.
//
// A client may get up to 2x Limit across a window boundary. It may get Limit at the end
// of one window, and Limit at the start of the next. That is inherent to the algorithm.
// Choose the sliding window or sliding log where that matters.
//
// In a Decision, Limit is the window's limit, and Remaining is what is left of it.
// RetryAfter and ResetAfter are the time until the window ends.
//
// A refund gives back a take's events, with the take's Receipt (AlgorithmLimiter.Charge).
// It takes them off the count only if the take was of the current window. Say the rule
// is 100 a minute, and 100 events admitted at 0:59 on an estimate are refunded at 1:10.
// They give nothing back, since they counted in a window that is over. Minute 1 admits
// its 100, no more.
//
// A debit counts a cost known after the answer (AlgorithmLimiter.Debit). It counts the
// events whatever the window holds, even past its limit. The key then denies until the
// window ends, and the next window starts at 0.
//
// State: Level is the events counted in the window that contains Time. Both are kept
// while the window lasts. A reset leaves a floor in Log until the window ends. The
// receipts of the takes before the reset then give nothing back.
//
// Quotas (Quota, NewQuota) are fixed windows of the calendar instead. A window is a day,
// an ISO week, a month or a year of a time zone. "10000 per month in America/New_York"
// counts from the 1st at 00:00 there. A day lasts 23 to 25 hours when summer time
// changes, and a month 28 to 31 days. In a quota's state, Aux is the end of the window
// its Level counts.
package fixedwindow

import (
	_ "embed"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Limiter is a fixed window limiter over a Store. It keeps one counter per key, all
// under one Rule. Its methods are ratelimit.AlgorithmLimiter's, as for every algorithm.
// It is safe for concurrent use.
type Limiter = ratelimit.AlgorithmLimiter

// New returns a fixedwindow limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce. It returns an error for a nil
// store. Its keys are in the rule's namespace, unless ratelimit.WithNamespace names one.
func New(store ratelimit.Store, rule ratelimit.Rule, opts ...ratelimit.Option) (*Limiter, error) {
	return ratelimit.NewAlgorithmLimiter(store, algorithm, rule, opts...)
}

// Algorithm is the fixed window as stores see it.
func Algorithm() *core.Algorithm { return algorithm }

// advance brings st to now, or to the latest instant it has seen while it is kept,
// empties a window that has passed, and returns the index of the window of st.Time.
func advance(st *core.State, now int64, a core.Args) (window int64) {
	if by := core.Rewind(st, now, a.Period); by > 0 {
		core.SetFloor(st, st.Time+by) // the count moved back: the takes before are of another moment
	}
	t := now
	if st.Level > 0 || st.Time != 0 {
		t = max(st.Time, now)
	}
	window = mathx.FloorDiv(t, a.Period)
	if st.Level > 0 && mathx.FloorDiv(st.Time, a.Period) != window {
		st.Level = 0
	}
	st.Time = t
	return window
}

func step(st *core.State, now int64, a core.Args) core.Outcome {
	return count(st, now, (advance(st, now, a)+1)*a.Period, a)
}

// count admits n events to the window that ends at end, counted in st.Level, if they fit
// with what the request must leave: the fixed window's decision, and a quota's.
func count(st *core.State, now, end int64, a core.Args) core.Outcome {
	allowed, retry := false, int64(0)
	if st.Level+a.N+a.Keep <= a.Limit {
		st.Level += a.N
		allowed = true
	} else {
		retry = end - now
	}
	reset := int64(0)
	if st.Level > 0 {
		reset = end - now
	}
	return a.Outcome(allowed, max(0, a.Limit-st.Level-a.Keep), mathx.Micros(retry), mathx.Micros(reset))
}

// debit counts n events in the current window whatever it holds (up to mathx.MaxExact),
// and returns the time until the window ends.
func debit(st *core.State, now int64, a core.Args) int64 {
	end := (advance(st, now, a) + 1) * a.Period
	st.Level = min(st.Level+min(a.N, mathx.MaxExact), mathx.MaxExact)
	return end - now
}

// refund takes n events off the count, down to 0, when the take at a.Taken was of the
// current window (and after the key's floor).
func refund(st *core.State, now int64, a core.Args) int64 {
	window := advance(st, now, a)
	if a.Taken <= core.Floor(st) || a.Taken > st.Time || mathx.FloorDiv(a.Taken, a.Period) != window {
		return 0
	}
	gave := min(a.N, max(0, st.Level))
	st.Level -= gave
	return gave
}

// void leaves a reset key empty, with a floor at its latest instant until the window
// ends: the takes before it, counted in the window, give nothing back. A window empty
// already keeps nothing, unless a floor of this window is there (an earlier reset's,
// which a second one keeps).
func void(st *core.State, now int64, a core.Args) int64 {
	window := advance(st, now, a)
	if st.Level == 0 && mathx.FloorDiv(core.Floor(st), a.Period) < window {
		return 0
	}
	core.VoidCounts(st)
	return (mathx.FloorDiv(st.Time, a.Period)+1)*a.Period - now
}

// prepare checks rule and n: at most Limit events counted per Period.
func prepare(rule core.Rule, n int64) (core.Args, error) {
	return core.CountArgs(name, rule, n)
}

const name = "fixedwindow"

// algorithm is the algorithm of fixedwindow as Algorithm returns it: its step in Go above,
// in Lua in fixedwindow.lua (for redisstore).
var algorithm = &core.Algorithm{Name: name, Script: script, ScriptKeys: []string{"state"}, Prepare: prepare, Step: step, Refund: refund, Debit: debit, Void: void, Lendable: true, Windowed: true}

//go:embed fixedwindow.lua
var script string
