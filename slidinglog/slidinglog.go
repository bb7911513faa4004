// Package slidinglog is the sliding log: it remembers when each admitted event happened
// and admits n more only if, with them, no more than Limit events fall in the last
// Period. An event at time e counts while now - e < Period. It is exact (never more than
// Limit in any interval of length Period) at the cost of memory: O(Limit) per key. Choose
// it for low limits that must hold exactly, such as login attempts or payments. Denied
// requests are not recorded. Burst is ignored.
//
// Decision: Limit is the limit; Remaining is Limit minus the events in the log;
// RetryAfter is the time until enough events age out; ResetAfter the time until the log
// is empty.
//
// Refund removes the newest events.
//
// State: Log holds the admitted events, merged per instant; Level is their sum.
package slidinglog

import (
	_ "embed"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/fast"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

const name = "slidinglog"

var algorithm = core.Algorithm(ratelimit.Algorithm{
	Name:       name,
	Script:     core.Script(script),
	ScriptKeys: []string{"state", "log"},
	Prepare:    prepare,
	Refund:     refund,
}, step)

//go:embed slidinglog.lua
var script string

// Algorithm is the sliding log as stores see it.
func Algorithm() *ratelimit.Algorithm { return algorithm }

func prepare(rule ratelimit.Rule, n int64) (ratelimit.Args, error) {
	period, err := core.Micros(name, rule)
	if err != nil {
		return ratelimit.Args{}, err
	}
	if err := core.CheckN(name, n, rule.Limit); err != nil {
		return ratelimit.Args{}, err
	}
	return ratelimit.Args{N: n, Limit: rule.Limit, Period: period}, nil
}

// advance brings st to now, or to the latest instant it has seen while it holds events,
// and drops the events that have aged out.
func advance(st *ratelimit.State, now int64, a ratelimit.Args) {
	if st.Log == nil {
		st.Log = &eventlog.Log{}
	}
	if by := core.Rewind(st, now, a.Period); by > 0 {
		st.Log.Shift(-by) // every event keeps its age
	}
	t := now
	if st.Log.Len() > 0 {
		t = max(st.Time, now)
	}
	for st.Log.Len() > 0 && t-st.Log.Oldest().At >= a.Period {
		st.Level -= st.Log.Pop().N
	}
	st.Time = t
}

func step(st *ratelimit.State, now int64, a ratelimit.Args) fast.Outcome {
	advance(st, now, a)
	log, t := st.Log, st.Time
	var d fast.Outcome
	keep := mathx.Keep(a.Limit, a.Reserve)
	if st.Level+a.N+keep <= a.Limit {
		log.Push(t, a.N)
		st.Level += a.N
		d.Allowed = true
	} else {
		// the oldest events must age out until n (and what it must leave) fit: the
		// oldest alone, most often, which the log keeps beside its ring
		excess := st.Level + a.N + keep - a.Limit
		wait := max(1, t+a.Period-now) // more than the log holds, which never fits: when it is empty
		if log.Len() > 0 {
			e, aged := log.Oldest(), int64(0)
			for i := 1; ; i++ {
				if aged += e.N; aged >= excess {
					wait = e.At + a.Period - now
					break
				}
				if i == log.Len() {
					break
				}
				e = log.At(i)
			}
		}
		d.Wait = mathx.Micros(wait)
	}
	d.Remaining = max(0, a.Limit-st.Level-keep)
	if log.Len() > 0 {
		d.ResetAfter = mathx.Micros(log.NewestAt() + a.Period - now)
	}
	return d
}

// refund removes up to n of the newest events.
func refund(st *ratelimit.State, now int64, a ratelimit.Args) {
	advance(st, now, a)
	st.Level -= st.Log.TrimNewest(a.N)
}
