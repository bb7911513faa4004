// Package concurrency is the algorithm of ratelimit.InFlightLimiter: a limit on the
// requests in progress at once, each holding a lease that expires by itself.
package concurrency

import (
	_ "embed"
	"fmt"
	"slices"

	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/eventlog"
	"github.com/ratelimit-go/ratelimit/internal/mathx"
)

// Algorithm is the in-flight limit as stores see it: an algorithm of leases (see
// core.Algorithm's Extend). A release
// (a refund) of a lease not held is remembered for a lease's duration, in the key's
// state, and an acquire of that lease meanwhile is denied, its RetryAfter until the
// release is forgotten: the acquire of a caller that gave up, run late, after the
// release sent for it. A store keeps a key with such a release that long.
func Algorithm() *core.Algorithm { return &inflight }

// inflight is the in-flight limit. Its state: Log holds the leases, At each one's expiry
// and N its id (unordered, at most Limit of them while the limit stays), and the leases
// released while not held, At when that is forgotten and N minus the id (lease ids are
// above 0); Level is the number of leases.
var inflight = core.Algorithm{
	Name:       "inflight",
	Script:     inflightScript,
	ScriptKeys: []string{"leases", "released"},
	Prepare:    prepareInFlight,
	Step:       acquireLease,
	Refund:     releaseLease,
	Extend:     extendLease,
}

//go:embed inflight.lua
var inflightScript string

func prepareInFlight(rule core.Rule, n int64) (core.Args, error) {
	if err := core.CheckRule(rule); err != nil {
		return core.Args{}, fmt.Errorf("inflight: %w", err)
	}
	switch {
	case n < 1:
		return core.Args{}, fmt.Errorf("inflight: n = %d: %w", n, core.ErrInvalidN)
	case n > 1:
		return core.Args{}, fmt.Errorf("inflight: n = %d: a lease is one request in progress: %w", n, core.ErrInvalidN)
	}
	return core.Args{N: 1, Limit: rule.Limit, Period: rule.Period.Microseconds()}, nil
}

// expireLeases drops the leases expired at now, and brings back to now + period those
// that would expire later: the clock went back, and a lease never lasts longer than its
// duration from now.
func expireLeases(st *core.State, now, period int64) {
	if st.Log == nil {
		st.Log = &eventlog.Log{}
	}
	st.Log.Expire(now)
	st.Log.Clamp(now + period)
}

// findLease is the index of lease id in log, or -1; the lease 0 is never found (each
// take without an id holds a lease of its own). The record of a lease released while not
// held is found as -id.
func findLease(log *eventlog.Log, id int64) int {
	if id == 0 {
		return -1
	}
	for i := 0; i < log.Len(); i++ {
		if log.At(i).N == id {
			return i
		}
	}
	return -1
}

// heldLeases are the expiries of the leases log holds (those of id 0 too, each a lease
// of its own), not of the releases it remembers.
func heldLeases(log *eventlog.Log) []int64 {
	var at []int64
	for i := 0; i < log.Len(); i++ {
		if e := log.At(i); e.N >= 0 {
			at = append(at, e.At)
		}
	}
	return at
}

// acquireLease takes a lease a.Lease for a.Period, if fewer than a.Limit are held (a
// lease held already is renewed), unless it was released before (an acquire that ran
// after its release: see releaseLease).
func acquireLease(st *core.State, now int64, a core.Args) core.Outcome {
	expireLeases(st, now, a.Period)
	allowed, keep := true, a.Keep
	held, gone := heldLeases(st.Log), findLease(st.Log, -a.Lease)
	if i := findLease(st.Log, a.Lease); i >= 0 {
		renew(st.Log, i, now+a.Period)
	} else if gone >= 0 {
		allowed = false
	} else if int64(len(held))+keep < a.Limit {
		st.Log.Append(eventlog.Event{At: now + a.Period, N: a.Lease})
	} else {
		allowed = false
	}
	held = heldLeases(st.Log) // as renewed or added
	st.Level = int64(len(held))
	d := a.Outcome(allowed, max(0, a.Limit-st.Level-keep), 0, 0)
	if len(held) > 0 {
		first, last := slices.Min(held), slices.Max(held)
		// until enough leases expire that this one fits with what it keeps: the oldest,
		// unless a lower limit per call or a reserve asks for more
		if k := st.Level + keep - a.Limit; !allowed && k > 0 {
			slices.Sort(held)
			first = held[k]
		}
		if !allowed {
			d.Wait = mathx.Micros(first - now)
		}
		d.Reset = mathx.Micros(last - now)
	}
	if gone >= 0 && !allowed { // released: until that is forgotten
		d.Wait = mathx.Micros(st.Log.At(gone).At - now)
	}
	return d
}

// renew sets the expiry of the i-th lease to at, unless it expires later already.
func renew(log *eventlog.Log, i int, at int64) {
	e := log.At(i)
	e.At = max(e.At, at)
	log.Set(i, e)
}

// releaseLease drops the lease a.Lease, if held, and says whether it was. A lease not
// held is kept released for a.Period: an acquire of it that runs after (sent before its
// release, and held up in a Redis that stopped, on another connection) takes nothing.
func releaseLease(st *core.State, now int64, a core.Args) int64 {
	expireLeases(st, now, a.Period)
	released := int64(0)
	if i := findLease(st.Log, a.Lease); i >= 0 {
		st.Log.Remove(i)
		released = 1
	} else if a.Lease > 0 && findLease(st.Log, -a.Lease) < 0 {
		st.Log.Append(eventlog.Event{At: now + a.Period, N: -a.Lease})
	}
	st.Level = int64(len(heldLeases(st.Log)))
	return released
}

// extendLease renews the lease a.Lease, if held, to expire a.Period after now.
func extendLease(st *core.State, now int64, a core.Args) bool {
	expireLeases(st, now, a.Period)
	st.Level = int64(len(heldLeases(st.Log)))
	i := findLease(st.Log, a.Lease)
	if i >= 0 {
		renew(st.Log, i, now+a.Period)
	}
	return i >= 0
}
