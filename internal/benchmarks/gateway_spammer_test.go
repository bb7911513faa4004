package benchmarks

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
)

// spammer is one attacker's shape of BenchmarkLeaseSpammer: one tenant asked perInstance
// requests a second on every instance (open-loop), or, if tight, by one caller per
// instance that asks again the moment it has an answer; on Redis delay away, with every
// holdEvery-th reply held hold longer (a Redis slowed past the fallback's timeout).
type spammer struct {
	name        string
	perInstance float64
	tight       bool
	delay       time.Duration
	holdEvery   int64
	hold        time.Duration
}

var spammers = []spammer{
	{name: "open-25x", perInstance: 2500, delay: 2500 * time.Microsecond},
	{name: "tight-loop", tight: true, delay: 2500 * time.Microsecond},
	{name: "open-25x-slow", perInstance: 2500, delay: 2500 * time.Microsecond, holdEvery: 25, hold: 60 * time.Millisecond},
	{name: "tight-loop-slow", tight: true, delay: 2500 * time.Microsecond, holdEvery: 25, hold: 60 * time.Millisecond},
}

// BenchmarkLeaseSpammer: the harness's four instances beside 2,000 requests a second of the
// Zipf load, and one tenant on the seed's rule (100 a second, burst 200) asked as an
// attacker would (see spammers), for 10s. Run it once: -benchtime 1x. It reports the
// harness's figures over every open-loop decision, and of the attacker's tenant: the
// most it was admitted over any [0, t) beyond the burst and the rate over t (events,
// in 100ms steps), what it was admitted after the first second against the rule, the
// most in any sliding second against the burst and a second's rate, the p99 of its
// open-loop decisions, and the tight loops' decisions a second. In the slow shapes
// every 25th reply of Redis comes 60ms late, past the fallback's timeout (50ms at most),
// and the replies behind it on its connection wait for it.
func BenchmarkLeaseSpammer(b *testing.B) {
	for _, sp := range spammers {
		for _, w := range ways[:3] { // exact, leases, leases-no-trust
			b.Run(sp.name+"/"+w.name, func(b *testing.B) { spammerRun(b, w, sp) })
		}
	}
}

func spammerRun(b *testing.B, w way, sp spammer) {
	const background, d = 2000.0, 10 * time.Second
	srv := redistest.Start(b)
	ins, _, proxy := openBehind(b, srv, w, gatewayInstances, sp.delay, 0)
	if sp.holdEvery > 0 {
		proxy.HoldEvery(sp.holdEvery, sp.hold)
	}
	warm(b, ins)
	tenants := tenantNames(gatewayTenants + 1)
	direct := srv.Client()
	calls0, cpu0 := redisStats(b, direct)
	r := newRun(len(tenants), d)
	r.watched = gatewayTenants
	z := newZipf(gatewayTenants)
	rest := spread(z, instanceSplit)

	var tight atomic.Int64
	stop := make(chan struct{})
	var loops sync.WaitGroup
	if sp.tight {
		for _, in := range ins {
			loops.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ok, err := in.allow(context.Background(), tenants[r.watched])
					tight.Add(1)
					if f := int(time.Since(r.start) / (100 * time.Millisecond)); err == nil && ok && f < len(r.fine) {
						r.fine[f].Add(1)
					}
				}
			})
		}
	}
	asked := float64(len(ins)) * sp.perInstance
	drive(ins, tenants, func(rng *rand.Rand, at time.Duration) (int, int) {
		if rng.Float64() < asked/(background+asked) {
			return r.watched, rng.IntN(len(ins))
		}
		return rest(rng, at)
	}, background+asked, d, r)
	close(stop)
	loops.Wait()

	var st hotkey.LeasesStats
	for _, in := range ins {
		if li := in.(*limiterInstance); li.leases != nil {
			st = addStats(st, li.leases.Stats())
		}
		in.close()
	}
	calls1, cpu1 := redisStats(b, direct)
	reportTimes(b, r, calls1-calls0, cpu1-cpu0, st)

	slots := int(d / (100 * time.Millisecond))
	over, _ := beyond(r, 0, slots, seedRule)
	b.ReportMetric(float64(over), "spammer-beyond-events")
	after := int64(0)
	for f := 10; f < slots; f++ {
		after += r.fine[f].Load()
	}
	rate := float64(seedRule.Limit) / seedRule.Period.Seconds()
	b.ReportMetric(float64(after)/(rate*(d.Seconds()-1)), "spammer-after-1s/rule")
	most := int64(0)
	for f := 0; f+10 <= slots; f++ {
		sum := int64(0)
		for i := f; i < f+10; i++ {
			sum += r.fine[i].Load()
		}
		most = max(most, sum)
	}
	b.ReportMetric(float64(most)/float64(seedRule.Burst+seedRule.Limit), "spammer-1s-most/(burst+rate)")
	perSecond := make([]int64, slots/10)
	for f := range slots {
		perSecond[f/10] += r.fine[f].Load()
	}
	first := make([]int64, min(10, slots))
	for f := range first {
		first[f] = r.fine[f].Load()
	}
	b.Logf("the attacker's tenant admitted, by second: %v; by 100ms of the first: %v", perSecond, first)
	var watched []time.Duration
	for i := range r.shards {
		for _, s := range r.shards[i].samples {
			if int(s.tenant) == r.watched {
				watched = append(watched, s.took)
			}
		}
	}
	slices.Sort(watched)
	b.ReportMetric(float64(percentile(watched, 0.99).Microseconds()), "spammer-p99-µs")
	b.ReportMetric(float64(tight.Load())/d.Seconds(), "tight-decisions/s")
	all := float64(r.decisions.Load() + tight.Load())
	b.ReportMetric((calls1-calls0)/all, "redis-calls/decision-all")
}
