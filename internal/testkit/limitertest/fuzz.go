package limitertest

import (
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/internal/core"
)

// fuzzPeriods are the periods a fuzzed rule picks from: round ones, and ones that make
// fractional rates and ticks.
var fuzzPeriods = []time.Duration{
	time.Millisecond, 7 * time.Millisecond, time.Second, 1500*time.Millisecond + 3*time.Microsecond,
	time.Minute, time.Hour, 24 * time.Hour,
}

// fuzzSteps are the time steps an op picks from, times a signed byte: a negative step
// moves the clock back.
var fuzzSteps = []time.Duration{time.Microsecond, time.Millisecond, 37 * time.Millisecond, time.Second, time.Minute}

// Fuzz checks alg's step (Algorithm.Step)
// on random rules and random sequences of (time step, n), each op three bytes of ops: the
// clock moves by int8(ops[0]) * fuzzSteps[ops[1]], then AllowN with n from ops[2]. Every
// decision must keep the invariants of check.
func Fuzz(f *testing.F, alg *ratelimit.Algorithm) {
	f.Add(uint8(10), uint8(0), uint8(2), []byte{0, 0, 1, 0, 0, 1, 100, 3, 1, 0xff, 3, 1})
	f.Add(uint8(3), uint8(5), uint8(0), []byte{1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0})
	f.Add(uint8(2), uint8(3), uint8(3), []byte{0, 0, 2, 0x80, 4, 1, 0, 0, 1, 127, 4, 0, 0, 0, 5})
	f.Fuzz(func(t *testing.T, limit, burst, period uint8, ops []byte) {
		rule := ratelimit.Rule{
			Limit:  1 + int64(limit%50),
			Period: fuzzPeriods[int(period)%len(fuzzPeriods)],
			Burst:  int64(burst % 60),
		}
		c := checker{t: t, alg: alg, rule: rule}
		now := Start.UnixMicro()
		for i := 0; i+2 < len(ops) && i < 600; i += 3 {
			now += int64(int8(ops[i])) * fuzzSteps[int(ops[i+1])%len(fuzzSteps)].Microseconds()
			c.step(now, 1+int64(ops[i+2]))
		}
	})
}

type checker struct {
	t        *testing.T
	alg      *ratelimit.Algorithm
	rule     ratelimit.Rule
	st       ratelimit.State
	latest   int64      // the latest instant the key has seen
	admitted []admitted // in time order
}

type admitted struct{ at, n int64 }

func (c *checker) args(n int64) ratelimit.Args {
	a, err := c.alg.Prepare(c.rule, n)
	if err != nil {
		c.t.Fatalf("Prepare(%v, %d): %v", c.rule, n, err)
	}
	return a
}

// decide runs the step on a copy of st, leaving st as it was.
func (c *checker) decide(st ratelimit.State, now, n int64) ratelimit.Decision {
	st = core.Clone(st)
	a := c.args(n)
	return c.alg.Step(&st, now, a).Decision()
}

func (c *checker) step(now, rawN int64) {
	t := c.t
	capacity := c.args(1).Limit
	n := 1 + (rawN-1)%capacity
	before := core.Clone(c.st)
	a := c.args(n)
	d := c.alg.Step(&c.st, now, a).Decision()
	us := time.Microsecond
	where := func() string { return time.Duration(now-Start.UnixMicro()).String() + "µs" }

	if d.Limit != capacity || d.Remaining < 0 || d.Remaining > d.Limit {
		t.Fatalf("at %s, n %d: %+v: Remaining outside [0, Limit %d]", where(), n, d, capacity)
	}
	if d.Allowed != (d.RetryAfter == 0) || d.RetryAfter < 0 || d.ResetAfter < 0 || d.Delay < 0 {
		t.Fatalf("at %s, n %d: %+v: RetryAfter must be > 0 exactly when denied", where(), n, d)
	}
	if d.Delay > 0 && c.alg.Name != "leakybucket" {
		t.Fatalf("at %s: %+v: only the leaky bucket delays", where(), d)
	}
	if d.Allowed && d.ResetAfter == 0 {
		t.Fatalf("at %s: %+v: an admitted event must take time to reset", where(), d)
	}

	// a clock that went back more than a period moves the key back by whole periods, to
	// within one of now: it decides exactly as it would have that much later
	period := c.args(1).Period
	if back := before.Time - now; back > period {
		by := (back - 1) / period * period
		if later := c.decide(before, now+by, n); later != d {
			t.Fatalf("at %s, %v behind the key's instant: %+v, but %v later %+v",
				where(), time.Duration(back)*us, d, time.Duration(by)*us, later)
		}
		c.latest -= by
		for i := range c.admitted {
			c.admitted[i].at -= by
		}
		before = core.Clone(c.st) // the key as the rewind left it: what later instants see
	} else if now < c.latest { // within a period, it sees the key as at the latest instant it has seen
		ahead := c.decide(before, c.latest, n)
		if ahead.Allowed != d.Allowed || ahead.Remaining != d.Remaining ||
			(!d.Allowed && d.RetryAfter != ahead.RetryAfter+time.Duration(c.latest-now)*us) {
			t.Fatalf("at %s, %v behind the latest instant: %+v, but at the latest %+v",
				where(), time.Duration(c.latest-now)*us, d, ahead)
		}
	}
	c.latest = max(c.latest, now)

	if d.Allowed {
		c.admitted = append(c.admitted, admitted{at: c.latest, n: n})
		c.checkAdmitted()
	} else {
		// RetryAfter is the earliest instant that works: not a microsecond earlier
		retry := now + int64(d.RetryAfter/us)
		if again := c.decide(before, retry, n); !again.Allowed {
			t.Fatalf("at %s, n %d: denied with %+v, still denied %v later: %+v", where(), n, d, d.RetryAfter, again)
		}
		if early := c.decide(before, retry-1, n); early.Allowed {
			t.Fatalf("at %s, n %d: denied with %+v, but allowed 1µs earlier", where(), n, d)
		}
	}

	// Remaining is exact: that many more fit now, one more does not
	if r := d.Remaining; r > 0 {
		if more := c.decide(c.st, c.latest, r); !more.Allowed {
			t.Fatalf("at %s: Remaining %d, but AllowN(%d) = %+v", where(), r, r, more)
		}
	}
	if r := d.Remaining; r < capacity {
		if more := c.decide(c.st, c.latest, r+1); more.Allowed {
			t.Fatalf("at %s: Remaining %d, but AllowN(%d) = %+v", where(), r, r+1, more)
		}
	}
	// after ResetAfter the key is full, and not a microsecond earlier
	if d.ResetAfter > 0 {
		reset := now + int64(d.ResetAfter/us)
		if full := c.decide(c.st, reset, 1); !full.Allowed || full.Remaining != capacity-1 {
			t.Fatalf("at %s: ResetAfter %v, but then Allow = %+v", where(), d.ResetAfter, full)
		}
		if early := c.decide(c.st, reset-1, 1); early.Allowed && early.Remaining == capacity-1 {
			t.Fatalf("at %s: ResetAfter %v, but full 1µs earlier: %+v", where(), d.ResetAfter, early)
		}
	}
}

// checkAdmitted checks the events admitted so far against what the algorithm promises.
func (c *checker) checkAdmitted() {
	last := c.admitted[len(c.admitted)-1]
	period := c.rule.Period.Microseconds()
	switch c.alg.Name {
	case "slidinglog": // never more than Limit in any interval of length Period
		if sum := c.sumSince(last.at - period + 1); sum > c.rule.Limit {
			c.t.Fatalf("sliding log admitted %d in the %v up to %d", sum, c.rule.Period, last.at)
		}
	case "fixedwindow", "slidingwindow": // never more than Limit in one aligned window
		if sum := c.sumSince(last.at - mod(last.at, period)); sum > c.rule.Limit {
			c.t.Fatalf("%s admitted %d in the window of %d", c.alg.Name, sum, last.at)
		}
	case "tokenbucket", "leakybucket": // never more than capacity + rate * elapsed
		for _, a := range c.admitted {
			sum := c.sumSince(a.at)
			if sum*period > core.Capacity(c.rule)*period+(last.at-a.at)*c.rule.Limit {
				c.t.Fatalf("%s admitted %d from %d to %d, over capacity plus refill", c.alg.Name, sum, a.at, last.at)
			}
		}
	}
}

func (c *checker) sumSince(from int64) int64 {
	sum := int64(0)
	for i := len(c.admitted) - 1; i >= 0 && c.admitted[i].at >= from; i-- {
		sum += c.admitted[i].n
	}
	return sum
}

func mod(a, b int64) int64 { return ((a % b) + b) % b }
