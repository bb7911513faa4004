package limitertest

import (
	"bytes"
	"slices"
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
func Fuzz(f *testing.F, alg *core.Algorithm) {
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
	alg      *core.Algorithm
	rule     ratelimit.Rule
	st       core.State
	latest   int64      // the latest instant the key has seen
	admitted []admitted // in time order
}

type admitted struct{ at, n int64 }

func (c *checker) args(n int64) core.Args {
	a, err := c.alg.Prepare(core.Rule(c.rule), n)
	if err != nil {
		c.t.Fatalf("Prepare(%v, %d): %v", c.rule, n, err)
	}
	return a
}

// decide runs the step on a copy of st, leaving st as it was.
func (c *checker) decide(st core.State, now, n int64) ratelimit.Decision {
	st = core.Clone(st)
	a := c.args(n)
	return decisionOf(c.alg.Step(&st, now, a))
}

func (c *checker) step(now, rawN int64) {
	t := c.t
	capacity := c.args(1).Limit
	n := 1 + (rawN-1)%capacity
	before := core.Clone(c.st)
	a := c.args(n)
	d := decisionOf(c.alg.Step(&c.st, now, a))
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
		sum := int64(0)
		for i := len(c.admitted) - 1; i >= 0; i-- { // from each admission to the last
			a := c.admitted[i]
			if sum += a.n; sum*period > core.Capacity(core.Rule(c.rule))*period+(last.at-a.at)*c.rule.Limit {
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

// FuzzReceipts checks alg's refunds (Algorithm.Refund) on random rules and random
// sequences of takes with receipts, each of which really costs from nothing to all it
// took, settled any time later (refunded the rest), several at one instant among takes:
// each op is three bytes of ops, the clock moving forward by ops[0] times a step of
// fuzzSteps[ops[1]], then, by ops[2], a take of n parked, or the settlement of a parked
// one. Counting every admission at its real cost at the instant of its take, no bucket
// admits more than its capacity plus its rate over any interval, and no window more than
// its Limit: a refund gives back only what its own take would have left had it cost
// less from the start, never what another refund gave back already.
func FuzzReceipts(f *testing.F, alg *core.Algorithm) {
	parked := bytes.Repeat([]byte{0, 0, 8}, 10) // a bucket of 10 a second drained, then a charge of 1 at no cost each 100ms
	parked = append(parked, bytes.Repeat([]byte{100, 1, 0}, 20)...)
	parked = append(parked, bytes.Repeat([]byte{0, 0, 128, 0, 0, 8}, 20)...) // all settled at one instant, each before a take
	f.Add(uint8(9), uint8(0), uint8(2), parked)
	f.Add(uint8(10), uint8(0), uint8(2), []byte{0, 0, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 255, 0, 0, 254, 0, 0, 1, 0, 0, 253, 0, 0, 1})
	f.Add(uint8(4), uint8(9), uint8(3), []byte{0, 0, 3, 9, 2, 1, 9, 2, 1, 9, 2, 1, 0, 0, 200, 0, 0, 1, 0, 0, 201, 0, 0, 1})
	f.Fuzz(func(t *testing.T, limit, burst, period uint8, ops []byte) {
		rule := ratelimit.Rule{
			Limit:  1 + int64(limit%50),
			Period: fuzzPeriods[int(period)%len(fuzzPeriods)],
			Burst:  int64(burst % 60),
		}
		c := checker{t: t, alg: alg, rule: rule}
		capacity := c.args(1).Limit
		type parked struct{ at, n, cost int64 }
		var open []parked
		now := Start.UnixMicro()
		for i := 0; i+2 < len(ops) && i < 900; i += 3 {
			now += int64(ops[i]) * fuzzSteps[int(ops[i+1])%len(fuzzSteps)].Microseconds()
			if op := ops[i+2]; op >= 128 && len(open) > 0 { // settle one: the real cost, the rest refunded
				p := open[int(op-128)%len(open)]
				open = slices.DeleteFunc(open, func(q parked) bool { return q == p })
				a := c.args(1)
				a.N, a.Taken = p.n-p.cost, p.at
				if a.N > 0 {
					c.alg.Refund(&c.st, now, a)
				}
				c.settle(p.at, p.n, p.cost)
				continue
			}
			n := 1 + int64(ops[i+2]%8)%capacity
			a := c.args(n)
			a.Taken = core.TakenNow
			o := c.alg.Step(&c.st, now, a)
			if !o.Allowed() {
				continue
			}
			at := c.st.Time // the receipt: the instant the take was decided at
			cost := int64(ops[i+2]/8) % (n + 1)
			c.admitted = append(c.admitted, admitted{at: at, n: n})
			open = append(open, parked{at, n, cost})
			c.checkAdmitted()
		}
	})
}

// settle makes the admission of n at at cost cost: what the reference counts it for from
// now on.
func (c *checker) settle(at, n, cost int64) {
	for i := range c.admitted {
		if a := &c.admitted[i]; a.at == at && a.n == n {
			a.n = cost
			return
		}
	}
}
