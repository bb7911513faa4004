package benchmarks

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
)

// BenchmarkLeaseScenarios: the harness's four instances on Redis 2.5ms away, 2,000
// requests a second of the Zipf load beside one tenant asked twice its rule (200 a
// second), through what happens to a gateway: the tenant's traffic moves from one
// instance to another at 5s (move: the time until the new instance admits the rule's
// rate again, 95 in the last second); an instance that holds leases dies at 4s, its
// connection cut (kill: the tenant's admitted, cluster-wide, from 3s after, once a
// lease's TTL and a refill have passed, against the rule); Redis stopped (SIGSTOP) for 5s
// at 4s (stop: errors, the decisions made from leases meanwhile, and the most a tenant
// was admitted in those 5s against the rule's 500). Run it once: -benchtime 1x.
func BenchmarkLeaseScenarios(b *testing.B) {
	const background, hot = 2000.0, 200.0
	for _, w := range ways[:3] { // exact, leases, leases-optimistic
		b.Run("move/"+w.name, func(b *testing.B) {
			srv := redistest.Start(b)
			ins, _ := openGateway(b, srv, w, 2500*time.Microsecond, 0)
			tenants, z := tenantNames(gatewayTenants+1), newZipf(gatewayTenants)
			mover := gatewayTenants
			r := newRun(len(tenants), 10*time.Second)
			r.watched = mover
			rest := spread(z, instanceSplit)
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
			ins, clients := openGateway(b, srv, w, 2500*time.Microsecond, 0)
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
		b.Run("stop/"+w.name, func(b *testing.B) {
			srv := redistest.Start(b)
			ins, _ := openGateway(b, srv, w, 2500*time.Microsecond, 0)
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
