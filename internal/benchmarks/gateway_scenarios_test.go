package benchmarks

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fallback"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/internal/trace"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
)

// BenchmarkLeaseScenarios: the harness's four instances on Redis 2.5ms away, 2,000
// requests a second of the Zipf load beside one tenant asked twice its rule (200 a
// second), through what happens to a gateway: the tenant's traffic moves from one
// instance to another at 5s (move: the time until the new instance admits the rule's
// rate again, 95 in the last second); an instance that holds leases dies at 4s, its
// connection cut (kill: the tenant's admitted, cluster-wide, from 3s after, once a
// lease's TTL and a refill have passed, against the rule); Redis stopped (SIGSTOP) for 5s
// at 4s (stop: errors, the decisions made from leases meanwhile, and the most a tenant
// was admitted in those 5s against the rule's 500); and the key changing under the
// tenant at 5s (see changes: a rule change, a reset, Redis restarted empty), where what
// the tenant was admitted from then on is held against the bound of the rule after the
// change, its burst and its rate over the time since; and a key that turns hot at once
// (hot-start: 20,000 requests a second of one key for 0.3s over the four instances, 1ms
// away, alone: the harness's figures over every decision, Redis's calls counted until
// the instances are closed, the charges of the last decisions and the give-backs included,
// and the events admitted, against the rule's burst and 0.3s of its rate: 230).
// Run it once: -benchtime 1x.
func BenchmarkLeaseScenarios(b *testing.B) {
	const background, hot = 2000.0, 200.0
	for _, w := range ways[:3] { // exact, leases, leases-no-trust
		b.Run("move/"+w.name, func(b *testing.B) {
			_, ins, tenants, r, rest := watchedRun(b, w)
			mover := r.watched
			drive(ins, tenants, func(rng *rand.Rand, at time.Duration) (int, int) {
				if rng.Float64() < hot/(background+hot) {
					return mover, map[bool]int{true: 0, false: 1}[at < 5*time.Second]
				}
				return rest(rng, at)
			}, background+hot, 10*time.Second, r)
			closeAll(ins)
			b.ReportMetric(float64(timeToRule(r, 50)/time.Millisecond), "to-rule-ms")
			b.ReportMetric(float64(r.errors.Load()), "errors")
		})
		b.Run("kill/"+w.name, func(b *testing.B) {
			srv := redistest.Start(b)
			ins, clients := openGateway(b, srv, w, gatewayInstances, 2500*time.Microsecond, 0)
			tenants, z := tenantNames(gatewayTenants+1), newZipf(gatewayTenants)
			victim := gatewayTenants
			r := newRun(len(tenants), 13*time.Second)
			rest := spread(z, []float64{0, 50, 30, 20}) // the first instance only for the victim
			killed := time.AfterFunc(4*time.Second, func() { clients[0].Close() })
			defer killed.Stop()
			drive(ins, tenants, func(rng *rand.Rand, at time.Duration) (int, int) {
				if rng.Float64() < hot/(background+hot) {
					if at < 4*time.Second {
						return victim, rng.IntN(2)
					}
					return victim, 1
				}
				return rest(rng, at)
			}, background+hot, 13*time.Second, r)
			closeAll(ins)
			sum := int64(0)
			for s := 7; s < 12; s++ {
				sum += r.admitted[victim][s].Load()
			}
			b.ReportMetric(float64(sum)/(5*float64(seedRule.Limit)), "after-ttl-of-rule")
		})
		for _, c := range changes {
			b.Run(c.name+"/"+w.name, func(b *testing.B) {
				srv, ins, tenants, r, rest := watchedRun(b, w)
				watched := r.watched
				onInstance := spread(newZipf(1), instanceSplit)
				var from atomic.Int64
				var rule atomic.Pointer[ratelimit.Rule]
				changed := time.AfterFunc(5*time.Second, func() {
					got := c.change(b, srv, ins, tenants[watched])
					rule.Store(&got)
					from.Store(int64((time.Since(r.start) + 100*time.Millisecond - 1) / (100 * time.Millisecond)))
				})
				defer changed.Stop()
				drive(ins, tenants, func(rng *rand.Rand, at time.Duration) (int, int) {
					if rng.Float64() < hot/(background+hot) {
						_, i := onInstance(rng, at)
						return watched, i
					}
					return rest(rng, at)
				}, background+hot, 10*time.Second, r)
				closeAll(ins)
				after := *rule.Load()
				over, ofBound := beyond(r, int(from.Load()), 100, after)
				b.ReportMetric(float64(over), "beyond-bound")
				b.ReportMetric(ofBound, "admitted/bound")
				b.ReportMetric(float64(over)/(10*float64(after.Limit)/after.Period.Seconds()), "beyond/10s-allowance")
				b.ReportMetric(float64(r.errors.Load()), "errors")
			})
		}
		b.Run("hot-start/"+w.name, func(b *testing.B) {
			srv := redistest.Start(b)
			ins, _ := openGateway(b, srv, w, gatewayInstances, time.Millisecond, 0)
			warm(b, ins)
			direct := srv.Client()
			calls0, cpu0 := redisStats(b, direct)
			r := newRun(1, 300*time.Millisecond)
			drive(ins, []string{"hot"}, spread(newZipf(1), instanceSplit), 20_000, 300*time.Millisecond, r)
			var st hotkey.LeasesStats
			for _, in := range ins { // the last admissions made ahead charged, and what the leases hold given back
				in.close()
				if li := in.(*limiterInstance); li.leases != nil {
					st = addStats(st, li.leases.Stats())
				}
			}
			calls1, cpu1 := redisStats(b, direct)
			reportTimes(b, r, calls1-calls0, cpu1-cpu0, st)
			b.ReportMetric(float64(r.admitted[0][0].Load()), "admitted")
		})
		b.Run("stop/"+w.name, func(b *testing.B) {
			srv := redistest.Start(b)
			ins, _ := openGateway(b, srv, w, gatewayInstances, 2500*time.Microsecond, 0)
			tenants, z := tenantNames(gatewayTenants), newZipf(gatewayTenants)
			r := newRun(len(tenants), 12*time.Second)
			paused := time.AfterFunc(4*time.Second, func() {
				srv.Pause()
				time.AfterFunc(5*time.Second, srv.Resume)
			})
			defer paused.Stop()
			drive(ins, tenants, spread(z, instanceSplit), background, 12*time.Second, r)
			closeAll(ins)
			most := 0.0
			for k := range r.admitted {
				sum := int64(0)
				for s := 4; s < 9; s++ {
					sum += r.admitted[k][s].Load()
				}
				most = max(most, float64(sum)/(5*float64(seedRule.Limit)))
			}
			b.ReportMetric(float64(r.errors.Load()), "errors")
			b.ReportMetric(most, "most-of-rule")
		})
	}
}

// changes are the scenarios of BenchmarkLeaseScenarios in which the key itself changes at
// 5s: every instance moves to a rule of 10 a second, burst 20 (rule-change); one instance
// resets the tenant's key (reset); Redis is killed and restarted empty (restart-empty).
// Each returns the rule that holds after the change.
var changes = []struct {
	name   string
	change func(b *testing.B, srv *redistest.Server, ins []gatewayInstance, tenant string) ratelimit.Rule
}{
	{"rule-change", func(_ *testing.B, _ *redistest.Server, ins []gatewayInstance, _ string) ratelimit.Rule {
		rule := ratelimit.Rule{Limit: 10, Period: time.Second, Burst: 20}
		for _, in := range ins {
			in.(*limiterInstance).rule.Store(&rule)
		}
		return rule
	}},
	{"reset", func(b *testing.B, _ *redistest.Server, ins []gatewayInstance, tenant string) ratelimit.Rule {
		if err := ins[0].(*limiterInstance).limiter.Reset(context.Background(), tenant); err != nil {
			b.Error(err)
		}
		return seedRule
	}},
	{"restart-empty", func(_ *testing.B, srv *redistest.Server, _ []gatewayInstance, _ string) ratelimit.Rule {
		srv.Kill()
		srv.Restart()
		return seedRule
	}},
}

// beyond is the most the watched tenant of r was admitted, from the 100ms slot from on
// up to the end of the run's load (to), beyond rule's bound: its burst and its rate over
// the time since; and what it was admitted over those slots against the bound at their
// end.
func beyond(r *run, from, to int, rule ratelimit.Rule) (most int64, ofBound float64) {
	sum, bound := int64(0), 0.0
	rate := float64(rule.Limit) / rule.Period.Seconds()
	for f := from; f < min(to, len(r.fine)); f++ {
		sum += r.fine[f].Load()
		bound = float64(rule.Burst) + rate*float64(f-from+1)/10
		most = max(most, sum-int64(math.Floor(bound)))
	}
	return most, float64(sum) / bound
}

// watchedRun opens the scenarios' instances of way w on a Redis of their own, 2.5ms away,
// and a 10s run of the harness's tenants and one more, watched (the last), with the
// router of the others.
func watchedRun(b *testing.B, w way) (*redistest.Server, []gatewayInstance, []string, *run, router) {
	srv := redistest.Start(b)
	ins, _ := openGateway(b, srv, w, gatewayInstances, 2500*time.Microsecond, 0)
	tenants := tenantNames(gatewayTenants + 1)
	r := newRun(len(tenants), 10*time.Second)
	r.watched = gatewayTenants
	return srv, ins, tenants, r, spread(newZipf(gatewayTenants), instanceSplit)
}

func closeAll(ins []gatewayInstance) {
	for _, in := range ins {
		in.close()
	}
}

// timeToRule is how long after from (in 100ms steps) the watched tenant starts a second
// in which it is admitted the rule's rate: 95 of 100.
func timeToRule(r *run, from int) time.Duration {
	for f := from; f+10 <= len(r.fine); f++ {
		sum := int64(0)
		for i := f; i < f+10; i++ {
			sum += r.fine[i].Load()
		}
		if sum >= 95 {
			return time.Duration(f-from) * 100 * time.Millisecond
		}
	}
	return time.Duration(len(r.fine)-from) * 100 * time.Millisecond
}

// warm has each instance decide on Redis, not on its shares, before a run: a cold
// connection and the script's first load take longer than the fallback's timeout.
func warm(b *testing.B, ins []gatewayInstance) {
	for i, in := range ins {
		deadline := time.Now().Add(10 * time.Second)
		for {
			ctx, rec := trace.With(context.Background())
			_, err := in.allow(ctx, fmt.Sprint("warm-", i))
			if err == nil && rec.Source() != fallback.Secondary.String() {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("instance %d does not reach Redis: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond) // poll interval
		}
	}
}
