package limitertest

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// Step is one AllowN at Start+At, and the exact Decision it must give.
type Step struct {
	At   time.Duration
	N    int64
	Want ratelimit.Decision
}

// Scenario is a table of steps on one key of a fresh store.
type Scenario struct {
	Name  string
	Rule  ratelimit.Rule
	Steps []Step
}

const (
	ms = time.Millisecond
	s  = time.Second
)

func allowed(limit, remaining int64, reset time.Duration) ratelimit.Decision {
	return ratelimit.Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func denied(limit, remaining int64, retry, reset time.Duration) ratelimit.Decision {
	return ratelimit.Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

func delayed(limit, remaining int64, delay, reset time.Duration) ratelimit.Decision {
	d := allowed(limit, remaining, reset)
	d.Delay = delay
	return d
}

// Scenarios pins the numbers each algorithm package documents, by algorithm name.
var Scenarios = map[string][]Scenario{
	"tokenbucket": {
		{Name: "capacity 10 at 2 per second", Rule: ratelimit.Rule{Limit: 2, Period: s, Burst: 10}, Steps: concat(
			// 15 requests at t=0: 10 allowed, 5 denied
			repeat(10, func(i int64) Step { return Step{0, 1, allowed(10, 9-i, time.Duration(i+1)*500*ms)} }),
			repeat(5, func(int64) Step { return Step{0, 1, denied(10, 0, 500*ms, 5*s)} }),
			// 5 more at t=3s: all allowed, 1 token left
			repeat(5, func(i int64) Step { return Step{3 * s, 1, allowed(10, 5-i, time.Duration(5+i)*500*ms)} }),
		)},
		{Name: "capacity 2 at 1 per second", Rule: ratelimit.Rule{Limit: 1, Period: s, Burst: 2}, Steps: []Step{
			{0, 1, allowed(2, 1, 1*s)},
			{0, 1, allowed(2, 0, 2*s)},
			{0, 1, denied(2, 0, 1*s, 2*s)},
			{1 * s, 1, allowed(2, 0, 2*s)},
		}},
		{Name: "burst 200 then 100 per second", Rule: ratelimit.Rule{Limit: 100, Period: s, Burst: 200}, Steps: []Step{
			{0, 200, allowed(200, 0, 2*s)},
			{0, 1, denied(200, 0, 10*ms, 2*s)},
			{1 * s, 100, allowed(200, 0, 2*s)},
			{1 * s, 1, denied(200, 0, 10*ms, 2*s)},
			{1*s + 10*ms, 1, allowed(200, 0, 2*s)},
		}},
		{Name: "a third of a second is rounded up", Rule: ratelimit.PerSecond(3), Steps: []Step{
			{0, 3, allowed(3, 0, 1*s)},
			{0, 1, denied(3, 0, 333334*time.Microsecond, 1*s)},
			{333333 * time.Microsecond, 1, denied(3, 0, 1*time.Microsecond, 666667*time.Microsecond)},
			{333334 * time.Microsecond, 1, allowed(3, 0, 1*s)},
		}},
	},
	"leakybucket": {
		{Name: "limit 2 per second, queue of 3", Rule: ratelimit.Rule{Limit: 2, Period: s, Burst: 3}, Steps: []Step{
			{0, 1, delayed(3, 2, 0, 500*ms)},
			{0, 1, delayed(3, 1, 500*ms, 1*s)},
			{0, 1, delayed(3, 0, 1*s, 1500*ms)},
			{0, 1, denied(3, 0, 500*ms, 1500*ms)},
			{0, 1, denied(3, 0, 500*ms, 1500*ms)},
			{500 * ms, 1, delayed(3, 0, 1*s, 1500*ms)},
			{2 * s, 1, delayed(3, 2, 0, 500*ms)},
		}},
		{Name: "n places at once", Rule: ratelimit.Rule{Limit: 2, Period: s, Burst: 3}, Steps: []Step{
			{0, 2, delayed(3, 1, 0, 1*s)},
			{0, 2, denied(3, 1, 500*ms, 1*s)},
			{500 * ms, 2, delayed(3, 0, 500*ms, 1500*ms)},
		}},
	},
	"fixedwindow": {
		{Name: "3 per second", Rule: ratelimit.PerSecond(3), Steps: []Step{
			{0, 1, allowed(3, 2, 1*s)},
			{0, 1, allowed(3, 1, 1*s)},
			{0, 1, allowed(3, 0, 1*s)},
			{0, 1, denied(3, 0, 1*s, 1*s)},
			{999 * ms, 1, denied(3, 0, 1*ms, 1*ms)},
			{1 * s, 1, allowed(3, 2, 1*s)},
		}},
		{Name: "twice the limit across a boundary", Rule: ratelimit.PerSecond(3), Steps: []Step{
			{900 * ms, 1, allowed(3, 2, 100*ms)},
			{900 * ms, 1, allowed(3, 1, 100*ms)},
			{900 * ms, 1, allowed(3, 0, 100*ms)},
			{900 * ms, 1, denied(3, 0, 100*ms, 100*ms)},
			{1000 * ms, 3, allowed(3, 0, 1*s)},
		}},
		{Name: "windows are aligned to the epoch", Rule: ratelimit.PerMinute(2), Steps: []Step{
			{90 * s, 2, allowed(2, 0, 30*s)},
			{119 * s, 1, denied(2, 0, 1*s, 1*s)},
			{120 * s, 2, allowed(2, 0, 60*s)},
		}},
	},
	"slidingwindow": {
		{Name: "previous 80, current 30, 15 s in", Rule: ratelimit.PerMinute(100), Steps: []Step{
			{30 * s, 80, allowed(100, 20, 90*s)},
			// window 2 starts at 60s; 15 s in, the previous window weighs 80 * 45/60 = 60
			{75 * s, 30, allowed(100, 10, 105*s)},
			{75 * s, 1, allowed(100, 9, 105*s)}, // estimate 90 + 1
			// 10 more need the previous weight down to 59: 80 * (60 - e)/60 <= 59, e = 15.75 s
			{75 * s, 10, denied(100, 9, 750*ms, 105*s)},
			{75*s + 749*ms, 10, denied(100, 9, 1*ms, 105*s-749*ms)},
			{75*s + 750*ms, 10, allowed(100, 0, 105*s-750*ms)},
			// no room in this window: in the next, 41 * (60 - e)/60 + 60 <= 100 from e = 1.464 s
			{76 * s, 60, denied(100, 0, 45*s+464*ms, 104*s)},
			// 15 s into window 3: the previous (41) weighs 30.75, rounded up in Remaining
			{135 * s, 1, allowed(100, 68, 105*s)},
			// two windows later nothing is left
			{240 * s, 100, allowed(100, 0, 120*s)},
		}},
	},
	"slidinglog": {
		{Name: "3 per second", Rule: ratelimit.PerSecond(3), Steps: []Step{
			{0, 1, allowed(3, 2, 1*s)},
			{100 * ms, 1, allowed(3, 1, 1*s)},
			{200 * ms, 1, allowed(3, 0, 1*s)},
			{300 * ms, 1, denied(3, 0, 700*ms, 900*ms)},
			{999 * ms, 1, denied(3, 0, 1*ms, 201*ms)},
			{1000 * ms, 1, allowed(3, 0, 1*s)},
			{1000 * ms, 1, denied(3, 0, 100*ms, 1*s)},
			{1000 * ms, 2, denied(3, 0, 200*ms, 1*s)},
		}},
		{Name: "n at once", Rule: ratelimit.PerSecond(5), Steps: []Step{
			{0, 3, allowed(5, 2, 1*s)},
			{500 * ms, 3, denied(5, 2, 500*ms, 500*ms)},
			{500 * ms, 2, allowed(5, 0, 1*s)},
			{1000 * ms, 3, allowed(5, 0, 1*s)},
		}},
	},
}

func repeat(k int64, f func(i int64) Step) []Step {
	steps := make([]Step, k)
	for i := range steps {
		steps[i] = f(int64(i))
	}
	return steps
}

func concat(parts ...[]Step) []Step {
	var all []Step
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

// RunSteps runs the scenarios of alg (Scenarios, by its Name) on its Step alone, with no
// store: the table each algorithm package tests itself with.
func RunSteps(t *testing.T, alg *core.Algorithm) {
	scenarios := Scenarios[alg.Name]
	if len(scenarios) == 0 {
		t.Fatalf("no scenarios of %s", alg.Name)
	}
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			var st core.State
			for i, step := range sc.Steps {
				a, err := alg.Prepare(core.Rule(sc.Rule), step.N)
				if err != nil {
					t.Fatalf("step %d: Prepare(%v, %d): %v", i, sc.Rule, step.N, err)
				}
				if got := decisionOf(alg.Step(&st, Start.Add(step.At).UnixMicro(), a)); got != step.Want {
					t.Errorf("step %d (at %v, n %d):\n got %+v\nwant %+v", i, step.At, step.N, got, step.Want)
				}
			}
		})
	}
}
