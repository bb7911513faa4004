// Package slidinglog is the sliding log. It remembers when each admitted event
// happened. It admits n more only if no more than Limit events then fall in the last
// Period. An event at time e counts while now - e < Period. It is exact: never more than
// Limit in any interval of length Period. The cost is memory, O(Limit) per key. Choose it
// for low limits that must hold exactly, such as login attempts or payments. Denied
// requests are not recorded. Burst is ignored.
//
// In a Decision, Limit is the limit and Remaining is Limit minus the events in the log.
// RetryAfter is the time until enough events age out. ResetAfter is the time until the
// log is empty.
//
// A refund removes a take's own events while they are in the log
// (AlgorithmLimiter.Charge). It takes no debts. A debit would log events that never
// happened. So AlgorithmLimiter.Debit returns an error wrapping errors.ErrUnsupported.
// Charge such costs to a token bucket or a window.
package slidinglog

import (
	_ "embed"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Limiter is a sliding log limiter over a Store: one log of events per key, all under
// one Rule. Its methods are ratelimit.AlgorithmLimiter's, which every algorithm's
// limiter is. It is safe for concurrent use.
type Limiter = ratelimit.AlgorithmLimiter

// New returns a slidinglog limiter with rule over store. It returns an error wrapping
// ratelimit.ErrInvalidRule for a rule it cannot enforce, and an error for a nil store.
// Its keys are in the rule's namespace unless ratelimit.WithNamespace names one.
func New(store ratelimit.Store, rule ratelimit.Rule, opts ...ratelimit.Option) (*Limiter, error) {
	return ratelimit.NewAlgorithmLimiter(store, algorithm, rule, opts...)
}

// Algorithm is the sliding log as stores see it.
func Algorithm() *core.Algorithm { return algorithm }

// advance brings st to now, or to the latest instant it has seen while it holds events,
// and drops the events that have aged out.
func advance(st *core.State, now int64, a core.Args) {
	if st.Log == nil {
		st.Log = &eventlog.Log{}
	}
	if by := core.Rewind(st, now, a.Period); by > 0 {
		st.Log.Shift(-by)                // every event keeps its age
		st.Aux = max(st.Aux, st.Time+by) // and the takes before are of another moment
	}
	t := now
	if st.Log.Len() > 0 || st.Time != 0 {
		t = max(st.Time, now)
	}
	for st.Log.Len() > 0 && t-st.Log.Oldest().At >= a.Period {
		st.Level -= st.Log.Pop().N
	}
	st.Time = t
}

func step(st *core.State, now int64, a core.Args) core.Outcome {
	advance(st, now, a)
	log, t := st.Log, st.Time
	allowed, retry := false, int64(0)
	if st.Level+a.N+a.Keep <= a.Limit {
		log.Push(t, a.N)
		st.Level += a.N
		allowed = true
	} else {
		retry = agedOut(log, st.Level+a.N+a.Keep-a.Limit, max(1, t+a.Period-now), now, a.Period)
	}
	reset := int64(0)
	if log.Len() > 0 {
		reset = log.NewestAt() + a.Period - now
	}
	return a.Outcome(allowed, max(0, a.Limit-st.Level-a.Keep), mathx.Micros(retry), mathx.Micros(reset))
}

// agedOut is the time from now until the oldest events of log, aging out one Period
// after they happened, add up to excess (the oldest alone, most often, which the log
// keeps beside its ring); never, for more than the log holds: then the time it is empty.
func agedOut(log *eventlog.Log, excess, never, now, period int64) int64 {
	if log.Len() == 0 {
		return never
	}
	e, aged := log.Oldest(), int64(0)
	for i := 1; ; i++ {
		if aged += e.N; aged >= excess {
			return e.At + period - now
		}
		if i == log.Len() {
			return never
		}
		e = log.At(i)
	}
}

// refund removes up to n of the events logged at a.Taken, the take's own instant.
func refund(st *core.State, now int64, a core.Args) int64 {
	advance(st, now, a)
	if a.Taken <= st.Aux || a.Taken > st.Time {
		return 0
	}
	for i := st.Log.Len() - 1; i >= 0; i-- {
		e := st.Log.At(i)
		if e.At < a.Taken {
			break
		}
		if e.At == a.Taken {
			gave := min(a.N, e.N)
			st.Level -= gave
			if e.N -= gave; e.N > 0 {
				st.Log.Set(i, e)
			} else {
				st.Log.Remove(i)
			}
			return gave
		}
	}
	return 0
}

// void leaves a reset key's log empty, with a floor at its latest instant for a period:
// the takes before it give nothing back. A key with an empty log keeps nothing.
func void(st *core.State, now int64, a core.Args) int64 {
	advance(st, now, a)
	t := st.Time
	if st.Log.Len() == 0 && st.Aux < t {
		return 0
	}
	*st = core.State{Time: t, Aux: max(t, st.Aux)}
	return t + a.Period - now
}

// prepare checks rule and n: at most Limit events counted per Period.
func prepare(rule core.Rule, n int64) (core.Args, error) {
	return core.CountArgs(name, rule, n)
}

const name = "slidinglog"

// algorithm is the algorithm of slidinglog as Algorithm returns it: its step in Go above,
// in Lua in slidinglog.lua (for redisstore).
//
// The State of a key: Log holds the admitted events, merged per instant; Level is their sum; Time is
// the latest instant, kept while the state is. Aux is the floor: the receipts of takes
// at or before it (a reset, a clock stepped back) give nothing back.
var algorithm = &core.Algorithm{Name: name, Script: script, ScriptKeys: []string{"state", "log"}, Prepare: prepare, Step: step, Refund: refund, Void: void}

//go:embed slidinglog.lua
var script string
