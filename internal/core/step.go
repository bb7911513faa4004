package core

import (
	"sync"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/fast"
)

// Step is an algorithm's Go step as this module's stores run it: Algorithm.Step, giving an
// Outcome in registers rather than a Decision through memory (see package fast).
type Step = func(st *ratelimit.State, now int64, a ratelimit.Args) fast.Outcome

// steps holds the Step of each algorithm made by Algorithm, by its address.
var steps sync.Map // *ratelimit.Algorithm -> Step

// Algorithm returns alg with its Step set from step, which the stores of this module then
// run directly (StepOf): an algorithm package declares its Algorithm with it.
func Algorithm(alg ratelimit.Algorithm, step Step) *ratelimit.Algorithm {
	alg.Step = func(st *ratelimit.State, now int64, a ratelimit.Args) ratelimit.Decision {
		return Decision(step(st, now, a), a.Limit)
	}
	p := &alg
	steps.Store(p, step)
	return p
}

// StepOf is alg's Step as an Outcome: the one Algorithm registered for it, else its
// Step's Decision taken apart (a third party's algorithm, or a copy of one of this
// module's, whose Step may have been replaced). alg.Step must be set.
func StepOf(alg *ratelimit.Algorithm) Step {
	if s, ok := steps.Load(alg); ok {
		return s.(Step)
	}
	step := alg.Step
	return func(st *ratelimit.State, now int64, a ratelimit.Args) fast.Outcome {
		return Outcome(step(st, now, a))
	}
}

// Decision is the Decision o stands for, under a rule whose Limit is limit.
func Decision(o fast.Outcome, limit int64) ratelimit.Decision {
	return ratelimit.Decision{Allowed: o.Allowed, Limit: limit, Remaining: o.Remaining,
		RetryAfter: o.RetryAfter(), ResetAfter: o.ResetAfter, Delay: o.Delay()}
}

// Outcome is d without its Limit. Of RetryAfter and Delay it keeps the one its Allowed
// says a Decision has.
func Outcome(d ratelimit.Decision) fast.Outcome {
	wait := d.Delay
	if !d.Allowed {
		wait = d.RetryAfter
	}
	return fast.Outcome{Allowed: d.Allowed, Remaining: d.Remaining, Wait: wait, ResetAfter: d.ResetAfter}
}
