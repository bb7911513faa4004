package benchmarks

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/redisstore/hotkey"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The daily quota of BenchmarkLeasePolicies: policyBudget tokens a day per tenant, each
// request admitted on one token and charged policyCost once its answer is served,
// policyService after it was admitted.
const (
	policyBudget  = 20_000
	policyCost    = 20
	policyService = 20 * time.Millisecond
)

// policiesInstance decides each request under two limits at once, all or none, as
// Middleware.Policies does: the tenant's rate (the seed's rule) and its daily quota of
// tokens, admitted on an estimate of one and charged the rest after the answer (Debit).
type policiesInstance struct {
	rate, quota *ratelimit.AlgorithmLimiter
	leases      *hotkey.Leases // nil but for leases
	debits      sync.WaitGroup // the costs of the answers not yet served
}

func (in *policiesInstance) allow(ctx context.Context, tenant string) (bool, error) {
	d, err := ratelimit.AllowAll(ctx, 1, ratelimit.Part{Limiter: in.rate, Key: tenant}, ratelimit.Part{Limiter: in.quota, Key: tenant})
	if err != nil || !d.Allowed {
		return false, err
	}
	in.debits.Add(1)
	time.AfterFunc(policyService, func() { // the answer is served: the rest of its cost
		defer in.debits.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		in.quota.Debit(ctx, tenant, policyCost-1)
	})
	return true, nil
}

// close waits for the costs of the answers in progress, then closes the leases.
func (in *policiesInstance) close() {
	in.debits.Wait()
	if in.leases != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		in.leases.Close(ctx)
	}
}

// asPolicies is way w, a Store, with each instance deciding two policies per request.
func asPolicies(w way) way {
	return way{name: w.name, open: func(b *testing.B, c *redis.Client, prefix string, n int) gatewayInstance {
		store, leases := w.store(b, c, prefix, n)
		rate, err := tokenbucket.New(store, seedRule, ratelimit.WithNamespace("rate"))
		if err != nil {
			b.Fatal(err)
		}
		quota, err := fixedwindow.New(store, ratelimit.PerDay(policyBudget), ratelimit.WithNamespace("quota"))
		if err != nil {
			b.Fatal(err)
		}
		return &policiesInstance{rate: rate, quota: quota, leases: leases}
	}}
}

// BenchmarkLeasePolicies: the harness's four instances on Redis 1ms away, a quarter of
// LEASE_LOAD (2,000 requests a second: each request costs Redis two limits and a debit,
// and this 2-core machine holds no more on the exact path) of the Zipf load for
// LEASE_SECONDS, each request decided under a
// rate and a daily quota together, the quota's cost known after the answer (see
// policiesInstance): the tenants asked about 70 a second or more spend their quota
// within the run. Reported beside the harness's figures over every decision: the most
// tokens a tenant was served against its budget, and beyond it, in tokens (the debt of
// the requests in progress when the quota ran out is at most about a tenant's rate over
// the service time, times the cost: 40 tokens). Run it once: -benchtime 1x.
func BenchmarkLeasePolicies(b *testing.B) {
	srv := redistest.Start(b)
	for _, w := range ways[:3] { // exact, leases, leases-no-trust
		b.Run(w.name, func(b *testing.B) {
			perSecond, d := gatewayLoad()
			perSecond /= 4
			direct := srv.Client()
			ins, _ := openGateway(b, srv, asPolicies(w), gatewayInstances, time.Millisecond, 0)
			names, z := tenantNames(gatewayTenants), newZipf(gatewayTenants)
			calls0, cpu0 := redisStats(b, direct)
			r := newRun(gatewayTenants, d)
			for range b.N {
				drive(ins, names, spread(z, instanceSplit), perSecond, d, r)
			}
			var st hotkey.LeasesStats
			for _, in := range ins { // the last answers' costs charged, and what the leases hold given back
				in.close()
				if pi := in.(*policiesInstance); pi.leases != nil {
					st = addStats(st, pi.leases.Stats())
				}
			}
			calls1, cpu1 := redisStats(b, direct)
			reportTimes(b, r, calls1-calls0, cpu1-cpu0, st)
			most := int64(0)
			for k := range r.admitted {
				served := int64(0)
				for s := range r.admitted[k] {
					served += r.admitted[k][s].Load() * policyCost
				}
				most = max(most, served)
			}
			b.ReportMetric(float64(most)/policyBudget, "quota-most/budget")
			b.ReportMetric(float64(max(0, most-policyBudget)), "quota-beyond-tokens")
		})
	}
}
