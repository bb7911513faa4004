package redissuite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// same applies req to both stores, local first, and fails the test unless they decide
// alike; what says which step it was. A take with a Receipt is sent to each store with a
// Receipt of its own, and both must write the same instant, which req's Receipt then
// holds (for a refund of it later, to both).
func same(t *testing.T, stores []ratelimit.Store, req core.Request, what func() string) {
	t.Helper()
	var got [2]core.Outcome
	var at [2]int64
	for i, s := range stores {
		r := req
		if req.Receipt != nil && req.Receipt.At == 0 {
			r.Receipt = &core.Receipt{}
		}
		var err error
		if got[i], err = s.Apply(context.Background(), r); err != nil {
			t.Fatalf("%s: %v", what(), err)
		}
		if r.Receipt != req.Receipt {
			at[i] = r.Receipt.At
		}
	}
	if got[0] != got[1] || at[0] != at[1] {
		t.Fatalf("%s:\n localstore %+v at %d\n     redis %+v at %d", what(), got[0], at[0], got[1], at[1])
	}
	if req.Receipt != nil && req.Receipt.At == 0 {
		req.Receipt.At = at[0]
	}
}

// receipts are the takes of a parity run that wrote a receipt, per key, for refunds of
// them later.
type receipts map[string][]core.Request

// note keeps req, when it is an admitted take with a receipt (or a debit: a take whatever
// the key has).
func (rs receipts) note(req core.Request) {
	if r := req.Receipt; r != nil && (req.Spec.Op == core.OpTake || req.Spec.Op == core.OpDebit) && r.At > 0 {
		rs[req.Key] = append(rs[req.Key], req)
	}
}

// refund is a refund of one of key's takes with a receipt, up to what it took; ok false
// when key has none.
func (rs receipts) refund(rng *rand.Rand, key string) (req core.Request, ok bool) {
	ts := rs[key]
	if len(ts) == 0 {
		return req, false
	}
	tk := ts[rng.IntN(len(ts))]
	spec := *tk.Spec
	spec.Op, spec.Reserve = core.OpRefund, 0
	return core.Request{Key: key, N: 1 + rng.Int64N(tk.N), Spec: &spec, Receipt: tk.Receipt}, true
}

// reserves are the reserves the parity tests draw from: none, most often.
var reserves = []int64{0, 0, 0, 20, 50, 99}

// ParityOn drives the same random traffic (takes, and debits past the limit) through
// localstore and redis, on one fake clock, and requires identical decisions: same
// algorithm, same time, same answer.
// Each step picks a key, a rule and n; the clock moves forward by a multiple of step.
// With changeRules, a key's rule changes mid-stream, and the state must convert (or
// expire) the same way in Go and in Lua; else key i keeps rule i.
func ParityOn(t *testing.T, redisStore func(*clock.Fake) ratelimit.Store, rules []ratelimit.Rule, changeRules bool, step time.Duration, steps int) {
	for _, k := range limitertest.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(k.Name))))
			clk := clock.NewFake(limitertest.Start)
			stores := []ratelimit.Store{localstore.New(localstore.WithClock(clk)), redisStore(clk)}
			rs := receipts{}
			for i := range steps {
				if rng.IntN(3) > 0 {
					clk.Advance(time.Duration(rng.IntN(40)) * step)
				}
				key := rng.IntN(len(rules))
				rule := rules[key]
				if changeRules {
					rule = rules[rng.IntN(len(rules))]
				}
				a, err := k.Algorithm.Prepare(core.Rule(rule), 1)
				if err != nil {
					t.Fatal(err)
				}
				req := core.Request{Key: "key" + strconv.Itoa(key), N: 1 + rng.Int64N(a.Limit), Spec: &core.Spec{Algorithm: k.Algorithm, Rule: core.Rule(rule)}}
				if rng.IntN(2) == 0 {
					req.N = 1
				}
				req.Spec.Reserve = reserves[rng.IntN(len(reserves))] // a priority's, often none
				switch {
				case k.Algorithm.Debit != nil && rng.IntN(8) == 0: // a cost after the answer, past the limit too
					req.Spec.Op, req.N = core.OpDebit, 1+rng.Int64N(3*a.Limit)
					if rng.IntN(2) == 0 { // a take whatever the key has, with a receipt, to refund later
						req.N, req.Receipt = 1+rng.Int64N(a.Limit), &core.Receipt{}
					}
				case rng.IntN(3) == 0: // a take with a receipt, to refund later
					req.Receipt = &core.Receipt{}
				case rng.IntN(5) == 0: // a refund of one of them, any time later
					if r, ok := rs.refund(rng, req.Key); ok {
						req = r
					}
				case rng.IntN(40) == 0:
					req.Spec.Op, req.N = core.OpReset, 1
				}
				same(t, stores, req, func() string {
					return fmt.Sprintf("step %d, %s %v op %q n %d reserve %d%% at %v", i, req.Key, req.Spec.Rule, req.Spec.Op, req.N,
						req.Spec.Reserve, clk.Now().Sub(limitertest.Start))
				})
				rs.note(req)
			}
		})
	}
}

// Parity runs ParityOn on a real Redis. TTLs run there on the server's real clock while
// the test's clock is fake: a key may outlive its fake reset, so each key keeps its rule
// (a state past its reset then decides as a fresh one), and every time step and every
// event's share of a period is a multiple of 100ms, so that no TTL is shorter than the
// real time between two steps.
func Parity(t *testing.T) {
	client := redistest.Start(t).Client()
	rules := []ratelimit.Rule{
		ratelimit.PerSecond(5),
		{Limit: 10, Period: 2 * time.Second, Burst: 7},
		ratelimit.PerMinute(60),
		{Limit: 36, Period: time.Hour, Burst: 50},
	}
	ParityOn(t, func(clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), FreshPrefix())
	}, rules, false, 100*time.Millisecond, 1500)
}

// InFlightParityOn drives the same random leases (acquires, releases, extensions, peeks,
// resets, limits per call) through localstore and redis on one fake clock, and requires
// identical decisions. Time moves in multiples of step.
func InFlightParityOn(t *testing.T, redisStore ratelimit.Store, clk *clock.Fake, step time.Duration, steps int) {
	rng := rand.New(rand.NewPCG(7, 11))
	stores := []ratelimit.Store{localstore.New(localstore.WithClock(clk)), redisStore}
	alg := concurrency.Algorithm()
	ops := []core.Op{core.OpTake, core.OpTake, core.OpTake, core.OpRefund, core.OpRefund,
		core.OpExtend, core.OpPeek}
	for i := range steps {
		if rng.IntN(3) == 0 {
			clk.Advance(time.Duration(rng.IntN(20)) * step)
		}
		req := core.Request{Key: "key" + strconv.Itoa(rng.IntN(3)), N: 1, Spec: &core.Spec{
			Algorithm: alg,
			Rule:      core.Rule{Limit: 1 + rng.Int64N(6), Period: time.Duration(10+rng.IntN(30)) * step},
			Op:        ops[rng.IntN(len(ops))],
			Lease:     1 + rng.Int64N(12), // few ids, so that releases and extensions find theirs
		}}
		if rng.IntN(200) == 0 {
			req.Spec.Op = core.OpReset
		}
		req.Spec.Reserve = reserves[rng.IntN(len(reserves))]
		same(t, stores, req, func() string {
			return fmt.Sprintf("step %d, %s op %q lease %d limit %d lease %v at %v", i, req.Key, req.Spec.Op, req.Spec.Lease,
				req.Spec.Rule.Limit, req.Spec.Rule.Period, clk.Now().Sub(limitertest.Start))
		})
	}
}

// InFlightParity runs InFlightParityOn on a real Redis, whose TTLs run on real time: each
// step is 100ms of the fake clock and no lease is shorter than a second, far more than
// the real time the run takes.
func InFlightParity(t *testing.T) {
	client := redistest.Start(t).Client()
	clk := clock.NewFake(limitertest.Start)
	InFlightParityOn(t, redisstore.New(client, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), FreshPrefix()), clk, 100*time.Millisecond, 2000)
}
