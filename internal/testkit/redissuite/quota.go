package redissuite

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	_ "time/tzdata" // the zones, on a machine without a zone database

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/clock"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/internal/core"
	"github.com/ratelimit-go/ratelimit/internal/testkit/redistest"
	"github.com/ratelimit-go/ratelimit/localstore"
	"github.com/ratelimit-go/ratelimit/redisstore"
)

// quotas are the quotas of the quota parity: days over Madrid's summer-time changes and
// Santiago's (whose midnight it skips), months over New York's, weeks and years in UTC.
func quotas(t *testing.T) []fixedwindow.Quota {
	zone := func(name string) *time.Location {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		return loc
	}
	madrid, ny, santiago := zone("Europe/Madrid"), zone("America/New_York"), zone("America/Santiago")
	return []fixedwindow.Quota{
		{Limit: 5, Per: fixedwindow.Day, In: madrid},
		{Limit: 2, Per: fixedwindow.Day, In: santiago}, // a midnight skipped on 5 September 2027
		{Limit: 7, Per: fixedwindow.Month, In: ny},
		{Limit: 3, Per: fixedwindow.Week},
		{Limit: 11, Per: fixedwindow.Year},
	}
}

// QuotaParityOn drives the same random takes, peeks, refunds and resets of calendar
// quotas through localstore and redis, on one fake clock moving by up to a few hours
// from a week before Madrid's 23-hour day of 2027 to past New York's end of summer time,
// and requires identical decisions.
func QuotaParityOn(t *testing.T, redisStore func(*clock.Fake) ratelimit.Store) {
	qs := quotas(t)
	rng := rand.New(rand.NewPCG(5, 8))
	clk := clock.NewFake(time.Date(2027, 3, 21, 0, 0, 0, 0, time.UTC))
	stores := []ratelimit.Store{localstore.New(localstore.WithClock(clk)), redisStore(clk)}
	ops := []core.Op{core.OpTake, core.OpTake, core.OpTake, core.OpTake, core.OpPeek, core.OpRefund}
	rs := receipts{}
	for i := range 3000 {
		clk.Advance(time.Duration(rng.Int64N(int64(5 * time.Hour))))
		q := qs[rng.IntN(len(qs))]
		alg, err := q.Algorithm()
		if err != nil {
			t.Fatal(err)
		}
		req := core.Request{Key: "tenant", N: 1 + rng.Int64N(2), Spec: &core.Spec{Algorithm: alg, Namespace: q.String(), Rule: core.Rule(q.Rule()), Op: ops[rng.IntN(len(ops))], Reserve: reserves[rng.IntN(len(reserves))]}}
		switch {
		case rng.IntN(300) == 0:
			req.Spec.Op = core.OpReset
		case req.Spec.Op == core.OpRefund: // of one of the takes with a receipt, or a take that writes one
			if r, ok := rs.refund(rng, req.Key); ok && r.Spec.Algorithm == alg {
				req = r
			} else {
				req.Spec.Op, req.Receipt = core.OpTake, &core.Receipt{}
			}
		}
		same(t, stores, req, func() string {
			return fmt.Sprintf("step %d, %v op %q n %d reserve %d%% at %v", i, q, req.Spec.Op, req.N, req.Spec.Reserve, clk.Now())
		})
		rs.note(req)
	}
}

// QuotaParity runs QuotaParityOn on a real Redis.
func QuotaParity(t *testing.T) {
	client := redistest.Start(t).Client()
	QuotaParityOn(t, func(clk *clock.Fake) ratelimit.Store {
		return redisstore.New(client, redisstore.WithClock(clk), FreshPrefix())
	})
}

// QuotaTTL: a quota's key lives until its window ends, on Redis's own clock: a monthly
// quota's key expires at the start of the next month (as the server's clock counts),
// give or take the test's own time, and a daily one's at midnight.
func QuotaTTL(t *testing.T) {
	client := redistest.Start(t).Client()
	ctx := context.Background()
	for _, per := range []fixedwindow.Calendar{fixedwindow.Day, fixedwindow.Month} {
		q := fixedwindow.Quota{Limit: 10, Per: per}
		l, err := fixedwindow.NewQuota(redisstore.New(client, redisstore.WithPrefix("ttl")), q)
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		d, err := l.Allow(ctx, "tenant")
		after := time.Now()
		if err != nil || !d.Allowed {
			t.Fatalf("%v: %+v, %v", q, d, err)
		}
		end := time.UnixMicro(q.Window(after).End)
		if q.Window(before) != q.Window(after) {
			continue // the test ran across midnight: nothing to compare
		}
		if d.ResetAfter < end.Sub(after)-time.Second || d.ResetAfter > end.Sub(before)+time.Second {
			t.Errorf("%v: ResetAfter %v; want the time until %v", q, d.ResetAfter, end)
		}
		keys, err := client.Keys(ctx, "ttl*quota*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("%v: keys %v, %v", q, keys, err)
		}
		ttl, err := client.PTTL(ctx, keys[0]).Result()
		if err != nil || ttl < d.ResetAfter-time.Second || ttl > d.ResetAfter+time.Second {
			t.Errorf("%v: the key's TTL is %v; want its ResetAfter, %v", q, ttl, d.ResetAfter)
		}
		client.Del(ctx, keys[0])
	}
}
