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
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/limitertest"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
	"github.com/ratelimit-go/ratelimit/slidingwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// LendParityOn drives the same random loans (several keys a call, holders giving back
// what they hold, revokes) and takes through localstore and redis on one
// fake clock, and requires identical answers. Time moves in multiples of step.
func LendParityOn(t *testing.T, redisStore ratelimit.Store, clk *clock.Fake, step time.Duration, steps int) {
	quota, err := fixedwindow.Quota{Limit: 50, Per: fixedwindow.Day, In: time.UTC}.Algorithm()
	if err != nil {
		t.Fatal(err)
	}
	algs := []*core.Algorithm{tokenbucket.Algorithm(), fixedwindow.Algorithm(), slidingwindow.Algorithm(), quota}
	rules := []ratelimit.Rule{{Limit: 20, Period: 10 * step, Burst: 30}, {Limit: 40, Period: 30 * step}}
	rng := rand.New(rand.NewPCG(3, 5))
	stores := []ratelimit.Store{localstore.New(localstore.WithClock(clk)), redisStore}
	held := map[string]int64{} // what each holder holds of each key, as far as it knows
	seqs := map[string]int64{} // and the latest of its numbered loans of it
	for i := range steps {
		if rng.IntN(3) == 0 {
			clk.Advance(time.Duration(rng.IntN(8)) * step)
		}
		loans := make([]core.Loan, 1+rng.IntN(4))
		for j := range loans {
			alg := algs[rng.IntN(len(algs))]
			k := rng.IntN(5)
			key, rule := "key"+strconv.Itoa(k), rules[k%len(rules)] // one rule per key: see Parity
			if alg == quota {
				rule = ratelimit.Rule{Limit: 50, Period: 24 * time.Hour}
			}
			holder := 1 + rng.Int64N(3)
			h := fmt.Sprint(alg.Name, key, holder)
			loans[j] = core.Loan{Key: key, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(rule)}, Holder: holder,
				Give: rng.Int64N(held[h] + 1), Want: rng.Int64N(12), Share: 1 + rng.Int64N(3),
				TTL: time.Duration(1+rng.IntN(40)) * step, Revoke: rng.IntN(30) == 0}
			if rng.IntN(2) == 0 { // numbered: now and then late, or counting what a lost answer changed
				seqs[h]++
				loans[j].Seq, loans[j].Out = seqs[h], max(0, held[h]+rng.Int64N(7)-3)
				if rng.IntN(5) == 0 {
					loans[j].Seq = 1 + rng.Int64N(seqs[h])
				}
			}
			if !loans[j].Revoke && rng.IntN(15) == 0 { // the holder's last loan: its record ends
				loans[j].Want, loans[j].End = 0, true
			}
			if rng.IntN(5) == 0 { // a partial take, keeping a priority's reserve
				loans[j] = core.Loan{Key: key, Spec: &core.Spec{Algorithm: alg, Rule: core.Rule(rule), Reserve: reserves[rng.IntN(len(reserves))]},
					Want: 1 + rng.Int64N(40), Share: 1}
				if rng.IntN(3) == 0 { // a debit: all of it, whatever the key has left
					loans[j].Spec.Op = core.OpDebit
				}
			}
		}
		var got [2][]core.Lent
		var receipts [2][]*core.Receipt // a holder's loan asks one now and then
		asks := rng.IntN(2) == 0
		for s, store := range stores {
			sent := append([]core.Loan(nil), loans...)
			receipts[s] = make([]*core.Receipt, len(sent))
			for j := range sent {
				if asks && sent[j].Holder != 0 && !sent[j].End {
					receipts[s][j] = &core.Receipt{}
					sent[j].Receipt = receipts[s][j]
				}
			}
			if got[s], err = store.(core.Lender).Lend(context.Background(), sent); err != nil {
				t.Fatalf("step %d, store %d: %v", i, s, err)
			}
		}
		for j, l := range loans {
			if r0, r1 := receipts[0][j], receipts[1][j]; r0 != nil && *r0 != *r1 {
				t.Fatalf("step %d, loan %d: receipts %+v and %+v", i, j, *r0, *r1)
			}
			if got[0][j] != got[1][j] {
				t.Fatalf("step %d, loan %d (%s %s holder %d give %d want %d share %d ttl %v revoke %v end %v seq %d out %d) at %v:\n localstore %+v\n     redis %+v",
					i, j, l.Spec.Algorithm.Name, l.Key, l.Holder, l.Give, l.Want, l.Share, l.TTL, l.Revoke, l.End, l.Seq, l.Out,
					clk.Now().Sub(limitertest.Start), got[0][j], got[1][j])
			}
			h := fmt.Sprint(l.Spec.Algorithm.Name, l.Key, l.Holder)
			if !got[0][j].Kept {
				held[h] = 0
			}
			held[h] = got[0][j].Out
		}
		if rng.IntN(2) == 0 { // a take beside the loans
			l := loans[0]
			same(t, stores, core.Request{Key: l.Key, N: 1, Spec: &core.Spec{Algorithm: l.Spec.Algorithm, Rule: l.Spec.Rule}},
				func() string { return fmt.Sprintf("step %d, a take of %s %s", i, l.Spec.Algorithm.Name, l.Key) })
		}
	}
}

// LendParity runs LendParityOn on a real Redis, whose TTLs run on real time: each step is
// 100ms of the fake clock, far more than the real time the run takes.
func LendParity(t *testing.T) {
	client := redistest.Start(t).Client()
	clk := clock.NewFake(limitertest.Start)
	LendParityOn(t, redisstore.New(client, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), FreshPrefix()), clk, 100*time.Millisecond, 1500)
}

// LendParityCluster runs it on a 3-master Redis Cluster, the loans of a call spread over
// its masters.
func LendParityCluster(t *testing.T) {
	client := redistest.StartCluster(t, 3).Client(t)
	clk := clock.NewFake(limitertest.Start)
	LendParityOn(t, redisstore.New(client, redisstore.WithClock(clk), redisstore.WithMinTTL(time.Hour), FreshPrefix()), clk, 100*time.Millisecond, 500)
}
